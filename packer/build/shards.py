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

Who builds the shards is an engine's choice, never the bytes': :func:`plan_set` (the
driver's plan), :func:`commit_shard` (one shard, put in place whole; idempotent) and
:func:`finish_set` (the index) are the same for the local engine (one shard after
another, here) and ``--engine ray`` (:mod:`packer.build.ray_engine`, a task per shard).

``--append`` reads the index, refuses other options, class map or targets (naming
which), builds the images under SRC that the set has not seen (neither holds nor
skipped) as new shards after the old ones, which are never rewritten, and swaps the
index. An image whose path the set holds is not rebuilt even if its file changed;
removing images from a set is not offered (build a new set).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
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

    #: ``--engine ray``: the object-store URL each task uploads its own shard to (built
    #: in a node-local folder), or None: the shards are in DST and :meth:`put` sends them
    url: str | None = None

    def sent(self, path: Path, uploaded: bool) -> None:
        """A task sent shard ``path.name`` itself (``uploaded``: False if it was there
        already): bring what the index needs of it (its manifest) into ``path``."""

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
    objects = getattr(scan, "objects", None)
    if objects is not None:  # a bucket's listing (packer.sources.bucket): size and ETag
        return [
            (objects[e.rel][0], f"{objects[e.rel][0]}:{objects[e.rel][1]}") for e in scan.entries
        ]
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
        getattr(plan.scan, "url", None) or str(plan.scan.root.resolve()),
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
    scan = replace(plan.scan, entries=plan.scan.entries[a:b], skipped=[])
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
    _check_set_destination(dst, config)


def _check_set_destination(dst: Path, config: BuildConfig) -> None:
    """Refuse a set destination that would lose data."""
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
    on_shard: Callable[[int, int], None] | None = None,
    sink: ShardSink | None = None,
) -> BuildResult:
    """Build (or with ``config.append``, extend) the pack set at ``dst`` from ``src``.

    ``sink``: where each shard goes once it is in place (object storage: see
    :mod:`packer.build.upload`); a shard the sink already holds is not built again.

    ``config.shard_size``: bytes per shard (None: :data:`DEFAULT_SHARD_SIZE`).
    ``progress(n)``: n more images decoded; ``on_start(total, already_done)`` once,
    ``already_done`` counting the images of shards kept from an interrupted run;
    ``on_shard(done, total)`` after each shard. ``config.engine``: who builds the
    shards (``"ray"``: :mod:`packer.build.ray_engine`); the bytes are the same.
    Returns the result of the whole set (``shards`` set). Raises PackerError
    subclasses as a single build does, and for ``--append`` with other options.
    """
    t0 = time.perf_counter()
    config.validate()
    shard_size = config.shard_size or DEFAULT_SHARD_SIZE
    if config.engine == "ray":
        from .ray_engine import cluster_device, import_ray

        import_ray()  # before the scan: a missing extra is a one-line error at once
        device = cluster_device(config)
    else:
        device = _build_device(config)
    given = Path(dst)
    dst = Path(os.path.abspath(dst))
    refuse_symlink_destination(dst)
    if isinstance(src, str) and "://" in src:  # a bucket of images (packer.build.upload)
        from ..storage.url import parse_url
        from .upload import plan_bucket

        src = str(parse_url(src))  # stays the URL (SetPlan.src), written one way
        plan = plan_bucket(src, config)
        check = functools.partial(_check_set_destination, dst, config)
    else:
        src = Path(src)
        plan = plan_labels(src, config)
        check = functools.partial(_check_destination, src, dst, config)
    check()
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        with dest_lock(dst):
            check()  # again, now that we hold the lock
            dst.mkdir(exist_ok=True)
            result = _build_set_locked(
                src, dst, plan, config, shard_size, device, progress, on_start, on_shard, t0, sink
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


@dataclass
class SetPlan:
    """A set build as the driver fixes it before any shard is built: the labelled images,
    where each shard starts and ends, its name, and which shards are already in place.
    Every engine (local, :mod:`packer.build.ray_engine`) builds from one."""

    src: Path  # or an object-store URL (str) of images: --engine ray
    dst: Path
    plan: _Labels
    config: BuildConfig
    shard_size: int
    options: dict[str, Any]
    old: SetIndex | None
    start: int  # the position of the first new shard (after the old ones, --append)
    shards: list[tuple[str, int, int]]  # (name, first row, end row) in plan.scan.entries
    done: set[str]  # shards already in place (a rerun keeps them)

    @property
    def kept(self) -> int:
        """Images in the shards already in place."""
        return sum(b - a for name, a, b in self.shards if name in self.done)

    @property
    def shard_config(self) -> BuildConfig:
        """The options each shard is built with (a single pack, never an append)."""
        return replace(self.config, shard_size=None, append=False, overwrite=False)

    def part(self, k: int) -> _Labels:
        """The labelled images of shard ``k``."""
        _, a, b = self.shards[k]
        return _slice(self.plan, a, b)


@dataclass
class ShardOutcome:
    """What building (or keeping) one shard gave: ``failed`` lists each input of a shard
    none of whose images could be used (it is left out of the set), else it is empty."""

    name: str
    built: bool
    resumed: int = 0
    failed: list[Skip] = field(default_factory=list)


def plan_set(
    src: Path,
    dst: Path,
    plan: _Labels,
    config: BuildConfig,
    shard_size: int,
    device: Any,
    sink: ShardSink | None = None,
) -> SetPlan:
    """Cut ``plan`` into named shards (``--append``: only SRC's new images, after the
    set's shards), and find the ones already in place. ``dst`` must exist (lock held)."""
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
    return SetPlan(src, dst, plan, config, shard_size, options, old, start, shards, done)


def commit_shard(
    src: Path,
    dst: Path,
    name: str,
    part: _Labels,
    config: BuildConfig,
    progress: Callable[[int], None] | None = None,
) -> ShardOutcome:
    """Build shard ``name`` of the set at ``dst`` from ``part`` and put it in place whole
    (:func:`packer.build.run.build`: a work folder beside it, resumed by a rerun, renamed
    into place when complete). Idempotent: a shard already in place is kept. ``config``:
    :attr:`SetPlan.shard_config`. A destination other than a shared folder (an object
    store) replaces this step: build into a local folder, then upload under ``name``."""
    path = dst / name
    if _complete(path):  # a retry of a task that died after the shard went into place
        return ShardOutcome(name, built=True)
    cfg = replace(config, overwrite=path.is_dir() and (path / MANIFEST).exists())
    try:
        r = build(src, path, cfg, progress=progress, plan=part)
    except NoUsableImagesError as e:
        # not one image of the shard decoded: the set goes on without it, and the
        # paths are recorded so --append does not try them again
        reason = f"no image of its shard could be used ({e})"
        failed = [Skip(x.rel, reason) for x in part.scan.entries]
        return ShardOutcome(name, built=False, failed=failed)
    return ShardOutcome(name, built=True, resumed=r.resumed)


def _run_local(
    sp: SetPlan,
    progress: Callable[[int], None] | None,
    on_shard: Callable[[int, int], None] | None,
    sink: ShardSink | None = None,
) -> list[ShardOutcome]:
    """The local engine: one shard after another, each with this machine's workers; each
    sent to ``sink`` as soon as it is in place."""
    out = []
    for k, (name, _a, _b) in enumerate(sp.shards):
        ok = True
        if name not in sp.done:
            o = commit_shard(sp.src, sp.dst, name, sp.part(k), sp.shard_config, progress)
            out.append(o)
            ok = not o.failed
        if sink is not None and ok:
            sink.put(sp.dst / name)
        if on_shard:
            on_shard(k + 1, len(sp.shards))
        _reached(f"shard {k}")
    return out


def _build_set_locked(
    src: Path,
    dst: Path,
    plan: _Labels,
    config: BuildConfig,
    shard_size: int,
    device: Any,
    progress: Callable[[int], None] | None,
    on_start: Callable[[int, int], None] | None,
    on_shard: Callable[[int, int], None] | None,
    t0: float,
    sink: ShardSink | None = None,
) -> BuildResult:
    sp = plan_set(src, dst, plan, config, shard_size, device, sink)
    if on_start:
        on_start(len(sp.plan.scan.entries), sp.kept)
    if config.engine == "ray":
        from .ray_engine import run_ray

        outcomes, extra = run_ray(sp, progress, on_shard, sink)
    else:
        outcomes, extra = _run_local(sp, progress, on_shard, sink), {}
    return finish_set(sp, outcomes, t0, extra)


def finish_set(
    sp: SetPlan, outcomes: list[ShardOutcome], t0: float, extra: dict[str, Any] | None = None
) -> BuildResult:
    """Every shard of ``sp`` in place (or failed, per ``outcomes``): write the index (the
    commit), remove what no index names, and return the set's result."""
    src, dst, plan, config = sp.src, sp.dst, sp.plan, sp.config
    by_name = {o.name: o for o in outcomes}
    old = sp.old
    new: list[ShardEntry] = []
    failed: list[Skip] = []
    skipped = list(plan.scan.skipped)
    shapes = []
    where = (extra or {}).pop("where", {})
    per_shard = []
    for name, a, b in sp.shards:
        o = by_name.get(name)
        row: dict[str, Any] = {"name": name, "images": b - a}
        per_shard.append(row)
        if o is not None and o.failed:
            failed.extend(o.failed)
            row.update(count=0, skipped=len(o.failed), status="failed", **where.get(name, {}))
            continue
        entry, m = _entry(dst / name)
        new.append(entry)
        shapes.append(m.image_shape)
        skipped.extend({"path": s.path, "reason": s.reason} for s in m.skipped)
        status = "built" if o is not None and o.built else "kept"
        row.update(count=m.count, skipped=len(m.skipped), status=status, **where.get(name, {}))
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
        options=sp.options,
        shard_size=sp.shard_size,
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
        resumed=sp.kept + sum(o.resumed for o in outcomes),
        extra={
            "shards_built": sum(o.built for o in outcomes),
            "shards_kept": len(sp.done),
            "shards_failed": len(sp.shards) - len(new),
            **(extra or {}),
        },
        ignored=plan.ignored,
        new_classes=list(plan.new_classes),
        targets=list(plan.target_names),
        classes_from=_classes_from(plan),
        storage=config.store,
        shards=len(index.shards),
        per_shard=per_shard,
    )
