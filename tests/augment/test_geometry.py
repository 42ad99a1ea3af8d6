"""packer.augment.geometry: RandomRotation/RandomAffine draw torchvision's parameters per
image and warp as torchvision's affine does.

Pixels, mean |ours - torchvision| in levels over the module outputs below (CPU,
torchvision's ``affine``/``rotate`` called image by image with the drawn
parameters): 0 for nearest and bilinear, with fill None, 0 or per channel
(the grids are torchvision's, bit for bit).
"""

from __future__ import annotations

import pytest
import torch
from torchvision import transforms as tv
from torchvision.transforms.v2 import functional as TF

import packer.transforms as T
from aug_checks import (
    assert_same_categories,
    assert_same_distribution,
    mad,
    photo_like,
    tv_draws,
)

N = 3000


def _tv_draws(fn, n: int = N, seed: int = 0) -> list:
    return tv_draws(fn, n, seed)


# ---------------------------------------------------------------- draws


def test_rotation_angles_follow_torchvision() -> None:
    ours = T.RandomRotation((-30, 45)).sample(N, torch.Generator().manual_seed(1))
    theirs = _tv_draws(lambda: tv.RandomRotation.get_params([-30.0, 45.0]))
    assert_same_distribution(ours.numpy(), theirs)


@pytest.mark.parametrize("shear", [(-10.0, 10.0, -5.0, 5.0), 8.0])
def test_affine_parameters_follow_torchvision(shear) -> None:
    h, w = 32, 40
    args = dict(degrees=25, translate=(0.1, 0.2), scale=(0.8, 1.2), shear=shear)
    ours = T.RandomAffine(**args).sample(N, h, w, torch.Generator().manual_seed(2))
    ref = tv.RandomAffine(**args)
    draws = _tv_draws(
        lambda: tv.RandomAffine.get_params(ref.degrees, ref.translate, ref.scale, ref.shear, [w, h])
    )
    assert_same_distribution(ours.angle.numpy(), [d[0] for d in draws])
    assert_same_distribution(ours.scale.numpy(), [d[2] for d in draws])
    assert_same_distribution(ours.shear[:, 0].numpy(), [d[3][0] for d in draws])
    assert_same_distribution(ours.shear[:, 1].numpy(), [d[3][1] for d in draws])
    # Translations are whole pixels, rounded half to even as Python's round.
    tx, ty = ours.translate.T.numpy()
    assert_same_categories(tx, [d[1][0] for d in draws], range(-4, 5))
    assert_same_categories(ty, [d[1][1] for d in draws], range(-7, 8))
    assert set(tx.tolist()) <= set(range(-4, 5)) and set(ty.tolist()) <= set(range(-6, 7))


def test_affine_without_optional_ranges_draws_the_identity() -> None:
    p = T.RandomAffine(0).sample(8, 16, 16, torch.Generator().manual_seed(3))
    assert torch.equal(p.angle, torch.zeros(8, dtype=torch.float64))
    assert not p.translate.any() and not p.shear.any() and torch.all(p.scale == 1)


# ---------------------------------------------------------------- pixels


def _affine_reference(x, p, mode, fill):
    return torch.stack(
        [
            TF.affine(
                img,
                float(p.angle[i]),
                [float(v) for v in p.translate[i]],
                float(p.scale[i]),
                [float(v) for v in p.shear[i]],
                TF.InterpolationMode(mode),
                fill,
            )
            for i, img in enumerate(x)
        ]
    )


@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
@pytest.mark.parametrize("fill", [None, 0, (10, 200, 30)])
def test_random_affine_matches_torchvision_image_by_image(mode: str, fill) -> None:
    x = photo_like(8, 32, 40, seed=4)
    tf = T.RandomAffine(30, (0.1, 0.1), (0.7, 1.3), (-15, 15, -5, 5), mode, fill)
    p = tf.sample(8, 32, 40, torch.Generator().manual_seed(5))
    out = tf(x, generator=torch.Generator().manual_seed(5))
    tv_fill = list(fill) if isinstance(fill, tuple) else fill
    assert mad(out, _affine_reference(x, p, mode, tv_fill)) < 0.05  # measured: 0


