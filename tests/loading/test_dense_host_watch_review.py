"""Review of the dense host worker's watch (a killed training process, a silent worker):
the wait for an answer counts only the time the producer looked (a process stopped and
resumed, with its worker, is not a hung worker), and ``DenseConfig._host_wait`` is
checked like the other fields."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import time
import types
from pathlib import Path

import pytest
from test_dense_host import LSJ

import packer
from helpers.dense_batches import coco_packs
from packer.errors import UsageError
from packer.loading.dense_host import forkable
from packer.loading.dense_pass import DenseConfig

pytestmark = pytest.mark.skipif(
    not forkable(), reason="the worker is forked here (not on Windows or macOS)"
)


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return coco_packs(tmp_path_factory.mktemp("watch"), semantic=False)


@pytest.mark.parametrize("wait", [0, -1.0, float("nan"), "5", None, True])
def test_a_host_wait_that_is_no_positive_number_is_refused(packs, wait) -> None:
    """0 stopped every pass's worker at its first look (a warning a pass), a negative
    wait the same, NaN never timed out, a string or None failed in float() (a
    traceback, no field named)."""
    dense = DenseConfig(LSJ, "padded", group=2, host="process", _host_wait=wait)
    with pytest.raises(UsageError, match=r"DenseConfig\._host_wait must be a positive"):
        packer.PackLoader(packer.load(packs["jpeg"]), 2, device="cpu", dense=dense)


def test_a_wait_resumed_after_a_stop_is_not_a_silent_worker(packs, monkeypatch) -> None:
    """The training process and its worker stopped together (Ctrl-Z, a job suspended)
    for longer than the wait, then resumed while the producer waits for an answer: the
    worker, healthy, was killed at the producer's first look (the stopped time counted
    as its silence). The clock jumps 100 s between two looks, as it does across a stop;
    the worker answers only once it has."""
    import packer.loading.dense_host as DH
    from packer.loading.dense_pass import dense_setup

    ctx = mp.get_context("fork")
    gate = ctx.Event()

    def gated(conn, pack, setup, theirs=None) -> None:
        theirs.close()
        conn.recv_bytes()
        gate.wait(30)
        conn.send_bytes(pickle.dumps(("ok", None)))

    real = time.monotonic
    looks = [0]

    def clock() -> float:
        looks[0] += 1
        if looks[0] < 2:
            return real()
        gate.set()  # resumed: the worker goes on with its group
        return real() + 100.0

    pack = packer.load(packs["jpeg"])
    setup, _ = dense_setup(pack, None, None, None, DenseConfig(LSJ, "padded", host="process"))
    monkeypatch.setattr(DH, "_serve", gated)
    worker = DH.HostWorker(pack, setup)
    monkeypatch.setattr(DH, "time", types.SimpleNamespace(monotonic=clock))
    try:
        worker.submit([(0, [0, 1])], (5, 0, 0))
        assert worker.result(None, wait=5.0) == ("ok", None)
        assert worker.proc.is_alive()
    finally:
        monkeypatch.setattr(DH, "time", time)
        worker.close()
    assert not mp.active_children()


def _zombie_or_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            f.read()
        return True  # still in the process table: running, dying or a zombie
    except FileNotFoundError:
        return False


def test_a_worker_stopped_for_its_silence_is_reaped_at_once(packs, monkeypatch) -> None:
    """A worker killed for not answering was left a zombie (<defunct>) for the rest of
    the pass, an epoch maybe: nothing waited for it until the pass closed its worker."""
    import threading

    import packer.loading.dense_host as DH

    ctx = mp.get_context("fork")
    pids = ctx.SimpleQueue()

    def hung(conn, *a) -> None:
        pids.put(os.getpid())
        threading.Event().wait()

    monkeypatch.setattr(DH, "_serve", hung)
    dense = DenseConfig(LSJ, "padded", group=1, host="process", _host_wait=0.3)
    loader = packer.PackLoader(
        packer.load(packs["jpeg"]), 2, device="cpu", seed=5, prefetch=1, dense=dense
    )
    it = iter(loader)
    with pytest.warns(RuntimeWarning, match=r"did not answer in 0.3 s and was stopped"):
        next(it)  # made by the thread, after the worker was stopped
        worker = pids.get()
        left = _zombie_or_alive(worker)
        rest = list(it)
    assert len(rest) == 4
    assert not left
