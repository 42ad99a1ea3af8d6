"""The build's worker processes: what each worker runs on its chunks of rows.

:func:`_worker_init` sets up a worker (its open rows file, resize spec, store);
:func:`_decode_chunk` decodes a chunk and pwrites it into the preallocated data file,
:func:`_encode_chunk` (``--store jpeg``) writes a chunk's JPEG bytes to its own file under
``chunks/``; both return the chunk's SHA-256. :func:`_decode_paths` is the GPU build's CPU
side (what the GPU does not take). No torch here: workers stay light.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DecodeError
from ..imaging.decode import ResizeSpec, decode_into, store_into
from ..pack.writer import digest, image_bytes
from .formats.fetch import fetch_chunk, jpeg_for_pack_item, load_resized_item

CHUNKS_DIR = "chunks"  # --store jpeg: one file of JPEG bytes per finished chunk


def _chunk_file(work: Path | str, chunk: int) -> Path:
    return Path(work) / CHUNKS_DIR / f"{chunk:08d}.jpg"


@dataclass
class _WorkerState:
    """What a decode worker needs: set once by the pool initializer, per process."""

    rows_path: str
    spec: ResizeSpec
    store: tuple[str, int, int | None] = ("raw", 3, None)  # (store, quality, max_side)
    fd: int | None = None  # the rows file, opened at the first chunk
    sync_file_range: Any = None  # libc's, on Linux
    buf: np.ndarray | None = None  # the chunk buffer, reused: every row is rewritten
    t_free: float = 0.0  # perf_counter (system-wide monotonic) when this worker last went idle
    die_at: tuple[int, str | None] | None = None  # tests only: see _test_death

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


_worker: _WorkerState | None = None


def _die_with_parent(build_pid: int | None = None) -> None:
    """End this worker when the build's process dies (so a killed build leaves no
    writers; Linux): a daemon thread waits on a pidfd of that process (``build_pid``;
    default this worker's parent) and SIGKILLs this worker when it ends.

    Not ``PR_SET_PDEATHSIG``: its "parent" is the *thread* that created the process,
    and the GPU build starts its CPU workers on a pipeline thread (a reader's first
    non-JPEG: :class:`packer.builder.chunks.LazyPool`). With spawn (after the process
    used a bucket) every worker was killed as that thread ended at the end of the
    decode; one killed holding the task queue's lock left its sibling waiting for the
    lock until the build's 30 s bound killed it (docs/RELIABILITY.md, "Pool shutdown").
    """
    if not sys.platform.startswith("linux"):
        return
    pid = os.getppid() if build_pid is None else build_pid
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:  # the build is gone already
        os.kill(os.getpid(), signal.SIGKILL)
        return
    except (AttributeError, OSError):  # no pidfd (Linux < 5.3): poll the parent
        fd = None

    def watch() -> None:
        if fd is not None:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            while not poller.poll():  # readable once the whole process has ended
                pass
        else:
            parent = os.getppid()
            while os.getppid() == parent and _alive(pid):
                time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="imgpack-parent-watch", daemon=True).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _worker_init(
    rows_path: str,
    spec: ResizeSpec,
    store: tuple[str, int, int | None] = ("raw", 3, None),
    forked: bool = False,
    build_pid: int | None = None,
) -> None:
    global _worker
    _die_with_parent(build_pid)
    if forked:
        _close_work_dir_fds(os.path.dirname(rows_path))
    # The parent handles Ctrl-C and SIGTERM and then kills its workers; a worker
    # that died of the signal itself would print a traceback and break the pool.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # the rows file is opened at the first chunk: the pool starts before the file exists
    _worker = _WorkerState(rows_path, spec, store, t_free=time.perf_counter())
    _worker.die_at = _test_death()
    _worker.sync_file_range = _writeback_fn()


# Tests only: makes a pool worker SIGKILL itself as it starts a chosen chunk, so the
# dead-worker tests kill a worker while work is certainly pending, whatever the load.
TEST_DEATH_ENV = "IMGPACK_TEST_WORKER_DIES_AT"


def _test_death() -> tuple[int, str | None] | None:
    """``IMGPACK_TEST_WORKER_DIES_AT=K`` (tests only): a pool worker that starts chunk K
    kills itself (every time: the retry pool dies too); ``K:PATH``: only the first
    worker to create the file PATH does (one death, then the retry succeeds). Read once
    per pool worker, never by an in-process build; unset (always, outside tests) it
    has no effect."""
    value = os.environ.get(TEST_DEATH_ENV)
    if not value:
        return None
    chunk, _, marker = value.partition(":")
    return int(chunk), marker or None


def _maybe_die(state: _WorkerState, chunk: int) -> None:
    """The test hook of :func:`_test_death`, at the start of a chunk."""
    if state.die_at is None or state.die_at[0] != chunk:
        return
    marker = state.die_at[1]
    if marker is not None:
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return  # a worker died here already
    os.kill(os.getpid(), signal.SIGKILL)


def _close_work_dir_fds(work: str) -> None:
    """A worker forked from the parent inherits its descriptor of the work folder, which
    holds the build's ``flock``: close it, so the lock never outlives the parent. Also
    any other imgpack lock (a ``*.imgpack-partial`` folder: a pack set's, issue 29)."""
    work = os.path.realpath(work)
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/self/fd/{name}")
                if target == work or target.endswith(".imgpack-partial"):
                    os.close(int(name))


def client_used_here() -> bool:
    """Whether this process has used its object-store client (its runtime's threads live
    here): a child forked from it could not use the client."""
    client = sys.modules.get("packer.storage.client")
    return getattr(client, "_RUNTIME_PID", None) == os.getpid()


def reads_object_storage(scan: Any) -> bool:
    """Whether a build's workers read object storage: its source's containers (a
    :class:`packer.builder.formats.common.SourceScan`'s) include a URL. A folder, or a
    parquet, tar or zip file on disk, is read from disk."""
    return any("://" in c.where for c in getattr(scan, "containers", ()))


def _start_method(reads_bucket: bool = True) -> str:
    """How decode workers start. ``fork`` (Linux) when it is safe: this process runs
    no other thread and no CUDA context, so a child cannot inherit a lock held
    mid-operation; workers then start in milliseconds with the decoder already
    imported. Otherwise a fork server (boots a clean interpreter once, ~0.5 s for 16
    workers) or spawn. ``reads_bucket``: whether the workers will read object storage
    (:func:`reads_object_storage`; False for a folder's build). ``IMGPACK_BUILD_START``
    overrides it, for benchmarks."""
    if not sys.platform.startswith("linux"):
        return "spawn"
    forced = os.environ.get("IMGPACK_BUILD_START")
    if forced in ("fork", "forkserver"):
        return forced
    # workers that read a bucket (packer.sources): a child forked from this process cannot
    # use its object-store client, and a fork server started earlier has an older
    # environment than the client's settings now: fresh interpreters. Workers that read
    # files only are forked as ever, even where this process has used its client (an
    # upload before, a pack set's shards sent to a bucket): they never touch it.
    if reads_bucket and "packer.builder.formats.remote" in sys.modules and client_used_here():
        return "spawn"
    torch = sys.modules.get("torch")
    cuda = False
    if torch is not None:
        with contextlib.suppress(Exception):
            cuda = bool(torch.cuda.is_initialized())
    return "fork" if threading.active_count() == 1 and not cuda else "forkserver"


def _writeback_fn() -> Any:
    """libc's ``sync_file_range`` when each chunk's writeback is started as it is
    written (Linux, :func:`_writeback_mode` ``chunk``), else None."""
    if sys.platform.startswith("linux") and _writeback_mode() == "chunk":
        with contextlib.suppress(Exception):
            return ctypes.CDLL(None, use_errno=True).sync_file_range
    return None


def _writeback_mode() -> str:
    """``chunk``: start each chunk's writeback as soon as it is written (sync_file_range),
    so the final fsync has little left; ``off``: leave it to the kernel and the final
    fsync. ``IMGPACK_BUILD_WRITEBACK`` selects it, for benchmarks only."""
    return "off" if os.environ.get("IMGPACK_BUILD_WRITEBACK") == "off" else "chunk"


def _warm_up() -> None:
    """A task per worker at the pool's start: it starts the process early and loads
    Pillow's common decoders (``Image.preinit``, tens of ms) while the parent lists the
    tree, not in the first chunk."""
    from PIL import Image

    Image.preinit()


# what a worker reports with each chunk: seconds per step, and when it ran (perf_counter
# is CLOCK_MONOTONIC, one clock for every process of the machine)
_WORKER_STEPS = ("decode", "copy", "pwrite", "sha256", "writeback", "idle")


def _chunk_times(
    state: Any, t_start: float, decode: float, copy: float, t1: float, t2: float, t3: float
) -> dict[str, Any]:
    """One chunk's time split (seconds) for BuildResult.extra: ``t1``..``t3`` end the
    copy, the pwrite and the SHA-256; what follows until now is the writeback start, and
    the wait since the worker's previous chunk is its idle time."""
    t_end = time.perf_counter()
    times = {
        "decode": decode,
        "copy": copy,
        "pwrite": t2 - t1,
        "sha256": t3 - t2,
        "writeback": t_end - t3,
        "idle": t_start - state.t_free,
        "t_start": t_start,
        "t_end": t_end,
        "pid": os.getpid(),
    }
    state.t_free = t_end
    return times


def _decode_chunk(
    task: tuple[int, int, list[str]],
) -> tuple[int, list[list[Any]], list[list[int]], str, dict[str, float]]:
    """Decode rows [start, start+len(paths)) and write them; return skips, sizes, sha
    and the worker's time split (``_WORKER_STEPS``, plus ``t_start``, ``t_end``, ``pid``)."""
    return _decode_rows(task, hashed=True)


def _decode_part(
    task: tuple[int, int, list[str]],
) -> tuple[int, list[list[Any]], list[list[int]], str, dict[str, float]]:
    """:func:`_decode_chunk` of a part of chunk ``task[0]`` (its rows from ``task[1]``), no
    SHA-256 ("": the chunk's is taken once every part is written,
    :mod:`packer.builder.tail`)."""
    return _decode_rows(task, hashed=False)


def _decode_rows(
    task: tuple[int, int, list[str]], hashed: bool
) -> tuple[int, list[list[Any]], list[list[int]], str, dict[str, float]]:
    t_start = time.perf_counter()
    chunk, start, paths = task
    state = _worker
    assert state is not None, "_worker_init was not run in this process"
    _maybe_die(state, chunk)
    paths = fetch_chunk(paths)  # a parquet/tar/zip/bucket source's bytes (packer.sources)
    spec = state.spec
    n = len(paths)
    if state.buf is None or len(state.buf) < n:
        state.buf = np.empty((n, *spec.shape), dtype=np.uint8)
    buf = state.buf[:n]  # every row below is written: decoded pixels or zeros
    skips: list[list[Any]] = []
    sizes: list[list[int]] = []
    t_decode = t_copy = 0.0
    for i, path in enumerate(paths):
        t = time.perf_counter()
        try:
            im, (w, h) = load_resized_item(path, spec)
            t2 = time.perf_counter()
            store_into(im, buf[i])
            t_copy += time.perf_counter() - t2
            t_decode += t2 - t
            sizes.append([w, h])
        except DecodeError as e:
            buf[i] = 0
            skips.append([start + i, str(e)])
            sizes.append([0, 0])
            t_decode += time.perf_counter() - t
    row = image_bytes(spec.shape)
    mv = memoryview(buf).cast("B")
    off, done = start * row, 0
    t1 = time.perf_counter()
    if state.fd is None:
        state.fd = os.open(state.rows_path, os.O_WRONLY)
    while done < len(mv):
        done += os.pwrite(state.fd, mv[done:], off + done)
    t2 = time.perf_counter()
    sha = digest(mv) if hashed else ""
    t3 = time.perf_counter()
    if state.sync_file_range is not None:
        # start writing this range to disk now (non-blocking), so the single fsync
        # at the end has little left to wait for
        state.sync_file_range(state.fd, ctypes.c_int64(off), ctypes.c_int64(len(mv)), 2)
    times = _chunk_times(state, t_start, t_decode, t_copy, t1, t2, t3)
    return chunk, skips, sizes, sha, times


def _encode_chunk(
    task: tuple[int, int, list[str]],
) -> tuple[int, list[list[Any]], list[list[int]], str, dict[str, float], dict[str, Any]]:
    """--store jpeg: the JPEG file of each image of a chunk, written back to back to the
    chunk's own file in the work folder; return skips, source sizes, the file's SHA-256,
    the worker's time split (as ``_decode_chunk``'s: ``decode`` is reading, checking and
    any re-encoding, ``copy`` joining the bytes) and each image's stored byte length and
    (height, width) (0 and [0, 0] for skips)."""
    t_start = time.perf_counter()
    chunk, start, paths = task
    state = _worker
    assert state is not None, "_worker_init was not run in this process"
    _maybe_die(state, chunk)
    paths = fetch_chunk(paths)  # a parquet/tar/zip/bucket source's bytes (packer.sources)
    _, quality, max_side = state.store
    parts: list[bytes] = []
    skips: list[list[Any]] = []
    sizes: list[list[int]] = []
    lengths: list[int] = []
    stored: list[list[int]] = []
    reencoded = 0
    for i, path in enumerate(paths):
        try:
            data, hw, upright, again = jpeg_for_pack_item(
                path, max_side, quality, state.spec.max_pixels
            )
        except DecodeError as e:
            skips.append([start + i, str(e)])
            sizes.append([0, 0])
            lengths.append(0)
            stored.append([0, 0])
            continue
        parts.append(data)
        sizes.append(list(upright))
        lengths.append(len(data))
        stored.append(list(hw))
        reencoded += again
    t0 = time.perf_counter()
    blob = b"".join(parts)
    t1 = time.perf_counter()
    path = _chunk_file(Path(state.rows_path).parent, chunk)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        mv, done = memoryview(blob), 0
        while done < len(mv):
            done += os.write(fd, mv[done:])
        t2 = time.perf_counter()
        sha = digest(blob)
        t3 = time.perf_counter()
        if state.sync_file_range is not None:
            state.sync_file_range(fd, ctypes.c_int64(0), ctypes.c_int64(len(mv)), 2)
    finally:
        os.close(fd)
    times = _chunk_times(state, t_start, t0 - t_start, t1 - t0, t1, t2, t3)
    extra = {"lengths": lengths, "stored": stored, "reencoded": reencoded}
    return chunk, skips, sizes, sha, times, extra


def _decode_paths(paths: list[str], spec: ResizeSpec) -> list[tuple[bytes | None, Any]]:
    """--device cuda: the inputs the GPU does not take, decoded by a CPU worker exactly
    as ``_decode_chunk`` does; per path (row bytes, upright (w, h)) or (None, reason)."""
    out: list[tuple[bytes | None, Any]] = []
    buf = np.empty(spec.shape, dtype=np.uint8)
    for p in paths:
        try:
            size = decode_into(p, spec, buf)
            out.append((buf.tobytes(), size))
        except DecodeError as e:
            out.append((None, str(e)))
    return out


# ---------------------------------------------------------------- the build
