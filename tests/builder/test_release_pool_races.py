"""release_pool and stop_pool (packer.builder.chunks) beside the executor's own thread,
which reaps the same workers. A hook on os.waitpid holds that thread just after it has
reaped a worker, before it records the exit code (the window in which
Process.is_alive() says "alive": waitpid gives ECHILD), until some thread joins it (as
the end of release_pool's wait does, and a shutdown with wait=True); another thread's
waitpid of the ended worker waits for that reap first. No timing decides the order."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from multiprocessing.connection import wait as mp_wait

import pytest

from packer.builder.chunks import release_pool, stop_pool

WAIT_S = 20.0  # a bound on each hand-off, so a broken schedule fails rather than hangs


def _nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


class _Reaping:
    """The hook (see the module docstring) on ``pool``'s one worker. ``signals``: every
    signal a thread other than the executor's sends to the worker's pid by its number."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, pool: ProcessPoolExecutor) -> None:
        (self.proc,) = pool._processes.values()  # type: ignore[attr-defined]
        self.pid = self.proc.pid
        self.manager = pool._executor_manager_thread  # type: ignore[attr-defined]
        self.reaped, self.go = threading.Event(), threading.Event()
        self.signals: list[int] = []
        real_waitpid, real_kill, real_join = os.waitpid, os.kill, self.manager.join

        def waitpid(pid: int, options: int) -> tuple[int, int]:
            if pid != self.pid:
                return real_waitpid(pid, options)
            if threading.current_thread() is not self.manager:
                if self.ended():  # the executor's thread reaps it first
                    assert self.reaped.wait(WAIT_S), "the executor's thread never reaped it"
                return real_waitpid(pid, options)
            got = real_waitpid(pid, options)
            if got[0] == pid:
                self.reaped.set()
                assert self.go.wait(WAIT_S), "nobody joined the executor's thread"
            return got

        def kill(pid: int, sig: int) -> None:
            if pid == self.pid and threading.current_thread() is not self.manager:
                self.signals.append(sig)
            real_kill(pid, sig)

        def join(timeout: float | None = None) -> None:
            self.go.set()
            real_join(timeout)

        monkeypatch.setattr(os, "waitpid", waitpid)
        monkeypatch.setattr(os, "kill", kill)
        monkeypatch.setattr(self.manager, "join", join)

    def ended(self) -> bool:
        return bool(mp_wait([self.proc.sentinel], 0))

    def finish(self) -> None:
        self.go.set()
        self.manager.join(WAIT_S)
        assert not self.manager.is_alive()


@pytest.fixture
def pool() -> Iterator[ProcessPoolExecutor]:
    p = ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"))
    p.submit(_nap, 0.0).result(timeout=60)  # started
    yield p
    p.shutdown(wait=False, cancel_futures=True)


def test_a_worker_that_exited_and_was_reaped_is_not_killed(
    pool: ProcessPoolExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker exits on its sentinel; the executor's thread has reaped it and not
    recorded its exit code when release_pool looks. Before, is_alive() (ECHILD) called
    it alive: the wait spun to the bound, then SIGKILLed its pid (by then free, or any
    other process's) and counted a sound worker killed."""
    hook = _Reaping(monkeypatch, pool)
    got = release_pool(pool, timeout=10.0)()
    assert hook.reaped.is_set()
    assert got == {"died": 0, "killed": 0}
    assert hook.signals == []  # no signal to a pid that is no longer the worker's
    assert not hook.proc.is_alive() and hook.proc.exitcode == 0  # recorded: exact now
    hook.finish()


def test_a_worker_killed_at_the_bound_is_not_alive_when_the_wait_returns(
    pool: ProcessPoolExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flaky test's case (tests/builder/test_build_timeline.py): the worker is busy
    past the bound and killed; the executor's thread reaps it and is held before it
    records the exit code. Before, the wait's join got ECHILD and returned; the test's
    is_alive() (ECHILD again) saw the killed worker "alive"."""
    pool.submit(_nap, 600.0)  # busy far past the bound
    hook = _Reaping(monkeypatch, pool)
    wait = release_pool(pool, timeout=1.0)
    assert not hook.ended()  # released, not waited for
    got = wait()
    assert got == {"died": 0, "killed": 1} and hook.reaped.is_set()
    assert not hook.proc.is_alive() and hook.proc.exitcode == -signal.SIGKILL
    hook.finish()


def test_stop_pool_sends_no_signal_to_a_reaped_worker(
    pool: ProcessPoolExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker died (killed by someone else); the executor's thread has reaped it and
    not recorded it when stop_pool kills the workers: before, it SIGKILLed that pid
    (free by then, or another process's)."""
    hook = _Reaping(monkeypatch, pool)
    os.kill(hook.pid, signal.SIGKILL)
    assert hook.reaped.wait(WAIT_S)
    hook.signals.clear()
    stop_pool(pool)  # its shutdown joins the executor's thread
    assert hook.signals == []
    assert hook.proc.exitcode == -signal.SIGKILL


def _ignore_sigterm() -> None:  # as a build's workers (packer.builder.workers)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _pid_after(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def test_a_dead_worker_gets_its_sibling_killed_at_once() -> None:
    """The dead-sibling rule reads the dead one's exit without reaping it: one worker
    SIGKILLed, its sibling busy past a long bound (the executor's SIGTERM ignored, as a
    build's workers do) is killed at once; one died, one killed."""
    ctx = mp.get_context("spawn")
    pool = ProcessPoolExecutor(2, mp_context=ctx, initializer=_ignore_sigterm)
    pids: set[int] = set()
    while len(pids) < 2:  # both workers up (their initializer run)
        futs = [pool.submit(_pid_after, 0.3) for _ in range(2)]
        pids |= {f.result(timeout=60) for f in futs}
    procs = list(pool._processes.values())  # type: ignore[attr-defined]
    busy = [pool.submit(_nap, 600.0) for _ in range(2)]
    os.kill(procs[0].pid, signal.SIGKILL)
    t = time.monotonic()
    got = release_pool(pool, timeout=120.0)()
    assert time.monotonic() - t < 60  # not the bound
    assert got == {"died": 1, "killed": 1}, got
    assert [p.exitcode for p in procs] == [-signal.SIGKILL, -signal.SIGKILL]
    assert all(f.done() for f in busy)
