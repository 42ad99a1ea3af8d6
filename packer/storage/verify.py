"""Checks of downloaded shard files against the shard's manifest (already checked
against the index's SHA-256): the big data file block by block before it is renamed
into place, and the small files (labels, targets, the JPEG index files)."""

from __future__ import annotations

from pathlib import Path

from ..pack.kinds import kind_of
from ..pack.schema import (
    DATA_DIR,
    LABELS_FILE,
    MANIFEST,
    TARGETS_FILE,
    FieldSpec,
    Manifest,
)
from ..pack.writer import digest


def big_field(m: Manifest) -> FieldSpec:
    """The field of a shard fetched on demand: the kind's data (images or JPEG bytes)."""
    return kind_of(m).fields(m)[0]


def small_files(m: Manifest) -> list[str]:
    """A shard's files (relative paths) fetched when its set is opened, the manifest
    last: tensordict's two meta.json files and every field file but the big one."""
    fields = [f"{DATA_DIR}/{f.file}" for f in m.fields[1:]]
    from ..pack.dense import record_files  # boxes, masks, keypoints: fetched with the labels

    dense = [f"{DATA_DIR}/{name}" for name in sorted(record_files(m))]
    return ["meta.json", f"{DATA_DIR}/meta.json", *fields, *dense, MANIFEST]


def check_small_file(rel: str, data: bytes, m: Manifest, shard: Path) -> str | None:
    """What is wrong with ``data`` as the shard's file ``rel``, or None. Labels and
    targets against their SHA-256; the JPEG index files (hashed together in the
    manifest) are checked once all three are there (``shard`` holds the others)."""
    ck = m.checksums
    name = rel.rsplit("/", 1)[-1]
    if name == LABELS_FILE and digest(data) != ck.labels:
        return "labels do not match the manifest's SHA-256"
    if name == TARGETS_FILE and digest(data) != ck.targets:
        return "targets do not match the manifest's SHA-256"
    dense = getattr(m, "dense", None)
    if dense is not None and name in dense.files and digest(data) != dense.files[name][1]:
        return f"{name} does not match the manifest's SHA-256"
    return None


def check_big_file(path: Path, m: Manifest, shard: Path) -> str | None:
    """What is wrong with ``path`` as the shard's big data file, or None: its size, then
    the SHA-256 of every block of ``block_rows`` images (the JPEG block ranges come from
    the shard's lengths file, checked when the set was opened)."""
    spec = big_field(m)
    want_size = (m.count if spec.rows is None else spec.rows) * spec.row_bytes
    size = path.stat().st_size
    if size != want_size:
        return f"{size:,} bytes where the manifest says {want_size:,} (truncated)"
    want = list(m.checksums.images)
    got = kind_of(m).block_hashes(path, m, shard)
    bad = [b for b, (x, y) in enumerate(zip(got, want)) if x != y]
    if len(got) != len(want) or bad:
        return f"checksum mismatch in {len(bad)} of {len(want)} blocks"
    return None
