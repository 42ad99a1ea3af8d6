"""``imgpack build``: decode and resize every image, in parallel, into a pack.

Data flow (see docs/ARCHITECTURE.md)::

    scan -> plan (fingerprint) -> workers decode chunks of rows -> pwrite into
    rows file -> journal line per finished chunk -> compact (only if skips) ->
    labels, manifest, tensordict meta -> rename the work folder into place

Crash safety: everything is written in ``.<DST>.imgpack-partial`` beside DST.
A worker writes its chunk of rows straight into the preallocated data file
(pwrite; the dataset is never held in RAM) and returns the chunk's SHA-256;
the parent records it in ``journal.jsonl`` (fsynced). A rerun of the same
command with the same inputs finds the journal, re-hashes the listed chunks
(a chunk that did not reach the disk before a power loss is redone) and
decodes only the rest; the data file is fsynced once, before the pack is
assembled; anything else about the partial folder that
does not match (other options, changed sources) starts it afresh. Nothing
appears at DST until the whole pack is complete. A lock file beside DST keeps
two builds from writing the same destination.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import json
import logging
import multiprocessing as mp
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import __version__
from .decode import DEFAULT_MAX_PIXELS, RESIZE_MODES, ResizeSpec, decode_into
from .errors import DecodeError, DiskFullError, InputError, PackBusyError, UsageError
from .format import (
    DATA_DIR,
    FORMAT_VERSION,
    IMAGES_FILE,
    LABELS_FILE,
    BuildInfo,
    Checksums,
    Manifest,
    Skip,
    block_rows_for,
    digest,
    image_bytes,
    is_pack,
    write_json_atomic,
    write_pack_metadata,
)
from .scan import Scan, scan_tree

log = logging.getLogger(__name__)

ROWS_FILE = "rows.u8"
JOURNAL = "journal.jsonl"
PLAN = "plan.json"


@dataclass(frozen=True)
class BuildConfig:
    """Options of a build. ``size`` is (width, height) in pixels."""

    size: tuple[int, int] = (224, 224)
    resize: str = "crop"
    workers: int | None = None  # None: every core
    overwrite: bool = False
    max_pixels: int = DEFAULT_MAX_PIXELS

    def validate(self) -> None:
        w, h = self.size
        if not (1 <= w <= 8192 and 1 <= h <= 8192):
            raise UsageError(f"--size {w}x{h} is out of range: each side must be 1 to 8192 pixels")
        if self.resize not in RESIZE_MODES:
            raise UsageError(
                f"--resize must be one of {', '.join(RESIZE_MODES)}, not {self.resize!r}"
            )
        if self.workers is not None and not 1 <= self.workers <= 1024:
            raise UsageError(f"--workers must be 1 to 1024, not {self.workers}")
        if self.max_pixels < 1:
            raise UsageError("--max-pixels must be positive")

    @property
    def spec(self) -> ResizeSpec:
        return ResizeSpec(self.size[0], self.size[1], self.resize, self.max_pixels)


@dataclass
class BuildResult:
    path: Path
    count: int
    skipped: list[dict[str, str]]
    classes: list[str]
    image_shape: list[int]
    seconds: float
    resumed: int = 0  # images taken from an interrupted earlier run
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "count": self.count,
            "skipped": self.skipped,
            "classes": self.classes,
            "image_shape": self.image_shape,
            "seconds": round(self.seconds, 3),
            "resumed": self.resumed,
        }


def default_workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


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


@contextlib.contextmanager
def dest_lock(dst: Path) -> Iterator[None]:
    """An exclusive lock on DST for one writer; released when the process ends, even on a crash."""
    lock_path = dst.parent / f".{dst.name}.imgpack-lock"
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise PackBusyError(
                f"{dst}: another imgpack process is writing this destination "
                f"(lock {lock_path}); wait for it to finish"
            ) from None
        yield
    finally:
        os.close(fd)


def work_dir_for(dst: Path) -> Path:
    return dst.parent / f".{dst.name}.imgpack-partial"


# ---------------------------------------------------------------- workers

_W: dict[str, Any] = {}


def _die_with_parent() -> None:
    """Linux: end this worker when the parent dies (so a killed build leaves no writers)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Linux: start writing this range to disk now (sync_file_range, non-blocking), so
    the single fsync at the end has little left to wait for."""
    fn = _W.get("sync_file_range")
    if fn is not None:
        fn(fd, ctypes.c_int64(offset), ctypes.c_int64(nbytes), 2)  # SYNC_FILE_RANGE_WRITE


def _worker_init(rows_path: str, spec: ResizeSpec) -> None:
    _die_with_parent()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            _W["sync_file_range"] = ctypes.CDLL(None, use_errno=True).sync_file_range
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C
    _W["rows_path"] = rows_path  # opened at the first chunk: the pool starts before the file exists
    _W["spec"] = spec


def _decode_chunk(
    task: tuple[int, int, list[str]],
) -> tuple[int, list[list[Any]], list[list[int]], str]:
    """Decode rows [start, start+len(paths)) and write them; return skips, sizes, sha."""
    chunk, start, paths = task
    spec: ResizeSpec = _W["spec"]
    buf = np.zeros((len(paths), *spec.shape), dtype=np.uint8)
    skips: list[list[Any]] = []
    sizes: list[list[int]] = []
    for i, path in enumerate(paths):
        try:
            w, h = decode_into(path, spec, buf[i])
            sizes.append([w, h])
        except DecodeError as e:
            buf[i] = 0
            skips.append([start + i, str(e)])
            sizes.append([0, 0])
    row = image_bytes(spec.shape)
    mv = memoryview(buf).cast("B")
    off, done = start * row, 0
    fd = _W.get("fd")
    if fd is None:
        fd = _W["fd"] = os.open(_W["rows_path"], os.O_WRONLY)
    while done < len(mv):
        done += os.pwrite(fd, mv[done:], off + done)
    _start_writeback(fd, off, len(mv))
    return chunk, skips, sizes, digest(mv)


# ---------------------------------------------------------------- the build


def _fingerprint(scan: Scan, config: BuildConfig) -> str:
    h = hashlib.sha256()
    h.update(
        json.dumps(
            [FORMAT_VERSION, list(config.size), config.resize, config.max_pixels, scan.classes]
        ).encode()
    )
    for e in scan.entries:
        try:
            st = os.stat(scan.root / e.rel)
            stamp = f"{st.st_size}:{st.st_mtime_ns}"
        except OSError:
            stamp = "missing"
        h.update(f"{e.rel}\0{e.label}\0{stamp}\n".encode())
    return h.hexdigest()


def _read_journal(path: Path) -> dict[int, dict[str, Any]]:
    done: dict[int, dict[str, Any]] = {}
    if not path.exists():
        return done
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                rec = json.loads(line)
                done[int(rec["chunk"])] = rec
            except (ValueError, KeyError, TypeError):
                break  # a torn last line from a crash: that chunk is simply redone
    return done


def _prepare_work_dir(work: Path, fingerprint: str, total_bytes: int) -> dict[int, dict[str, Any]]:
    """Reuse a matching partial build, else start a fresh one. Returns finished chunks."""
    plan_path = work / PLAN
    if work.exists():
        try:
            same = json.loads(plan_path.read_text())["fingerprint"] == fingerprint
        except (OSError, ValueError, KeyError, TypeError):
            same = False
        have_data = (work / ROWS_FILE).exists() or (work / DATA_DIR / IMAGES_FILE).exists()
        if same and have_data:
            return _read_journal(work / JOURNAL)  # checked against the data in _build_locked
        log.info("discarding %s: it was started with other inputs or options", work)
        shutil.rmtree(work)
    work.mkdir(parents=True)
    (work / DATA_DIR).mkdir()
    fd = os.open(work / ROWS_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if total_bytes:
            try:
                os.posix_fallocate(fd, 0, total_bytes)
            except OSError as e:
                if e.errno == errno.ENOSPC:
                    free = shutil.disk_usage(work).free
                    raise DiskFullError(
                        f"{work.parent}: not enough disk space for the pack (needs "
                        f"{total_bytes / 1e9:.2f} GB, {free / 1e9:.2f} GB free); free space "
                        "and run the same command again"
                    ) from None
                if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                os.ftruncate(fd, total_bytes)
    finally:
        os.close(fd)
    write_json_atomic(plan_path, {"fingerprint": fingerprint})
    return {}


def build(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    config: BuildConfig = BuildConfig(),
    progress: Callable[[int], None] | None = None,
    on_start: Callable[[int, int], None] | None = None,
) -> BuildResult:
    """Build a pack at ``dst`` from the images under ``src``.

    ``progress(n)`` is called in this process after each chunk with the number
    of images it finished; ``on_start(total, already_done)`` once before work.
    Raises PackerError subclasses for unusable input; broken images are skipped
    and listed in the result. Interrupted builds resume when rerun.
    """
    t0 = time.perf_counter()
    config.validate()
    src, dst = Path(src), Path(dst)
    scan = scan_tree(src)
    check_destination(src, dst, config.overwrite)
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        with dest_lock(dst):
            check_destination(src, dst, config.overwrite)  # again, now that we hold the lock
            return _build_locked(scan, dst, config, progress, on_start, t0)
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise DiskFullError(
                f"{dst.parent}: the disk is full ({e}); free space and run the "
                "same command again: the finished part is kept"
            ) from None
        raise


def _decode_all(
    scan: Scan,
    config: BuildConfig,
    work: Path,
    chunks: list[tuple[int, int, list[str]]],
    row: int,
    pool: Any,
    progress: Callable[[int], None] | None,
    on_start: Callable[[int, int], None] | None,
) -> tuple[float, float, dict[int, dict[str, Any]], int]:
    """Prepare (or resume) the work dir and decode every pending chunk into it.

    Returns when setup ended, when the first chunk arrived, the journal of
    finished chunks, and how many images an earlier run had done.
    """
    n_total = len(scan.entries)
    done = _prepare_work_dir(work, _fingerprint(scan, config), n_total * row)
    if done and (work / ROWS_FILE).exists():
        # The journal is fsynced per chunk, the data only at the end: after a power
        # loss a listed chunk may not have reached the disk. Its SHA-256 tells.
        with open(work / ROWS_FILE, "rb") as f:
            for k in [k for k in done if k < len(chunks)]:
                f.seek(chunks[k][1] * row)
                if digest(f.read(len(chunks[k][2]) * row)) != done[k]["sha"]:
                    log.info("chunk %d of %s did not reach the disk; redoing it", k, work)
                    del done[k]
    t_prepared = time.perf_counter()
    t_first: list[float] = []
    pending = [c for c in chunks if c[0] not in done]
    resumed = sum(len(c[2]) for c in chunks if c[0] in done)
    if on_start:
        on_start(n_total, resumed)
    if resumed:
        log.info("resuming %s: %d of %d images already done", work, resumed, n_total)

    if pending:
        with open(work / JOURNAL, "a", encoding="utf-8") as journal:

            def record(res: tuple[int, list[list[Any]], list[list[int]], str]) -> None:
                chunk, skips, sizes, sha = res
                rec = {"chunk": chunk, "skips": skips, "sizes": sizes, "sha": sha}
                journal.write(json.dumps(rec, ensure_ascii=False) + "\n")
                journal.flush()
                os.fsync(journal.fileno())
                done[chunk] = rec
                if not t_first:
                    t_first.append(time.perf_counter())
                if progress:
                    progress(len(sizes))

            if pool is None:  # in this process: no signal or parent-death handling of a worker
                _W.update(rows_path=str(work / ROWS_FILE), spec=config.spec)
                try:
                    for c in pending:
                        record(_decode_chunk(c))
                finally:
                    fd = _W.pop("fd", None)
                    if fd is not None:
                        os.close(fd)
            else:
                for res in pool.imap_unordered(_decode_chunk, pending):
                    record(res)
    return t_prepared, (t_first or [time.perf_counter()])[0], done, resumed


def _build_locked(
    scan: Scan,
    dst: Path,
    config: BuildConfig,
    progress: Callable[[int], None] | None,
    on_start: Callable[[int, int], None] | None,
    t0: float,
) -> BuildResult:
    spec = config.spec
    n_total = len(scan.entries)
    row = image_bytes(spec.shape)
    block = block_rows_for(n_total)
    chunks = [
        (k, k * block, [str(scan.root / e.rel) for e in scan.entries[k * block : (k + 1) * block]])
        for k in range((n_total + block - 1) // block)
    ]
    work = work_dir_for(dst)
    workers = min(config.workers or default_workers(), len(chunks))
    pool = None
    if workers > 1:
        # started first: its processes boot while this one fingerprints and preallocates
        ctx = mp.get_context("forkserver" if sys.platform.startswith("linux") else "spawn")
        if ctx.get_start_method() == "forkserver":
            # the fork server imports the decoder once; each worker forks from it ready to go
            ctx.set_forkserver_preload(["packer.build"])
        pool = ctx.Pool(workers, initializer=_worker_init, initargs=(str(work / ROWS_FILE), spec))
    try:
        t_prepared, t_first, done, resumed = _decode_all(
            scan, config, work, chunks, row, pool, progress, on_start
        )
        if pool is not None:
            pool.close()
    except BaseException:
        if pool is not None:
            pool.terminate()
        raise
    finally:
        if pool is not None:
            pool.join()
    t_decoded = time.perf_counter()
    result = _finalize(scan, dst, work, config, done, block, resumed, t0)
    # where the time went, for benchmarks: setup (scan, plan, preallocate), the wait
    # for the first chunk (pool start + one chunk), then decoding
    result.extra = {
        "setup_s": round(t_prepared - t0, 3),
        "first_chunk_s": round(t_first - t_prepared, 3),
        "decode_s": round(t_decoded - t0, 3),
        "finalize_s": round(time.perf_counter() - t_decoded, 3),
    }
    return result


def _finalize(
    scan: Scan,
    dst: Path,
    work: Path,
    config: BuildConfig,
    done: dict[int, dict[str, Any]],
    block: int,
    resumed: int,
    t0: float,
) -> BuildResult:
    spec = config.spec
    row = image_bytes(spec.shape)
    skip_reason: dict[int, str] = {}
    sizes: list[list[int]] = []
    shas: list[str] = []
    for k in sorted(done):
        rec = done[k]
        skip_reason.update({int(i): r for i, r in rec["skips"]})
        sizes.extend(rec["sizes"])
        shas.append(rec["sha"])
    keep = [i for i in range(len(scan.entries)) if i not in skip_reason]
    n = len(keep)
    images_path = work / DATA_DIR / IMAGES_FILE
    if (work / ROWS_FILE).exists():
        fd = os.open(work / ROWS_FILE, os.O_RDONLY)
        try:
            os.fsync(fd)  # all rows durable before anything depends on them
        finally:
            os.close(fd)
        if skip_reason:
            shas = _compact(work / ROWS_FILE, images_path, keep, row, block)
            os.remove(work / ROWS_FILE)
        else:
            os.replace(work / ROWS_FILE, images_path)
    elif skip_reason:  # compacted by an earlier run that stopped before the manifest
        shas = _block_shas(images_path, row, block)
    labels = np.array([scan.entries[i].label for i in keep], dtype="<i8")
    with open(work / DATA_DIR / LABELS_FILE, "wb") as f:
        f.write(labels.tobytes())
        f.flush()
        os.fsync(f.fileno())
    skipped = [{"path": scan.entries[i].rel, "reason": skip_reason[i]} for i in sorted(skip_reason)]
    counts = np.bincount(labels[labels >= 0], minlength=len(scan.classes)).tolist()
    manifest = Manifest(
        count=n,
        image_shape=spec.shape,
        resize=config.resize,
        classes=tuple(scan.classes),
        class_counts=tuple(counts),
        sources=tuple(scan.entries[i].rel for i in keep),
        source_sizes=tuple((sizes[i][0], sizes[i][1]) for i in keep),
        skipped=tuple(Skip(s["path"], s["reason"]) for s in skipped),
        build=BuildInfo(
            max_pixels=config.max_pixels,
            source_root=str(scan.root.resolve()),
            imgpack_version=__version__,
            created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        ),
        checksums=Checksums(block_rows=block, images=tuple(shas), labels=digest(labels.tobytes())),
    )
    write_pack_metadata(work, manifest)
    for name in (JOURNAL, PLAN):  # bookkeeping of the build, not part of the pack
        (work / name).unlink(missing_ok=True)
    _fsync_dir(work / DATA_DIR)
    _fsync_dir(work)
    if dst.exists():
        trash = dst.parent / f".{dst.name}.imgpack-old"
        if trash.exists():
            shutil.rmtree(trash)
        os.replace(dst, trash)
        os.replace(work, dst)
        shutil.rmtree(trash)
    else:
        os.replace(work, dst)
    _fsync_dir(dst.parent)
    return BuildResult(
        path=dst,
        count=n,
        skipped=skipped,
        classes=scan.classes,
        image_shape=list(spec.shape),
        seconds=time.perf_counter() - t0,
        resumed=resumed,
    )


def _compact(rows_path: Path, out_path: Path, keep: list[int], row: int, block: int) -> list[str]:
    """Copy the kept rows, in order, into a new file; return per-block checksums.

    Restartable: the source file is untouched until the copy is complete.
    """
    shas: list[str] = []
    tmp = out_path.with_name(out_path.name + ".tmp")
    with open(rows_path, "rb") as src, open(tmp, "wb") as out:
        for b in range(0, len(keep), block):
            buf = bytearray()
            for i in keep[b : b + block]:
                src.seek(i * row)
                buf += src.read(row)
            out.write(buf)
            shas.append(digest(buf))
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, out_path)
    return shas


def _block_shas(path: Path, row: int, block: int) -> list[str]:
    shas = []
    with open(path, "rb") as f:
        while chunk := f.read(row * block):
            shas.append(digest(chunk))
    return shas


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
