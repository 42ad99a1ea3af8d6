"""Where a set build's shards end, their names, which are in place already, and what
``--append`` adds: :func:`plan_set` fixes a :class:`SetPlan` before any shard is built.

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
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .._version import __version__
from ..errors import InputError, PackFormatError, UsageError
from ..pack.files import check_files, read_manifest
from ..pack.index import (
    OPTION_KEYS,
    SET_VERSION,
    SetIndex,
    read_index,
    read_shard_manifest,
)
from ..pack.kinds import kind_of
from ..pack.schema import FORMAT_VERSION
from ..pack.writer import image_bytes
from ..sources.scan import Scan
from .config import BuildConfig, _Labels

_SHARD_DIR = re.compile(r"(\d{5,})-[0-9a-f]{16}")  # a shard's folder in the set
_F = "BuildConfig."  # how messages name a field (the CLI shows its flag: packer.cli.flags)


class ShardSink:
    """Where a set build sends each shard once it is in place (see shards.build_set)."""

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
    the kind's cut (raw, ``shard_size // row_bytes`` images each; jpeg, by cumulative
    source bytes)."""
    return kind_of(store).cut(sizes, row_bytes, shard_size)


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
    if getattr(plan, "dense", None) is not None:  # boxes, masks: other annotations, other shard
        from .dense import dense_digest

        h.update(dense_digest(plan.dense, [e.rel for e in plan.scan.entries]))
    return f"{position:05d}-{h.hexdigest()[:16]}"


def _slice(plan: _Labels, a: int, b: int) -> _Labels:
    """The part of ``plan`` a shard packs: the same class map, no set-wide skips."""
    scan = replace(plan.scan, entries=plan.scan.entries[a:b], skipped=[])
    targets = None if plan.targets is None else plan.targets[a:b]
    dense = plan.dense
    if dense is not None:  # only this shard's images' targets travel with it (Ray tasks)
        dense = replace(dense, by_file={e.rel: dense.by_file[e.rel] for e in scan.entries})
    return replace(
        plan, scan=scan, targets=targets, ignored=0, missing_rows=0, shard=True, dense=dense
    )


def _complete(path: Path) -> bool:
    """Whether a shard folder already holds a whole, valid pack (a rerun keeps it)."""
    if path.is_symlink() or not path.is_dir():
        return False
    try:
        check_files(path, read_manifest(path))
        return True
    except PackFormatError:
        return False


def _check_append(old: SetIndex, plan: _Labels, options: dict[str, Any], dst: Path) -> None:
    """--append: the same options, class map and targets as the set, or UsageError /
    InputError naming what differs."""
    for key in OPTION_KEYS:
        if old.options[key] != options[key]:
            have, want = old.options[key], options[key]
            if key == "size":
                have, want = "x".join(map(str, have)), "x".join(map(str, want))
            raise UsageError(
                f"{_F}append: {_F}{key} {want} differs from the set's {have} ({dst}); "
                "give the options the set was built with",
                field=f"{_F}{key}",
            )
    if tuple(plan.scan.classes) != old.classes:
        added = [c for c in plan.scan.classes if c not in old.classes]
        gone = [c for c in old.classes if c not in plan.scan.classes]
        if added:  # a set keeps one class map: no --classes makes room for these
            raise InputError(
                f"{_F}append: SRC has classes the set does not: {added}; a set keeps one "
                f"class map (see `imgpack info {dst}`): move those images out of SRC or "
                "build a new set",
                field=f"{_F}append",
            )
        # SRC lacks some of the set's classes, or orders them otherwise (its own folders
        # give the indices): the set's class map, given as --classes, labels it as the set
        what = f"SRC lacks the set's classes {gone}" if gone else "SRC orders the classes otherwise"
        raise InputError(
            f"{_F}append: {what}, so its folders would give other label indices; add "
            f"{_F}classes {dst} to label SRC with the set's class map",
            field=f"{_F}classes",
        )
    if getattr(plan, "dense", None) is not None:  # one category map for the whole set
        from .dense import check_append_categories

        check_append_categories(dst, old, plan)
    if tuple(plan.target_names) != old.targets:
        raise UsageError(
            f"{_F}append: {_F}targets {','.join(plan.target_names) or '(none)'} differs from "
            f"the set's {','.join(old.targets) or '(none)'}",
            field=f"{_F}targets",
        )


def _next_position(old: SetIndex) -> int:
    nums = [_SHARD_DIR.fullmatch(s.name) for s in old.shards]
    if all(nums):
        return max(int(m.group(1)) for m in nums if m) + 1
    return len(old.shards)


