"""PackLoader on detection and segmentation packs (issue 46, items 3 and 4, the loader's
side): ``(images, targets)`` on the device, per-image geometry on every field, read
through the pack storage's reading contract (``packer.pack.dense.dense_of``), here the
in-memory fake of tests/helpers/fake_dense.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import packer
from conftest import write_image
from helpers import fake_dense
from helpers.dense_batches import assert_same
from packer.augment import dense as D
from packer.builder.run import BuildConfig, build
from packer.errors import UsageError
from packer.loading.dense_pass import DenseConfig
from packer.loading.order import batch_seed

N = 7


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A raw pack (32x24, crop) and a JPEG pack (stored sizes vary) of the same N images."""
    root = tmp_path_factory.mktemp("dense")
    sizes = [(40 + 6 * i, 30 + 4 * i) for i in range(N)]  # (w, h)
    for i, s in enumerate(sizes):
        write_image(root / "src" / "all" / f"{i}.jpg", s, seed=i)
    build(root / "src", root / "raw", BuildConfig(size=(32, 24), workers=1))
    build(root / "src", root / "jpeg", BuildConfig(store="jpeg", workers=1))
    return {"raw": root / "raw", "jpeg": root / "jpeg"}


def _stored_sizes(pack) -> list[tuple[int, int]]:
    if hasattr(pack, "sizes"):
        return [tuple(int(v) for v in s) for s in pack.sizes.tolist()]
    h, w = pack.images.shape[-2:]
    return [(int(h), int(w))] * len(pack)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> dict:
    return fake_dense.install(monkeypatch)


def _open(fake: dict, packs: dict, store: str, **kw) -> tuple[object, fake_dense.FakeColumns]:
    pack = packer.load(packs[store])
    cols = fake_dense.make_columns(_stored_sizes(pack), **kw)
    fake[str(pack.path)] = cols
    return pack, cols


def _loader(pack, bs=3, **kw) -> packer.PackLoader:
    kw.setdefault("shuffle", False)
    kw.setdefault("device", "cpu")
    return packer.PackLoader(pack, bs, **kw)


# ---------------------------------------------------------------- plain packs stay plain


def test_a_pack_without_targets_streams_as_before(fake, packs) -> None:
    pack = packer.load(packs["raw"])
    batch = next(iter(_loader(pack)))
    assert len(batch) == 2 and batch[1].dtype == torch.int64  # (images, labels)
    with pytest.raises(UsageError, match="for packs with boxes, masks or keypoints"):
        _loader(pack, targets="padded")


def test_a_pack_the_real_storage_finds_no_targets_in_is_plain(packs) -> None:
    """No fake: packer.pack.dense.dense_of of a pack built without targets is None, and
    the loader streams it as before, (images, labels)."""
    from packer.pack.dense import dense_of

    pack = packer.load(packs["raw"])
    assert dense_of(pack) is None
    images, labels = next(iter(_loader(pack)))
    assert images.dtype == torch.uint8 and labels.dtype == torch.int64


# ---------------------------------------------------------------- dicts


@pytest.mark.parametrize("store", ["raw", "jpeg"])
def test_dicts_are_torchvisions_targets(fake, packs, store) -> None:
    pack, cols = _open(fake, packs, store)
    sizes = _stored_sizes(pack)
    seen = []
    for images, targets in _loader(pack):
        assert images.dtype == torch.uint8 and images.ndim == 4 and images.shape[1] == 3
        assert len(targets) == images.shape[0]
        ids = [t["image_id"] - 1000 for t in targets]
        if len({sizes[i] for i in ids}) > 1:  # sizes differ: padded to a multiple of 32
            assert images.shape[2] % 32 == 0 and images.shape[3] % 32 == 0
        else:  # one size: as stored
            assert tuple(images.shape[2:]) == sizes[ids[0]]
        for t in targets:
            i = t["image_id"] - 1000
            rec = cols.records[i]
            m = len(rec["labels"])
            h, w = sizes[i]
            assert set(t) == {
                "boxes",
                "labels",
                "masks",
                "keypoints",
                "image_id",
                "area",
                "iscrowd",
            }
            assert t["boxes"].dtype == torch.float32 and t["boxes"].shape == (m, 4)
            assert t["labels"].dtype == torch.int64 and t["labels"].shape == (m,)
            assert t["iscrowd"].dtype == torch.int64 and t["area"].dtype == torch.float32
            assert t["masks"].dtype == torch.uint8
            assert t["masks"].shape == (m, *images.shape[2:])
            assert t["keypoints"].shape == (m, fake_dense.K, 3)
            assert np.array_equal(t["boxes"].numpy(), rec["boxes"])
            assert np.array_equal(t["area"].numpy(), rec["area"])  # untransformed: stored
            full = fake_dense.decode_masks(rec["masks_rle"], rec["size"])
            assert np.array_equal(t["masks"][:, :h, :w].numpy(), full)
            assert not t["masks"][:, h:].any() and not t["masks"][:, :, w:].any()
            seen.append(i)
    assert seen == list(range(N))


