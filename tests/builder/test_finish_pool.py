"""The end of a build never hangs on a stuck worker (packer.builder.chunks.finish_pool):
workers exit on the executor's sentinels, and one still alive after the bound is killed."""

from __future__ import annotations

import multiprocessing as mp
import time
from concurrent.futures import ProcessPoolExecutor

from packer.builder.chunks import LazyPool, finish_pool


def _nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def _pool() -> ProcessPoolExecutor:  # a fresh interpreter per worker, as bucket builds use
    return ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"))


def test_a_worker_still_busy_past_the_bound_is_killed_not_waited_for() -> None:
    pool = LazyPool(_pool)
    pool.submit(_nap, 0.0).result(timeout=60)  # started
    pool.submit(_nap, 600.0)  # a worker that will not come back in time
    (proc,) = pool._processes.values()
    t = time.monotonic()
    finish_pool(pool, timeout=1.0)
    assert time.monotonic() - t < 30
    assert not proc.is_alive() and proc.exitcode != 0  # killed
