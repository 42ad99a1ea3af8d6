"""Decoding a build's chunks of rows, each journaled once it is on disk: on the worker
pool (started early; the unfinished chunks retried once in a fresh pool after a worker
dies), in this process (one worker), or on the GPU (:mod:`packer.builder.gpu`).

On resume, the chunks the journal lists are hashed again first: one that did not reach
the disk before a power loss is redone.
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.connection import wait as mp_wait
from pathlib import Path
from typing import Any

from .._fs import default_workers
from ..errors import WorkerDiedError
from ..imaging.decode import ResizeSpec
from ..pack.writer import digest
from ..sources.scan import Scan
from . import workers as build_workers
from .config import BuildConfig
from .tail import run_with_tail
from .workdir import JOURNAL, ROWS_FILE, WorkState
from .worker_handle import WorkerHandle
from .workers import (
    CHUNKS_DIR,
    _chunk_file,
    _decode_chunk,
    _encode_chunk,
    _start_method,
    _warm_up,
    _worker_init,
    _WorkerState,
)

log = logging.getLogger(__name__)

# what a chunk's work returns, to ``record``: (chunk, skips [[row, reason]], source sizes
# [[w, h]], SHA-256 of its bytes, the worker's time split or None (GPU path), and for
# --store jpeg a dict of more journal fields: lengths, stored sizes, re-encoded count)
_ChunkResult = tuple[Any, ...]
_ChunkFn = Callable[[tuple[int, int, list[str]]], _ChunkResult]


def decode_all(
    scan: Scan,
    config: BuildConfig,
    work: Path,
    state: WorkState,
    chunks: list[tuple[int, int, list[str]]],
    row: int,
    pool: ProcessPoolExecutor | None,
    new_pool: Callable[[], ProcessPoolExecutor],
    progress: Callable[[int], None] | None,
    on_start: Callable[[int, int], None] | None,
    times: dict[str, Any],
    write_plan: Callable[[], None],
    device: Any = None,
) -> tuple[float, int]:
    """Decode every chunk that ``state.done`` lacks into the work dir, journaling each.

    A worker that dies breaks the pool; the unfinished chunks are retried once in
    a fresh one (``new_pool()``), and a second death raises WorkerDiedError.

    Returns when the first chunk arrived and how many images an earlier run had done.
    """
    n_total = len(scan.entries)
    done = state.done
    _drop_unwritten(config, work, done, chunks, row)
    t_first: list[float] = []
    pending = [c for c in chunks if c[0] not in done]
    resumed = sum(len(c[2]) for c in chunks if c[0] in done)
    if on_start:
        on_start(n_total, resumed)
    if resumed:
        log.info("resuming %s: %d of %d images already done", work, resumed, n_total)
    if not pending:
        return (t_first or [time.perf_counter()])[0], resumed

    with open(work / JOURNAL, "a", encoding="utf-8") as journal:
        unsynced: list[int] = []  # images of chunks journaled but not yet fsynced

        def record(res: _ChunkResult, sync: bool = True) -> None:
            """Journal one finished chunk (its line fsynced, or with ``sync`` False left
            for the next record's fsync), then report it: ``progress`` hears of a chunk
            only once its line is fsynced (what a rerun would keep)."""
            t = time.perf_counter()
            chunk, skips, sizes, sha, chunk_times = res[:5]
            rec = {"chunk": chunk, "skips": skips, "sizes": sizes, "sha": sha}
            if len(res) > 5:  # --store jpeg: each image's stored length and size
                rec.update(res[5])
            if chunk_times is not None:  # None from the GPU path: no worker split
                times["chunks"].append(chunk_times)
            journal.write(json.dumps(rec, ensure_ascii=False) + "\n")
            unsynced.append(len(sizes))
            if sync:
                journal.flush()
                os.fsync(journal.fileno())
                times["journal_fsyncs"] += 1
            times["journal"] += time.perf_counter() - t
            done[chunk] = rec
            if not t_first:
                t_first.append(time.perf_counter())
            if sync:
                reported = list(unsynced)
                unsynced.clear()
                for n in reported if progress else ():
                    progress(n)

        if device is not None:  # --device cuda: batched on the GPU, the rest on the workers
            from .gpu import decode_chunks_batched

            try:
                decode_chunks_batched(
                    pending, config.spec, str(work / ROWS_FILE), device, pool, record, write_plan,
                    config._gpu,
                )  # fmt: skip
            except BrokenProcessPool:
                raise WorkerDiedError(
                    "a CPU worker or GPU decoder process of the build died (killed, or out "
                    "of memory); "
                    f"{len(done)} of {len(chunks)} chunks are kept in the work folder: run "
                    "the same command again to resume"
                ) from None
        elif pool is None:  # in this process: no signal or parent-death handling of a worker
            _decode_here(config, work, pending, record, write_plan)
        else:
            _decode_on_pool(
                config, pool, new_pool, len(chunks), pending, done, record, times, write_plan,
                (work / ROWS_FILE, row),
            )  # fmt: skip
    return (t_first or [time.perf_counter()])[0], resumed


def _drop_unwritten(
    config: BuildConfig,
    work: Path,
    done: dict[int, dict[str, Any]],
    chunks: list[tuple[int, int, list[str]]],
    row: int,
) -> None:
    """Forget the journaled chunks whose bytes on disk do not hash to the journal's."""
    if config.kind.chunk_files and (work / ROWS_FILE).exists():
        (work / CHUNKS_DIR).mkdir(exist_ok=True)
        for k in [k for k in done if k < len(chunks)]:
            try:
                ok = digest(_chunk_file(work, k).read_bytes()) == done[k]["sha"]
            except OSError:
                ok = False
            if not ok:
                log.info("chunk %d of %s did not reach the disk; redoing it", k, work)
                del done[k]
    elif done and (work / ROWS_FILE).exists():
        # The journal is fsynced per chunk, the data only at the end: after a power
        # loss a listed chunk may not have reached the disk. Its SHA-256 tells.
        with open(work / ROWS_FILE, "rb") as f:
            for k in [k for k in done if k < len(chunks)]:
                f.seek(chunks[k][1] * row)
                if digest(f.read(len(chunks[k][2]) * row)) != done[k]["sha"]:
                    log.info("chunk %d of %s did not reach the disk; redoing it", k, work)
                    del done[k]


def _decode_here(
    config: BuildConfig,
    work: Path,
    pending: list[tuple[int, int, list[str]]],
    record: Callable[[_ChunkResult], None],
    write_plan: Callable[[], None],
) -> None:
    """The chunks decoded one after another in this process (one worker)."""
    # the chunk functions read the worker state from their own module's global
    build_workers._worker = _WorkerState(
        str(work / ROWS_FILE), config.spec, store_options(config), t_free=time.perf_counter()
    )
    write_plan()
    try:
        for c in pending:
            record(_chunk_fn(config)(c))
    finally:
        build_workers._worker.close()
        build_workers._worker = None


def _decode_on_pool(
    config: BuildConfig,
    pool: ProcessPoolExecutor,
    new_pool: Callable[[], ProcessPoolExecutor],
    n_chunks: int,
    pending: list[tuple[int, int, list[str]]],
    done: dict[int, dict[str, Any]],
    record: Callable[[_ChunkResult], None],
    times: dict[str, Any],
    write_plan: Callable[[], None],
    rows: tuple[Path, int] | None = None,
) -> None:
    """The chunks decoded on the worker pool; after a worker dies, the unfinished ones
    once more on a fresh pool (``new_pool()``), and a second death is WorkerDiedError.
    ``rows``: the rows file and a row's bytes, where the last wave of chunks is cut into
    parts (:mod:`packer.builder.tail`; not for a kind that writes a file per chunk)."""
    workers = min(config.workers or default_workers(), n_chunks)

    def run(on: ProcessPoolExecutor, chunks: list[tuple[int, int, list[str]]]) -> bool:
        if rows is None or config.kind.chunk_files:
            return _run_chunks(on, chunks, done, record, _chunk_fn(config), times, write_plan)
        return run_with_tail(
            on, chunks, workers, rows[0], rows[1], done, record, _chunk_fn(config), times,
            write_plan,
        )  # fmt: skip

    if run(pool, pending):
        return
    # kill -9 or the OOM killer. Perhaps a one-off (several big images at once,
    # an operator's kill): the unfinished chunks get one fresh pool.
    stop_pool(pool)
    left = [c for c in pending if c[0] not in done]
    log.warning("a decode worker died; retrying %d unfinished chunks", len(left))
    retry = new_pool()
    try:
        ok = run(retry, left)
    finally:
        stop_pool(retry)
    if not ok:  # the pool cannot tell which image a dead worker was on
        raise WorkerDiedError(
            "a decode worker died twice (killed, or out of memory: a very large "
            f"image can need GBs to decode); {len(done)} of {n_chunks} chunks are "
            "kept in the work folder: run the same command again to resume, with "
            "fewer BuildConfig.workers or a lower BuildConfig.max_pixels if memory is short"
        )


def store_options(config: BuildConfig) -> tuple[str, int, int | None]:
    return (config.store, config.quality, config.max_side)


def _chunk_fn(config: BuildConfig) -> _ChunkFn:
    return _encode_chunk if config.kind.chunk_files else _decode_chunk


def _run_chunks(
    pool: ProcessPoolExecutor,
    chunks: list[tuple[int, int, list[str]]],
    done: dict[int, dict[str, Any]],
    record: Callable[[_ChunkResult], None],
    fn: _ChunkFn,
    times: dict[str, Any],
    after_submit: Callable[[], None],
) -> bool:
    """Run ``fn`` on ``chunks`` in ``pool``, recording each; False if the pool broke (a
    worker died), after recording every chunk that had finished before."""
    futures = []
    broken = False
    try:
        for c in chunks:
            futures.append(pool.submit(fn, c))
    except BrokenProcessPool:  # a worker died while chunks were still being submitted
        broken = True
    after_submit()  # this process's own work, while the workers decode
    if not broken:
        try:
            t = time.perf_counter()
            for fut in as_completed(futures):
                times["wait"] += time.perf_counter() - t
                record(fut.result())
                t = time.perf_counter()
            return True
        except BrokenProcessPool:
            pass
    for fut in futures:
        finished = fut.done() and not fut.cancelled() and fut.exception() is None
        if finished and fut.result()[0] not in done:
            record(fut.result())
    return False


def start_pool(
    workers: int,
    rows_path: Path,
    spec: ResizeSpec,
    store: tuple[str, int, int | None] = ("raw", 3, None),
    reads_bucket: bool = True,
) -> ProcessPoolExecutor:
    """A process pool whose workers boot now, while this process prepares the work dir.
    ``reads_bucket``: whether they will read object storage (their start method:
    :func:`packer.builder.workers._start_method`).

    concurrent.futures rather than multiprocessing.Pool: when a worker dies,
    multiprocessing.Pool loses its task and waits forever; this pool breaks,
    and every pending task raises BrokenProcessPool.
    """
    method = _start_method(reads_bucket)
    ctx = mp.get_context(method)
    if ctx.get_start_method() == "forkserver":
        # the fork server imports the decoder once; each worker forks from it ready to go
        ctx.set_forkserver_preload(["packer.builder.workers"])
    pool = ProcessPoolExecutor(
        workers,
        mp_context=ctx,
        initializer=_worker_init,
        initargs=(str(rows_path), spec, store, method == "fork", os.getpid()),
    )
    for _ in range(workers):  # processes start as tasks arrive
        pool.submit(_warm_up)
    return pool


class LazyPool:
    """A process pool that starts at its first task: the GPU build's CPU workers decode
    only what the GPU does not take, often nothing, and 16 booting workers took the
    cores the GPU pipeline's threads needed (the decoder's calls ran slower until the
    pool had booted: docs/PERFORMANCE.md, section "Figures behind the code", row "GPU
    build's lazy pool"). ``start()``
    makes the pool; :func:`stop_pool` and ``shutdown`` work on one never started."""

    def __init__(self, start: Callable[[], ProcessPoolExecutor]) -> None:
        self._start = start
        self._pool: ProcessPoolExecutor | None = None
        self._closed = False
        self._lock = threading.Lock()

    @property
    def started(self) -> bool:
        return self._pool is not None

    @property
    def _processes(self) -> Any:  # stop_pool's handle on the workers
        return None if self._pool is None else getattr(self._pool, "_processes", None)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            if self._pool is None:
                self._pool = self._start()
            pool = self._pool
        return pool.submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closed = True
            pool = self._pool
        if pool is not None:
            pool.shutdown(wait=wait, cancel_futures=cancel_futures)


def finish_pool(pool: ProcessPoolExecutor | LazyPool, timeout: float = 30.0) -> dict[str, int]:
    """The end of a build whose tasks are all done: the workers exit on the executor's
    sentinels. One still alive ``timeout`` seconds later is stuck, not working (seen
    once in the suite: a worker waiting forever for the task queue's lock, which a dead
    sibling held), and is killed rather than left to hang the build's last step.
    Returns :func:`release_pool`'s counts."""
    return release_pool(pool, timeout)()


def release_pool(
    pool: ProcessPoolExecutor | LazyPool, timeout: float = 30.0
) -> Callable[[], dict[str, int]]:
    """:func:`finish_pool` in two halves: the workers are told to exit now (the
    executor's sentinels, sent by its own thread) and this returns at once; the returned
    call waits for them (killing one still alive ``timeout`` seconds after the release).
    A build releases its pool when the last chunk is in and waits only after the pack is
    in place, so the workers' exits overlap the final fsync, manifest and rename.

    Once a worker has died (by a signal: no worker of a finished build exits so), the
    others are killed at once, not at the bound: the dead one may have held the task
    queue's lock, which they would wait for forever. The call returns
    ``{"died": ..., "killed": ...}``: workers that ended by a signal, not killed by
    this call, and workers it killed (``BuildResult.extra["workers_died"]``,
    ``["workers_killed"]``; both 0 in a sound build). When it returns every worker has
    ended, and the executor's own thread, which reaps them, has recorded their exit
    codes (``Process.exitcode``; a bound of :data:`_REAP_WAIT_S`); this never reaps,
    polls or signals one by its pid (:class:`packer.builder.worker_handle.WorkerHandle`).
    """
    executor = getattr(pool, "_pool", pool)  # a LazyPool's executor (None: never started)
    manager = getattr(executor, "_executor_manager_thread", None)  # gone after shutdown
    workers = [WorkerHandle(p) for p in (getattr(pool, "_processes", None) or {}).values()]
    pool.shutdown(wait=False)
    deadline = time.monotonic() + timeout

    def dead() -> bool:  # one ended by a signal (the executor: "broken"): it may hold the lock
        return bool(getattr(executor, "_broken", False)) or any(w.died() for w in workers)

    def wait() -> dict[str, int]:
        try:
            left = [w for w in workers if not w.ended()]
            while left and not dead():
                now = time.monotonic()
                if now >= deadline:
                    break
                step = deadline - now
                if any(w.ended() and w.exit_code() is None for w in workers):
                    # its status not readable yet (a fork server's child; or reaped by
                    # the executor's thread, not recorded yet): look again soon
                    step = min(step, _STATUS_POLL_S)
                mp_wait([w.sentinel for w in left if w.sentinel is not None], step)
                left = [w for w in left if not w.ended()]
            killed = [w for w in workers if not w.ended() and w.kill()]
            if killed:  # SIGKILL ends them at once
                mp_wait([w.sentinel for w in killed if w.sentinel is not None], _REAP_WAIT_S)
            if manager is not None and workers:
                manager.join(_REAP_WAIT_S)  # it reaps them and records their exit codes
            died = sum(1 for w in workers if w not in killed and w.died())
            return {"died": died, "killed": len(killed)}
        finally:
            for w in workers:
                w.close()

    return wait


_STATUS_POLL_S = 0.05  # an ended worker's exit code, recorded by another thread
_REAP_WAIT_S = 10.0  # SIGKILLed workers' ends; the executor's thread's, once they ended


def stop_pool(pool: ProcessPoolExecutor | LazyPool) -> None:
    """End the workers now, whatever they are doing (Ctrl-C, a dead sibling, an error)."""
    # the executor has no terminate(); its process table is the only handle on them
    # (killed through a pidfd: never a pid the executor's thread has reaped meanwhile)
    for p in list((getattr(pool, "_processes", None) or {}).values()):
        w = WorkerHandle(p)
        try:
            if not w.ended():
                w.kill()
        finally:
            w.close()
    pool.shutdown(wait=True, cancel_futures=True)
