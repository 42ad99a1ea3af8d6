"""A build's end never waits on its pool's bound (packer.builder.chunks.release_pool):
every CPU worker lives until the build tells it to exit, whichever thread started it
(the GPU build starts its pool on a pipeline thread: packer.builder.chunks.LazyPool),
and a worker that died at the end does not leave its siblings to the 30 s kill."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

import packer.builder.chunks
from conftest import subprocess_env
from packer.builder.api import BuildConfig, build
from packer.builder.chunks import release_pool
from packer.builder.workers import _worker_init


@pytest.mark.parametrize("method", ["spawn", "fork", "forkserver"])
def test_cpu_workers_started_on_a_pipeline_thread_outlive_it(
    photos: Path, tmp_path: Path, batched_on_cpu: None, monkeypatch: pytest.MonkeyPatch,
    method: str,
) -> None:  # fmt: skip
    """The GPU build's CPU workers start on a reader thread (the first non-JPEG), which
    ends before the build does. They were bound to that thread (PR_SET_PDEATHSIG: its
    "parent" is the creating thread): with spawn (any process that used a bucket) or
    fork they were SIGKILLed as the readers ended, one holding the task queue's lock,
    and its sibling waited for the lock until the 30 s bound killed it."""
    monkeypatch.setattr(packer.builder.chunks, "_start_method", lambda *a: method)
    cfg = BuildConfig(size=(24, 20), workers=2, device="cuda")
    r = build(photos, tmp_path / "gpu", cfg)
    assert r.count == 33
    assert (r.extra["workers_died"], r.extra["workers_killed"]) == (0, 0)


def test_cpu_builds_count_no_dead_or_killed_worker(image_tree: Path, tmp_path: Path) -> None:
    r = build(image_tree, tmp_path / "p", BuildConfig(size=(32, 32), workers=2))
    assert (r.extra["workers_died"], r.extra["workers_killed"]) == (0, 0)


def _pid() -> int:
    return os.getpid()


def _pool_from_a_thread(method: str, rows: Path) -> tuple[ProcessPoolExecutor, list[int]]:
    """A build's pool whose workers a short-lived thread starts, as the GPU build's."""
    ctx = mp.get_context(method)
    pool = ProcessPoolExecutor(
        2, mp_context=ctx, initializer=_worker_init,
        initargs=(str(rows), None, ("raw", 3, None), False, os.getpid()),
    )  # fmt: skip
    pids: list[int] = []

    def start() -> None:
        futs = [pool.submit(_pid) for _ in range(2)]
        pids.extend(f.result(timeout=120) for f in futs)

    t = threading.Thread(target=start)
    t.start()
    t.join()
    return pool, pids


def test_the_thread_that_started_the_workers_may_end(tmp_path: Path) -> None:
    pool, _ = _pool_from_a_thread("spawn", tmp_path / "rows")
    procs = list(pool._processes.values())  # type: ignore[attr-defined]
    assert pool.submit(_pid).result(timeout=120) > 0  # still served, the thread gone
    assert release_pool(pool, timeout=120)() == {"died": 0, "killed": 0}
    assert [p.exitcode for p in procs] == [0, 0]


def _wchan(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return ""


@pytest.mark.skipif(not os.path.exists("/proc/self/wchan"), reason="needs Linux /proc")
def test_a_worker_killed_holding_the_queue_lock_gets_its_sibling_killed_not_waited_for(
    tmp_path: Path,
) -> None:
    """One worker killed (the OOM killer, an operator) once the work is done, while it
    held the task queue's lock (the idle worker reading the queue holds it; its sibling
    waits for it): the sibling can never take a sentinel, and is killed at once rather
    than waited for to the bound."""
    pool, _ = _pool_from_a_thread("spawn", tmp_path / "rows")
    procs = list(pool._processes.values())  # type: ignore[attr-defined]
    holder = None
    for _ in range(600):  # until one reads the queue's pipe and the other waits for the lock
        chans = {p.pid: _wchan(p.pid) for p in procs}
        readers = [p for p in procs if "pipe" in chans[p.pid]]
        if len(readers) == 1 and any("futex" in c for c in chans.values()):
            holder = readers[0]
            break
        threading.Event().wait(0.1)
    assert holder is not None, chans
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(60)
    t = time.monotonic()
    got = release_pool(pool, timeout=120)()
    assert got == {"died": 1, "killed": 1}
    assert time.monotonic() - t < 60  # not the bound: it could never have exited


_ORPHANING = """
import os, sys, threading
from packer.builder.chunks import start_pool
from packer.imaging.decode import ResizeSpec

def main():
    pids = []
    def start():  # on a thread that ends first, as the GPU build's readers
        pool = start_pool(2, sys.argv[1] + "/rows", ResizeSpec(8, 8))
        pids.extend(pool.submit(os.getpid).result(timeout=120) for _ in range(4))
        main.pool = pool
    t = threading.Thread(target=start)
    t.start()
    t.join()
    print(" ".join(str(p) for p in set(pids)), flush=True)
    sys.stdin.read()  # killed here

if __name__ == "__main__":
    main()
"""


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_killed_builds_workers_end_with_it(tmp_path: Path, method: str) -> None:
    """The workers watch the build's process (not the thread that started them): a
    build killed with SIGKILL leaves no worker behind."""
    script = tmp_path / "orphaning.py"
    script.write_text(_ORPHANING)
    env = {**subprocess_env(), "IMGPACK_BUILD_START": method}
    if method == "spawn":  # IMGPACK_BUILD_START names fork or forkserver only
        env.pop("IMGPACK_BUILD_START")
        script.write_text(_ORPHANING.replace(
            "from packer.builder.chunks import start_pool",
            "import packer.builder.chunks as c\nc._start_method = lambda *a: 'spawn'\n"
            "from packer.builder.chunks import start_pool",
        ))  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path)], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, env=env, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert pids and all(_exists(p) for p in pids)
    finally:
        proc.kill()
        proc.wait(60)
    for _ in range(600):  # the watchers' SIGKILL, at once; the forkserver's exit
        if not any(_exists(p) for p in pids):
            break
        threading.Event().wait(0.1)
    assert not [p for p in pids if _exists(p)]


def _exists(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
