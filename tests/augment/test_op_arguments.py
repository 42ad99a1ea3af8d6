"""Issue 42.12 and 42.15: every op of packer.transforms bounds its size-like and numeric
arguments (an ArgumentError, a UsageError that is also a ValueError, naming the op and
the argument), refuses zero-size images, takes channels-last batches, and never
returns NaN silently."""

from __future__ import annotations

import math

import pytest
import torch

import packer.transforms as T
from packer.errors import UsageError

NAN, INF = math.nan, math.inf


def batch(b: int = 4, h: int = 16, w: int = 16) -> torch.Tensor:
    return torch.randint(0, 256, (b, 3, h, w), generator=torch.Generator().manual_seed(0)).to(
        torch.uint8
    )


def ops() -> dict[str, torch.nn.Module]:
    return {
        "RandomResizedCrop": T.RandomResizedCrop(8),
        "RandomHorizontalFlip": T.RandomHorizontalFlip(),
        "CenterCrop": T.CenterCrop(2),
        "Resize": T.Resize(8),
        "RandomRotation": T.RandomRotation(30),
        "RandomAffine": T.RandomAffine(20, translate=(0.1, 0.1), scale=(0.8, 1.2), shear=10),
        "ColorJitter": T.ColorJitter(0.4, 0.4, 0.4, 0.1),
        "RandomGrayscale": T.RandomGrayscale(0.5),
        "GaussianBlur": T.GaussianBlur(3),
        "RandomPosterize": T.RandomPosterize(4),
        "RandomSolarize": T.RandomSolarize(128),
        "RandomAdjustSharpness": T.RandomAdjustSharpness(2),
        "RandomAutocontrast": T.RandomAutocontrast(),
        "RandomEqualize": T.RandomEqualize(),
        "RandomInvert": T.RandomInvert(),
        "RandomErasing": T.RandomErasing(1.0),
        "TrivialAugmentWide": T.TrivialAugmentWide(),
        "RandAugment": T.RandAugment(),
        "AutoAugment": T.AutoAugment(),
        "AugMix": T.AugMix(),
    }


MIXERS = {
    "MixUp": lambda: T.MixUp(1.0, 5),
    "CutMix": lambda: T.CutMix(1.0, 5),
    "CutMix(elem)": lambda: T.CutMix(1.0, 5, mode="elem"),
    "MixUp(elem)": lambda: T.MixUp(1.0, 5, mode="elem"),
}


@pytest.mark.parametrize("shape", [(4, 3, 0, 0), (4, 3, 0, 16), (2, 3, 16, 0)])
def test_zero_size_images_are_refused_by_every_op_naming_it(shape: tuple[int, ...]) -> None:
    x = torch.zeros(shape, dtype=torch.uint8)
    for name, op in ops().items():
        with pytest.raises(UsageError, match=rf"^{name}: images of \d+x\d+ pixels"):
            op(x, generator=torch.Generator().manual_seed(0))
    for name, make in MIXERS.items():
        with pytest.raises(UsageError, match=rf"^{name.split('(')[0]}: images of"):
            make()(x, torch.zeros(shape[0], dtype=torch.int64), generator=torch.Generator())
    with pytest.raises(UsageError, match="Resize: images of 0x0 pixels have no side"):
        T.Resize(8).output_size(0, 0)
    with pytest.raises(UsageError, match=r"CutMix\.sample: height"):
        T.CutMix(1.0, 5, mode="elem").sample(4, 0, 0)


def test_an_empty_batch_passes_every_op() -> None:
    x = batch(b=0)
    for name, op in ops().items():
        out = op(x, generator=torch.Generator().manual_seed(0))
        assert out.shape[0] == 0 and out.dtype == torch.uint8, name
    for name, make in MIXERS.items():
        out, soft = make()(x, torch.zeros(0, dtype=torch.int64), generator=torch.Generator())
        assert out.shape[0] == 0 and soft.shape == (0, 5), name


def test_channels_last_batches_give_what_contiguous_ones_do() -> None:
    x = batch()
    cl = x.contiguous(memory_format=torch.channels_last)
    for name, op in ops().items():
        a = op(x, generator=torch.Generator().manual_seed(1))
        b = op(cl, generator=torch.Generator().manual_seed(1))
        assert torch.equal(a, b), name


