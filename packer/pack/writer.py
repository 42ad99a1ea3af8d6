"""Writing a pack's files: block checksums, tensordict's ``meta.json`` files, the
manifest (:func:`write_pack_metadata`, where every way of making a pack ends), and
:func:`write_pack` for synthetic packs and tests. No torch."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import PackFormatError, UsageError
from .files import _fail, loads_json, read_bounded, write_json_atomic
from .hashing import digest, hash_blocks, image_bytes
from .schema import (
    DATA_DIR,
    IMAGES_FILE,
    LABELS_FILE,
    MANIFEST,
    MAX_MANIFEST_BYTES,
    MAX_META_BYTES,
    TD_TYPE,
    Checksums,
    FieldSpec,
    Layout,
    Manifest,
)


def block_rows_for(count: int) -> int:
    """Rows per checksum block (also the build's unit of work): at most 64, about
    256 blocks for small packs, so every worker gets many small tasks."""
    return max(1, min(64, math.ceil(count / 256)))


def _tensordict_meta(count: int, fields: Iterable[FieldSpec]) -> dict[str, Any]:
    meta: dict[str, Any] = {
        f.name: {
            "device": "cpu",
            "shape": [count, *f.row_shape],
            "dtype": f"torch.{f.dtype}",
            "is_nested": False,
        }
        for f in fields
    }
    meta.update(
        {
            "shape": [count],
            "device": "cpu",
            "_type": "<class 'tensordict._td.TensorDict'>",
            "_format_version": 1,
            "_class": "tensordict:TensorDict",
        }
    )
    return meta


def write_tensordict_meta(root: Path, count: int, image_shape: Iterable[int]) -> None:
    """The two meta.json files that let tensordict's own loader open an images+labels pack."""
    shape = tuple(image_shape)
    fields = (
        FieldSpec("images", IMAGES_FILE, "uint8", shape),
        FieldSpec("labels", LABELS_FILE, "int64", ()),
    )
    write_json_atomic(root / DATA_DIR / "meta.json", _tensordict_meta(count, fields))
    write_json_atomic(root / "meta.json", {"_type": TD_TYPE})


def write_pack_metadata(root: Path, manifest: Manifest) -> None:
    """Write tensordict's two meta.json files and the manifest (last) into ``root``,
    whose data files are complete. Every way of making a pack ends here."""
    root = Path(root)
    write_json_atomic(
        root / DATA_DIR / "meta.json", _tensordict_meta(manifest.count, manifest.fields)
    )
    write_json_atomic(root / "meta.json", {"_type": TD_TYPE})
    write_json_atomic(root / MANIFEST, manifest.to_json())
    size = (root / MANIFEST).stat().st_size
    if size > MAX_MANIFEST_BYTES:  # what every reader refuses is never left as a pack
        (root / MANIFEST).unlink()
        raise UsageError(
            f"{root}: the manifest of {manifest.count:,} images would be {size:,} bytes, "
            f"more than a reader takes ({MAX_MANIFEST_BYTES:,}); build a pack set instead "
            "(BuildConfig.shard_size)"
        )


def checksums_of(root: Path, count: int, image_shape: Iterable[int]) -> Checksums:
    """Hash a pack's data files as a build records them (the targets when present)."""
    lay = Layout(Path(root))
    block = block_rows_for(count)
    row = image_bytes(image_shape)
    shas = hash_blocks(lay.images, row * block, -(-count // block))
    targets = digest(lay.targets.read_bytes()) if lay.targets.is_file() else ""
    return Checksums(
        block_rows=block,
        images=tuple(shas),
        labels=digest(lay.labels.read_bytes()),
        targets=targets,
    )


def write_pack(
    root: Path,
    images: Iterable[bytes | memoryview],
    labels: Iterable[int],
    manifest: Manifest,
    targets: Iterable[Iterable[float]] | None = None,
) -> Path:
    """Write a whole pack at ``root`` from image bytes and labels, for synthetic packs
    and tests; the build writes its data its own way and ends in :func:`write_pack_metadata`.

    ``images``: chunks of raw uint8 rows, C-order [*, 3, H, W], ``manifest.count``
    rows in all. ``labels``: ``manifest.count`` ints. ``targets``: with
    ``manifest.targets`` (K names), ``manifest.count`` rows of K floats, stored as
    float32 [N, K]. The checksums of
    ``manifest`` are replaced by those of the data written. The pack is written
    under a temporary name and renamed into place, so ``root`` is whole or absent.
    """
    import shutil
    import struct

    root = Path(root)
    if root.exists():
        raise PackFormatError(f"{root}: already exists; remove it first")
    work = root.with_name(f".{root.name}.imgpack-writing")
    shutil.rmtree(work, ignore_errors=True)
    (work / DATA_DIR).mkdir(parents=True)
    lay = Layout(work)
    with open(lay.images, "wb") as f:
        for chunk in images:
            f.write(chunk)
        written = f.tell()
        f.flush()
        os.fsync(f.fileno())
    want = manifest.count * manifest.image_bytes
    if written != want:
        shutil.rmtree(work)
        raise ValueError(f"write_pack: {written} image bytes for {manifest.count} images ({want})")
    lab = list(labels)
    if len(lab) != manifest.count:
        shutil.rmtree(work)
        raise ValueError(f"write_pack: {len(lab)} labels for {manifest.count} images")
    with open(lay.labels, "wb") as f:
        f.write(struct.pack(f"<{len(lab)}q", *lab))
        f.flush()
        os.fsync(f.fileno())
    rows = [list(r) for r in targets] if targets is not None else []
    k = len(manifest.targets)
    if (targets is not None) != bool(k) or len(rows) != (manifest.count if k else 0):
        shutil.rmtree(work)
        raise ValueError(f"write_pack: {len(rows)} target rows for {manifest.count} images")
    if k:
        if any(len(r) != k for r in rows):
            shutil.rmtree(work)
            raise ValueError(f"write_pack: target rows must hold {k} values each")
        with open(lay.targets, "wb") as f:
            f.write(struct.pack(f"<{len(rows) * k}f", *(v for r in rows for v in r)))
            f.flush()
            os.fsync(f.fileno())
    manifest = replace(manifest, checksums=checksums_of(work, manifest.count, manifest.image_shape))
    write_pack_metadata(work, manifest)
    os.replace(work, root)
    return root


_OPTIONAL_META = ("device", "_format_version", "_class")  # older tensordicts wrote none


def check_data_meta(root: Path, m: Manifest) -> None:
    """Refuse ``_tensordict/meta.json`` of a checked pack unless it is as imgpack writes
    it (:func:`write_pack_metadata`): TensorDict's type (whose loader unpickles nothing
    that :func:`~packer.pack.files.check_files` lets through) and exactly the manifest's
    fields, shapes and dtypes, so tensordict loading the data folder alone maps exactly
    the files checked against the manifest."""
    meta_path = root / DATA_DIR / "meta.json"
    try:
        data = read_bounded(root, meta_path, MAX_META_BYTES)
    except FileNotFoundError:
        raise _fail(root, f"{DATA_DIR}/meta.json is missing; the pack is incomplete") from None
    try:
        meta = loads_json(data)
    except (ValueError, UnicodeDecodeError):
        meta = None
    want = _tensordict_meta(m.count, m.fields)
    ok = isinstance(meta, dict) and not set(meta) - set(want)
    ok = ok and all(
        meta.get(k) == v if k in meta or k not in _OPTIONAL_META else True for k, v in want.items()
    )
    if not ok:
        raise _fail(
            root,
            f"{DATA_DIR}/meta.json does not describe the manifest's fields as imgpack writes "
            "them; refusing the pack (nothing was imported)",
        )
