"""The dense pass's batched path (packer.loading.dense_batched over
packer.augment.dense_batched) gives what the per-image path gives on the same seeds:
boxes, labels, keypoints and the other targets the same, masks identical, images within
one level; and it costs a number of device ops that does not grow with the batch, and
no host wait."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from helpers import fake_dense
from helpers.dense_batches import assert_same
from helpers.sync_count import SyncCounter
from packer.augment import dense as D
from packer.augment.dense_batched import batched_ops
from packer.imaging.resize import ArgumentError
from packer.loading.dense_batched import run_batched
from packer.loading.dense_pass import DenseSetup, _pixels, run_batch
from packer.loading.dense_producer import run_batches
from packer.transforms import ColorJitter

MEAN = (124, 116, 104)


def _recipes() -> dict[str, D.Compose]:
    flip = D.RandomHorizontalFlip(0.5)
    lsj = [D.ScaleJitter((48, 48)), D.FixedSizeCrop((48, 48), fill=MEAN), flip]
    lsj_up = [D.ScaleJitter((96, 96), (0.9, 2.0)), D.FixedSizeCrop((96, 96), fill=MEAN), flip]
    rrc = [D.RandomResizedCrop(28, scale=(0.2, 1.0)), flip, D.SanitizeBoundingBoxes(min_size=2)]
    zoom = [D.RandomZoomOut(fill=MEAN, side_range=(1.0, 2.0), p=0.7)]
    zoom += [D.FixedSizeCrop((50, 50), fill=MEAN), flip]
    pad = [D.ScaleJitter((40, 40), antialias=False), D.Pad((1, 2, 3, 4), fill=9)]
    pad += [D.PadTo((100, 100), fill=9), flip, D.SanitizeBoundingBoxes()]
    return {
        "lsj": D.Compose([*lsj, D.SanitizeBoundingBoxes()]),
        "lsj-up": D.Compose(lsj_up),
        "hflip": D.Compose([flip, D.SanitizeBoundingBoxes()]),
        "resize": D.Compose([D.Resize(24, max_size=40), flip, D.PadToMultiple(16, fill=3)]),
        "rrc": D.Compose(rrc),
        "rrc-nearest": D.Compose([D.RandomResizedCrop((20, 30), interpolation="nearest"), flip]),
        "zoom": D.Compose(zoom),
        "pad": D.Compose(pad),
        "flip-only": flip,
        "flip-lsj": D.Compose([D.RandomHorizontalFlip(0.5), *lsj, D.SanitizeBoundingBoxes()]),
        "flips-rrc": D.Compose([flip, flip, D.RandomResizedCrop(28, scale=(0.2, 1.0))]),
        "flip-nearest": D.Compose([flip, D.RandomResize(20, 60, interpolation="nearest"), flip]),
        "zoom-fills": D.Compose(
            [D.RandomZoomOut(5, (1.0, 1.5), 1.0, mask_fill=1, semantic_fill=7), flip]
        ),  # masks and semantic masks padded with their own values
    }


SIZES = [(37, 53), (30, 30), (61, 44), (25, 70), (40, 41), (52, 39)]


def _inputs(sizes, seed: int, **kw):
    cols = fake_dense.make_columns(sizes, seed=seed, **kw)
    g = torch.Generator().manual_seed(seed)
    images = [torch.randint(0, 256, (3, h, w), generator=g, dtype=torch.uint8) for h, w in sizes]
    return images, cols


def _both(op, sizes, seed, targets="dicts", masks=True, semantic=False, keypoints=True):
    images, cols = _inputs(sizes, seed, keypoints=keypoints, semantic=semantic)
    setup = DenseSetup(cols, op, targets, 32, 0, 255, masks)
    records = cols.read(np.arange(len(sizes)))
    out = []
    for batched in (True, False):
        gen = torch.Generator().manual_seed(seed + 100)
        out.append(run_batch(images, records, setup, gen, batched=batched))
    plan = batched_ops(op)
    if plan is not None:  # the batched path ran (it may decline a batch)
        items = [_pixels(r, setup) for r in records]
        gen = torch.Generator().manual_seed(seed + 100)
        direct = run_batched(images, records, items, setup, gen, plan)
        assert direct is not None
        assert torch.equal(direct[0], out[0][0])
    return out


def _same_images(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype == torch.uint8
    diff = (a.int() - b.int()).abs()
    assert int(diff.max()) <= 1, int(diff.max())  # the rounding of one product at most
    assert float((diff > 0).float().mean()) < 0.01


def _same_targets(a, b) -> None:
    if isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b)
        for x, y in zip(a, b):
            _same_targets(x, y)
        return
    if isinstance(a, dict):
        assert set(a) == set(b), (sorted(a), sorted(b))
        for k in a:
            _same_targets(a[k], b[k])
        return
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
        if a.is_floating_point():
            torch.testing.assert_close(a, b, atol=1e-4, rtol=0)
        assert torch.equal(a, b)  # the per-image kernels' float operations: the same bits
        return
    assert a == b


@pytest.mark.parametrize("name", list(_recipes()))
@pytest.mark.parametrize("targets", ["dicts", "padded"])
def test_batched_is_the_per_image_path(name: str, targets: str) -> None:
    op = _recipes()[name]
    assert batched_ops(op) is not None
    for seed in range(3):
        (bi, bt), (pi, pt) = _both(op, SIZES, seed, targets)
        _same_images(bi, pi)
        _same_targets(bt, pt)


def test_batched_without_masks_and_without_keypoints() -> None:
    op = _recipes()["lsj"]
    for masks, keypoints in ((False, True), (True, False), (False, False)):
        (bi, bt), (pi, pt) = _both(op, SIZES, 5, masks=masks, keypoints=keypoints)
        _same_images(bi, pi)
        _same_targets(bt, pt)
        assert ("masks" in bt[0]) is masks and ("keypoints" in bt[0]) is keypoints


@pytest.mark.parametrize("name", ["lsj", "hflip", "zoom", "resize", "zoom-fills", "flip-lsj"])
def test_batched_semantic_masks_are_the_per_image_path(name: str) -> None:
    ops = [o for o in _recipes()[name].ops if not isinstance(o, D.SanitizeBoundingBoxes)]
    op = D.Compose(ops)
    for seed in range(3):
        (bi, bs), (pi, ps) = _both(op, SIZES, seed, semantic=True)
        _same_images(bi, pi)
        assert torch.equal(bs, ps)


def test_the_segmentation_recipe_is_batched_and_the_same() -> None:
    """examples/train_segmentation.py's train preset: RandomResize, flip, FixedSizeCrop."""
    import argparse

    from packer.examples import train_segmentation as TS

    op = TS.pack_pipeline(argparse.Namespace(base_size=40, crop_size=32), True)
    assert batched_ops(op) is not None
    for seed in range(3):
        (bi, bs), (pi, ps) = _both(op, SIZES, seed, semantic=True)
        _same_images(bi, pi)
        assert torch.equal(bs, ps)


