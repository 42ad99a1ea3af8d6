"""Triton kernel behind :func:`packer.transforms.resized_crop` on CUDA.

One program computes a BLOCK_H x BLOCK_W tile of one output image, all
channels: from the image's box it computes, for each of its rows, the window
of input rows and their antialias weights (the rule of
``packer.transforms.aa_weights``), likewise for each column (mirrored if the
image is flipped), and ``out = sum_ky wy * sum_kx wx * X[iy, ix]`` in float32,
rounded to uint8. Nothing but the boxes is prepared on the host.
Reads only the input pixels under each window (from L1/L2), writes each output
byte once: memory-bound, with no float copy of the batch. Imported only when
CUDA work asks for it (Triton compiles on first use per tap count).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Tile of one program (rows, columns) and its warps.
TILE = (16, 32, 4)


@triton.jit
def _window(o, n_out, start, length, flip, K: tl.constexpr, k: tl.constexpr):
    """Input index and unnormalised weight of tap ``k`` for output positions ``o``."""
    o = tl.where(flip != 0, n_out - 1 - o, o)
    scale = length.to(tl.float32) / n_out
    support = tl.maximum(scale, 1.0)
    centre = scale * (o.to(tl.float32) + 0.5)
    first = tl.maximum(tl.floor(centre - support + 0.5), 0.0)
    j = first + k
    w = tl.maximum(1.0 - tl.abs((j - centre + 0.5) / support), 0.0)
    w = tl.where(j < length.to(tl.float32), w, 0.0)
    idx = start + tl.minimum(j.to(tl.int32), length - 1)
    return idx, w


@triton.jit
def _resample_kernel(
    x_ptr,
    out_ptr,
    box_ptr,
    sxb,
    sxc,
    sxh,
    sxw,
    oh,
    ow,
    C: tl.constexpr,
    KY: tl.constexpr,
    KX: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    b = tl.program_id(0)
    i = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    j = tl.program_id(2) * BLOCK_W + tl.arange(0, BLOCK_W)
    top = tl.load(box_ptr + b * 5 + 0)
    left = tl.load(box_ptr + b * 5 + 1)
    bh = tl.load(box_ptr + b * 5 + 2)
    bw = tl.load(box_ptr + b * 5 + 3)
    flip = tl.load(box_ptr + b * 5 + 4)
    mi = i < oh
    mj = j < ow
    mask = mi[:, None] & mj[None, :]
    b64 = b.to(tl.int64)
    x_base = x_ptr + b64 * sxb
    out_base = out_ptr + b64 * (C * oh * ow)
    # Normalisers: the weights of each window sum to 1, as torch's aa kernel.
    sy = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for ky in tl.static_range(KY):
        _, w = _window(i, oh, top, bh, 0, KY, ky)
        sy += w
    sx = tl.zeros((BLOCK_W,), dtype=tl.float32)
    for kx in tl.static_range(KX):
        _, w = _window(j, ow, left, bw, flip, KX, kx)
        sx += w
    sy = 1.0 / tl.maximum(sy, 1e-12)
    sx = 1.0 / tl.maximum(sx, 1e-12)
    for c in tl.static_range(C):
        acc = tl.zeros((BLOCK_H, BLOCK_W), dtype=tl.float32)
        for ky in tl.static_range(KY):
            yy, wy = _window(i, oh, top, bh, 0, KY, ky)
            row = tl.zeros((BLOCK_H, BLOCK_W), dtype=tl.float32)
            for kx in tl.static_range(KX):
                xx, wx = _window(j, ow, left, bw, flip, KX, kx)
                v = tl.load(
                    x_base + c * sxc + yy[:, None] * sxh + xx[None, :] * sxw, mask=mask, other=0
                )
                row += v.to(tl.float32) * (wx * sx)[None, :]
            acc += row * (wy * sy)[:, None]
        acc = tl.minimum(tl.maximum(acc + 0.5, 0.0), 255.0)
        tl.store(
            out_base + c * (oh * ow) + i[:, None] * ow + j[None, :], acc.to(tl.uint8), mask=mask
        )


def resample(
    images: torch.Tensor, boxes: torch.Tensor, oh: int, ow: int, ky: int, kx: int
) -> torch.Tensor:
    """uint8 [B, C, H, W] -> uint8 [B, C, oh, ow], each image cropped and resized.

    ``boxes``: int32 [B, 5] on the images' device: top, left, height, width and
    a flip flag (non-zero: mirror the output). ``ky``/``kx``: taps per window
    (an upper bound; see ``aa_weights``). The weights are computed in the kernel.
    """
    b, c = images.shape[:2]
    out = torch.empty((b, c, oh, ow), dtype=torch.uint8, device=images.device)
    if b == 0:
        return out
    block_h, block_w, warps = TILE
    grid = (b, triton.cdiv(oh, block_h), triton.cdiv(ow, block_w))
    _resample_kernel[grid](
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
        num_warps=warps,
    )
    return out
