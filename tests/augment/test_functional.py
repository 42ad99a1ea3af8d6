"""packer.augment.functional: per-image batched ops give torchvision's pixels image by image.

Measured here (CPU, 6 images 3x32x40, a different parameter per image), mean
|ours - torchvision| in levels: 0 for every op (bit-identical) except
gaussian_blur, about 3e-5 (two 1-D passes instead of one 2-D conv: a few pixels
one level apart). The asserts allow a little more, and far less than 1/255 of
the range (1 level).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torchvision.transforms.v2 import functional as TF

from aug_checks import mad, per_image, photo_like
from conftest import subprocess_env
from helpers.interpreted import run_fresh
from packer.augment import functional as F
from packer.augment import params as PR
from packer.augment import warps as W

B = 6
FACTORS = torch.tensor([0.0, 0.3, 0.9, 1.0, 1.5, 2.0], dtype=torch.float64)
HUES = torch.tensor([-0.5, -0.2, 0.0, 0.1, 0.33, 0.5], dtype=torch.float64)
BITS = torch.tensor([0, 1, 3, 5, 7, 8])
THRESHOLDS = torch.tensor([0.0, 50.5, 128.0, 200.0, 254.9, 255.0], dtype=torch.float64)
SIGMAS = torch.tensor([0.1, 0.5, 0.8, 1.2, 1.7, 2.0], dtype=torch.float64)
ANGLES = torch.tensor([-170.0, -30.0, -7.5, 0.0, 45.0, 90.0], dtype=torch.float64)
TRANSLATES = torch.tensor([[0, 0], [3, -2], [-5, 4], [1, 1], [0, -6], [7, 0]], dtype=torch.float64)
SCALES = torch.tensor([1.0, 0.8, 1.2, 0.7, 1.0, 1.3], dtype=torch.float64)
SHEARS = torch.tensor([[0, 0], [10, 0], [-20, 5], [0, -15], [30, 30], [-5, 0]], dtype=torch.float64)


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    x = photo_like(B, 32, 40)
    x[3, 1] = 77  # a flat channel: autocontrast and equalize keep it
    x[4, 2] = torch.where(x[4, 2] > 128, 200, 10).to(torch.uint8)  # two levels only
    return x


def _mode(name: str) -> TF.InterpolationMode:
    return TF.InterpolationMode(name)


def _list(t: torch.Tensor) -> list[float]:
    return [float(v) for v in t]


COLOR_CASES = {
    "brightness": (
        lambda x: F.adjust_brightness(x, FACTORS),
        lambda x: per_image(lambda i, f: TF.adjust_brightness(i, float(f)), x, FACTORS),
    ),
    "contrast": (
        lambda x: F.adjust_contrast(x, FACTORS),
        lambda x: per_image(lambda i, f: TF.adjust_contrast(i, float(f)), x, FACTORS),
    ),
    "saturation": (
        lambda x: F.adjust_saturation(x, FACTORS),
        lambda x: per_image(lambda i, f: TF.adjust_saturation(i, float(f)), x, FACTORS),
    ),
    "hue": (
        lambda x: F.adjust_hue(x, HUES),
        lambda x: per_image(lambda i, f: TF.adjust_hue(i, float(f)), x, HUES),
    ),
    "sharpness": (
        lambda x: F.adjust_sharpness(x, FACTORS),
        lambda x: per_image(lambda i, f: TF.adjust_sharpness(i, float(f)), x, FACTORS),
    ),
    "posterize": (
        lambda x: F.posterize(x, BITS),
        lambda x: per_image(lambda i, n: TF.posterize(i, int(n)), x, BITS),
    ),
    "solarize": (
        lambda x: F.solarize(x, THRESHOLDS),
        lambda x: per_image(lambda i, t: TF.solarize(i, float(t)), x, THRESHOLDS),
    ),
    "autocontrast": (F.autocontrast, lambda x: per_image(TF.autocontrast, x)),
    "equalize": (F.equalize, lambda x: per_image(TF.equalize, x)),
    "invert": (F.invert, lambda x: per_image(TF.invert, x)),
    "grayscale1": (
        lambda x: F.rgb_to_grayscale(x, 1),
        lambda x: per_image(lambda i: TF.rgb_to_grayscale(i, 1), x),
    ),
    "grayscale3": (
        lambda x: F.rgb_to_grayscale(x, 3),
        lambda x: per_image(lambda i: TF.rgb_to_grayscale(i, 3), x),
    ),
}


@pytest.mark.parametrize("name", list(COLOR_CASES))
def test_color_ops_match_torchvision_image_by_image(images: torch.Tensor, name: str) -> None:
    ours_fn, ref_fn = COLOR_CASES[name]
    ours, ref = ours_fn(images), ref_fn(images)
    assert ours.dtype == torch.uint8 and ours.shape == ref.shape
    assert mad(ours, ref) < 0.01  # measured: 0 (bit-identical)
    assert (ours.int() - ref.int()).abs().max() <= 1


@pytest.mark.parametrize("name", ["brightness", "contrast", "saturation", "hue", "sharpness"])
def test_factor_ops_on_one_channel_images(name: str) -> None:
    x = photo_like(4, 16, 20, c=1)
    f = torch.tensor([0.2, 0.0, 0.45, 0.5], dtype=torch.float64)  # valid for hue too
    ours = getattr(F, f"adjust_{name}")(x, f)
    ref = per_image(lambda i, v: getattr(TF, f"adjust_{name}")(i, float(v)), x, f)
    assert torch.equal(ours, ref)


def test_parameters_as_numbers_float32_and_int_tensors(images: torch.Tensor) -> None:
    ref = per_image(lambda i: TF.adjust_brightness(i, 1.3), images)
    assert torch.equal(F.adjust_brightness(images, 1.3), ref)
    as32 = F.adjust_contrast(images, FACTORS.float())
    assert mad(as32, F.adjust_contrast(images, FACTORS)) < 0.01
    assert torch.equal(F.posterize(images, 3), per_image(lambda i: TF.posterize(i, 3), images))


def test_different_images_get_different_parameters(images: torch.Tensor) -> None:
    same = images[:1].expand(B, -1, -1, -1)
    out = F.adjust_brightness(same, FACTORS)
    assert len({tuple(o.flatten().tolist()) for o in out}) == B


@pytest.mark.parametrize("kernel_size", [5, (3, 7), 9])
def test_gaussian_blur_matches_torchvision(images: torch.Tensor, kernel_size) -> None:
    ks = [kernel_size] * 2 if isinstance(kernel_size, int) else list(kernel_size)
    ours = F.gaussian_blur(images, kernel_size, SIGMAS)
    ref = per_image(lambda i, s: TF.gaussian_blur(i, ks, [float(s)] * 2), images, SIGMAS)
    assert mad(ours, ref) < 0.01  # measured about 3e-5: separable float32 sums
    assert (ours.int() - ref.int()).abs().max() <= 1


def test_gaussian_blur_per_axis_sigmas(images: torch.Tensor) -> None:
    sig = torch.stack([SIGMAS, SIGMAS.flip(0)], 1)
    ours = F.gaussian_blur(images, (5, 3), sig)
    ref = per_image(lambda i, s: TF.gaussian_blur(i, [5, 3], _list(s)), images, sig)
    assert mad(ours, ref) < 0.01
    assert torch.equal(F.gaussian_blur(images, 1, 1.0), images)  # a 1-tap kernel keeps the image


@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
@pytest.mark.parametrize("fill", [None, 0, (10, 200, 30)])
def test_affine_matches_torchvision(images: torch.Tensor, mode: str, fill) -> None:
    ours = W.affine(images, ANGLES, TRANSLATES, SCALES, SHEARS, mode, fill)
    tv_fill = list(fill) if isinstance(fill, tuple) else fill

    def ref(i, a, t, s, sh):
        return TF.affine(i, float(a), _list(t), float(s), _list(sh), _mode(mode), tv_fill)

    expected = per_image(ref, images, ANGLES, TRANSLATES, SCALES, SHEARS)
    assert mad(ours, expected) < 0.05  # measured: 0 (bit-identical grids)


@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
@pytest.mark.parametrize("fill", [None, 0, (10, 200, 30)])
def test_rotate_matches_torchvision(images: torch.Tensor, mode: str, fill) -> None:
    ours = W.rotate(images, ANGLES, mode, fill)
    tv_fill = list(fill) if isinstance(fill, tuple) else fill
    ref = per_image(lambda i, a: TF.rotate(i, float(a), _mode(mode), fill=tv_fill), images, ANGLES)
    assert mad(ours, ref) < 0.05  # measured: 0


def test_affine_about_a_corner_as_trivial_augment_shears(images: torch.Tensor) -> None:
    # TrivialAugmentWide's ShearX: shear about (0, 0), fill None.
    shear = SHEARS[:, 0]
    ours = W.affine(images, 0.0, 0.0, 1.0, shear, "nearest", None, center=(0, 0))
    ref = per_image(
        lambda i, s: TF.affine(i, 0.0, [0, 0], 1.0, [float(s), 0.0], center=[0, 0]), images, shear
    )
    assert mad(ours, ref) < 0.05


def test_affine_geometry_exact_cases() -> None:
    x = photo_like(2, 24, 24)
    assert torch.equal(W.affine(x, 0.0), x)  # the identity is exact
    assert torch.equal(W.rotate(x, 90.0), torch.rot90(x, 1, (-2, -1)))  # counter-clockwise
    assert torch.equal(W.rotate(x, 180.0, "bilinear"), torch.rot90(x, 2, (-2, -1)))
    moved = W.affine(x, 0.0, (3, -2), fill=(1, 2, 3))
    assert torch.equal(moved[..., :22, 3:], x[..., 2:, :21])  # content moves right 3, up 2
    assert torch.equal(moved[:, :, 0, 0], torch.tensor([[1, 2, 3]] * 2, dtype=torch.uint8))


def test_erase_matches_torchvision(images: torch.Tensor) -> None:
    boxes = torch.tensor(
        [[0, 0, 5, 7], [3, 4, 10, 12], [0, 0, 0, 0], [31, 39, 1, 1], [2, 3, 0, 5], [5, 6, 20, 30]]
    )
    ours = F.erase(images, boxes, (5, 6, 7))
    v = torch.tensor([5.0, 6.0, 7.0])[:, None, None]
    ref = per_image(lambda i, b: TF.erase(i, *map(int, b), v), images, boxes)
    assert torch.equal(ours, ref)
    normed = (images.float() - 120) / 60
    ours = F.erase(normed, boxes, 0.0)
    ref = per_image(lambda i, b: TF.erase(i, *map(int, b), torch.zeros(3, 1, 1)), normed, boxes)
    assert ours.dtype == torch.float32 and torch.equal(ours, ref)
    noise = torch.randn(B, 3, 32, 40, generator=torch.Generator().manual_seed(0))
    ours = F.erase(normed, boxes, noise)
    top, left, h, w = boxes[1].tolist()
    assert torch.equal(
        ours[1, :, top : top + h, left : left + w], noise[1, :, top : top + h, left : left + w]
    )
    assert torch.equal(ours[2], normed[2])


# ---------------------------------------------------------------- subsets


def test_apply_to_runs_only_on_the_chosen_images(images: torch.Tensor) -> None:
    calls = []

    def fn(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        calls.append(x.shape[0])
        return F.adjust_brightness(x, f)

    mask = torch.tensor([True, False, True, False, False, True])
    out = PR.apply_to(images, mask, fn, FACTORS)
    assert calls == [3]
    full = F.adjust_brightness(images, FACTORS)
    assert torch.equal(out[mask], full[mask]) and torch.equal(out[~mask], images[~mask])
    assert PR.apply_to(images, torch.zeros(B, dtype=torch.bool), fn, FACTORS) is images
    assert torch.equal(PR.apply_to(images, torch.ones(B, dtype=torch.bool), fn, FACTORS), full)
    assert calls == [3, B]
    assert torch.equal(PR.where(mask, full, images), out)


def test_apply_groups_gives_each_image_its_groups_op(images: torch.Tensor) -> None:
    group = torch.tensor([2, 0, 1, 2, 0, 0])
    fns = [
        lambda x, f: F.adjust_brightness(x, f),
        None,
        lambda x, f: F.adjust_contrast(x, f),
    ]
    out = PR.apply_groups(images, group, fns, FACTORS)
    assert torch.equal(out[[1, 4, 5]], F.adjust_brightness(images, FACTORS)[[1, 4, 5]])
    assert torch.equal(out[2], images[2])
    assert torch.equal(out[[0, 3]], F.adjust_contrast(images, FACTORS)[[0, 3]])
    assert PR.apply_groups(images, torch.ones(B, dtype=torch.int64), fns, FACTORS) is images
    with pytest.raises(ValueError, match=r"group values must lie in \[0, 3\)"):
        PR.apply_groups(images, torch.full((B,), 3), fns, FACTORS)


# ---------------------------------------------------------------- bad arguments


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda x: F.adjust_brightness(x, -0.5), "brightness factor must be at least 0"),
        (lambda x: F.adjust_saturation(x, torch.tensor([1.0, 2.0])), r"must be a tensor \[6\]"),
        (lambda x: F.adjust_hue(x, 0.7), "hue factor must be at most 0.5"),
        (lambda x: F.posterize(x, 9), "bits must be at most 8"),
        (lambda x: F.solarize(x, 300.0), "threshold must be at most 255"),
        (lambda x: F.gaussian_blur(x, 4, 1.0), "kernel_size must be odd"),
        (lambda x: F.gaussian_blur(x, 3, 0.0), "sigma must be positive"),
        (lambda x: F.gaussian_blur(x, 65, 1.0), "too large"),
        (lambda x: W.affine(x, 0.0, scale=0.0), "scale must be positive"),
        (lambda x: W.affine(x, 0.0, fill=(1, 2)), "fill must be a number, 3 numbers"),
        (lambda x: F.erase(x, torch.zeros(6, 4, dtype=torch.int64), (1, 2)), "value must be"),
        (lambda x: F.rgb_to_grayscale(x, 2), "num_output_channels must be 1 or 3"),
        (lambda x: F.adjust_contrast(x[:, :2], 1.0), "takes 1 or 3 channels"),
        (lambda x: F.invert(x.float()), "must be uint8"),
    ],
)
def test_bad_arguments_raise(images: torch.Tensor, call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call(images)


# ---------------------------------------------------------------- CUDA


def _all_ops(x: torch.Tensor) -> dict[str, torch.Tensor]:
    out = {name: fns[0](x) for name, fns in COLOR_CASES.items()}
    out["blur"] = F.gaussian_blur(x, (5, 3), SIGMAS)
    for mode in ("nearest", "bilinear"):
        for fill in (None, (10, 200, 30)):
            out[f"affine {mode} {fill}"] = W.affine(
                x, ANGLES, TRANSLATES, SCALES, SHEARS, mode, fill
            )
    out["rotate"] = W.rotate(x, ANGLES, "bilinear", 0)
    out["erase"] = F.erase(x, torch.tensor([[1, 2, 5, 6]] * B), (1, 2, 3))
    out["apply_to"] = PR.apply_to(x, torch.tensor([True, False] * 3), F.invert)
    return out


@pytest.mark.cuda
def test_cuda_matches_cpu(images: torch.Tensor) -> None:
    cpu = _all_ops(images)
    gpu = _all_ops(images.cuda())
    for name, ref in cpu.items():
        got = gpu[name]
        assert got.device.type == "cuda" and got.dtype == ref.dtype, name
        # CUDA float32 arithmetic may round a few values to the other level; a
        # nearest sample on an exact tie may pick the neighbour.
        assert mad(got.cpu(), ref) < 0.05, name


@pytest.mark.cuda
def test_cuda_ops_never_make_the_host_wait(images: torch.Tensor) -> None:
    x = images.cuda()
    on_device = FACTORS.cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # a synchronizing call raises
    try:
        _all_ops(x)
        F.adjust_brightness(x, on_device)  # device parameters too
        W.affine(x, on_device, 0.0, 1.0, 0.0, "bilinear", 0)
        PR.apply_to(x, on_device > 1, F.invert)
    finally:
        torch.cuda.set_sync_debug_mode(0)


def test_affine_matrix_is_the_same_from_numpy_and_from_tensors() -> None:
    # Device parameters take the tensor route; on the CPU both routes can be compared.
    params = (
        ANGLES.numpy(),
        TRANSLATES.numpy(),
        SCALES.numpy(),
        SHEARS.numpy(),
        TRANSLATES.numpy(),
    )
    from_numpy = W.affine_matrix(*params)
    from_torch = W.affine_matrix(*map(torch.from_numpy, params))
    assert isinstance(from_numpy, np.ndarray) and from_numpy.shape == (B, 2, 3)
    assert np.allclose(from_numpy, from_torch.numpy(), rtol=0, atol=1e-12)


@pytest.mark.xdist_group("fresh-interpreter")  # one zygote (helpers.interpreted.run_fresh)
def test_importing_an_augment_module_first_works() -> None:
    # packer.transforms re-exports these modules, which build on its helpers: the
    # package loads it first, so no import order can hit a half-made module. In a fork of
    # an interpreter that imported torch and nothing of packer (helpers.interpreted: a
    # fresh one took 2.4 CPU-s, most of it torch's import).
    code = (
        "import packer.augment.geometry as g, packer.transforms as T\n"
        "assert T.RandomAffine is g.RandomAffine and T.ColorJitter.__module__ == 'packer.augment.color'\n"
    )
    r = run_fresh(code, env=subprocess_env(), timeout=120)
    assert r.returncode == 0, r.stderr