def test_untransformed_images_are_the_stored_ones(fake, packs) -> None:
    pack, _ = _open(fake, packs, "jpeg")
    images, targets = next(iter(_loader(pack, bs=2)))
    for k, t in enumerate(targets):
        want = pack.decode([t["image_id"] - 1000])[0]
        h, w = want.shape[1:]
        assert torch.equal(images[k, :, :h, :w], want)
        assert not images[k, :, h:].any() and not images[k, :, :, w:].any()


def _tiny_faster_rcnn() -> torch.nn.Module:
    from torchvision.models import detection
    from torchvision.models.detection.anchor_utils import AnchorGenerator
    from torchvision.ops import MultiScaleRoIAlign

    torch.manual_seed(0)
    backbone = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=4, padding=1), torch.nn.ReLU())
    backbone.out_channels = 8
    return detection.FasterRCNN(
        backbone,
        num_classes=4,
        rpn_anchor_generator=AnchorGenerator(((8, 16, 32),), ((0.5, 1.0, 2.0),)),
        box_roi_pool=MultiScaleRoIAlign(["0"], 7, 2),
        min_size=48,
        max_size=96,
    )


def test_a_torchvision_faster_rcnn_trains_on_a_batch(fake, packs) -> None:
    pack, _ = _open(fake, packs, "jpeg", masks=False, keypoints=False)
    op = D.Compose([D.RandomHorizontalFlip(), D.ScaleJitter((48, 64)), D.SanitizeBoundingBoxes()])
    model = _tiny_faster_rcnn().train()
    images, targets = next(iter(_loader(pack, bs=4, dense_transform=op)))
    losses = model([i.float() / 255 for i in images], targets)
    assert {"loss_classifier", "loss_box_reg", "loss_objectness"} <= set(losses)
    assert all(torch.isfinite(v) for v in losses.values())


# ---------------------------------------------------------------- geometry


def _op() -> D.Compose:
    return D.Compose(
        [
            D.RandomZoomOut(side_range=(1.0, 2.0), p=0.7),
            D.RandomIoUCrop(),
            D.RandomHorizontalFlip(),
            D.Resize((40, 48)),
            D.SanitizeBoundingBoxes(),
        ]
    )


@pytest.mark.parametrize("store", ["raw", "jpeg"])
def test_geometry_equals_the_dense_ops_applied_with_the_batch_generator(fake, packs, store) -> None:
    from packer.loading.dense_pass import DenseSetup, to_sample

    pack, cols = _open(fake, packs, store, keypoints=False)
    op = _op()
    loader = _loader(pack, bs=3, dense=DenseConfig(transform=op), seed=5)
    setup = DenseSetup(cols, op, "dicts", 32, 0, 255)
    g = torch.Generator()
    for b, (images, targets) in enumerate(loader):
        assert images.shape[2:] == (40, 48)  # a fixed size: no padding
        g.manual_seed(batch_seed(5, 0, 0, b))
        for k, t in enumerate(targets):
            i = t["image_id"] - 1000
            image = pack.decode([i])[0] if store == "jpeg" else pack.images[i].clone()
            want = op(to_sample(image, cols.records[i], setup), g)
            assert torch.equal(t["boxes"], want.boxes)
            assert torch.equal(t["labels"], want.labels)
            assert torch.equal(t["masks"], want.masks)
            assert torch.equal(images[k], want.image)
            assert torch.equal(t["area"], want.masks.flatten(1).sum(1).float())


