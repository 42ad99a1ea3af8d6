"""packer.augment.color: torchvision's parameter draws per image, torchvision's pixels.

Pixels, mean |ours - torchvision| in levels over the module outputs below
(CPU, torchvision called image by image with the drawn parameters): 0 for
ColorJitter, RandomGrayscale and the Random* ops (bit-identical); about 3e-5
for GaussianBlur (separable float32 sums).
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torchvision import transforms as tv
from torchvision.transforms.v2 import functional as TF

import packer.transforms as T
from aug_checks import (
    assert_same_categories,
    assert_same_distribution,
    assert_same_rate,
    mad,
    photo_like,
    tv_draws,
)

N = 3000


def _tv_draws(fn, n: int = N, seed: int = 0) -> list:
    return tv_draws(fn, n, seed)


# ---------------------------------------------------------------- draws


def test_color_jitter_factors_follow_torchvision() -> None:
    args = dict(brightness=0.4, contrast=(0.2, 1.8), saturation=0.5, hue=0.1)
    ours = T.ColorJitter(**args).sample(N, torch.Generator().manual_seed(1)).factors
    ref = tv.ColorJitter(**args)
    draws = _tv_draws(
        lambda: tv.ColorJitter.get_params(ref.brightness, ref.contrast, ref.saturation, ref.hue)
    )
    for k in range(4):
        assert_same_distribution(ours[:, k].numpy(), [d[1 + k] for d in draws])


def test_color_jitter_orders_follow_torchvision_randperm() -> None:
    perms = {p: i for i, p in enumerate(itertools.permutations(range(4)))}
    order = T.ColorJitter(0.4).sample(N, torch.Generator().manual_seed(2)).order
    ours = [perms[tuple(o)] for o in order.tolist()]
    theirs = [perms[tuple(p.tolist())] for p in _tv_draws(lambda: torch.randperm(4))]
    assert_same_categories(ours, theirs, range(24))
    assert len(set(ours)) == 24


def test_gaussian_blur_sigmas_follow_torchvision() -> None:
    ours = T.GaussianBlur(5, (0.1, 2.0)).sample(N, torch.Generator().manual_seed(3))
    theirs = _tv_draws(lambda: tv.GaussianBlur.get_params(0.1, 2.0))
    assert_same_distribution(ours.numpy(), theirs)
    assert float(ours.min()) >= 0.1 and float(ours.max()) <= 2.0


RANDOM_APPLY = {
    "RandomGrayscale": lambda p: T.RandomGrayscale(p),
    "RandomPosterize": lambda p: T.RandomPosterize(3, p),
    "RandomSolarize": lambda p: T.RandomSolarize(100.0, p),
    "RandomAdjustSharpness": lambda p: T.RandomAdjustSharpness(2.0, p),
    "RandomAutocontrast": lambda p: T.RandomAutocontrast(p),
    "RandomEqualize": lambda p: T.RandomEqualize(p),
    "RandomInvert": lambda p: T.RandomInvert(p),
}


@pytest.mark.parametrize("name", list(RANDOM_APPLY))
def test_apply_masks_follow_torchvisions_coin(name: str) -> None:
    # torchvision's Random* ops: ``if torch.rand(1) < self.p`` per call.
    ours = RANDOM_APPLY[name](0.3).sample(N, torch.Generator().manual_seed(4))
    theirs = torch.tensor(_tv_draws(lambda: bool(torch.rand(1) < 0.3)))
    assert ours.dtype == torch.bool and ours.shape == (N,)
    assert_same_rate(ours, theirs)


# ---------------------------------------------------------------- pixels


def _jitter_reference(images, order, factors, ranges):
    ops = [TF.adjust_brightness, TF.adjust_contrast, TF.adjust_saturation, TF.adjust_hue]
    out = []
    for img, perm, f in zip(images, order.tolist(), factors.tolist()):
        for k in perm:
            if ranges[k] is not None:
                img = ops[k](img, f[k])
        out.append(img)
    return torch.stack(out)


@pytest.mark.parametrize(
    "args",
    [
        dict(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1),
        dict(brightness=(0.2, 1.9), contrast=0.8),  # the order of two clamping ops matters
        dict(saturation=0.9, hue=0.5),
    ],
)
def test_color_jitter_matches_torchvision_image_by_image(args: dict) -> None:
    x = photo_like(16, 24, 28, seed=5)
    tf = T.ColorJitter(**args)
    order, factors = tf.sample(16, torch.Generator().manual_seed(6))
    out = tf(x, generator=torch.Generator().manual_seed(6))
    ref = _jitter_reference(x, order, factors, tf._ranges())
    assert mad(out, ref) < 0.01  # measured: 0
    assert (out.int() - ref.int()).abs().max() <= 1


def test_color_jitter_gives_each_image_its_own_draw() -> None:
    x = photo_like(1, 24, 28).expand(32, -1, -1, -1)
    tf = T.ColorJitter(0.4, 0.4, 0.4, 0.1)
    out = tf(x, generator=torch.Generator().manual_seed(7))
    assert len({tuple(o.flatten().tolist()) for o in out}) == 32
    order = tf.sample(32, torch.Generator().manual_seed(7)).order
    assert len({tuple(o) for o in order.tolist()}) > 8


def test_color_jitter_off_is_the_identity() -> None:
    x = photo_like(4, 8, 8)
    assert T.ColorJitter()(x) is x
    assert T.ColorJitter(brightness=(1.0, 1.0), hue=0.0)(x) is x


def test_gaussian_blur_matches_torchvision_image_by_image() -> None:
    x = photo_like(8, 24, 28, seed=8)
    tf = T.GaussianBlur((5, 3), (0.2, 3.0))
    sigma = tf.sample(8, torch.Generator().manual_seed(9))
    out = tf(x, generator=torch.Generator().manual_seed(9))
    ref = torch.stack([TF.gaussian_blur(i, [5, 3], [float(s)] * 2) for i, s in zip(x, sigma)])
    assert mad(out, ref) < 0.01  # measured about 3e-5


REFERENCE_OPS = {
    "RandomGrayscale": lambda i: TF.rgb_to_grayscale(i, 3),
    "RandomPosterize": lambda i: TF.posterize(i, 3),
    "RandomSolarize": lambda i: TF.solarize(i, 100.0),
    "RandomAdjustSharpness": lambda i: TF.adjust_sharpness(i, 2.0),
    "RandomAutocontrast": TF.autocontrast,
    "RandomEqualize": TF.equalize,
    "RandomInvert": TF.invert,
}


@pytest.mark.parametrize("name", list(RANDOM_APPLY))
def test_random_ops_change_exactly_the_chosen_images(name: str) -> None:
    x = photo_like(12, 20, 24, seed=10)
    tf = RANDOM_APPLY[name](0.5)
    chosen = tf.sample(12, torch.Generator().manual_seed(11))
    assert 0 < int(chosen.sum()) < 12  # the seed picks some, not all
    out = tf(x, generator=torch.Generator().manual_seed(11))
    ref = torch.stack([REFERENCE_OPS[name](i) if c else i for i, c in zip(x, chosen.tolist())])
    assert torch.equal(out, ref)  # measured: bit-identical


def test_random_ops_with_p_zero_return_the_input_and_p_one_all() -> None:
    x = photo_like(4, 8, 8)
    assert T.RandomInvert(0.0)(x) is x
    assert torch.equal(T.RandomInvert(1.0)(x), 255 - x)


def test_random_grayscale_keeps_one_channel_images() -> None:
    x = photo_like(4, 8, 8, c=1)
    assert torch.equal(T.RandomGrayscale(1.0)(x), x)


def test_same_seed_same_output_other_seed_other_output() -> None:
    x = photo_like(16, 20, 24)
    tf = T.Compose(
        [
            T.ColorJitter(0.4, 0.4, 0.4, 0.1),
            T.RandomGrayscale(0.3),
            T.GaussianBlur(3),
            T.RandomEqualize(),
        ]
    )
    a = tf(x, generator=torch.Generator().manual_seed(12))
    b = tf(x, generator=torch.Generator().manual_seed(12))
    c = tf(x, generator=torch.Generator().manual_seed(13))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_repr_names_the_arguments() -> None:
    assert "hue=(-0.1, 0.1)" in repr(T.ColorJitter(hue=0.1))
    assert "bits=3, p=0.5" in repr(T.RandomPosterize(3))


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: T.ColorJitter(brightness=-0.1), "brightness must be a non-negative number"),
        (lambda: T.ColorJitter(contrast=(1.5, 0.5)), "contrast must lie within"),
        (lambda: T.ColorJitter(hue=0.6), "hue must lie within"),
        (lambda: T.ColorJitter(saturation="x"), "saturation must be a number or"),
        (lambda: T.GaussianBlur(4), "kernel_size must be odd"),
        (lambda: T.GaussianBlur(3, (2.0, 1.0)), "sigma must be positive, as"),
        (lambda: T.GaussianBlur(3, 0.0), "sigma must be positive"),
        (lambda: T.RandomPosterize(9), r"bits must be an int in \[0, 8\]"),
        (lambda: T.RandomSolarize(300), r"threshold must be a number in \[0, 255\]"),
        (lambda: T.RandomAdjustSharpness(-1.0), "sharpness_factor must be a non-negative"),
        (lambda: T.RandomInvert(1.5), r"p must be a probability in \[0, 1\]"),
    ],
)
def test_bad_arguments_raise(make, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()


def test_bad_images_raise() -> None:
    with pytest.raises(ValueError, match="must be uint8"):
        T.ColorJitter(0.4)(torch.zeros(2, 3, 8, 8))
    with pytest.raises(ValueError, match="takes 1 or 3 channels"):
        T.RandomAutocontrast(1.0)(torch.zeros(2, 4, 8, 8, dtype=torch.uint8))


# ---------------------------------------------------------------- CUDA


def _modules() -> list[torch.nn.Module]:
    return [
        T.ColorJitter(0.4, 0.4, 0.4, 0.1),
        T.GaussianBlur(5),
        *(make(0.5) for make in RANDOM_APPLY.values()),
    ]


@pytest.mark.cuda
def test_cuda_draws_the_cpu_parameters_and_pixels() -> None:
    x = photo_like(16, 24, 28)
    for tf in _modules():
        cpu = tf(x, generator=torch.Generator().manual_seed(14))
        gpu = tf(x.cuda(), generator=torch.Generator().manual_seed(14))
        assert gpu.device.type == "cuda"
        assert mad(gpu.cpu(), cpu) < 0.05, tf  # CUDA float32 rounding: a few levels apart


@pytest.mark.cuda
def test_cuda_modules_never_make_the_host_wait() -> None:
    x = photo_like(16, 24, 28).cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for tf in _modules():
            tf(x, generator=torch.Generator().manual_seed(0))
    finally:
        torch.cuda.set_sync_debug_mode(0)