@pytest.mark.parametrize("bad", [NAN, INF, -INF, 1e308])
def test_nan_and_unbounded_parameters_are_refused_when_the_op_is_made(bad: float) -> None:
    makers = {
        "RandomResizedCrop": lambda v: T.RandomResizedCrop(8, ratio=(0.5, v)),
        "RandomRotation": lambda v: T.RandomRotation(v),
        "RandomRotation fill": lambda v: T.RandomRotation(30, fill=v),
        "RandomRotation center": lambda v: T.RandomRotation(30, center=(v, 1)),
        "RandomAffine": lambda v: T.RandomAffine(v),
        "RandomAffine fill": lambda v: T.RandomAffine(10, fill=(0, v, 0)),
        "RandomAffine shear": lambda v: T.RandomAffine(10, shear=v),
        "RandomAffine scale": lambda v: T.RandomAffine(10, scale=(0.5, v)),
        "ColorJitter": lambda v: T.ColorJitter(brightness=v),
        "GaussianBlur": lambda v: T.GaussianBlur(3, sigma=(0.1, v)),
        "RandomAdjustSharpness": lambda v: T.RandomAdjustSharpness(v),
        "RandomErasing": lambda v: T.RandomErasing(1.0, ratio=(0.3, v)),
        "TrivialAugmentWide": lambda v: T.TrivialAugmentWide(fill=v),
        "RandAugment": lambda v: T.RandAugment(fill=[0, 0, v]),
        "AutoAugment": lambda v: T.AutoAugment(fill=v),
        "AugMix fill": lambda v: T.AugMix(fill=v),
        "AugMix alpha": lambda v: T.AugMix(alpha=v),
        "MixUp": lambda v: T.MixUp(v, 5),
        "CutMix": lambda v: T.CutMix(v, 5),
        "RandomChoice": lambda v: T.RandomChoice([T.MixUp(1.0, 5), T.CutMix(1.0, 5)], p=[v, v]),
    }
    for name, make in makers.items():
        if bad == -INF and name in ("RandomRotation", "RandomAffine", "RandomAffine shear"):
            continue  # a negative number is refused by torchvision's own rule
        with pytest.raises(ValueError):
            make(bad)
            pytest.fail(f"{name} took {bad}")


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: T.TrivialAugmentWide(num_magnitude_bins=10**6), "num_magnitude_bins"),
        (lambda: T.RandAugment(num_ops=10**6), "RandAugment: num_ops"),
        (lambda: T.AugMix(mixture_width=10**6), "AugMix: mixture_width"),
        (lambda: T.AugMix(chain_depth=10**6), "AugMix: chain_depth"),
        (lambda: T.MixUp(1.0, 10**9), "MixUp: num_classes"),
        (lambda: T.CutMix(1.0, 10**9), "CutMix: num_classes"),
        (lambda: T.MixUp(1e308, 5), "MixUp: alpha"),
        (lambda: T.GaussianBlur(3, sigma=1e6), "GaussianBlur: sigma"),
        (lambda: T.RandomAffine(10, scale=(1, 1e6)), "RandomAffine: scale"),
        (lambda: T.Resize(10**6), "too large"),
        (lambda: T.RandomResizedCrop(10**6), "too large"),
    ],
)
def test_size_like_arguments_have_a_bound(make, match: str) -> None:
    with pytest.raises(UsageError, match=match):
        make()


def test_resize_far_beyond_the_largest_side_is_refused_before_allocating() -> None:
    strip = torch.zeros(1, 3, 1, 200, dtype=torch.uint8)
    with pytest.raises(UsageError, match=r"Resize\(100\) of 1x200 images makes a side of 20000"):
        T.Resize(100)(strip)


def test_nan_fill_given_at_call_time_is_refused() -> None:
    from packer.augment.warps import rotate

    with pytest.raises(UsageError, match="fill must lie in"):
        rotate(batch(), 30.0, fill=NAN)


def test_the_bounds_themselves_are_accepted() -> None:
    from packer.augment import params as P

    x = batch(b=2)
    T.TrivialAugmentWide(num_magnitude_bins=P.MAX_BINS)(x, generator=torch.Generator())
    T.AugMix(mixture_width=2, chain_depth=P.MAX_CHAINS)(x, generator=torch.Generator())
    _out, soft = T.CutMix(P.MAX_ALPHA, 7, mode="elem")(
        x, torch.tensor([1, 2]), generator=torch.Generator()
    )
    assert torch.isfinite(soft).all()
    T.RandomAffine(P.MAX_DEGREES, shear=P.MAX_SHEAR, scale=(0.5, 2), fill=255)(x)
