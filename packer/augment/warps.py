"""Batched geometric warps, each image its own matrix: :func:`affine`, :func:`rotate`.

``img``: Tensor[B, C, H, W] uint8 on the CPU or CUDA; returns uint8 of the same shape
and device. torchvision's geometry (``torchvision.transforms.v2.functional.affine``):
its inverse matrices (:func:`affine_matrix`), its pixel-centre sampling grid and
``grid_sample(align_corners=False)``, its fill rule. :func:`warp` samples a batch at
given matrices; the policies' geometric ops use it directly. Parameters as
:mod:`packer.augment.params` takes them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as nnf

from ..imaging.resize import check_images
from ..imaging.resize import interpolation_mode as _interpolation_mode
from .params import Fill, Param, constant, fill_values, param, send_params

# What torchvision's warps (affine, rotate, the policies' geometric ops) take for
# tensors: bicubic, nearest-exact and lanczos are refused there, so here too.
WARP_INTERPOLATIONS = ("nearest", "bilinear")
_WHY = (
    " (torchvision's tensor warps refuse the others too; bicubic and lanczos are for"
    " the resizes: RandomResizedCrop, Resize)"
)


def interpolation_mode(mode: object, op: str = "affine") -> str:
    """A warp's ``interpolation`` (a string or torchvision's ``InterpolationMode``) as
    "nearest" or "bilinear"; UsageError naming ``op`` otherwise."""
    return _interpolation_mode(mode, op, WARP_INTERPOLATIONS, _WHY)


def affine_matrix(angle, translate, scale, shear, center):  # -> same kind as the inputs
    """torchvision's inverse affine matrices (output pixel -> input pixel), [B, 2, 3].

    Inputs all numpy float64 arrays or all tensors: ``angle`` [B] degrees
    clockwise, ``translate`` [B, 2] (tx, ty) pixels, ``scale`` [B], ``shear``
    [B, 2] (x, y) degrees, ``center`` [B, 2] relative to the image centre.
    ``M = T C R S SHy SHx C^-1``, inverted in closed form as
    ``_get_inverse_affine_matrix`` does, in the inputs' precision (float64 for
    host values, as torchvision's ``math``).
    """
    xp = np if isinstance(angle, np.ndarray) else torch
    rot = xp.deg2rad(angle)
    sx, sy = xp.deg2rad(shear[..., 0]), xp.deg2rad(shear[..., 1])
    cx, cy = center[..., 0], center[..., 1]
    tx, ty = translate[..., 0], translate[..., 1]
    cos_sy = xp.cos(sy)
    tan_sx = xp.tan(sx)
    rot_minus_sy = rot - sy
    cx_plus_tx = cx + tx
    cy_plus_ty = cy + ty
    a = xp.cos(rot_minus_sy) / cos_sy
    b = -(a * tan_sx + xp.sin(rot))
    c = xp.sin(rot_minus_sy) / cos_sy
    d = xp.cos(rot) - c * tan_sx
    m0, m1, m3, m4 = d / scale, -b / scale, -c / scale, a / scale
    m2 = cx - m0 * cx_plus_tx - m1 * cy_plus_ty
    m5 = cy - m3 * cx_plus_tx - m4 * cy_plus_ty
    return xp.stack([m0, m1, m2, m3, m4, m5], -1).reshape(-1, 2, 3)


def affine(
    img: torch.Tensor,
    angle: Param,
    translate: Param | Sequence[float] = 0.0,
    scale: Param = 1.0,
    shear: Param | Sequence[float] = 0.0,
    interpolation: str = "nearest",
    fill: Fill = None,
    center: Sequence[float] | torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-image affine warp about the centre, torchvision's ``affine`` geometry.

    Args:
      img: Tensor[B, C, H, W] uint8.
      angle: clockwise degrees, Tensor[B] or a number.
      translate: (tx, ty) pixels, Tensor[B, 2], a pair, or 0.
      scale: Tensor[B] or a number, > 0.
      shear: (x, y) degrees, Tensor[B, 2], a pair, or Tensor[B] / one number (x only).
      interpolation: "nearest" or "bilinear" (or torchvision's InterpolationMode; the
        others are refused, as torchvision refuses them for tensors).
      fill: None (zero padding, torchvision's ``fill=None``), a number, C numbers,
        or Tensor[B, C], in [0, 255]: the value of pixels mapped from outside the
        image. Given, the sample of a ones channel weighs it in as torchvision
        does (bilinear edges blend towards it).
      center: (x, y) pixels of the fixed point (Tensor[B, 2] or a pair); None =
        the image centre.

    Returns uint8 Tensor[B, C, H, W]. The sampling grid is torchvision's
    (pixel-centre coordinates, ``grid_sample(align_corners=False)``), so most
    pixels match exactly; a nearest sample exactly halfway between two pixels
    may pick the other one.
    """
    check_images(img, "affine")
    b, _, h, w = img.shape
    mode = interpolation_mode(interpolation, "affine")
    ang = param(angle, b, "angle")
    tr = param(translate, b, "translate", width=2)
    sc = param(scale, b, "scale")
    if isinstance(sc, np.ndarray) and sc.size and sc.min() <= 0:
        raise ValueError(f"scale must be positive, not {sc.min()}")
    if isinstance(shear, torch.Tensor) and shear.ndim == 1 and shear.shape[0] == b != 2:
        shear = torch.stack([shear, torch.zeros_like(shear)], -1)
    elif not isinstance(shear, (torch.Tensor, Sequence)):
        shear = (float(shear), 0.0)
    sh = param(shear, b, "shear", width=2)
    ctr = np.zeros((b, 2)) if center is None else param(center, b, "center", width=2)
    ctr = ctr - np.array([w * 0.5, h * 0.5]) if center is not None else ctr
    params = (ang, tr, sc, sh, ctr)
    if all(isinstance(p, np.ndarray) for p in params):
        theta = affine_matrix(*params)
    else:  # some parameters on a device: the matrices are built there, in float32
        dev = next(p.device for p in params if isinstance(p, torch.Tensor))
        theta = affine_matrix(*send_params(dev, torch.float32, *params))
    return warp(img, theta, mode, fill)


