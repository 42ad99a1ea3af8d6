"""What every batched JPEG decoder shares, below the backends and the chain that picks
one (:mod:`packer.imaging.decoders`, where the interface is described): the
:class:`JpegDecoder` protocol, :class:`DecoderBase` (the checks before and after a
backend's ``_decode``), :class:`Unavailable`, :func:`undecodable`, :func:`crop_all`,
and the decoders that need no backend module of their own (``cpu``, ``torchvision``,
``torchcodec``). The backends in their own files (:mod:`.decoders_nvimgcodec`,
:mod:`.nvbatch`) build on this; nothing here imports them or the chain. Everything is
importable from :mod:`packer.imaging.decoders` as well.
"""

from __future__ import annotations

import importlib
import os
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from ..errors import PackFormatError
from .decode import _FILLER, _GREY, jpeg_too_short
from .jpeg import _decode_one, check_frames, frame_size, size_mismatch, truncated
from .resize import check_boxes

_TV_DEPRECATION = "The image decoding and encoding capabilities of TorchVision"


@runtime_checkable
class JpegDecoder(Protocol):
    """What every decoder offers (see the module docstring for shapes and errors)."""

    name: str
    device: torch.device
    supports_roi: bool

    @property
    def roi_path(self) -> str: ...

    def decode(
        self,
        datas: Sequence[torch.Tensor],
        *,
        sizes: torch.Tensor | np.ndarray | None = None,
        indices: Sequence[int] | None = None,
        prechecked: bool = False,
    ) -> list[torch.Tensor]: ...

    def decode_rois(
        self,
        datas: Sequence[torch.Tensor],
        boxes: torch.Tensor | np.ndarray,
        *,
        sizes: torch.Tensor | np.ndarray | None = None,
        indices: Sequence[int] | None = None,
    ) -> list[torch.Tensor]: ...


class Unavailable(Exception):
    """A backend cannot run here (not installed, no engine); the message says why."""


def _import(module: str):  # -> module; every backend imports through here
    return importlib.import_module(module)


def quiet_torchvision_io() -> None:
    """Silence torchvision 0.29's deprecation of ``torchvision.io`` decoding, and only it
    (a filter added once: ``warnings.catch_warnings`` is not thread-safe)."""
    warnings.filterwarnings("ignore", message=_TV_DEPRECATION, category=DeprecationWarning)


