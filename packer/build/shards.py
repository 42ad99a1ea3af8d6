"""``imgpack build --shard-size SIZE [--append]``: a pack set of immutable shards.

Data flow::

    scan + labels (as a single build: one class map for every shard) -> cut the list
    into shards in source order -> each shard a complete pack, built by the single-pack
    build into SET/<k>-<hash> -> the index (packer.pack.index), written last: the commit

Where shards end is fixed by the inputs and the options only:

* raw storage: a fixed image count per shard, ``shard_size // (3 * H * W)`` (at least
  one), so every shard but the last holds the same count;
* ``--store jpeg``: by the cumulative size of the source files; a shard ends before
  the image that would take it past ``shard_size`` (each holds at least one). Stored
  JPEGs are about their sources' size (kept byte for byte, or re-encoded once).

A shard's name is its position and a hash of its inputs (relative paths, sizes, mtimes,
labels, targets), the class map, the source folder, the options and the imgpack
version; its manifest records no build time. So the same command gives the same names
and bytes whatever the timing or ``--workers``.

Crash safety: each shard is built by :func:`packer.build.run.build` (its own work folder
beside it, inside the set, resumed by a rerun) and renamed into place whole. A rerun of
a killed build keeps every shard already in place (its manifest valid), builds the rest
and writes the index: byte-identical to an uninterrupted build. Shards no index names
(left by a build with other inputs) are removed once the new index is in place.

``--append`` reads the index, refuses other options, class map or targets (naming
which), builds the images under SRC that the set has not seen (neither holds nor
skipped) as new shards after the old ones, which are never rewritten, and swaps the
index. An image whose path the set holds is not rebuilt even if its file changed;
removing images from a set is not offered (build a new set).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from .._version import __version__
from ..errors import InputError, NoUsableImagesError, PackFormatError, UsageError
from ..pack.files import check_files, loads_json, read_manifest
from ..pack.index import (
    INDEX,
    OPTION_KEYS,
    SET_VERSION,
    SetIndex,
    ShardEntry,
    data_bytes,
    is_set,
    manifest_digest,
    read_index,
    read_shard_manifest,
    write_index,
)
from ..pack.schema import FORMAT_VERSION, MANIFEST, Manifest, Skip
from ..pack.writer import image_bytes
from ..sources.scan import Scan
from .config import BuildConfig, BuildResult, _Labels
from .finalize import _classes_from
from .plan import check_not_nested, plan_labels
from .run import _build_device, build
from .workdir import dest_lock, destination_error, refuse_symlink_destination

log = logging.getLogger(__name__)

DEFAULT_SHARD_SIZE = 256 * 1000**2  # 256 MB: ~1,700 224x224 raw images, ~2,000 ImageNet JPEGs
_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*")
# what a set build writes into the set folder besides the index
_SHARD_DIR = re.compile(r"(\d{5,})-[0-9a-f]{16}")
_OWN = re.compile(r"\.?(\d{5,})-[0-9a-f]{16}(\.imgpack-partial|\.imgpack-old)?")
_FLAGS = {
    "size": "--size",
    "resize": "--resize",
    "max_pixels": "--max-pixels",
    "store": "--store",
    "quality": "--quality",
    "max_side": "--max-side",
    "device": "--device",
}


def parse_bytes(text: str, option: str = "--shard-size") -> int:
    """``"256MB"`` -> 256000000. Units (any case): B, KB, MB, GB, TB (powers of 1000),
    KiB, MiB, GiB, TiB (powers of 1024); a bare number is bytes. UsageError naming
    ``option`` for anything else or a size below one byte."""
    m = _SIZE.fullmatch(str(text).lower())
    if m is None or m.group(2) not in _UNITS:
        raise UsageError(
            f"{option} {text!r}: give a size such as 256MB, 1GB or 512MiB "
            "(units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"
        )
    value = int(float(m.group(1)) * _UNITS[m.group(2)])
    if value < 1:
        raise UsageError(f"{option} {text!r}: must be at least one byte")
    return value


class ShardSink:
    """Where a set build sends each shard once it is in place (see build_set)."""

    def holds(self, path: Path) -> bool:
        """Whether the shard whose local folder is ``path`` (its manifest at least) is
        already there, whole: the build keeps it without building it again."""
        return False

    def put(self, path: Path) -> None:
        """Send the complete shard at ``path``."""


def _reached(step: str) -> None:
    """Called between a set build's steps ("shard <k>" once shard k is in place, "index"
    before the index is written, "committed" after); crash tests make it stop there."""


def set_options(config: BuildConfig, device: Any) -> dict[str, Any]:
    """The build options a set records and ``--append`` must repeat (OPTION_KEYS)."""
    opts = {
        "size": list(config.size),
        "resize": config.resize,
        "max_pixels": config.max_pixels,
        "store": config.store,
        "quality": config.quality,
        "max_side": config.max_side,
        "device": "cpu" if device is None else device.type,
    }
    assert tuple(opts) == OPTION_KEYS
    return opts


def _stats(scan: Scan) -> list[tuple[int, str]]:
    """(size in bytes, "size:mtime_ns" stamp) of each entry; a file gone since the scan
    counts 0 bytes and is skipped by its shard's build."""
    out = []
    root = str(scan.root)
    for e in scan.entries:
        try:
            st = os.stat(os.path.join(root, e.rel))
            out.append((st.st_size, f"{st.st_size}:{st.st_mtime_ns}"))
        except OSError:
            out.append((0, "missing"))
    return out