def test_a_flip_swaps_keypoints_by_the_category_flip_map(fake, packs) -> None:
    pack, cols = _open(fake, packs, "raw")
    flip = D.RandomHorizontalFlip(p=1.0)
    images, targets = next(iter(_loader(pack, bs=N, dense_transform=flip)))
    w = images.shape[-1]
    swapped = 0
    for t in targets:
        rec = cols.records[t["image_id"] - 1000]
        got = t["keypoints"]
        for m, label in enumerate(rec["labels"].tolist()):
            kp = torch.from_numpy(rec["keypoints"][m])
            perm = list(range(fake_dense.K))
            for a, z in fake_dense.CATEGORIES.flip_map[label]:
                perm[a], perm[z] = z, a
                swapped += 1
            want = kp[perm]
            assert torch.allclose(got[m, :, 0], w - 1 - want[:, 0])  # torchvision's flip
            assert torch.equal(got[m, :, 1], want[:, 1])
    assert swapped > 0  # some instance is a person, whose eyes and hands swap
    assert flip.flip_map is None  # the loader's copy took the map, not the caller's op


def test_transform_takes_a_dense_compose(fake, packs) -> None:
    pack, _ = _open(fake, packs, "raw", masks=False)
    a = [t for _, ts in _loader(pack, transform=_op(), seed=3) for t in ts]
    b = [t for _, ts in _loader(pack, dense_transform=_op(), seed=3) for t in ts]
    assert [torch.equal(x["boxes"], y["boxes"]) for x, y in zip(a, b)] == [True] * N


def test_colour_ops_touch_images_only(fake, packs) -> None:
    pack, cols = _open(fake, packs, "raw")
    op = D.Compose([D.ColorOnly(packer.transforms.ColorJitter(0.8, 0.8, 0.8))])
    (images, targets), (plain, _) = (
        next(iter(_loader(pack, dense_transform=op))),
        next(iter(_loader(pack))),
    )
    assert not torch.equal(images, plain)
    for t in targets:
        assert np.array_equal(t["boxes"].numpy(), cols.records[t["image_id"] - 1000]["boxes"])


# ---------------------------------------------------------------- padded, semantic


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


@pytest.mark.cuda
def test_cutting_a_padded_cuda_batch_into_images_makes_no_host_wait(fake, packs) -> None:
    """The detection recipe's cut (pack_batches) of a padded batch on the GPU: torch's
    sync debug mode raises at any host wait."""
    from packer.examples import train_detection as TD

    pack, cols = _open(fake, packs, "jpeg")
    images, out = next(iter(_loader(pack, bs=4, targets="padded", device="cuda")))
    torch.cuda.set_sync_debug_mode("error")
    try:
        cut, targets = next(TD.pack_batches([(images, out)], True))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert [t["image_id"] for t in targets] == [1000, 1001, 1002, 1003]
    assert all(i.is_cuda for i in cut) and all(t["boxes"].is_cuda for t in targets)
    assert [len(t["labels"]) for t in targets] == [len(cols.records[i]["labels"]) for i in range(4)]


