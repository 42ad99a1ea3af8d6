"""Affine warps and rotations of a :class:`~packer.augment.dense_sample.Sample`, with
explicit parameters, as ``torchvision.transforms.v2.functional.affine`` / ``rotate`` on
tv_tensors: the image by :func:`packer.augment.warps.affine`, masks nearest on
torchvision's own grid (identical), boxes the box around their moved corners (clamped),
keypoints moved (visibility 0 where they leave the canvas)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import replace

import torch
import torch.nn.functional as nnf

from ..imaging.resize import ArgumentError, to_device
from .dense_sample import FillArg, Sample, clamp_boxes, hide_outside, masks_apply, vec
from .warps import affine as affine_images
from .warps import interpolation_mode as warp_interpolation


def affine_matrix(
    center: Sequence[float],
    angle: float,
    translate: Sequence[float],
    scale: float,
    shear: Sequence[float],
    inverted: bool = True,
) -> list[float]:
    """torchvision's ``_get_inverse_affine_matrix`` (Python floats, float64): the 2x3
    matrix row-major, output -> input pixel when ``inverted`` else input -> output."""
    rot = math.radians(angle)
    sx, sy = math.radians(shear[0]), math.radians(shear[1])
    cx, cy = center
    tx, ty = translate
    cos_sy = math.cos(sy)
    tan_sx = math.tan(sx)
    rot_minus_sy = rot - sy
    cx_plus_tx, cy_plus_ty = cx + tx, cy + ty
    a = math.cos(rot_minus_sy) / cos_sy
    b = -(a * tan_sx + math.sin(rot))
    c = math.sin(rot_minus_sy) / cos_sy
    d = math.cos(rot) - c * tan_sx
    if inverted:
        m = [d / scale, -b / scale, 0.0, -c / scale, a / scale, 0.0]
        m[2] += cx - m[0] * cx_plus_tx - m[1] * cy_plus_ty
        m[5] += cy - m[3] * cx_plus_tx - m[4] * cy_plus_ty
    else:
        m = [a * scale, b * scale, 0.0, c * scale, d * scale, 0.0]
        m[2] += cx_plus_tx - m[0] * cx - m[1] * cy
        m[5] += cy_plus_ty - m[3] * cx - m[4] * cy
    return m


def _warp_nearest(m: torch.Tensor, matrix: list[float], fill: float | None) -> torch.Tensor:
    """torchvision's ``affine_image`` of a mask [C, H, W], nearest: its grid
    (``_affine_grid``) and fill rule (``_apply_grid_transform``), op for op."""
    _, h, w = m.shape
    if m.numel() == 0:
        return m.clone()
    dev = m.device
    theta = vec(matrix, torch.empty(0, dtype=torch.float32, device=dev)).reshape(1, 2, 3)
    base = torch.empty(1, h, w, 3, dtype=torch.float32, device=dev)
    base[..., 0].copy_(torch.linspace((1.0 - w) * 0.5, (w - 1.0) * 0.5, steps=w, device=dev))
    ys = torch.linspace((1.0 - h) * 0.5, (h - 1.0) * 0.5, steps=h, device=dev).unsqueeze_(-1)
    base[..., 1].copy_(ys)
    base[..., 2].fill_(1)
    half = vec([0.5 * w, 0.5 * h], theta)
    grid = base.view(1, h * w, 3).bmm(theta.transpose(1, 2).div_(half)).view(1, h, w, 2)
    x = m[None].to(torch.float32)
    if fill is not None:
        x = torch.cat((x, torch.ones((1, 1, h, w), dtype=torch.float32, device=dev)), dim=1)
    x = nnf.grid_sample(x, grid, mode="nearest", padding_mode="zeros", align_corners=False)
    if fill is not None:
        x, inside = torch.tensor_split(x, indices=(-1,), dim=-3)
        x = torch.where(inside.expand_as(x) < 0.5, torch.full_like(x, float(fill)), x)
    return x.round_().to(m.dtype)[0]


def _move_points(pts: torch.Tensor, matrix: list[float]) -> torch.Tensor:
    """Points [..., 2] through the forward 2x3 ``matrix`` as torchvision's matmul does."""
    t = vec(matrix, pts).reshape(2, 3).T
    flat = pts.reshape(-1, 2)
    ones = torch.ones(flat.shape[0], 1, device=pts.device, dtype=pts.dtype)
    return torch.matmul(torch.cat([flat, ones], dim=-1), t).reshape(pts.shape)


def _warp_targets(s: Sample, angle: float, translate, scale, shear, center) -> tuple:
    """Boxes and keypoints through torchvision's forward matrix (``inverted=False``)."""
    h, w = s.size
    ctr = [w * 0.5, h * 0.5] if center is None else [float(c) for c in center]
    fwd = affine_matrix(ctr, angle, translate, scale, shear, inverted=False)
    boxes = s.boxes
    if boxes is not None and boxes.numel():
        corners = boxes[:, to_device(_CORNERS, boxes.device)]  # no blocking index copy
        moved = _move_points(corners, fwd)
        lo, hi = torch.aminmax(moved, dim=1)
        boxes = clamp_boxes(torch.cat([lo, hi], dim=1), h, w)
    kp = s.keypoints
    if kp is not None and kp.numel():
        kp = kp.clone()
        kp[..., :2] = _move_points(kp[..., :2].contiguous(), fwd)
        kp = hide_outside(kp, h, w)
    return boxes, kp


