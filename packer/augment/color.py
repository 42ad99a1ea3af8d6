"""Random colour ops with per-image parameters: ColorJitter, RandomGrayscale, GaussianBlur,
RandomPosterize, RandomSolarize, RandomAdjustSharpness, RandomAutocontrast, RandomEqualize,
RandomInvert.

Each takes ``images``: Tensor[B, C, H, W] uint8 in [0, 255] (C = 3; 1 where
torchvision allows it) on any device and returns uint8 of the same shape on the
same device. Per image, parameters are drawn as torchvision's v1 ``get_params``
draws them (``sample`` returns them, on the CPU, from ``generator``); the pixels
are :mod:`packer.augment.functional`'s. An op applied with probability ``p``
runs only on its chosen images (their indices are known on the host), and
returns the input itself when none is chosen, as torchvision does.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import NamedTuple

import torch

from ..imaging.resize import check_images
from . import functional as F
from .base import _Transform
from .params import MAX_FACTOR, MAX_SIGMA, apply_groups, apply_to, number


def _probability(p: float) -> float:
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 <= float(p) <= 1.0:
        raise ValueError(f"p must be a probability in [0, 1], not {p!r}")
    return float(p)


def _range(
    value: float | Sequence[float],
    name: str,
    center: float = 1.0,
    bound: tuple[float, float] = (0.0, MAX_FACTOR),
    clip_first_on_zero: bool = True,
) -> tuple[float, float] | None:
    """torchvision's ColorJitter ``_check_input``: a number ``v`` means
    ``[center - v, center + v]``; None where the range is the identity."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"{name} must be a non-negative number or (min, max), not {value!r}")
        lo, hi = center - float(value), center + float(value)
        if clip_first_on_zero:
            lo = max(lo, 0.0)
    elif isinstance(value, Sequence) and len(value) == 2:
        lo, hi = float(value[0]), float(value[1])
    else:
        raise ValueError(f"{name} must be a number or (min, max), not {value!r}")
    if not bound[0] <= lo <= hi <= bound[1]:
        raise ValueError(f"{name} must lie within {bound} as (min, max), not {value!r}")
    return None if lo == hi == center else (lo, hi)