def test_every_box_falls_out_and_images_without_boxes() -> None:
    """A crop far from every box: all dropped (counts 0), as the per-image path."""
    op = D.Compose([D.RandomResizedCrop(16, scale=(0.01, 0.02)), D.SanitizeBoundingBoxes(5, 30)])
    sizes = [(60, 60), (50, 70), (64, 48)]
    for targets in ("dicts", "padded"):
        (bi, bt), (pi, pt) = _both(op, sizes, 1, targets)
        _same_images(bi, pi)
        _same_targets(bt, pt)
    counts = bt["counts"].tolist()
    assert counts[1] == 0  # image 1 of make_columns has no boxes
    assert sum(counts) < 1 + 1 + 3  # boxes were dropped


def test_flips_swap_keypoints_by_the_categories_flip_map() -> None:
    flip_map = {i: m for i, m in enumerate(fake_dense.CATEGORIES.flip_map) if m}
    mapped = D.Compose([D.Resize((30, 30)), D.RandomHorizontalFlip(1.0, flip_map=flip_map)])
    plain = D.Compose([D.Resize((30, 30)), D.RandomHorizontalFlip(1.0)])
    (_, bt), (_, pt) = _both(mapped, SIZES, 2)
    _same_targets(bt, pt)
    (_, unswapped), _ = _both(plain, SIZES, 2)
    swapped = 0
    for t, u in zip(bt, unswapped):
        person = t["labels"] == 2  # the category with (left, right) pairs
        swapped += int(person.sum())
        assert torch.equal(t["keypoints"][~person], u["keypoints"][~person])
        assert torch.equal(t["keypoints"][person][:, [0, 2, 1, 4, 3]], u["keypoints"][person])
    assert swapped  # the batch held some


