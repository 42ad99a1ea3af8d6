"""``imgpack build``: decode and resize every image, in parallel, into a pack.

Data flow (see docs/ARCHITECTURE.md)::

    scan + labels (class map, label table) -> plan (fingerprint) -> workers decode
    chunks of rows -> pwrite into rows file -> journal line per finished chunk ->
    compact (only if skips) -> labels, targets, manifest, tensordict meta -> rename
    the work folder into place

Crash safety: everything is written in a work folder beside DST
(:mod:`packer.workdir`), which is also the lock against a second writer.
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

Labels (:mod:`packer.labels`): the class folders (ImageFolder's indices), or the
``--classes`` map (a text file or a pack; a folder not in it is an error unless
``--allow-new-classes``), or a ``--labels`` table whose rows name images under SRC,
with optional ``--targets`` columns stored as float32 ``targets [N, K]``.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import io
import json
import logging
import multiprocessing as mp
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ._version import __version__
from .decode import (
    DEFAULT_MAX_PIXELS,
    RESIZE_MODES,
    ResizeSpec,
    decode_into,
    jpeg_for_pack,
    jpeg_frame,
    load_resized,
    open_image,
    open_regular,
    store_into,
)
from .errors import (
    DecodeError,
    InputError,
    NoUsableImagesError,
    UsageError,
    WorkerDiedError,
)
from .format import (
    DATA_DIR,
    FORMAT_VERSION,
    IMAGES_FILE,
    JPEG_FILE,
    JPEG_STORAGE_VERSION,
    LABELS_FILE,
    LENGTHS_FILE,
    OFFSETS_FILE,
    SIZES_FILE,
    TARGETS_FILE,
    BuildInfo,
    Checksums,
    Manifest,
    Skip,
    block_rows_for,
    digest,
    image_bytes,
    is_pack,
    read_manifest,
    write_pack_metadata,
)
from .labels import (
    apply_class_map,
    apply_table,
    check_target_names,
    read_class_map,
    read_table,
    resolve_classes,
)
from .scan import Scan, list_images, scan_tree
from .workdir import (
    JOURNAL,
    PLAN,
    ROWS_FILE,
    WorkState,
    clear_work_dir,
    default_workers,
    dest_lock,
    destination_error,
    fsync_dir,
    is_fresh_work_dir,
    mark_assembled,
    prepare_work_dir,
    recover_trash,
    refuse_symlink_destination,
    start_plan,
    trash_dir_for,
    work_dir_for,
)

log = logging.getLogger(__name__)

__all__ = ["BuildConfig", "BuildResult", "build", "default_workers", "dest_lock", "work_dir_for"]


@dataclass(frozen=True)
class BuildConfig:
    """Options of a build. ``size`` is (width, height) in pixels.

    ``classes``: a class-map file (one name per line) or a pack whose ``classes`` are
    reused: fixes the class -> index map. ``allow_new_classes``: append classes not in
    the map instead of refusing them. ``labels``: a label table (.csv, .tsv, .parquet)
    with ``path`` and ``label`` columns. ``targets``: numeric columns of the table,
    stored as float32 ``targets [N, K]`` in this order.
    """

    size: tuple[int, int] = (224, 224)
    resize: str = "crop"
    workers: int | None = None  # None: every core
    overwrite: bool = False
    max_pixels: int = DEFAULT_MAX_PIXELS
    classes: Path | None = None
    allow_new_classes: bool = False
    labels: Path | None = None
    targets: tuple[str, ...] = ()
    store: str = "raw"  # "raw": uint8 rows of ``size``; "jpeg": each image's JPEG file
    quality: int = 3  # --store jpeg: re-encode quality, ffmpeg's -q:v scale (2 best..31)
    max_side: int | None = None  # --store jpeg: longest stored side; larger are re-encoded
    device: str = "cpu"  # "cpu" (worker processes), "cuda" (batched nvjpeg), "auto"

    def __post_init__(self) -> None:
        # paths given as str and column names as a list are the same options
        for name in ("classes", "labels"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Path):
                object.__setattr__(self, name, Path(value))
        if not isinstance(self.targets, tuple):
            object.__setattr__(self, "targets", tuple(self.targets))

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
        if self.targets and self.labels is None:
            raise UsageError(
                "--targets names columns of a label table; give the table with --labels TABLE"
            )
        check_target_names(list(self.targets))
        if self.store not in STORES:
            raise UsageError(f"--store must be one of {', '.join(STORES)}, not {self.store!r}")
        if not 2 <= self.quality <= 31:
            raise UsageError(f"--quality must be 2 (best) to 31 (worst), not {self.quality}")
        if self.max_side is not None:
            if self.store != "jpeg":
                raise UsageError("--max-side bounds stored JPEGs; use it with --store jpeg")
            if not 1 <= self.max_side <= 65536:
                raise UsageError(f"--max-side must be 1 to 65536 pixels, not {self.max_side}")
        if self.device not in ("cpu", "cuda", "auto") and not self.device.startswith("cuda:"):
            raise UsageError(f"--device must be cpu, cuda or auto, not {self.device!r}")
        if self.store == "jpeg" and self.device not in ("cpu", "auto"):
            raise UsageError(
                "--device cuda decodes and resizes raw packs; --store jpeg stores the "
                "files as they are (they are decoded on the GPU when read)"
            )
        if self.allow_new_classes and self.classes is None:
            raise UsageError(
                "--allow-new-classes extends a fixed class map; give the map with --classes"
            )

    @property
    def spec(self) -> ResizeSpec:
        return ResizeSpec(self.size[0], self.size[1], self.resize, self.max_pixels)


STORES = ("raw", "jpeg")
# --device cuda vs the CPU path, pixels of the same inputs (tests/test_build_gpu.py, the
# batched code run on the CPU, 500x375 q90 photos-like JPEGs: mean 0.15-1.2, p99 1-12;
# nvjpeg adds its IDCT rounding): the mean absolute difference per pixel value, at most
GPU_TOLERANCE = {"mean_abs": 2.0}


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


CHUNKS_DIR = "chunks"  # --store jpeg: one file of JPEG bytes per finished chunk


def _chunk_file(work: Path | str, chunk: int) -> Path:
    return Path(work) / CHUNKS_DIR / f"{chunk:08d}.jpg"


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
    ignored: int = 0  # images under SRC that the --labels table has no row for
    new_classes: list[str] = field(default_factory=list)  # appended by --allow-new-classes
    targets: list[str] = field(default_factory=list)  # names of the targets columns

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "count": self.count,
            "skipped": self.skipped,
            "classes": self.classes,
            "image_shape": self.image_shape,
            "seconds": round(self.seconds, 3),
            "resumed": self.resumed,
            "ignored": self.ignored,
            "new_classes": self.new_classes,
            # null without targets, as `imgpack info --json` says
            "targets": self.targets or None,
        }


@dataclass(frozen=True)
class _Labels:
    """The images to pack and what labels them, fixed before any decoding.

    ``scan.entries``: the images in pack order with their label index into
    ``scan.classes``; ``targets``: float32 [len(entries), K] aligned with them, or None.
    """

    scan: Scan
    targets: np.ndarray | None = None
    target_names: tuple[str, ...] = ()
    new_classes: list[str] = field(default_factory=list)
    ignored: int = 0
    class_map: str | None = None  # absolute path of --classes
    table: str | None = None  # absolute path of --labels
    table_sha256: str | None = None
    missing_rows: int = 0  # table rows naming no image (all, listed or not)


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


def _die_with_parent() -> None:
    """Linux: end this worker when the parent dies (so a killed build leaves no writers)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _worker_init(
    rows_path: str,
    spec: ResizeSpec,
    store: tuple[str, int, int | None] = ("raw", 3, None),
    forked: bool = False,
) -> None:
    global _worker
    _die_with_parent()
    if forked:
        _close_work_dir_fds(os.path.dirname(rows_path))
    # The parent handles Ctrl-C and SIGTERM and then kills its workers; a worker
    # that died of the signal itself would print a traceback and break the pool.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # the rows file is opened at the first chunk: the pool starts before the file exists
    _worker = _WorkerState(rows_path, spec, store, t_free=time.perf_counter())
    _worker.die_at = _test_death()
    if sys.platform.startswith("linux") and _writeback_mode() == "chunk":
        with contextlib.suppress(Exception):
            _worker.sync_file_range = ctypes.CDLL(None, use_errno=True).sync_file_range


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
    holds the build's ``flock``: close it, so the lock never outlives the parent."""
    work = os.path.realpath(work)
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/self/fd/{name}") == work:
                    os.close(int(name))


