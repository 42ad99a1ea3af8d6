"""packer.augment.dense ops against torchvision.transforms.v2 transforms: the same seed
(a generator here, ``torch.manual_seed`` there) draws the same parameters, so every
field comes out the same (boxes 1e-4 px, masks identical, keypoints 1e-4, images as the
image kernels give). Also: determinism, colour ops touching the image only, and the
refusal of torchvision (and batch-only packer) transforms where a dense op is expected."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from dense_checks import as_tv, assert_matches, make_sample
from torchvision import tv_tensors
from torchvision.transforms import v2

import packer.transforms as T
from packer.augment import dense as D
from packer.augment import dense_kernels as K
from packer.errors import UsageError

# torchvision before 0.27 takes no strings for v2 interpolation: the enum on every version
_MODE = {"nearest": v2.InterpolationMode.NEAREST, "bilinear": v2.InterpolationMode.BILINEAR}

SEEDS = range(12)


def _both(ours_op, theirs_op, seed: int, sample: K.Sample | None = None):
    s = sample if sample is not None else make_sample(seed)
    torch.manual_seed(seed)
    theirs = theirs_op(as_tv(s))
    ours = ours_op(s, torch.Generator().manual_seed(seed))
    return ours, theirs


def _nearest_close(ours: K.Sample, theirs: dict) -> None:
    """packer.augment.warps.affine's nearest image: torchvision's grid; a sample exactly
    halfway between two pixels may take the other one."""
    differ = (ours.image != theirs["image"].as_subclass(torch.Tensor)).float().mean()
    assert differ < 0.01


@pytest.mark.parametrize("seed", SEEDS)
def test_random_resized_crop_is_torchvisions(seed: int) -> None:
    ours, theirs = _both(D.RandomResizedCrop((24, 32)), v2.RandomResizedCrop((24, 32)), seed)
    assert_matches(ours, theirs, image_tol=2)


def test_random_resized_crop_falls_back_to_the_centre_crop() -> None:
    args = dict(scale=(5.0, 6.0), ratio=(2.5, 3.0))  # never fits: torchvision's fallback
    ours, theirs = _both(D.RandomResizedCrop(16, **args), v2.RandomResizedCrop(16, **args), 1)
    assert_matches(ours, theirs, image_tol=2)


@pytest.mark.parametrize("seed", SEEDS)
def test_random_iou_crop_is_torchvisions(seed: int) -> None:
    ours, theirs = _both(D.RandomIoUCrop(), v2.RandomIoUCrop(), seed)
    assert_matches(ours, theirs)


@pytest.mark.parametrize("seed", SEEDS)
def test_ssd_crop_then_sanitize_is_torchvisions(seed: int) -> None:
    s = replace(make_sample(seed, m=8), keypoints=None)  # torchvision's sanitize keeps KeyPoints
    ours, theirs = _both(
        D.Compose([D.RandomIoUCrop(), D.SanitizeBoundingBoxes()]),
        v2.Compose([v2.RandomIoUCrop(), v2.SanitizeBoundingBoxes()]),
        seed,
        s,
    )
    assert_matches(ours, theirs)
    assert torch.equal(ours.labels, theirs["labels"])
    assert ours.extras["iscrowd"].shape == ours.labels.shape


@pytest.mark.parametrize("seed", SEEDS)
def test_scale_jitter_is_torchvisions(seed: int) -> None:
    ours, theirs = _both(D.ScaleJitter((64, 48)), v2.ScaleJitter((64, 48)), seed)
    assert_matches(ours, theirs, image_tol=2)


@pytest.mark.parametrize("seed", SEEDS)
def test_zoom_out_is_torchvisions(seed: int) -> None:
    fill = {tv_tensors.Image: [1, 2, 3], tv_tensors.Mask: 0, "others": 0}
    ours, theirs = _both(
        D.RandomZoomOut(fill=(1, 2, 3), side_range=(1.0, 2.5), semantic_fill=0),
        v2.RandomZoomOut(fill=fill, side_range=(1.0, 2.5)),
        seed,
    )
    assert_matches(ours, theirs)


@pytest.mark.parametrize("seed", SEEDS)
def test_flip_is_torchvisions(seed: int) -> None:
    ours, theirs = _both(D.RandomHorizontalFlip(), v2.RandomHorizontalFlip(), seed)
    assert_matches(ours, theirs)


@pytest.mark.parametrize("seed", SEEDS)
def test_rotation_is_torchvisions(seed: int) -> None:
    ours, theirs = _both(D.RandomRotation(40, semantic_fill=0), v2.RandomRotation(40, fill=0), seed)
    assert_matches(ours, theirs, image_tol=255)
    _nearest_close(ours, theirs)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
def test_affine_is_torchvisions(seed: int, interpolation: str) -> None:
    args = dict(degrees=20, translate=(0.1, 0.2), scale=(0.8, 1.2), shear=(-5, 5, -3, 3))
    ours, theirs = _both(
        D.RandomAffine(**args, interpolation=interpolation, semantic_fill=0),
        v2.RandomAffine(**args, interpolation=_MODE[interpolation], fill=0),
        seed,
    )
    assert_matches(ours, theirs, image_tol=255 if interpolation == "nearest" else 1)
    _nearest_close(ours, theirs)


@pytest.mark.parametrize("size,max_size", [(20, None), ((30, 17), None), (20, 25)])
def test_resize_is_torchvisions(size, max_size) -> None:
    ours, theirs = _both(D.Resize(size, max_size=max_size), v2.Resize(size, max_size=max_size), 0)
    assert_matches(ours, theirs, image_tol=2)


@pytest.mark.parametrize("seed", range(6))
def test_fixed_size_crop_draws_one_offset_as_the_reference(seed: int) -> None:
    s = make_sample(seed, h=60, w=80, m=8)
    out = D.FixedSizeCrop((40, 96), fill=(5, 6, 7))(s, torch.Generator().manual_seed(seed))
    r = torch.Generator().manual_seed(seed)
    r = torch.rand(1, generator=r)
    top, left = int(20 * r), int(0 * r)  # the reference: offset * r, one r for both
    want = K.fixed_size_crop(s, top, left, 40, 96, (5, 6, 7))
    assert out.size == (40, 96) and torch.equal(out.image, want.image)
    assert torch.equal(out.boxes, want.boxes) and torch.equal(out.masks, want.masks)
    assert ((out.boxes[:, 2] > out.boxes[:, 0]) & (out.boxes[:, 3] > out.boxes[:, 1])).all()


def test_lsj_recipe_gives_fixed_size_outputs() -> None:
    lsj = D.Compose(
        [D.ScaleJitter((64, 64)), D.FixedSizeCrop(64, fill=0), D.RandomHorizontalFlip(),
         D.SanitizeBoundingBoxes()]
    )  # fmt: skip
    for seed in range(8):
        out = lsj(make_sample(seed, h=45, w=70, m=6), torch.Generator().manual_seed(seed))
        assert out.size == (64, 64) and out.masks.shape[1:] == (64, 64)
        assert out.semantic.shape == (64, 64) and out.count == out.labels.shape[0]


def test_same_generator_same_sample_other_seed_other_sample() -> None:
    ops = D.Compose([D.RandomZoomOut(p=1.0), D.RandomIoUCrop(), D.RandomHorizontalFlip(),
                     D.RandomAffine(10, scale=(0.9, 1.1)), D.SanitizeBoundingBoxes()])  # fmt: skip
    s = make_sample(3, m=8)
    a = ops(s, torch.Generator().manual_seed(5))
    b = ops(s, torch.Generator().manual_seed(5))
    c = ops(s, torch.Generator().manual_seed(6))
    assert torch.equal(a.image, b.image) and torch.equal(a.boxes, b.boxes)
    assert torch.equal(a.masks, b.masks) and torch.equal(a.keypoints, b.keypoints)
    assert a.size != c.size or not torch.equal(a.image, c.image)


def test_sample_params_then_apply_is_the_call() -> None:
    op = D.RandomAffine(15, translate=(0.1, 0.1))
    s = make_sample(2)
    p = op.sample_params(s, torch.Generator().manual_seed(9))
    assert set(p) == {"angle", "translate", "scale", "shear"}
    direct = op(s, torch.Generator().manual_seed(9))
    assert torch.equal(op.apply(s, p).boxes, direct.boxes)


def test_color_only_touches_the_image_only() -> None:
    s = make_sample(4)
    out = D.ColorOnly(T.ColorJitter(0.5, 0.5, 0.5, 0.1))(s, torch.Generator().manual_seed(0))
    assert not torch.equal(out.image, s.image)
    for name in ("boxes", "labels", "masks", "semantic", "keypoints"):
        assert getattr(out, name) is getattr(s, name)
    again = D.ColorOnly(T.ColorJitter(0.5, 0.5, 0.5, 0.1))(s, torch.Generator().manual_seed(0))
    assert torch.equal(out.image, again.image)


@pytest.mark.parametrize(
    "transform,match",
    [
        (T.RandomResizedCrop(32), r"ColorOnly: packer.transforms.RandomResizedCrop moves pixels"),
        (
            T.Compose([T.ColorJitter(0.2), T.RandomAffine(5)]),
            r"packer.transforms.RandomAffine moves",
        ),
        (T.TrivialAugmentWide(), r"packer.transforms.TrivialAugmentWide moves pixels"),
        (v2.ColorJitter(0.2), r"ColorOnly: torchvision.transforms.v2.ColorJitter is a torchvision"),
    ],
)
def test_color_only_refuses_what_moves_pixels_or_is_torchvisions(transform, match) -> None:
    with pytest.raises(UsageError, match=match):
        D.ColorOnly(transform)


@pytest.mark.parametrize(
    "op,match",
    [
        (
            v2.RandomIoUCrop(),
            r"Compose \(item 1\): torchvision.transforms.v2.RandomIoUCrop is a torchvision "
            r"transform.*use packer.augment.dense.RandomIoUCrop",
        ),
        (v2.RandomHorizontalFlip(), r"use packer.augment.dense.RandomHorizontalFlip"),
        (v2.SanitizeBoundingBoxes(), r"torchvision.transforms.v2.SanitizeBoundingBoxes is a"),
        (v2.ColorJitter(), r"v2.ColorJitter is a torchvision transform.*ColorOnly"),
        (T.RandomResizedCrop(32), r"packer.transforms.RandomResizedCrop works on image batches"),
        (lambda s: s, r"expected a packer.augment.dense op, not function"),
    ],
)
def test_compose_refuses_other_transforms_naming_them(op, match) -> None:
    with pytest.raises(UsageError, match=match):
        D.Compose([D.RandomHorizontalFlip(), op])


def test_an_op_refuses_a_plain_dict() -> None:
    with pytest.raises(UsageError, match=r"RandomIoUCrop: takes a packer.augment.dense.Sample"):
        D.RandomIoUCrop()({"image": torch.zeros(3, 4, 4, dtype=torch.uint8)})


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: D.RandomZoomOut(side_range=(0.5, 2)), r"RandomZoomOut: side_range must be"),
        (lambda: D.RandomHorizontalFlip(p=1.5), r"RandomHorizontalFlip: p must be a probability"),
        (lambda: D.RandomAffine(10, translate=(0.1, 2.0)), r"translate values must lie in"),
        (lambda: D.SanitizeBoundingBoxes(min_size=0), r"min_size must be >= 1, not 0"),
        (lambda: D.RandomIoUCrop(trials=0), r"RandomIoUCrop: trials must be a positive int"),
        (lambda: D.PadToMultiple(0), r"divisor must be a positive int, not 0"),
        (lambda: D.RandomRotation(10, interpolation="bicubic"), r"RandomRotation: interpolation"),
    ],
)
def test_bad_arguments_name_the_op(make, match) -> None:
    with pytest.raises(UsageError, match=match):
        make()


def test_iou_crop_without_a_possible_crop_keeps_the_sample() -> None:
    s = replace(make_sample(0, m=0), labels=None, masks=None, keypoints=None, extras={})
    op = D.RandomIoUCrop(sampler_options=[0.5], max_rounds=3)
    assert op(s, torch.Generator().manual_seed(0)) is s  # torchvision would draw forever


@pytest.mark.cuda
def test_cuda_gives_the_cpu_fields() -> None:
    ops = D.Compose([D.RandomZoomOut(p=1.0), D.RandomIoUCrop(), D.RandomHorizontalFlip(),
                     D.RandomAffine(10, scale=(0.9, 1.1)), D.ScaleJitter((64, 64)),
                     D.FixedSizeCrop(64), D.SanitizeBoundingBoxes()])  # fmt: skip
    for seed in range(4):
        s = make_sample(seed, m=8)
        dev = K.Sample(**{f: (getattr(s, f).cuda()) for f in
                          ("image", "boxes", "labels", "masks", "semantic", "keypoints")},
                       extras={k: v.cuda() for k, v in s.extras.items()})  # fmt: skip
        a = ops(s, torch.Generator().manual_seed(seed))
        b = ops(dev, torch.Generator().manual_seed(seed))
        assert b.image.is_cuda and b.size == a.size
        torch.testing.assert_close(b.boxes.cpu(), a.boxes, atol=1e-4, rtol=0)
        torch.testing.assert_close(b.keypoints.cpu(), a.keypoints, atol=1e-4, rtol=0)
        assert (b.masks.cpu() != a.masks).float().mean() < 0.01
        assert (b.image.cpu().int() - a.image.int()).abs().float().mean() < 1.0


def _on(s: K.Sample, device: str) -> K.Sample:
    """``s`` with every tensor on ``device``."""
    fields = ("image", "boxes", "labels", "masks", "semantic", "keypoints")
    moved = {f: None if getattr(s, f) is None else getattr(s, f).to(device) for f in fields}
    return K.Sample(**moved, extras={k: v.to(device) for k, v in s.extras.items()})


_ZOOM_FILL = {tv_tensors.Image: [1, 2, 3], tv_tensors.Mask: 0, "others": 0}
_AFFINE = dict(degrees=20, translate=(0.1, 0.2), scale=(0.8, 1.2), shear=(-5, 5, -3, 3))
# the CPU tests above, on CUDA: (ours, torchvision's, image_tol, nearest warp, no keypoints)
CUDA_TWINS = {
    "random_resized_crop": (lambda: D.RandomResizedCrop((24, 32)),
                            lambda: v2.RandomResizedCrop((24, 32)), 2, False, False),
    "random_iou_crop": (D.RandomIoUCrop, v2.RandomIoUCrop, 0, False, False),
    "ssd_crop_then_sanitize": (
        lambda: D.Compose([D.RandomIoUCrop(), D.SanitizeBoundingBoxes()]),
        lambda: v2.Compose([v2.RandomIoUCrop(), v2.SanitizeBoundingBoxes()]), 0, False, True),
    "scale_jitter": (lambda: D.ScaleJitter((64, 48)), lambda: v2.ScaleJitter((64, 48)), 2,
                     False, False),
    "zoom_out": (lambda: D.RandomZoomOut(fill=(1, 2, 3), side_range=(1.0, 2.5), semantic_fill=0),
                 lambda: v2.RandomZoomOut(fill=_ZOOM_FILL, side_range=(1.0, 2.5)), 0, False,
                 False),
    "flip": (D.RandomHorizontalFlip, v2.RandomHorizontalFlip, 0, False, False),
    "rotation": (lambda: D.RandomRotation(40, semantic_fill=0),
                 lambda: v2.RandomRotation(40, fill=0), 255, True, False),
    "affine_nearest": (lambda: D.RandomAffine(**_AFFINE, interpolation="nearest", semantic_fill=0),
                       lambda: v2.RandomAffine(**_AFFINE, interpolation=_MODE["nearest"], fill=0), 255,
                       True, False),
    "affine_bilinear": (lambda: D.RandomAffine(**_AFFINE, interpolation="bilinear",
                                               semantic_fill=0),
                        lambda: v2.RandomAffine(**_AFFINE, interpolation=_MODE["bilinear"], fill=0), 1,
                        True, False),
    "resize": (lambda: D.Resize(20, max_size=25), lambda: v2.Resize(20, max_size=25), 2, False,
               False),
}  # fmt: skip


@pytest.mark.cuda
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("name", sorted(CUDA_TWINS))
def test_cuda_ops_are_torchvisions(name: str, seed: int) -> None:
    """The CPU tests' assertions (boxes 1e-4 px, masks identical, keypoints 1e-4, the
    image within the kernels' rounding) with the sample on CUDA, against torchvision's
    v2 on the CPU."""
    ours_op, theirs_op, tol, nearest, no_keypoints = CUDA_TWINS[name]
    s = make_sample(seed)
    if (
        no_keypoints
    ):  # as its CPU test: more boxes, no keypoints (torchvision's sanitize keeps them)
        s = replace(make_sample(seed, m=8), keypoints=None)
    ours, theirs = _both(lambda x, g: ours_op()(_on(x, "cuda"), g), theirs_op(), seed, s)
    assert ours.image.is_cuda and ours.boxes.is_cuda
    ours = _on(ours, "cpu")
    assert_matches(ours, theirs, image_tol=tol)
    if nearest:
        _nearest_close(ours, theirs)
    if name == "ssd_crop_then_sanitize":
        assert torch.equal(ours.labels, theirs["labels"])


def test_every_op_a_refusal_names_exists() -> None:
    from packer.augment.dense_compose import DENSE_OPS

    assert set(D.__all__) >= DENSE_OPS
    assert all(isinstance(getattr(D, name), type) for name in DENSE_OPS)


def test_color_only_runs_a_packer_compose_with_the_generator() -> None:
    s = make_sample(6)
    op = D.ColorOnly(T.Compose([T.ColorJitter(0.3), T.RandomGrayscale(1.0)]))
    out = op(s, torch.Generator().manual_seed(1))
    assert torch.equal(out.image[0], out.image[1]) and torch.equal(out.image[1], out.image[2])
    assert out.boxes is s.boxes and out.masks is s.masks


def test_the_scalar_draws_are_torchvisions_tensor_draws_bit_for_bit() -> None:
    """ScaleJitter, FixedSizeCrop and the flips' coin do torchvision's float32 tensor
    arithmetic on float32 scalars (a handful of tensor ops an image less on the loader's
    thread): over many draws and sizes, the same sizes, offsets and coins as torchvision's
    own make_params and the tensor formulas."""
    import numpy as np

    from packer.augment.dense_batched_plan import _Size

    # torch casts the Python number to float32 in a float32 comparison: so do the coins
    assert bool(torch.tensor([np.float32(0.7)]) >= 0.7)
    jitter, theirs = D.ScaleJitter((1024, 1024)), v2.ScaleJitter((1024, 1024))
    crop = D.FixedSizeCrop((512, 384))
    rng = np.random.default_rng(0)
    for seed in range(600):
        h, w = (int(v) for v in rng.integers(16, 900, 2))
        got = jitter.sample_params(_Size(h, w), torch.Generator().manual_seed(seed))["size"]
        torch.manual_seed(seed)
        want = theirs.make_params([tv_tensors.Image(torch.empty(3, h, w, dtype=torch.uint8))])
        assert got == want["size"], (seed, h, w)
        g, r = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        offsets = crop.sample_params(_Size(h, w), g)
        u = torch.rand(1, generator=r)
        if h > 512 or w > 384:
            assert offsets == {"top": int(max(h - 512, 0) * u), "left": int(max(w - 384, 0) * u)}
        for p in (0.5, 0.7, 1 / 3, 0.123):
            g, r = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
            assert D._coin(p, g) == (not bool(torch.rand(1, generator=r) >= p))


def test_the_lsj_draws_make_one_torch_call_a_draw() -> None:
    """The draws run on the loader's producer thread, image by image: each is one call
    to the generator (``rand`` and its ``item``), no tensor arithmetic."""
    from torch.overrides import TorchFunctionMode

    from packer.augment.dense_batched_plan import _Size

    class Calls(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.names: list[str] = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.names.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    g = torch.Generator().manual_seed(0)
    for op in (D.ScaleJitter((64, 64)), D.FixedSizeCrop(32), D.RandomHorizontalFlip(0.5)):
        with Calls() as calls:
            op.sample_params(_Size(90, 70), g)
        assert calls.names == ["rand", "item"], (type(op).__name__, calls.names)
