"""The dense pass's GPU path makes the host wait at most a fixed number of times per
batch (not per image or per instance), and its outputs are those of the code before
that change (golden digests), counted on the CPU with tests/helpers/sync_count.py."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from pycocotools import mask as cocomask

from helpers import fake_dense
from helpers.sync_count import SyncCounter
from packer.augment import dense as D
from packer.loading.dense_pass import DenseSetup, run_batch

MEAN_FILL = (124, 116, 104)
B = 8


def lsj(size: int = 1024) -> D.Compose:
    """examples/train_detection.py's ``--data-augmentation lsj``."""
    return D.Compose(
        [
            D.ScaleJitter((size, size)),
            D.FixedSizeCrop((size, size), fill=MEAN_FILL),
            D.RandomHorizontalFlip(0.5),
            D.SanitizeBoundingBoxes(),
        ]
    )


def _records(sizes: list[tuple[int, int]], seed: int, m: int = 5) -> fake_dense.FakeColumns:
    """``m`` boxes an image (one tiny, one in a corner), their masks as COCO RLE."""
    rng = np.random.default_rng(seed)
    records = []
    for i, (h, w) in enumerate(sizes):
        x = np.sort(rng.uniform(0, w, (m, 2)), 1)
        y = np.sort(rng.uniform(0, h, (m, 2)), 1)
        x[:, 1] = np.maximum(x[:, 1], x[:, 0] + 2).clip(max=w)
        y[:, 1] = np.maximum(y[:, 1], y[:, 0] + 2).clip(max=h)
        x[0] = (w - 3.0, w - 2.6)  # under a pixel after most scales
        y[1] = (h - 40.0, h)  # at the bottom: FixedSizeCrop drops it where it crops
        boxes = np.stack([x[:, 0], y[:, 0], x[:, 1], y[:, 1]], 1).astype(np.float32)
        rles = []
        for x1, y1, x2, y2 in boxes.tolist():
            mk = np.zeros((h, w), np.uint8, order="F")
            mk[int(y1) : int(np.ceil(y2)), int(x1) : int(np.ceil(x2))] = 1
            rles.append(cocomask.encode(mk)["counts"])
        records.append(
            {
                "image_id": 1000 + i,
                "boxes": boxes,
                "labels": rng.integers(0, 3, m).astype(np.int64),
                "iscrowd": (np.arange(m) == 2).astype(np.uint8),
                "area": ((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])),
                "masks_rle": rles,
                "size": (h, w),
            }
        )
    return fake_dense.FakeColumns(records, True, False, False)