@pytest.mark.parametrize(
    "op",
    [
        D.Compose([D.RandomIoUCrop(), D.RandomHorizontalFlip()]),
        D.Compose([D.RandomAffine(10), D.SanitizeBoundingBoxes()]),
        D.Compose([D.RandomRotation(10)]),
        D.Compose([D.ColorOnly(ColorJitter(brightness=0.2)), D.RandomHorizontalFlip()]),
        D.Compose([D.RandomResizedCrop(16, interpolation="bicubic")]),
        D.Compose([D.Pad((1, 1, 1, 1)), D.Resize(20)]),  # resample after a pad
        D.Compose([D.ScaleJitter((20, 20)), D.Resize(20)]),  # two resamples
        D.Compose([D.RandomZoomOut(fill=1), D.FixedSizeCrop(20, fill=2)]),  # two fills
    ],
    ids=["iou", "affine", "rotation", "colour", "bicubic", "pad-resize", "two", "fills"],
)
def test_ops_without_a_batched_path_keep_the_per_image_path(op) -> None:
    assert batched_ops(op) is None
    (bi, bt), (pi, pt) = _both(op, SIZES[:3], 0)
    assert torch.equal(bi, pi)
    _same_targets(bt, pt)


# ---------------------------------------------------------------- device ops and waits


