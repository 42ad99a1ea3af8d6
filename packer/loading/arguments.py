"""The checks of a :class:`packer.loading.loader.PackLoader`'s own arguments: the choices,
the transform, the combinations refused, the JPEG-only ones (those shared: ``order.py``).
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import UsageError
from .order import _size_arg
from .producer import GATHER_MODES


def check_modes(decode: Any, gather: Any) -> None:
    """Refuse a ``decode=`` that names no mode, decoder or decoder object, and a
    ``gather=`` that is not one of :data:`GATHER_MODES`."""
    from ..imaging.decoders import JpegDecoder
    from ..imaging.jpeg import DECODE_MODES
    from .jpeg_pass import DECODE_NAMES

    def one(d: Any, modes: tuple[str, ...]) -> bool:
        return isinstance(d, JpegDecoder) or (isinstance(d, str) and d in (*modes, *DECODE_NAMES))

    several = isinstance(decode, (list, tuple)) and decode
    if not (all(one(d, ()) for d in decode) if several else one(decode, DECODE_MODES)):
        raise UsageError(
            f"decode must be 'auto', 'device' or 'cpu', not {decode!r} (or a GPU "
            f"decoder's name: {', '.join(DECODE_NAMES)}, a decoder object, or a list of "
            "decoder names and objects to decode several batches at once)"
        )
    if not isinstance(gather, str) or gather not in GATHER_MODES:
        raise UsageError(f"gather must be 'cpu' or 'device', not {gather!r}")


def check_transform(transform: Any) -> None:
    """Refuse a transform that is not callable, or one that would draw once per batch."""
    if transform is not None and not callable(transform):
        raise UsageError(f"transform must be callable, not {type(transform).__name__}")
    if transform is not None:
        from ..augment.per_image import refuse_batch_wide

        refuse_batch_wide(transform)


def refuse_combinations(
    units: Any, mix: Any, gather: str, resident: bool, indices: Any, order: str
) -> None:
    """Refuse ``gather="device"`` over several packs or a set's shards, and ``weights=``
    with ``resident``, ``indices`` or ``order="shards"``."""
    if units is not None and gather == "device":
        raise UsageError(
            "gather='device' reads one pack's file in place; stream a pack set or mixed "
            "packs with gather='cpu' (the default)"
        )
    if mix is not None and (resident or indices is not None or order != "global"):
        raise UsageError(
            "weights= draws each epoch's images from several packs; it does not combine "
            "with resident=True, indices= or order='shards'"
        )


def check_distinct(rows: torch.Tensor | None, order: str) -> None:
    """``order="shards"`` streams each image once an epoch: refuse repeated ``indices``."""
    if order == "shards" and rows is not None and len(rows.unique()) < len(rows):
        raise UsageError(
            "order='shards' streams each image once per epoch: indices= must not repeat rows"
        )


def crop_args(
    kind: Any,
    transform: Any,
    image_size: Any,
    train: bool,
    resident: bool,
    gather: str,
    decode: str,
) -> Any:
    """The :class:`packer.loading.crop.JpegCrop` of a kind that decodes (None for raw
    rows), after refusing the arguments that do not apply to ``kind``."""
    if not kind.decoded:
        if decode != "auto":
            raise UsageError("decode= is for JPEG packs; a raw pack's rows are not decoded")
        if image_size is not None:
            raise UsageError(
                "image_size is for JPEG packs; a raw pack's images have the size it was "
                "built with (crop or resize them with transform=)"
            )
        return None
    from .crop import crop_for

    if resident:
        raise UsageError("resident=True is for raw packs; a JPEG pack is decoded")
    if image_size is not None:
        image_size = _size_arg("image_size", image_size)
    try:
        crop = crop_for(transform, image_size, train)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if gather != "cpu":
        raise UsageError("gather= is for raw packs; a JPEG pack's images are decoded")
    return crop
