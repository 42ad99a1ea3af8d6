"""packer.augment.dense_kernels against torchvision.transforms.v2.functional on tv_tensors
with the same explicit parameters: boxes within 1e-4 px, masks (instance and semantic)
identical, keypoints within 1e-4, images as the image kernels give (exact for slicing,
padding and nearest warps; bilinear/bicubic resizes within the resize's 1-2 levels)."""

from __future__ import annotations

import pytest
import torch
from dense_checks import assert_matches, make_sample, tv_call
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from torchvision import tv_tensors
from torchvision.transforms.v2 import functional as F

from packer.augment import dense_kernels as K
from packer.imaging.resize import ArgumentError

# no shrinking: a failure prints its example at once (shrinking these takes minutes)
SWEEP = settings(max_examples=12, deadline=None, derandomize=True, phases=[Phase.generate])
seeds = st.integers(0, 10_000)


@SWEEP
@given(seeds)
def test_horizontal_flip_matches_torchvision(seed: int) -> None:
    s = make_sample(seed)
    assert_matches(K.horizontal_flip(s), tv_call("horizontal_flip", s))


@SWEEP
@given(seeds, st.integers(-8, 30), st.integers(-8, 40), st.integers(1, 45), st.integers(1, 60))
def test_crop_matches_torchvision(seed, top, left, height, width) -> None:
    s = make_sample(seed)
    ours = K.crop(s, top, left, height, width)
    assert_matches(ours, tv_call("crop", s, top=top, left=left, height=height, width=width))


@SWEEP
@given(
    seeds,
    st.lists(st.integers(0, 12), min_size=4, max_size=4),
    st.one_of(st.integers(0, 255), st.tuples(*[st.integers(0, 255)] * 3)),
)
def test_pad_matches_torchvision(seed, padding, fill) -> None:
    s = make_sample(seed)
    left, top, right, bottom = padding
    ours = K.pad(s, left, top, right, bottom, fill=fill, mask_fill=0, semantic_fill=0)
    theirs = tv_call(
        "pad", s, padding=padding, fill=list(fill) if isinstance(fill, tuple) else fill
    )
    assert_matches(ours, theirs)


@SWEEP
@given(
    seeds,
    st.integers(5, 90),
    st.integers(5, 90),
    st.sampled_from(["bilinear", "nearest", "bicubic", "nearest-exact"]),
)
def test_resize_matches_torchvision(seed, nh, nw, mode) -> None:
    s = make_sample(seed)
    ours = K.resize(s, (nh, nw), interpolation=mode)
    theirs = tv_call("resize", s, size=[nh, nw], interpolation=mode)
    assert_matches(ours, theirs, image_tol=0 if mode.startswith("nearest") else 2)


@pytest.mark.parametrize("size,max_size", [(20, None), ([30], None), (24, 40), (60, 70)])
def test_resize_shorter_side_matches_torchvision(size, max_size) -> None:
    s = make_sample(3)
    ours = K.resize(s, size, max_size=max_size)
    theirs = tv_call("resize", s, size=size, max_size=max_size)
    assert_matches(ours, theirs, image_tol=2)


@SWEEP
@given(seeds, st.integers(0, 20), st.integers(0, 30), st.integers(5, 60), st.integers(8, 40))
def test_resized_crop_matches_torchvision(seed, top, left, out_h, out_w) -> None:
    s = make_sample(seed)
    height, width = 37 - top, 53 - left - (left % 3)
    ours = K.resized_crop(s, top, left, height, width, (out_h, out_w))
    theirs = tv_call(
        "resized_crop", s, top=top, left=left, height=height, width=width, size=[out_h, out_w]
    )
    assert_matches(ours, theirs, image_tol=2)


@SWEEP
@given(
    seeds,
    st.floats(-180, 180),
    st.tuples(st.integers(-10, 10), st.integers(-10, 10)),
    st.floats(0.5, 1.6),
    st.tuples(st.floats(-25, 25), st.floats(-25, 25)),
    st.sampled_from(["nearest", "bilinear"]),
    st.one_of(st.none(), st.tuples(st.floats(0, 53), st.floats(0, 37))),
)
def test_affine_matches_torchvision(seed, angle, translate, scale, shear, mode, center) -> None:
    s = make_sample(seed)
    fill = 0
    ours = K.affine(s, angle, translate, scale, shear, mode, fill=fill, center=center,
                    mask_fill=0, semantic_fill=0)  # fmt: skip
    theirs = tv_call(
        "affine",
        s,
        mask_kw={"masks": {"fill": 0}, "semantic": {"fill": 0}},
        angle=angle,
        translate=list(translate),
        scale=scale,
        shear=list(shear),
        interpolation=mode,
        fill=fill,
        center=None if center is None else list(center),
    )
    # the image: packer.augment.warps.affine, torchvision's grid; a nearest sample exactly
    # halfway between two pixels may take the other one (its documented difference)
    assert_matches(ours, theirs, image_tol=255 if mode == "nearest" else 1)
    differ = (ours.image != theirs["image"].as_subclass(torch.Tensor)).float().mean()
    assert differ < 0.01


