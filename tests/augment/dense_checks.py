"""Shared by tests/augment/test_dense*.py: random samples, and torchvision v2's functional
on the same fields as tv_tensors (BoundingBoxes, Mask, KeyPoints) for comparison."""

from __future__ import annotations

import torch
from torchvision import tv_tensors
from torchvision.transforms.v2 import functional as F

from packer.augment.dense_kernels import Sample


def make_sample(
    seed: int, h: int = 37, w: int = 53, m: int = 5, k: int = 4, semantic: bool = True
) -> Sample:
    """A textured image, ``m`` boxes inside it (some tiny), blocky instance masks, a
    semantic mask of 4 classes and ``k`` visible keypoints per instance."""
    g = torch.Generator().manual_seed(seed)
    image = torch.randint(0, 256, (3, h, w), generator=g, dtype=torch.uint8)
    # smooth a little so bilinear paths see photo-like content
    image = ((image.float() + image.float().roll(1, -1) + image.float().roll(1, -2)) / 3).to(
        torch.uint8
    )
    x = torch.rand(m, 2, generator=g) * (w - 1)
    y = torch.rand(m, 2, generator=g) * (h - 1)
    boxes = torch.stack([x.min(1).values, y.min(1).values, x.max(1).values, y.max(1).values], 1)
    labels = torch.randint(1, 4, (m,), generator=g)
    masks = torch.zeros(m, h, w, dtype=torch.uint8)
    for i, (x1, y1, x2, y2) in enumerate(boxes.tolist()):
        masks[i, int(y1) : int(y2) + 1, int(x1) : int(x2) + 1] = 1
    sem = torch.randint(0, 4, (h // 4 + 1, w // 4 + 1), generator=g, dtype=torch.uint8)
    sem = sem.repeat_interleave(4, 0).repeat_interleave(4, 1)[:h, :w].contiguous()
    kp = torch.empty(m, k, 3)
    kp[..., 0] = torch.rand(m, k, generator=g) * (w - 1)
    kp[..., 1] = torch.rand(m, k, generator=g) * (h - 1)
    kp[..., 2] = 2.0
    return Sample(
        image=image,
        boxes=boxes.float(),
        labels=labels,
        masks=masks,
        semantic=sem if semantic else None,
        keypoints=kp,
        extras={"iscrowd": torch.zeros(m, dtype=torch.int64)},
    )


def as_tv(s: Sample) -> dict:
    h, w = s.size
    out = {
        "image": tv_tensors.Image(s.image),
        "boxes": tv_tensors.BoundingBoxes(s.boxes, format="XYXY", canvas_size=(h, w)),
        "labels": s.labels,
        "masks": tv_tensors.Mask(s.masks),
    }
    if s.keypoints is not None:
        out["keypoints"] = tv_tensors.KeyPoints(s.keypoints[..., :2].clone(), canvas_size=(h, w))
    if s.semantic is not None:
        out["semantic"] = tv_tensors.Mask(s.semantic)
    return out


def tv_call(fn_name: str, s: Sample, mask_kw: dict | None = None, **kw) -> dict:
    """torchvision's ``F.<fn_name>`` on every field of ``s`` (masks with ``mask_kw``
    in place of the image-only keywords)."""
    fn = getattr(F, fn_name)
    t = as_tv(s)
    image_only = {"fill"}  # masks: mask_kw; the other kernels take and ignore the rest
    out = {}
    for key, v in t.items():
        if key == "labels":
            out[key] = v
            continue
        args = dict(kw)
        if key != "image":
            for name in image_only:
                args.pop(name, None)
            if key in ("masks", "semantic") and mask_kw:
                args.update(mask_kw.get(key, {}))
        out[key] = fn(v, **args)
    return out


def assert_matches(ours: Sample, theirs: dict, image_tol: int = 0) -> None:
    """Boxes within 1e-4 px, masks identical, keypoints within 1e-4, the image within
    ``image_tol`` levels (the image kernels' documented rounding), same sizes."""
    assert ours.size == tuple(theirs["image"].shape[-2:])
    assert ours.image.shape == theirs["image"].shape
    diff = (ours.image.int() - theirs["image"].as_subclass(torch.Tensor).int()).abs()
    assert int(diff.max()) <= image_tol if diff.numel() else True, int(diff.max())
    torch.testing.assert_close(
        ours.boxes, theirs["boxes"].as_subclass(torch.Tensor), atol=1e-4, rtol=0
    )
    assert torch.equal(ours.masks, theirs["masks"].as_subclass(torch.Tensor))
    if "semantic" in theirs:
        assert torch.equal(ours.semantic, theirs["semantic"].as_subclass(torch.Tensor))
    if ours.keypoints is not None:
        got = theirs["keypoints"].as_subclass(torch.Tensor)
        torch.testing.assert_close(ours.keypoints[..., :2], got, atol=1e-4, rtol=0)
