"""The Triton kernel of the recipe's tail on CUDA: Normalize, RandomErasing and MixUp or
CutMix (with the mixed one-hot labels) of a uint8 batch in one pass (:func:`tail`).

Called as ``aug_triton.tail`` by :mod:`packer.augment.fused` (``aug_triton`` re-exports it
and the parameter block's layout constants). Its tunables, ``TAIL_TILE`` and ``NORM_FMA``,
are this module's. Imported only when CUDA work asks for it; under ``TRITON_INTERPRET=1``
the kernel also runs on CPU tensors (the tests).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Layout of the tail's int32 parameter block on the device: the mixer's mode
# (TAIL_NONE, TAIL_MIXUP, TAIL_CUTMIX) and CutMix box (x1, y1, x2, y2), three
# spare words, then each image's erasing box (top, left, height, width).
TAIL_NONE, TAIL_MIXUP, TAIL_CUTMIX = 0, 1, 2
TAIL_HEAD = 8
TAIL_TILE = (8, 128, 4)
TAIL_LABELS_BLOCK = 1024
# torch's addcmul (Normalize) rounds once, a fused multiply-add, on the CPU and on CUDA
# (bit for bit on CUDA: python -m benchmarks.recipe --check); so does the tail.
NORM_FMA = True


@triton.jit
def _norm_erase(x, sc, sh, v, inside, ERASE: tl.constexpr, FMA: tl.constexpr):
    y = tl.fma(x, sc, sh) if FMA else x * sc + sh
    if ERASE:
        y = tl.where(inside, v, y)
    return y


@triton.jit
def _box_in(prm_ptr, b, i, j):
    top = tl.load(prm_ptr + b * 4)
    left = tl.load(prm_ptr + b * 4 + 1)
    bh = tl.load(prm_ptr + b * 4 + 2)
    bw = tl.load(prm_ptr + b * 4 + 3)
    return (i >= top) & (i < top + bh) & (j >= left) & (j < left + bw)


# Over 60 lines but one piece: the three ops share each tile's loads and its one store.
@triton.jit
def _tail_kernel(
    x_ptr,
    out_ptr,
    prm_ptr,
    norm_ptr,
    lab_ptr,
    soft_ptr,
    a,
    cc,
    H,
    W,
    K,
    C: tl.constexpr,
    ERASE: tl.constexpr,
    LABELS: tl.constexpr,
    FMA: tl.constexpr,
    BH: tl.constexpr,
    BW: tl.constexpr,
    KB: tl.constexpr,
):
    b = tl.program_id(0)
    nb = tl.num_programs(0)
    prev = tl.where(b == 0, nb - 1, b - 1)
    i = tl.program_id(1) * BH + tl.arange(0, BH)[:, None]
    j = tl.program_id(2) * BW + tl.arange(0, BW)[None, :]
    m = (i < H) & (j < W)
    HW = H * W
    pix = i * W + j
    mode = tl.load(prm_ptr)
    src = x_ptr + b.to(tl.int64) * (C * HW)
    src_p = x_ptr + prev.to(tl.int64) * (C * HW)
    dst = out_ptr + b.to(tl.int64) * (C * HW)
    boxes = prm_ptr + 8  # TAIL_HEAD
    in_b = m
    in_p = m
    if ERASE:
        in_b = _box_in(boxes, b, i, j)
        in_p = _box_in(boxes, prev, i, j)
    cut = m & (i >= tl.load(prm_ptr + 2)) & (i < tl.load(prm_ptr + 4))
    cut = cut & (j >= tl.load(prm_ptr + 1)) & (j < tl.load(prm_ptr + 3)) & (mode == 2)
    for c in tl.static_range(C):
        sc = tl.load(norm_ptr + c)
        sh = tl.load(norm_ptr + C + c)
        v = tl.load(norm_ptr + 2 * C + c)
        x = tl.load(src + c * HW + pix, mask=m, other=0).to(tl.float32)
        y = _norm_erase(x, sc, sh, v, in_b, ERASE, FMA)
        if mode == 1:  # MixUp: torchvision's x.roll(1) * (1 - lam) + x * lam, unfused
            xp = tl.load(src_p + c * HW + pix, mask=m, other=0).to(tl.float32)
            yp = _norm_erase(xp, sc, sh, v, in_p, ERASE, FMA)
            y = yp * a + y * cc
        elif mode == 2:  # CutMix: the box from the previous image
            xp = tl.load(src_p + c * HW + pix, mask=cut, other=0).to(tl.float32)
            yp = _norm_erase(xp, sc, sh, v, in_p, ERASE, FMA)
            y = tl.where(cut, yp, y)
        tl.store(dst + c * HW + pix, y, mask=m)
    if LABELS:  # noqa: SIM102 (compile-time flag outside, runtime test inside)
        if (tl.program_id(1) == 0) & (tl.program_id(2) == 0):
            yl = tl.load(lab_ptr + b)
            yq = tl.load(lab_ptr + prev)
            for k0 in range(0, K, KB):
                ks = k0 + tl.arange(0, KB)
                t = (ks == yl).to(tl.float32)
                tp = (ks == yq).to(tl.float32)
                s = tp * a + t * cc
                tl.store(soft_ptr + b.to(tl.int64) * K + ks, s, mask=ks < K)


def tail(
    images: torch.Tensor,
    params: torch.Tensor,
    norm: torch.Tensor,
    erase: bool,
    labels: torch.Tensor | None,
    num_classes: int,
    a: float,
    c: float,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Normalize, erase and mix a uint8 batch [B, C, H, W] (contiguous) in one pass.

    ``params``: int32 on the device, ``TAIL_HEAD`` words (the mixer's mode and
    CutMix box) then, with ``erase``, each image's box [B, 4]; ``norm``: float32
    [3 C] on the device (the scales of uint8 values, the shifts, the erased value
    per channel); ``a``, ``c``: MixUp's ``1 - lam`` and ``lam`` (CutMix: the label
    weights), float32 values. Returns float32 images and, given class indices
    ``labels`` (int64 [B] on the device), their mixed one-hot labels [B, K].
    """
    b, ch, h, w = images.shape
    out = torch.empty(images.shape, dtype=torch.float32, device=images.device)
    soft = None
    if labels is not None:
        soft = torch.empty((b, num_classes), dtype=torch.float32, device=images.device)
    if b == 0:
        return out, soft
    bh, bw, warps = TAIL_TILE
    grid = (b, triton.cdiv(h, bh), triton.cdiv(w, bw))
    _tail_kernel[grid](
        images,
        out,
        params,
        norm,
        params if labels is None else labels,
        out if soft is None else soft,
        a,
        c,
        h,
        w,
        max(num_classes, 1),
        C=ch,
        ERASE=erase,
        LABELS=labels is not None,
        FMA=NORM_FMA,
        BH=bh,
        BW=bw,
        KB=TAIL_LABELS_BLOCK,
        num_warps=warps,
        enable_fp_fusion=False,
    )
    return out, soft
