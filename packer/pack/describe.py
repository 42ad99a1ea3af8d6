"""``imgpack info``: :func:`describe` a pack from its manifest, :func:`describe_set` a
pack set from its index and shard manifests, and their bytes on disk. Reads JSON and
file sizes only: no torch, no data mapped."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from .files import folder_kind, read_manifest
from .index import read_index, read_shard_manifest
from .kinds import kind_of
from .schema import MANIFEST


def pack_bytes(root: Path) -> int:
    """Bytes a pack directory's files take on disk (allocated blocks, not their apparent
    sizes: a sparse file is counted for what it holds). Links are not followed."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            try:
                st = os.lstat(os.path.join(dirpath, f))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_blocks * 512
    return total


def is_pack(path: Path) -> bool:
    """Whether ``path`` is a single pack's folder, by :func:`folder_kind` (PackFormatError
    for a folder that also holds a set index)."""
    return folder_kind(path) == "pack" and (Path(path) / MANIFEST).is_file()


def describe(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What ``imgpack info --json`` prints: count, shape, classes and their counts,
    the class -> index map, the targets (names, dtype, shape; None without), bytes on
    disk, build options, skipped inputs, format version."""
    root = Path(path)
    m = read_manifest(root)
    classes = list(m.classes)
    counts = list(m.class_counts) or [0] * len(classes)
    j = m.to_json()
    return {
        "path": str(path),
        "count": m.count,
        "image_shape": list(m.image_shape),
        "classes": classes,
        "class_counts": dict(zip(classes, counts)),
        "class_to_idx": m.class_to_idx,
        "targets": j.get("targets"),
        "bytes": pack_bytes(root),
        "build": j["build"],
        "skipped": j["skipped"],
        "format_version": m.version,
        # what its kind adds (nothing for raw, so raw packs' info stays as it was)
        **kind_of(m).describe(m),
    }


def describe_set(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What ``imgpack info --json`` prints for a set: the keys of a pack's ``info``
    (count, image_shape, classes, class_counts, class_to_idx, targets, bytes, build
    options, skipped, format_version, storage) plus ``shards`` (count, bytes, images
    per shard, and each shard's name, count, bytes). Reads the index and each shard's
    manifest (checked against it), not the data."""
    root = Path(path)
    index = read_index(root)
    counts = [0] * len(index.classes)
    skipped = [{"path": s.path, "reason": s.reason} for s in index.skipped]
    for entry in index.shards:
        m = read_shard_manifest(root, entry, index)
        for i, c in enumerate(m.class_counts):
            counts[i] += c
        skipped += [{"path": s.path, "reason": s.reason} for s in m.skipped]
    per = [s.count for s in index.shards]
    k = len(index.targets)
    return {
        "path": str(path),
        "count": index.count,
        "image_shape": list(index.image_shape),
        "classes": list(index.classes),
        "class_counts": dict(zip(index.classes, counts)),
        "class_to_idx": index.class_to_idx,
        "targets": (
            {"names": list(index.targets), "dtype": "float32", "shape": [index.count, k]}
            if k
            else None
        ),
        "bytes": pack_bytes(root),
        "build": dict(index.options),
        "skipped": sorted(skipped, key=lambda s: s["path"]),
        "format_version": index.version,
        "storage": index.storage,
        "shards": {
            "count": len(index.shards),
            "bytes": index.bytes,
            "shard_size": index.shard_size,
            "images": {"min": min(per), "max": max(per), "total": sum(per)},
            "list": [{"name": s.name, "count": s.count, "bytes": s.bytes} for s in index.shards],
        },
    }
