"""Dense batches made in groups (``DenseConfig.group``, review of 5cc1f67): a batch that
fails in a group fails where it fails alone (the batches before it handed out first);
a group handed out is not held by the producer while it makes the next; a set's
working set covers the shards a group holds; a group larger than the pass costs no
more than the pass. Over the in-memory fake of tests/helpers/fake_dense.py."""

from __future__ import annotations

import gc
import re
import threading
import weakref
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from pycocotools import mask as cocomask
from test_dense_loader import N, _open
from test_loader_sets import _Fetching

import packer
from conftest import write_image
from helpers import fake_dense
from helpers.dense_batches import break_jpeg_end
from packer.augment import dense as D
from packer.builder.api import BuildConfig, build
from packer.errors import PackFormatError
from packer.imaging.resize import ArgumentError
from packer.loading.dense_pass import DenseConfig
from packer.storage.packset import PackSet, open_set

OP = D.Compose([D.RandomHorizontalFlip(), D.RandomResize(20, 40)])


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """test_dense_loader's: a raw pack (32x24) and a JPEG pack (sizes vary) of N images."""
    root = tmp_path_factory.mktemp("groups")
    for i in range(N):
        write_image(root / "src" / "all" / f"{i}.jpg", (40 + 6 * i, 30 + 4 * i), seed=i)
    build(root / "src", root / "raw", BuildConfig(size=(32, 24), workers=1))
    build(root / "src", root / "jpeg", BuildConfig(store="jpeg", workers=1))
    return {"raw": root / "raw", "jpeg": root / "jpeg"}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> dict:
    return fake_dense.install(monkeypatch)


def _run(pack, group, bs=2) -> tuple[list[list[int]], BaseException | None]:
    """The ids of each batch a pass yields (a semantic pack's: by position, in order), and
    the error that ended it (or None)."""
    got: list[list[int]] = []
    # the producer thread's groups (the worker process's: tests/loading/test_dense_host*.py)
    dense = DenseConfig(OP, "padded", group=group, host="thread")
    ld = packer.PackLoader(pack, bs, shuffle=False, device="cpu", dense=dense)
    try:
        for x, t in ld:
            at = 1000 + sum(map(len, got))
            got.append(
                t["image_ids"].tolist() if isinstance(t, dict) else list(range(at, at + len(x)))
            )
    except Exception as e:
        return got, e
    return got, None


def _damage_record(cols) -> None:
    read = cols.read

    def failing(indices):  # as DenseColumns.read of a damaged row
        if 4 in np.asarray(indices).tolist():
            raise PackFormatError("data/dense_offsets.memmap: row 4 lies outside the values")
        return read(indices)

    cols.read = failing


def _damage_mask(cols) -> None:
    rec = cols.records[4]
    rec["masks_rle"] = [b"\xff garbage"] * len(rec["labels"])


def _mask_of_a_wrong_size(cols) -> None:
    rec = cols.records[4]
    h, w = rec["size"]
    rec["size"] = (h + 3, w)
    empty = cocomask.encode(np.zeros((h + 3, w), np.uint8, order="F"))["counts"]
    rec["masks_rle"] = [empty] * len(rec["labels"])


def _one_label_too_many(cols) -> None:
    rec = cols.records[4]
    rec["labels"] = np.concatenate([rec["labels"], [0]])


def _semantic_of_a_wrong_size(cols) -> None:
    cols.records[4]["semantic"] = cols.records[4]["semantic"][:-2]


@pytest.mark.parametrize("store", ["raw", "jpeg"])
@pytest.mark.parametrize(
    "damage, error, match",
    [
        (_damage_record, PackFormatError, "row 4 lies outside"),
        (_damage_mask, PackFormatError, "image 1004: instance mask 0"),
        # records that disagree with their image: the per-image path names the image
        (_mask_of_a_wrong_size, ArgumentError, r"image 1004: Sample: masks must be .* \[1, "),
        (_one_label_too_many, ArgumentError, r"image 1004: Sample: per-instance fields disagree"),
        (_semantic_of_a_wrong_size, ArgumentError, r"image 1004: Sample: semantic must be"),
    ],
)
def test_a_batch_that_fails_in_a_group_fails_where_it_fails_alone(
    fake, packs, store, damage, error, match
) -> None:
    """Image 4 (the third batch of 2) is damaged: alone, two batches then its error;
    in a group of 3 (or the default), the same two batches, then the same error."""
    pack, cols = _open(fake, packs, store, semantic=damage is _semantic_of_a_wrong_size)
    damage(cols)
    alone, e = _run(pack, 1)
    assert alone == [[1000, 1001], [1002, 1003]]
    assert isinstance(e, error) and re.search(match, str(e)), e
    for group in (3, None):
        got, e2 = _run(pack, group)
        assert got == alone, group
        assert type(e2) is type(e) and str(e2) == str(e)