class DecoderBase:
    """The checks every backend shares, before and after its own ``_decode``.

    A subclass sets ``name`` and ``supports_roi`` and implements ``_decode(datas, names)``
    -> list of uint8 [3, h, w] on ``device``; one with ROI also ``_decode_rois``.
    """

    name = ""
    supports_roi = False

    def __init__(self, device: torch.device | str, *, check_tail: bool | None = None) -> None:
        self.device = torch.device(device)
        self.check_tail = self.device.type == "cpu" if check_tail is None else bool(check_tail)
        self.passed_over: tuple[str, ...] = ()  # set by get_decoder: backends it skipped, why

    @property
    def roi_path(self) -> str:
        return "roi" if self.supports_roi else "full+crop"

    def __repr__(self) -> str:
        skipped = f", passed over: {'; '.join(self.passed_over)}" if self.passed_over else ""
        return f"{type(self).__name__}(name={self.name!r}, device={self.device}, roi_path={self.roi_path!r}{skipped})"

    # ------------------------------------------------------------ the interface

    def decode(
        self,
        datas: Sequence[torch.Tensor],
        *,
        sizes: torch.Tensor | np.ndarray | None = None,
        indices: Sequence[int] | None = None,
        prechecked: bool = False,
    ) -> list[torch.Tensor]:
        """Each JPEG whole: list of uint8 [3, h_i, w_i] in [0, 255] on ``device``.

        ``prechecked``: the caller took ``sizes`` from
        :func:`packer.imaging.jpeg_header.plain_jpeg_size` of these very bytes (the GPU
        build's readers), which made every check of the headers, the end marker and the
        length made here: they are not made twice (the outputs' shapes still are)."""
        names, hw = self._checked(datas, sizes, indices, walk=not prechecked)
        if not datas:
            return []
        out = self._decode_sized(list(datas), names, hw)
        self._check_shapes(out, names, hw)
        if self.check_tail:
            self._check_tails(out, datas, names)
        return out

    def decode_rois(
        self,
        datas: Sequence[torch.Tensor],
        boxes: torch.Tensor | np.ndarray,
        *,
        sizes: torch.Tensor | np.ndarray | None = None,
        indices: Sequence[int] | None = None,
    ) -> list[torch.Tensor]:
        """Only each box: list of uint8 [3, bh_i, bw_i] (contiguous) on ``device``.
        ValueError for a box that is empty or leaves its image."""
        names, hw = self._checked(datas, sizes, indices)
        bn = np.asarray(boxes, dtype=np.int64).reshape(-1, 4)
        if len(bn) != len(datas):
            raise ValueError(f"{len(bn)} boxes for {len(datas)} images")
        if not datas:
            return []
        check_boxes(bn, hw)
        out = self._decode_rois(list(datas), bn, names, hw)
        self._check_shapes(out, names, bn[:, 2:])
        if self.check_tail:
            self._check_tails(out, datas, names)
        return out

    # ------------------------------------------------------------ for subclasses

    def _decode(self, datas: list[torch.Tensor], names: list[int]) -> list[torch.Tensor]:
        raise NotImplementedError

    def _decode_sized(
        self, datas: list[torch.Tensor], names: list[int], hw: np.ndarray
    ) -> list[torch.Tensor]:
        """:meth:`_decode`, for a backend that wants the checked sizes ``hw`` [n, 2] too
        (the batched decoder lays out its one buffer from them)."""
        return self._decode(datas, names)

    def _decode_rois(
        self, datas: list[torch.Tensor], boxes: np.ndarray, names: list[int], hw: np.ndarray
    ) -> list[torch.Tensor]:
        """Without ROI decoding: whole, then each box copied out."""
        full = self._decode(datas, names)
        self._check_shapes(full, names, hw)
        return crop_all(full, boxes)

    # ------------------------------------------------------------ checks

    def _checked(
        self,
        datas: Sequence[torch.Tensor],
        sizes: torch.Tensor | np.ndarray | None,
        indices: Sequence[int] | None,
        walk: bool = True,
    ) -> tuple[list[int], np.ndarray]:
        """The names errors use, and each image's (h, w) int64 [n, 2]: ``sizes`` checked
        against the frame headers, else read from them. Refuses before any decode a file
        without its end marker or too short for its frame. ``walk`` False: the caller
        made those checks on these bytes (``decode(prechecked=True)``); only the counts
        are checked, and ``sizes`` is required."""
        names = list(range(len(datas))) if indices is None else [int(i) for i in indices]
        if len(names) != len(datas):
            raise ValueError(f"{len(names)} indices for {len(datas)} images")
        if sizes is None and not walk:
            raise ValueError("prechecked decode needs the sizes the checks read")
        if sizes is not None:
            hw = np.asarray(sizes, dtype=np.int64).reshape(-1, 2)
            if len(hw) != len(datas):
                raise ValueError(f"{len(hw)} sizes for {len(datas)} images")
            if not walk:
                return names, hw
            check_frames(datas, names, hw)
        else:
            hw = np.empty((len(datas), 2), dtype=np.int64)
            for k, (d, i) in enumerate(zip(datas, names)):
                got = frame_size(d)
                if got is None:
                    raise undecodable(i, "no frame header before its image data")
                hw[k] = got
        for d, i in zip(datas, names):
            b = memoryview(d.numpy())
            if len(b) < 4 or b[-2] != 0xFF or b[-1] != 0xD9:
                raise truncated(i)
            why = jpeg_too_short(b, len(b))
            if why:
                raise undecodable(i, why)
        return names, hw

    def _check_shapes(
        self, out: Sequence[torch.Tensor], names: Sequence[int], hw: np.ndarray
    ) -> None:
        for x, i, (h, w) in zip(out, names, hw.tolist()):
            if x.ndim != 3 or x.shape[0] != 3:
                raise undecodable(i, f"it decodes to shape {tuple(x.shape)}, not [3, H, W]")
            if (x.shape[1], x.shape[2]) != (h, w):
                raise size_mismatch(i, x.shape[1:], (h, w))

    def _check_tails(
        self, out: Sequence[torch.Tensor], datas: Sequence[torch.Tensor], names: Sequence[int]
    ) -> None:
        """PackFormatError for a file whose image data stop before its last block: libjpeg
        and nvjpeg fill the rest grey (128) and go on. An output's last pixel is the latest
        block in raster order it holds (also for a box), so only outputs ending in that grey
        are decoded again on the CPU, with filler bytes before the end marker: a whole
        file's decoder has stopped before them (the same pixels), a cut one's reads them."""
        last = torch.stack([x[:, -1, -1] for x in out]).cpu()
        for k in torch.nonzero((last == _GREY[0]).all(1)).flatten().tolist():
            data, i = datas[k], names[k]
            b = bytes(data.numpy())
            end = b.rfind(b"\xff\xd9")
            again = torch.frombuffer(bytearray(b[:end] + _FILLER + b[end:]), dtype=torch.uint8)
            cpu = torch.device("cpu")
            if not torch.equal(_decode_one(data, i, cpu), _decode_one(again, i, cpu)):
                raise undecodable(i, "its image data stop before its last block")


