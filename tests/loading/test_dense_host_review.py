"""``DenseConfig(host="process")`` under review (review7b of e54e82a): the batches the
thread makes, also where the producer's half fails (a damaged JPEG, a group the device
cannot hold), where the worker dies between two requests, where the pack's path no
longer leads to the pack the loader holds (replaced, a relative path after a chdir, a
reader bound raised by ``packer.load(max_pixels=)``), and where Ctrl-C reaches the
worker (the process group's SIGINT)."""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import signal
import warnings
from pathlib import Path

import pytest
import torch
from test_dense_host import LSJ

import packer
from helpers.dense_batches import assert_same, break_jpeg_end, coco_packs, host_workers
from helpers.dense_data import make_truth, write_coco
from packer.builder.config import BuildConfig
from packer.builder.dense import DenseOptions
from packer.errors import PackFormatError
from packer.loading.dense_host import forkable
from packer.loading.dense_pass import DenseConfig

pytestmark = pytest.mark.skipif(
    not forkable(), reason="the worker is forked here (not on Windows or macOS)"
)


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """test_dense_host's COCO packs (instance masks, boxes) of 10 images: JPEG and raw."""
    return coco_packs(tmp_path_factory.mktemp("review"))


def _loader(pack, host: str, group=3, bs=2, **kw) -> packer.PackLoader:
    dense = DenseConfig(LSJ, "padded", group=group, host=host)
    return packer.PackLoader(pack, bs, device="cpu", seed=5, shuffle=False, dense=dense, **kw)


def _ids(loader) -> tuple[list[list[int]], BaseException | None]:
    got: list[list[int]] = []
    try:
        for _, t in loader:
            got.append(t["image_ids"].tolist())
    except Exception as e:
        return got, e
    return got, None


def _ours(said) -> list[str]:
    return [str(w.message) for w in said if "imgpack" in str(w.message)]


def test_a_damaged_jpeg_fails_where_the_thread_fails(packs, tmp_path) -> None:
    """Image 4's JPEG truncated: the producer's decode of the group fails. The batches
    before image 4's come first, then its error, as with host="thread" (the worker made
    the group's host half; the producer met the error in its own half)."""
    break_jpeg_end(packs["jpeg"], tmp_path / "bad", 4)
    got = {}
    for host in ("thread", "process"):
        ids, e = _ids(_loader(packer.load(tmp_path / "bad"), host))
        assert isinstance(e, PackFormatError) and "image 4" in str(e), (host, e)
        got[host] = (ids, str(e))
    assert got["process"] == got["thread"] and len(got["thread"][0]) == 2
    assert not host_workers()


def test_a_group_the_device_cannot_hold_is_made_batch_by_batch(packs, monkeypatch) -> None:
    """The group's kernels fail (the device's memory) while one batch's do not: every
    batch comes, and the warning naming DenseConfig(group=1) is said once, as with
    host="thread"."""
    import packer.augment.dense_batched as ADB

    real = ADB.on_device

    def no_room_for_groups(plan, images, *args, **kw):
        if len(images) > 2:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(plan, images, *args, **kw)

    monkeypatch.setattr(ADB, "on_device", no_room_for_groups)
    got = {}
    for host in ("thread", "process"):
        with pytest.warns(RuntimeWarning) as said:
            got[host] = list(_loader(packer.load(packs["raw"]), host))
        ours = _ours(said)
        assert len(ours) == 1 and "a group of 3 dense batches failed" in ours[0], ours
    assert len(got["thread"]) == 5
    assert_same(got["process"], got["thread"])


def test_a_worker_killed_between_requests_leaves_the_thread_to_finish(packs) -> None:
    """The worker killed while the pass still has groups to ask for: the next request
    meets a closed pipe. One warning, and the thread makes the rest: the same batches."""
    thread = list(_loader(packer.load(packs["raw"]), "thread", group=1, bs=1))
    loader = _loader(packer.load(packs["raw"]), "process", group=1, bs=1, prefetch=1)
    it = iter(loader)
    first = next(it)
    (worker,) = host_workers()
    # the producer thread may meet the closed pipe at once, before the rest is asked for
    with pytest.warns(RuntimeWarning) as said:
        os.kill(worker.pid, signal.SIGKILL)
        worker.join(10)
        assert worker.exitcode == -signal.SIGKILL
        rest = list(it)
    ours = _ours(said)
    assert len(ours) == 1 and "host worker ended" in ours[0], ours
    assert_same([first, *rest], thread)
    assert not host_workers()


def test_ctrl_c_reaches_the_worker_quietly(packs, capfd) -> None:
    """Ctrl-C signals the whole process group: the worker leaves the interrupt to the
    training process (which closes the pass) and keeps working, printing no traceback
    of its own; the pass goes on with no warning, the same batches."""
    thread = list(_loader(packer.load(packs["jpeg"]), "thread", group=1))
    loader = _loader(packer.load(packs["jpeg"]), "process", group=1, prefetch=1)
    it = iter(loader)
    first = next(it)
    (worker,) = host_workers()
    os.kill(worker.pid, signal.SIGINT)
    worker.join(0.5)  # a worker that took the interrupt has ended by now
    assert worker.is_alive()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        rest = list(it)
    assert _ours(said) == []
    assert_same([first, *rest], thread)
    err = capfd.readouterr().err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert not host_workers()


@pytest.fixture
def two_packs(tmp_path: Path) -> tuple[Path, Path]:
    """Two raw packs of one size (40x48) and 10 images: COCO instances, and the same
    images with other annotations (COCO person keypoints)."""
    truths = make_truth(10, ext=".jpg")
    write_coco(tmp_path / "a", truths)
    write_coco(tmp_path / "b", truths[::-1], keypoints=True)
    cfg = BuildConfig(
        workers=1,
        size=(40, 48),
        resize="pad",
        dense=DenseOptions(format="coco", split="train2017"),
    )
    return (
        packer.build_pack(tmp_path / "a", tmp_path / "pa", cfg).path,
        packer.build_pack(tmp_path / "b", tmp_path / "pb", cfg).path,
    )


