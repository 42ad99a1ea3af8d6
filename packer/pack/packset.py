"""Open a pack set (:mod:`packer.pack.index`) as one dataset: :class:`PackSet`.

``packer.load(SET)`` returns a :class:`PackSet` when the folder holds a set index; a
single pack opens as before. Every shard is opened with :func:`open_pack` after its
manifest was checked against the index (SHA-256, count, bytes, class map), so opening
reads only the index and one manifest per shard, maps the data files read-only, never
unpickles and never follows a link out of the set.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import UsageError
from .describe import pack_bytes
from .files import check_files
from .index import SetIndex, read_index, read_shard_manifest, shard_root
from .reader import ImagePack, JpegPack, open_pack


class PackSet:
    """A pack set opened read-only: its shards in order, seen as one dataset.

    Attributes:
      shards: list of the opened shard packs (:class:`ImagePack` or :class:`JpegPack`).
      labels: Tensor[N], int64, every shard's labels concatenated in shard order
        (class index into ``classes``, or -1 for unlabeled).
      targets: Tensor[N, K], float32, likewise; None for a set without targets.
      offsets: np.ndarray[S + 1], int64: image ``i`` of the set is row
        ``i - offsets[k]`` of shard ``k`` where ``offsets[k] <= i < offsets[k + 1]``.
      classes, class_to_idx, target_names, sources (relative source path of each image,
      in order), image_shape ((3, H, W); for JPEG storage the largest stored image),
      storage ("raw" or "jpeg"), index (:class:`SetIndex`), path.
    """

    def __init__(self, root: Path, index: SetIndex, shards: list[ImagePack | JpegPack]) -> None:
        self.path = root
        self.index = index
        self.shards = shards
        counts = np.array([len(s) for s in shards], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.labels = (
            torch.cat([s.labels for s in shards]) if shards else torch.empty(0, dtype=torch.int64)
        )
        self.targets = torch.cat([s.targets for s in shards]) if index.targets and shards else None
        self.sources = [src for s in shards for src in s.sources]

    def __len__(self) -> int:
        return self.index.count

    def __repr__(self) -> str:
        return (
            f"PackSet({str(self.path)!r}, {len(self)} images of {list(self.image_shape)}, "
            f"{len(self.shards)} shards, storage={self.storage!r})"
        )

    @property
    def classes(self) -> list[str]:
        return list(self.index.classes)

    @property
    def class_to_idx(self) -> dict[str, int]:
        """Class name -> label index, as ``torchvision.datasets.ImageFolder.class_to_idx``."""
        return self.index.class_to_idx

    @property
    def target_names(self) -> list[str]:
        return list(self.index.targets)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return self.index.image_shape

    @property
    def storage(self) -> str:
        return self.index.storage

    def locate(self, indices: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(shard, row)`` of each global image index: two int64 arrays shaped as
        ``indices``. UsageError for an index outside ``[0, len(self))``."""
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
            bad = int(idx[(idx < 0) | (idx >= len(self))].flat[0])
            raise UsageError(f"image index {bad} is outside the set of {len(self)} images")
        shard = np.searchsorted(self.offsets, idx, side="right") - 1
        return shard, idx - self.offsets[shard]


def open_set(path: str | os.PathLike[str]) -> PackSet:
    """Open the pack set at ``path``: the index, then each shard checked against it and
    mapped. Raises PackFormatError naming the shard for a missing, changed or foreign
    one, and naming the field for a bad index."""
    root = Path(path)
    index = read_index(root)
    shards: list[ImagePack | JpegPack] = []
    for entry in index.shards:
        m = read_shard_manifest(root, entry, index)
        shard = shard_root(root, entry)
        check_files(shard, m)
        shards.append(open_pack(shard, m))
    return PackSet(root, index, shards)


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