def _start_method() -> str:
    """How decode workers start. ``fork`` (Linux) when it is safe: this process runs
    no other thread and no CUDA context, so a child cannot inherit a lock held
    mid-operation; workers then start in milliseconds with the decoder already
    imported. Otherwise a fork server (boots a clean interpreter once, ~0.5 s for 16
    workers) or spawn. ``IMGPACK_BUILD_START`` overrides it, for benchmarks."""
    if not sys.platform.startswith("linux"):
        return "spawn"
    forced = os.environ.get("IMGPACK_BUILD_START")
    if forced in ("fork", "forkserver"):
        return forced
    torch = sys.modules.get("torch")
    cuda = False
    if torch is not None:
        with contextlib.suppress(Exception):
            cuda = bool(torch.cuda.is_initialized())
    return "fork" if threading.active_count() == 1 and not cuda else "forkserver"


def _writeback_mode() -> str:
    """``chunk``: start each chunk's writeback as soon as it is written (sync_file_range),
    so the final fsync has little left; ``off``: leave it to the kernel and the final
    fsync. ``IMGPACK_BUILD_WRITEBACK`` selects it, for benchmarks only."""
    return "off" if os.environ.get("IMGPACK_BUILD_WRITEBACK") == "off" else "chunk"


def _warm_up() -> None:
    """A no-op task: submitting one per worker starts the processes early."""