def test_a_pack_replaced_at_its_path_is_not_read_by_the_worker(two_packs, tmp_path) -> None:
    """The loader holds pack A; a rebuild then renames pack B into A's path (as a build
    with overwrite does). The batches are A's images with A's targets, as the thread
    makes them: never B's targets on A's images."""
    a, b = two_packs
    thread = list(_loader(packer.load(a), "thread"))
    live = tmp_path / "live"
    shutil.copytree(a, live)
    pack = packer.load(live)
    loader = _loader(pack, "process")
    live.rename(tmp_path / "old")
    shutil.copytree(b, live)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        got = list(loader)
    assert _ours(said) == []
    assert_same(got, thread)


def test_a_relative_path_after_a_chdir_is_not_reopened(two_packs, monkeypatch) -> None:
    """A pack opened by a relative path, the working directory changed before the pass
    (as a training script's output folder): the worker makes the groups, no warning."""
    a, _ = two_packs
    thread = list(_loader(packer.load(a), "thread"))
    monkeypatch.chdir(a.parent)
    loader = _loader(packer.load(a.name), "process")
    monkeypatch.chdir(a.parent.parent)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        got = list(loader)
    assert _ours(said) == []
    assert_same(got, thread)


def test_a_worker_sending_an_answer_no_one_reads_ends_at_close(packs) -> None:
    """The pass ends while its worker sends answers larger than the pipe holds (a COCO
    group's masks), and another process forked later holds the pipe's end too (a second
    pass's worker, zip(loader, loader); a DataLoader's workers): closing does not wait
    on that copy of the pipe, the worker ends on its own, not killed."""
    import numpy as np

    from packer.loading.dense_host import HostWorker

    pack = packer.load(packs["jpeg"])
    setup = _loader(pack, "process")._dense
    rows = np.arange(600) % 10  # an answer of about 0.7 MB
    first = HostWorker(pack, setup)
    later = HostWorker(pack, setup)  # holds first's end of its pipe (forked after it)
    try:
        first.submit([(0, rows)], (5, 0, 0))
        first.submit([(1, rows)], (5, 0, 0))
        first.close(wait=3.0)
        assert first.proc.exitcode == 0  # ended, not killed after the wait
    finally:
        later.close()
    assert not host_workers()


def test_a_loader_forked_while_a_worker_starts_starts_its_own(packs, tmp_path) -> None:
    """A process forked (DataLoader-style) while a producer thread here starts its
    worker: the child's passes start their own workers and finish, the same batches."""
    import packer.loading.dense_host as DH

    loader = _loader(packer.load(packs["raw"]), "process")
    thread = list(_loader(packer.load(packs["raw"]), "thread"))
    out = tmp_path / "forked.pt"

    def child() -> None:
        torch.set_num_threads(1)  # as DataLoader's workers: this process may have run OpenMP
        torch.save(list(loader), out)
        os._exit(0)

    ctx = mp.get_context("fork")
    with DH._STARTING:  # as a producer thread starting a worker at the moment of the fork
        p = ctx.Process(target=child)
        p.start()
    p.join(30)
    if p.is_alive():
        p.kill()
        p.join()
    assert p.exitcode == 0
    assert_same(torch.load(out), thread)


def test_a_pass_stopped_while_its_worker_is_silent_ends_it(packs, monkeypatch) -> None:
    """The worker answers once, then takes its requests without answering (a group that
    takes long; a worker stuck): closing the loader mid-pass stops the producer's wait
    for the answer and ends the worker, instead of leaving both behind."""
    import time

    import packer.loading.dense_host as DH

    serve = DH._serve

    class Silent:
        def __init__(self, conn) -> None:
            self.conn, self.n = conn, 0

        def recv_bytes(self):
            while True:
                msg = self.conn.recv_bytes()
                self.n += 1
                if self.n == 1 or msg == DH._STOP:
                    return msg

        def send_bytes(self, b) -> None:
            self.conn.send_bytes(b)

        def poll(self, timeout: float) -> bool:
            return self.conn.poll(timeout)

    monkeypatch.setattr(DH, "_serve", lambda conn, *a: serve(Silent(conn), *a))
    loader = _loader(packer.load(packs["raw"]), "process", group=1, prefetch=1)
    it = iter(loader)
    next(it)
    (worker,) = host_workers()
    t0 = time.monotonic()
    loader.close()
    assert time.monotonic() - t0 < 5.0
    worker.join(5)
    assert worker.exitcode == 0  # it took the stop: not left behind, not killed


def test_an_answer_carries_its_tensors_as_arrays(packs) -> None:
    """The worker's answer holds its tensors as arrays: the producer rebuilds them
    without torch's storage loader (a ``torch.load`` a storage, each a zip archive:
    unpickling took about as long as making the group's host half on the thread)."""
    import pickle

    import numpy as np

    from packer.loading.dense_host import HostWorker

    pack = packer.load(packs["jpeg"])
    setup = _loader(pack, "process")._dense
    worker = HostWorker(pack, setup)
    try:
        worker.submit([(0, np.arange(4)), (1, np.arange(4, 8))], (5, 0, 0))
        data = worker.conn.recv_bytes()  # the answer's bytes, as result() reads them
    finally:
        worker.close()
    status, made = pickle.loads(data)
    assert status == "ok" and made.collated[1]["host"]["boxes"].numel()
    assert b"_load_from_bytes" not in data and b"_rebuild_tensor" not in data
