"""Random rotations and affine warps with per-image parameters: RandomRotation, RandomAffine.

Input ``images``: Tensor[B, C, H, W] uint8 in [0, 255] on any device; output
uint8 of the same shape and device. Parameters follow torchvision's v1
``get_params`` (drawn on the CPU from ``generator``, one draw per batch,
returned by ``sample``); pixels are :func:`packer.augment.warps.affine`'s:
one batched ``grid_sample`` over per-image inverse matrices built as
torchvision builds them (same centre, pixel-centre grid, rotation, shear and
scale order), nearest or bilinear, with ``fill`` for pixels from outside.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from ..imaging.resize import check_images
from .base import _Transform
from .params import MAX_DEGREES, MAX_SCALE, MAX_SHEAR, check_fill, number
from .warps import affine, interpolation_mode, rotate


def _angles(value: float | Sequence[float], name: str, sizes: tuple[int, ...]) -> tuple[float, ...]:
    """torchvision's ``_setup_angle``: a number ``v`` >= 0 means (-v, v); each angle
    finite, within +-MAX_DEGREES (a shear within +-MAX_SHEAR: tan(90) is infinite)."""
    out = _angles_unchecked(value, name, sizes)
    bound = MAX_SHEAR if name == "shear" else MAX_DEGREES
    for v in out:
        number(v, name, "RandomRotation/RandomAffine", -bound, bound)
    return out


def _angles_unchecked(
    value: float | Sequence[float], name: str, sizes: tuple[int, ...]
) -> tuple[float, ...]:
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"{name} must be a non-negative number or a sequence, not {value!r}")
        return (-float(value), float(value))
    if not isinstance(value, Sequence) or len(value) not in sizes:
        n = " or ".join(map(str, sizes))
        raise ValueError(f"{name} must be a number or a sequence of {n} numbers, not {value!r}")
    return tuple(float(v) for v in value)


def _fill(fill: object) -> float | tuple[float, ...] | None:
    check_fill(fill, "RandomRotation/RandomAffine")
    if fill is None:
        return None
    if isinstance(fill, numbers.Real) and not isinstance(fill, bool):
        return float(fill)
    if isinstance(fill, Sequence) and fill and all(isinstance(v, numbers.Real) for v in fill):
        return tuple(float(v) for v in fill)
    raise ValueError(f"fill must be a number, a sequence of numbers or None, not {fill!r}")


def _center(center: object) -> tuple[float, float] | None:
    if center is None:
        return None
    if isinstance(center, Sequence) and len(center) == 2:
        return tuple(
            number(c, "center", "RandomRotation/RandomAffine", -65536, 65536) for c in center
        )  # type: ignore[return-value]
    raise ValueError(f"center must be (x, y) in pixels or None, not {center!r}")


class RandomRotation(_Transform):
    """Rotate each image by its own angle, uniform in ``degrees``, counter-clockwise.

    ``degrees``: a number ``d`` (the range (-d, d)) or (min, max). ``interpolation``:
    "nearest" or "bilinear" (or torchvision's InterpolationMode; bicubic is refused,
    as torchvision refuses it for tensors). ``fill``: value
    of the pixels that come from outside the image, a number or one per channel
    (torchvision's v1 default 0 weighs it in with a ones channel); None pads
    with zeros without it (v2's ``fill=None``, which differs in bilinear edges).
    ``center``: (x, y) pixels, default the image centre. The output keeps the
    input size (torchvision's ``expand=False``; ``expand`` is not offered).
    """

    def __init__(
        self,
        degrees: float | Sequence[float],
        interpolation: str = "nearest",
        fill: float | Sequence[float] | None = 0,
        center: Sequence[float] | None = None,
    ) -> None:
        super().__init__()
        self.degrees = _angles(degrees, "degrees", (2,))
        self.interpolation = interpolation_mode(interpolation, "RandomRotation")
        self.fill = _fill(fill)
        self.center = _center(center)

    def _repr_fields(self) -> dict[str, object]:
        return {
            "degrees": self.degrees,
            "interpolation": self.interpolation,
            "fill": self.fill,
            "center": self.center,
        }

    def sample(self, batch: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Per image angle in degrees (counter-clockwise), float64 [B] on the CPU."""
        lo, hi = self.degrees
        return torch.rand(batch, generator=generator, dtype=torch.float64).mul_(hi - lo).add_(lo)

    def forward(
        self, images: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        check_images(images, self)
        angle = self.sample(images.shape[0], generator)
        return rotate(images, angle, self.interpolation, self.fill, self.center)


class AffineParams(NamedTuple):
    """RandomAffine's draw for a batch, float64 on the CPU."""

    angle: torch.Tensor  # [B] degrees, clockwise (torchvision's affine convention)
    translate: torch.Tensor  # [B, 2] (tx, ty), whole pixels
    scale: torch.Tensor  # [B]
    shear: torch.Tensor  # [B, 2] (x, y) degrees


class RandomAffine(_Transform):
    """Per image, a random rotation, translation, scale and shear about the centre.

    Arguments as torchvision's ``RandomAffine``: ``degrees`` (d or (min, max));
    ``translate`` (a, b): tx uniform in ±a * width and ty in ±b * height, rounded
    to whole pixels; ``scale`` (min, max); ``shear``: s (x shear in (-s, s)),
    (min, max) for x, or (xmin, xmax, ymin, ymax); ``interpolation``, ``fill``,
    ``center`` as :class:`RandomRotation`. Each image draws its own parameters.
    """

    def __init__(
        self,
        degrees: float | Sequence[float],
        translate: Sequence[float] | None = None,
        scale: Sequence[float] | None = None,
        shear: float | Sequence[float] | None = None,
        interpolation: str = "nearest",
        fill: float | Sequence[float] | None = 0,
        center: Sequence[float] | None = None,
    ) -> None:
        super().__init__()
        self.degrees = _angles(degrees, "degrees", (2,))
        if translate is not None:
            if not isinstance(translate, Sequence) or len(translate) != 2:
                raise ValueError(f"translate must be (a, b) or None, not {translate!r}")
            if not all(0.0 <= float(t) <= 1.0 for t in translate):
                raise ValueError(f"translate values must lie in [0, 1], not {translate!r}")
            translate = (float(translate[0]), float(translate[1]))
        if scale is not None:
            if not isinstance(scale, Sequence) or len(scale) != 2:
                raise ValueError(f"scale must be (min, max) or None, not {scale!r}")
            if not all(float(s) > 0 for s in scale):
                raise ValueError(f"scale values must be positive, not {scale!r}")
            for s in scale:
                number(s, "scale", "RandomAffine", 0.0, MAX_SCALE, lo_open=True)
            scale = (float(scale[0]), float(scale[1]))
        self.translate = translate
        self.scale = scale
        self.shear = None if shear is None else _angles(shear, "shear", (2, 4))
        self.interpolation = interpolation_mode(interpolation, "RandomAffine")
        self.fill = _fill(fill)
        self.center = _center(center)

    def _repr_fields(self) -> dict[str, object]:
        keys = ("degrees", "translate", "scale", "shear", "interpolation", "fill", "center")
        return {k: getattr(self, k) for k in keys}

    def sample(
        self, batch: int, height: int, width: int, generator: torch.Generator | None = None
    ) -> AffineParams:
        """Per image parameters for ``height`` x ``width`` images (one draw of [B, 6]).

        As torchvision's ``RandomAffine.get_params``: angle ~ U(degrees); tx =
        round(U(-a W, a W)), ty = round(U(-b H, b H)) (half to even, Python's
        round); scale ~ U(scale); shear x ~ U(shear[0:2]), y ~ U(shear[2:4]);
        the identity where an argument is None.
        """
        # numpy on the drawn numbers: each torch call on a tiny tensor costs microseconds.
        u = torch.rand(batch, 6, generator=generator, dtype=torch.float64).numpy()

        def uniform(col: int, lo: float, hi: float) -> np.ndarray:
            return u[:, col] * (hi - lo) + lo

        angle = uniform(0, *self.degrees)
        translate = np.zeros((batch, 2))
        if self.translate is not None:
            max_dx, max_dy = self.translate[0] * width, self.translate[1] * height
            translate[:, 0] = np.round(uniform(1, -max_dx, max_dx))  # half to even
            translate[:, 1] = np.round(uniform(2, -max_dy, max_dy))
        scale = uniform(3, *self.scale) if self.scale is not None else np.ones(batch)
        shear = np.zeros((batch, 2))
        if self.shear is not None:
            shear[:, 0] = uniform(4, *self.shear[:2])
            if len(self.shear) == 4:
                shear[:, 1] = uniform(5, *self.shear[2:])
        angle, translate, scale, shear = map(torch.from_numpy, (angle, translate, scale, shear))
        return AffineParams(angle, translate, scale, shear)

    def forward(
        self, images: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        check_images(images, self)
        b, _, h, w = images.shape
        p = self.sample(b, h, w, generator)
        return affine(
            images,
            p.angle,
            p.translate,
            p.scale,
            p.shear,
            self.interpolation,
            self.fill,
            self.center,
        )
