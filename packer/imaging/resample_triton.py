"""Triton kernel behind :func:`packer.transforms.resized_crop` on CUDA.

One program computes a BLOCK_H x BLOCK_W tile of one output image, all
channels: from the image's box it computes, for each of its rows, the window
of input rows and their weights (the rules of
``packer.imaging.resize.filter_weights``, mirrored here for each filter: ``FILT``,
a compile-time code of :data:`FILTERS`), likewise for each column (mirrored if the
image is flipped), and ``out = sum_ky wy * sum_kx wx * X[iy, ix]`` in float32,
rounded to uint8 (bicubic and lanczos round and clamp the width pass to bytes
first, as torch's uint8 kernel and the CPU path do). Nothing but the boxes is
prepared on the host.
Reads only the input pixels under each window (from L1/L2), writes each output
byte once: memory-bound, with no float copy of the batch. Imported only when
CUDA work asks for it (Triton compiles on first use per tap count).

The kernels are in :mod:`packer.imaging.resample_triton_kernels`; this module holds
the tiles, the filters' codes and the launches (tests set ``TILE``, ``KERNEL``,
``RAGGED_CHUNK`` here).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
import triton

if __package__:
    from .resample_triton_kernels import (
        resample_dot_kernel,
        resample_kernel,
        resample_ragged_kernel,
        resample_ragged_parts_kernel,
    )
else:  # imported standalone, beside resample_triton_kernels.py (as resize.py may)
    from resample_triton_kernels import (
        resample_dot_kernel,
        resample_kernel,
        resample_ragged_kernel,
        resample_ragged_parts_kernel,
    )

# Tile of one program (output rows, columns, warps) for each kernel, and which kernel.
# (docs/PERFORMANCE.md, section "Figures behind the code", row "crop kernel tiles")
TILE = (2, 128, 4)  # the gather kernel's best of 5 (slower than dot)
DOT_TILE = (16, 16, 1)  # the dot kernel's best of 12
KERNEL = "dot"
# Images per launch of the ragged kernel (0: the whole batch in one). A launch fills
# every SM until its last tile starts, and a model's kernel queued meanwhile on another
# stream waits for all of it; in slices of 8 it waits for one slice at most, and
# ResNet-50 fed by a JPEG pack trains closer to its resident rate, grouped
# (RAGGED_GROUP) closer still (docs/PERFORMANCE.md, section "Figures behind the code",
# row "crop in slices").
RAGGED_CHUNK = 8
# Group the ragged kernel's rows by the input patch their tiles need (ragged_order), so a
# batch's largest box no longer sets every image's patch.
RAGGED_GROUP = True
# Bilinear boxes whose square patch (_square_spans) is at least PARTS_FROM go through
# resample_ragged_parts_kernel, their patch in PART x PART parts: one compile serves any
# downscale. A single-patch kernel takes a compile per patch size, the large ones' far
# the longest (docs/PERFORMANCE.md, section "JPEG packs beside DALI", row "the crop
# kernel's compile"), and none exists beyond 256 (~15x). From 128 the parts kernel is
# also the faster on the GPU; from 64 it is not (same section, row "the crop kernel on
# large photos").
PARTS_FROM = 128
PART = 64

# (interpolation, antialias) -> the kernels' FILT code; the half width of each
# filter at scale 1 sets the input patch (resize.py's _HALF, mirrored).
FILTERS = {
    ("bilinear", True): 0,
    ("nearest", True): 1,
    ("nearest", False): 1,
    ("nearest-exact", True): 2,
    ("nearest-exact", False): 2,
    ("bicubic", True): 3,
    ("lanczos", True): 4,
    ("bilinear", False): 5,
    ("bicubic", False): 6,
}
_HALF = {"nearest": 1, "nearest-exact": 1, "bilinear": 1, "bicubic": 2, "lanczos": 3}


@functools.lru_cache(maxsize=1024)  # a few hundred (block, scale, half) at most
def _span(block: int, scale: float, half: int = 1) -> int:
    """Input patch length covering the windows of ``block`` outputs (power of 2, >= 16)
    for a filter of half width ``half`` at scale 1."""
    need = math.ceil((block - 1) * scale + 2 * half * max(scale, 1.0)) + 2
    return max(16, triton.next_power_of_2(need))


def _spans(block: int, scale: np.ndarray, half: int = 1) -> np.ndarray:
    """:func:`_span` of every scale at once (int64)."""
    need = np.ceil((block - 1) * scale + 2 * half * np.maximum(scale, 1.0)).astype(np.int64) + 2
    pow2 = np.left_shift(1, np.ceil(np.log2(np.maximum(need, 1))).astype(np.int64))
    return np.maximum(16, pow2)


def _dot_launch(
    b: int, oh: int, ow: int, max_scale: tuple[float, float], half: int = 1
) -> tuple[tuple[int, int, int], int, int, int]:
    """Grid, input patch spans and warps of the dot kernels for ``b`` outputs of oh x ow."""
    block_h, block_w, warps = DOT_TILE
    sy, sx = _span(block_h, max_scale[0], half), _span(block_w, max_scale[1], half)
    if max(sy, sx) > 32:  # strong downscaling: a bigger patch wants more warps
        warps = max(warps, 4)
    return (b, triton.cdiv(oh, block_h), triton.cdiv(ow, block_w)), sy, sx, warps


def fits(max_scale: tuple[float, float], mode: str = "bilinear") -> bool:
    """Whether the kernels suit crops up to ``max_scale`` (crop / output length) per axis
    with interpolation ``mode``.

    Beyond 256-pixel patches (bilinear: downscaling more than ~15x; bicubic ~10x,
    lanczos ~7x) the dense route is the better one.
    """
    half = _HALF[mode]
    return (
        KERNEL != "dot"
        or max(_span(DOT_TILE[0], max_scale[0], half), _span(DOT_TILE[1], max_scale[1], half))
        <= 256
    )


def filter_code(mode: str, antialias: bool) -> int:
    """The kernels' FILT code of ``mode`` (a name of ``resize.INTERPOLATIONS``)."""
    return FILTERS[(mode, bool(antialias))]


