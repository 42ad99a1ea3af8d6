"""The Triton kernels behind :mod:`packer.imaging.resample_triton` (which launches them):
per output tile, each row's and column's window of input pixels and its weights (the
rules of ``packer.imaging.resize.filter_weights`` mirrored for each filter code ``FILT``),
then ``out = sum_ky wy * sum_kx wx * X[iy, ix]`` in float32, rounded to uint8.
:func:`resample_kernel` gathers, :func:`resample_dot_kernel` does each tile as two small
dot products over a dense weight patch, :func:`resample_ragged_kernel` takes images where
they lie, each to its own output row. Compiled on first use per tap count.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _cubic(x, A: tl.constexpr):
    """Keys' cubic convolution kernel (a = A), 0 beyond 2."""
    x = tl.abs(x)
    near = ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    far = ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A
    return tl.where(x < 1.0, near, tl.where(x < 2.0, far, 0.0))


@triton.jit
def _filter(x, FILT: tl.constexpr):
    """The antialias-form filters: triangle (0, 5), cubic a = -0.5 (3), lanczos-3 (4)."""
    if FILT == 3:
        w = _cubic(x, -0.5)
    elif FILT == 4:
        ax = tl.abs(x)
        px = ax * 3.141592653589793
        safe = tl.where(ax == 0.0, 1.0, px)
        w = tl.sin(safe) * tl.sin(safe / 3.0) * 3.0 / (safe * safe)
        w = tl.where(ax < 3.0, tl.where(ax == 0.0, 1.0, w), 0.0)
    else:
        w = tl.maximum(1.0 - tl.abs(x), 0.0)
    return w


@triton.jit
def _nearest(o, scale, length, FILT: tl.constexpr):
    """torch's nearest (1: floor(o * scale)) or nearest-exact (2: floor((o + .5) * scale))
    source index, inside the crop; float32 as torch's ``floorf``."""
    of = o.to(tl.float32)
    if FILT == 2:
        of = of + 0.5
    return tl.minimum(tl.floor(of * scale).to(tl.int32), length - 1)


@triton.jit
def _stretch(scale, FILT: tl.constexpr):
    """How far the filter is stretched: the scale when antialiased and downscaling."""
    if FILT == 5 or FILT == 6:  # noqa: SIM108 (Triton: a constexpr branch)
        st = scale * 0.0 + 1.0
    else:
        st = tl.maximum(scale, 1.0)
    return st


@triton.jit
def _support(stretch, FILT: tl.constexpr):
    """The window's half width: the filter's at scale 1 (resize.py's _HALF), stretched."""
    if FILT == 3:
        sup = stretch * 2.0
    elif FILT == 4:
        sup = stretch * 3.0
    else:
        sup = stretch * 1.0
    return sup


@triton.jit
def _window(o, n_out, start, length, flip, K: tl.constexpr, k: tl.constexpr, FILT: tl.constexpr):
    """Input index and unnormalised weight of tap ``k`` for output positions ``o``."""
    o = tl.where(flip != 0, n_out - 1 - o, o)
    scale = length.to(tl.float32) / n_out
    if FILT == 0:
        support = tl.maximum(scale, 1.0)
        centre = scale * (o.to(tl.float32) + 0.5)
        first = tl.maximum(tl.floor(centre - support + 0.5), 0.0)
        j = first + k
        w = tl.maximum(1.0 - tl.abs((j - centre + 0.5) / support), 0.0)
        w = tl.where(j < length.to(tl.float32), w, 0.0)
        idx = start + tl.minimum(j.to(tl.int32), length - 1)
    elif FILT == 1 or FILT == 2:
        idx = start + _nearest(o, scale, length, FILT)
        w = tl.where(o >= 0, 1.0, 0.0)
    elif FILT == 6:  # bicubic unantialiased: 4 taps, border pixels repeated
        src = scale * (o.to(tl.float32) + 0.5) - 0.5
        j = tl.floor(src) - 1.0 + k
        w = _cubic(src - j, -0.75)
        idx = start + tl.minimum(tl.maximum(j.to(tl.int32), 0), length - 1)
    else:
        stretch = _stretch(scale, FILT)
        support = _support(stretch, FILT)
        centre = scale * (o.to(tl.float32) + 0.5)
        first = tl.maximum(tl.floor(centre - support + 0.5), 0.0)
        j = first + k
        w = _filter((j - centre + 0.5) / stretch, FILT)
        w = tl.where(j < length.to(tl.float32), w, 0.0)
        idx = start + tl.minimum(j.to(tl.int32), length - 1)
    return idx, w