@SWEEP
@given(seeds, st.floats(-360, 360), st.booleans())
def test_rotate_matches_torchvision(seed, angle, square) -> None:
    s = make_sample(seed, h=40 if square else 37, w=40 if square else 53)
    ours = K.rotate(s, angle, "nearest", fill=None, mask_fill=None, semantic_fill=None)
    assert_matches(ours, tv_call("rotate", s, angle=angle), image_tol=255)
    differ = (ours.image != tv_call("rotate", s, angle=angle)["image"]).float().mean()
    assert differ < 0.01


@pytest.mark.parametrize("angle", [0, 90, 180, 270, -90, 450])
@pytest.mark.parametrize("square", [True, False])
def test_rotate_right_angles_are_exact(angle, square) -> None:
    s = make_sample(7, h=40 if square else 37, w=40 if square else 53)
    ours = K.rotate(s, angle, fill=None, mask_fill=None, semantic_fill=None)
    assert_matches(ours, tv_call("rotate", s, angle=angle), image_tol=0)


@SWEEP
@given(seeds, st.floats(1.0, 6.0), st.floats(1.0, 30.0))
def test_sanitize_matches_torchvision(seed, min_size, min_area) -> None:
    from torchvision.transforms import v2

    s = make_sample(seed, m=8)
    # some degenerate boxes: zero width, outside the canvas
    boxes = s.boxes.clone()
    boxes[0, 2] = boxes[0, 0]
    boxes[1] = torch.tensor([50.0, 30.0, 60.0, 36.0])
    s = K.Sample(s.image, boxes, s.labels, s.masks, s.semantic, s.keypoints, s.extras)
    ours = K.sanitize(s, min_size, min_area)
    t = tv_call("crop", s, top=0, left=0, height=37, width=53)  # tv_tensors of the same fields
    t["boxes"] = t["boxes"].__class__(boxes, format="XYXY", canvas_size=(37, 53))
    t["keypoints"] = tv_call("crop", s, top=0, left=0, height=37, width=53)["keypoints"]
    theirs = v2.SanitizeBoundingBoxes(min_size=min_size, min_area=min_area)(t)
    # torchvision keeps KeyPoints apart from boxes; here they are the instances' own
    keep = torch.isin(torch.arange(8), torch.nonzero(K.sanitize_mask(s, min_size, min_area))[:, 0])
    assert torch.equal(theirs["labels"], s.labels[keep])
    theirs["keypoints"] = t["keypoints"][keep]
    assert ours.count == len(theirs["labels"])
    assert torch.equal(ours.labels, theirs["labels"])
    assert ours.extras["iscrowd"].shape[0] == ours.count
    assert_matches(ours, theirs)


def test_fixed_size_crop_is_crop_drop_then_pad() -> None:
    s = make_sample(11, m=6)
    ours = K.fixed_size_crop(s, 5, 0, 30, 64, fill=(1, 2, 3), semantic_fill=0)
    assert ours.size == (30, 64)
    cropped = K.crop(s, 5, 0, 30, 53)
    keep = (cropped.boxes[:, 0] < cropped.boxes[:, 2]) & (cropped.boxes[:, 1] < cropped.boxes[:, 3])
    theirs = tv_call("crop", s, top=5, left=0, height=30, width=53)
    theirs = {
        k: tv_tensors.wrap(v[keep], like=v) if k in ("boxes", "masks", "keypoints") else v
        for k, v in theirs.items()
    }
    theirs["labels"] = s.labels[keep]
    padded = {
        k: F.pad(v, padding=[0, 0, 11, 0], **({"fill": [1, 2, 3]} if k == "image" else {}))
        for k, v in theirs.items()
        if k != "labels"
    }
    assert_matches(ours, padded)
    assert torch.equal(ours.labels, theirs["labels"])
    assert ours.image[:, :, 53:].flatten(1).unique(dim=1).tolist() == [[1], [2], [3]]