def resample(
    images: torch.Tensor,
    boxes: torch.Tensor,
    oh: int,
    ow: int,
    ky: int,
    kx: int,
    max_scale: tuple[float, float] | None = None,
    mode: str = "bilinear",
    antialias: bool = True,
) -> torch.Tensor:
    """uint8 [B, C, H, W] -> uint8 [B, C, oh, ow], each image cropped and resized.

    ``boxes``: int32 [B, 5] on the images' device: top, left, height, width and
    a flip flag (non-zero: mirror the output). ``ky``/``kx``: taps per window
    (an upper bound; see ``aa_weights``). ``max_scale``: the largest box
    height / oh and width / ow in the batch (default: from the image size).
    ``mode``, ``antialias``: the interpolation (``resize.filter_weights``'s rules).
    The weights are computed in the kernel.
    """
    b, c, h, w = images.shape
    out = torch.empty((b, c, oh, ow), dtype=torch.uint8, device=images.device)
    if b == 0:
        return out
    filt = filter_code(mode, antialias)
    if KERNEL == "dot":
        grid, sy, sx, warps = _dot_launch(b, oh, ow, max_scale or (h / oh, w / ow), _HALF[mode])
        block_h, block_w, _ = DOT_TILE
        resample_dot_kernel[grid](
            images,
            out,
            boxes,
            *images.stride(),
            oh,
            ow,
            C=c,
            SY=sy,
            SX=sx,
            BLOCK_H=block_h,
            BLOCK_W=block_w,
            FILT=filt,
            num_warps=warps,
        )
        return out
    block_h, block_w, warps = TILE
    grid = (b, triton.cdiv(oh, block_h), triton.cdiv(ow, block_w))
    resample_kernel[grid](
        images,
        out,
        boxes,
        *images.stride(),
        oh,
        ow,
        C=c,
        KY=ky,
        KX=kx,
        BLOCK_H=block_h,
        BLOCK_W=block_w,
        FILT=filt,
        num_warps=warps,
    )
    return out


def _square_spans(scales: np.ndarray, half: int = 1) -> np.ndarray:
    """The ragged kernel's input patch side for each row of ``scales`` float [B, 2]: the
    larger of its two axes' spans. One side for both axes keeps the compiled kernels
    to four (16 to 64, and the parts kernel from :data:`PARTS_FROM`), each compiled
    in a loader's first batches; pairs of sides gave up to 25, the rarer ones compiled
    mid-epoch."""
    return np.maximum(
        _spans(DOT_TILE[0], scales[:, 0], half), _spans(DOT_TILE[1], scales[:, 1], half)
    )