# what a worker reports with each chunk: seconds per step, and when it ran (perf_counter
# is CLOCK_MONOTONIC, one clock for every process of the machine)
_WORKER_STEPS = ("decode", "copy", "pwrite", "sha256", "writeback", "idle")


def _decode_chunk(
    task: tuple[int, int, list[str]],
) -> tuple[int, list[list[Any]], list[list[int]], str, dict[str, float]]:
    """Decode rows [start, start+len(paths)) and write them; return skips, sizes, sha
    and the worker's time split (``_WORKER_STEPS``, plus ``t_start``, ``t_end``, ``pid``)."""
    t_start = time.perf_counter()
    chunk, start, paths = task
    state = _worker
    assert state is not None, "_worker_init was not run in this process"
    _maybe_die(state, chunk)
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
            im, (w, h) = load_resized(path, spec)
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
    sha = digest(mv)
    t3 = time.perf_counter()
    if state.sync_file_range is not None:
        # start writing this range to disk now (non-blocking), so the single fsync
        # at the end has little left to wait for
        state.sync_file_range(state.fd, ctypes.c_int64(off), ctypes.c_int64(len(mv)), 2)
    t_end = time.perf_counter()
    times = {
        "decode": t_decode,
        "copy": t_copy,
        "pwrite": t2 - t1,
        "sha256": t3 - t2,
        "writeback": t_end - t3,
        "idle": t_start - state.t_free,
        "t_start": t_start,
        "t_end": t_end,
        "pid": os.getpid(),
    }
    state.t_free = t_end
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
    _, quality, max_side = state.store
    parts: list[bytes] = []
    skips: list[list[Any]] = []
    sizes: list[list[int]] = []
    lengths: list[int] = []
    stored: list[list[int]] = []
    reencoded = 0
    for i, path in enumerate(paths):
        try:
            data, hw, upright, again = jpeg_for_pack(path, max_side, quality, state.spec.max_pixels)
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
    t_end = time.perf_counter()
    times = {
        "decode": t0 - t_start,
        "copy": t1 - t0,
        "pwrite": t2 - t1,
        "sha256": t3 - t2,
        "writeback": t_end - t3,
        "idle": t_start - state.t_free,
        "t_start": t_start,
        "t_end": t_end,
        "pid": os.getpid(),
    }
    state.t_free = t_end
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


def _gpu_jpeg(data: bytes, path: str, max_pixels: int) -> tuple[int, int] | None:
    """(w, h) if ``data`` is a JPEG the GPU decodes as the CPU path would see it
    (baseline/progressive 8-bit, YCbCr or grey, no EXIF rotation, ending with its EOI
    marker), else None. CMYK fails in nvjpeg; a truncated file decodes there without
    an error (scripts/check_nvjpeg.py, H100, torchvision 0.26)."""
    frame = jpeg_frame(data)
    if frame is None or frame[0] not in (0xC0, 0xC1, 0xC2) or frame[1] != 8:
        return None
    if frame[2] not in (1, 3) or not data.endswith(b"\xff\xd9"):
        return None
    try:
        with open_image(io.BytesIO(data), path) as im:
            if im.mode not in ("RGB", "L") or im.size[0] * im.size[1] > max_pixels:
                return None
            if im.getexif().get(0x0112, 1) not in (0, 1):
                return None
            return im.size
    except Exception:  # anything odd: the CPU path decides, and names the reason
        return None


