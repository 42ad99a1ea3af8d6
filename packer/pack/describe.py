"""``imgpack info``: :func:`describe` a pack from its manifest, and its bytes on disk."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from .files import folder_kind, read_manifest
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
        # only for other storage than raw, so raw packs' info stays as it was
        **({"storage": m.storage, "jpeg_bytes": m.jpeg_bytes} if m.storage != "raw" else {}),
    }
