"""Who decodes a JPEG pack's batches (:mod:`packer.loading.jpeg_pass` runs the pass):
:class:`Decoding` (one decoder, or the lanes: batch b goes whole to decoder b % n, on a
thread and CUDA stream of its own; ``path``/``paths`` say how each ran), made by
:func:`decoding_for` from ``decode=`` (``auto``/``device``: the measured best lanes on
CUDA; a decoder's name; a decoder object or a list of them; ``cpu``: None, the threads
decode), :func:`lane_tuning_for`, and where a region decode pays
(:func:`regions_pay`: boxes the resize shrinks at least :data:`REGION_SHRINK` times).
"""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from ..errors import UsageError

DECODE_NAMES = ("nvimgcodec", "torchcodec", "torchvision")  # decode= may name one


class Decoding:
    """Who decodes a JPEG-pack loader's batches on its device: one decoder of
    :mod:`packer.imaging.decoders` or several (``lanes``: batch ``b`` goes whole to
    decoder ``b % lanes``, each on a decode thread and CUDA stream of its own, so which
    decoder gave a batch's pixels never depends on timing), shared by the loader's
    passes, each used by one thread at a time (nvImageCodec's ROI probe and handles are
    per decoder); or on the CPU a
    :class:`~packer.imaging.decoders.CpuDecoder` per pass on the pass's threads.

    ``path``: what the latest batch of each decoder ran, "<decoder>: roi", "<decoder>:
    roi (no fancy upsampling)" or "<decoder>: full+crop" ("<decoder>: not yet run"
    before any), joined by "; "."""

    def __init__(
        self, decoder: Any = None, device: torch.device | None = None, *, more: Any = ()
    ) -> None:
        self.decoders = [] if decoder is None else [decoder, *more]
        self.decoder = decoder  # None: a CpuDecoder per pass (the CPU's "device" way)
        self.device = decoder.device if decoder is not None else device
        self.lock = threading.Lock()
        self._held = {id(d): threading.Lock() for d in self.decoders}
        self._last: dict[int, str] = {}

    @property
    def lanes(self) -> int:
        """Batches decoded at once: one per decoder."""
        return max(1, len(self.decoders))

    @property
    def name(self) -> str:
        return "+".join(_label(d) for d in self.decoders) if self.decoders else "cpu"

    @property
    def last(self) -> str | None:
        """What the first decoder's latest batch ran (None before any)."""
        return self._last.get(0)

    @property
    def paths(self) -> list[str]:
        """What each lane's latest batch ran, "<decoder>: <way>" a lane ("cpu: <way>" for
        the CPU's batched decode)."""
        if not self.decoders:
            return [f"cpu: {self._last.get(0) or 'not yet run'}"]
        return [
            f"{_label(d)}: {self._last.get(k) or 'not yet run'}"
            for k, d in enumerate(self.decoders)
        ]

    @property
    def path(self) -> str:
        return "; ".join(self.paths)

    def for_pass(self, pool: ThreadPoolExecutor | None) -> Any:
        """The decoder a pass uses (on the calling thread: it may import); None where
        batch ``b`` takes ``decoders[b % lanes]`` (:meth:`of_batch`)."""
        if self.decoders:
            return None
        from ..imaging.decoders import CpuDecoder

        return CpuDecoder(self.device, pool=pool)

    def of_batch(self, b: int) -> Any:
        """The decoder of batch ``b`` (its number in the epoch: the same on a resume)."""
        return self.decoders[b % len(self.decoders)]

    def roi(self, dec: Any) -> bool:
        """Whether ``dec``'s next batch decodes only the boxes (a probe batch does)."""
        return bool(dec.supports_roi) and dec.roi_path != "full+crop"

    def run(
        self,
        dec: Any,
        datas: list[torch.Tensor],
        sizes: torch.Tensor,
        boxes: torch.Tensor,
        indices: list[int],
        flip: torch.Tensor | None = None,
        size: tuple[int, int] | None = None,
    ) -> tuple[list[bool] | None, Any]:
        """On a decode thread: (cropped, images): per image, its box alone (uint8
        [3, bh_i, bw_i], ``cropped`` True) where the decoder can, else the whole image
        [3, h_i, w_i] (or a kept batch of them: addresses, no tensors). A decoder that
        ``resizes`` (a CPU lane, :mod:`packer.imaging.cpu_lane`) gives the finished batch
        on the CPU (pinned where the loader's device is CUDA; the pass copies it on its
        stream), uint8 [n, 3, *size], boxes cut, resized to ``size`` and ``flip``-ped:
        ``cropped`` None. ``dec`` is held for the batch: one batch at a time each."""
        with self._held.get(id(dec)) or contextlib.nullcontext():
            if getattr(dec, "resizes", False) and size is not None:
                got = dec.decode_resized(datas, sizes, boxes, flip, size, indices)
                with self.lock:
                    self._last[self._index(dec)] = dec.roi_path
                return None, got
            if getattr(dec, "roi_kept", False):  # only the boxes, addresses, no tensors
                got = dec.decode_kept(datas, sizes, indices, boxes=boxes)
                out = [True] * len(got), got
            elif getattr(dec, "kept", False):  # addresses into kept buffers, no tensors
                got = dec.decode_kept(datas, sizes, indices)
                out = [False] * len(got), got
            elif self.roi(dec) and getattr(dec, "coarse_regions", False):
                out = _regions_or_whole(dec, datas, sizes, boxes, indices, size)
            elif self.roi(dec):
                got = dec.decode_rois(datas, boxes, sizes=sizes, indices=indices)
                out = [True] * len(got), got
            else:
                got = dec.decode(datas, sizes=sizes, indices=indices)
                out = [False] * len(got), got
            way = dec.roi_path if self.roi(dec) or getattr(dec, "roi_kept", False) else "full+crop"
            with self.lock:  # after a probe batch: the way it found
                self._last[self._index(dec)] = way
            return out

    def _index(self, dec: Any) -> int:
        return next((k for k, d in enumerate(self.decoders) if d is dec), 0)