def _read_for_gpu(paths: list[str], spec: ResizeSpec) -> list[tuple[str, Any, Any]]:
    """--device cuda, in a CPU worker: per path ("jpeg", file bytes, (w, h)) for the GPU,
    else the CPU build's own decode: ("row", row bytes, upright (w, h)) or
    ("skip", reason, None)."""
    out: list[tuple[str, Any, Any]] = []
    buf = np.empty(spec.shape, dtype=np.uint8)
    for p in paths:
        try:
            with open_regular(p) as f:
                data = f.read()
        except DecodeError as e:
            out.append(("skip", str(e), None))
            continue
        except OSError as e:
            out.append(("skip", f"cannot read: {e.strerror}", None))
            continue
        size = _gpu_jpeg(data, p, spec.max_pixels)
        if size is not None:
            out.append(("jpeg", data, size))
            continue
        try:
            out.append(("row", None, decode_into(p, spec, buf)))
            out[-1] = ("row", buf.tobytes(), out[-1][2])
        except DecodeError as e:
            out.append(("skip", str(e), None))
    return out


# ---------------------------------------------------------------- the build


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
) -> BuildResult:
    """Build a pack at ``dst`` from the images under ``src``.

    ``progress(n)`` is called in this process after each chunk with the number
    of images it finished; ``on_start(total, already_done)`` once before work.
    Raises PackerError subclasses for unusable input; broken images are skipped
    and listed in the result. Interrupted builds resume when rerun.
    """
    t0 = time.perf_counter()
    config.validate()
    device = _build_device(config)
    given = Path(dst)
    # absolute first: the work folder's name comes from DST's, and "." has none
    src, dst = Path(src), Path(os.path.abspath(dst))
    refuse_symlink_destination(dst)  # before the scan: nothing is read for a DST we refuse
    plan = _plan_labels(src, config)
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

        def record(res: _ChunkResult) -> None:
            """Journal one finished chunk (its line fsynced), then report it."""
            t = time.perf_counter()
            chunk, skips, sizes, sha, chunk_times = res[:5]
            rec = {"chunk": chunk, "skips": skips, "sizes": sizes, "sha": sha}
            if len(res) > 5:  # --store jpeg: each image's stored length and size
                rec.update(res[5])
            if chunk_times is not None:  # None from the GPU path: no worker split
                times["chunks"].append(chunk_times)
            journal.write(json.dumps(rec, ensure_ascii=False) + "\n")
            journal.flush()
            os.fsync(journal.fileno())
            times["journal"] += time.perf_counter() - t
            times["journal_fsyncs"] += 1
            done[chunk] = rec
            if not t_first:
                t_first.append(time.perf_counter())
            if progress:
                progress(len(sizes))

        if device is not None:  # --device cuda: batched on the GPU, the rest on the workers
            from .build_gpu import decode_chunks_batched

            try:
                decode_chunks_batched(
                    pending, config.spec, str(work / ROWS_FILE), device, pool, record, write_plan
                )
            except BrokenProcessPool:
                raise WorkerDiedError(
                    "a CPU worker of the GPU build died (killed, or out of memory); "
                    f"{len(done)} of {len(chunks)} chunks are kept in the work folder: run "
                    "the same command again to resume"
                ) from None
        elif pool is None:  # in this process: no signal or parent-death handling of a worker
            global _worker
            _worker = _WorkerState(
                str(work / ROWS_FILE), config.spec, _store(config), t_free=time.perf_counter()
            )
            write_plan()
            try:
                for c in pending:
                    record(_chunk_fn(config)(c))
            finally:
                _worker.close()
                _worker = None
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
        ctx.set_forkserver_preload(["packer.build"])
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


def _reached(step: str) -> None:
    """Called between finalize's steps; crash tests make it raise to stop the build there."""