class _RandomApply(_Transform):
    """An op applied to each image with probability ``p``; subclasses define ``_apply``."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = _probability(p)

    def _repr_fields(self) -> dict[str, object]:
        return {"p": self.p}

    def sample(self, batch: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Which images the op applies to: Tensor[B] bool, on the CPU."""
        return torch.rand(batch, generator=generator) < self.p

    def _apply(self, images: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(
        self, images: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        check_images(images, self)
        return apply_to(images, self.sample(images.shape[0], generator), self._apply)


class JitterParams(NamedTuple):
    """ColorJitter's draw for a batch, on the CPU."""

    order: torch.Tensor  # int64 [B, 4]: per image, a permutation of 0..3 (the order of the ops)
    factors: torch.Tensor  # float64 [B, 4]: brightness, contrast, saturation, hue factors


class ColorJitter(_Transform):
    """Per image, random brightness, contrast, saturation and hue, in a random order.

    Arguments as torchvision's ``ColorJitter``: a number ``v`` gives the factor
    range ``[max(0, 1 - v), 1 + v]`` (hue: ``[-v, v]``, v <= 0.5), a pair gives
    (min, max); 0 (or a range holding only the identity) turns that adjustment
    off. Unlike torchvision, which draws one set for the whole batch, every image
    draws its own factors and its own order of the four adjustments (a uniform
    random permutation). The batch runs in four rounds: in round ``r`` each
    image gets the adjustment its permutation puts at position ``r``, each
    adjustment once on its group of images (:func:`~packer.augment.params.apply_groups`),
    so the result equals torchvision's image by image with the same factors and
    order.
    """

    _NAMES = ("brightness", "contrast", "saturation", "hue")

    def __init__(
        self,
        brightness: float | Sequence[float] = 0,
        contrast: float | Sequence[float] = 0,
        saturation: float | Sequence[float] = 0,
        hue: float | Sequence[float] = 0,
    ) -> None:
        super().__init__()
        self.brightness = _range(brightness, "brightness")
        self.contrast = _range(contrast, "contrast")
        self.saturation = _range(saturation, "saturation")
        self.hue = _range(hue, "hue", center=0.0, bound=(-0.5, 0.5), clip_first_on_zero=False)

    def _repr_fields(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in self._NAMES}

    def _ranges(self) -> list[tuple[float, float] | None]:
        return [self.brightness, self.contrast, self.saturation, self.hue]

    def sample(self, batch: int, generator: torch.Generator | None = None) -> JitterParams:
        """Per image, an order (a uniform permutation of the four adjustments, as
        ``torch.randperm(4)``) and four factors, each uniform over its range (the
        identity, 1 or 0 for hue, where that adjustment is off). Two draws from
        ``generator`` whatever the arguments."""
        order = torch.rand(batch, 4, generator=generator).argsort(dim=1)
        u = torch.rand(batch, 4, generator=generator, dtype=torch.float64)
        identity = (1.0, 1.0, 1.0, 0.0)
        bounds = [r or (c, c) for r, c in zip(self._ranges(), identity)]
        lo, hi = torch.tensor(bounds, dtype=torch.float64).unbind(1)
        return JitterParams(order, u.mul_(hi - lo).add_(lo))

    def forward(
        self, images: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        check_images(images, self)
        order, factors = self.sample(images.shape[0], generator)
        ops = [F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue]
        fns = [
            None if r is None else (lambda x, f, op=op, k=k: op(x, f[:, k]))
            for k, (op, r) in enumerate(zip(ops, self._ranges()))
        ]
        if all(fn is None for fn in fns):
            return images
        for r in range(4):
            images = apply_groups(images, order[:, r], fns, factors)
        return images


class RandomGrayscale(_RandomApply):
    """Each image turned to grayscale (its luma in every channel) with probability ``p``."""

    def __init__(self, p: float = 0.1) -> None:
        super().__init__(p)

    def _apply(self, images: torch.Tensor) -> torch.Tensor:
        return F.rgb_to_grayscale(images, num_output_channels=images.shape[1])


class GaussianBlur(_Transform):
    """Gaussian blur of every image with its own sigma, uniform in ``sigma`` = (min, max).

    ``kernel_size``: odd int, or (kx, ky) as torchvision (x first). ``sigma``: a
    number (fixed) or (min, max), 0 < min <= max. Pixels as
    :func:`~packer.augment.functional.gaussian_blur` (reflect padding).
    """

    def __init__(
        self, kernel_size: int | Sequence[int], sigma: float | Sequence[float] = (0.1, 2.0)
    ) -> None:
        super().__init__()
        ks = (kernel_size, kernel_size) if isinstance(kernel_size, int) else tuple(kernel_size)
        if len(ks) == 1:
            ks = (ks[0], ks[0])
        if len(ks) != 2 or any(
            isinstance(k, bool) or not isinstance(k, int) or k < 1 or k % 2 == 0 for k in ks
        ):
            raise ValueError(
                f"kernel_size must be odd and positive, or two such, not {kernel_size!r}"
            )
        if isinstance(sigma, numbers.Real) and not isinstance(sigma, bool):
            lo = hi = float(sigma)
        elif isinstance(sigma, Sequence) and len(sigma) == 2:
            lo, hi = float(sigma[0]), float(sigma[1])
        else:
            raise ValueError(f"sigma must be a number or (min, max), not {sigma!r}")
        if not 0.0 < lo <= hi:
            raise ValueError(
                f"sigma must be positive, as (min, max) with min <= max, not {sigma!r}"
            )
        number(hi, "sigma", "GaussianBlur", 0.0, MAX_SIGMA, lo_open=True)
        self.kernel_size = ks
        self.sigma = (lo, hi)

    def _repr_fields(self) -> dict[str, object]:
        return {"kernel_size": self.kernel_size, "sigma": self.sigma}

    def sample(self, batch: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Per image sigma, float64 [B] on the CPU, uniform in ``sigma`` (one draw)."""
        lo, hi = self.sigma
        return torch.rand(batch, generator=generator, dtype=torch.float64).mul_(hi - lo).add_(lo)

    def forward(
        self, images: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        check_images(images, self)
        return F.gaussian_blur(images, self.kernel_size, self.sample(images.shape[0], generator))


class RandomPosterize(_RandomApply):
    """Keep the ``bits`` (0 to 8) high bits of each image's values, with probability ``p``."""

    def __init__(self, bits: int, p: float = 0.5) -> None:
        super().__init__(p)
        if isinstance(bits, bool) or not isinstance(bits, int) or not 0 <= bits <= 8:
            raise ValueError(f"bits must be an int in [0, 8], not {bits!r}")
        self.bits = bits

    def _repr_fields(self) -> dict[str, object]:
        return {"bits": self.bits, "p": self.p}

    def _apply(self, images: torch.Tensor) -> torch.Tensor:
        return F.posterize(images, self.bits)


class RandomSolarize(_RandomApply):
    """Invert the values >= ``threshold`` of each image, with probability ``p``."""

    def __init__(self, threshold: float, p: float = 0.5) -> None:
        super().__init__(p)
        if not isinstance(threshold, numbers.Real) or not 0 <= float(threshold) <= 255:
            raise ValueError(f"threshold must be a number in [0, 255], not {threshold!r}")
        self.threshold = float(threshold)

    def _repr_fields(self) -> dict[str, object]:
        return {"threshold": self.threshold, "p": self.p}

    def _apply(self, images: torch.Tensor) -> torch.Tensor:
        return F.solarize(images, self.threshold)


class RandomAdjustSharpness(_RandomApply):
    """Sharpen (factor > 1) or soften (< 1) each image, with probability ``p``."""

    def __init__(self, sharpness_factor: float, p: float = 0.5) -> None:
        super().__init__(p)
        if not isinstance(sharpness_factor, numbers.Real) or sharpness_factor < 0:
            raise ValueError(
                f"sharpness_factor must be a non-negative number, not {sharpness_factor!r}"
            )
        self.sharpness_factor = number(
            sharpness_factor, "sharpness_factor", "RandomAdjustSharpness", 0.0, MAX_FACTOR
        )

    def _repr_fields(self) -> dict[str, object]:
        return {"sharpness_factor": self.sharpness_factor, "p": self.p}

    def _apply(self, images: torch.Tensor) -> torch.Tensor:
        return F.adjust_sharpness(images, self.sharpness_factor)


class RandomAutocontrast(_RandomApply):
    """Stretch each channel of an image to [0, 255], with probability ``p`` per image."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__(p)

    def _apply(self, images: torch.Tensor) -> torch.Tensor:
        return F.autocontrast(images)


class RandomEqualize(_RandomApply):
    """Histogram-equalize each image (per channel), with probability ``p`` per image."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__(p)

    def _apply(self, images: torch.Tensor) -> torch.Tensor:
        return F.equalize(images)


class RandomInvert(_RandomApply):
    """``255 - image``, with probability ``p`` per image."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__(p)

    def _apply(self, images: torch.Tensor) -> torch.Tensor:
        return F.invert(images)
