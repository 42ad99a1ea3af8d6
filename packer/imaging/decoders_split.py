"""Several JPEG decoders on one batch at once: :class:`SplitDecoder`, and
:func:`best_decoder`, the JPEG-pack loader's and the GPU build's choice on CUDA.

nvImageCodec's hardware engines (NVJPG, ``backends="hw"``) are silicon of their own,
beside the SMs and the CPU; nvjpeg's batched CUDA decoder (torchcodec's, else
torchvision's) decodes its Huffman data on the CPU and the rest on the SMs. A split
batch goes to both at once: the engines take the first share, the CUDA decoder the rest,
each on a thread and a CUDA stream of its own (both release the GIL), and the share
follows their measured rates (each part's images over its wall time, smoothed) so both
finish together. Measured on an H100 (docs/BENCHMARKS.md, 2026-11-25): without ROI
+4% over torchcodec alone in one lease, -1% in another; with ROI slower. So it is an
opt-in decoder object (``PackLoader(decode=SplitDecoder([...], roi=False))``), not
:func:`best_decoder`'s choice. An image the engines refuse (a
progressive JPEG, say) is decoded by the CUDA decoder instead, which names a file that
is damaged.

ROI: a part that decodes regions decodes only its images' boxes; the others decode
whole. :meth:`SplitDecoder.decode_mixed` says which images came back cropped (the
loader then resizes each from what it got); :meth:`decode_rois` crops the rest, for the
plain interface. Which image goes to which decoder depends on their timing, so pixels
may differ from run to run by the two decoders' difference (both without libjpeg's
fancy upsampling on the ROI path: docs/PERFORMANCE.md gives the measured figure).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from ..errors import PackFormatError, UsageError
from .decoders import DecoderBase, crop_all
from .resize import check_boxes

_SMOOTH = 0.3  # weight of the latest batch in each part's rate
_MIN_SHARE = 0.1  # each part keeps at least this share, so its rate stays measured


class SplitDecoder(DecoderBase):
    """``parts`` (two or more decoders on one device) decode each batch together; the
    last one also takes what the others refuse. ``share``: the first parts' starting
    shares (default: equal). ``roi`` False: every part decodes whole."""

    def __init__(
        self,
        parts: Sequence[DecoderBase],
        *,
        share: Sequence[float] | None = None,
        roi: bool = True,
    ) -> None:
        if len(parts) < 2:
            raise ValueError("a SplitDecoder needs two decoders or more")
        dev = parts[0].device
        if any(p.device != dev for p in parts):
            raise ValueError("a SplitDecoder's decoders must share one device")
        super().__init__(dev, check_tail=False)  # each part checks its own tails
        self.parts = list(parts)
        self.name = "+".join(_label(p) for p in self.parts)
        self.supports_roi = bool(roi) and any(p.supports_roi for p in self.parts)
        k = len(self.parts)
        self.rates: list[float | None] = [None] * k
        self.shares = [*share, 1 - sum(share)] if share is not None else [1 / k] * k
        self.refused = 0  # images the first parts refused, decoded by the last
        self._pool = ThreadPoolExecutor(k - 1, thread_name_prefix="imgpack-split")
        cuda = dev.type == "cuda"
        self._streams = [torch.cuda.Stream(dev) if cuda else None for _ in self.parts]

    @property
    def roi_path(self) -> str:
        return " + ".join(
            f"{_label(p)} {p.roi_path if self.supports_roi and p.supports_roi else 'full+crop'}"
            for p in self.parts
        )

    def __repr__(self) -> str:
        shares = "/".join(f"{s:.2f}" for s in self.shares)
        return f"SplitDecoder({self.name!r}, device={self.device}, shares={shares})"

    # ------------------------------------------------------------ the interface

    def _decode(self, datas: list[torch.Tensor], names: list[int]) -> list[torch.Tensor]:
        hw = np.zeros((len(datas), 2), np.int64)  # unused without boxes
        return self._mixed(datas, None, names, hw)[1]

    def _decode_rois(
        self, datas: list[torch.Tensor], boxes: np.ndarray, names: list[int], hw: np.ndarray
    ) -> list[torch.Tensor]:
        cropped, out = self._mixed(datas, boxes, names, hw)
        whole = [k for k, c in enumerate(cropped) if not c]
        self._check_shapes([out[k] for k in whole], [names[k] for k in whole], hw[whole])
        for k, crop in zip(whole, crop_all([out[k] for k in whole], boxes[whole])):
            out[k] = crop
        return out

    def decode_mixed(
        self,
        datas: Sequence[torch.Tensor],
        boxes: torch.Tensor | np.ndarray,
        *,
        sizes: torch.Tensor | np.ndarray,
        indices: Sequence[int] | None = None,
    ) -> tuple[list[bool], list[torch.Tensor]]:
        """Each image's box where its part decodes regions, else the whole image:
        (cropped per image, uint8 [3, bh_i, bw_i] or [3, h_i, w_i] on ``device``)."""
        names, hw = self._checked(datas, sizes, indices)
        bn = np.asarray(boxes, dtype=np.int64).reshape(-1, 4)
        if len(bn) != len(datas):
            raise ValueError(f"{len(bn)} boxes for {len(datas)} images")
        if not datas:
            return [], []
        check_boxes(bn, hw)
        cropped, out = self._mixed(list(datas), bn, names, hw)
        for c, x, i, b, s in zip(cropped, out, names, bn, hw):
            self._check_shapes([x], [i], (b[None, 2:] if c else s[None]))
        return cropped, out

    # ------------------------------------------------------------ the split

    def _bounds(self, n: int) -> list[int]:
        cut, acc = [0], 0.0
        for s in self.shares[:-1]:
            acc += s
            cut.append(min(n, round(acc * n)))
        return [*cut, n]

    def _run(
        self, k: int, datas: list, boxes: np.ndarray | None, names: list, hw: np.ndarray
    ) -> tuple[list[bool], list[torch.Tensor], float]:
        part, stream = self.parts[k], self._streams[k]
        t0 = time.perf_counter()
        ctx = torch.cuda.stream(stream) if stream is not None else _null()
        with torch.cuda.device(self.device) if stream is not None else _null(), ctx:
            roi = self.supports_roi and part.supports_roi and part.roi_path != "full+crop"
            if boxes is not None and roi:
                out = part._decode_rois(datas, boxes, names, hw)
                cropped = [True] * len(out)
            else:
                out = part._decode(datas, names)
                cropped = [False] * len(out)
        return cropped, out, time.perf_counter() - t0

    def _mixed(
        self, datas: list, boxes: np.ndarray | None, names: list[int], hw: np.ndarray
    ) -> tuple[list[bool], list[torch.Tensor]]:
        n, last = len(datas), len(self.parts) - 1
        cut = self._bounds(n)
        spans = [(cut[k], cut[k + 1]) for k in range(len(self.parts))]

        def args(k: int) -> tuple:
            a, z = spans[k]
            return k, datas[a:z], None if boxes is None else boxes[a:z], names[a:z], hw[a:z]

        futs = {
            k: self._pool.submit(self._run, *args(k))
            for k in range(last)
            if spans[k][1] > spans[k][0]
        }
        results: dict[int, tuple[list[bool], list[torch.Tensor], float]] = {}
        if spans[last][1] > spans[last][0]:
            results[last] = self._run(*args(last))
        for k, f in futs.items():
            try:
                results[k] = f.result()
            except (PackFormatError, UsageError, RuntimeError):
                # the engines refused one (or the file is damaged): the last decoder
                # decodes this part whole, and names a damaged file
                a, z = spans[k]
                self.refused += z - a
                c, o, _ = self._run(last, datas[a:z], None, names[a:z], hw[a:z])
                results[k] = (c, o, float("inf"))
        cropped: list[bool] = []
        out: list[torch.Tensor] = []
        for k in range(len(self.parts)):
            if k in results:
                cropped += results[k][0]
                out += results[k][1]
        if self.device.type == "cuda":
            here = torch.cuda.current_stream(self.device)
            for s in self._streams:
                here.wait_stream(s)  # the parts' outputs are ready on the caller's stream
        self._learn(spans, results)
        return cropped, out

    def _learn(self, spans: list[tuple[int, int]], results: dict) -> None:
        """Each part's rate (images / wall second, smoothed) -> shares proportional to
        them, each at least ``_MIN_SHARE``."""
        for k, (a, z) in enumerate(spans):
            if k not in results or z - a < 8 or not np.isfinite(results[k][2]):
                continue
            r = (z - a) / max(results[k][2], 1e-6)
            old = self.rates[k]
            self.rates[k] = r if old is None else (1 - _SMOOTH) * old + _SMOOTH * r
        if all(r is not None for r in self.rates):
            total = sum(self.rates)  # type: ignore[arg-type]
            raw = [max(_MIN_SHARE, r / total) for r in self.rates]  # type: ignore[operator]
            self.shares = [s / sum(raw) for s in raw]

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _label(dec: DecoderBase) -> str:
    backends = getattr(dec, "backends", None)
    return f"{dec.name}({backends})" if backends and backends != "cpu" else dec.name


# the order the loader and the GPU build try decoders in on CUDA, by measurement (H100,
# 2026-11-25, benchmarks/decoders.py, docs/PERFORMANCE.md "GPU JPEG decoders"): nvjpeg's
# batched decode (torchcodec, torchvision) fed ResNet-50 at 0.98 of its resident rate and
# streamed 8.5-8.9k img/s; nvImageCodec (engines + CUDA decoder, ROI) at 0.89-0.90 and
# 5.2-7.0k, this split included; nvImageCodec comes last (by name it is always there)
MEASURED_ORDER = ("torchcodec", "torchvision", "nvimgcodec")


def best_decoder(device: torch.device | str, **opts: object) -> DecoderBase:
    """The JPEG-pack loader's and the GPU build's decoder on ``device``: on CUDA the
    first of :data:`MEASURED_ORDER` that starts here, quietly (``passed_over`` says why
    the others did not); on the CPU the CPU decoder. ``opts`` go to nvImageCodec
    (``pitched``). A :class:`SplitDecoder` is never chosen by itself: it measured no
    faster (pass one as ``decode=`` to use it)."""
    from .decoders import get_decoder

    device = torch.device(device)
    if device.type != "cuda":
        return get_decoder(device)
    passed: list[str] = []
    for name in MEASURED_ORDER:
        try:
            dec = get_decoder(device, prefer=name, **(opts if name == "nvimgcodec" else {}))
        except UsageError as e:
            passed.append(f"{name}: {str(e)[:160]}")
            continue
        dec.passed_over = tuple(passed)
        return dec
    return get_decoder(device, **opts)  # raises, saying how to install one


# decoders with an nvjpeg instance each (each library keeps one decoder behind a lock):
# two of them decode two batches at once, 1.6x one alone and 1.5-1.8x the loader's rate
# with one (H100, 2026-11-25, benchmarks/decode_lanes.py); nvImageCodec beside nvjpeg
# gained little and fed ResNet-50 worse
MEASURED_LANES = ("torchcodec", "torchvision")


def best_lanes(device: torch.device | str, **opts: object) -> list[DecoderBase]:
    """The JPEG-pack loader's decoders on ``device``: on CUDA every one of
    :data:`MEASURED_LANES` that starts here (a batch each at once), else
    :func:`best_decoder`'s one; on the CPU the CPU decoder."""
    from .decoders import get_decoder

    device = torch.device(device)
    if device.type == "cuda":
        lanes = []
        for name in MEASURED_LANES:
            try:
                lanes.append(get_decoder(device, prefer=name))
            except UsageError:
                continue
        if len(lanes) > 1:
            return lanes
    return [best_decoder(device, **opts)]


