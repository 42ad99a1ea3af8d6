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
:mod:`~packer.pack.describe` (``imgpack info``). The names, numbers and small records live one
floor down in :mod:`~packer.pack.layout` (which the kinds import) and are importable from
here; :class:`Manifest` sits above the kinds (its ``fields`` and JSON are its kind's
answers) and the checks in :mod:`~packer.pack.parse`. No torch, no Pillow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..errors import PackFormatError
from .kinds import kind_of
from .layout import (
    _BUILD_KEYS,
    CHECKSUM,
    DATA_DIR,
    DTYPE_BYTES,
    FORMAT_NAME,
    FORMAT_VERSION,
    IMAGES_FILE,
    JPEG_FILE,
    JPEG_STORAGE_VERSION,
    LABEL_DTYPE,
    LABELS_FILE,
    LENGTHS_FILE,
    MANIFEST,
    MANIFEST_BASE_BYTES,
    MANIFEST_BYTES_PER_IMAGE,
    MAX_COUNT,
    MAX_MANIFEST_BYTES,
    MAX_META_BYTES,
    OFFSETS_FILE,
    SET_INDEX,
    SIZES_FILE,
    STORAGE_KINDS,
    TARGET_DTYPE,
    TARGETS_FILE,
    TD_TYPE,
    BuildInfo,
    Checksums,
    FieldSpec,
    Layout,
    Skip,
    label_fields_json,
)
from .parse import _Bad, _parse

__all__ = [
    "CHECKSUM",
    "DATA_DIR",
    "DTYPE_BYTES",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "IMAGES_FILE",
    "JPEG_FILE",
    "JPEG_STORAGE_VERSION",
    "LABELS_FILE",
    "LABEL_DTYPE",
    "LENGTHS_FILE",
    "MANIFEST",
    "MANIFEST_BASE_BYTES",
    "MANIFEST_BYTES_PER_IMAGE",
    "MAX_COUNT",
    "MAX_MANIFEST_BYTES",
    "MAX_META_BYTES",
    "OFFSETS_FILE",
    "SET_INDEX",
    "SIZES_FILE",
    "STORAGE_KINDS",
    "TARGETS_FILE",
    "TARGET_DTYPE",
    "TD_TYPE",
    "BuildInfo",
    "Checksums",
    "FieldSpec",
    "Layout",
    "Manifest",
    "Skip",
    "label_fields_json",
]


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
    build: BuildInfo = BuildInfo()  # noqa: RUF009 (frozen: a safe shared default)
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
        try:
            return cls(**_parse(obj))
        except _Bad as e:
            raise PackFormatError(f"{where}: {e}") from None