@pytest.fixture
def uploads_marked(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the CPU ``to_device`` hands back the host tensor; a CUDA run's is a device
    tensor, and every op on it a launch: count those too."""
    import packer.augment.dense_batched_masks as masks_side
    import packer.augment.dense_batched_resample as resample_side
    import packer.loading.dense_batched as loading_side

    def upload(t: torch.Tensor, device: torch.device) -> torch.Tensor:
        out = t.clone()
        SyncCounter.device(out)
        return out

    for mod in (resample_side, masks_side, loading_side):
        monkeypatch.setattr(mod, "to_device", upload)


def _count(name: str, b: int, targets: str = "dicts", masks: bool = True) -> SyncCounter:
    sizes = [SIZES[i % len(SIZES)] for i in range(b)]
    images, cols = _inputs(sizes, 0)
    setup = DenseSetup(cols, _recipes()[name], targets, 32, 0, 255, masks)
    records = cols.read(np.arange(b))
    SyncCounter.device(images)
    with SyncCounter() as counter:
        run_batch(images, records, setup, torch.Generator().manual_seed(1))
    return counter


@pytest.mark.parametrize("name", ["lsj", "hflip", "rrc"])
@pytest.mark.parametrize("targets", ["dicts", "padded"])
@pytest.mark.parametrize("masks", [True, False], ids=["masks", "boxes"])
def test_device_ops_do_not_grow_with_the_batch(
    name: str, targets: str, masks: bool, uploads_marked: None
) -> None:
    small, large = _count(name, 4, targets, masks), _count(name, 16, targets, masks)
    assert small.syncs == 0 and large.syncs == 0, (dict(small.where), dict(large.where))
    assert large.ops <= small.ops + 2, (small.ops, large.ops, large.op_names - small.op_names)
    assert large.ops <= 200, large.op_names  # a batch's, not an image's (LSJ before: ~30 each)
    assert large.uploads <= small.uploads


def test_the_per_image_path_grows_with_the_batch() -> None:
    """What the test above would catch: the per-image path's ops per batch."""
    counts = []
    for b in (4, 16):
        sizes = [SIZES[i % len(SIZES)] for i in range(b)]
        images, cols = _inputs(sizes, 0)
        setup = DenseSetup(cols, _recipes()["lsj"], "dicts", 32, 0, 255, True)
        SyncCounter.device(images)
        with SyncCounter() as counter:
            run_batch(images, cols.read(np.arange(b)), setup, torch.Generator(), batched=False)
        counts.append(counter.ops)
    assert counts[1] > counts[0] + 100, counts


def test_images_padded_one_by_one_where_nested_tensors_fail(monkeypatch) -> None:
    """A torch build whose nested tensors refuse uint8 (or any): the same batch."""
    op = _recipes()["lsj"]
    (want, want_t), _ = _both(op, SIZES, 4)

    def refuse(*a, **k):
        raise NotImplementedError("no nested tensors here")

    monkeypatch.setattr(torch.nested, "as_nested_tensor", refuse)
    (got, got_t), _ = _both(op, SIZES, 4)
    assert torch.equal(got, want)
    _same_targets(got_t, want_t)


def test_a_batch_without_any_instance() -> None:
    """No image of the batch holds a box: empty targets of the right shapes, as the
    per-image path (keypoints [0, K, 3], masks [0, H, W])."""
    sizes = SIZES[:3]
    images, cols = _inputs(sizes, 6)
    for rec in cols.records:
        rec.update(
            boxes=np.zeros((0, 4), np.float32),
            labels=np.zeros(0, np.int64),
            iscrowd=np.zeros(0, np.uint8),
            area=np.zeros(0, np.float32),
            keypoints=np.zeros((0, fake_dense.K, 3), np.float32),
            masks_rle=[],
        )
    records = cols.read(np.arange(len(sizes)))
    for targets in ("dicts", "padded"):
        setup = DenseSetup(cols, _recipes()["lsj"], targets, 32, 0, 255, True)
        got = run_batch(images, records, setup, torch.Generator().manual_seed(0))
        want = run_batch(images, records, setup, torch.Generator().manual_seed(0), batched=False)
        _same_images(got[0], want[0])
        _same_targets(got[1], want[1])
    assert got[1]["keypoints"].shape == (3, 0, fake_dense.K, 3)


# ---------------------------------------------------------------- batches made together


GROUPS = [3, 2, 1, 4]  # batch sizes made in one pass (SIZES' images, and a few more)


@pytest.mark.parametrize("name", sorted(_recipes()))
@pytest.mark.parametrize("targets", ["dicts", "padded", "semantic"])
def test_batches_made_together_are_the_batches_made_alone(name: str, targets: str) -> None:
    """Each batch of a group (run_batches: one decode, one pass) is what run_batch makes
    of it alone with its own generator: images, masks and every target equal, on its
    own canvas (the group's images differ in size, so a batch's canvas is cut from it)."""
    sizes = [*SIZES, (33, 90), (70, 20), (44, 44), (29, 31)]
    semantic = targets == "semantic"
    images, cols = _inputs(sizes, 5, semantic=semantic)
    setup = DenseSetup(cols, _recipes()[name], "dicts" if semantic else targets, 32, 0, 255, True)
    records = cols.read(np.arange(len(sizes)))
    gens = [(n, torch.Generator().manual_seed(40 + k)) for k, n in enumerate(GROUPS)]
    at, alone = 0, []
    try:
        for k, n in enumerate(GROUPS):
            g = torch.Generator().manual_seed(40 + k)
            alone.append(run_batch(images[at : at + n], records[at : at + n], setup, g))
            at += n
    except ArgumentError as e:  # sanitize on semantic masks: refused alike
        with pytest.raises(ArgumentError, match=re.escape(str(e))):
            run_batches(images, records, setup, gens)
        return
    together = run_batches(images, records, setup, gens)
    assert_same(together, alone)  # test_a_group_shares_the_passs_torch_calls: in one pass


def test_a_group_the_batched_path_declines_is_made_batch_by_batch() -> None:
    """The first batch's records have keypoints and the second's none: one pass cannot
    stack them, so each batch is made alone (each through the batched path), the same."""
    images, cols = _inputs(SIZES, 2)
    setup = DenseSetup(cols, _recipes()["lsj"], "dicts", 32, 0, 255, True)
    records = cols.read(np.arange(len(SIZES)))
    records[3:] = [{k: v for k, v in r.items() if k != "keypoints"} for r in records[3:]]
    gens = [(3, torch.Generator().manual_seed(1)), (3, torch.Generator().manual_seed(2))]
    together = run_batches(images, records, setup, gens)
    alone = [
        run_batch(images[:3], records[:3], setup, torch.Generator().manual_seed(1)),
        run_batch(images[3:], records[3:], setup, torch.Generator().manual_seed(2)),
    ]
    assert_same(together, alone)
    assert "keypoints" in together[0][1][0] and "keypoints" not in together[1][1][0]


def _group_ops(group: int, b: int = 4) -> SyncCounter:
    sizes = [SIZES[i % len(SIZES)] for i in range(b * group)]
    images, cols = _inputs(sizes, 0)
    setup = DenseSetup(cols, _recipes()["lsj"], "padded", 32, 0, 255, False)
    records = cols.read(np.arange(len(sizes)))
    SyncCounter.device(images)
    gens = [(b, torch.Generator().manual_seed(k)) for k in range(group)]
    with SyncCounter() as counter:
        run_batches(images, records, setup, gens)
    return counter


def test_a_group_shares_the_passs_torch_calls(uploads_marked: None) -> None:
    """A pass's device calls are a fixed count: 4 batches made together make far fewer
    than 4 passes (what the producer thread holds the GIL for, beside the step)."""
    one, four = _group_ops(1), _group_ops(4)
    assert four.syncs == 0, dict(four.where)
    assert four.ops < 2 * one.ops, (one.ops, four.ops, four.op_names - one.op_names)


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["lsj", "hflip", "rrc", "zoom-fills"])
def test_cuda_batches_are_the_cpu_batches(name: str) -> None:
    """The batched path on a GPU (float16 products, pinned copies, nested tensors of
    uint8) gives the CPU's batch: targets within 1e-4, masks identical, images within
    the products' rounding."""
    op = _recipes()[name]
    images, cols = _inputs(SIZES, 7)
    records = cols.read(np.arange(len(SIZES)))
    for targets in ("dicts", "padded"):
        setup = DenseSetup(cols, op, targets, 32, 0, 255, True)
        want = run_batch(images, records, setup, torch.Generator().manual_seed(3))
        got = run_batch([i.cuda() for i in images], records, setup,
                        torch.Generator().manual_seed(3))  # fmt: skip
        assert got[0].is_cuda and got[0].shape == want[0].shape
        diff = (got[0].cpu().int() - want[0].int()).abs()
        assert int(diff.max()) <= 2 and float(diff.float().mean()) < 0.5
        moved = torch.utils._pytree.tree_map(
            lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, got[1]
        )
        _same_targets(moved, want[1])


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["lsj", "hflip", "zoom-fills"])
def test_cuda_batches_made_together_are_the_batches_made_alone(name: str) -> None:
    """On a GPU a group's half-precision products take the group's padded shape: each
    batch's targets and masks as alone, its images within one level."""
    sizes = [*SIZES, (33, 90), (70, 20), (44, 44), (29, 31)]
    images, cols = _inputs(sizes, 5)
    records = cols.read(np.arange(len(sizes)))
    setup = DenseSetup(cols, _recipes()[name], "padded", 32, 0, 255, True)
    cuda = [i.cuda() for i in images]
    gens = [(n, torch.Generator().manual_seed(40 + k)) for k, n in enumerate(GROUPS)]
    together = run_batches(cuda, records, setup, gens)
    at = 0
    for k, n in enumerate(GROUPS):
        g = torch.Generator().manual_seed(40 + k)
        alone = run_batch(cuda[at : at + n], records[at : at + n], setup, g)
        at += n
        got = together[k]
        assert got[0].shape == alone[0].shape and got[0].is_contiguous()
        assert int((got[0].int() - alone[0].int()).abs().max()) <= 1
        assert list(got[1]) == list(alone[1])
        for key in got[1]:
            assert torch.equal(got[1][key].cpu(), alone[1][key].cpu()), key