def test_a_damaged_jpeg_in_a_group_fails_where_it_fails_alone(fake, packs, tmp_path) -> None:
    """The end marker of image 4's JPEG overwritten: decoding the group fails, and the
    batches before image 4's come first, as without groups."""
    break_jpeg_end(packs["jpeg"], tmp_path / "bad", 4)
    pack, _ = _open(fake, {"jpeg": tmp_path / "bad"}, "jpeg")
    alone, e = _run(pack, 1)
    assert alone == [[1000, 1001], [1002, 1003]]
    assert isinstance(e, PackFormatError) and "image 4" in str(e), e
    for group in (3, None):
        got, e2 = _run(pack, group)
        assert got == alone and type(e2) is type(e) and str(e2) == str(e), (group, e2)


@pytest.mark.parametrize("group", [1, 3])
def test_a_group_handed_out_is_not_held_while_the_next_is_made(fake, packs, group) -> None:
    """Once the consumer has dropped every batch of a group, nothing of it stays alive
    while the producer reads the next group (the producer's references would keep a
    whole group, its decoded inputs too, beside the next one)."""
    pack, cols = _open(fake, packs, "jpeg")
    read, calls = cols.read, []
    entered, release = threading.Event(), threading.Event()

    def blocking(indices):  # the second group's read waits for the test
        calls.append(1)
        if len(calls) == 2:
            entered.set()
            release.wait(20)
        return read(indices)

    cols.read = blocking
    dense = DenseConfig(OP, "padded", group=group, host="thread")  # the reads on the thread
    ld = packer.PackLoader(pack, 2, shuffle=False, device="cpu", dense=dense)
    it = iter(ld)
    try:
        refs = []
        for _ in range(group):
            x, t = next(it)
            refs += [weakref.ref(x), weakref.ref(t["boxes"]), weakref.ref(t["image_ids"])]
        del x, t
        assert entered.wait(20)  # the producer is inside the next group's read
        gc.collect()
        assert [r() is None for r in refs] == [True] * len(refs)
    finally:
        release.set()
    assert len(list(it)) == 4 - group


@pytest.fixture(scope="module")
def dense_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A raw pack set of 30 images, 3 a shard (10 shards)."""
    root = tmp_path_factory.mktemp("dense_set")
    for i in range(30):
        write_image(root / "src" / f"c{i % 3}" / f"{i:02d}.png", (20, 16), seed=i)
    raw = BuildConfig(size=(8, 6), workers=1)
    build(root / "src", root / "set", replace(raw, shard_size=3 * 144))
    return root / "set"


@pytest.mark.parametrize("group", [1, 3, None])
def test_the_working_set_covers_the_shards_a_group_holds(fake, dense_set, tmp_path, group) -> None:
    """A group's batches are read together, so their shards are held together: the
    working set (what a cache limit is checked against before the first batch) is at
    least what the pass holds at once."""
    local = open_set(dense_set)
    fake[str(local.path)] = fake_dense.make_columns([(6, 8)] * len(local))
    store = _Fetching(dense_set, tmp_path)
    s = PackSet(local.path, local.index, local.manifests, store)
    dense = DenseConfig(OP, "padded", group=group)
    ld = packer.PackLoader(s, 3, device="cpu", order="shards", seed=2, num_threads=2, dense=dense)
    need, held = ld.working_set()
    assert len(list(ld)) == 10
    assert store.most <= held, (store.most, held)
    sizes = sorted((e.bytes for e in local.index.shards), reverse=True)
    assert need >= sum(sizes[: store.most])
    assert not any(store.holds.values())


def test_a_group_larger_than_the_pass_costs_only_the_pass(fake, packs, monkeypatch) -> None:
    """DenseConfig(group=10**6) over a pass of 4 batches makes those 4 (one group) and
    sets up no more than they need (a generator per batch of the group, not 10**6)."""
    made = []

    class Counting(torch.Generator):
        def __init__(self, *a, **kw) -> None:
            super().__init__(*a, **kw)
            made.append(1)

    pack, _ = _open(fake, packs, "jpeg")
    one, _ = _run(pack, 1)
    monkeypatch.setattr(torch, "Generator", Counting)
    got, e = _run(pack, 10**6)
    assert e is None and got == one and len(one) == 4
    assert len(made) <= len(one) + 1, len(made)  # the pass's own and one a batch at most


def test_a_group_that_fails_while_its_batches_do_not_is_said_once(fake, packs, monkeypatch) -> None:
    """The group itself fails (the device's memory, say) and each batch made alone does
    not: every batch comes, the same as one a pass, and one warning says what happened
    and what to pass."""
    import packer.loading.dense_producer as producer

    real = producer.run_grouped

    def no_room_for_groups(images, records, items, setup, gens, plan):
        if len(gens) > 1:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore lines")
        return real(images, records, items, setup, gens, plan)

    pack, _ = _open(fake, packs, "raw", masks=False)
    alone, err = _run(pack, 1)
    assert err is None and len(alone) == -(-N // 2)
    monkeypatch.setattr(producer, "run_grouped", no_room_for_groups)
    with pytest.warns(RuntimeWarning) as said:
        got, err = _run(pack, 3)
    assert err is None and got == alone
    ours = [w for w in said if "dense batches failed" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in said]
    assert re.search(
        r"a group of 3 dense batches failed \(RuntimeError: CUDA out of memory\. Tried to "
        r"allocate 2\.00 GiB\) and was made one batch at a time, each fine; .* "
        r"DenseConfig\(group=1\)",
        str(ours[0].message),
    )