def _batch(seed: int, size: int = 640) -> tuple[list[torch.Tensor], fake_dense.FakeColumns]:
    """B images of COCO's sizes (``size`` the longer side), 5 boxes each."""
    sizes = [(size * 3 // 4 + 7 * i, size) if i % 2 else (size, size * 2 // 3 + 5 * i)
             for i in range(B)]  # fmt: skip
    g = torch.Generator().manual_seed(seed)
    images = [torch.randint(0, 256, (3, h, w), generator=g, dtype=torch.uint8) for h, w in sizes]
    return images, _records(sizes, seed)


def _run(seed: int, masks: bool, targets: str, size: int = 120, count: bool = False):
    """One batch through LSJ at ``size * 8 // 5`` (COCO's 640 to 1024, scaled down so
    the CPU runs it in a fraction of a second)."""
    images, cols = _batch(seed, size)
    setup = DenseSetup(cols, lsj(size * 8 // 5), targets, 32, 0, 255, masks)
    records = cols.read(np.arange(B))
    gen = torch.Generator()
    gen.manual_seed(seed + 11)
    counter = SyncCounter()
    if count:
        SyncCounter.device(images)
        with counter:
            out = run_batch(images, records, setup, gen)
    else:
        out = run_batch(images, records, setup, gen)
    return out, counter


def _digest(out) -> str:
    """sha256 of the targets (every tensor's dtype, shape and bytes) and the images' shape."""
    images, targets = out
    h = hashlib.sha256(repr((images.dtype, tuple(images.shape))).encode())

    def add(t) -> None:
        if isinstance(t, torch.Tensor):
            h.update(repr((t.dtype, tuple(t.shape))).encode())
            h.update(t.contiguous().numpy().tobytes())
        elif isinstance(t, dict):
            for k in sorted(t):
                h.update(k.encode())
                add(t[k])
        elif isinstance(t, list):
            for v in t:
                add(v)
        else:
            h.update(repr(t).encode())

    add(targets)
    return h.hexdigest()[:16]


CASES = [(s, m, t) for s in (0, 1, 2) for m in (True, False) for t in ("padded", "dicts")]

# _digest of _run(*case) by the code before the host syncs were cut (d6c5bc1).
GOLDEN = {
    (0, True, "padded"): "cf8ce5b353d04c32",
    (0, True, "dicts"): "410364245ccb1dcf",
    (0, False, "padded"): "ad974a51b9151671",
    (0, False, "dicts"): "b760899ab6750f90",
    (1, True, "padded"): "1372b3e7984880e2",
    (1, True, "dicts"): "f169eccf4d7d4fc1",
    (1, False, "padded"): "50c5a03c5bb6117f",
    (1, False, "dicts"): "64a8e69485a54169",
    (2, True, "padded"): "d5fc8488263e12f2",
    (2, True, "dicts"): "0e6501fc29963e5e",
    (2, False, "padded"): "bfaa43615886a06d",
    (2, False, "dicts"): "0ec2ed3e370dda20",
}


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_targets_are_those_of_the_code_before(case) -> None:
    assert _digest(_run(*case)[0]) == GOLDEN[case]


def test_the_golden_batches_drop_boxes() -> None:
    """The cases above exercise FixedSizeCrop's and SanitizeBoundingBoxes' selection."""
    (_, targets), _ = _run(0, True, "padded")
    assert 0 < int(targets["counts"].min()) < 5


if __name__ == "__main__":  # prints GOLDEN (from the code before the change)
    for case in CASES:
        print(f"    {case!r}: {_digest(_run(*case)[0])!r},")


# ---------------------------------------------------------------- host waits


def _preset(name: str) -> D.Compose:
    from packer.transforms import ColorJitter

    flip = D.RandomHorizontalFlip(0.5)
    ops = {
        "lsj": lsj(64).ops[:-1],
        "hflip": [flip],
        "ssd": [
            D.ColorOnly(ColorJitter(brightness=0.125, contrast=0.5, saturation=0.5, hue=0.05)),
            D.RandomZoomOut(fill=MEAN_FILL),
            D.RandomIoUCrop(),
            flip,
        ],
        "ssdlite": [D.RandomIoUCrop(), flip],
        "affine": [D.RandomAffine(20, (0.1, 0.1), (0.8, 1.2), 5), D.RandomResizedCrop(32)],
    }[name]
    return D.Compose([*ops, D.SanitizeBoundingBoxes()])


WAIT_CASES = [("lsj", m, t) for m in (True, False) for t in ("padded", "dicts")] + [
    (p, m, "dicts") for p in ("hflip", "ssd", "ssdlite", "affine") for m in (True, False)
]


@pytest.mark.parametrize(
    ("preset", "masks", "targets"),
    WAIT_CASES,
    ids=lambda v: {True: "masks", False: "boxes"}.get(v, v),
)
def test_a_batch_makes_the_host_wait_at_most_twice(preset, masks, targets) -> None:
    """The dense pass on a GPU: boxes, labels and extras stay on the host until the batch
    is collated, so dropping boxes (FixedSizeCrop, SanitizeBoundingBoxes, IoU crops)
    and flipping them make the host wait for nothing (before: 8-10 waits an image)."""
    images, cols = _batch(3, size=40)
    setup = DenseSetup(cols, _preset(preset), targets, 32, 0, 255, masks)
    gen = torch.Generator()
    gen.manual_seed(4)
    SyncCounter.device(images)
    with SyncCounter() as counter:
        run_batch(images, cols.read(np.arange(B)), setup, gen)
    assert counter.syncs <= 2, dict(counter.where)
    assert counter.ops > 0  # the counter saw the device work


def test_lsj_launches_a_bounded_number_of_device_ops_an_image() -> None:
    """Per image (views and the CPU twin of the image resize included): a few dozen ops,
    not the ~85 of before; instance masks cost a fixed number, not a number per mask."""
    counts = {}
    for masks in (True, False):
        _, counter = _run(0, masks, "padded", count=True)
        counts[masks] = counter.ops / B
    assert counts[False] <= 20, counts  # before: 82
    assert counts[True] <= 40, counts  # before: 87


def _all_on_device(s):
    SyncCounter.device(s.image, s.boxes, s.labels, s.masks, s.semantic, s.keypoints, s.extras)
    return s


@pytest.mark.parametrize("preset", ["lsj", "ssdlite", "affine"])
def test_ops_on_a_device_sample_wait_once_a_selection(preset) -> None:
    """A Sample wholly on the GPU (the ops' own API): dropping boxes costs one wait (the
    count kept), not one per field; a flip none (before: 7-10 waits an image)."""
    from augment.dense_checks import make_sample

    op = _preset(preset)
    selections = sum(isinstance(o, (D.FixedSizeCrop, D.SanitizeBoundingBoxes)) for o in op.ops)
    for seed in range(4):
        s = _all_on_device(make_sample(seed, h=30, w=40))
        with SyncCounter() as counter:
            op(s, torch.Generator().manual_seed(seed))
        reads = isinstance(op.ops[0], D.RandomIoUCrop)  # it reads the boxes to draw
        assert counter.syncs <= selections + reads, dict(counter.where)


def test_host_targets_sit_beside_device_pixels() -> None:
    """Boxes, labels, keypoints and extras may stay on the CPU beside an image elsewhere;
    masks and semantic masks may not."""
    from packer.augment.dense_sample import ArgumentError, Sample

    img = torch.zeros(3, 4, 5, dtype=torch.uint8, device="meta")
    Sample(
        img,
        boxes=torch.zeros(2, 4),
        labels=torch.zeros(2, dtype=torch.int64),
        keypoints=torch.zeros(2, 3, 3),
        masks=torch.zeros(2, 4, 5, dtype=torch.uint8, device="meta"),
        extras={"iscrowd": torch.zeros(2, dtype=torch.int64)},
    )
    with pytest.raises(ArgumentError, match=r"masks is on cpu, the image on meta"):
        Sample(img, masks=torch.zeros(2, 4, 5, dtype=torch.uint8))
    with pytest.raises(ArgumentError, match=r"semantic is on cpu, the image on meta"):
        Sample(img, semantic=torch.zeros(4, 5, dtype=torch.uint8))


def test_host_targets_move_in_one_copy_a_dtype() -> None:
    from packer.augment.dense_batch import collate_padded, on_device
    from packer.augment.dense_sample import Sample

    dev = torch.device("meta")
    samples = [
        Sample(
            torch.zeros(3, 4, 5, dtype=torch.uint8, device=dev),
            boxes=torch.rand(m, 4),
            labels=torch.arange(m),
            extras={"iscrowd": torch.zeros(m, dtype=torch.int64), "area": torch.rand(m)},
        )
        for m in (2, 0, 3)
    ]
    with SyncCounter() as counter:
        moved = on_device(samples, dev)
    assert counter.uploads == 2  # float32, int64
    for s, m in zip(moved, (2, 0, 3)):
        assert s.boxes.device == dev and s.boxes.shape == (m, 4)
        assert s.labels.device == dev and s.extras["area"].shape == (m,)
    out = collate_padded(samples)
    shapes = ("image_sizes", "counts")  # on the host: cutting by them waits for nothing
    assert {str(t.device) for k, t in out.items() if k not in shapes} == {"meta"}
    assert {str(out[k].device) for k in shapes} == {"cpu"}
    assert out["boxes"].shape == (3, 3, 4)


# ---------------------------------------------------------------- masks decoded on the device


def test_masks_decoded_on_the_device_equal_pycocotools() -> None:
    """Run lengths expanded by the device (one copy, one repeat_interleave a batch)
    give pycocotools' masks: an image without instances, one without masks read, a
    mask full, one empty, one starting with a 1."""
    from packer.loading.dense_pass import _pixels, upload_pixels
    from packer.pack.dense import decode_masks, encode_masks

    rng = np.random.default_rng(0)
    frames = [(7, 5), (4, 9), (6, 6)]
    masks = [
        (rng.random((3, 7, 5)) > 0.5).astype(np.uint8),
        np.zeros((0, 4, 9), np.uint8),
        np.stack([np.ones((6, 6)), np.zeros((6, 6)), np.eye(6)]).astype(np.uint8),
    ]
    records = [{"masks_rle": encode_masks(m), "size": f} for m, f in zip(masks, frames)]
    records.insert(1, {})
    setup = DenseSetup(fake_dense.FakeColumns([], True, False, False), None, "dicts", 32, 0, 255)
    got = upload_pixels([_pixels(r, setup) for r in records], torch.device("cpu"))
    assert got[1] is None
    got = got[:1] + got[2:]
    for g, m, r in zip(got, masks, records[:1] + records[2:]):
        assert g.dtype == torch.uint8 and g.shape == m.shape
        assert np.array_equal(g.numpy(), m)
        assert np.array_equal(g.numpy(), decode_masks(r["masks_rle"], r["size"]))


def test_a_damaged_mask_is_refused_before_the_device_decodes_it() -> None:
    from packer.errors import PackFormatError
    from packer.loading.dense_pass import _pixels
    from packer.pack.dense import encode_masks

    good = encode_masks(np.ones((1, 3, 3), np.uint8))[0]
    setup = DenseSetup(fake_dense.FakeColumns([], True, False, False), None, "dicts", 32, 0, 255)
    for bad, why in ((b"8", "of 8 pixels"), (b"\xff", "character")):
        rec = {"masks_rle": [good, bad], "size": (3, 3)}
        with pytest.raises(PackFormatError, match=f"instance mask 1: .*{why}.*damaged"):
            _pixels(rec, setup)
