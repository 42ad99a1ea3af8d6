"""The pack on disk: its layout, and the one documented import path of its schema and version.

A pack is a directory::

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

The two ``meta.json`` files follow tensordict's ``memmap_()`` layout, so
tensordict can read the directory too. imgpack itself never trusts them:
``packer.pack.reader.open_pack`` reads only the manifest (plain JSON, every field
type-checked by :meth:`Manifest.from_json`), and maps the data files at fixed
names with shapes from the manifest. Nothing is unpickled and nothing named in
the pack's files is imported. ``ImagePack.load_memmap``/``load`` are routed to
the same safe path. This module needs no torch, so build workers stay light.

The manifest is read only through :meth:`Manifest.from_json` and written only
through :meth:`Manifest.to_json` (by :func:`write_pack_metadata`); a new field
is added there, with its default, and nowhere else.

This module is the format's documented import path (the docs, tests, benchmarks and
scripts outside the package use it); the code lives beside it, and packer's own modules
import each name from its defining module:
:mod:`~packer.pack.schema` (constants, :class:`Manifest`), :mod:`~packer.pack.parse`
(the manifest's checks, label dtypes), :mod:`~packer.pack.files` (JSON and bounded
reads, :func:`read_manifest`, :func:`check_files`), :mod:`~packer.pack.writer`
(checksums, meta files, :func:`write_pack`), :mod:`~packer.pack.describe`
(``imgpack info``), and :mod:`~packer.pack.kinds` (what each storage kind lays out).
"""

from __future__ import annotations

from .describe import describe, is_pack, pack_bytes
from .files import (
    JSONNestingError,
    check_files,
    check_tensordict_meta,
    loads_json,
    manifest_limit,
    read_bounded,
    read_manifest,
    write_json_atomic,
)
from .parse import (
    check_label_arrays,
    check_label_fields,
    check_label_fields_json,
    label_fields,
)
from .schema import (
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
    SIZES_FILE,
    STORAGE_KINDS,
    TARGET_DTYPE,
    TARGETS_FILE,
    TD_TYPE,
    BuildInfo,
    Checksums,
    FieldSpec,
    Layout,
    Manifest,
    Skip,
    label_fields_json,
)
from .writer import (
    block_rows_for,
    check_data_meta,
    checksums_of,
    digest,
    hash_blocks,
    image_bytes,
    write_pack,
    write_pack_metadata,
    write_tensordict_meta,
)

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
    "SIZES_FILE",
    "STORAGE_KINDS",
    "TARGETS_FILE",
    "TARGET_DTYPE",
    "TD_TYPE",
    "BuildInfo",
    "Checksums",
    "FieldSpec",
    "JSONNestingError",
    "Layout",
    "Manifest",
    "Skip",
    "block_rows_for",
    "check_data_meta",
    "check_files",
    "check_label_arrays",
    "check_label_fields",
    "check_label_fields_json",
    "check_tensordict_meta",
    "checksums_of",
    "describe",
    "digest",
    "hash_blocks",
    "image_bytes",
    "is_pack",
    "label_fields",
    "label_fields_json",
    "loads_json",
    "manifest_limit",
    "pack_bytes",
    "read_bounded",
    "read_manifest",
    "write_json_atomic",
    "write_pack",
    "write_pack_metadata",
    "write_tensordict_meta",
]