REGION_SHRINK = 2  # a box is decoded alone only where the resize shrinks it this much


def regions_pay(boxes: torch.Tensor, size: tuple[int, int] | None) -> torch.Tensor:
    """bool [n]: which boxes (top, left, h, w) a region decoder decodes alone: those the
    resize to ``size`` shrinks at least :data:`REGION_SHRINK` times on both sides (all of
    them where ``size`` is None). nvImageCodec decodes regions without libjpeg's smooth
    chroma upsampling, about 1.2/255 mean from Pillow's pixels before any resize; a
    shrink of 2 or more averages that below 1/255, where a box kept or enlarged by the
    resize would carry it whole. The rest are decoded whole, with smooth upsampling, and
    cut after (docs/PERFORMANCE.md, "JPEG packs beside DALI")."""
    if size is None:
        return torch.ones(len(boxes), dtype=torch.bool)
    oh, ow = size
    return (boxes[:, 2] >= REGION_SHRINK * oh) & (boxes[:, 3] >= REGION_SHRINK * ow)


def _regions_or_whole(
    dec: Any,
    datas: list[torch.Tensor],
    sizes: torch.Tensor,
    boxes: torch.Tensor,
    indices: list[int],
    size: tuple[int, int] | None,
) -> tuple[list[bool], list[torch.Tensor]]:
    """The batch of a decoder whose regions come without smooth chroma upsampling
    (``coarse_regions``): the boxes where :func:`regions_pay` alone, the other images
    whole; (cut, images) in the batch's order."""
    cut = regions_pay(boxes, size).tolist()
    out: list[Any] = [None] * len(datas)
    for alone in (True, False):
        ks = [k for k, c in enumerate(cut) if c is alone]
        if not ks:
            continue
        part = [datas[k] for k in ks]
        names = [indices[k] for k in ks]
        if alone:
            got = dec.decode_rois(part, boxes[ks], sizes=sizes[ks], indices=names)
        else:
            got = dec.decode(part, sizes=sizes[ks], indices=names)
        for k, img in zip(ks, got, strict=True):
            out[k] = img
    return cut, out


