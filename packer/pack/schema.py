"""The pack on disk: its layout, the manifest's schema and the format's version, in one
place: :class:`Manifest` and the records it holds, the file names of a pack, the dtypes
of its fields. A pack is a directory::

    PACK/
      meta.json                  tensordict: {"_type": "<class 'packer.pack.ImagePack'>"}
      _tensordict/meta.json      tensordict: shapes and dtypes of the fields
      _tensordict/images.memmap  uint8 [N, 3, H, W], raw C-order bytes
      _tensordict/labels.memmap  int64 [N], raw little-endian bytes
      _tensordict/targets.memmap float32 [N, K], only with ``--targets`` (C-order, little-endian)
      imgpack.json               imgpack's manifest: :class:`Manifest`

A JPEG pack (``storage: "jpeg"``, ``--store jpeg``) holds, instead of ``images.memmap``::

      _tensordict/jpeg.memmap    uint8 [total_bytes]: every image's JPEG file, back to back
      _tensordict/offsets.memmap int64 [N]: where image i's bytes start in jpeg.memmap
      _tensordict/lengths.memmap int64 [N]: how many bytes it has
      _tensordict/sizes.memmap   int64 [N, 2]: its (height, width) in pixels, upright

The two ``meta.json`` files follow tensordict's ``memmap_()`` layout, so tensordict can
read the directory too. imgpack itself never trusts them:
:func:`packer.pack.reader.open_pack` reads only the manifest (plain JSON, every field
type-checked by :meth:`Manifest.from_json`), and maps the data files at fixed names
with shapes from the manifest. Nothing is unpickled and nothing named in the pack's
files is imported.

Parsed only by :meth:`Manifest.from_json` (the checks are in
:mod:`packer.pack.parse`), written only by :meth:`Manifest.to_json` (by
:func:`packer.pack.writer.write_pack_metadata`); a new field is added here, with its
default, and nowhere else. What a storage kind lays out (``Manifest.fields``) and the
manifest fields it owns are its kind's answers (:mod:`packer.pack.kinds`). The rest of
the format: :mod:`~packer.pack.parse` (the manifest's checks, label dtypes),
:mod:`~packer.pack.files` (JSON and bounded reads, ``read_manifest``, ``check_files``),
:mod:`~packer.pack.writer` (checksums, meta files, ``write_pack``),
:mod:`~packer.pack.describe` (``imgpack info``). No torch, no Pillow, no numpy.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import PackFormatError
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


@dataclass(frozen=True)
class Manifest:
    """imgpack's manifest (``imgpack.json``), typed. On disk its JSON keys are those of
    format 1: ``image_shape`` and ``resize`` at the top, repeated as ``build.size``
    ([W, H]) and ``build.resize`` for older readers; this class holds each once.

    Optional fields (defaults = today's packs) are what later formats add: write them
    in :meth:`to_json` only when set, so packs without them stay byte-identical.

    Labels and targets (issue 15) are recorded with their dtype and shape and checked
    on load; a pack whose record says anything but int64 ``[count]`` labels and float32
    ``[count, K]`` targets is refused, never cast. On disk::

        "label_dtype": "int64", "label_shape": [N],
        "targets": {"names": ["col", ...], "dtype": "float32", "shape": [N, K]}   # if any
        "class_map": "/abs/path/of/--classes"                                     # if given

    ``label_dtype``/``label_shape`` are written for every pack (older packs without
    them read as int64 ``[count]``); ``targets`` only for a pack that has them.
    """

    count: int
    image_shape: tuple[int, int, int]  # (3, H, W)
    resize: str  # one of RESIZE_MODES
    classes: tuple[str, ...]
    sources: tuple[str, ...]  # relative POSIX path of each image's source
    source_sizes: tuple[tuple[int, int], ...]  # (W, H) of each source before resizing
    checksums: Checksums
    class_counts: tuple[int, ...] = ()  # images per class; () when not recorded
    skipped: tuple[Skip, ...] = ()
    build: BuildInfo = BuildInfo()
    version: int = FORMAT_VERSION
    storage: str = "raw"  # how images are stored: one uint8 [3, H, W] row each
    label_dtype: str = LABEL_DTYPE
    targets: tuple[str, ...] = ()  # column names of a float32 ``targets`` [N, K] field
    class_map: str | None = None  # where a fixed class list came from (``--classes``)
    # storage "jpeg": bytes of jpeg.memmap, the layout version, and the build options
    # that shaped the stored files (``--max-side``; ``--quality`` of re-encoded inputs)
    jpeg_bytes: int = 0
    storage_version: int = 0
    max_side: int | None = None
    quality: int | None = None
    # dense targets (boxes, masks, keypoints: packer.pack.dense.DenseRecord), only in a
    # pack built with them; written as "dense" only when set
    dense: Any = None

    @property
    def class_to_idx(self) -> dict[str, int]:
        """Class name -> label index (the order of ``classes``)."""
        return {c: i for i, c in enumerate(self.classes)}

    @property
    def height(self) -> int:
        return self.image_shape[1]

    @property
    def width(self) -> int:
        return self.image_shape[2]

    @property
    def image_bytes(self) -> int:
        return math.prod(self.image_shape)

    @property
    def fields(self) -> tuple[FieldSpec, ...]:
        """The memory-mapped fields of the pack, in the order tensordict writes them."""
        from .kinds import kind_of

        out = [*kind_of(self).fields(self), FieldSpec("labels", LABELS_FILE, self.label_dtype, ())]
        if self.targets:
            out.append(FieldSpec("targets", TARGETS_FILE, TARGET_DTYPE, (len(self.targets),)))
        return tuple(out)

    # ---------------------------------------------------------------- JSON

    def to_json(self) -> dict[str, Any]:
        """The manifest as JSON-ready dicts and lists, in the key order of format 1."""
        c, h, w = self.image_shape
        build: dict[str, Any] = {
            "size": [w, h],
            "resize": self.resize,
            "max_pixels": self.build.max_pixels,
        }
        for key in _BUILD_KEYS:
            value = getattr(self.build, key)
            if value is not None:
                build[key] = value
        build.update(self.build.extra)
        out: dict[str, Any] = {
            "format": FORMAT_NAME,
            "version": self.version,
            "count": self.count,
            "image_shape": [c, h, w],
            "dtype": "uint8",
            "resize": self.resize,
            "classes": list(self.classes),
            "class_counts": list(self.class_counts),
            "sources": list(self.sources),
            "source_sizes": [list(s) for s in self.source_sizes],
            "skipped": [{"path": s.path, "reason": s.reason} for s in self.skipped],
            "build": build,
            "checksums": {
                "algorithm": self.checksums.algorithm,
                "block_rows": self.checksums.block_rows,
                "images": list(self.checksums.images),
                "labels": self.checksums.labels,
            },
            **label_fields_json(self.count, self.targets, self.label_dtype),
        }
        if self.checksums.targets:
            out["checksums"]["targets"] = self.checksums.targets
        from .kinds import kind_of

        own = kind_of(self).manifest_json(self)  # the fields its kind owns (none for raw)
        out["checksums"].update(own.pop("checksums", {}))
        out.update(own)
        if self.class_map is not None:
            out["class_map"] = self.class_map
        if self.dense is not None:
            out["dense"] = self.dense.to_json()
        return out

    @classmethod
    def from_json(cls, obj: Any, where: str = MANIFEST) -> Manifest:
        """Validate a parsed manifest and return it typed; the only reader of raw manifests.

        Every field's type and range is checked here once, so no reader meets a
        wrong type later. Raises PackFormatError naming ``where`` and the field.
        """
        from .parse import _Bad, _parse

        try:
            return _parse(obj)
        except _Bad as e:
            raise PackFormatError(f"{where}: {e}") from None


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