def _finalize(
    plan: _Labels,
    dst: Path,
    work: Path,
    config: BuildConfig,
    state: WorkState,
    block: int,
    resumed: int,
    t0: float,
    fingerprint: str,
    device: Any = None,
    times: dict[str, Any] | None = None,
) -> BuildResult:
    """Assemble the pack in ``work`` and move it to ``dst``, in idempotent steps.

    Each step's result is on disk before the next starts, and a rerun finds
    where a crash stopped: rows file present (data not yet moved), journal and
    plan (assembly not finished), ``"assembled"`` in the plan (only the move is
    left), no plan (the work is discarded and rebuilt), an old pack aside
    (:func:`recover_trash`).
    """
    spec = config.spec
    scan = plan.scan
    clock = {} if times is None else times.setdefault("finalize", {})
    t = time.perf_counter()
    if state.assembled:  # a crash came after the pack was complete: only the move is left
        m = read_manifest(work)
        count, skipped = m.count, [{"path": k.path, "reason": k.reason} for k in m.skipped]
        return _move_into_place(work, dst, count, skipped, plan, spec, resumed, t0)
    done = state.done
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
    if not keep:
        clear_work_dir(work)  # nothing usable: no pack, and nothing left beside DST
        first = scan.entries[0].rel
        raise NoUsableImagesError(
            f"{scan.root}: none of its {len(scan.entries)} images could be used (first: "
            f"{first}: {skip_reason[0]}); no pack was written"
        )
    images_path = work / DATA_DIR / IMAGES_FILE
    (work / DATA_DIR).mkdir(exist_ok=True)
    jpeg: dict[str, Any] = {}
    if config.store == "jpeg":
        jpeg = _assemble_jpeg(work, done, block)
        shas = jpeg["shas"]
    elif (work / ROWS_FILE).exists():
        fd = os.open(work / ROWS_FILE, os.O_RDONLY)
        try:
            os.fsync(fd)  # all rows durable before anything depends on them
        finally:
            os.close(fd)
        clock["fsync_rows"] = time.perf_counter() - t
        t = time.perf_counter()
        if skip_reason:
            shas = _compact(work / ROWS_FILE, images_path, keep, row, block)
            os.remove(work / ROWS_FILE)
        else:
            os.replace(work / ROWS_FILE, images_path)
    elif skip_reason:  # compacted by an earlier run that stopped before the manifest
        shas = _block_shas(images_path, row, block)
    clock["compact_or_rename"] = time.perf_counter() - t
    t = time.perf_counter()
    _reached("data")
    labels = np.array([scan.entries[i].label for i in keep], dtype="<i8")
    _write_atomic(work / DATA_DIR / LABELS_FILE, labels.tobytes())
    targets_sha = ""
    if plan.targets is not None:
        # the same kept rows as the labels; float32 as read, never cast (little-endian
        # C-order, what tensordict's memmap and packer.load map)
        targets = np.ascontiguousarray(plan.targets[keep], dtype="<f4")
        _write_atomic(work / DATA_DIR / TARGETS_FILE, targets.tobytes())
        targets_sha = digest(targets.tobytes())
    _reached("labels")
    skipped = _skip_list(scan, skip_reason)
    counts = (
        np.bincount(labels[labels >= 0], minlength=len(scan.classes)).tolist()
        if scan.classes
        else []  # integer labels from a table without a map: no classes to count
    )
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
            labels_table=plan.table,
            labels_sha256=plan.table_sha256,
            unlisted=plan.ignored if plan.table is not None else None,
            extra={"missing_rows": plan.missing_rows} if plan.missing_rows else {},
        ),
        checksums=Checksums(
            block_rows=block,
            images=tuple(shas),
            labels=digest(labels.tobytes()),
            targets=targets_sha,
            index=jpeg.get("index", ""),
        ),
        targets=plan.target_names,
        class_map=plan.class_map,
    )
    if device is not None:
        extra = {**manifest.build.extra, "device": device.type, "tolerance": GPU_TOLERANCE}
        manifest = replace(manifest, build=replace(manifest.build, extra=extra))
    if jpeg:
        manifest = replace(
            manifest,
            image_shape=(3, *jpeg["max_hw"]),
            storage="jpeg",
            storage_version=JPEG_STORAGE_VERSION,
            jpeg_bytes=jpeg["bytes"],
            max_side=config.max_side,
            quality=config.quality,
            build=replace(
                manifest.build, extra={**manifest.build.extra, "reencoded": jpeg["reencoded"]}
            ),
        )
    write_pack_metadata(work, manifest)
    fsync_dir(work / DATA_DIR)
    fsync_dir(work)
    _reached("manifest")
    mark_assembled(work, fingerprint)
    _reached("assembled")
    clock["metadata"] = time.perf_counter() - t
    t = time.perf_counter()
    result = _move_into_place(work, dst, n, skipped, plan, spec, resumed, t0)
    clock["move"] = time.perf_counter() - t
    result.image_shape = list(manifest.image_shape)  # jpeg: the largest stored image
    return result