_CORNERS = torch.tensor([[0, 1], [2, 1], [2, 3], [0, 3]])  # a box's (x, y) corners


def _shear_pair(shear: float | Sequence[float]) -> list[float]:
    if isinstance(shear, numbers.Real):
        return [float(shear), 0.0]
    shear = [float(v) for v in shear]
    if len(shear) == 1:
        return [shear[0], shear[0]]
    if len(shear) != 2:
        raise ArgumentError(f"affine: shear must be a number or (x, y), not {shear!r}")
    return shear


def affine(
    s: Sample,
    angle: float,
    translate: Sequence[float] = (0.0, 0.0),
    scale: float = 1.0,
    shear: float | Sequence[float] = (0.0, 0.0),
    interpolation: object = "nearest",
    fill: FillArg = 0,
    center: Sequence[float] | None = None,
    mask_fill: float | None = 0,
    semantic_fill: float | None = 255,
) -> Sample:
    """torchvision's ``affine`` (``angle`` clockwise degrees, ``translate`` pixels,
    ``scale`` > 0, ``shear`` degrees, about ``center`` or the image centre): the image
    by :func:`packer.augment.warps.affine`, masks nearest on torchvision's grid
    (outside pixels ``mask_fill`` / ``semantic_fill``; None: zero padding), boxes the
    box around their moved corners (clamped), keypoints moved."""
    angle, scale = float(angle), float(scale)
    if not scale > 0:
        raise ArgumentError(f"affine: scale must be positive, not {scale}")
    translate = [float(t) for t in translate]
    if len(translate) != 2:
        raise ArgumentError(f"affine: translate must be (tx, ty), not {translate!r}")
    shear = _shear_pair(shear)
    mode = warp_interpolation(interpolation, "affine")
    h, w = s.size
    image = affine_images(s.image[None], angle, translate, scale, shear, mode, fill, center)[0]
    ctr = [0.0, 0.0] if center is None else [float(c) - d * 0.5 for c, d in zip(center, (w, h))]
    inverse = affine_matrix(ctr, angle, translate, scale, shear)

    def warp_mask(m: torch.Tensor, name: str) -> torch.Tensor:
        return _warp_nearest(m, inverse, mask_fill if name == "masks" else semantic_fill)

    masks, semantic = masks_apply(s, warp_mask)
    boxes, kp = _warp_targets(s, angle, translate, scale, shear, center)
    return replace(s, image=image, boxes=boxes, masks=masks, semantic=semantic, keypoints=kp)


def _rot90(t: torch.Tensor, angle: float, square: bool) -> torch.Tensor | None:
    """torchvision's ``rotate_image`` shortcuts (no centre given): 0, 180, and 90/270
    on square images are exact transposes; None where the warp runs."""
    if angle == 0:
        return t.clone()
    if angle == 180:
        return torch.rot90(t, k=2, dims=(-2, -1))
    if square and angle in (90, 270):
        return torch.rot90(t, k=1 if angle == 90 else 3, dims=(-2, -1))
    return None


def rotate(
    s: Sample,
    angle: float,
    interpolation: object = "nearest",
    fill: FillArg = 0,
    center: Sequence[float] | None = None,
    mask_fill: float | None = 0,
    semantic_fill: float | None = 255,
) -> Sample:
    """torchvision's ``rotate`` (``expand=False``): ``angle`` degrees counter-clockwise
    about ``center`` or the image centre; fields as :func:`affine`."""
    angle = float(angle)
    h, w = s.size
    mod = angle % 360
    mode = warp_interpolation(interpolation, "rotate")
    fast = center is None and _rot90(s.image, mod, h == w) is not None
    if fast:
        image = _rot90(s.image, mod, h == w)
    else:
        zero = [0.0, 0.0]
        image = affine_images(s.image[None], -mod, zero, 1.0, zero, mode, fill, center)[0]
    ctr = [0.0, 0.0] if center is None else [float(c) - d * 0.5 for c, d in zip(center, (w, h))]
    inverse = affine_matrix(ctr, -mod, [0.0, 0.0], 1.0, [0.0, 0.0])

    def warp_mask(m: torch.Tensor, name: str) -> torch.Tensor:
        if fast:
            return _rot90(m, mod, h == w)
        return _warp_nearest(m, inverse, mask_fill if name == "masks" else semantic_fill)

    masks, semantic = masks_apply(s, warp_mask)
    boxes, kp = _warp_targets(s, -angle, [0.0, 0.0], 1.0, [0.0, 0.0], center)
    return replace(s, image=image, boxes=boxes, masks=masks, semantic=semantic, keypoints=kp)