def ragged_order(
    scales: np.ndarray, parts_from: int | None = None
) -> tuple[np.ndarray, list[tuple[int, int, float, float]]]:
    """Launch plan of :func:`resample_ragged` for boxes of ``scales`` float [B, 2] (box
    height / oh, width / ow each): the order of the table's rows (grouped by the input
    patch their tiles need, :func:`_square_spans`: a batch's largest box no longer sets
    every image's), and the
    launches (first row, end row, scale per axis), each of at most :data:`RAGGED_CHUNK`
    rows (0: a group in one). The rows from ``parts_from`` (:data:`PARTS_FROM`) are one
    group: the parts kernel's."""
    scales = np.asarray(scales, dtype=np.float64).reshape(-1, 2)
    b = len(scales)
    spans = np.minimum(_square_spans(scales), PARTS_FROM if parts_from is None else parts_from)
    order = np.argsort(spans, kind="stable")
    key = spans[order]
    ends = [*(np.flatnonzero(key[1:] != key[:-1]) + 1).tolist(), b]
    launches: list[tuple[int, int, float, float]] = []
    start = 0
    for end in ends if b else []:  # each group of one patch, in slices
        step = RAGGED_CHUNK if RAGGED_CHUNK > 0 else end - start
        for a in range(start, end, step):
            part = scales[order[a : min(a + step, end)]]
            launches.append((a, min(a + step, end), *part.max(0).tolist()))
        start = end
    return order, launches


def resample_ragged(
    table: torch.Tensor,
    channels: int,
    oh: int,
    ow: int,
    max_scale: tuple[float, float],
    device: torch.device,
    launches: list[tuple[int, int, float, float]] | None = None,
    mode: str = "bilinear",
    antialias: bool = True,
    out: torch.Tensor | None = None,
    parts_from: int | None = None,
) -> torch.Tensor:
    """Images of different sizes -> uint8 [B, C, oh, ow], each cropped, resized, flipped.

    ``table``: int64 [B, 9] on ``device``: each image's address (``data_ptr()`` of a
    contiguous uint8 [C, H, W] on ``device``), its box (top, left, height, width), flip
    flag, H, W and its row of the output. ``max_scale``: the largest box height / oh and
    width / ow. ``launches``: (first row, end row, scale per axis) per launch
    (:func:`ragged_order`); default: slices of :data:`RAGGED_CHUNK` rows at
    ``max_scale``. A launch fills every SM until its last tile starts, and a model's
    kernel queued meanwhile on another stream waits for all of it: small launches keep
    that wait short. ``mode``, ``antialias``: the interpolation, as :func:`resample`'s
    (``launches`` from :func:`ragged_order` assume bilinear's patches). ``out``: uint8
    [N, C, oh, ow] the rows are written to (each at its table's output row; the others
    are left as they are), instead of a new [B, C, oh, ow]. ``parts_from``: the square
    patch from which bilinear launches take the parts kernel (:data:`PARTS_FROM`).
    """
    b = table.shape[0]
    if out is None:
        out = torch.empty((b, channels, oh, ow), dtype=torch.uint8, device=device)
    if b == 0:
        return out
    if launches is None:
        step = RAGGED_CHUNK if RAGGED_CHUNK > 0 else b
        launches = [(a, min(a + step, b), *max_scale) for a in range(0, b, step)]
    block_h, block_w, _ = DOT_TILE
    filt, half = filter_code(mode, antialias), _HALF[mode]
    for a, z, sc_h, sc_w in launches:
        grid, sy, sx, warps = _dot_launch(z - a, oh, ow, (sc_h, sc_w), half)
        sy = sx = max(sy, sx)  # square patches: _square_spans
        if filt == 0 and sy >= (PARTS_FROM if parts_from is None else parts_from):
            resample_ragged_parts_kernel[grid](
                table[a:z], out, oh, ow, C=channels, T=PART, BLOCK_H=block_h,
                BLOCK_W=block_w, num_warps=4,
            )  # fmt: skip
            continue
        resample_ragged_kernel[grid](
            table[a:z],
            out,
            oh,
            ow,
            C=channels,
            SY=sy,
            SX=sx,
            BLOCK_H=block_h,
            BLOCK_W=block_w,
            FILT=filt,
            num_warps=warps,
        )
    return out