def _assemble_jpeg(work: Path, done: dict[int, dict[str, Any]], block: int) -> dict[str, Any]:
    """--store jpeg: concatenate the chunk files, in order, into ``jpeg.memmap`` and write
    the offsets, lengths and sizes of the kept images. Restartable: the chunk files are
    removed only after the byte file is complete and fsynced; a rerun that finds them
    gone hashes the byte file instead.

    Returns ``shas`` (SHA-256 per block of ``block`` kept images' bytes), ``index`` (of
    the three index files), ``bytes``, ``max_hw`` and ``reencoded``.
    """
    lengths: list[int] = []
    stored: list[list[int]] = []
    per_chunk: list[list[int]] = []
    reencoded = 0
    for k in sorted(done):
        rec = done[k]
        kept = [n for n in rec["lengths"] if n > 0]
        per_chunk.append(kept)
        lengths.extend(kept)
        stored.extend(hw for n, hw in zip(rec["lengths"], rec["stored"]) if n > 0)
        reencoded += int(rec.get("reencoded", 0))
    lens = np.array(lengths, dtype="<i8")
    offsets = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype("<i8") if len(lens) else lens
    sizes = np.array(stored, dtype="<i8").reshape(-1, 2)
    out = work / DATA_DIR / JPEG_FILE
    chunk_dir = work / CHUNKS_DIR
    if (work / ROWS_FILE).exists():  # the marker: chunks not yet joined into ``out``
        tmp = out.with_name(out.name + ".tmp")
        with open(tmp, "wb") as f:
            for k in sorted(done):
                f.write(_chunk_file(work, k).read_bytes())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
        fsync_dir(out.parent)
        (work / ROWS_FILE).unlink()
        fsync_dir(work)
    shutil.rmtree(chunk_dir, ignore_errors=True)
    shas: list[str] = []
    with open(out, "rb") as f:
        for b in range(0, len(lens), block):
            shas.append(digest(f.read(int(lens[b : b + block].sum()))))
    index = offsets.tobytes() + lens.tobytes() + sizes.tobytes()
    _write_atomic(work / DATA_DIR / OFFSETS_FILE, offsets.tobytes())
    _write_atomic(work / DATA_DIR / LENGTHS_FILE, lens.tobytes())
    _write_atomic(work / DATA_DIR / SIZES_FILE, sizes.tobytes())
    return {
        "shas": shas,
        "index": digest(index),
        "bytes": int(lens.sum()),
        "max_hw": tuple(int(v) for v in sizes.max(0)) if len(sizes) else (1, 1),
        "reencoded": reencoded,
    }


def _skip_list(scan: Scan, skip_reason: dict[int, str]) -> list[dict[str, str]]:
    """Every skip, by path: what the scan could not read and the images that did not decode."""
    skipped = [{"path": scan.entries[i].rel, "reason": r} for i, r in skip_reason.items()]
    return sorted(scan.skipped + skipped, key=lambda s: s["path"])


def _move_into_place(
    work: Path,
    dst: Path,
    count: int,
    skipped: list[dict[str, str]],
    plan: _Labels,
    spec: ResizeSpec,
    resumed: int,
    t0: float,
) -> BuildResult:
    """The last steps: drop the build's bookkeeping, then rename the pack to DST."""
    for name in (JOURNAL, PLAN):  # the plan last: it says what the work folder is
        (work / name).unlink(missing_ok=True)
        fsync_dir(work)
        _reached(name)
    if dst.exists() and any(dst.iterdir()):
        trash = trash_dir_for(dst)
        if trash.exists():
            shutil.rmtree(trash)
        os.replace(dst, trash)
        _reached("aside")
        os.replace(work, dst)
        _reached("moved")
        shutil.rmtree(trash)
    else:
        os.replace(work, dst)  # onto a missing or empty DST: one atomic rename
    fsync_dir(dst.parent)
    return BuildResult(
        path=dst,
        count=count,
        skipped=skipped,
        classes=plan.scan.classes,
        image_shape=list(spec.shape),
        seconds=time.perf_counter() - t0,
        resumed=resumed,
        ignored=plan.ignored,
        new_classes=list(plan.new_classes),
        targets=list(plan.target_names),
    )


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


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