def cut(sizes: list[int], store: str, row_bytes: int, shard_size: int) -> list[tuple[int, int]]:
    """``[start, end)`` of each shard over a list of inputs (see the module docstring):
    raw, ``shard_size // row_bytes`` images each; jpeg, by cumulative source bytes."""
    n = len(sizes)
    if store == "raw":
        per = max(1, shard_size // max(row_bytes, 1))
        return [(a, min(a + per, n)) for a in range(0, n, per)]
    out, start, total = [], 0, 0
    for i, s in enumerate(sizes):
        if i > start and total + s > shard_size:
            out.append((start, i))
            start, total = i, 0
        total += s
    if start < n:
        out.append((start, n))
    return out


def shard_name(position: int, plan: _Labels, stamps: list[str], options: dict[str, Any]) -> str:
    """``<position>-<16 hex>``: a hash of everything the shard's bytes depend on."""
    h = hashlib.sha256()
    head = [
        SET_VERSION,
        FORMAT_VERSION,
        __version__,
        options,
        plan.scan.classes,
        str(plan.scan.root.resolve()),
        plan.class_map,
        plan.table,
        plan.table_sha256,
        list(plan.target_names),
    ]
    h.update(json.dumps(head).encode())
    for e, stamp in zip(plan.scan.entries, stamps):
        h.update(f"{e.rel}\0{e.label}\0{stamp}\n".encode("utf-8", "surrogateescape"))
    if plan.targets is not None:
        h.update(plan.targets.astype("<f4").tobytes())
    return f"{position:05d}-{h.hexdigest()[:16]}"


def _slice(plan: _Labels, a: int, b: int) -> _Labels:
    """The part of ``plan`` a shard packs: the same class map, no set-wide skips."""
    scan = Scan(root=plan.scan.root, classes=plan.scan.classes, entries=plan.scan.entries[a:b])
    targets = None if plan.targets is None else plan.targets[a:b]
    return replace(plan, scan=scan, targets=targets, ignored=0, missing_rows=0, shard=True)


def _complete(path: Path) -> bool:
    """Whether a shard folder already holds a whole, valid pack (a rerun keeps it)."""
    if path.is_symlink() or not path.is_dir():
        return False
    try:
        check_files(path, read_manifest(path))
        return True
    except PackFormatError:
        return False


def _check_destination(src: Path, dst: Path, config: BuildConfig) -> None:
    """Refuse a set destination that would lose data or nest the set inside its source."""
    check_not_nested(src, dst, "set")
    if not (dst.exists() or dst.is_symlink()):
        if config.append:
            raise UsageError(
                f"--append: {dst} holds no pack set; build one first (without --append)"
            )
        return
    if not dst.is_dir():
        raise InputError(f"{dst}: exists and is not a folder; choose another destination")
    if (dst / MANIFEST).exists():
        raise InputError(
            f"{dst}: holds a single pack; --shard-size writes a pack set, choose another "
            "destination (or remove the pack yourself)"
        )
    if is_set(dst):
        if not (config.append or config.overwrite):
            raise InputError(
                f"{dst}: a pack set already exists; pass --append to add SRC's new images "
                "or --overwrite to rebuild it"
            )
        return
    if config.append:
        raise UsageError(f"--append: {dst} holds no pack set; build one first (without --append)")
    other = sorted(n for n in os.listdir(dst) if not _OWN.fullmatch(n) and n != INDEX + ".tmp")
    if other:
        raise InputError(
            f"{dst}: exists and is not a pack set (it holds {other[0]!r}); refusing to "
            "write into it (choose a new path or remove it yourself)"
        )


def _check_append(old: SetIndex, plan: _Labels, options: dict[str, Any], dst: Path) -> None:
    """--append: the same options, class map and targets as the set, or UsageError /
    InputError naming what differs."""
    for key in OPTION_KEYS:
        if old.options[key] != options[key]:
            have, want = old.options[key], options[key]
            if key == "size":
                have, want = "x".join(map(str, have)), "x".join(map(str, want))
            raise UsageError(
                f"--append: {_FLAGS[key]} {want} differs from the set's {have} ({dst}); "
                "give the options the set was built with"
            )
    if tuple(plan.scan.classes) != old.classes:
        added = [c for c in plan.scan.classes if c not in old.classes]
        gone = [c for c in old.classes if c not in plan.scan.classes]
        what = (
            f"classes not in the set: {added}"
            if added
            else f"set classes missing: {gone}"
            if gone
            else "the same classes in another order"
        )
        raise InputError(
            f"--append: the class map of SRC differs from the set's ({what}); a set keeps "
            f"one class map (see `imgpack info {dst}`): fix SRC or build a new set"
        )
    if tuple(plan.target_names) != old.targets:
        raise UsageError(
            f"--append: --targets {','.join(plan.target_names) or '(none)'} differs from the "
            f"set's {','.join(old.targets) or '(none)'}"
        )


def _seen(root: Path, old: SetIndex) -> set[str]:
    """Every source path the set holds or skipped (what --append leaves out)."""
    seen = {s.path for s in old.skipped}
    for entry in old.shards:
        m = read_shard_manifest(root, entry, old)
        seen.update(m.sources)
        seen.update(s.path for s in m.skipped)
    return seen


def _next_position(old: SetIndex) -> int:
    nums = [_SHARD_DIR.fullmatch(s.name) for s in old.shards]
    if all(nums):
        return max(int(m.group(1)) for m in nums if m) + 1
    return len(old.shards)


def _entry(path: Path) -> tuple[ShardEntry, Manifest]:
    """The index's record of the shard just built (or kept) at ``path``."""
    data = (path / MANIFEST).read_bytes()
    m = Manifest.from_json(loads_json(data), where=f"{path}: {MANIFEST}")
    return ShardEntry(path.name, m.count, data_bytes(m), manifest_digest(data)), m


def _clean(dst: Path, keep: set[str]) -> None:
    """Remove what earlier set builds left that this index does not name."""
    for name in os.listdir(dst):
        m = _OWN.fullmatch(name)
        stale = (m is not None and name not in keep) or name == INDEX + ".tmp"
        path = dst / name
        if not stale:
            continue
        log.info("removing %s: no shard of the set's index", path)
        if path.is_symlink() or not path.is_dir():
            path.unlink()
        else:
            shutil.rmtree(path)


def build_set(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    config: BuildConfig,
    progress: Callable[[int], None] | None = None,
    on_start: Callable[[int, int], None] | None = None,
    sink: ShardSink | None = None,
) -> BuildResult:
    """Build (or with ``config.append``, extend) the pack set at ``dst`` from ``src``.

    ``sink``: where each shard goes once it is in place (object storage: see
    :mod:`packer.build.upload`); a shard the sink already holds is not built again.

    ``config.shard_size``: bytes per shard (None: :data:`DEFAULT_SHARD_SIZE`).
    ``progress(n)``: n more images decoded; ``on_start(total, already_done)`` once,
    ``already_done`` counting the images of shards kept from an interrupted run.
    Returns the result of the whole set (``shards`` set). Raises PackerError
    subclasses as a single build does, and for ``--append`` with other options.
    """
    t0 = time.perf_counter()
    config.validate()
    shard_size = config.shard_size or DEFAULT_SHARD_SIZE
    device = _build_device(config)
    given = Path(dst)
    src, dst = Path(src), Path(os.path.abspath(dst))
    refuse_symlink_destination(dst)
    plan = plan_labels(src, config)
    _check_destination(src, dst, config)
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        with dest_lock(dst):
            _check_destination(src, dst, config)  # again, now that we hold the lock
            dst.mkdir(exist_ok=True)
            result = _build_set_locked(
                src, dst, plan, config, shard_size, device, progress, on_start, t0, sink
            )
    except OSError as e:
        raise destination_error(e, dst) from None
    result.path = given
    return result


def _only_new(plan: _Labels, dst: Path, old: SetIndex) -> _Labels:
    """``plan`` less the images the set at ``dst`` already holds (``--append``)."""
    seen = _seen(dst, old)
    keep_rows = [i for i, e in enumerate(plan.scan.entries) if e.rel not in seen]
    entries = [plan.scan.entries[i] for i in keep_rows]
    targets = None if plan.targets is None else plan.targets[keep_rows]
    return replace(plan, scan=replace(plan.scan, entries=entries), targets=targets)


def _build_set_locked(
    src: Path,
    dst: Path,
    plan: _Labels,
    config: BuildConfig,
    shard_size: int,
    device: Any,
    progress: Callable[[int], None] | None,
    on_start: Callable[[int, int], None] | None,
    t0: float,
    sink: ShardSink | None = None,
) -> BuildResult:
    options = set_options(config, device)
    old = read_index(dst) if config.append else None
    start = 0
    if old is not None:
        _check_append(old, plan, options, dst)
        plan = _only_new(plan, dst, old)
        start = _next_position(old)
    stats = _stats(plan.scan)
    row = image_bytes(config.spec.shape)
    bounds = cut([s for s, _ in stats], config.store, row, shard_size)
    shards = [
        (shard_name(start + k, _slice(plan, a, b), [t for _, t in stats[a:b]], options), a, b)
        for k, (a, b) in enumerate(bounds)
    ]
    done = {
        name
        for name, _, _ in shards
        if _complete(dst / name) or (sink is not None and sink.holds(dst / name))
    }
    kept = sum(b - a for name, a, b in shards if name in done)
    if on_start:
        on_start(len(plan.scan.entries), kept)
    shard_config = replace(config, shard_size=None, append=False, overwrite=False)
    new: list[ShardEntry] = []
    failed: list[Skip] = []
    skipped = list(plan.scan.skipped)
    resumed = kept
    shapes = []
    built = 0
    for k, (name, a, b) in enumerate(shards):
        path = dst / name
        if name not in done:
            part = _slice(plan, a, b)
            cfg = replace(shard_config, overwrite=path.is_dir() and (path / MANIFEST).exists())
            try:
                r = build(src, path, cfg, progress=progress, plan=part)
                resumed += r.resumed
                built += 1
            except NoUsableImagesError as e:
                # not one image of the shard decoded: the set goes on without it, and the
                # paths are recorded so --append does not try them again
                reason = f"no image of its shard could be used ({e})"
                failed.extend(Skip(x.rel, reason) for x in part.scan.entries)
                _reached(f"shard {k}")
                continue
        entry, m = _entry(path)
        if sink is not None:
            sink.put(path)
        new.append(entry)
        shapes.append(m.image_shape)
        skipped.extend({"path": s.path, "reason": s.reason} for s in m.skipped)
        _reached(f"shard {k}")
    skipped.extend({"path": s.path, "reason": s.reason} for s in failed)
    all_shards = (old.shards if old is not None else ()) + tuple(new)
    if not all_shards:
        raise NoUsableImagesError(
            f"{src}: none of its {len(plan.scan.entries)} images could be used; no set written"
        )
    if old is not None:
        shapes.append(old.image_shape)
    shape = tuple(max(s[i] for s in shapes) for i in range(3))
    index = SetIndex(
        count=sum(s.count for s in all_shards),
        image_shape=(shape[0], shape[1], shape[2]),
        storage=config.store,
        classes=tuple(plan.scan.classes),
        shards=all_shards,
        options=options,
        shard_size=shard_size,
        targets=tuple(plan.target_names),
        skipped=(old.skipped if old is not None else ()) + tuple(failed),
    )
    _reached("index")
    write_index(dst, index)
    _reached("committed")
    _clean(dst, {s.name for s in index.shards})
    return BuildResult(
        path=dst,
        count=index.count,
        skipped=sorted(skipped, key=lambda s: s["path"]),
        classes=list(index.classes),
        image_shape=list(index.image_shape),
        seconds=time.perf_counter() - t0,
        resumed=resumed,
        extra={
            "shards_built": built,
            "shards_kept": len(done),
            "shards_failed": len(shards) - len(new),
        },
        ignored=plan.ignored,
        new_classes=list(plan.new_classes),
        targets=list(plan.target_names),
        classes_from=_classes_from(plan),
        storage=config.store,
        shards=len(index.shards),
    )