@pytest.mark.parametrize("device", DEVICES)
def test_padded_batch_with_counts(fake, packs, device) -> None:
    pack, cols = _open(fake, packs, "jpeg")
    images, out = next(iter(_loader(pack, bs=4, targets="padded", device=device)))
    # the shapes (and ids) on the host, so cutting the batch by them waits for nothing
    shapes = {"image_sizes", "counts", "image_ids"}
    assert images.device.type == device
    assert all(out[k].device.type == "cpu" for k in shapes)
    assert all(t.device.type == device for k, t in out.items() if k not in shapes)
    images, out = images.cpu(), {k: v.cpu() for k, v in out.items()}
    b = images.shape[0]
    counts = [len(cols.records[i]["labels"]) for i in range(b)]
    n = max(counts)
    assert out["counts"].tolist() == counts
    assert out["boxes"].shape == (b, n, 4) and out["labels"].shape == (b, n)
    assert out["masks"].shape == (b, n, *images.shape[2:])
    assert out["keypoints"].shape == (b, n, fake_dense.K, 3)
    assert out["image_ids"].tolist() == [1000, 1001, 1002, 1003]
    assert images.shape[2] % 32 == 0 and images.shape[3] % 32 == 0
    for i, c in enumerate(counts):
        assert np.array_equal(out["boxes"][i, :c].numpy(), cols.records[i]["boxes"])
        assert (out["labels"][i, c:] == -1).all() and not out["valid"][i, c:].any()
        assert np.array_equal(out["area"][i, :c].numpy(), cols.records[i]["area"])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("store", ["raw", "jpeg"])
def test_semantic_packs_yield_a_mask_batch(fake, packs, store, device) -> None:
    pack, cols = _open(fake, packs, store, semantic=True)
    op = D.Compose([D.RandomHorizontalFlip(p=1.0)])
    for images, masks in _loader(pack, bs=3, dense_transform=op, device=device):
        assert masks.dtype == torch.uint8 and masks.ndim == 3
        assert masks.shape == (images.shape[0], *images.shape[2:])
        assert images.device.type == masks.device.type == device
    images, masks = next(iter(_loader(pack, bs=2, device=device)))
    masks = masks.cpu()
    for k in range(2):
        sem = torch.from_numpy(cols.records[k]["semantic"])
        h, w = sem.shape
        assert torch.equal(masks[k, :h, :w], sem)
        assert (masks[k, h:] == 255).all() and (masks[k, :, w:] == 255).all()


@pytest.mark.parametrize("targets", ["dicts", "padded"])
def test_masks_false_leaves_the_instance_masks_unread(fake, packs, monkeypatch, targets) -> None:
    """A box model's loader (``DenseConfig(masks=False)``) never decodes the masks and
    yields the same images, boxes and labels without them."""
    from packer.loading import dense_pass

    pack, _ = _open(fake, packs, "jpeg")
    op = D.Compose([D.RandomHorizontalFlip(), D.ScaleJitter((40, 48)), D.FixedSizeCrop((40, 48)),
                    D.SanitizeBoundingBoxes()])  # fmt: skip
    full = list(_loader(pack, dense=DenseConfig(transform=op, targets=targets)))

    def no_decode(*args: object) -> None:
        raise AssertionError("the masks were decoded")

    monkeypatch.setattr(dense_pass, "decode_masks", no_decode)
    monkeypatch.setattr(dense_pass, "mask_runs", no_decode)  # the device decode's input
    boxes = list(_loader(pack, dense=DenseConfig(transform=op, targets=targets, masks=False)))
    assert len(full) == len(boxes) == 3
    for (fi, ft), (bi, bt) in zip(full, boxes):
        assert torch.equal(fi, bi)
        if targets == "padded":
            ft, bt = [ft], [bt]
        for a, b in zip(ft, bt):
            assert "masks" in a and "masks" not in b
            assert torch.equal(a["boxes"], b["boxes"]) and torch.equal(a["labels"], b["labels"])


# ---------------------------------------------------------------- order, resume


def test_every_image_once_per_epoch_shuffled(fake, packs) -> None:
    pack, _ = _open(fake, packs, "jpeg")
    loader = _loader(pack, bs=2, shuffle=True, seed=1)
    orders = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        ids = [t["image_id"] for _, ts in loader for t in ts]
        assert sorted(ids) == [1000 + i for i in range(N)]
        orders.append(ids)
    assert orders[0] != orders[1]  # each epoch its own permutation
    want = [1000 + int(i) for e in range(2) for i in loader.indices(e)]
    assert orders[0] + orders[1] == want  # the loader's order, targets with their rows