class _OldShard:
    """One shard of the set ``--append`` extends: its manifest, and (opened on first
    use) its pack, to compare a new image with what the set stores."""

    def __init__(self, dst: Path, entry: Any, old: SetIndex) -> None:
        self.entry = entry
        self.path = dst / entry.name
        self.m = read_shard_manifest(dst, entry, old)
        self.cpu = old.options.get("device") == "cpu"  # CPU builds re-decode exactly
        self._pack: Any = None
        self._lock = threading.Lock()

    def pack(self) -> Any:
        """The shard opened, or None where its data is not here (a set in object
        storage keeps only manifests in its staging folder)."""
        with self._lock:
            if self._pack is None:
                from ..pack.reader import open_pack  # torch: only when comparing

                try:
                    check_files(self.path, self.m)
                    self._pack = open_pack(self.path, self.m)
                except PackFormatError:
                    self._pack = False
            return None if self._pack is False else self._pack


def _same_root(recorded: str | None, plan: _Labels) -> bool:
    """Whether a shard built from ``recorded`` (its manifest's ``build.source_root``)
    came from the source folder or bucket prefix of ``plan`` (a bucket's is recorded as
    its URL folded into a path, under the folder the build ran in)."""
    if recorded is None:
        return False
    url = getattr(plan.scan, "url", None)
    if url:
        return recorded == url or recorded.endswith(str(Path(url)))
    return recorded == str(plan.scan.root.resolve())


def _same_image(plan: _Labels, rel: str, held: list[tuple[_OldShard, int]]) -> str | None:
    """Why SRC's image ``rel`` may be left out of the set: the reason when the set
    already holds it (the same pixels or stored bytes as one of the set's images of that
    path, re-made from SRC exactly as the build would), else None (a different image:
    it is added). Where the set's data cannot be compared (not on this machine, or built
    on a GPU, whose pixels differ from the CPU's within a tolerance), an image of the
    same path from the same source folder is taken as the one the set holds."""

    local = getattr(plan.scan, "url", None) is None
    for shard, row in held:
        pack = shard.pack() if (local and shard.cpu) else None
        where = f"shard {shard.entry.name} of the set"
        if pack is not None:
            path = os.path.join(str(plan.scan.root), rel)
            if kind_of(shard.m).same_as_source(pack, shard.m, path, row):
                return f"already in the set: the same image as {rel} in {where}"
        elif _same_root(shard.m.build.source_root, plan):
            return (
                f"already in the set: {rel} from the same source folder is in {where} (the "
                "set's data is not on this machine or was built on a GPU, so not compared)"
            )
    return None


def _only_new(plan: _Labels, dst: Path, old: SetIndex) -> _Labels:
    """``plan`` less the images the set at ``dst`` already holds (``--append``), each one
    left out listed in ``plan.scan.skipped`` with its reason.

    A path is not an image's identity: appends from other folders (a new week of data)
    bring paths the set holds already. An image whose path relative to SRC is also in the
    set is compared with the set's image(s) of that path (:func:`_same_image`): the same
    image is left out, a different one is added (each shard records the source folder
    it was built from, so ``(source root, path)`` stays unique over appends). A path the
    set's build could not use is left out only when it comes from the same source
    folder, or when a whole shard of it failed (those skips are recorded by path alone).
    """
    held: dict[str, list[tuple[_OldShard, int]]] = {}
    failed: dict[str, str] = {s.path: s.reason for s in old.skipped}
    for entry in old.shards:
        shard = _OldShard(dst, entry, old)
        for i, rel in enumerate(shard.m.sources):
            held.setdefault(rel, []).append((shard, i))
        if _same_root(shard.m.build.source_root, plan):
            for s in shard.m.skipped:
                failed.setdefault(s.path, s.reason)
    entries = plan.scan.entries
    found = [i for i, e in enumerate(entries) if e.rel in held]
    with ThreadPoolExecutor(max(1, min(8, os.cpu_count() or 1))) as pool:
        same = dict(
            zip(
                found,
                pool.map(lambda i: _same_image(plan, entries[i].rel, held[entries[i].rel]), found),
            )
        )
    keep_rows, skipped = [], list(plan.scan.skipped)
    for i, e in enumerate(entries):
        why = same.get(i)
        if why is None and e.rel not in held and e.rel in failed:
            why = f"an earlier build of the set could not use {e.rel} ({failed[e.rel]})"
        if why is None:
            keep_rows.append(i)
        else:
            skipped.append({"path": e.rel, "reason": why})
    kept = [entries[i] for i in keep_rows]
    targets = None if plan.targets is None else plan.targets[keep_rows]
    scan = replace(plan.scan, entries=kept, skipped=skipped)
    return replace(plan, scan=scan, targets=targets)


@dataclass
class SetPlan:
    """A set build as the driver fixes it before any shard is built: the labelled images,
    where each shard starts and ends, its name, and which shards are already in place.
    Every engine (local, :mod:`packer.builder.ray_engine`) builds from one."""

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
