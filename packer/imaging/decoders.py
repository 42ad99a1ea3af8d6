"""Batched JPEG decoders behind one small interface, and the chain that picks one.

A decoder turns a list of JPEG files into RGB images on its ``device``::

    dec = get_decoder("cuda")                        # nvImageCodec, else torchcodec, else torchvision
    imgs = dec.decode(datas, sizes=hw)               # list of uint8 [3, h_i, w_i] on dec.device
    crops = dec.decode_rois(datas, boxes, sizes=hw)  # list of uint8 [3, bh_i, bw_i]

``datas``: 1-D uint8 CPU tensors, one file's bytes each. ``sizes``: int [n, 2], each
image's stored (h, w) (a pack's readers always pass it): every frame header must say the
same before anything is decoded, so a 2 KB file cannot ask a decoder for gigabytes.
``boxes``: int [n, 4] (top, left, height, width) in the stored upright image.

:func:`get_decoder`'s chain puts nvImageCodec first (Pillow's exact pixels, ROI); the
JPEG-pack loader and the GPU build instead take
:func:`packer.imaging.decoders_split.best_decoder`'s measured order (torchcodec,
torchvision, nvImageCodec: nvjpeg's batched decode fed a model best; see
docs/PERFORMANCE.md, section "Figures behind the code", row "decoder order").

The backends (``name``):

* ``nvimgcodec`` (:mod:`.decoders_nvimgcodec`): the GPU's hardware JPEG engines first,
  its CUDA decoder taking the rest, GIL released; ROI decoding (only the box's blocks).
* ``torchcodec``: ``torchcodec.decoders.decode_jpeg(list, device="cuda")`` (one
  ``nvjpegDecodeBatched`` call); no ROI.
* ``torchvision``: ``torchvision.io.decode_jpeg(list, device="cuda")``, deprecated from
  torchvision 0.29 (only that warning is silenced); no ROI.
* ``cpu``: :func:`packer.imaging.jpeg.decode_batch` on the CPU (libjpeg-turbo through
  torchvision, one image per pool thread, without the GIL); no ROI.

Without ROI, :meth:`JpegDecoder.decode_rois` decodes whole and crops (the same pixels);
``roi_path`` says which way ran ("roi" or "full+crop").

Errors: a file that cannot be decoded, is truncated (no end-of-image marker), too short
for its frame, or whose header or output differs from its stored size raises
:class:`PackFormatError` naming its index (``indices``, default its position), never a
library's own error. A file cut short and then closed with an end marker decodes grey to
its end with only a warning from libjpeg; with ``check_tail`` (the default on the CPU,
where it is free) an output whose last pixel is that grey is decoded again on the CPU to
tell the two apart (:func:`packer.imaging.decode._check_whole`'s test). On CUDA it costs
a device-to-host read per batch, so it is off unless asked for: ``imgpack verify``'s
checksums find such damage.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..errors import UsageError
from .decoder_base import (
    CpuDecoder,
    DecoderBase,
    JpegDecoder,
    TorchcodecDecoder,
    TorchvisionDecoder,
    Unavailable,
    _import,
    crop_all,
    quiet_torchvision_io,
    undecodable,
)
from .decoders_nvimgcodec import NvImageCodecDecoder

GPU_CHAIN = ("nvimgcodec", "torchcodec", "torchvision")
NAMES = (*GPU_CHAIN, "cpu")
INSTALL = {
    "nvimgcodec": "pip install 'imgpack[gpu]' (nvImageCodec and nvJPEG, Linux x86-64)",
    "torchcodec": "pip install torchcodec (the release matching your torch)",
    "torchvision": "pip install torchvision",
    "cpu": "pip install torchvision",
}


_MAKERS: dict[str, Callable[..., DecoderBase]] = {
    "nvimgcodec": NvImageCodecDecoder,
    "torchcodec": TorchcodecDecoder,
    "torchvision": TorchvisionDecoder,
    "cpu": CpuDecoder,
}


def get_decoder(
    device: torch.device | str = "cpu", prefer: str | None = None, **opts: object
) -> DecoderBase:
    """The decoder for ``device``.

    ``prefer`` None: on CUDA the first of :data:`GPU_CHAIN` that imports and starts here,
    quietly (``decoder.name`` says which, ``decoder.passed_over`` why the others were
    not); on the CPU the CPU decoder. ``prefer`` a name from :data:`NAMES`: that one, or a
    UsageError saying how to install it. ``opts`` go to the backend (``check_tail``;
    nvimgcodec's ``backends``; the CPU's ``threads``).
    """
    device = torch.device(device)
    if prefer is not None and prefer not in NAMES:
        raise UsageError(f"decoder must be one of {', '.join(NAMES)}, not {prefer!r}")
    if prefer == "cpu" and device.type != "cpu":
        raise UsageError(f"decoder 'cpu' decodes on the CPU, not on {device}")
    if prefer is not None:
        try:
            return _MAKERS[prefer](device, **opts)
        except (Unavailable, ImportError, OSError, RuntimeError) as e:
            why = (str(e).splitlines() or [type(e).__name__])[0][:160]
            raise UsageError(
                f"decoder {prefer!r} cannot run here ({why}); install it: {INSTALL[prefer]}"
            ) from None
    if device.type == "cpu":
        return CpuDecoder(device, **opts)
    passed: list[str] = []
    for name in GPU_CHAIN:
        kw = {k: v for k, v in opts.items() if k == "check_tail" or name == "nvimgcodec"}
        try:
            dec = _MAKERS[name](device, **kw)
        except (Unavailable, ImportError, OSError, RuntimeError) as e:
            why = (str(e).splitlines() or [type(e).__name__])[0][:160]
            passed.append(f"{name}: {why}")
            continue
        dec.passed_over = tuple(passed)
        return dec
    raise UsageError(
        f"no JPEG decoder runs on {device} ({'; '.join(passed)}); install one: {INSTALL['nvimgcodec']}"
    )


# the backends above decoder_base build on it; ``_import`` stays importable here
__all__ = [
    "GPU_CHAIN",
    "INSTALL",
    "NAMES",
    "CpuDecoder",
    "DecoderBase",
    "JpegDecoder",
    "NvImageCodecDecoder",
    "TorchcodecDecoder",
    "TorchvisionDecoder",
    "Unavailable",
    "_import",
    "crop_all",
    "get_decoder",
    "quiet_torchvision_io",
    "undecodable",
]