def _targets_of(loader, skip: int = 0) -> list[tuple[int, torch.Tensor]]:
    it = iter(loader)
    out = []
    for b, (_, ts) in enumerate(it):
        if b >= skip:
            out += [(t["image_id"], t["boxes"]) for t in ts]
    return out


def test_resume_gives_the_same_targets(fake, packs) -> None:
    pack, _ = _open(fake, packs, "raw", masks=False)
    whole = _targets_of(_loader(pack, bs=2, shuffle=True, seed=7, dense_transform=_op()))
    first = _loader(pack, bs=2, shuffle=True, seed=7, dense_transform=_op())
    it = iter(first)
    next(it)
    next(it)
    state = first.state_dict()
    it.close()
    resumed = _loader(pack, bs=2, shuffle=True, seed=7, dense_transform=_op())
    resumed.load_state_dict(state)
    rest = _targets_of(resumed)
    assert len(rest) == len(whole) - 4
    for (i, a), (j, b) in zip(whole[4:], rest):
        assert i == j and torch.equal(a, b)
    other = _targets_of(_loader(pack, bs=2, shuffle=True, seed=8, dense_transform=_op()))
    assert any(not torch.equal(a, b) for (_, a), (_, b) in zip(sorted(whole), sorted(other)))


@pytest.mark.parametrize("targets", ["dicts", "padded"])
def test_batches_made_in_groups_are_the_batches_made_one_by_one(fake, packs, targets) -> None:
    """DenseConfig(group=...): the batches a pass makes together (the JPEG pack's images
    of different sizes, each batch on its own canvas) are those made one at a time."""
    pack, _ = _open(fake, packs, "jpeg")
    op = D.Compose([D.RandomHorizontalFlip(), D.RandomResize(20, 40), D.SanitizeBoundingBoxes()])

    def batches(group):
        dense = DenseConfig(op, targets, group=group)
        return list(_loader(pack, bs=2, shuffle=True, seed=3, dense=dense))

    one = batches(1)
    assert len(one) == -(-N // 2)
    assert len({tuple(x.shape) for x, _ in one}) > 1  # the canvases differ
    for group in (2, 3, None):
        assert_same(batches(group), one, contiguous=True)


def test_a_resume_inside_a_group_gives_the_same_batches(fake, packs) -> None:
    pack, _ = _open(fake, packs, "jpeg")
    op = D.Compose([D.RandomHorizontalFlip(), D.RandomResize(20, 40)])

    def loader():
        dense = DenseConfig(op, "padded", group=3)
        return _loader(pack, bs=2, shuffle=True, seed=7, dense=dense)

    whole = list(loader())
    first = loader()
    it = iter(first)
    next(it)  # one batch of the first group of three
    state = first.state_dict()
    it.close()
    resumed = loader()
    resumed.load_state_dict(state)
    assert_same(list(resumed), whole[1:], contiguous=True)


def test_how_many_batches_a_pass_makes_together(fake, packs) -> None:
    from dataclasses import replace
    from types import SimpleNamespace

    from packer.loading.dense_pass import GROUP_IMAGES, dense_setup
    from packer.loading.dense_producer import group_size

    pack, _ = _open(fake, packs, "raw")
    lsj = DenseConfig(D.Compose([D.ScaleJitter((32, 32)), D.FixedSizeCrop(32)]))
    iou = DenseConfig(D.Compose([D.RandomIoUCrop()]))  # no batched path
    setup = dense_setup(pack, None, None, None, lsj)[0]
    assert group_size(setup, 8, 4) == GROUP_IMAGES // 8 == 4
    assert group_size(setup, 8, 2) == 2  # at most the loader's prefetch
    assert group_size(setup, GROUP_IMAGES, 4) == 1
    assert group_size(dense_setup(pack, None, None, None, iou)[0], 8, 4) == 1
    fixed = dense_setup(pack, None, None, None, DenseConfig(lsj.transform, group=3))[0]
    assert group_size(fixed, 64, 1) == 3
    semantic = replace(setup, columns=SimpleNamespace(semantic=True))
    assert semantic.semantic and group_size(semantic, 8, 4) == 1
    assert group_size(replace(semantic, group=2), 8, 4) == 2


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize("where", ["dense_transform", "transform", "compose"])
def test_a_torchvision_transform_is_refused_by_name(fake, packs, where) -> None:
    from torchvision.transforms import v2

    pack, _ = _open(fake, packs, "raw")
    op = v2.RandomIoUCrop()
    if where == "compose":
        with pytest.raises(UsageError, match=r"v2\.RandomIoUCrop is a torchvision transform"):
            _loader(pack, dense_transform=v2.Compose([v2.RandomIoUCrop()]))
        return
    with pytest.raises(
        UsageError, match=r"torchvision.transforms.v2.RandomIoUCrop is a torchvision transform"
    ):
        _loader(pack, **{where: op})


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"targets": "list"}, r"targets must be 'dicts' or 'padded', not 'list'"),
        ({"resident": True}, r"resident=True is for plain raw packs"),
        ({"decode": "cpu"}, r"decode= is for plain packs"),
        ({"transform": packer.transforms.RandomResizedCrop(16)}, r"works on image batches only"),
        (
            {"dense": DenseConfig(), "targets": "padded"},
            r"either in dense=DenseConfig\(...\) or as dense_transform= / targets=",
        ),
        ({"dense": DenseConfig(size_divisible=0)}, r"size_divisible must be a positive int"),
        ({"dense": "padded"}, r"dense must be a DenseConfig, not str"),
        ({"dense": DenseConfig(masks="no")}, r"DenseConfig.masks must be True or False, not 'no'"),
        (
            {"dense": DenseConfig(group=0)},
            r"DenseConfig.group must be a positive int or None, not 0",
        ),
    ],
)
def test_bad_dense_arguments_are_refused(fake, packs, kw, match) -> None:
    pack, _ = _open(fake, packs, "raw")
    with pytest.raises(UsageError, match=match):
        _loader(pack, **kw)


