"""``imgpack build``: decode and resize every image, in parallel, into a pack.

Data flow (see docs/ARCHITECTURE.md)::

    scan + labels (class map, label table) -> plan (fingerprint) -> workers decode
    chunks of rows -> pwrite into rows file -> journal line per finished chunk ->
    compact (only if skips) -> labels, targets, manifest, tensordict meta -> rename
    the work folder into place

Crash safety: everything is written in a work folder beside DST
(:mod:`packer.builder.workdir`), which is also the lock against a second writer.
A worker writes its chunk of rows straight into the preallocated data file
(pwrite; the dataset is never held in RAM) and returns the chunk's SHA-256;
the parent records it in ``journal.jsonl`` (fsynced). A rerun of the same
command with the same inputs finds the journal, re-hashes the listed chunks
(a chunk that did not reach the disk before a power loss is redone) and
decodes only the rest; the data file is fsynced once, before the pack is
assembled; anything else about the partial folder that does not match
(other options, changed sources) starts it afresh. Finalizing is a sequence
of idempotent steps, each recoverable from what is on disk (see
:func:`_finalize`). Nothing appears at DST until the whole pack is complete.
A worker that dies (kill -9, out of memory) breaks the pool; the unfinished
chunks are retried once in a fresh pool, and a second death ends the build
with :class:`WorkerDiedError` (exit 1), the finished chunks kept for the rerun.

The plan (labels, destination checks, fingerprint) is :mod:`packer.builder.plan`'s; the
decode of the chunks (worker pool, in this process, or the GPU) and the resume check
are :mod:`packer.builder.chunks`'s.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from .._fs import default_workers, destination_error
from ..errors import UsageError
from ..pack.writer import block_rows_for
from .chunks import LazyPool, decode_all, release_pool, start_pool, stop_pool, store_options
from .config import GPU_TOLERANCE as GPU_TOLERANCE  # re-exported: old import path
from .config import STORES as STORES
from .config import BuildConfig, BuildResult, _Labels
from .finalize import _finalize
from .plan import check_destination, plan_fingerprint, plan_labels
from .timeline import Timeline
from .workdir import (
    ROWS_FILE,
    dest_lock,
    is_fresh_work_dir,
    prepare_work_dir,
    recover_trash,
    refuse_symlink_destination,
    start_plan,
    work_dir_for,
)
from .workers import _WORKER_STEPS as _WORKER_STEPS
from .workers import TEST_DEATH_ENV as TEST_DEATH_ENV
from .workers import _close_work_dir_fds as _close_work_dir_fds
from .workers import _decode_paths as _decode_paths
from .workers import reads_object_storage

__all__ = ["BuildConfig", "BuildResult", "build", "default_workers", "dest_lock", "work_dir_for"]


def _build_device(config: BuildConfig) -> Any:
    """None for the CPU path, else the torch.device of the batched GPU path.
    ``device="cuda"`` without CUDA is a usage error (exit 2)."""
    if config.device == "cpu" or not config.kind.gpu_build:
        return None
    import torch

    if not torch.cuda.is_available():
        if config.device == "auto":
            return None
        raise UsageError(
            f"BuildConfig.device {config.device}: no CUDA device is available to this "
            "process; use BuildConfig.device cpu (or auto, which falls back to the CPU)",
            field="BuildConfig.device",
        )
    device = torch.device("cuda" if config.device == "auto" else config.device)
    if device.index is not None and device.index >= torch.cuda.device_count():
        n = torch.cuda.device_count()
        raise UsageError(
            f"BuildConfig.device {config.device}: this process sees {n} CUDA "
            f"device{'s' * (n != 1)} (cuda:0 to cuda:{n - 1})",
            field="BuildConfig.device",
        )
    return device


def build(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    config: BuildConfig = BuildConfig(),
    progress: Callable[[int], None] | None = None,
    on_start: Callable[[int, int], None] | None = None,
    plan: _Labels | None = None,
) -> BuildResult:
    """Build one pack at ``dst`` from the images under folder ``src`` (a set, a bucket or
    a cluster build: :func:`packer.builder.api.build`, which decides and calls this).

    ``progress(n)`` is called in this process after each chunk with the number
    of images it finished (by the GPU path from its journal thread); ``on_start(total, already_done)`` once before work.
    Raises PackerError subclasses for unusable input; broken images are skipped
    and listed in the result. Interrupted builds resume when rerun.
    ``plan``: the labelled images to pack, already listed (a shard of a set).
    A bucket's tar shards are spooled beside DST while it runs, and removed when it
    ends (:mod:`packer.builder.formats.spool`; their removal is in ``seconds``).
    """
    from .formats.spool import spool_area

    with spool_area(dst) as spools:
        result = _build(src, dst, config, progress, on_start, plan)
        t = time.perf_counter()
        spools.remove()
        result.seconds += time.perf_counter() - t
    return result


def _build(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    config: BuildConfig,
    progress: Callable[[int], None] | None,
    on_start: Callable[[int, int], None] | None,
    plan: _Labels | None,
) -> BuildResult:
    """:func:`build`, inside its spool area."""
    t0 = time.perf_counter()
    timeline = Timeline(t0)  # the phases' ends, for benchmarks (packer.builder.timeline)
    config.validate()
    if config.shard_size is not None or config.append or config.engine != "local":
        # which build a job is, is packer.builder.api's decision: a set never reaches here
        raise UsageError(
            "this builds one pack: a pack set (BuildConfig.shard_size, append, engine ray) "
            "is built by packer.build_pack"
        )
    listing: ProcessPoolExecutor | None = None
    if plan is None:  # parquet, Arrow, tar, zip or a bucket read here (packer.sources)
        from .formats.base import source_plan

        listing = _listing_pool(src, dst, config)
        try:
            sourced = source_plan(src, dst, config)
        except BaseException:
            if listing is not None:
                stop_pool(listing)
            raise
        if sourced is not None:
            plan, src = sourced, sourced.scan.root
            config = replace(config, device="cpu")  # their bytes reach the CPU workers
    auto = config.device == "auto"
    try:
        device = None if auto else _build_device(config)
    except BaseException:
        if listing is not None:
            stop_pool(listing)
        raise
    given = Path(dst)
    # absolute first: the work folder's name comes from DST's, and "." has none
    src, dst = Path(src), Path(os.path.abspath(dst))
    if listing is not None and device is not None:  # a folder for the GPU: none early
        stop_pool(listing)
        listing = None
    refuse_symlink_destination(dst)  # before the scan: nothing is read for a DST we refuse
    # the CPU workers boot while the tree is scanned (a listed plan has no scan to wait on)
    # or, started above, while a source was listed
    if listing is not None:
        early = [listing]
    else:
        early = [_early_pool(config, dst)] if plan is None and device is None else [None]
    timeline.mark("pool_spawned")
    try:
        plan = plan_labels(src, config) if plan is None else plan
        timeline.mark("scanned")
        if auto:  # the faster way for this job (packer.builder.auto), known once it is listed
            from .auto import auto_device

            n = len(plan.scan.entries)
            device = auto_device(config, n, config.workers or default_workers())
        if device is not None and early[0] is not None:  # the GPU's workers start lazily
            stop_pool(early[0])
            early[0] = None
        check_destination(src, dst, config.overwrite)
        try:
            dst.parent.mkdir(parents=True, exist_ok=True)
            with dest_lock(dst) as work:
                timeline.mark("locked")
                recover_trash(dst)
                check_destination(src, dst, config.overwrite)  # again, now that we hold the lock
                result = _build_locked(
                    plan, dst, work, config, progress, on_start, t0, device, early, timeline
                )
                result.path = given
            now = time.perf_counter()
            timeline.mark("unlocked", now)
            result.seconds = now - t0  # the whole call: the workers' exit and the unlock too
            result.extra["timeline"] = timeline.as_dict()
            result.extra["t0_monotonic"] = t0
            return result
        except OSError as e:
            raise destination_error(e, dst) from None
    except BaseException:
        if early[0] is not None:  # not yet handed to _build_locked, which stops its own
            stop_pool(early[0])
        raise


def _listing_pool(src: Any, dst: Any, config: BuildConfig) -> ProcessPoolExecutor | None:
    """The CPU workers started before a source (parquet, tar, zip, a bucket) is listed,
    so that they boot while it is: when its images will be decoded on the CPU, DST is
    not a symbolic link, and the workers would be forked from this process now (no
    other thread; a bucket's client not yet used here: a worker forked later could not
    use its own, and is spawned, ~1 s for 16). None otherwise: the pool starts after
    the listing, as before."""
    from .workers import _start_method, client_used_here

    if config.device not in ("cpu", "auto") or config.engine != "local":
        return None
    texts = [os.fspath(x) for x in src] if isinstance(src, (list, tuple)) else [os.fspath(src)]
    if len(texts) == 1 and not any(ch in texts[0] for ch in "{*?[") and os.path.isdir(texts[0]):
        return None  # a folder (or a save_to_disk folder): its own early pool, after
    if isinstance(dst, str) and "://" in dst:
        return None
    if any("://" in t for t in texts) and client_used_here():
        return None  # its workers read the bucket: forked from here they could not
    if _start_method() != "fork":
        return None
    target = Path(os.path.abspath(dst))
    if target.is_symlink():
        return None  # refused below, before anything starts
    return _early_pool(config, target)


def _early_pool(config: BuildConfig, dst: Path) -> ProcessPoolExecutor | None:
    """The CPU build's worker pool, started before the scan so that its processes boot
    while the tree is listed: ``config.workers`` (or every core), writing into DST's
    work folder (:func:`work_dir_for`; the workers open the rows file at their first
    chunk). None for one worker (the build decodes in this process). A folder's workers
    read files; a source's are started here only where :func:`_listing_pool` found
    they fork (this process has not used its object-store client)."""
    workers = config.workers or default_workers()
    if workers <= 1:
        return None
    rows = work_dir_for(dst) / ROWS_FILE
    return start_pool(workers, rows, config.spec, store_options(config), reads_bucket=False)


def _build_locked(
    plan: _Labels,
    dst: Path,
    work: Path,
    config: BuildConfig,
    progress: Callable[[int], None] | None,
    on_start: Callable[[int, int], None] | None,
    t0: float,
    device: Any = None,
    early: list[ProcessPoolExecutor | None] | None = None,
    timeline: Timeline | None = None,
) -> BuildResult:
    """Build into the locked work folder ``work``. ``early``: a holder of the pool
    :func:`build` started before the scan (None in it: none started); this function
    takes it over (empties the holder) and stops or shuts it down. ``timeline``: where
    the phases' ends are marked (``BuildResult.extra["timeline"]``)."""
    timeline = timeline or Timeline(t0)
    spec = config.spec
    scan = plan.scan
    n_total = len(scan.entries)
    row = config.kind.row_bytes(spec.shape)
    block = block_rows_for(n_total)
    root = str(scan.root)
    items = getattr(scan, "chunk_items", None)  # a source's refs (packer.builder.formats.base)
    paths = items() if items else [os.path.join(root, e.rel) for e in scan.entries]
    chunks = [
        (k, k * block, paths[k * block : (k + 1) * block])
        for k in range((n_total + block - 1) // block)
    ]
    workers = min(config.workers or default_workers(), len(chunks))
    times: dict[str, Any] = {"chunks": [], "wait": 0.0, "journal": 0.0, "journal_fsyncs": 0}

    # started first: its processes boot while this one fingerprints and preallocates
    bucket = reads_object_storage(scan)  # else they fork, whatever this process did before

    def new_pool() -> ProcessPoolExecutor:
        return start_pool(workers, work / ROWS_FILE, spec, store_options(config), bucket)

    t = time.perf_counter()
    times["plan"] = t - t0
    pool: Any = None
    started = early[0] if early else None
    if early:
        early[0] = None  # this function's to stop from here
    if workers > 1:  # the GPU build's workers start when it first needs them
        pool = (started or new_pool()) if device is None else LazyPool(new_pool)
    elif started is not None:  # one chunk: decoded here, as without the early pool
        stop_pool(started)
    t_pool = time.perf_counter()
    times["pool_start"] = t_pool - t
    reap = _nothing  # the wait for the workers' exit: after the pack is in place
    try:
        # A fresh work folder needs no fingerprint to start: its plan (the fingerprint)
        # is written while the workers decode the first chunks, before the first
        # journal line (a folder with rows and no plan is discarded by a rerun).
        fresh = is_fresh_work_dir(work)
        fingerprint = None if fresh else plan_fingerprint(plan, config, device)
        t = time.perf_counter()
        times["fingerprint"] = t - t_pool
        state = prepare_work_dir(work, fingerprint, n_total * row)
        holder = [fingerprint]

        def write_plan() -> None:
            if holder[0] is None:
                t = time.perf_counter()
                holder[0] = plan_fingerprint(plan, config, device)
                start_plan(work, holder[0])
                times["fingerprint_overlapped"] = time.perf_counter() - t

        t_prepared = time.perf_counter()
        times["prepare"] = t_prepared - t
        timeline.mark("prepared", t_prepared)
        if state.assembled:
            t_first, resumed = t_prepared, n_total
            if on_start:
                on_start(n_total, n_total)
        else:
            t_first, resumed = decode_all(
                scan, config, work, state, chunks, row, pool, new_pool, progress, on_start, times,
                write_plan, device,
            )  # fmt: skip
            _mark_chunks(timeline, t_first, times["chunks"])
        t = time.perf_counter()
        timeline.mark("decoded", t)
        if pool is not None:  # the workers exit while the pack is finalized
            reap = release_pool(pool)
        times["pool_stop"] = time.perf_counter() - t
    except BaseException:
        if pool is not None:
            stop_pool(pool)
        raise
    write_plan()  # nothing was left to decode
    fingerprint = holder[0]
    assert fingerprint is not None
    t_decoded = time.perf_counter()
    ended = {"died": 0, "killed": 0}
    try:
        result = _finalize(
            plan, dst, work, config, state, block, resumed, t0, fingerprint, device, times,
            timeline,
        )  # fmt: skip
    finally:
        t = time.perf_counter()
        ended = reap() or _nothing()
        times["pool_join"] = time.perf_counter() - t
        timeline.mark("pool_joined")
    t_end = time.perf_counter()
    # where the time went, for benchmarks: setup (scan, plan, preallocate), the wait
    # for the first chunk (pool start + one chunk), then decoding
    result.extra = {
        "setup_s": round(t_prepared - t0, 3),
        "first_chunk_s": round(t_first - t_prepared, 3),
        "decode_s": round(t_decoded - t0, 3),
        "finalize_s": round(t_end - t_decoded, 3),
        **_time_split(times, workers, t_pool, t_prepared, t_decoded, t_end),
        # pool workers that ended by a signal at the build's end, and those its bound
        # killed (packer.builder.chunks.release_pool): 0 and 0 in a sound build
        "workers_died": ended["died"],
        "workers_killed": ended["killed"],
    }
    return result


def _nothing() -> dict[str, int]:
    return {"died": 0, "killed": 0}


def _mark_chunks(timeline: Timeline, t_first: float, chunks: list[dict[str, Any]]) -> None:
    """The decode's phases: the first task a worker started, the first chunk journaled,
    the last task a worker finished (from the workers' own clock readings)."""
    if chunks:
        timeline.mark("first_task_started", min(c["t_start"] for c in chunks))
    timeline.mark("first_chunk_journaled", t_first)
    if chunks:
        timeline.mark("last_task_ended", max(c["t_end"] for c in chunks))


def _time_split(
    times: dict[str, Any],
    workers: int,
    t_pool: float,
    t_prepared: float,
    t_decoded: float,
    t_end: float,
) -> dict[str, Any]:
    """Where a build's time went, for benchmarks: the parent's steps (seconds of wall
    time) and the workers' (seconds summed over workers: ``workers x wall`` in all).

    ``worker_idle`` counts a worker's time between chunks (hand-off, waiting for the
    parent) and before its first chunk after it started; ``worker_tail`` the time
    workers sat idle at the end while others finished the last chunks;
    ``worker_start`` the time from the pool's creation to the first chunk started.
    """
    chunks = times.pop("chunks")
    parent = {
        k: round(v, 3) if isinstance(v, float) else v for k, v in times.items() if k != "finalize"
    }
    parent.update({f"finalize_{k}": round(v, 3) for k, v in times.get("finalize", {}).items()})
    out: dict[str, Any] = {"parent": parent, "workers": workers}
    if chunks:
        steps = {k: round(sum(c[k] for c in chunks), 3) for k in _WORKER_STEPS}
        ends: dict[int, float] = {}
        starts: dict[int, float] = {}
        for c in chunks:
            pid = int(c["pid"])
            ends[pid] = max(ends.get(pid, 0.0), c["t_end"])
            starts[pid] = min(starts.get(pid, c["t_start"]), c["t_start"])
        last = max(ends.values())
        steps["tail"] = round(sum(last - e for e in ends.values()), 3)
        out["worker"] = steps
        out["worker_start_s"] = round(min(starts.values()) - t_pool, 3)
        out["first_start_after_prepared_s"] = round(min(starts.values()) - t_prepared, 3)
        out["last_chunk_end_to_decoded_s"] = round(t_decoded - last, 3)
        out["decode_window_s"] = round(last - min(starts.values()), 3)
        out["processes_used"] = len(ends)
    out["finalize_total_s"] = round(t_end - t_decoded, 3)
    return out
