"""The format's names and numbers and the small records a manifest holds, on nothing of
the format above them: the file names of a pack, the format's version, the reader's
caps, the dtypes of its fields, :class:`Layout` and the records :class:`Skip`,
:class:`BuildInfo`, :class:`Checksums`, :class:`FieldSpec`.

The bottom of :mod:`packer.pack`: the storage kinds (:mod:`~packer.pack.kind`,
:mod:`~packer.pack.raw`, :mod:`~packer.pack.jpeg`) and the manifest's checks
(:mod:`~packer.pack.parse`) build on these, and :class:`~packer.pack.schema.Manifest`
on them. Everything here is importable from :mod:`packer.pack.schema` as well, where the
format is described. Imports none of its siblings; no torch, no Pillow, no numpy.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..imaging.limits import DEFAULT_MAX_PIXELS

FORMAT_NAME = "imgpack"
FORMAT_VERSION = 1
MANIFEST = "imgpack.json"
SET_INDEX = "imgpack-set.json"  # a pack set's index (packer.pack.index)
DATA_DIR = "_tensordict"
IMAGES_FILE = "images.memmap"
LABELS_FILE = "labels.memmap"
TARGETS_FILE = "targets.memmap"
TD_TYPE = "<class 'packer.pack.ImagePack'>"
CHECKSUM = "sha256"
# A manifest holds about 100 bytes per image (its source path and size, a share of the
# block checksums) besides what every pack has and what was skipped. The reader's cap
# is this constant, never a figure read from the pack (round 4: it followed the labels
# file's size, which a sparse file inflates): checked on the opened file before a byte
# is read, and a file that does not start as a JSON object is refused at its first
# chunk. 1 GiB is some ten million images; a larger pack is a set (--shard-size), and
# the writer refuses to write a manifest this reader would refuse.
MAX_MANIFEST_BYTES = 1 << 30
MANIFEST_BASE_BYTES = 64 << 20  # kept for the format's documented names (unused)
MANIFEST_BYTES_PER_IMAGE = 512  # likewise
MAX_META_BYTES = 64 << 10  # tensordict's meta.json files: tens of bytes in a pack
MAX_COUNT = 1 << 40
STORAGE_KINDS = ("raw", "jpeg")  # jpeg: variable-size JPEG files with an offset table
JPEG_STORAGE_VERSION = 1  # the layout of a "jpeg" pack's four files, recorded in the manifest
JPEG_FILE = "jpeg.memmap"
OFFSETS_FILE = "offsets.memmap"
LENGTHS_FILE = "lengths.memmap"
SIZES_FILE = "sizes.memmap"
DTYPE_BYTES = {"uint8": 1, "int64": 8, "float32": 4}
LABEL_DTYPE = "int64"  # labels: int64 [N]; anything else is refused on load, never cast
TARGET_DTYPE = "float32"  # targets: float32 [N, K]; likewise


@dataclass(frozen=True)
class Layout:
    """File paths of a pack directory."""

    root: Path

    @property
    def manifest(self) -> Path:
        return self.root / MANIFEST

    @property
    def images(self) -> Path:
        return self.root / DATA_DIR / IMAGES_FILE

    @property
    def labels(self) -> Path:
        return self.root / DATA_DIR / LABELS_FILE

    @property
    def targets(self) -> Path:
        return self.root / DATA_DIR / TARGETS_FILE

    def data(self, name: str) -> Path:
        return self.root / DATA_DIR / name


# ---------------------------------------------------------------- the manifest


@dataclass(frozen=True)
class Skip:
    """An input the build could not use: its relative path and why."""

    path: str
    reason: str


@dataclass(frozen=True)
class BuildInfo:
    """How the pack was made. ``extra`` keeps other build keys as written."""

    max_pixels: int = DEFAULT_MAX_PIXELS
    source_root: str | None = None  # absolute path of the source folder at build time
    imgpack_version: str | None = None
    created: str | None = None  # ISO 8601 local time
    labels_table: str | None = None  # absolute path of the ``--labels`` table
    labels_sha256: str | None = None  # SHA-256 of the table's bytes at build time
    unlisted: int | None = None  # images under SRC the table has no row for (ignored)
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Checksums:
    """SHA-256 of the image data per block of ``block_rows`` rows, of the labels, and
    of the targets (``""`` for a pack without them)."""

    block_rows: int
    images: tuple[str, ...] = ()
    labels: str = ""
    algorithm: str = CHECKSUM
    targets: str = ""
    index: str = ""  # jpeg packs: SHA-256 of offsets, lengths and sizes files, concatenated


@dataclass(frozen=True)
class FieldSpec:
    """One memory-mapped field: file under ``_tensordict/``, dtype, and per-row shape."""

    name: str
    file: str
    dtype: str  # a key of DTYPE_BYTES
    row_shape: tuple[int, ...]
    rows: int | None = None  # rows in the file; None: one per image (the pack's count)

    @property
    def row_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype] * math.prod(self.row_shape)


_BUILD_KEYS = (
    "source_root",
    "imgpack_version",
    "created",
    "labels_table",
    "labels_sha256",
    "unlisted",
)


def label_fields_json(
    count: int, target_names: Iterable[str] = (), label_dtype: str = LABEL_DTYPE
) -> dict[str, Any]:
    """The manifest keys recording the labels' and targets' dtype and shape."""
    out: dict[str, Any] = {"label_dtype": label_dtype, "label_shape": [count]}
    names = list(target_names)
    if names:
        out["targets"] = {"names": names, "dtype": TARGET_DTYPE, "shape": [count, len(names)]}
    return out