def test_image_size_is_refused_on_a_dense_jpeg_pack(fake, packs) -> None:
    pack, _ = _open(fake, packs, "jpeg")
    with pytest.raises(UsageError, match=r"image_size is for plain JPEG packs"):
        _loader(pack, image_size=32)


def test_a_dense_pack_in_a_list_is_refused(fake, packs) -> None:
    pack, _ = _open(fake, packs, "raw")
    with pytest.raises(UsageError, match=r"a pack with targets streams alone"):
        _loader([pack, pack])


# ---------------------------------------------------------------- CUDA


@pytest.mark.cuda
@pytest.mark.parametrize("store", ["raw", "jpeg"])
def test_cuda_gives_the_cpu_targets(fake, packs, store) -> None:
    pack, _ = _open(fake, packs, store)
    op = D.Compose([D.RandomHorizontalFlip(), D.Resize((40, 48)), D.SanitizeBoundingBoxes()])
    cpu = list(_loader(pack, dense_transform=op, seed=2))
    gpu = list(packer.PackLoader(pack, 3, device="cuda", shuffle=False, dense_transform=op, seed=2))
    assert len(cpu) == len(gpu)
    for (ci, ct), (gi, gt) in zip(cpu, gpu):
        assert gi.is_cuda and gt[0]["boxes"].is_cuda
        # the resize's rounding on raw rows; a JPEG pack's GPU decode (nvjpeg) also
        # upsamples chroma without libjpeg's smoothing, which this enlarging Resize
        # carries: 1.16/255 mean measured (H200, 2026-11-29), as
        # tests/loading/test_decode_vs_pillow.py's enlarged boxes
        d = (ci.int() - gi.cpu().int()).abs()
        mean = float(d.float().mean())
        assert d.max() <= 2 if store == "raw" else mean <= 1.5, (int(d.max()), mean)
        for a, b in zip(ct, gt):
            assert torch.allclose(a["boxes"], b["boxes"].cpu(), atol=1e-4)
            assert torch.equal(a["labels"], b["labels"].cpu())
            assert torch.equal(a["masks"], b["masks"].cpu())