def _label(dec: Any) -> str:
    if getattr(dec, "batched", False):  # nvbatch: one C call a batch
        return f"nvimgcodec-batched({dec.backends})"
    backends = getattr(dec, "backends", None)
    if dec.name == "nvimgcodec" and backends and backends != "hw+hybrid":
        return f"nvimgcodec({backends})"
    return str(dec.name)


def lane_tuning_for(pack: Any, batch: int) -> dict[str, Any] | None:
    """The default lanes' tuning for ``pack`` read in batches of ``batch``
    (:func:`~packer.imaging.decoders_split.lane_tuning`), from its stored sizes; None
    where the pack records none (a set gives its own)."""
    sizes = getattr(pack, "sizes", None)
    if sizes is None or len(sizes) == 0:
        return None
    from ..imaging.decoders_split import lane_tuning

    hw = np.asarray(sizes).reshape(-1, 2)
    pixels = float(np.median(hw[:, 0].astype(np.float64) * hw[:, 1]))
    return lane_tuning(batch, (int(hw[:, 0].max()), int(hw[:, 1].max())), pixels)


def decoding_for(
    decode: Any, device: torch.device, tuning: dict[str, Any] | None = None
) -> Decoding | None:
    """The :class:`Decoding` of a JPEG-pack loader's ``decode=`` on ``device``, or None
    where it decodes image by image on its threads (``decode="cpu"``; "auto" on the CPU).

    ``decode``: "auto" or "device" (on CUDA: torchcodec and torchvision, a batch each
    at once, where both run, else the first of torchcodec, torchvision, nvImageCodec
    that runs here, quietly; "device" on the CPU: the CPU decoder in batches), a name from :data:`DECODE_NAMES` (that decoder on ``device``, else a
    UsageError saying how to install it), a decoder object (``get_decoder(...)``,
    on ``device``'s type), or a list or tuple of names and decoder objects: several
    decoders, a batch each at once. Made here, on the caller's thread: it imports its
    library. ``tuning``: the default lanes' (:func:`lane_tuning_for`).
    """
    if isinstance(decode, (list, tuple)):
        if not decode:
            raise UsageError("decode= names no decoder: give one or more")
        got = [decoding_for(d, device) for d in decode]
        decs = [d.decoder for d in got if d is not None and d.decoder is not None]
        if len(decs) != len(got):
            raise UsageError(
                f"decode={list(decode)!r}: a list of decoders decodes on {device} in "
                "batches; give GPU decoders' names or decoder objects, not a mode"
            )
        ids = [id(d) for d in decs]
        if len(set(ids)) != len(ids):
            raise UsageError("decode= lists one decoder object twice; make one per lane")
        return Decoding(decs[0], more=decs[1:])
    from ..imaging.decoders import JpegDecoder, get_decoder
    from ..imaging.jpeg import decodes_on_cpu

    if isinstance(decode, JpegDecoder):
        if decode.device.type != device.type or (
            device.index is not None
            and decode.device.index is not None
            and decode.device.index != device.index
        ):
            raise UsageError(
                f"decode= decodes on {decode.device}, but the loader's device is {device}; "
                "make the decoder for the loader's device"
            )
        return Decoding(decode)
    if decodes_on_cpu(decode, device):
        return None
    if decode in ("auto", "device"):
        if device.type != "cuda":
            return Decoding(None, device)
        from ..imaging.decoders_split import best_lanes

        first, *more = best_lanes(device, tuning, pitched=True)
        return Decoding(first, more=more)
    return Decoding(get_decoder(device, prefer=decode, **_pitched(decode)))


def _pitched(name: str) -> dict[str, Any]:
    return {"pitched": True} if name == "nvimgcodec" else {}