def test_records_that_disagree_with_their_image_are_refused_naming_the_field() -> None:
    """A semantic mask or instance masks of another size than the image, or fewer masks
    than boxes: the per-image path's clear error, never a silent gather."""
    from packer.imaging.resize import ArgumentError

    op = _recipes()["lsj"]
    images, cols = _inputs(SIZES[:2], 8, semantic=True)
    cols.records[1]["semantic"] = cols.records[1]["semantic"][:-1]
    setup = DenseSetup(cols, D.Compose(op.ops[:-1]), "dicts", 32, 0, 255, True)
    with pytest.raises(ArgumentError, match=r"semantic must be a uint8 tensor \[\d+, \d+\]"):
        run_batch(images, cols.read(np.arange(2)), setup, torch.Generator())
    images, cols = _inputs(SIZES[:3], 8)
    cols.records[2]["masks_rle"] = cols.records[2]["masks_rle"][:-1]
    setup = DenseSetup(cols, op, "dicts", 32, 0, 255, True)
    with pytest.raises(ArgumentError, match="per-instance fields disagree on M"):
        run_batch(images, cols.read(np.arange(3)), setup, torch.Generator())


def test_a_flip_then_a_resize_to_the_same_size_mirrors_the_source() -> None:
    """No resampling left (the size kept) but the source mirrored: a gather, exact."""
    sizes = [(30, 30)] * 3
    op = D.Compose([D.RandomHorizontalFlip(1.0), D.Resize((30, 30))])
    assert batched_ops(op) is not None
    (bi, bt), (pi, pt) = _both(op, sizes, 0)
    assert torch.equal(bi, pi)
    _same_targets(bt, pt)


@pytest.mark.parametrize("batched", [True, False])
def test_a_padded_batch_keeps_its_shapes_on_the_host(batched) -> None:
    """The pixels on another device ("meta" stands for the GPU here): the padded batch's
    shapes and ids stay on the host, so a consumer cutting it into images (the detection
    recipe's pack_batches) waits for nothing; the rest is on the device."""
    images, cols = _inputs(SIZES, 0)
    setup = DenseSetup(cols, _recipes()["lsj"], "padded", 32, 0, 255, True)
    records = cols.read(np.arange(len(SIZES)))
    gen = torch.Generator().manual_seed(3)
    x, t = run_batch([i.to("meta") for i in images], records, setup, gen, batched=batched)
    shapes = {"image_sizes", "counts", "image_ids"}
    assert x.device.type == "meta"
    assert {k: t[k].device.type for k in shapes} == dict.fromkeys(shapes, "cpu")
    assert t["image_ids"].tolist() == [int(r["image_id"]) for r in records]
    assert t["image_sizes"].tolist() == [[48, 48]] * len(SIZES)
    rest = {k: v.device.type for k, v in t.items() if k not in shapes}
    assert set(rest.values()) == {"meta"} and {"boxes", "labels", "valid", "masks"} <= set(rest)
