"""The dense host worker as the default for a pack with boxes, under review (review8 of
4eb1b1d): every detection user on Linux now forks one a pass. The training process's
own signal handlers (a checkpoint on SIGTERM, a scheduler's SIGUSR1) are not run in the
worker, and ``terminate()`` ends it; a fork that fails is tried once a process (each
failed start leaves multiprocessing's pipe ends open); a pass of one group forks no
worker it cannot overlap with."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from test_dense_host import LSJ

import packer
import packer.loading.dense_host as DH
from helpers.dense_batches import assert_same, coco_packs, failing_forks_forgotten, host_workers
from packer.loading.dense_pass import DenseConfig

pytestmark = pytest.mark.skipif(
    not DH.forkable(), reason="the worker is forked here (not on Windows or macOS)"
)


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """test_dense_host's COCO packs (instance masks, boxes) of 10 images: JPEG and raw."""
    return coco_packs(tmp_path_factory.mktemp("default"))


def _loader(path: Path, host=None, bs=2, group=None, **kw) -> packer.PackLoader:
    dense = DenseConfig(LSJ, "padded", group=group, host=host)
    return packer.PackLoader(packer.load(path), bs, device="cpu", seed=5, dense=dense, **kw)


@pytest.mark.parametrize("term", ["handled", "ignored", "blocked"])
def test_the_training_process_signal_handlers_do_not_run_in_the_worker(packs, tmp_path, term):
    """A training script's handlers (a checkpoint written on SIGTERM, SLURM's SIGUSR1
    warning) were inherited by the fork: a signal to the process group ran them in the
    worker too (a second checkpoint writer), and ``terminate()`` (multiprocessing's, at
    exit too) left it running; so did SIGTERM ignored, or blocked in the thread that
    forks. Now the worker ignores the others and ends on SIGTERM."""

    def handler(sig, frame) -> None:  # what a trainer does: saves, marks, carries on
        (tmp_path / f"ran-{sig}-in-{os.getpid()}").write_text("x")

    on_term = signal.SIG_IGN if term == "ignored" else handler
    old = {signal.SIGTERM: signal.signal(signal.SIGTERM, on_term)}
    old[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, handler)
    # the producer thread, and so the worker, inherit this thread's mask
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM} if term == "blocked" else ())
    try:
        it = iter(_loader(packs["jpeg"], bs=1, prefetch=1))  # the pass stays open
        got = [next(it)]
        (w,) = host_workers()
        os.kill(w.pid, signal.SIGUSR1)
        w.terminate()
        w.join(5)
        alive = w.is_alive()
        if alive:
            w.kill()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "imgpack: the dense loader's host worker ended")
            got += list(it)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for s, h in old.items():
            signal.signal(s, h)
    assert not alive and w.exitcode == -signal.SIGTERM
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    assert_same(got, list(_loader(packs["jpeg"], "thread", bs=1)))


def test_a_fork_that_fails_is_tried_once_a_process(packs, monkeypatch) -> None:
    """A fork refused (RLIMIT_NPROC, memory) left multiprocessing's four pipe ends of
    the failed start open, and every pass tried again: 50 passes, 200 descriptors. Now
    the first failure is said once and the thread makes every pass after it."""
    tries = []

    def no_fork() -> int:
        tries.append(1)
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", no_fork)
    want = list(_loader(packs["raw"], "thread"))
    before = len(os.listdir("/proc/self/fd"))
    with failing_forks_forgotten(), warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        for _ in range(6):
            assert_same(list(_loader(packs["raw"])), want)
    ours = [str(w.message) for w in said if "host worker" in str(w.message)]
    assert len(tries) == 1 and len(ours) == 1 and "[Errno 11]" in ours[0]
    assert len(os.listdir("/proc/self/fd")) - before <= 4  # one failed start's pipes
    assert not host_workers()


@pytest.mark.parametrize(
    "kw", [dict(bs=1, indices=[3]), dict(bs=2, group=8), dict(bs=4, drop_last=True)]
)
def test_a_pass_of_one_group_forks_no_worker(packs, kw) -> None:
    """A pass of one group (a batch, a short validation set) gives the worker nothing to
    make ahead: the fork was its whole cost (12 -> 80 ms to the first batch beside a
    3 GB process). By default the thread makes it; host="process" still forks."""
    it = iter(_loader(packs["jpeg"], **kw))
    got = [next(it)]
    assert host_workers() == []
    got += list(it)
    assert_same(got, list(_loader(packs["jpeg"], "thread", **kw)))
    it = iter(_loader(packs["jpeg"], "process", **kw))
    got = [next(it)]
    assert len(host_workers()) == 1
    assert_same(got + list(it), list(_loader(packs["jpeg"], "thread", **kw)))
    assert not host_workers()


_FORKS_A_HELPER = """
import os, sys, multiprocessing as mp, warnings
import packer
from packer.loading.dense_pass import DenseConfig
from test_dense_host import LSJ
warnings.simplefilter("error", RuntimeWarning)
pack = packer.load(sys.argv[1])
dense = DenseConfig(LSJ, "padded", group=1)
it = iter(packer.PackLoader(pack, 1, prefetch=1, device="cpu", seed=5, dense=dense))
got = [next(it)]
(w,) = mp.active_children()
pid = os.fork()
if pid == 0:
    sys.exit(0)  # a helper forked with os.fork that ends the ordinary way: atexit runs
os.waitpid(pid, 0)
alive = w.is_alive()
got += list(it)  # a worker that ended would be said: a RuntimeWarning, an error here
print("alive", alive, len(got))
"""


def test_a_helper_forked_during_a_pass_leaves_its_worker_alone(packs, tmp_path) -> None:
    """A child forked with os.fork while a pass runs inherited multiprocessing's list of
    children: at its exit, multiprocessing's atexit hook sent the pass's worker SIGTERM
    (the parent's pass then went on without it, said) and failed to join it
    ("AssertionError: can only join a child process" printed by the child)."""
    script = tmp_path / "helper.py"
    script.write_text(_FORKS_A_HELPER)
    root = Path(__file__).resolve().parents[2]
    paths = [str(root), str(root / "tests"), str(root / "tests" / "loading")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    out = subprocess.run(
        [sys.executable, "-W", "ignore::DeprecationWarning", str(script), str(packs["jpeg"])],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert "can only join a child process" not in out.stderr
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["alive", "True", "10"]
