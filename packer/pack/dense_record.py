"""The manifest's ``"dense"`` record and the dense files' names (:mod:`packer.pack.dense`
describes the format): :class:`DenseRecord` (files with sizes and SHA-256, the category
map as plain JSON, M, K, which masks there are), :func:`parse_record` (a manifest's
record checked field by field), :func:`record_files`, :func:`check_dense_files` (each
file present, regular, inside the pack, of its recorded size) and :func:`verify_dense`
(every file hashed against its SHA-256).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import PackFormatError
from ..imaging.limits import DEFAULT_MAX_PIXELS
from .layout import DATA_DIR

DENSE_VERSION = 1
DEFAULT_MAX_INSTANCES = 100_000  # the reader's cap on one image's instances
MAX_KEYPOINTS = 1024  # the reader's cap on K
MAX_FRAME_SIDE = 65536
# a frame's h * w: the reader's bound on a stored image (pycocotools counts in uint32)
DEFAULT_MAX_FRAME_PIXELS = DEFAULT_MAX_PIXELS
DEFAULT_MAX_RLE_BYTES = 64 << 20  # one instance's RLE
SEMANTIC_STORES = ("rows", "png")

OFFSETS = "dense_offsets.memmap"
FRAMES = "dense_frames.memmap"
IMAGE_IDS = "dense_image_ids.memmap"
BOXES = "dense_boxes.memmap"
LABELS = "dense_labels.memmap"
ISCROWD = "dense_iscrowd.memmap"
AREA = "dense_area.memmap"
KEYPOINTS = "dense_keypoints.memmap"
RLE_OFFSETS = "dense_rle_offsets.memmap"
RLE = "dense_rle.memmap"
SEMANTIC = "dense_semantic.memmap"
PNG_OFFSETS = "dense_png_offsets.memmap"
PNG = "dense_png.memmap"
ALL_FILES = (
    OFFSETS,
    FRAMES,
    IMAGE_IDS,
    BOXES,
    LABELS,
    ISCROWD,
    AREA,
    KEYPOINTS,
    RLE_OFFSETS,
    RLE,
    SEMANTIC,
    PNG_OFFSETS,
    PNG,
)


def _sha(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------- the manifest's record


@dataclass(frozen=True)
class DenseRecord:
    """The manifest's ``"dense"`` object. ``categories``: the
    :class:`~packer.sources.annotations.CategoryMap`; ``count``: N; ``instances``: M;
    ``keypoints``: K (0: none); ``masks``: instance masks stored; ``semantic``: None,
    ``"rows"`` or ``"png"``; ``ignore_index``: the semantic masks' ignore value;
    ``dropped``: boxes the build's resize left outside the stored image; ``files``:
    ``{name: (bytes, sha256)}``; ``source``: what the columns were read from (format,
    annotation file), for ``imgpack verify``."""

    categories: Any
    count: int
    instances: int
    keypoints: int = 0
    masks: bool = False
    semantic: str | None = None
    ignore_index: int = 255
    dropped: int = 0
    files: Mapping[str, tuple[int, str]] = field(default_factory=dict)
    source: Mapping[str, Any] = field(default_factory=dict)
    version: int = DENSE_VERSION

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "categories": self.categories.to_json(),
            "count": self.count,
            "instances": self.instances,
            "keypoints": self.keypoints,
            "masks": self.masks,
            "semantic": self.semantic,
            "ignore_index": self.ignore_index,
            "dropped": self.dropped,
            "files": {k: {"bytes": b, "sha256": s} for k, (b, s) in sorted(self.files.items())},
            "source": dict(self.source),
        }


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_record(obj: Any, count: int) -> DenseRecord:
    """The manifest's ``"dense"`` object, every field checked (ValueError naming it;
    :meth:`Manifest.from_json` words it as a PackFormatError)."""
    from ..errors import InputError
    from ..sources.annotations.model import CategoryMap

    def want(ok: bool, what: str) -> None:
        if not ok:
            raise ValueError(f"field 'dense.{what}'; rebuild the pack")

    want(isinstance(obj, dict), "is not an object")
    v = obj.get("version")
    want(_is_int(v) and v >= 1, "version must be a positive integer")
    if v > DENSE_VERSION:
        raise ValueError(
            f"dense targets of version {v}, this imgpack reads up to {DENSE_VERSION}; "
            "upgrade imgpack"
        )
    try:
        cats = CategoryMap.from_json(obj.get("categories"), "dense.categories")
    except InputError as e:
        raise ValueError(f"{e}; rebuild the pack") from None
    want(obj.get("count") == count and _is_int(obj.get("count")), f"count must be {count}")
    m = obj.get("instances")
    want(_is_int(m) and 0 <= m <= 1 << 40, "instances must be an integer >= 0")
    k = obj.get("keypoints", 0)
    want(_is_int(k) and 0 <= k <= MAX_KEYPOINTS, f"keypoints must be 0 to {MAX_KEYPOINTS}")
    masks = obj.get("masks", False)
    want(isinstance(masks, bool), "masks must be true or false")
    sem = obj.get("semantic")
    want(sem is None or sem in SEMANTIC_STORES, f"semantic must be null or {SEMANTIC_STORES}")
    ign = obj.get("ignore_index", 255)
    want(_is_int(ign) and 0 <= ign <= 255, "ignore_index must be 0 to 255")
    dropped = obj.get("dropped", 0)
    want(_is_int(dropped) and dropped >= 0, "dropped must be an integer >= 0")
    files = obj.get("files")
    want(isinstance(files, dict), "files must be an object")
    out: dict[str, tuple[int, str]] = {}
    for name, rec in files.items():
        want(name in ALL_FILES, f"files names {name!r}, not a dense file")
        ok = (
            isinstance(rec, dict)
            and _is_int(rec.get("bytes"))
            and 0 <= rec["bytes"] <= 1 << 50
            and isinstance(rec.get("sha256"), str)
            and len(rec["sha256"]) == 64
        )
        want(ok, f"files.{name} must be {{'bytes': n, 'sha256': hex}}")
        out[name] = (rec["bytes"], rec["sha256"])
    need = {OFFSETS, FRAMES, IMAGE_IDS, BOXES, LABELS, ISCROWD, AREA}
    if k:
        need.add(KEYPOINTS)
    if masks:
        need |= {RLE_OFFSETS, RLE}
    if sem == "rows":
        need.add(SEMANTIC)
    elif sem == "png":
        need |= {PNG_OFFSETS, PNG}
    want(set(out) == need, f"files must list exactly {sorted(need)}")
    source = obj.get("source", {})
    want(isinstance(source, dict), "source must be an object")
    return DenseRecord(cats, count, m, k, masks, sem, ign, dropped, out, source, v)


def record_files(m: Any) -> set[str]:
    """The dense files a manifest lists (none for a pack without dense targets)."""
    rec = getattr(m, "dense", None)
    return set(rec.files) if rec is not None else set()


def check_dense_files(root: Path, m: Any) -> None:
    """Each dense file of the manifest ``m`` present, a regular file inside the pack, of
    its recorded size, and the sizes consistent with N, M and K (PackFormatError)."""
    rec = getattr(m, "dense", None)
    if rec is None:
        return
    data = Path(root) / DATA_DIR
    real_root = Path(root).resolve()
    for name, (size, _sha) in rec.files.items():
        path = data / name
        rel = f"{DATA_DIR}/{name}"
        if path.is_symlink() or not path.is_file():
            raise PackFormatError(f"{root}: {rel} is missing or not a regular file")
        if not path.resolve().is_relative_to(real_root):
            raise PackFormatError(f"{root}: {rel} points outside the pack; refusing it")
        got = path.stat().st_size
        if got != size:
            raise PackFormatError(
                f"{root}: {rel} is {got:,} bytes, the manifest says {size:,}; the pack is "
                "damaged or truncated"
            )
    n, mm, k = rec.count, rec.instances, rec.keypoints
    want = {
        OFFSETS: (n + 1) * 8,
        FRAMES: n * 16,
        IMAGE_IDS: n * 8,
        BOXES: mm * 16,
        LABELS: mm * 8,
        ISCROWD: mm,
        AREA: mm * 4,
        KEYPOINTS: mm * k * 12,
        RLE_OFFSETS: (mm + 1) * 8,
        PNG_OFFSETS: (n + 1) * 8,
    }
    if rec.semantic == "rows":
        want[SEMANTIC] = n * m.image_shape[1] * m.image_shape[2]
    for name, (size, _sha) in rec.files.items():
        if name in want and want[name] != size:
            raise PackFormatError(
                f"{root}: {DATA_DIR}/{name} is {size:,} bytes for {n} images and {mm} "
                f"instances; it must be {want[name]:,}. The pack is damaged, rebuild it"
            )


def verify_dense(root: Path, m: Any) -> tuple[bool, str]:
    """Every dense file hashed against the manifest's SHA-256 (``imgpack verify``)."""
    rec = getattr(m, "dense", None)
    if rec is None:
        return True, "no dense targets"
    bad = []
    for name, (_size, sha) in sorted(rec.files.items()):
        h = hashlib.sha256()
        with open(Path(root) / DATA_DIR / name, "rb") as f:
            for chunk in iter(lambda: f.read(8 << 20), b""):
                h.update(chunk)
        if h.hexdigest() != sha:
            bad.append(name)
    if bad:
        return False, (
            f"checksum mismatch in {', '.join(bad)}: the dense targets changed since the "
            "build; rebuild the pack"
        )
    return True, f"{rec.instances} instances in {len(rec.files)} files, SHA-256 match"
