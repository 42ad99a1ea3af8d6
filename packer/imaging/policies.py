"""Automatic augmentation policies, per image: TrivialAugmentWide, RandAugment,
AutoAugment and AugMix.

Each takes ``images``: Tensor[B, C, H, W] uint8 in [0, 255] (C = 3, or 1), on the
CPU or CUDA, and returns uint8 of the same shape on the same device. Every image
draws its own op, magnitude bin and sign, with torchvision's v2 op spaces,
magnitude tables and rules (``torchvision.transforms.v2._auto_augment``): the
op uniform over the space, the bin uniform (TrivialAugmentWide) or fixed
(RandAugment), the sign negative where a uniform draw is <= 0.5 for the signed
ops. :meth:`sample` returns the draws (a :class:`PolicyDraw`).

Pixels: a batch's draws come from ``generator`` on the CPU in one call (AugMix:
three), become per-image parameters in numpy (the geometric ops' affine matrices
in float64, as torchvision computes them), and the batch's gathers go to the
device in one copy. Images are grouped by the batched op of
:mod:`packer.imaging.functional` they need: the five geometric ops (shear,
translate, rotate) are one affine warp, each colour op one call. Per op stage:
one gather puts the images in op order, each op runs once on its contiguous
slice, one ``cat`` joins them; one gather restores the batch order at the end.
A batch costs one call per op present, whatever its size: at most ten for
TrivialAugmentWide. On the CPU, outputs equal torchvision's image by image.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from . import functional as F
from .functional import _to
from .transforms import _check_images, _Transform

# ---------------------------------------------------------------- op spaces

# Per op name, (magnitudes, signed), the magnitudes over the bins being: ("lin", a, b)
# torchvision's linspace(a, b); ("posterize", top, k) its (top - arange / ((bins - 1)
# / k)).round(); ("width" or "height", f) linspace(0, f * side); None: no magnitude.
_LIN = "lin"


def _lin(a: float, b: float) -> tuple[str, float, float]:
    return (_LIN, a, b)


_TA_SPACE = {
    "Identity": (None, False),
    "ShearX": (_lin(0.0, 0.99), True),
    "ShearY": (_lin(0.0, 0.99), True),
    "TranslateX": (_lin(0.0, 32.0), True),
    "TranslateY": (_lin(0.0, 32.0), True),
    "Rotate": (_lin(0.0, 135.0), True),
    "Brightness": (_lin(0.0, 0.99), True),
    "Color": (_lin(0.0, 0.99), True),
    "Contrast": (_lin(0.0, 0.99), True),
    "Sharpness": (_lin(0.0, 0.99), True),
    "Posterize": (("posterize", 8, 6), False),
    "Solarize": (_lin(1.0, 0.0), False),
    "AutoContrast": (None, False),
    "Equalize": (None, False),
}

# AutoAugment's and RandAugment's (RandAugment adds Identity first, AutoAugment Invert).
_AA_SPACE = {
    "ShearX": (_lin(0.0, 0.3), True),
    "ShearY": (_lin(0.0, 0.3), True),
    "TranslateX": (("width", 150.0 / 331.0), True),
    "TranslateY": (("height", 150.0 / 331.0), True),
    "Rotate": (_lin(0.0, 30.0), True),
    "Brightness": (_lin(0.0, 0.9), True),
    "Color": (_lin(0.0, 0.9), True),
    "Contrast": (_lin(0.0, 0.9), True),
    "Sharpness": (_lin(0.0, 0.9), True),
    "Posterize": (("posterize", 8, 4), False),
    "Solarize": (_lin(1.0, 0.0), False),
    "AutoContrast": (None, False),
    "Equalize": (None, False),
}
_RA_SPACE = {"Identity": (None, False), **_AA_SPACE}
_AA_FULL_SPACE = {**_AA_SPACE, "Invert": (None, False)}

_AUGMIX_PARTIAL = {
    "ShearX": (_lin(0.0, 0.3), True),
    "ShearY": (_lin(0.0, 0.3), True),
    "TranslateX": (("width", 1.0 / 3.0), True),
    "TranslateY": (("height", 1.0 / 3.0), True),
    "Rotate": (_lin(0.0, 30.0), True),
    "Posterize": (("posterize", 4, 4), False),
    "Solarize": (_lin(1.0, 0.0), False),
    "AutoContrast": (None, False),
    "Equalize": (None, False),
}
_AUGMIX_ALL = {
    **_AUGMIX_PARTIAL,
    "Brightness": (_lin(0.0, 0.9), True),
    "Color": (_lin(0.0, 0.9), True),
    "Contrast": (_lin(0.0, 0.9), True),
    "Sharpness": (_lin(0.0, 0.9), True),
}

# AutoAugment's sub-policies: ((op, probability, magnitude bin of 10), (...)).
_AA_POLICIES = {
    "imagenet": (
        (("Posterize", 0.4, 8), ("Rotate", 0.6, 9)),
        (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
        (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
        (("Posterize", 0.6, 7), ("Posterize", 0.6, 6)),
        (("Equalize", 0.4, None), ("Solarize", 0.2, 4)),
        (("Equalize", 0.4, None), ("Rotate", 0.8, 8)),
        (("Solarize", 0.6, 3), ("Equalize", 0.6, None)),
        (("Posterize", 0.8, 5), ("Equalize", 1.0, None)),
        (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)),
        (("Equalize", 0.6, None), ("Posterize", 0.4, 6)),
        (("Rotate", 0.8, 8), ("Color", 0.4, 0)),
        (("Rotate", 0.4, 9), ("Equalize", 0.6, None)),
        (("Equalize", 0.0, None), ("Equalize", 0.8, None)),
        (("Invert", 0.6, None), ("Equalize", 1.0, None)),
        (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
        (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
        (("Color", 0.8, 8), ("Solarize", 0.8, 7)),
        (("Sharpness", 0.4, 7), ("Invert", 0.6, None)),
        (("ShearX", 0.6, 5), ("Equalize", 1.0, None)),
        (("Color", 0.4, 0), ("Equalize", 0.6, None)),
        (("Equalize", 0.4, None), ("Solarize", 0.2, 4)),
        (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
        (("Invert", 0.6, None), ("Equalize", 1.0, None)),
        (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
        (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
    ),
    "cifar10": (
        (("Invert", 0.1, None), ("Contrast", 0.2, 6)),
        (("Rotate", 0.7, 2), ("TranslateX", 0.3, 9)),
        (("Sharpness", 0.8, 1), ("Sharpness", 0.9, 3)),
        (("ShearY", 0.5, 8), ("TranslateY", 0.7, 9)),
        (("AutoContrast", 0.5, None), ("Equalize", 0.9, None)),
        (("ShearY", 0.2, 7), ("Posterize", 0.3, 7)),
        (("Color", 0.4, 3), ("Brightness", 0.6, 7)),
        (("Sharpness", 0.3, 9), ("Brightness", 0.7, 9)),
        (("Equalize", 0.6, None), ("Equalize", 0.5, None)),
        (("Contrast", 0.6, 7), ("Sharpness", 0.6, 5)),
        (("Color", 0.7, 7), ("TranslateX", 0.5, 8)),
        (("Equalize", 0.3, None), ("AutoContrast", 0.4, None)),
        (("TranslateY", 0.4, 3), ("Sharpness", 0.2, 6)),
        (("Brightness", 0.9, 6), ("Color", 0.2, 8)),
        (("Solarize", 0.5, 2), ("Invert", 0.0, None)),
        (("Equalize", 0.2, None), ("AutoContrast", 0.6, None)),
        (("Equalize", 0.2, None), ("Equalize", 0.6, None)),
        (("Color", 0.9, 9), ("Equalize", 0.6, None)),
        (("AutoContrast", 0.8, None), ("Solarize", 0.2, 8)),
        (("Brightness", 0.1, 3), ("Color", 0.7, 0)),
        (("Solarize", 0.4, 5), ("AutoContrast", 0.9, None)),
        (("TranslateY", 0.9, 9), ("TranslateY", 0.7, 9)),
        (("AutoContrast", 0.9, None), ("Solarize", 0.8, 3)),
        (("Equalize", 0.8, None), ("Invert", 0.1, None)),
        (("TranslateY", 0.7, 9), ("AutoContrast", 0.9, None)),
    ),
    "svhn": (
        (("ShearX", 0.9, 4), ("Invert", 0.2, None)),
        (("ShearY", 0.9, 8), ("Invert", 0.7, None)),
        (("Equalize", 0.6, None), ("Solarize", 0.6, 6)),
        (("Invert", 0.9, None), ("Equalize", 0.6, None)),
        (("Equalize", 0.6, None), ("Rotate", 0.9, 3)),
        (("ShearX", 0.9, 4), ("AutoContrast", 0.8, None)),
        (("ShearY", 0.9, 8), ("Invert", 0.4, None)),
        (("ShearY", 0.9, 5), ("Solarize", 0.2, 6)),
        (("Invert", 0.9, None), ("AutoContrast", 0.8, None)),
        (("Equalize", 0.6, None), ("Rotate", 0.9, 3)),
        (("ShearX", 0.9, 4), ("Solarize", 0.3, 3)),
        (("ShearY", 0.8, 8), ("Invert", 0.7, None)),
        (("Equalize", 0.9, None), ("TranslateY", 0.6, 6)),
        (("Invert", 0.9, None), ("Equalize", 0.6, None)),
        (("Contrast", 0.3, 3), ("Rotate", 0.8, 4)),
        (("Invert", 0.8, None), ("TranslateY", 0.0, 2)),
        (("ShearY", 0.7, 6), ("Solarize", 0.4, 8)),
        (("Invert", 0.6, None), ("Rotate", 0.8, 4)),
        (("ShearY", 0.3, 7), ("TranslateX", 0.9, 3)),
        (("ShearX", 0.1, 6), ("Invert", 0.6, None)),
        (("Solarize", 0.7, 2), ("TranslateY", 0.6, 7)),
        (("ShearY", 0.8, 4), ("Invert", 0.8, None)),
        (("ShearX", 0.7, 9), ("TranslateY", 0.8, 3)),
        (("ShearY", 0.8, 5), ("AutoContrast", 0.7, None)),
        (("ShearX", 0.7, 2), ("Invert", 0.1, None)),
    ),
}


def magnitude_table(space: dict, num_bins: int, height: int, width: int) -> np.ndarray:
    """float64 [len(space), num_bins]: each op's magnitudes, torchvision's float32
    values (0 for the ops without one)."""
    rows = []
    for spec, _ in space.values():
        if spec is None:
            rows.append(torch.zeros(num_bins))
        elif spec[0] == _LIN:
            rows.append(torch.linspace(spec[1], spec[2], num_bins))
        elif spec[0] == "posterize":
            top, k = spec[1], spec[2]
            rows.append((top - (torch.arange(num_bins) / ((num_bins - 1) / k))).round().int())
        else:  # a translate: a fraction of the width or height
            side = width if spec[0] == "width" else height
            rows.append(torch.linspace(0.0, spec[1] * side, num_bins))
    return torch.stack([r.to(torch.float32) for r in rows]).double().numpy()


# ---------------------------------------------------------------- draws


class PolicyDraw(NamedTuple):
    """The ops drawn for a batch, on the CPU; ``S`` ops per image, applied in order.

    ``op``: int64 [B, S], the index in the policy's ``ops`` (-1: none, for
    AutoAugment's sub-op that its probability skipped and AugMix's steps past a
    chain's depth); ``magnitude``: float64 [B, S], signed, the value torchvision
    passes to the op (0 for ops without one); ``sign``: float64 [B, S], -1 or 1
    (1 for unsigned ops); ``bin``: int64 [B, S], the magnitude bin.
    """

    op: torch.Tensor
    magnitude: torch.Tensor
    sign: torch.Tensor
    bin: torch.Tensor


class AugMixDraw(NamedTuple):
    """AugMix's draws for a batch of B images with ``W`` chains of up to ``D`` ops.

    ``chains``: a :class:`PolicyDraw` with tensors [B, W * D] (chain ``i``'s step
    ``j`` at column ``i * D + j``; op -1 past the chain's depth); ``depth``: int64
    [B, W]; ``weights``: float32 [B, 1 + W]: the original image's weight ``m``
    (Beta(alpha, alpha)), then each chain's (Dirichlet(alpha) times ``1 - m``).
    """

    chains: PolicyDraw
    depth: torch.Tensor
    weights: torch.Tensor


def _signed_draw(
    space: dict,
    table: np.ndarray,
    op: np.ndarray,
    bins: np.ndarray,
    u_sign: np.ndarray,
) -> PolicyDraw:
    """Magnitudes and signs for ops ``op`` (int, -1 = none) at ``bins``."""
    signed = np.array([s for _, s in space.values()] + [False])  # [-1] -> none
    neg = signed[op] & (u_sign <= 0.5)
    sign = np.where(neg, -1.0, 1.0)
    mag = np.where(op >= 0, table[np.maximum(op, 0), bins], 0.0) * sign
    return PolicyDraw(
        torch.from_numpy(op.astype(np.int64)),
        torch.from_numpy(mag + 0.0),  # + 0.0: no -0.0
        torch.from_numpy(sign),
        torch.from_numpy(bins.astype(np.int64)),
    )


def _randint(u: np.ndarray, n: int) -> np.ndarray:
    """Uniform integers in [0, n) from uniform floats in [0, 1)."""
    return np.minimum((u * n).astype(np.int64), n - 1)


# ---------------------------------------------------------------- applying


# The batched op each op name needs; the geometric ones are all one affine warp.
_FAMILIES = (
    "Identity",
    "Affine",
    "Brightness",
    "Color",
    "Contrast",
    "Sharpness",
    "Posterize",
    "Solarize",
    "AutoContrast",
    "Equalize",
    "Invert",
)
_AFFINE_OPS = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")
_BLEND_OPS = ("Brightness", "Color", "Contrast", "Sharpness")


def _family(name: str) -> int:
    return 1 if name in _AFFINE_OPS else _FAMILIES.index(name)


def _inverse_affine(
    angle: np.ndarray,
    tx: np.ndarray,
    ty: np.ndarray,
    shx: np.ndarray,
    shy: np.ndarray,
    cx: np.ndarray,
    cy: np.ndarray,
) -> np.ndarray:
    """torchvision's ``_get_inverse_affine_matrix`` (scale 1), float64 [..., 6], vectorized."""
    rot = np.radians(angle)
    sx = np.radians(shx)
    sy = np.radians(shy)
    cos_sy = np.cos(sy)
    tan_sx = np.tan(sx)
    rot_minus_sy = rot - sy
    cx_plus_tx = cx + tx
    cy_plus_ty = cy + ty
    a = np.cos(rot_minus_sy) / cos_sy
    b = -(a * tan_sx + np.sin(rot))
    c = np.sin(rot_minus_sy) / cos_sy
    d = np.cos(rot) - c * tan_sx
    m0, m1, m3, m4 = d, -b, -c, a
    m2 = cx - m0 * cx_plus_tx - m1 * cy_plus_ty
    m5 = cy - m3 * cx_plus_tx - m4 * cy_plus_ty
    return np.stack([m0, m1, m2, m3, m4, m5], -1)


class _OpPlan:
    """How a policy's op indices map to batched ops and their parameters."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        # Index -1 (no op) reads the last entry: the identity.
        self.family = np.array([_family(n) for n in names] + [0], dtype=np.int64)
        self.is_op = {
            n: np.array([x == n for x in names] + [False])
            for n in (*_AFFINE_OPS, "Posterize", "Solarize")
        }
        self.blend = np.array([x in _BLEND_OPS for x in names] + [False])

    def params(self, op: np.ndarray, mag: np.ndarray, h: int, w: int) -> np.ndarray:
        """float64 [..., 7]: per op, its parameter, then the 2x3 inverse affine matrix.

        The parameters torchvision computes from the magnitude: ``1 + m`` for the
        blends, ``int(m)`` bits, ``255 * m`` thresholds; the warps as
        ``F.affine``/``F.rotate`` get them: shears of ``degrees(atan(m))`` about
        the top-left corner, translations of ``int(m)`` pixels, rotations of
        ``m % 360`` degrees about the centre.
        """
        on = self.is_op
        p = np.where(self.blend[op], 1.0 + mag, mag)
        p = np.where(on["Solarize"][op], 255.0 * mag, p)
        p = np.where(on["Posterize"][op], np.trunc(mag), p)
        zero = np.zeros_like(mag)
        shear_deg = np.degrees(np.arctan(mag))
        shx = np.where(on["ShearX"][op], shear_deg, zero)
        shy = np.where(on["ShearY"][op], shear_deg, zero)
        tx = np.where(on["TranslateX"][op], np.trunc(mag), zero)
        ty = np.where(on["TranslateY"][op], np.trunc(mag), zero)
        angle = np.where(on["Rotate"][op], -np.mod(mag, 360.0), zero)
        shear = on["ShearX"][op] | on["ShearY"][op]
        # torchvision shears with center=[0, 0]: the top-left corner, in centre coordinates.
        cx = np.where(shear, -0.5 * w, zero)
        cy = np.where(shear, -0.5 * h, zero)
        theta = _inverse_affine(angle, tx, ty, shx, shy, cx, cy)
        return np.concatenate([p[..., None], theta], -1)


class _Program(NamedTuple):
    """A batch's ops as device work: what to gather, which groups to run, in which order.

    ``table``: float32 [2 S + chains, B], sent to the device in one copy: per stage
    ``k``, row ``2k`` (as int32 bits) the gather that brings the images into the
    stage's order, grouped by batched op, and row ``2k + 1`` each image's
    parameter in that order; then per chain one row (int32 bits), the gather
    back into batch order. ``host``: float64 [S, 7, B], each image's parameter and
    inverse affine matrix in the stage's order, for the ops that take theirs from
    the host. ``stages``: per stage, None (no image changes) or (gather needed,
    [(family, start, end)]); ``unsort``: per chain, whether it ends out of order.
    """

    table: np.ndarray
    host: np.ndarray
    stages: list[tuple[bool, list[tuple[int, int, int]]] | None]
    unsort: list[bool]


def _program(
    plan: _OpPlan, op: np.ndarray, mag: np.ndarray, h: int, w: int, chains: int = 1
) -> _Program:
    """Plan ops ``op`` [B, S] (magnitudes ``mag``), as ``chains`` chains of S / chains
    stages each starting from the input images, on the CPU."""
    b, s = op.shape
    fam = plan.family[op]  # [B, S]
    params = plan.params(op, mag, h, w)  # [B, S, 7]
    table = np.empty((2 * s + chains, b), dtype=np.float32)
    ints = table.view(np.int32)
    host = np.empty((s, 7, b), dtype=np.float64)
    stages: list[tuple[bool, list[tuple[int, int, int]]] | None] = []
    unsort = []
    arange = np.arange(b)
    per_chain = s // chains
    for c in range(chains):
        pos = arange  # where each image of the batch is in the current order
        for k in range(c * per_chain, (c + 1) * per_chain):
            f = fam[:, k]
            if not f.any():
                stages.append(None)
                continue
            order = np.argsort(f, kind="stable")
            gather = pos[order]
            ints[2 * k] = gather
            host[k] = params[order, k].T
            table[2 * k + 1] = host[k, 0]
            counts = np.bincount(f, minlength=len(_FAMILIES))
            ends = np.cumsum(counts)
            groups = [
                (int(g), int(ends[g] - counts[g]), int(ends[g])) for g in np.flatnonzero(counts)
            ]
            stages.append((not np.array_equal(gather, arange), groups))
            pos = np.empty_like(order)
            pos[order] = arange
        ints[2 * s + c] = pos
        unsort.append(not np.array_equal(pos, arange))
    return _Program(table, host, stages, unsort)


def _run_group(
    fam: int,
    x: torch.Tensor,
    dev: torch.Tensor,
    host: np.ndarray,
    interpolation: str,
    fill: object,
) -> torch.Tensor:
    """Batched op ``fam`` on images ``x`` [n, C, H, W].

    ``dev``: their parameters, float32 [n] on the device; ``host``: float64 [7, n]
    (parameter, inverse affine matrix). Brightness and solarize take the device
    values as they are. The blends take the host's float64 factors, so ``1 - f``
    is rounded as torchvision rounds it, and the warps and posterize the host's
    values, which their functions turn into what the kernels need on the host:
    each one small copy instead of a few device kernels.
    """
    if fam == 0:
        return x
    if fam == 1:
        theta = np.ascontiguousarray(host[1:].T).reshape(-1, 2, 3)
        return F._warp(x, theta, interpolation, fill)
    if fam == 2:
        return F.adjust_brightness(x, dev)
    if fam == 3:
        return F.adjust_saturation(x, host[0])
    if fam == 4:
        return F.adjust_contrast(x, host[0])
    if fam == 5:
        return F.adjust_sharpness(x, host[0])
    if fam == 6:
        return F.posterize(x, host[0])
    if fam == 7:
        return F.solarize(x, dev)
    if fam == 8:
        return F.autocontrast(x)
    if fam == 9:
        return F.equalize(x)
    return F.invert(x)


def _run_chain(
    images: torch.Tensor,
    prog: _Program,
    table: torch.Tensor,
    chain: int,
    per_chain: int,
    interpolation: str,
    fill: object,
) -> torch.Tensor:
    """Chain ``chain``'s stages on ``images``; ``table``: the program's table on the device.

    Per stage: one gather into the stage's order, one batched call per op present
    on its contiguous slice, one ``cat``; at the end one gather back. The result
    is ``images`` itself when no image changed.
    """
    x = images
    s = len(prog.stages)
    for k in range(chain * per_chain, (chain + 1) * per_chain):
        stage = prog.stages[k]
        if stage is None:
            continue
        gather, groups = stage
        if gather:
            x = x.index_select(0, table[2 * k].view(torch.int32))
        dev, host = table[2 * k + 1], prog.host[k]
        parts = [
            _run_group(f, x[a:e], dev[a:e], host[:, a:e], interpolation, fill) for f, a, e in groups
        ]
        x = parts[0] if len(parts) == 1 else torch.cat(parts)
    if prog.unsort[chain]:
        x = x.index_select(0, table[2 * s + chain].view(torch.int32))
    return x


# ---------------------------------------------------------------- fused path (CUDA)

# Which backend runs the ops: "auto" (the fused Triton kernels on CUDA when Triton
# imports, the batched torch ops otherwise), "torch" or "triton" (also on CPU
# tensors under TRITON_INTERPRET=1: the tests).
_BACKEND = "auto"

# Per family (_FAMILIES' order), the fused kernel's branch and lookup op
# (``aug_triton.KIND_*``, ``aug_triton.LUT_*``; literal so planning needs no Triton).
_FUSED_KIND = np.array([0, 2, 1, 3, 1, 4, 1, 1, 1, 1, 1, 0])  # [-1]: no op
_FUSED_LUT = np.array([0, 0, 1, 0, 2, 0, 3, 4, 5, 6, 7, 0])
_NCOL = 12


def _fused_backend(images: torch.Tensor):  # -> the aug_triton module or None
    if _BACKEND == "torch" or (_BACKEND == "auto" and not images.is_cuda):
        return None
    try:
        from . import aug_triton
    except ImportError:
        if _BACKEND == "triton":
            raise
        return None
    return aug_triton


def _fused_table(
    plan: _OpPlan, op: np.ndarray, mag: np.ndarray, h: int, w: int, c: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The fused kernels' per-image table, float32 [S, B, 12], and per stage whether
    any image changes and whether any takes a lookup table (bool [S] each).

    The same parameters as the batched ops get: the blends' factor ``f`` and
    ``1 - f`` (rounded from float64, as torchvision's ``1.0 - ratio``), the
    brightness factor and solarize threshold in float32, posterize's kept-bits
    mask, the warps' inverse matrices over the half sizes (as ``F._warp``).
    """
    fam = plan.family[op].T  # [S, B]
    params = plan.params(op, mag, h, w).transpose(1, 0, 2)  # [S, B, 7]
    p = params[..., 0]
    kind = _FUSED_KIND[fam]
    if c == 1:  # saturation leaves 1-channel images as they are
        kind = np.where(fam == 3, 0, kind)
    table = np.zeros((*fam.shape, _NCOL), dtype=np.float32)
    table[..., 0] = kind
    table[..., 1] = _FUSED_LUT[fam]
    table[..., 2] = p
    table[..., 3] = 1.0 - p
    bits = np.clip(np.trunc(p), 0, 8).astype(np.int64)
    table[..., 4] = np.where(fam == 6, 256 - np.left_shift(1, 8 - bits), p)
    rows = params[..., 1:].astype(np.float32)
    rows[..., :3] /= np.float32(0.5 * w)
    rows[..., 3:] /= np.float32(0.5 * h)
    table[..., 5:11] = rows
    return table, (kind != 0).any(1), (kind == 1).any(1)


def _fused_fill(fill: object, c: int, interpolation: str) -> tuple[np.ndarray | None, bool]:
    """(fill values float32 [C] for the kernel or None for zero padding, whether
    nearest samples need rounding), by ``F._warp``'s rules."""
    fills = F._fill_values(fill, 1, c)
    if fills is None or (interpolation == "nearest" and not fills.any()):
        return None, False
    return fills[0].astype(np.float32), bool((fills != np.round(fills)).any())


def _run_chain_fused(
    kernels,
    images: torch.Tensor,
    table: torch.Tensor,
    live: np.ndarray,
    lut: np.ndarray,
    stages: range,
    fill: torch.Tensor | None,
    bilinear: bool,
    round_nearest: bool,
) -> torch.Tensor:
    """The fused kernels over ``stages`` (two launches a stage); ``images`` itself
    when no image changes."""
    x = images
    for k in stages:
        if live[k]:
            x = kernels.apply_stage(
                x.contiguous(), table[k], fill, bilinear, round_nearest, bool(lut[k])
            )
    return x


def _interp(interpolation: object) -> str:
    mode = getattr(interpolation, "value", interpolation)  # torchvision's InterpolationMode
    if mode not in ("nearest", "bilinear"):
        raise ValueError(f"interpolation must be 'nearest' or 'bilinear', not {interpolation!r}")
    return mode


def _check_fill(fill: object) -> object:
    if fill is None or (isinstance(fill, (int, float)) and not isinstance(fill, bool)):
        return fill
    try:
        return [float(v) for v in fill]  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise ValueError(
            f"fill must be None, a number or one number per channel, not {fill!r}"
        ) from None


def _check_bins(num_magnitude_bins: int) -> int:
    if isinstance(num_magnitude_bins, bool) or not isinstance(num_magnitude_bins, int):
        raise ValueError(f"num_magnitude_bins must be an int >= 2, not {num_magnitude_bins!r}")
    if num_magnitude_bins < 2:
        raise ValueError(f"num_magnitude_bins must be an int >= 2, not {num_magnitude_bins!r}")
    return num_magnitude_bins


# ---------------------------------------------------------------- modules


class _Policy(_Transform):
    """A policy of S ops per image, each from ``ops`` (torchvision's op names, in its order)."""

    def __init__(self, space: dict, interpolation: object, fill: object) -> None:
        super().__init__()
        self._space = space
        self.interpolation = _interp(interpolation)
        self.fill = _check_fill(fill)
        self._plan = _OpPlan(tuple(self._space))
        self._tables: dict[tuple[int, int, int], np.ndarray] = {}
        self._fused_rows: dict[tuple[int, int, int, int], np.ndarray] = {}

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(self._space)

    def _table(self, num_bins: int, size: tuple[int, int] | None) -> np.ndarray:
        h, w = size if size is not None else (0, 0)
        key = (num_bins, h, w)
        t = self._tables.get(key)
        if t is None:
            if len(self._tables) > 16:  # many image sizes: keep the memory bounded
                self._tables.clear()
            t = self._tables[key] = magnitude_table(self._space, num_bins, h, w)
        return t

    def _size(self, size: tuple[int, int] | None) -> tuple[int, int]:
        if size is None:
            if any(
                spec is not None and spec[0] in ("width", "height")
                for spec, _ in self._space.values()
            ):
                raise ValueError(
                    f"{type(self).__name__}.sample needs size=(height, width): "
                    "its translations are relative to the image size"
                )
            return (0, 0)
        h, w = (int(v) for v in size)
        return h, w

    def forward(
        self, images: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        _check_images(images)
        b, _, h, w = images.shape
        return self._apply(images, self.sample(b, generator, size=(h, w)), drawn=True)

    def apply(self, images: torch.Tensor, draw: PolicyDraw) -> torch.Tensor:
        """The ops of ``draw`` (from :meth:`sample`), in order, with its signed magnitudes.

        ``images``: uint8 Tensor[B, C, H, W]; returns a new uint8 tensor like it.
        """
        return self._apply(images, draw, drawn=False)

    def _apply(self, images: torch.Tensor, draw: PolicyDraw, drawn: bool) -> torch.Tensor:
        """``drawn``: ``draw`` comes from :meth:`sample`, so its magnitudes are its
        bins' and signs' (the fused path then looks its table rows up)."""
        _check_images(images)
        op, mag = draw.op.numpy(), draw.magnitude.numpy()
        if op.ndim != 2 or op.shape[0] != images.shape[0] or mag.shape != op.shape:
            raise ValueError(
                f"draw.op and draw.magnitude must be [{images.shape[0]}, S], "
                f"not {tuple(op.shape)} and {tuple(mag.shape)}"
            )
        if images.shape[0] == 0 or op.shape[1] == 0:
            return images.clone()
        h, w = images.shape[-2:]
        kernels = _fused_backend(images)
        if kernels is not None:
            x = self._apply_fused(kernels, images, op, mag, draw if drawn else None, None)[0]
            return x if x is not images else images.clone()
        prog = _program(self._plan, op, mag, h, w)
        table = _to(torch.from_numpy(prog.table), images.device)  # the one copy
        x = _run_chain(images, prog, table, 0, op.shape[1], self.interpolation, self.fill)
        return x if x is not images else images.clone()

    def _apply_fused(
        self,
        kernels,
        images: torch.Tensor,
        op: np.ndarray,
        mag: np.ndarray,
        draw: PolicyDraw | None,
        extra: np.ndarray | None,
        chains: int = 1,
    ) -> tuple[torch.Tensor | list[torch.Tensor], torch.Tensor | None]:
        """``chains`` chains of ``op``'s stages through the fused kernels, each from
        ``images``; with one host-to-device copy for the table, the fill and
        ``extra`` (float32, returned on the device). One chain: its result (maybe
        ``images`` itself); several: the list of them. ``draw``: the draw from
        :meth:`sample` behind ``op`` and ``mag``, whose table rows are looked up
        (None: computed from ``op`` and ``mag``)."""
        c, h, w = images.shape[-3:]
        if draw is None:
            table, live, lut = _fused_table(self._plan, op, mag, h, w, c)
        else:
            rows = self._rows(h, w, c)  # [ops + 1, bins, 2 signs, 12]
            neg = (draw.sign.numpy() < 0).astype(np.int64)
            sel = rows[op, draw.bin.numpy(), neg]  # op -1: the last row
            table = sel.transpose(1, 0, 2)
            kind = table[..., 0]
            live, lut = (kind != 0).any(1), (kind == 1).any(1)
        fill, round_nearest = _fused_fill(self.fill, c, self.interpolation)
        parts = [table.ravel()]
        parts += [] if fill is None else [fill]
        parts += [] if extra is None else [extra.astype(np.float32).ravel()]
        flat = _to(torch.from_numpy(np.concatenate(parts)), images.device)  # the one copy
        n = table.size
        table_dev = flat[:n].view(table.shape)
        fill_dev = None if fill is None else flat[n : n + c]
        extra_dev = None if extra is None else flat[n + (0 if fill is None else c) :]
        per = op.shape[1] // chains
        outs = [
            _run_chain_fused(
                kernels,
                images,
                table_dev,
                live,
                lut,
                range(i * per, (i + 1) * per),
                fill_dev,
                self.interpolation == "bilinear",
                round_nearest,
            )
            for i in range(chains)
        ]
        return (outs[0] if chains == 1 else outs), extra_dev

    def _bins(self) -> int:
        """The number of magnitude bins of :meth:`sample`'s draws."""
        return getattr(self, "num_magnitude_bins", 10)

    def _rows(self, h: int, w: int, c: int) -> np.ndarray:
        """The fused kernels' table row of every (op, bin, sign) a draw can hold, for
        ``c`` x ``h`` x ``w`` images: float32 [ops + 1, bins, 2, 12], sign index 1
        for a negative sign, op index ``ops`` (-1) for no op. Made once per size:
        a batch's table is then one lookup instead of its numpy passes."""
        key = (self._bins(), h, w, c)
        rows = self._fused_rows.get(key)
        if rows is None:
            n, bins = len(self._space), key[0]
            mags = self._table(bins, self._size((h, w)))  # [ops, bins]
            signed = np.array([sg for _, sg in self._space.values()])
            sign = np.where(signed[:, None, None], np.array([1.0, -1.0]), 1.0)  # [ops, 1, 2]
            mag = np.broadcast_to(mags[:, :, None] * sign + 0.0, (n, bins, 2))
            op = np.broadcast_to(np.arange(n)[:, None, None], (n, bins, 2))
            t = _fused_table(self._plan, op.reshape(-1, 1), mag.reshape(-1, 1), h, w, c)[0]
            rows = np.zeros((n + 1, bins, 2, _NCOL), dtype=np.float32)
            rows[:n] = t.reshape(n, bins, 2, _NCOL)
            none = _fused_table(self._plan, np.array([[-1]]), np.zeros((1, 1)), h, w, c)[0]
            rows[n] = none[0]
            if len(self._fused_rows) > 16:  # many image sizes: keep the memory bounded
                self._fused_rows.clear()
            self._fused_rows[key] = rows
        return rows

    def _repr_fields(self) -> dict[str, object]:
        return {"interpolation": self.interpolation, "fill": self.fill}


class TrivialAugmentWide(_Policy):
    """TrivialAugment (wide space), per image: one op uniform over 14, one magnitude
    bin uniform over ``num_magnitude_bins``, a random sign for the signed ops.

    As ``torchvision.transforms.v2.TrivialAugmentWide``; ``interpolation``
    ("nearest" or "bilinear") and ``fill`` (None, a number or one per channel)
    for the geometric ops. Input and output: uint8 Tensor[B, C, H, W], same device.
    """

    def __init__(
        self, num_magnitude_bins: int = 31, interpolation: object = "nearest", fill: object = None
    ) -> None:
        super().__init__(_TA_SPACE, interpolation, fill)
        self.num_magnitude_bins = _check_bins(num_magnitude_bins)

    def _repr_fields(self) -> dict[str, object]:
        return {"num_magnitude_bins": self.num_magnitude_bins, **super()._repr_fields()}

    def sample(
        self,
        batch: int,
        generator: torch.Generator | None = None,
        *,
        size: tuple[int, int] | None = None,
    ) -> PolicyDraw:
        """Per image: op, bin and sign ([B, 1] each), from one draw of ``generator``."""
        n = len(self._space)
        u = torch.rand(batch, 3, generator=generator, dtype=torch.float64).numpy()
        op = _randint(u[:, :1], n)
        bins = _randint(u[:, 1:2], self.num_magnitude_bins)
        table = self._table(self.num_magnitude_bins, self._size(size))
        return _signed_draw(self._space, table, op, bins, u[:, 2:3])


class RandAugment(_Policy):
    """RandAugment, per image: ``num_ops`` ops in a row, each uniform over 14 (with
    Identity), at the fixed bin ``magnitude`` of ``num_magnitude_bins``, each with
    a random sign for the signed ops. As ``torchvision.transforms.v2.RandAugment``.
    """

    def __init__(
        self,
        num_ops: int = 2,
        magnitude: int = 9,
        num_magnitude_bins: int = 31,
        interpolation: object = "nearest",
        fill: object = None,
    ) -> None:
        super().__init__(_RA_SPACE, interpolation, fill)
        if isinstance(num_ops, bool) or not isinstance(num_ops, int) or num_ops < 0:
            raise ValueError(f"num_ops must be a non-negative int, not {num_ops!r}")
        self.num_magnitude_bins = _check_bins(num_magnitude_bins)
        if (
            isinstance(magnitude, bool)
            or not isinstance(magnitude, int)
            or not 0 <= magnitude < num_magnitude_bins
        ):
            raise ValueError(
                f"magnitude must be an int bin in [0, {num_magnitude_bins}), not {magnitude!r}"
            )
        self.num_ops = num_ops
        self.magnitude = magnitude

    def _repr_fields(self) -> dict[str, object]:
        return {
            "num_ops": self.num_ops,
            "magnitude": self.magnitude,
            "num_magnitude_bins": self.num_magnitude_bins,
            **super()._repr_fields(),
        }

    def sample(
        self,
        batch: int,
        generator: torch.Generator | None = None,
        *,
        size: tuple[int, int] | None = None,
    ) -> PolicyDraw:
        """Per image: ``num_ops`` ops and signs ([B, num_ops] each); ``size`` (h, w)
        sets the translations."""
        k = self.num_ops
        u = torch.rand(batch, 2 * k, generator=generator, dtype=torch.float64).numpy()
        op = _randint(u[:, :k], len(self._space))
        bins = np.full_like(op, self.magnitude)
        table = self._table(self.num_magnitude_bins, self._size(size))
        return _signed_draw(self._space, table, op, bins, u[:, k:])


class AutoAugment(_Policy):
    """AutoAugment, per image: one of the 25 sub-policies of ``policy`` ("imagenet",
    "cifar10" or "svhn"), whose two ops each apply with their probability, at
    their bin of 10, with a random sign for the signed ops. As
    ``torchvision.transforms.v2.AutoAugment``.
    """

    def __init__(
        self, policy: object = "imagenet", interpolation: object = "nearest", fill: object = None
    ) -> None:
        super().__init__(_AA_FULL_SPACE, interpolation, fill)
        name = str(getattr(policy, "value", policy))  # torchvision's AutoAugmentPolicy
        if name not in _AA_POLICIES:
            raise ValueError(f"policy must be 'imagenet', 'cifar10' or 'svhn', not {policy!r}")
        self.policy = name
        names = tuple(self._space)
        pol = _AA_POLICIES[name]
        self._sub_op = np.array([[names.index(o) for o, _, _ in sp] for sp in pol])
        self._sub_p = np.array([[p for _, p, _ in sp] for sp in pol])
        self._sub_bin = np.array([[0 if m is None else m for _, _, m in sp] for sp in pol])

    def _repr_fields(self) -> dict[str, object]:
        return {"policy": self.policy, **super()._repr_fields()}

    def sample(
        self,
        batch: int,
        generator: torch.Generator | None = None,
        *,
        size: tuple[int, int] | None = None,
    ) -> PolicyDraw:
        """Per image: its sub-policy's two ops ([B, 2] each; -1 where skipped)."""
        u = torch.rand(batch, 5, generator=generator, dtype=torch.float64).numpy()
        pol = _randint(u[:, 0], len(self._sub_op))
        applied = u[:, 1:3] <= self._sub_p[pol]
        op = np.where(applied, self._sub_op[pol], -1)
        bins = self._sub_bin[pol]
        table = self._table(10, self._size(size))
        return _signed_draw(self._space, table, op, bins, u[:, 3:5])


class AugMix(_Policy):
    """AugMix, per image: ``mixture_width`` chains of 1-3 ops (``chain_depth`` if > 0)
    from the AugMix space at a bin uniform below ``severity`` (of 10), mixed with
    Dirichlet(``alpha``) weights, then with the original image by a
    Beta(``alpha``, ``alpha``) weight. ``all_ops`` False leaves out brightness,
    colour, contrast and sharpness. As ``torchvision.transforms.v2.AugMix``: the
    mix is float32 and truncated to uint8.
    """

    _PARAMETER_MAX = 10

    def __init__(
        self,
        severity: int = 3,
        mixture_width: int = 3,
        chain_depth: int = -1,
        alpha: float = 1.0,
        all_ops: bool = True,
        interpolation: object = "bilinear",
        fill: object = None,
    ) -> None:
        super().__init__(_AUGMIX_ALL if all_ops else _AUGMIX_PARTIAL, interpolation, fill)
        if isinstance(severity, bool) or not isinstance(severity, int):
            raise ValueError(f"severity must be an int in [1, 10], not {severity!r}")
        if not 1 <= severity <= self._PARAMETER_MAX:
            raise ValueError(f"severity must be an int in [1, 10], not {severity!r}")
        if isinstance(mixture_width, bool) or not isinstance(mixture_width, int):
            raise ValueError(f"mixture_width must be a positive int, not {mixture_width!r}")
        if mixture_width < 1:
            raise ValueError(f"mixture_width must be a positive int, not {mixture_width!r}")
        if isinstance(chain_depth, bool) or not isinstance(chain_depth, int):
            raise ValueError(
                f"chain_depth must be an int (<= 0: 1 to 3 at random), not {chain_depth!r}"
            )
        alpha = float(alpha)
        if not (alpha > 0 and math.isfinite(alpha)):
            raise ValueError(f"alpha must be a positive number, not {alpha!r}")
        self.severity = severity
        self.mixture_width = mixture_width
        self.chain_depth = chain_depth
        self.alpha = alpha
        self.all_ops = all_ops

    def _repr_fields(self) -> dict[str, object]:
        return {
            "severity": self.severity,
            "mixture_width": self.mixture_width,
            "chain_depth": self.chain_depth,
            "alpha": self.alpha,
            "all_ops": self.all_ops,
            **super()._repr_fields(),
        }

    @property
    def max_depth(self) -> int:
        return self.chain_depth if self.chain_depth > 0 else 3

    def sample(
        self,
        batch: int,
        generator: torch.Generator | None = None,
        *,
        size: tuple[int, int] | None = None,
    ) -> AugMixDraw:
        """Per image: the chains' ops, their depths and the mixing weights (:class:`AugMixDraw`)."""
        wd, d = self.mixture_width, self.max_depth
        conc2 = torch.full((batch, 2), self.alpha, dtype=torch.float32)
        m = torch._sample_dirichlet(conc2, generator=generator)
        concw = torch.full((batch, wd), self.alpha, dtype=torch.float32)
        w = torch._sample_dirichlet(concw, generator=generator) * m[:, 1:]
        u = torch.rand(batch, wd * (1 + 3 * d), generator=generator, dtype=torch.float64).numpy()
        if self.chain_depth > 0:
            depth = np.full((batch, wd), self.chain_depth, dtype=np.int64)
        else:
            depth = 1 + _randint(u[:, :wd], 3)
        steps = np.arange(d)
        live = (steps[None, None, :] < depth[:, :, None]).reshape(batch, wd * d)
        u_op, u_bin, u_sign = np.split(u[:, wd:], 3, axis=1)
        op = np.where(live, _randint(u_op, len(self._space)), -1)
        bins = _randint(u_bin, self.severity)
        table = self._table(self._PARAMETER_MAX, self._size(size))
        chains = _signed_draw(self._space, table, op, bins, u_sign)
        return AugMixDraw(chains, torch.from_numpy(depth), torch.cat([m[:, :1], w], 1))

    def forward(
        self, images: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        _check_images(images)
        b, _, h, w = images.shape
        return self._apply(images, self.sample(b, generator, size=(h, w)), drawn=True)

    def apply(self, images: torch.Tensor, draw: AugMixDraw) -> torch.Tensor:
        """The chains and weights of ``draw`` (from :meth:`sample`) applied and mixed.

        ``images``: uint8 Tensor[B, C, H, W]; returns a new uint8 tensor like it.
        """
        return self._apply(images, draw, drawn=False)

    def _apply(self, images: torch.Tensor, draw: AugMixDraw, drawn: bool) -> torch.Tensor:
        _check_images(images)
        wd, d = self.mixture_width, self.max_depth
        b, _, h, w = images.shape
        op, mag = draw.chains.op.numpy(), draw.chains.magnitude.numpy()
        if op.shape != (b, wd * d) or draw.weights.shape != (b, 1 + wd):
            raise ValueError(
                f"draw must hold [{b}, {wd * d}] chain ops and [{b}, {1 + wd}] weights, "
                f"not {tuple(op.shape)} and {tuple(draw.weights.shape)}"
            )
        if b == 0:
            return images.clone()
        kernels = _fused_backend(images)
        if kernels is not None:
            chains = draw.chains if drawn else None
            xs, weights = self._apply_fused(
                kernels, images, op, mag, chains, draw.weights.numpy(), wd
            )
            weights = weights.view(-1, 1 + wd)
            mix = images * weights[:, 0, None, None, None]  # float32, as torchvision
            for i, x in enumerate(xs):
                mix.add_(weights[:, 1 + i, None, None, None] * x)
            return mix.to(torch.uint8)
        prog = _program(self._plan, op, mag, h, w, chains=wd)
        # One copy for the ops' parameters and the mixing weights.
        flat = np.concatenate([prog.table.ravel(), draw.weights.numpy().ravel()])
        flat_dev = _to(torch.from_numpy(flat), images.device)
        table = flat_dev[: prog.table.size].view(prog.table.shape)
        weights = flat_dev[prog.table.size :].view(-1, 1 + wd)
        mix = images * weights[:, 0, None, None, None]  # float32, as torchvision
        for i in range(wd):
            x = _run_chain(images, prog, table, i, d, self.interpolation, self.fill)
            mix.add_(weights[:, 1 + i, None, None, None] * x)
        return mix.to(torch.uint8)