def rotate(
    img: torch.Tensor,
    angle: Param,
    interpolation: str = "nearest",
    fill: Fill = None,
    center: Sequence[float] | torch.Tensor | None = None,
) -> torch.Tensor:
    """Rotate each image by ``angle`` degrees counter-clockwise (Tensor[B] or a number)
    about the centre, keeping its size: torchvision's ``rotate(expand=False)``.
    ``interpolation``, ``fill``, ``center``: as :func:`affine`."""
    check_images(img, "rotate")
    ang = param(angle, img.shape[0], "angle")
    return affine(img, -ang, 0.0, 1.0, 0.0, interpolation, fill, center)


def _base_grid(h: int, w: int, device: torch.device) -> torch.Tensor:
    """torchvision's ``_affine_grid`` base: float32 [H*W, 3] rows (x, y, 1), pixel centres
    about the image centre, x fastest; built once per size and device."""

    def make() -> torch.Tensor:
        base = torch.empty(h, w, 3, dtype=torch.float32, device=device)
        base[..., 0].copy_(torch.linspace((1.0 - w) * 0.5, (w - 1.0) * 0.5, steps=w, device=device))
        base[..., 1].copy_(
            torch.linspace((1.0 - h) * 0.5, (h - 1.0) * 0.5, steps=h, device=device)[:, None]
        )
        base[..., 2].fill_(1.0)
        return base.view(h * w, 3)

    return constant(("grid", h, w), device, make)


def warp(
    img: torch.Tensor, theta: np.ndarray | torch.Tensor, mode: str, fill: Fill
) -> torch.Tensor:
    """Sample ``img`` at ``theta`` (float [B, 2, 3], pixel units about the centre)."""
    b, c, h, w = img.shape
    fills = fill_values(fill, b, c)
    if img.numel() == 0:
        return img.clone()
    dev = img.device
    # torchvision's _affine_grid: the matrix's rows (in float32) over the half sizes.
    if isinstance(theta, np.ndarray):
        rows = theta.astype(np.float32)
        rows[:, 0] /= np.float32(0.5 * w)
        rows[:, 1] /= np.float32(0.5 * h)
    else:
        rows = torch.stack([theta[:, 0] / (0.5 * w), theta[:, 1] / (0.5 * h)], 1)
    rows, *fills_dev = send_params(dev, torch.float32, rows, *(() if fills is None else (fills,)))
    # [H*W, 3] @ [B, 3, 2] as torchvision's bmm (the base shared, not copied): grid [B, H, W, 2].
    base = _base_grid(h, w, dev).expand(b, h * w, 3)
    grid = torch.bmm(base, rows.transpose(1, 2)).view(b, h, w, 2)
    # Nearest with a zero fill is zero padding: the ones channel is not needed then.
    zero_fill = isinstance(fills, np.ndarray) and not fills.any()
    use_mask = fills is not None and not (mode == "nearest" and zero_fill)
    if use_mask:
        x = torch.empty((b, c + 1, h, w), dtype=torch.float32, device=dev)
        x[:, :c].copy_(img)
        x[:, c].fill_(1.0)
    else:
        x = img.to(torch.float32)
    x = nnf.grid_sample(x, grid, mode=mode, padding_mode="zeros", align_corners=False)
    if use_mask:
        x, mask = x[:, :c], x[:, c:]
        f = fills_dev[0].view(-1, c, 1, 1)
        # torchvision's rule: nearest takes the fill where the ones channel fell
        # below one half; bilinear blends, (sample - fill) * mask + fill.
        nearest = mode == "nearest"
        x = torch.where(mask < 0.5, f, x) if nearest else x.sub_(f).mul_(mask).add_(f)
    # Nearest samples are whole values unless a fill is fractional: no rounding then.
    integral = fills is None or (isinstance(fills, np.ndarray) and (fills == np.round(fills)).all())
    if mode == "bilinear" or not integral:
        x = x.round_()
    if isinstance(fills, torch.Tensor):  # device fills: unchecked, so clamp
        x = x.clamp_(0, 255)
    return x.to(torch.uint8)