def undecodable(index: int, why: str) -> PackFormatError:
    """The error for a stored JPEG that does not decode, naming its index and why."""
    why = (why.splitlines() or [""])[0][:200]
    return PackFormatError(
        f"image {index}: its stored JPEG does not decode ({why}); the pack is damaged, run "
        "`imgpack verify` and rebuild it"
    )


def crop_all(images: Sequence[torch.Tensor], boxes: np.ndarray) -> list[torch.Tensor]:
    """Each box (top, left, height, width) of its image, copied out contiguous."""
    return [
        x[:, t : t + h, l : l + w].contiguous()
        for x, (t, l, h, w) in zip(images, boxes.tolist())  # noqa: E741
    ]


# ---------------------------------------------------------------- the backends


class CpuDecoder(DecoderBase):
    """The CPU decoder: :func:`packer.imaging.jpeg.decode_batch`, one image per thread of
    a pool of ``threads`` (default: every core; 0: the calling thread), or of ``pool``
    (the caller's, e.g. a loader's threads: used, never shut down here)."""

    name = "cpu"

    def __init__(
        self,
        device: torch.device | str = "cpu",
        *,
        threads: int | None = None,
        pool: ThreadPoolExecutor | None = None,
        check_tail: bool | None = None,
    ) -> None:
        super().__init__(device, check_tail=check_tail)
        _import("torchvision.io")
        quiet_torchvision_io()
        self.threads = len(os.sched_getaffinity(0)) if threads is None else int(threads)
        self._pool: ThreadPoolExecutor | None = pool
        self._own_pool = pool is None

    def _decode(self, datas: list[torch.Tensor], names: list[int]) -> list[torch.Tensor]:
        if self._pool is None and self.threads > 1 and self.device.type == "cpu":
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="imgpack-jpeg")
        from . import jpeg  # looked up per call: a test may stand in for decode_batch

        pool = self._pool if self.device.type == "cpu" else None
        return jpeg.decode_batch(datas, self.device, indices=names, pool=pool, ends_checked=True)

    def close(self) -> None:
        if self._pool is not None and self._own_pool:
            self._pool.shutdown(wait=True)
        self._pool = None if self._own_pool else self._pool


class TorchvisionDecoder(CpuDecoder):
    """``torchvision.io.decode_jpeg(list, device=...)``: nvjpeg's batched decode on CUDA
    (through :func:`packer.imaging.jpeg.decode_batch`, which names a bad image)."""

    name = "torchvision"


class TorchcodecDecoder(DecoderBase):
    """``torchcodec.decoders.decode_jpeg(list, device=...)``: one ``nvjpegDecodeBatched``
    call on CUDA (hardware engines where the GPU has them); libjpeg-turbo on the CPU."""

    name = "torchcodec"

    def __init__(self, device: torch.device | str, *, check_tail: bool | None = None) -> None:
        super().__init__(device, check_tail=check_tail)
        self._decode_jpeg: Callable = _import("torchcodec.decoders").decode_jpeg

    def _decode(self, datas: list[torch.Tensor], names: list[int]) -> list[torch.Tensor]:
        try:
            return list(self._decode_jpeg(datas, mode="RGB", device=self.device))
        except (RuntimeError, ValueError):
            pass  # nvjpeg reports a batch, not an image: find the bad one
        out = []
        for d, i in zip(datas, names):
            try:
                out.append(self._decode_jpeg([d], mode="RGB", device=self.device)[0])
            except (RuntimeError, ValueError) as e:
                raise undecodable(i, str(e)) from None
        return out