# nvImageCodec lanes: the hardware engines decode whole images into kept buffers (reuse),
# several decoders at once (a batch each). Bare, one such decoder gave 17.5-26.1k img/s
# and four 28.1-31.8k on an H200; through the decoder interface (header checks, a DLPack
# tensor and a finalizer per image, under the GIL) one gave 10.0k and four 9.8k, and
# the loader fed by four 6.7k, below its default (benchmarks/dali.py, docs/PERFORMANCE.md
# "JPEG packs beside DALI"). So the loader does not use them by itself: pass
# ``decode=nvimgcodec_lanes(device)`` to try them. Where the engines are missing, the
# CUDA decoder alone.
NVIMGCODEC_LANES = 4
NVIMGCODEC_BACKENDS = ("hw", "hw+hybrid", "hybrid")


def nvimgcodec_lanes(device: torch.device | str, lanes: int = NVIMGCODEC_LANES) -> list:
    """nvImageCodec decoders for a JPEG-pack loader's ``decode=`` on ``device``: ``lanes``
    decoders on the first of :data:`NVIMGCODEC_BACKENDS` that starts here, each decoding
    whole images into kept buffers (``reuse``) with pitched outputs; the loader crops
    them. On the CPU one decoder. Raises UsageError (how to install) where nvImageCodec cannot run."""
    from .decoders import Unavailable, get_decoder

    device = torch.device(device)
    if device.type != "cuda":
        return [get_decoder(device, prefer="nvimgcodec", reuse=True, roi=False)]
    why = ""
    for backends in NVIMGCODEC_BACKENDS:
        opts = {"backends": backends, "pitched": True, "reuse": True, "roi": False}
        try:
            first = get_decoder(device, prefer="nvimgcodec", **opts)
        except UsageError as e:
            why = str(e)
            continue
        more = [get_decoder(device, prefer="nvimgcodec", **opts) for _ in range(lanes - 1)]
        return [first, *more]
    raise UsageError(why or str(Unavailable("nvImageCodec")))


__all__ = [
    "MEASURED_LANES",
    "MEASURED_ORDER",
    "NVIMGCODEC_LANES",
    "SplitDecoder",
    "best_decoder",
    "best_lanes",
    "nvimgcodec_lanes",
]
