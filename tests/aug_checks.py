"""Shared checks for the augmentation tests: images, pixel distance, two-sample tests."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from torch import nn


def photo_like(b: int = 6, h: int = 32, w: int = 40, seed: int = 0, c: int = 3) -> torch.Tensor:
    """uint8 [b, c, h, w]: smooth random shapes plus mild noise, each image different."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(b, c, max(h // 6, 2), max(w // 6, 2), generator=g) * 255
    x = nn.functional.interpolate(x, size=(h, w), mode="bicubic", align_corners=False)
    x = x + torch.randn(b, c, h, w, generator=g) * 8
    return x.round().clamp(0, 255).to(torch.uint8)


def mad(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean absolute difference in levels (1.0 = 1/255 for uint8)."""
    return (a.double() - b.double()).abs().mean().item()


def per_image(fn: Callable[..., torch.Tensor], images: torch.Tensor, *params) -> torch.Tensor:
    """torchvision's op called image by image with that image's parameters."""
    return torch.stack([fn(img, *(p[i] for p in params)) for i, img in enumerate(images)])


def ks_statistic(a, b) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: max |ECDF_a - ECDF_b| (ties handled)."""
    a, b = np.sort(np.asarray(a, dtype=np.float64)), np.sort(np.asarray(b, dtype=np.float64))
    grid = np.concatenate([a, b])
    fa = np.searchsorted(a, grid, side="right") / len(a)
    fb = np.searchsorted(b, grid, side="right") / len(b)
    return float(np.abs(fa - fb).max())


def ks_limit(n: int, m: int) -> float:
    """The KS statistic's critical value at alpha = 0.001 (seeds are fixed, so no flakes)."""
    return 1.95 * math.sqrt((n + m) / (n * m))


def assert_same_distribution(ours, theirs) -> None:
    d = ks_statistic(ours, theirs)
    assert d < ks_limit(len(ours), len(theirs)), f"KS statistic {d:.4f}"


def chi_square_two_sample(a, b, categories) -> tuple[float, int]:
    """Chi-square statistic of a 2 x k contingency table (two samples of categories), and
    its degrees of freedom; empty categories are dropped."""
    a, b = np.asarray(a), np.asarray(b)
    ca = np.array([(a == k).sum() for k in categories], dtype=np.float64)
    cb = np.array([(b == k).sum() for k in categories], dtype=np.float64)
    keep = (ca + cb) > 0
    ca, cb = ca[keep], cb[keep]
    total = ca + cb
    ea, eb = total * len(a) / (len(a) + len(b)), total * len(b) / (len(a) + len(b))
    stat = float((((ca - ea) ** 2) / ea).sum() + (((cb - eb) ** 2) / eb).sum())
    return stat, int(keep.sum()) - 1


def chi_square_limit(dof: int) -> float:
    """Upper 0.001 quantile of chi-square(dof), Wilson-Hilferty's approximation."""
    z = 3.09
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def assert_same_categories(ours, theirs, categories) -> None:
    stat, dof = chi_square_two_sample(ours, theirs, categories)
    if dof == 0:
        return
    assert stat < chi_square_limit(dof), f"chi-square {stat:.1f} with {dof} dof"


def assert_same_rate(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    """Two boolean samples with the same success rate (two-proportion z-test, |z| < 3.3)."""
    a, b = ours.double(), theirs.double()
    pooled = (a.sum() + b.sum()) / (len(a) + len(b))
    se = math.sqrt(float(pooled * (1 - pooled)) * (1 / len(a) + 1 / len(b))) or 1.0
    z = float(a.mean() - b.mean()) / se
    assert abs(z) < 3.3, f"rates {float(a.mean()):.4f} vs {float(b.mean()):.4f}"


def tv_draws(fn: Callable[[], object], n: int, seed: int = 0) -> list:
    """``n`` calls of a torchvision sampler ``fn`` after seeding torch's global RNG."""
    torch.manual_seed(seed)
    return [fn() for _ in range(n)]
