"""``DenseConfig(host="process")``: a worker process makes each group's host half
(packer.loading.dense_host), the producer thread only reads, decodes and launches. The
same batches as the thread makes (raw and JPEG packs, dicts and padded, masks and
keypoints, semantic masks), the host half made outside this process, errors met where
the thread meets them, a worker that dies replaced by the thread, no worker left."""

from __future__ import annotations

import multiprocessing as mp
import os
import re
from pathlib import Path

import numpy as np
import pytest

import packer
from helpers.dense_batches import assert_same, coco_packs
from packer.augment import dense as D
from packer.errors import PackFormatError, UsageError
from packer.loading.dense_pass import DenseConfig

pytestmark = pytest.mark.skipif(
    "fork" not in mp.get_all_start_methods(), reason="the worker is forked here"
)

LSJ = D.Compose(
    [D.ScaleJitter((48, 48)), D.FixedSizeCrop(48, fill=(1, 2, 3)), D.RandomHorizontalFlip(),
     D.SanitizeBoundingBoxes()]
)  # fmt: skip
HFLIP = D.Compose([D.RandomHorizontalFlip(), D.RandomResize(24, 40)])


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """COCO packs (instance masks, boxes; JPEG and raw) and a semantic pack, of 10 images."""
    return coco_packs(tmp_path_factory.mktemp("host"), semantic=True)


def _batches(path: Path, host: str, op=LSJ, targets="padded", bs=2, group=2, **kw) -> list:
    pack = packer.load(path)
    dense = DenseConfig(op, targets, group=group, host=host)
    loader = packer.PackLoader(pack, bs, device="cpu", seed=5, shuffle=True, dense=dense, **kw)
    return list(loader)


@pytest.mark.parametrize("store", ["jpeg", "raw"])
@pytest.mark.parametrize("targets", ["padded", "dicts"])
@pytest.mark.parametrize("op", [LSJ, HFLIP], ids=["lsj", "hflip"])
def test_a_worker_makes_the_batches_the_thread_makes(packs, store, targets, op) -> None:
    thread = _batches(packs[store], "thread", op, targets)
    assert len(thread) == 5
    assert_same(_batches(packs[store], "process", op, targets), thread)
    assert not mp.active_children()  # the pass's worker has ended with it


def test_semantic_masks_through_a_worker(packs) -> None:
    op = D.Compose([D.RandomResize(24, 40), D.FixedSizeCrop(24), D.RandomHorizontalFlip()])
    thread = _batches(packs["seg"], "thread", op, bs=3)
    assert_same(_batches(packs["seg"], "process", op, bs=3), thread)


def test_the_host_half_is_made_outside_this_process(packs, monkeypatch) -> None:
    """drawn_group (the records, draws, geometry and host targets) runs in the worker:
    never in this process with host="process", in every group with "thread"."""
    import packer.loading.dense_batched as DBL
    import packer.loading.dense_host as DH

    here: list[int] = []
    real = DBL.drawn_group

    def counted(*args, **kw):
        here.append(os.getpid())  # the forked worker appends to its own copy
        return real(*args, **kw)

    monkeypatch.setattr(DBL, "drawn_group", counted)
    monkeypatch.setattr(DH, "drawn_group", counted)
    _batches(packs["jpeg"], "process")
    assert here == []
    _batches(packs["jpeg"], "thread")
    assert here and set(here) == {os.getpid()}


def test_an_error_in_a_group_is_met_where_the_thread_meets_it(packs, monkeypatch) -> None:
    """A damaged record: the worker reports it, the thread makes that group, hands out
    the batches before the bad one, then raises the same error as with host="thread"."""
    from packer.pack.dense import DenseColumns

    read = DenseColumns.read

    def damaged(self, indices):
        if 7 in np.asarray(indices).tolist():
            raise PackFormatError("data/dense_offsets.memmap: row 7 lies outside the values")
        return read(self, indices)

    monkeypatch.setattr(DenseColumns, "read", damaged)  # the forked worker's too
    got = {}
    for host in ("thread", "process"):
        pack = packer.load(packs["jpeg"])
        dense = DenseConfig(LSJ, "padded", group=2, host=host)
        loader = packer.PackLoader(pack, 2, device="cpu", shuffle=False, dense=dense)
        ids = []
        with pytest.raises(PackFormatError, match="row 7 lies outside") as e:
            for _, t in loader:
                ids.append(t["image_ids"].tolist())
        got[host] = (ids, str(e.value))
    assert got["process"] == got["thread"] and len(got["thread"][0]) == 3
    assert not mp.active_children()


def test_a_worker_that_dies_leaves_the_thread_to_finish(packs, monkeypatch) -> None:
    """The worker answers once, then dies: one warning, and the thread makes the rest of
    the pass, the same batches."""
    import packer.loading.dense_host as DH

    serve = DH._serve

    class OneAnswer:
        def __init__(self, conn) -> None:
            self.conn, self.n = conn, 0

        def recv_bytes(self):
            if self.n == 1:
                os._exit(3)
            self.n += 1
            return self.conn.recv_bytes()

        def send_bytes(self, b) -> None:
            self.conn.send_bytes(b)

    monkeypatch.setattr(DH, "_serve", lambda conn, *a: serve(OneAnswer(conn), *a))
    thread = _batches(packs["raw"], "thread")
    with pytest.warns(RuntimeWarning, match=r"host worker ended; its producer thread makes"):
        got = _batches(packs["raw"], "process")
    assert_same(got, thread)
    assert not mp.active_children()


def test_a_pass_stopped_early_ends_its_worker(packs) -> None:
    pack = packer.load(packs["jpeg"])
    dense = DenseConfig(LSJ, "padded", group=1, host="process")
    loader = packer.PackLoader(pack, 2, device="cpu", dense=dense)
    it = iter(loader)
    next(it)
    assert mp.active_children()  # the worker is up, a group or two ahead
    it.close()
    loader.close()
    assert not mp.active_children()


def test_a_host_that_names_no_way_is_refused(packs) -> None:
    pack = packer.load(packs["jpeg"])
    with pytest.raises(UsageError, match=re.escape("DenseConfig.host must be 'thread' or")):
        packer.PackLoader(pack, 2, device="cpu", dense=DenseConfig(LSJ, host="processes"))
