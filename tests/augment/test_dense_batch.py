"""packer.augment.dense_batch: per-image target dicts that torchvision's detection models
train on, and the padded batch with counts (targets="padded")."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from dense_checks import make_sample

from packer.augment import dense as D
from packer.augment.dense_batch import area, collate_padded, detection_targets
from packer.imaging.resize import ArgumentError


def _batch(seed: int = 0):
    ops = D.Compose([D.RandomIoUCrop(), D.RandomHorizontalFlip(), D.SanitizeBoundingBoxes()])
    g = torch.Generator().manual_seed(seed)
    return [ops(make_sample(i, h=40 + 3 * i, w=50 - 2 * i, m=2 + i), g) for i in range(4)]


def test_detection_targets_have_torchvisions_fields() -> None:
    samples = _batch()
    images, targets = detection_targets(samples, image_ids=[10, 11, 12, 13])
    assert [tuple(i.shape[1:]) for i in images] == [s.size for s in samples]
    for s, t in zip(samples, targets):
        assert set(t) == {"boxes", "labels", "masks", "keypoints", "image_id", "area", "iscrowd"}
        m = s.count
        assert t["boxes"].dtype == torch.float32 and t["boxes"].shape == (m, 4)
        assert t["labels"].dtype == torch.int64 and t["labels"].shape == (m,)
        assert t["masks"].shape == (m, *s.size) and t["keypoints"].shape[:1] == (m,)
        assert t["iscrowd"].dtype == torch.int64 and t["area"].dtype == torch.float32
        assert torch.equal(t["area"], s.masks.flatten(1).sum(1).float())
    assert [t["image_id"] for t in targets] == [10, 11, 12, 13]


def test_area_of_boxes_without_masks() -> None:
    s = replace(make_sample(1, m=3), masks=None)
    b = s.boxes
    assert torch.allclose(area(s), (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1]))


def _tiny_backbone() -> torch.nn.Module:
    backbone = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=4, padding=1), torch.nn.ReLU())
    backbone.out_channels = 8
    return backbone


@pytest.mark.parametrize("model_name", ["MaskRCNN", "KeypointRCNN"])
def test_torchvision_detection_models_train_on_them(model_name: str) -> None:
    from torchvision.models import detection
    from torchvision.models.detection.anchor_utils import AnchorGenerator
    from torchvision.ops import MultiScaleRoIAlign

    torch.manual_seed(0)
    anchors = AnchorGenerator(((8, 16, 32),), ((0.5, 1.0, 2.0),))
    kw = dict(rpn_anchor_generator=anchors, min_size=48, max_size=64)
    kw["box_roi_pool"] = MultiScaleRoIAlign(["0"], 7, 2)
    if model_name == "MaskRCNN":
        kw["mask_roi_pool"] = MultiScaleRoIAlign(["0"], 14, 2)
        model = detection.MaskRCNN(_tiny_backbone(), num_classes=4, **kw)
    else:
        kw["keypoint_roi_pool"] = MultiScaleRoIAlign(["0"], 14, 2)
        kw["keypoint_head"] = detection.keypoint_rcnn.KeypointRCNNHeads(8, [16])
        kw["keypoint_predictor"] = detection.keypoint_rcnn.KeypointRCNNPredictor(16, 4)
        model = detection.KeypointRCNN(_tiny_backbone(), num_classes=4, **kw)
    model.train()
    images, targets = detection_targets(_batch()[:2])
    losses = model([i.float() / 255 for i in images], targets)
    head = "loss_mask" if model_name == "MaskRCNN" else "loss_keypoint"
    assert {"loss_classifier", "loss_box_reg", head} <= set(losses)
    assert all(torch.isfinite(v) for v in losses.values())


def test_collate_padded_pads_to_the_most_instances_with_counts() -> None:
    samples = _batch(1)
    out = collate_padded(samples, size_divisible=32)
    b, n = len(samples), max(s.count for s in samples)
    hmax = max(s.size[0] for s in samples)
    wmax = max(s.size[1] for s in samples)
    H, W = -(-hmax // 32) * 32, -(-wmax // 32) * 32
    assert out["images"].shape == (b, 3, H, W)
    assert out["image_sizes"].tolist() == [list(s.size) for s in samples]
    assert out["counts"].tolist() == [s.count for s in samples]
    assert out["boxes"].shape == (b, n, 4) and out["labels"].shape == (b, n)
    assert out["masks"].shape == (b, n, H, W) and out["semantic"].shape == (b, H, W)
    assert out["keypoints"].shape == (b, n, 4, 3) and out["iscrowd"].shape == (b, n)
    for i, s in enumerate(samples):
        c = s.count
        h, w = s.size
        assert out["valid"][i].tolist() == [True] * c + [False] * (n - c)
        assert torch.equal(out["boxes"][i, :c], s.boxes) and not out["boxes"][i, c:].any()
        assert torch.equal(out["labels"][i, :c], s.labels) and (out["labels"][i, c:] == -1).all()
        assert torch.equal(out["images"][i, :, :h, :w], s.image)
        assert not out["images"][i, :, h:].any() and not out["images"][i, :, :, w:].any()
        assert torch.equal(out["semantic"][i, :h, :w], s.semantic)
        assert (out["semantic"][i, h:] == 255).all() and (out["semantic"][i, :, w:] == 255).all()
        assert torch.equal(out["masks"][i, :c, :h, :w], s.masks) and not out["masks"][i, c:].any()


def test_collate_padded_semantic_only() -> None:
    samples = [D.Sample(make_sample(i).image, semantic=make_sample(i).semantic) for i in range(3)]
    out = collate_padded(samples)
    assert set(out) == {"images", "image_sizes", "semantic"}
    assert out["semantic"].shape == (3, 37, 53) and out["semantic"].dtype == torch.uint8


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: collate_padded([]), r"collate_padded: takes a non-empty list"),
        (lambda: collate_padded(_batch(), size_divisible=0), r"size_divisible must be a positive"),
        (lambda: detection_targets(_batch(), image_ids=[1]), r"1 image_ids for 4 samples"),
        (
            lambda: collate_padded([make_sample(0), D.Sample(make_sample(1).image)]),
            r"some samples have instances and some none",
        ),
    ],
)
def test_bad_batches_are_refused(call, match) -> None:
    with pytest.raises(ArgumentError, match=match):
        call()


def test_collate_padded_keeps_the_shapes_on_the_host() -> None:
    # pixels on another device ("meta" stands for the GPU on a CPU-only machine), the
    # host targets on the CPU, as the dense pass leaves them
    meta = ("image", "masks", "semantic")
    samples = [replace(s, **{k: getattr(s, k).to("meta") for k in meta}) for s in _batch(1)]
    out = collate_padded(samples, size_divisible=32)
    assert out["image_sizes"].device.type == "cpu" and out["counts"].device.type == "cpu"
    assert out["counts"].tolist() == [s.count for s in samples]
    moved = {k: v.device.type for k, v in out.items() if k not in ("image_sizes", "counts")}
    assert set(moved.values()) == {"meta"}, moved
    assert {"images", "boxes", "labels", "valid", "masks", "keypoints"} <= set(moved)
