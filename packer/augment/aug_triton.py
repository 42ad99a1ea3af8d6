"""Triton kernels behind the policies (TrivialAugmentWide, RandAugment, AutoAugment,
AugMix) and MixUp on CUDA.

A policy stage (one op per image) is two launches over the whole batch, whatever
ops the images drew, driven by a per-image float32 table (columns ``COL_*``):

* ``_lut_kernel``, one program per (image, channel): the ops that map each
  channel's values through a table (brightness, contrast, posterize, solarize,
  autocontrast, equalize, invert) build that 256-entry table, reading the image
  only where the op needs a statistic (the mean of the luma, the channel's
  extremes or histogram);
* ``_apply_kernel``, one program per tile of one image, all channels: the
  image's op picked by a scalar branch (a copy, the lookup, an affine warp
  sampled from the uint8 input, the saturation blend with the luma, or the 3x3
  sharpness blend), uint8 in, uint8 out, each output byte written once.

Each op follows the float32 arithmetic of :mod:`packer.augment.functional`
(torchvision's), so outputs equal the batched ops' but where a sum is taken in
another order or a multiply-add is fused: a level apart at a few pixels in a
million (a nearest sample exactly between two pixels may take the other).
Imported only when CUDA work asks for it; under ``TRITON_INTERPRET=1`` the
kernels also run on CPU tensors (the tests).
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

# the recipe's tail (Normalize + RandomErasing + MixUp/CutMix) has a module of its own;
# its layout constants and launcher stay reachable here (packer.augment.fused calls ``tail``)
from .tail_triton import TAIL_CUTMIX as TAIL_CUTMIX
from .tail_triton import TAIL_HEAD as TAIL_HEAD
from .tail_triton import TAIL_MIXUP as TAIL_MIXUP
from .tail_triton import TAIL_NONE as TAIL_NONE
from .tail_triton import tail as tail

# Columns of the per-image table, float32 [B, NCOL].
COL_KIND, COL_LUT, COL_R, COL_OMR, COL_PARAM, COL_ROWS = 0, 1, 2, 3, 4, 5
NCOL = 12
# Kinds (the main kernel's branch) and lookup ops (the table kernel's branch).
KIND_COPY, KIND_LUT, KIND_WARP, KIND_SATURATION, KIND_SHARPNESS = 0, 1, 2, 3, 4
LUT_BRIGHTNESS, LUT_CONTRAST, LUT_POSTERIZE, LUT_SOLARIZE = 1, 2, 3, 4
LUT_AUTOCONTRAST, LUT_EQUALIZE, LUT_INVERT = 5, 6, 7

STATS_BLOCK = 1024
TILE = (16, 64, 4)  # rows, columns, warps of one program of the main kernel


@triton.jit
def _rint(x):
    """Round half to even (torch's ``round``, CUDA's ``nearbyint``), from floor alone."""
    r = tl.floor(x + 0.5)
    tie = (r - x) == 0.5
    odd = (r - 2.0 * tl.floor(r * 0.5)) == 1.0
    return tl.where(tie & odd, r - 1.0, r)


@triton.jit
def _smooth_weight(k: tl.constexpr):
    if k == 4:
        return 5.0 / 13.0
    return 1.0 / 13.0


@triton.jit
def _lut_kernel(
    x_ptr, tab_ptr, lut_ptr, HW, C: tl.constexpr, NC: tl.constexpr, BLOCK: tl.constexpr
):
    b = tl.program_id(0)
    c = tl.program_id(1)
    row = tab_ptr + b * NC
    kind = tl.load(row).to(tl.int32)
    if kind == 1:
        op = tl.load(row + 1).to(tl.int32)
        r = tl.load(row + 2)
        omr = tl.load(row + 3)
        p = tl.load(row + 4)
        v = tl.arange(0, 256)
        vf = v.to(tl.float32)
        img = x_ptr + b.to(tl.int64) * (C * HW)
        chan = img + c * HW
        y = vf
        if op == 1:  # brightness: img * f, clamped
            y = tl.minimum(tl.maximum(vf * r, 0.0), 255.0)
        elif op == 2:  # contrast: blend with the mean of the floored luma
            acc = tl.zeros((BLOCK,), tl.float32)
            for start in range(0, HW, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                mc = offs < HW
                if C == 3:
                    rr = tl.load(img + offs, mask=mc, other=0).to(tl.float32)
                    gg = tl.load(img + HW + offs, mask=mc, other=0).to(tl.float32)
                    bb = tl.load(img + 2 * HW + offs, mask=mc, other=0).to(tl.float32)
                    acc += tl.floor(rr * 0.2989 + gg * 0.587 + bb * 0.114)
                else:
                    acc += tl.load(img + offs, mask=mc, other=0).to(tl.float32)
            mean = tl.sum(acc, 0) / HW
            y = tl.minimum(tl.maximum(vf * r + mean * omr, 0.0), 255.0)
        elif op == 3:  # posterize: p is the mask of the kept bits
            y = (v & p.to(tl.int32)).to(tl.float32)
        elif op == 4:  # solarize: invert from the threshold p up
            y = tl.where(vf >= p, 255.0 - vf, vf)
        elif op == 5:  # autocontrast: the channel stretched to [0, 255]
            lo = tl.full((BLOCK,), 255, tl.int32)
            hi = tl.zeros((BLOCK,), tl.int32)
            for start in range(0, HW, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                ma = offs < HW
                xa = tl.load(chan + offs, mask=ma, other=0).to(tl.int32)
                lo = tl.minimum(lo, tl.where(ma, xa, 255))
                hi = tl.maximum(hi, xa)
            lo_f = tl.min(lo, 0).to(tl.float32)
            hi_f = tl.max(hi, 0).to(tl.float32)
            flat = hi_f == lo_f
            scale = tl.where(flat, 1.0, (hi_f - lo_f) * (1.0 / 255))
            lo_f = tl.where(flat, 0.0, lo_f)
            y = tl.minimum(tl.maximum(tl.math.div_rn(vf - lo_f, scale), 0.0), 255.0)
        elif op == 6:  # equalize: PIL's table from the channel's histogram
            hist = tl.zeros((256,), tl.int32)
            for start in range(0, HW, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                xe = tl.load(chan + offs, mask=offs < HW, other=0).to(tl.int32)
                hist += tl.histogram(xe, 256)
            pad = tl.cdiv(HW, BLOCK) * BLOCK - HW  # masked loads counted as zeros
            hist -= tl.where(v == 0, pad, 0)
            cum = tl.cumsum(hist, 0)
            last = tl.max(tl.where(hist > 0, v, 0), 0)
            step = (HW - tl.sum(tl.where(v == last, hist, 0), 0)) // 255
            lut = ((cum - hist) + step // 2) // tl.maximum(step, 1)
            y = tl.where(step == 0, vf, tl.minimum(lut, 255).to(tl.float32))
        elif op == 7:  # invert
            y = 255.0 - vf
        tl.store(lut_ptr + (b * C + c) * 256 + v, y.to(tl.uint8))


# Over 100 lines but one piece: every op's branch shares the tile's loads, warp and store.
@triton.jit
def _apply_kernel(
    x_ptr,
    out_ptr,
    tab_ptr,
    lut_ptr,
    fill_ptr,
    H,
    W,
    C: tl.constexpr,
    NC: tl.constexpr,
    BILINEAR: tl.constexpr,
    HAS_FILL: tl.constexpr,
    ROUND: tl.constexpr,
    BH: tl.constexpr,
    BW: tl.constexpr,
):
    b = tl.program_id(0)
    i = tl.program_id(1) * BH + tl.arange(0, BH)[:, None]
    j = tl.program_id(2) * BW + tl.arange(0, BW)[None, :]
    m = (i < H) & (j < W)
    HW = H * W
    base = b.to(tl.int64) * (C * HW)
    src = x_ptr + base
    dst = out_ptr + base
    pix = i * W + j
    row = tab_ptr + b * NC
    kind = tl.load(row).to(tl.int32)
    if kind == 2:  # affine warp: torchvision's grid, grid_sample(align_corners=False)
        m0 = tl.load(row + 5)
        m1 = tl.load(row + 6)
        m2 = tl.load(row + 7)
        m3 = tl.load(row + 8)
        m4 = tl.load(row + 9)
        m5 = tl.load(row + 10)
        xc = j.to(tl.float32) - (W - 1) * 0.5
        yc = i.to(tl.float32) - (H - 1) * 0.5
        gx = xc * m0 + yc * m1 + m2
        gy = xc * m3 + yc * m4 + m5
        ix = ((gx + 1.0) * W - 1.0) * 0.5
        iy = ((gy + 1.0) * H - 1.0) * 0.5
        if BILINEAR:
            x0 = tl.floor(ix)
            y0 = tl.floor(iy)
            x1 = x0 + 1.0
            y1 = y0 + 1.0
            w_nw = (x1 - ix) * (y1 - iy)
            w_ne = (ix - x0) * (y1 - iy)
            w_sw = (x1 - ix) * (iy - y0)
            w_se = (ix - x0) * (iy - y0)
            ok_x0 = (x0 >= 0) & (x0 < W)
            ok_x1 = (x1 >= 0) & (x1 < W)
            ok_y0 = (y0 >= 0) & (y0 < H)
            ok_y1 = (y1 >= 0) & (y1 < H)
            ok_nw = m & ok_x0 & ok_y0
            ok_ne = m & ok_x1 & ok_y0
            ok_sw = m & ok_x0 & ok_y1
            ok_se = m & ok_x1 & ok_y1
            xi0 = x0.to(tl.int32)
            yi0 = y0.to(tl.int32)
            p_nw = yi0 * W + xi0
            if HAS_FILL:
                cover = tl.where(ok_nw, w_nw, 0.0)
                cover += tl.where(ok_ne, w_ne, 0.0)
                cover += tl.where(ok_sw, w_sw, 0.0)
                cover += tl.where(ok_se, w_se, 0.0)
            for c in tl.static_range(C):
                s = src + c * HW
                acc = tl.where(
                    ok_nw, tl.load(s + p_nw, mask=ok_nw, other=0).to(tl.float32) * w_nw, 0.0
                )
                acc += tl.where(
                    ok_ne, tl.load(s + p_nw + 1, mask=ok_ne, other=0).to(tl.float32) * w_ne, 0.0
                )
                acc += tl.where(
                    ok_sw, tl.load(s + p_nw + W, mask=ok_sw, other=0).to(tl.float32) * w_sw, 0.0
                )
                acc += tl.where(ok_se, tl.load(s + p_nw + W + 1, mask=ok_se, other=0).to(tl.float32) * w_se, 0.0)  # fmt: skip
                if HAS_FILL:
                    f = tl.load(fill_ptr + c)
                    acc = (acc - f) * cover + f
                tl.store(dst + c * HW + pix, _rint(acc).to(tl.uint8), mask=m)
        else:
            xn = _rint(ix)
            yn = _rint(iy)
            ok = m & (xn >= 0) & (xn < W) & (yn >= 0) & (yn < H)
            p_n = yn.to(tl.int32) * W + xn.to(tl.int32)
            for c in tl.static_range(C):
                val = tl.load(src + c * HW + p_n, mask=ok, other=0).to(tl.float32)
                if HAS_FILL:
                    val = tl.where(ok, val, tl.load(fill_ptr + c))
                if ROUND:
                    val = _rint(val)
                tl.store(dst + c * HW + pix, val.to(tl.uint8), mask=m)
    elif kind == 3:  # saturation: blend with the floored luma
        s_r = tl.load(row + 2)
        s_omr = tl.load(row + 3)
        s_rr = tl.load(src + pix, mask=m, other=0).to(tl.float32)
        s_gg = tl.load(src + HW + pix, mask=m, other=0).to(tl.float32)
        s_bb = tl.load(src + 2 * HW + pix, mask=m, other=0).to(tl.float32)
        gray = tl.floor(s_rr * 0.2989 + s_gg * 0.587 + s_bb * 0.114)
        for c in tl.static_range(C):
            s_x = tl.load(src + c * HW + pix, mask=m, other=0).to(tl.float32)
            s_y = tl.minimum(tl.maximum(s_x * s_r + gray * s_omr, 0.0), 255.0)
            tl.store(dst + c * HW + pix, s_y.to(tl.uint8), mask=m)
    elif kind == 4:  # sharpness: blend with the rounded 3x3 smooth, the border kept
        h_omr = tl.load(row + 3)
        inner = m & (i >= 1) & (i < H - 1) & (j >= 1) & (j < W - 1)
        for c in tl.static_range(C):
            h_src = src + c * HW
            h_x = tl.load(h_src + pix, mask=m, other=0).to(tl.float32)
            # PIL's SMOOTH kernel (1 1 1 / 1 5 1 / 1 1 1) / 13, row by row as the conv sums
            h_acc = tl.zeros((BH, BW), tl.float32)
            for dy in tl.static_range(3):
                for dx in tl.static_range(3):
                    q = tl.load(h_src + pix + (dy - 1) * W + (dx - 1), mask=inner, other=0)
                    h_acc += q.to(tl.float32) * _smooth_weight(dy * 3 + dx)
            h_y = h_x + (_rint(h_acc) - h_x) * h_omr
            h_y = tl.where(inner, tl.minimum(tl.maximum(h_y, 0.0), 255.0), h_x)
            tl.store(dst + c * HW + pix, h_y.to(tl.uint8), mask=m)
    else:  # a copy, or each channel through its table
        for c in tl.static_range(C):
            u = tl.load(src + c * HW + pix, mask=m, other=0)
            if kind == 1:
                u = tl.load(lut_ptr + (b * C + c) * 256 + u.to(tl.int32), mask=m, other=0)
            tl.store(dst + c * HW + pix, u, mask=m)


def apply_stage(
    images: torch.Tensor,
    table: torch.Tensor,
    fill: torch.Tensor | None,
    bilinear: bool,
    round_nearest: bool,
    needs_lut: bool,
) -> torch.Tensor:
    """One op per image on ``images`` (uint8 [B, C, H, W], contiguous), as ``table``
    (float32 [B, NCOL] on the same device) says; returns a new uint8 tensor.
    ``fill``: float32 [C] on the device, or None (zero padding); ``needs_lut``:
    whether any image's op is a lookup."""
    b, c, h, w = images.shape
    out = torch.empty_like(images)
    lut = torch.empty((b, c, 256) if needs_lut else (1,), dtype=torch.uint8, device=images.device)
    if needs_lut:
        _lut_kernel[(b, c)](images, table, lut, h * w, C=c, NC=NCOL, BLOCK=STATS_BLOCK)
    bh, bw, warps = TILE
    grid = (b, triton.cdiv(h, bh), triton.cdiv(w, bw))
    _apply_kernel[grid](
        images,
        out,
        table,
        lut,
        table if fill is None else fill,
        h,
        w,
        C=c,
        NC=NCOL,
        BILINEAR=bilinear,
        HAS_FILL=fill is not None,
        ROUND=round_nearest,
        BH=bh,
        BW=bw,
        num_warps=warps,
    )
    return out