def test_fixed_size_crop_refuses_an_offset_past_the_image() -> None:
    s = make_sample(11)
    with pytest.raises(ArgumentError, match=r"fixed_size_crop: left 7 leaves the 37x53 image"):
        K.fixed_size_crop(s, 5, 7, 30, 64)


def test_sanitize_refuses_sizes_below_one_as_torchvision() -> None:
    with pytest.raises(ArgumentError, match=r"sanitize: min_size must be >= 1, not 0.5"):
        K.sanitize(make_sample(0), min_size=0.5)


@pytest.mark.parametrize(
    "hw,want", [((37, 53), (64, 64)), ((64, 96), (64, 96)), ((1, 33), (32, 64))]
)
def test_pad_to_multiple(hw, want) -> None:
    s = make_sample(1, h=hw[0], w=hw[1], m=2)
    out = K.pad_to_multiple(s, 32, fill=9)
    assert out.size == want
    assert torch.equal(out.image[:, : hw[0], : hw[1]], s.image)
    assert torch.equal(out.boxes, s.boxes)
    assert (out.semantic[hw[0] :] == 255).all()  # the ignore value


def test_flip_swaps_keypoint_pairs_per_category() -> None:
    s = make_sample(5, m=3, k=4)
    labels = torch.tensor([1, 2, 7])
    s = K.Sample(s.image, s.boxes, labels, s.masks, None, s.keypoints, {})
    out = K.horizontal_flip(s, flip_map={1: [(0, 1), (2, 3)], 2: [3, 2, 1, 0]})
    x = (s.size[1] - 1) - s.keypoints[..., 0]
    assert torch.allclose(out.keypoints[0, :, 0], x[0, [1, 0, 3, 2]])
    assert torch.allclose(out.keypoints[1, :, 0], x[1, [3, 2, 1, 0]])
    assert torch.allclose(out.keypoints[2, :, 0], x[2])  # category 7: not in the map
    every = K.horizontal_flip(s, flip_map=[(0, 3)])
    assert torch.allclose(every.keypoints[:, :, 0], x[:, [3, 1, 2, 0]])
    with pytest.raises(ArgumentError, match=r"flip_map\[1\] must be a permutation of 0..3"):
        K.horizontal_flip(s, flip_map={1: [0, 0, 1, 2]})


def test_points_moved_outside_lose_visibility() -> None:
    s = make_sample(2, m=4, k=3)
    out = K.crop(s, 10, 10, 10, 10)
    x, y, v = out.keypoints.unbind(-1)
    outside = (x < 0) | (x >= 10) | (y < 0) | (y >= 10)
    assert outside.any() and (~outside).any()
    assert torch.equal(v == 0, outside)
    assert torch.allclose(out.keypoints[..., :2], s.keypoints[..., :2] - 10)  # never clamped


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("image", torch.zeros(3, 4, 4), r"image must be a uint8 tensor \[C, H, W\]"),
        ("boxes", torch.zeros(2, 4, dtype=torch.float64), r"boxes must be a float32"),
        (
            "masks",
            torch.zeros(5, 3, 3, dtype=torch.uint8),
            r"masks must be a uint8 tensor \[M, 37, 53\]",
        ),
        ("labels", torch.zeros(4, dtype=torch.int64), r"disagree on M"),
        ("keypoints", torch.zeros(5, 2, 2), r"keypoints must be a float32 tensor \[M, K, 3\]"),
    ],
)
def test_bad_fields_are_refused_naming_them(field, value, match) -> None:
    s = make_sample(0)
    kw = dict(image=s.image, boxes=s.boxes, labels=s.labels, masks=s.masks, keypoints=s.keypoints)
    kw[field] = value
    with pytest.raises(ArgumentError, match=match):
        K.Sample(**kw)


def test_empty_targets_pass_through_every_kernel() -> None:
    s = make_sample(4, m=0)
    for out in (
        K.horizontal_flip(s, flip_map=[1, 0, 3, 2]),
        K.crop(s, 2, 2, 20, 20),
        K.resize(s, (20, 30)),
        K.affine(s, 30, (2, 3), 1.1, (5, 0)),
        K.rotate(s, 33),
        K.pad(s, 1, 2, 3, 4),
        K.sanitize(s),
        K.fixed_size_crop(s, 0, 0, 20, 70),
    ):
        assert out.count == 0 and out.masks.shape[1:] == out.image.shape[1:]
