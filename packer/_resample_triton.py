"""Triton kernel behind :func:`packer.transforms.resized_crop` on CUDA.

One program computes a BLOCK_H x BLOCK_W tile of one output image, all
channels: for each of its rows the window of input rows (``iy``, ``wy``), for
each column the window of input columns (``ix``, ``wx``), and
``out = sum_ky wy * sum_kx wx * X[iy, ix]`` in float32, rounded to uint8.
Reads only the input pixels under each window (from L1/L2), writes each output
byte once: memory-bound, with no float copy of the batch. Imported only when
CUDA work asks for it (Triton compiles on first use per tap count).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _resample_kernel(
    x_ptr,
    out_ptr,
    iy_ptr,
    wy_ptr,
    ix_ptr,
    wx_ptr,
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
    mi = i < oh
    mj = j < ow
    b64 = b.to(tl.int64)
    x_base = x_ptr + b64 * sxb
    out_base = out_ptr + b64 * (C * oh * ow)
    yrow = (b64 * oh + i) * KY
    xcol = (b64 * ow + j) * KX
    mask = mi[:, None] & mj[None, :]
    for c in tl.static_range(C):
        acc = tl.zeros((BLOCK_H, BLOCK_W), dtype=tl.float32)
        for ky in tl.static_range(KY):
            yy = tl.load(iy_ptr + yrow + ky, mask=mi, other=0)
            wyk = tl.load(wy_ptr + yrow + ky, mask=mi, other=0.0)
            row = tl.zeros((BLOCK_H, BLOCK_W), dtype=tl.float32)
            for kx in tl.static_range(KX):
                xx = tl.load(ix_ptr + xcol + kx, mask=mj, other=0)
                wxk = tl.load(wx_ptr + xcol + kx, mask=mj, other=0.0)
                v = tl.load(
                    x_base + c * sxc + yy[:, None] * sxh + xx[None, :] * sxw, mask=mask, other=0
                )
                row += v.to(tl.float32) * wxk[None, :]
            acc += row * wyk[:, None]
        acc = tl.minimum(tl.maximum(acc + 0.5, 0.0), 255.0)
        tl.store(
            out_base + c * (oh * ow) + i[:, None] * ow + j[None, :], acc.to(tl.uint8), mask=mask
        )


def resample(
    images: torch.Tensor,
    iy: torch.Tensor,
    wy: torch.Tensor,
    ix: torch.Tensor,
    wx: torch.Tensor,
    oh: int,
    ow: int,
) -> torch.Tensor:
    """uint8 [B, C, H, W] -> uint8 [B, C, oh, ow] through windowed weights.

    ``iy``/``wy``: int64/float32 [B, oh, KY] input rows and weights per output
    row; ``ix``/``wx``: [B, ow, KX] likewise for columns (see ``aa_weights``).
    """
    b, c = images.shape[:2]
    ky, kx = iy.shape[2], ix.shape[2]
    out = torch.empty((b, c, oh, ow), dtype=torch.uint8, device=images.device)
    if b == 0:
        return out
    block_h, block_w = 16, 32
    grid = (b, triton.cdiv(oh, block_h), triton.cdiv(ow, block_w))
    _resample_kernel[grid](
        images,
        out,
        iy.to(torch.int32).contiguous(),
        wy.contiguous(),
        ix.to(torch.int32).contiguous(),
        wx.contiguous(),
        *images.stride(),
        oh,
        ow,
        C=c,
        KY=ky,
        KX=kx,
        BLOCK_H=block_h,
        BLOCK_W=block_w,
        num_warps=4,
    )
    return out
