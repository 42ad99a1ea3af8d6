"""``imgpack build``: decode and resize every image, in parallel, into a pack.

Data flow (see docs/ARCHITECTURE.md)::

    scan + labels (class map, label table) -> plan (fingerprint) -> workers decode
    chunks of rows -> pwrite into rows file -> journal line per finished chunk ->
    compact (only if skips) -> labels, targets, manifest, tensordict meta -> rename
    the work folder into place

Crash safety: everything is written in a work folder beside DST
(:mod:`packer.build.workdir`), which is also the lock against a second writer.
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

Labels (:mod:`packer.sources.labels`): the class folders (ImageFolder's indices), or the
``--classes`` map (a text file or a pack; a folder not in it is an error unless
``--allow-new-classes``), or a ``--labels`` table whose rows name images under SRC,
with optional ``--targets`` columns stored as float32 ``targets [N, K]``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import multiprocessing as mp
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from ..errors import InputError, UsageError, WorkerDiedError
from ..imaging.decode import ResizeSpec
from ..pack.format import FORMAT_VERSION, block_rows_for, digest, image_bytes, is_pack
from ..pack.reader import read_class_map
from ..sources.labels import apply_class_map, apply_table, read_table, resolve_classes
from ..sources.scan import Scan, list_images, scan_tree
from . import workers as build_workers
from .config import GPU_TOLERANCE as GPU_TOLERANCE  # re-exported: old import path
from .config import STORES as STORES
from .config import BuildConfig, BuildResult, _Labels
from .finalize import _finalize
from .workdir import (
    JOURNAL,
    ROWS_FILE,
    WorkState,
    default_workers,
    dest_lock,
    destination_error,
    is_fresh_work_dir,
    prepare_work_dir,
    recover_trash,
    refuse_symlink_destination,
    start_plan,
    work_dir_for,
)
from .workers import _WORKER_STEPS as _WORKER_STEPS
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
from .workers import TEST_DEATH_ENV as TEST_DEATH_ENV
from .workers import _close_work_dir_fds as _close_work_dir_fds
from .workers import _decode_paths as _decode_paths

log = logging.getLogger(__name__)

__all__ = ["BuildConfig", "BuildResult", "build", "default_workers", "dest_lock", "work_dir_for"]


def _build_device(config: BuildConfig) -> Any:
    """None for the CPU path, else the torch.device of the batched GPU path.
    ``--device cuda`` without CUDA is a usage error (exit 2)."""
    if config.device == "cpu" or config.store == "jpeg":
        return None
    import torch

    if not torch.cuda.is_available():
        if config.device == "auto":
            return None
        raise UsageError(
            f"--device {config.device}: no CUDA device is available to this process; "
            "use --device cpu (or auto, which falls back to the CPU)"
        )
    return torch.device("cuda" if config.device == "auto" else config.device)


def _plan_labels(src: Path, config: BuildConfig) -> _Labels:
    """Find the images and fix their labels: class folders through the ``--classes`` map,
    or the rows of a ``--labels`` table. Raises InputError for a class not in the map,
    a bad table (with its row number) or a table that names no image under ``src``."""
    fixed = read_class_map(config.classes) if config.classes is not None else None
    class_map = str(config.classes.resolve()) if config.classes is not None else None
    if config.labels is None:
        scan = scan_tree(src)
        classes, new = resolve_classes(
            scan.classes, fixed, config.allow_new_classes, map_source=config.classes
        )
        if new:
            log.warning("classes not in %s, appended at the end: %s", config.classes, new)
        return _Labels(scan=apply_class_map(scan, classes), new_classes=new, class_map=class_map)
    table_path = config.labels
    table = read_table(
        table_path,
        targets=config.targets,
        classes=fixed,
        allow_new_classes=config.allow_new_classes,
    )
    table_sha = table.sha256  # of exactly the bytes read_table parsed
    found = list_images(src)
    match = apply_table(table, [e.rel for e in found.entries], src=src)
    if not match.entries:
        first = match.missing[0][0]
        raise InputError(
            f"{table_path}: none of its {len(table)} rows names an image under {src} "
            f"(first: {first!r}); paths are relative to SRC, check SRC and the table"
        )
    if match.ignored:
        log.info("%d image(s) under %s have no row in %s; ignored", match.ignored, src, table_path)
    missing = [{"path": rel, "reason": reason} for rel, reason in match.missing]
    if match.missing_count > len(match.missing):
        # A table of a million rows naming no file would store a million skips; list
        # the first ones and count the rest under the table's own path.
        missing.append(
            {
                "path": str(table_path),
                "reason": f"and {match.missing_count - len(match.missing)} more rows that "
                f"name no image under SRC ({match.missing_count} in all; the first "
                f"{len(match.missing)} are listed)",
            }
        )
    scan = Scan(
        root=found.root,
        classes=list(match.classes),
        entries=match.entries,
        skipped=found.skipped + missing,
    )
    return _Labels(
        scan=scan,
        targets=match.targets,
        target_names=tuple(table.target_names),
        new_classes=list(match.new_classes),
        ignored=match.ignored,
        missing_rows=match.missing_count,
        class_map=class_map,
        table=str(table_path.resolve()),
        table_sha256=table_sha,
    )


def check_destination(src: Path, dst: Path, overwrite: bool) -> None:
    """Refuse destinations that would lose data or nest the pack inside its source."""
    rs, rd = src.resolve(), dst.resolve()
    if rd == rs or rd.is_relative_to(rs):
        raise InputError(
            f"{dst}: the pack would be inside its source {src}; "
            "choose a destination outside the source folder"
        )
    if rs.is_relative_to(rd):
        raise InputError(f"{dst}: contains the source {src}; choose another destination")
    if dst.exists() or dst.is_symlink():
        if dst.is_dir() and is_pack(dst):
            if not overwrite:
                raise InputError(f"{dst}: a pack already exists; pass --overwrite to replace it")
        elif dst.is_dir() and not any(dst.iterdir()):
            pass  # an empty folder is fine
        else:
            raise InputError(
                f"{dst}: exists and is not an imgpack pack; refusing to replace it "
                "(choose a new path or remove it yourself)"
            )


# ---------------------------------------------------------------- workers


def _fingerprint(plan: _Labels, config: BuildConfig, device: Any = None) -> str:
    """What the rows and labels of the work folder depend on: a rerun resumes only when
    this is unchanged (options, class map, table and targets, every source's stat)."""
    scan = plan.scan
    h = hashlib.sha256()
    h.update(
        json.dumps(
            [FORMAT_VERSION, list(config.size), config.resize, config.max_pixels, scan.classes]
        ).encode()
    )
    if device is not None:  # other pixels than the CPU path: never mixed with its chunks
        h.update(json.dumps(["device", device.type]).encode())
    if config.store != "raw":  # only then, so raw builds keep their fingerprint
        h.update(json.dumps([config.store, config.quality, config.max_side]).encode())
    if plan.table_sha256 is not None or plan.class_map is not None:
        # only with --classes/--labels, so plain builds keep their fingerprint
        targets = b"" if plan.targets is None else plan.targets.astype("<f4").tobytes()
        h.update(
            json.dumps(
                [plan.class_map, plan.table, plan.table_sha256, list(plan.target_names)]
            ).encode()
        )
        h.update(hashlib.sha256(targets).digest())
    root = str(scan.root)
    for e in scan.entries:
        try:
            st = os.stat(os.path.join(root, e.rel))
            stamp = f"{st.st_size}:{st.st_mtime_ns}"
        except OSError:
            stamp = "missing"
        h.update(f"{e.rel}\0{e.label}\0{stamp}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def build(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    config: BuildConfig = BuildConfig(),
    progress: Callable[[int], None] | None = None,
    on_start: Callable[[int, int], None] | None = None,
    plan: _Labels | None = None,
) -> BuildResult:
    """Build a pack at ``dst`` from the images under ``src``.

    ``progress(n)`` is called in this process after each chunk with the number
    of images it finished (by the GPU path from its journal thread); ``on_start(total, already_done)`` once before work.
    Raises PackerError subclasses for unusable input; broken images are skipped
    and listed in the result. Interrupted builds resume when rerun.
    ``plan``: the labelled images to pack, already listed (a shard of a set).
    ``config.shard_size`` or ``config.append``: a pack set (packer.build.shards).
    """
    t0 = time.perf_counter()
    config.validate()
    if config.shard_size is not None or config.append:  # issue 29: a pack set
        from .shards import build_set

        return build_set(src, dst, config, progress=progress, on_start=on_start)
    device = _build_device(config)
    given = Path(dst)
    # absolute first: the work folder's name comes from DST's, and "." has none
    src, dst = Path(src), Path(os.path.abspath(dst))
    refuse_symlink_destination(dst)  # before the scan: nothing is read for a DST we refuse
    plan = _plan_labels(src, config) if plan is None else plan
    check_destination(src, dst, config.overwrite)
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        with dest_lock(dst) as work:
            recover_trash(dst)
            check_destination(src, dst, config.overwrite)  # again, now that we hold the lock
            result = _build_locked(plan, dst, work, config, progress, on_start, t0, device)
            result.path = given
            return result
    except OSError as e:
        raise destination_error(e, dst) from None


def _decode_all(
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
    jpeg = config.store == "jpeg"
    if jpeg and (work / ROWS_FILE).exists():
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

        def record(res: _ChunkResult, sync: bool = True) -> None:
            """Journal one finished chunk (its line fsynced, or with ``sync`` False left
            for the next record's fsync), then report it."""
            t = time.perf_counter()
            chunk, skips, sizes, sha, chunk_times = res[:5]
            rec = {"chunk": chunk, "skips": skips, "sizes": sizes, "sha": sha}
            if len(res) > 5:  # --store jpeg: each image's stored length and size
                rec.update(res[5])
            if chunk_times is not None:  # None from the GPU path: no worker split
                times["chunks"].append(chunk_times)
            journal.write(json.dumps(rec, ensure_ascii=False) + "\n")
            if sync:
                journal.flush()
                os.fsync(journal.fileno())
                times["journal_fsyncs"] += 1
            times["journal"] += time.perf_counter() - t
            done[chunk] = rec
            if not t_first:
                t_first.append(time.perf_counter())
            if progress:
                progress(len(sizes))

        if device is not None:  # --device cuda: batched on the GPU, the rest on the workers
            from .gpu import decode_chunks_batched

            try:
                decode_chunks_batched(
                    pending, config.spec, str(work / ROWS_FILE), device, pool, record, write_plan
                )
            except BrokenProcessPool:
                raise WorkerDiedError(
                    "a CPU worker or GPU decoder process of the build died (killed, or out "
                    "of memory); "
                    f"{len(done)} of {len(chunks)} chunks are kept in the work folder: run "
                    "the same command again to resume"
                ) from None
        elif pool is None:  # in this process: no signal or parent-death handling of a worker
            # the chunk functions read the worker state from their own module's global
            build_workers._worker = _WorkerState(
                str(work / ROWS_FILE), config.spec, _store(config), t_free=time.perf_counter()
            )
            write_plan()
            try:
                for c in pending:
                    record(_chunk_fn(config)(c))
            finally:
                build_workers._worker.close()
                build_workers._worker = None
        elif not _run_chunks(pool, pending, done, record, _chunk_fn(config), times, write_plan):
            # kill -9 or the OOM killer. Perhaps a one-off (several big images at once,
            # an operator's kill): the unfinished chunks get one fresh pool.
            _stop_pool(pool)
            left = [c for c in pending if c[0] not in done]
            log.warning("a decode worker died; retrying %d unfinished chunks", len(left))
            retry = new_pool()
            try:
                ok = _run_chunks(retry, left, done, record, _chunk_fn(config), times, write_plan)
            finally:
                _stop_pool(retry)
            if not ok:  # the pool cannot tell which image a dead worker was on
                raise WorkerDiedError(
                    "a decode worker died twice (killed, or out of memory: a very large "
                    f"image can need GBs to decode); {len(done)} of {len(chunks)} chunks are "
                    "kept in the work folder: run the same command again to resume, with "
                    "fewer --workers or a lower --max-pixels if memory is short"
                )
    return (t_first or [time.perf_counter()])[0], resumed


def _store(config: BuildConfig) -> tuple[str, int, int | None]:
    return (config.store, config.quality, config.max_side)


# what a chunk's work returns, to ``record``: (chunk, skips [[row, reason]], source sizes
# [[w, h]], SHA-256 of its bytes, the worker's time split or None (GPU path), and for
# --store jpeg a dict of more journal fields: lengths, stored sizes, re-encoded count)
_ChunkResult = tuple[Any, ...]
_ChunkFn = Callable[[tuple[int, int, list[str]]], _ChunkResult]


def _chunk_fn(config: BuildConfig) -> _ChunkFn:
    return _encode_chunk if config.store == "jpeg" else _decode_chunk


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


def _start_pool(
    workers: int,
    rows_path: Path,
    spec: ResizeSpec,
    store: tuple[str, int, int | None] = ("raw", 3, None),
) -> ProcessPoolExecutor:
    """A process pool whose workers boot now, while this process prepares the work dir.

    concurrent.futures rather than multiprocessing.Pool: when a worker dies,
    multiprocessing.Pool loses its task and waits forever; this pool breaks,
    and every pending task raises BrokenProcessPool.
    """
    method = _start_method()
    ctx = mp.get_context(method)
    if ctx.get_start_method() == "forkserver":
        # the fork server imports the decoder once; each worker forks from it ready to go
        ctx.set_forkserver_preload(["packer.build.run"])
    pool = ProcessPoolExecutor(
        workers,
        mp_context=ctx,
        initializer=_worker_init,
        initargs=(str(rows_path), spec, store, method == "fork"),
    )
    for _ in range(workers):  # processes start as tasks arrive
        pool.submit(_warm_up)
    return pool


def _stop_pool(pool: ProcessPoolExecutor) -> None:
    """End the workers now, whatever they are doing (Ctrl-C, a dead sibling, an error)."""
    # the executor has no terminate(); its process table is the only handle on them
    for p in list((getattr(pool, "_processes", None) or {}).values()):
        with contextlib.suppress(Exception):
            p.kill()
    pool.shutdown(wait=True, cancel_futures=True)


def _build_locked(
    plan: _Labels,
    dst: Path,
    work: Path,
    config: BuildConfig,
    progress: Callable[[int], None] | None,
    on_start: Callable[[int, int], None] | None,
    t0: float,
    device: Any = None,
) -> BuildResult:
    spec = config.spec
    scan = plan.scan
    n_total = len(scan.entries)
    row = image_bytes(spec.shape) if config.store == "raw" else 0
    block = block_rows_for(n_total)
    root = str(scan.root)
    paths = [os.path.join(root, e.rel) for e in scan.entries]
    chunks = [
        (k, k * block, paths[k * block : (k + 1) * block])
        for k in range((n_total + block - 1) // block)
    ]
    workers = min(config.workers or default_workers(), len(chunks))
    times: dict[str, Any] = {"chunks": [], "wait": 0.0, "journal": 0.0, "journal_fsyncs": 0}

    # started first: its processes boot while this one fingerprints and preallocates
    def new_pool() -> ProcessPoolExecutor:
        return _start_pool(workers, work / ROWS_FILE, spec, _store(config))

    t = time.perf_counter()
    times["plan"] = t - t0
    pool = new_pool() if workers > 1 else None
    t_pool = time.perf_counter()
    times["pool_start"] = t_pool - t
    try:
        # A fresh work folder needs no fingerprint to start: its plan (the fingerprint)
        # is written while the workers decode the first chunks, before the first
        # journal line (a folder with rows and no plan is discarded by a rerun).
        fresh = is_fresh_work_dir(work)
        fingerprint = None if fresh else _fingerprint(plan, config, device)
        t = time.perf_counter()
        times["fingerprint"] = t - t_pool
        state = prepare_work_dir(work, fingerprint, n_total * row)
        holder = [fingerprint]

        def write_plan() -> None:
            if holder[0] is None:
                t = time.perf_counter()
                holder[0] = _fingerprint(plan, config, device)
                start_plan(work, holder[0])
                times["fingerprint_overlapped"] = time.perf_counter() - t

        t_prepared = time.perf_counter()
        times["prepare"] = t_prepared - t
        if state.assembled:
            t_first, resumed = t_prepared, n_total
            if on_start:
                on_start(n_total, n_total)
        else:
            t_first, resumed = _decode_all(
                scan, config, work, state, chunks, row, pool, new_pool, progress, on_start, times,
                write_plan, device,
            )  # fmt: skip
        t = time.perf_counter()
        if pool is not None:
            pool.shutdown(wait=True)
        times["pool_stop"] = time.perf_counter() - t
    except BaseException:
        if pool is not None:
            _stop_pool(pool)
        raise
    write_plan()  # nothing was left to decode
    fingerprint = holder[0]
    assert fingerprint is not None
    t_decoded = time.perf_counter()
    result = _finalize(
        plan, dst, work, config, state, block, resumed, t0, fingerprint, device, times
    )
    t_end = time.perf_counter()
    # where the time went, for benchmarks: setup (scan, plan, preallocate), the wait
    # for the first chunk (pool start + one chunk), then decoding
    result.extra = {
        "setup_s": round(t_prepared - t0, 3),
        "first_chunk_s": round(t_first - t_prepared, 3),
        "decode_s": round(t_decoded - t0, 3),
        "finalize_s": round(t_end - t_decoded, 3),
        **_time_split(times, workers, t_pool, t_prepared, t_decoded, t_end),
    }
    return result


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