@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
def test_random_rotation_matches_torchvision_image_by_image(mode: str) -> None:
    x = photo_like(8, 32, 40, seed=6)
    tf = T.RandomRotation(180, interpolation=mode, fill=(1, 2, 3), center=(5, 7))
    angle = tf.sample(8, torch.Generator().manual_seed(7))
    out = tf(x, generator=torch.Generator().manual_seed(7))
    ref = torch.stack(
        [
            TF.rotate(i, float(a), TF.InterpolationMode(mode), center=[5, 7], fill=[1, 2, 3])
            for i, a in zip(x, angle)
        ]
    )
    assert mad(out, ref) < 0.05  # measured: 0


def test_torchvision_interpolation_modes_are_accepted() -> None:
    tf = T.RandomRotation(10, interpolation=TF.InterpolationMode.BILINEAR)
    assert tf.interpolation == "bilinear"


def test_each_image_gets_its_own_warp() -> None:
    x = photo_like(1, 24, 24).expand(16, -1, -1, -1)
    for tf in (T.RandomRotation(45), T.RandomAffine(10, (0.2, 0.2), (0.8, 1.2), 10)):
        out = tf(x, generator=torch.Generator().manual_seed(8))
        assert len({tuple(o.flatten().tolist()) for o in out}) == 16


def test_same_seed_same_output() -> None:
    x = photo_like(8, 24, 24)
    tf = T.Compose([T.RandomRotation(20, "bilinear"), T.RandomAffine(0, (0.1, 0.1))])
    a = tf(x, generator=torch.Generator().manual_seed(9))
    b = tf(x, generator=torch.Generator().manual_seed(9))
    c = tf(x, generator=torch.Generator().manual_seed(10))
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: T.RandomRotation(-5), "degrees must be a non-negative number"),
        (lambda: T.RandomRotation((1, 2, 3)), "degrees must be a number or a sequence of 2"),
        (lambda: T.RandomRotation(5, fill="white"), "fill must be a number"),
        (lambda: T.RandomRotation(5, center=(1, 2, 3)), "center must be"),
        (lambda: T.RandomAffine(5, translate=(0.5, 1.5)), r"translate values must lie in \[0, 1\]"),
        (lambda: T.RandomAffine(5, scale=(0.0, 1.0)), "scale values must be positive"),
        (
            lambda: T.RandomAffine(5, shear=(1, 2, 3)),
            "shear must be a number or a sequence of 2 or 4",
        ),
    ],
)
def test_bad_arguments_raise(make, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()


def test_fill_with_the_wrong_number_of_channels_raises() -> None:
    with pytest.raises(ValueError, match="fill must be a number, 3 numbers"):
        T.RandomRotation(5, fill=(1, 2))(photo_like(2, 8, 8))


# ---------------------------------------------------------------- CUDA


def _modules() -> list[torch.nn.Module]:
    return [
        T.RandomRotation(30),
        T.RandomRotation(30, "bilinear", fill=None),
        T.RandomAffine(20, (0.1, 0.1), (0.8, 1.2), 10, "bilinear", fill=(10, 20, 30)),
    ]


@pytest.mark.cuda
def test_cuda_draws_the_cpu_parameters_and_pixels() -> None:
    x = photo_like(16, 32, 40)
    for tf in _modules():
        cpu = tf(x, generator=torch.Generator().manual_seed(11))
        gpu = tf(x.cuda(), generator=torch.Generator().manual_seed(11))
        assert gpu.device.type == "cuda"
        assert mad(gpu.cpu(), cpu) < 0.05, tf  # a nearest tie may pick the neighbour


@pytest.mark.cuda
def test_cuda_modules_never_make_the_host_wait() -> None:
    x = photo_like(16, 32, 40).cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for tf in _modules():
            tf(x, generator=torch.Generator().manual_seed(0))
    finally:
        torch.cuda.set_sync_debug_mode(0)