@triton.jit
def _mix_kernel(x_ptr, out_ptr, a, c, N, B, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    prev = tl.where(b == 0, B - 1, b - 1).to(tl.int64)
    x = tl.load(x_ptr + b.to(tl.int64) * N + offs, mask=m, other=0.0)
    xp = tl.load(x_ptr + prev * N + offs, mask=m, other=0.0)
    tl.store(out_ptr + b.to(tl.int64) * N + offs, xp * a + x * c, mask=m)


MIX_BLOCK = 4096


def mixup(x: torch.Tensor, lam: float) -> torch.Tensor:
    """``x.roll(1, 0) * (1 - lam) + x * lam`` for float32 ``x`` [B, ...] (contiguous) in
    one pass, rounded after each product and the sum as the three torch ops are
    (no fused multiply-add): equal to torchvision's MixUp bit for bit."""
    b = x.shape[0]
    n = x[0].numel()
    out = torch.empty_like(x)
    if x.numel() == 0:
        return out
    a, c = float(np.float32(1.0 - lam)), float(np.float32(lam))  # torch's scalars, in float32
    grid = (b, triton.cdiv(n, MIX_BLOCK))
    _mix_kernel[grid](x, out, a, c, n, b, BLOCK=MIX_BLOCK, enable_fp_fusion=False)
    return out


@triton.jit
def _erase_kernel(x_ptr, out_ptr, box_ptr, v_ptr, H, W, C: tl.constexpr, INPLACE: tl.constexpr,
                  BH: tl.constexpr, BW: tl.constexpr):  # fmt: skip
    b = tl.program_id(0)
    i = tl.program_id(1) * BH + tl.arange(0, BH)[:, None]
    j = tl.program_id(2) * BW + tl.arange(0, BW)[None, :]
    top = tl.load(box_ptr + b * 4)
    left = tl.load(box_ptr + b * 4 + 1)
    bh = tl.load(box_ptr + b * 4 + 2)
    bw = tl.load(box_ptr + b * 4 + 3)
    m = (i < H) & (j < W)
    inside = m & (i >= top) & (i < top + bh) & (j >= left) & (j < left + bw)
    base = b.to(tl.int64) * (C * H * W)
    pix = i * W + j
    for c in tl.static_range(C):
        v = tl.load(v_ptr + c)
        if INPLACE:
            tl.store(
                x_ptr + base + c * H * W + pix, tl.zeros_like(pix).to(v.dtype) + v, mask=inside
            )
        else:
            x = tl.load(x_ptr + base + c * H * W + pix, mask=m, other=0)
            tl.store(out_ptr + base + c * H * W + pix, tl.where(inside, v, x), mask=m)


ERASE_TILE = (8, 128, 4)


def erase(x: torch.Tensor, boxes: torch.Tensor, value: torch.Tensor, inplace: bool) -> torch.Tensor:
    """Each image's box (top, left, height, width: int32 [B, 4] on the device) set to
    ``value`` (one per channel, of ``x``'s dtype, on the device), ``x`` contiguous
    [B, C, H, W]: one pass writing a new tensor, or with ``inplace`` only the boxes'
    pixels of ``x``."""
    b, c, h, w = x.shape
    out = x if inplace else torch.empty_like(x)
    if x.numel() == 0:
        return out
    bh, bw, warps = ERASE_TILE
    grid = (b, triton.cdiv(h, bh), triton.cdiv(w, bw))
    _erase_kernel[grid](x, out, boxes, value, h, w, C=c, INPLACE=inplace, BH=bh, BW=bw,
                        num_warps=warps)  # fmt: skip
    return out
