"""The policies' ops run on a batch: a few batched calls, or fused kernels on CUDA.

A batch's draws (op indices and signed magnitudes, [B, S]) become per-image
parameters in numpy (:class:`OpPlan`: the geometric ops' inverse affine matrices in
float64, as torchvision computes them), and images are grouped by the batched op
they need (:func:`program`): the five geometric ops (shear, translate, rotate) are one
warp (:func:`packer.augment.warps.warp`), each colour op one call of
:mod:`packer.augment.functional`. Per stage, one gather puts the images in op order,
each op runs once on its contiguous slice, one ``cat`` joins them; one gather restores
the batch order at the end (:func:`run_chain`). On CUDA with Triton the same table
drives :mod:`packer.augment.aug_triton`'s fused kernels instead (:func:`fused_table`,
:func:`run_chain_fused`), imported only when a CUDA batch first asks
(:func:`fused_backend`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from . import functional as F
from . import warps
from .params import fill_values

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


class OpPlan:
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
        ``affine``/``rotate`` get them: shears of ``degrees(atan(m))`` about
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


class Program(NamedTuple):
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


def program(
    plan: OpPlan, op: np.ndarray, mag: np.ndarray, h: int, w: int, chains: int = 1
) -> Program:
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
    return Program(table, host, stages, unsort)


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
        return warps.warp(x, theta, interpolation, fill)
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


def run_chain(
    images: torch.Tensor,
    prog: Program,
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
NCOL = 12


def fused_backend(images: torch.Tensor):  # -> the aug_triton module or None
    if _BACKEND == "torch" or (_BACKEND == "auto" and not images.is_cuda):
        return None
    try:
        from . import aug_triton
    except ImportError:
        if _BACKEND == "triton":
            raise
        return None
    return aug_triton


def fused_table(
    plan: OpPlan, op: np.ndarray, mag: np.ndarray, h: int, w: int, c: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The fused kernels' per-image table, float32 [S, B, 12], and per stage whether
    any image changes and whether any takes a lookup table (bool [S] each).

    The same parameters as the batched ops get: the blends' factor ``f`` and
    ``1 - f`` (rounded from float64, as torchvision's ``1.0 - ratio``), the
    brightness factor and solarize threshold in float32, posterize's kept-bits
    mask, the warps' inverse matrices over the half sizes (as ``warp``).
    """
    fam = plan.family[op].T  # [S, B]
    params = plan.params(op, mag, h, w).transpose(1, 0, 2)  # [S, B, 7]
    p = params[..., 0]
    kind = _FUSED_KIND[fam]
    if c == 1:  # saturation leaves 1-channel images as they are
        kind = np.where(fam == 3, 0, kind)
    table = np.zeros((*fam.shape, NCOL), dtype=np.float32)
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


def fused_fill(fill: object, c: int, interpolation: str) -> tuple[np.ndarray | None, bool]:
    """(fill values float32 [C] for the kernel or None for zero padding, whether
    nearest samples need rounding), by ``warp``'s rules."""
    fills = fill_values(fill, 1, c)
    if fills is None or (interpolation == "nearest" and not fills.any()):
        return None, False
    return fills[0].astype(np.float32), bool((fills != np.round(fills)).any())


def run_chain_fused(
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