@triton.jit
def resample_kernel(
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
    FILT: tl.constexpr,
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
        _, w = _window(i, oh, top, bh, 0, KY, ky, FILT)
        sy += w
    sx = tl.zeros((BLOCK_W,), dtype=tl.float32)
    for kx in tl.static_range(KX):
        _, w = _window(j, ow, left, bw, flip, KX, kx, FILT)
        sx += w
    sy = 1.0 / tl.maximum(sy, 1e-12)
    sx = 1.0 / tl.maximum(sx, 1e-12)
    for c in tl.static_range(C):
        acc = tl.zeros((BLOCK_H, BLOCK_W), dtype=tl.float32)
        for ky in tl.static_range(KY):
            yy, wy = _window(i, oh, top, bh, 0, KY, ky, FILT)
            row = tl.zeros((BLOCK_H, BLOCK_W), dtype=tl.float32)
            for kx in tl.static_range(KX):
                xx, wx = _window(j, ow, left, bw, flip, KX, kx, FILT)
                v = tl.load(
                    x_base + c * sxc + yy[:, None] * sxh + xx[None, :] * sxw, mask=mask, other=0
                )
                row += v.to(tl.float32) * (wx * sx)[None, :]
            if (
                FILT == 3 or FILT == 4 or FILT == 6
            ):  # the width pass as bytes, as torch's uint8 kernel
                row = tl.minimum(tl.maximum(tl.floor(row + 0.5), 0.0), 255.0)
            acc += row * (wy * sy)[:, None]
        acc = tl.minimum(tl.maximum(acc + 0.5, 0.0), 255.0)
        tl.store(
            out_base + c * (oh * ow) + i[:, None] * ow + j[None, :], acc.to(tl.uint8), mask=mask
        )


@triton.jit
def _dense_weights(
    o0, n_out, length, flip, BLOCK: tl.constexpr, SPAN: tl.constexpr, FILT: tl.constexpr
):
    """Weights [BLOCK, SPAN] of output positions o0.. over SPAN inputs from ``first``.

    Rows sum to 1; the filter is zero outside each window, as in ``_window``.
    ``first`` (int32, relative to the crop) is the start of the lowest window.
    """
    o = o0 + tl.arange(0, BLOCK)
    o = tl.minimum(o, n_out - 1)  # tail of the last tile: computed, never stored
    o = tl.where(flip != 0, n_out - 1 - o, o)
    scale = length.to(tl.float32) / n_out
    lo = tl.where(flip != 0, tl.maximum(n_out - o0 - BLOCK, 0), o0)
    if FILT == 0:  # bilinear, antialiased: the parts kernel's rule over the whole span
        first, w = _triangle_part(o0, n_out, length, flip, 0, BLOCK, SPAN)
        w = w / tl.maximum(tl.sum(w, axis=1), 1e-12)[:, None]
    elif FILT == 1 or FILT == 2:  # one input per output
        src = _nearest(o, scale, length, FILT)
        first = _nearest(lo, scale, length, FILT).to(tl.float32)
        j = first + tl.arange(0, SPAN).to(tl.float32)
        w = tl.where(j[None, :] == src.to(tl.float32)[:, None], 1.0, 0.0)
    elif FILT == 6:  # bicubic unantialiased: 4 taps, border pixels repeated
        src = scale * (o.to(tl.float32) + 0.5) - 0.5
        f = tl.floor(src)
        first = tl.maximum(tl.floor(scale * (lo.to(tl.float32) + 0.5) - 0.5) - 1.0, 0.0)
        j = first + tl.arange(0, SPAN).to(tl.float32)
        last = (length - 1).to(tl.float32)
        w = tl.zeros((BLOCK, SPAN), dtype=tl.float32)
        for k in tl.static_range(4):
            jk = f - 1.0 + k
            at = tl.minimum(tl.maximum(jk, 0.0), last)
            wk = _cubic(src - jk, -0.75)
            w += tl.where(j[None, :] == at[:, None], wk[:, None], 0.0)
    else:
        stretch = _stretch(scale, FILT)
        support = _support(stretch, FILT)
        centre = scale * (o.to(tl.float32) + 0.5)
        first = tl.maximum(tl.floor(scale * (lo.to(tl.float32) + 0.5) - support + 0.5), 0.0)
        j = first + tl.arange(0, SPAN).to(tl.float32)
        w = _filter((j[None, :] - centre[:, None] + 0.5) / stretch, FILT)
        w = tl.where(j[None, :] < length.to(tl.float32), w, 0.0)
        w = w / tl.maximum(tl.sum(w, axis=1), 1e-12)[:, None]
    return first.to(tl.int32), w


@triton.jit
def _dot_tile(
    x_base,
    out_base,
    sxc,
    sxh,
    sxw,
    top,
    left,
    bh,
    bw,
    flip,
    i0,
    j0,
    oh,
    ow,
    C: tl.constexpr,
    SY: tl.constexpr,
    SX: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_W: tl.constexpr,
    FILT: tl.constexpr,
):
    # The tile's input patch [SY, SX] (one coalesced load per channel) goes
    # through two small matrix products on the tensor cores:
    # out[BLOCK_H, BLOCK_W] = Wy[BLOCK_H, SY] @ (X[SY, SX] @ Wx^T[SX, BLOCK_W]).
    fy, wy = _dense_weights(i0, oh, bh, 0, BLOCK_H, SY, FILT)
    fx, wx = _dense_weights(j0, ow, bw, flip, BLOCK_W, SX, FILT)
    wy = wy.to(tl.float16)
    wxt = tl.trans(wx).to(tl.float16)
    ry = fy + tl.arange(0, SY)
    rx = fx + tl.arange(0, SX)
    m_in = (ry < bh)[:, None] & (rx < bw)[None, :]
    src = x_base + (top + ry)[:, None] * sxh + (left + rx)[None, :] * sxw
    i = i0 + tl.arange(0, BLOCK_H)
    j = j0 + tl.arange(0, BLOCK_W)
    m_out = (i < oh)[:, None] & (j < ow)[None, :]
    dst = out_base + i[:, None] * ow + j[None, :]
    for c in tl.static_range(C):
        x = tl.load(src + c * sxc, mask=m_in, other=0).to(tl.float16)
        h = tl.dot(x, wxt)  # [SY, BLOCK_W], float32 accumulation
        if FILT == 3 or FILT == 4 or FILT == 6:  # the width pass as bytes, as torch's uint8 kernel
            h = tl.minimum(tl.maximum(tl.floor(h + 0.5), 0.0), 255.0)
        y = tl.dot(wy, h.to(tl.float16))
        y = tl.minimum(tl.maximum(y + 0.5, 0.0), 255.0)
        tl.store(dst + c * (oh * ow), y.to(tl.uint8), mask=m_out)


@triton.jit
def resample_dot_kernel(
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
    SY: tl.constexpr,
    SX: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_W: tl.constexpr,
    FILT: tl.constexpr,
):
    b = tl.program_id(0)
    top = tl.load(box_ptr + b * 5 + 0)
    left = tl.load(box_ptr + b * 5 + 1)
    bh = tl.load(box_ptr + b * 5 + 2)
    bw = tl.load(box_ptr + b * 5 + 3)
    flip = tl.load(box_ptr + b * 5 + 4)
    b64 = b.to(tl.int64)
    _dot_tile(
        x_ptr + b64 * sxb,
        out_ptr + b64 * (C * oh * ow),
        sxc,
        sxh,
        sxw,
        top,
        left,
        bh,
        bw,
        flip,
        tl.program_id(1) * BLOCK_H,
        tl.program_id(2) * BLOCK_W,
        oh,
        ow,
        C,
        SY,
        SX,
        BLOCK_H,
        BLOCK_W,
        FILT,
    )


@triton.jit
def _table_row(table_ptr, b):
    """Row ``b`` of a ragged table: (image address, top, left, height, width, flip,
    plane height, row pitch, output row)."""
    row = table_ptr + b * 9
    x_base = tl.load(row).to(tl.pointer_type(tl.uint8))
    top = tl.load(row + 1).to(tl.int32)
    left = tl.load(row + 2).to(tl.int32)
    bh = tl.load(row + 3).to(tl.int32)
    bw = tl.load(row + 4).to(tl.int32)
    flip = tl.load(row + 5).to(tl.int32)
    return x_base, top, left, bh, bw, flip, tl.load(row + 6), tl.load(row + 7), tl.load(row + 8)


# the table's slices start at any row (72 bytes each): one compiled kernel whatever their
# alignment, not two (a compile is ~1 s, paid mid-epoch when a new slice offset appears)
@triton.jit(do_not_specialize_on_alignment=["table_ptr"])
def resample_ragged_kernel(
    table_ptr,
    out_ptr,
    oh,
    ow,
    C: tl.constexpr,
    SY: tl.constexpr,
    SX: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_W: tl.constexpr,
    FILT: tl.constexpr,
):
    # Images of different sizes, each in its own allocation: row b of the int64
    # table is (address, top, left, height, width, flip, image height, image width,
    # output row) of a contiguous uint8 [C, H, W]. No padded copy of the batch is made.
    x_base, top, left, bh, bw, flip, ih, iw, dst = _table_row(table_ptr, tl.program_id(0))
    _dot_tile(
        x_base,
        out_ptr + dst * (C * oh * ow),
        ih * iw,
        iw,
        1,
        top,
        left,
        bh,
        bw,
        flip,
        tl.program_id(1) * BLOCK_H,
        tl.program_id(2) * BLOCK_W,
        oh,
        ow,
        C,
        SY,
        SX,
        BLOCK_H,
        BLOCK_W,
        FILT,
    )


@triton.jit
def _triangle_part(o0, n_out, length, flip, c0, BLOCK: tl.constexpr, T: tl.constexpr):
    """Bilinear (antialiased) weights [BLOCK, T] of output positions o0.. over the T
    inputs from ``first + c0``, not yet normalized: ``_dense_weights``' FILT 0 rule,
    one part of its span."""
    o = o0 + tl.arange(0, BLOCK)
    o = tl.minimum(o, n_out - 1)
    o = tl.where(flip != 0, n_out - 1 - o, o)
    scale = length.to(tl.float32) / n_out
    lo = tl.where(flip != 0, tl.maximum(n_out - o0 - BLOCK, 0), o0)
    support = tl.maximum(scale, 1.0)
    centre = scale * (o.to(tl.float32) + 0.5)
    first = tl.maximum(tl.floor(scale * (lo.to(tl.float32) + 0.5) - support + 0.5), 0.0)
    j = first + c0 + tl.arange(0, T).to(tl.float32)
    w = tl.maximum(1.0 - tl.abs((j[None, :] - centre[:, None] + 0.5) / support), 0.0)
    w = tl.where(j[None, :] < length.to(tl.float32), w, 0.0)
    return first.to(tl.int32), w


@triton.jit
def _triangle_sums(o0, n_out, length, flip, parts, BLOCK: tl.constexpr, T: tl.constexpr):
    """Each output's weight total over ``parts`` parts of T inputs (the normalizer)."""
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for p in range(parts):
        _, w = _triangle_part(o0, n_out, length, flip, p * T, BLOCK, T)
        total += tl.sum(w, axis=1)
    return tl.maximum(total, 1e-12)


@triton.jit(do_not_specialize_on_alignment=["table_ptr"])
def resample_ragged_parts_kernel(
    table_ptr,
    out_ptr,
    oh,
    ow,
    C: tl.constexpr,
    T: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    # resample_ragged_kernel's bilinear tile for any downscale: the input patch is taken
    # in T x T parts, a loop bounded at run time by the box's own scale, so one compiled
    # kernel serves every box (the single-patch kernel needs one compile per patch size,
    # over a minute for 256 x 256, and stops at 256).
    x_base, top, left, bh, bw, flip, ih, iw, dst = _table_row(table_ptr, tl.program_id(0))
    i0 = tl.program_id(1) * BLOCK_H
    j0 = tl.program_id(2) * BLOCK_W
    sy = bh.to(tl.float32) / oh
    sx = bw.to(tl.float32) / ow
    # inputs the tile's windows span (as resample_triton._span, without the power of 2)
    ny = tl.ceil((BLOCK_H - 1) * sy + 2.0 * tl.maximum(sy, 1.0)).to(tl.int32) + 2
    nx = tl.ceil((BLOCK_W - 1) * sx + 2.0 * tl.maximum(sx, 1.0)).to(tl.int32) + 2
    py = (ny + T - 1) // T
    px = (nx + T - 1) // T
    norm_y = _triangle_sums(i0, oh, bh, 0, py, BLOCK_H, T)
    norm_x = _triangle_sums(j0, ow, bw, flip, px, BLOCK_W, T)
    i = i0 + tl.arange(0, BLOCK_H)
    j = j0 + tl.arange(0, BLOCK_W)
    m_out = (i < oh)[:, None] & (j < ow)[None, :]
    out_base = out_ptr + dst * (C * oh * ow)
    d = out_base + i[:, None] * ow + j[None, :]
    plane = ih * iw
    for c in tl.static_range(C):
        acc = tl.zeros((BLOCK_H, BLOCK_W), dtype=tl.float32)
        for qy in range(py):
            fy, wy = _triangle_part(i0, oh, bh, 0, qy * T, BLOCK_H, T)
            wy = (wy / norm_y[:, None]).to(tl.float16)
            ry = fy + qy * T + tl.arange(0, T)
            h = tl.zeros((T, BLOCK_W), dtype=tl.float32)
            for qx in range(px):
                fx, wx = _triangle_part(j0, ow, bw, flip, qx * T, BLOCK_W, T)
                wxt = tl.trans(wx / norm_x[:, None]).to(tl.float16)
                rx = fx + qx * T + tl.arange(0, T)
                m_in = (ry < bh)[:, None] & (rx < bw)[None, :]
                src = x_base + c * plane + (top + ry)[:, None] * iw + (left + rx)[None, :]
                x = tl.load(src, mask=m_in, other=0).to(tl.float16)
                h += tl.dot(x, wxt)
            acc += tl.dot(wy, h.to(tl.float16))
        y = tl.minimum(tl.maximum(acc + 0.5, 0.0), 255.0)
        tl.store(d + c * (oh * ow), y.to(tl.uint8), mask=m_out)
