"""``DenseConfig(host="process")``: a worker process makes each group's host half
(packer.loading.dense_host), the producer thread only reads, decodes and launches. The
same batches as the thread makes (raw and JPEG packs, dicts and padded, masks and
keypoints, semantic masks), the host half made outside this process, errors met where
the thread meets them, a worker that dies replaced by the thread, no worker left; the
default (a worker for a pack with boxes, none for a semantic pack), and the thread where
no worker can start (a daemonic process, a fork that fails)."""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import signal
import time
from pathlib import Path

import numpy as np
import pytest

import packer
from helpers.dense_batches import assert_same, coco_packs, failing_forks_forgotten
from packer.augment import dense as D
from packer.errors import PackFormatError, UsageError
from packer.loading.dense_host import forkable
from packer.loading.dense_pass import DenseConfig

pytestmark = pytest.mark.skipif(
    not forkable(), reason="the worker is forked here (not on Windows or macOS)"
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

        def poll(self, timeout: float) -> bool:
            return self.conn.poll(timeout)

    monkeypatch.setattr(DH, "_serve", lambda conn, *a: serve(OneAnswer(conn), *a))
    thread = _batches(packs["raw"], "thread")
    with pytest.warns(RuntimeWarning, match=r"host worker ended; its producer thread makes"):
        got = _batches(packs["raw"], "process")
    assert_same(got, thread)
    assert not mp.active_children()


def test_a_worker_that_hangs_is_stopped_and_the_thread_finishes(packs, monkeypatch) -> None:
    """Alive but silent (a lock a thread of the training process held as it forked,
    say): it stalled the pass for good. Now, after DenseConfig's wait for an answer, it
    is stopped, one warning says so, and the thread makes the pass: the same batches."""
    import threading

    import packer.loading.dense_host as DH

    monkeypatch.setattr(DH, "_serve", lambda conn, *a: threading.Event().wait())
    thread = _batches(packs["jpeg"], "thread")
    pack = packer.load(packs["jpeg"])
    dense = DenseConfig(LSJ, "padded", group=2, host="process", _host_wait=0.5)
    loader = packer.PackLoader(pack, 2, device="cpu", seed=5, shuffle=True, dense=dense)
    said = r"host worker did not answer in 0.5 s and was stopped; its producer thread"
    with pytest.warns(RuntimeWarning, match=said):
        got = list(loader)
    assert_same(got, thread)
    assert not mp.active_children()


def _pass_then_wait(path: str, q) -> None:
    """A training process: a pass under way, its worker's pid sent, then idle."""
    import threading

    import torch

    torch.set_num_threads(1)  # as DataLoader's workers: this test process ran OpenMP
    dense = DenseConfig(LSJ, "padded", group=1, host="process")
    it = iter(packer.PackLoader(packer.load(path), 1, device="cpu", prefetch=1, dense=dense))
    next(it)
    q.put([p.pid for p in mp.active_children()])
    threading.Event().wait()


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_worker_ends_when_its_training_process_is_killed(packs) -> None:
    """SIGKILL (the OOM killer, a scheduler) gives the training process no time to close
    its passes: the worker held its own copy of the producer's end of the pipe, never
    saw it close, and waited for requests for good (a leaked process per loader)."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_pass_then_wait, args=(str(packs["jpeg"]), q))
    p.start()
    try:
        (worker,) = q.get(timeout=60)
    finally:
        p.kill()
        p.join()
    deadline = time.monotonic() + 30
    while not _gone(worker) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling for the worker's end (bounded), not waiting one out
    gone = _gone(worker)
    if not gone:
        os.kill(worker, signal.SIGKILL)
    assert gone


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
    said = re.escape("DenseConfig.host must be 'thread', 'process' or None")
    with pytest.raises(UsageError, match=said):
        packer.PackLoader(pack, 2, device="cpu", dense=DenseConfig(LSJ, host="processes"))


def _workers_during_a_pass(path: Path, op, **kw) -> tuple[list[str], list]:
    """The names of this process's children after a pass's first batch, and the pass."""
    dense = DenseConfig(op, "padded", group=1, **kw)
    loader = packer.PackLoader(packer.load(path), 2, device="cpu", seed=5, dense=dense)
    it = iter(loader)
    first = next(it)
    names = [p.name for p in mp.active_children()]
    return names, [first, *it]


def test_by_default_a_box_pack_has_a_worker_and_a_semantic_pack_none(packs) -> None:
    names, got = _workers_during_a_pass(packs["jpeg"], LSJ)
    assert names == ["imgpack-dense-host"]
    assert_same(got, _workers_during_a_pass(packs["jpeg"], LSJ, host="thread")[1])
    op = D.Compose([D.RandomResize(24, 40), D.FixedSizeCrop(24)])
    assert _workers_during_a_pass(packs["seg"], op)[0] == []
    assert _workers_during_a_pass(packs["seg"], op, host="process")[0] == ["imgpack-dense-host"]
    assert not mp.active_children()


def _ids_in_a_daemon(path: str, q) -> None:
    """A daemonic process (a DataLoader's worker, a pool's) may start no child."""
    import torch

    torch.set_num_threads(1)  # as DataLoader's workers: this test process ran OpenMP
    try:
        names, got = _workers_during_a_pass(Path(path), LSJ)
        q.put((names, [t["image_ids"].tolist() for _, t in got]))
    except BaseException as e:  # the parent sees it, not a hang
        q.put(repr(e))


def test_a_daemonic_process_makes_the_groups_on_its_thread(packs) -> None:
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_ids_in_a_daemon, args=(str(packs["jpeg"]), q), daemon=True)
    p.start()
    out = q.get(timeout=60)
    p.join(10)
    _, thread = _workers_during_a_pass(packs["jpeg"], LSJ, host="thread")
    assert out == ([], [t["image_ids"].tolist() for _, t in thread])


def test_a_worker_that_cannot_be_forked_leaves_the_thread_to_make_the_pass(
    packs, monkeypatch
) -> None:
    import packer.loading.dense_host as DH

    def no_fork(self, pack, setup) -> None:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(DH.HostWorker, "__init__", no_fork)
    said = r"could not start its host worker \(\[Errno 11\]"
    with failing_forks_forgotten(), pytest.warns(RuntimeWarning, match=said):
        names, got = _workers_during_a_pass(packs["raw"], LSJ)
    assert names == []
    assert_same(got, _workers_during_a_pass(packs["raw"], LSJ, host="thread")[1])
