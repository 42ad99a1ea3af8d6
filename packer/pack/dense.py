"""Dense targets in a pack: boxes, labels, ``iscrowd``, area, keypoints, instance masks
and semantic masks, as ragged columns beside the images (issue 46.2).

On disk, new files in ``_tensordict/`` (only in a pack built with dense targets; a pack
without them is byte-for-byte what it was)::

    dense_offsets.memmap     int64 [N+1]: image i's instances are rows offsets[i]:offsets[i+1]
    dense_frames.memmap      int64 [N, 2]: (h, w) of image i as stored (the boxes' pixels)
    dense_image_ids.memmap   int64 [N]: the source's image id (COCO's), -1 for none
    dense_boxes.memmap       float32 [M, 4]: XYXY in pixels of the STORED image
    dense_labels.memmap      int64 [M]: category index 0..C-1
    dense_iscrowd.memmap     uint8 [M]
    dense_area.memmap        float32 [M]
    dense_keypoints.memmap   float32 [M, K, 3]         (when the source has keypoints)
    dense_rle_offsets.memmap int64 [M+1] + dense_rle.memmap uint8 [bytes]: each
                             instance's mask as COCO compressed RLE counts of its frame
    dense_semantic.memmap    uint8 [N, H, W]           (semantic masks beside raw rows)
    dense_png_offsets.memmap int64 [N+1] + dense_png.memmap uint8 [bytes]: one PNG each
                             (semantic masks beside JPEG files)

The manifest's ``"dense"`` object (:class:`DenseRecord`) names the files with their
sizes and SHA-256, the category map (names, original ids, keypoint names, flip_map:
plain JSON, never pickled), M, K and which masks there are.

Reading (:func:`dense_of`, :class:`DenseColumns`) never trusts the files: sizes match
the record, offsets start at 0, never decrease and end at the values' length, no image
holds more instances than the reader's cap (``max_instances``, the reader's option),
labels are category indices, every RLE is checked to cover exactly its frame before
pycocotools decodes it (pycocotools writes past its buffer otherwise), and a PNG's
header must give its image's size before a pixel is decoded. Anything else is a
:class:`~packer.errors.PackFormatError` naming the pack and the file.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._fs import write_atomic
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


# ---------------------------------------------------------------- writing


@dataclass
class DenseArrays:
    """The columns of N images, in pack order, before they are written (the build's
    :mod:`packer.builder.dense` fills them). ``masks``: M RLE counts (or None);
    ``semantic``: N uint8 [h, w] arrays (or None)."""

    offsets: np.ndarray  # int64 [N+1]
    frames: np.ndarray  # int64 [N, 2]
    image_ids: np.ndarray  # int64 [N]
    boxes: np.ndarray  # float32 [M, 4]
    labels: np.ndarray  # int64 [M]
    iscrowd: np.ndarray  # uint8 [M]
    area: np.ndarray  # float32 [M]
    keypoints: np.ndarray | None = None  # float32 [M, K, 3]
    masks: list[bytes] | None = None
    semantic: list[np.ndarray] | None = None


def _ragged(items: Sequence[bytes]) -> tuple[np.ndarray, bytes]:
    lengths = np.fromiter((len(b) for b in items), dtype=np.int64, count=len(items))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype("<i8")
    return offsets, b"".join(items)


def encode_png(mask: np.ndarray) -> bytes:
    """A uint8 [h, w] mask as a grey PNG (deterministic bytes)."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(mask, dtype=np.uint8), mode="L").save(buf, "PNG")
    return buf.getvalue()


def write_dense(
    data_dir: Path,
    cols: DenseArrays,
    categories: Any,
    *,
    semantic: str | None,
    ignore_index: int = 255,
    dropped: int = 0,
    source: Mapping[str, Any] | None = None,
) -> DenseRecord:
    """Write ``cols`` into ``data_dir`` (each file whole or not at all) and return the
    manifest's record of them. ``semantic``: how semantic masks are stored beside this
    pack's images (``"rows"`` [N, H, W] or ``"png"``; the kind's answer), None for none."""
    n = int(cols.frames.shape[0])
    m = int(cols.boxes.shape[0])
    blobs: dict[str, bytes] = {
        OFFSETS: np.ascontiguousarray(cols.offsets, "<i8").tobytes(),
        FRAMES: np.ascontiguousarray(cols.frames, "<i8").tobytes(),
        IMAGE_IDS: np.ascontiguousarray(cols.image_ids, "<i8").tobytes(),
        BOXES: np.ascontiguousarray(cols.boxes, "<f4").tobytes(),
        LABELS: np.ascontiguousarray(cols.labels, "<i8").tobytes(),
        ISCROWD: np.ascontiguousarray(cols.iscrowd, np.uint8).tobytes(),
        AREA: np.ascontiguousarray(cols.area, "<f4").tobytes(),
    }
    k = 0
    if cols.keypoints is not None:
        k = int(cols.keypoints.shape[1])
        blobs[KEYPOINTS] = np.ascontiguousarray(cols.keypoints, "<f4").tobytes()
    if cols.masks is not None:
        off, data = _ragged(cols.masks)
        blobs[RLE_OFFSETS], blobs[RLE] = off.tobytes(), data
    sem_store = None
    if cols.semantic is not None:
        sem_store = semantic or "rows"
        if sem_store == "rows":
            blobs[SEMANTIC] = b"".join(
                np.ascontiguousarray(s, np.uint8).tobytes() for s in cols.semantic
            )
        else:
            off, data = _ragged([encode_png(s) for s in cols.semantic])
            blobs[PNG_OFFSETS], blobs[PNG] = off.tobytes(), data
    files = {}
    for name, data in blobs.items():
        write_atomic(Path(data_dir) / name, data)
        files[name] = (len(data), _sha(data))
    return DenseRecord(
        categories=categories,
        count=n,
        instances=m,
        keypoints=k,
        masks=cols.masks is not None,
        semantic=sem_store,
        ignore_index=ignore_index,
        dropped=dropped,
        files=files,
        source=dict(source or {}),
    )


# ---------------------------------------------------------------- RLE, checked


def rle_counts(counts: bytes, size: tuple[int, int]) -> np.ndarray:
    """The run lengths of a COCO compressed RLE string (pycocotools' ``rleFrString``,
    vectorized), checked to be non-negative runs covering exactly ``h * w`` pixels.
    ValueError otherwise: pycocotools' decoder trusts the runs and writes past its
    buffer when they add up to more."""
    h, w = size
    a = np.frombuffer(bytes(counts), dtype=np.uint8).astype(np.int64)
    if a.size == 0:
        if h * w == 0:
            return np.zeros(0, np.int64)
        raise ValueError("an empty RLE")
    a -= 48
    if a.min() < 0 or a.max() > 63:
        raise ValueError("an RLE holds a character outside '0'..'o'")
    more = (a & 0x20) != 0
    if more[-1]:
        raise ValueError("an RLE ends inside a number")
    ends = np.flatnonzero(~more)
    starts = np.concatenate([[0], ends[:-1] + 1])
    lens = ends - starts + 1
    if lens.max() > 12:
        raise ValueError("an RLE number of more than 12 characters")
    pos = np.arange(a.size) - np.repeat(starts, lens)
    x = np.add.reduceat((a & 0x1F) << (5 * pos), starts)
    neg = (a[ends] & 0x10) != 0
    x = np.where(neg, x - (np.int64(1) << (5 * lens)), x)
    cnts = x.copy()  # from the third on, each run is a delta of the one two before
    cnts[1::2] = np.cumsum(x[1::2])
    cnts[2::2] = np.cumsum(x[2::2])
    if cnts.min() < 0:
        raise ValueError("an RLE with a negative run")
    if int(cnts.max()) > h * w:
        # each run at most the frame (h * w from the pack's sizes): runs of up to 2**62
        # would add up past int64 and wrap round to exactly h * w
        raise ValueError(f"an RLE run of {int(cnts.max())} pixels for a {w}x{h} mask")
    if int(cnts.sum()) != h * w:
        raise ValueError(f"an RLE of {int(cnts.sum())} pixels for a {w}x{h} mask")
    return cnts


def mask_runs(masks_rle: Sequence[bytes], size: Sequence[int]) -> list[np.ndarray]:
    """The run lengths of each instance mask (:func:`rle_counts`: column-major runs of
    0s then 1s alternately, summing to ``h * w``), checked as :func:`decode_masks`
    checks them (PackFormatError for a frame outside the reader's bounds or a run
    list that does not cover it). The loader decodes them on its device."""
    h, w = (int(v) for v in size)
    if (
        not (0 <= h <= MAX_FRAME_SIDE and 0 <= w <= MAX_FRAME_SIDE)
        or h * w > DEFAULT_MAX_FRAME_PIXELS
    ):
        raise PackFormatError(f"a mask frame of {w}x{h} is outside the reader's bounds")
    runs = []
    for i, c in enumerate(masks_rle):
        try:
            runs.append(rle_counts(c, (h, w)))
        except ValueError as e:
            raise PackFormatError(f"instance mask {i}: {e}; the pack is damaged") from None
    return runs


def decode_masks(masks_rle: Sequence[bytes], size: Sequence[int]) -> np.ndarray:
    """Instance masks uint8 [M, h, w] of 0/1 from COCO compressed RLE counts of an
    ``(h, w)`` frame (pycocotools), each checked first (:func:`rle_counts`;
    PackFormatError for one that does not cover its frame)."""
    h, w = (int(v) for v in size)
    mask_runs(masks_rle, (h, w))
    if not masks_rle:
        return np.zeros((0, h, w), dtype=np.uint8)
    import warnings

    from ..sources.annotations.model import coco_mask

    rles = [{"size": [h, w], "counts": bytes(c)} for c in masks_rle]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        out = coco_mask().decode(rles)
    return np.ascontiguousarray(out.transpose(2, 0, 1), dtype=np.uint8)


def encode_masks(masks: np.ndarray) -> list[bytes]:
    """uint8 [M, h, w] 0/1 masks as COCO compressed RLE counts (pycocotools)."""
    if masks.shape[0] == 0:
        return []
    import warnings

    from ..sources.annotations.model import coco_mask

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        rles = coco_mask().encode(np.asfortranarray(masks.transpose(1, 2, 0).astype(np.uint8)))
    return [bytes(r["counts"]) for r in rles]


# ---------------------------------------------------------------- reading


def _map(root: Path, rec: DenseRecord, name: str, dtype: Any, row: tuple[int, ...]) -> np.ndarray:
    """Dense file ``name`` mapped read-only as ``dtype`` rows of ``row``, its size checked
    against the record (and the record's against the shape) first."""
    path = Path(root) / DATA_DIR / name
    rel = f"{DATA_DIR}/{name}"
    if path.is_symlink() or not path.is_file():
        raise PackFormatError(f"{root}: {rel} is missing or not a regular file")
    size = path.stat().st_size
    item = np.dtype(dtype).itemsize * math.prod(row)
    if size != rec.files[name][0] or (item and size % item):
        raise PackFormatError(
            f"{root}: {rel} is {size:,} bytes, which is not what the manifest records "
            f"({rec.files[name][0]:,}) in whole rows of {item} bytes; the pack is damaged"
        )
    rows = size // item if item else 0
    if rows == 0:
        return np.zeros((0, *row), dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(rows, *row))


def _check_offsets(off: np.ndarray, rows: int, end: int, where: str, cap: int | None) -> None:
    """``off`` (int64 [rows+1]) starts at 0, never decreases, ends at ``end`` and steps by
    at most ``cap``; PackFormatError naming ``where`` otherwise."""
    if off.shape != (rows + 1,):
        raise PackFormatError(
            f"{where}: {off.shape[0]} offsets for {rows} rows; the pack is damaged"
        )
    if int(off[0]) != 0:
        raise PackFormatError(
            f"{where}: offsets start at {int(off[0])}, not 0; the pack is damaged"
        )
    d = np.diff(off)
    if d.size and int(d.min()) < 0:
        i = int(np.argmin(d))
        raise PackFormatError(
            f"{where}: offsets decrease at row {i} ({int(off[i])} then {int(off[i + 1])}); "
            "the pack is damaged"
        )
    if int(off[-1]) != end:
        raise PackFormatError(
            f"{where}: offsets end at {int(off[-1])}, past or short of the {end} values the "
            "file holds; the pack is damaged"
        )
    if cap is not None and d.size and int(d.max()) > cap:
        i = int(np.argmax(d))
        raise PackFormatError(
            f"{where}: row {i} holds {int(d[i])} values, more than the reader's cap of {cap} "
            "(dense_of's max_instances); refusing the pack"
        )


class _PackDense:
    """One pack's dense files, mapped and checked (:func:`dense_of`)."""

    def __init__(
        self, root: Path, m: Any, max_instances: int, max_pixels: int = DEFAULT_MAX_FRAME_PIXELS
    ) -> None:
        rec: DenseRecord = m.dense
        self.root, self.rec = Path(root), rec
        where = f"{root}: {DATA_DIR}/"
        n, c = rec.count, len(rec.categories)
        self.offsets = np.array(_map(root, rec, OFFSETS, "<i8", ()), dtype=np.int64)
        self.boxes = _map(root, rec, BOXES, "<f4", (4,))
        mm = self.boxes.shape[0]
        _check_offsets(self.offsets, n, mm, where + OFFSETS, max_instances)
        self.frames = np.array(_map(root, rec, FRAMES, "<i8", (2,)), dtype=np.int64)
        if self.frames.shape != (n, 2):
            raise PackFormatError(f"{where}{FRAMES}: not [{n}, 2]; the pack is damaged")
        if n and (
            self.frames.min() < 1
            or self.frames.max() > MAX_FRAME_SIDE
            or int((self.frames[:, 0] * self.frames[:, 1]).max()) > max_pixels
        ):
            raise PackFormatError(
                f"{where}{FRAMES}: a frame outside 1..{MAX_FRAME_SIDE} a side or over the "
                f"reader's {max_pixels:,} pixels (dense_of's max_pixels); refusing the pack"
            )
        self.image_ids = _map(root, rec, IMAGE_IDS, "<i8", ())
        self.labels = _map(root, rec, LABELS, "<i8", ())
        self.iscrowd = _map(root, rec, ISCROWD, np.uint8, ())
        self.area = _map(root, rec, AREA, "<f4", ())
        for name, a in ((IMAGE_IDS, self.image_ids),):
            if a.shape[0] != n:
                raise PackFormatError(f"{where}{name}: {a.shape[0]} rows for {n} images")
        for name, a in ((LABELS, self.labels), (ISCROWD, self.iscrowd), (AREA, self.area)):
            if a.shape[0] != mm:
                raise PackFormatError(f"{where}{name}: {a.shape[0]} rows for {mm} instances")
        if mm and (int(self.labels.min()) < 0 or int(self.labels.max()) >= c):
            raise PackFormatError(
                f"{where}{LABELS}: a label outside 0..{c - 1} (the category map's); the pack "
                "is damaged"
            )
        self.keypoints = None
        if rec.keypoints:
            self.keypoints = _map(root, rec, KEYPOINTS, "<f4", (rec.keypoints, 3))
            if self.keypoints.shape[0] != mm:
                raise PackFormatError(f"{where}{KEYPOINTS}: not one row per instance")
        self.rle = self.rle_off = None
        if rec.masks:
            self.rle_off = np.array(_map(root, rec, RLE_OFFSETS, "<i8", ()), dtype=np.int64)
            self.rle = _map(root, rec, RLE, np.uint8, ())
            _check_offsets(
                self.rle_off, mm, self.rle.shape[0], where + RLE_OFFSETS, DEFAULT_MAX_RLE_BYTES
            )
        self.semantic = self.png = self.png_off = None
        if rec.semantic == "rows":
            h, w = m.image_shape[1], m.image_shape[2]
            if n and not (self.frames == [h, w]).all():
                raise PackFormatError(f"{where}{FRAMES}: a raw pack's frames are its rows' size")
            self.semantic = _map(root, rec, SEMANTIC, np.uint8, (h, w))
            if self.semantic.shape[0] != n:
                raise PackFormatError(f"{where}{SEMANTIC}: not one mask per image")
        elif rec.semantic == "png":
            self.png_off = np.array(_map(root, rec, PNG_OFFSETS, "<i8", ()), dtype=np.int64)
            self.png = _map(root, rec, PNG, np.uint8, ())
            _check_offsets(self.png_off, n, self.png.shape[0], where + PNG_OFFSETS, None)

    def row(self, i: int) -> dict[str, Any]:
        where = f"{self.root}: {DATA_DIR}/"
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        if not 0 <= a <= b <= self.boxes.shape[0]:  # the map changed under us
            raise PackFormatError(f"{where}{OFFSETS}: row {i} lies outside the values")
        h, w = int(self.frames[i, 0]), int(self.frames[i, 1])
        out: dict[str, Any] = {
            "boxes": np.array(self.boxes[a:b], dtype=np.float32).reshape(b - a, 4),
            "labels": np.array(self.labels[a:b], dtype=np.int64),
            "iscrowd": np.array(self.iscrowd[a:b], dtype=np.uint8),
            "area": np.array(self.area[a:b], dtype=np.float32),
            "image_id": int(self.image_ids[i]),
            "size": (h, w),
        }
        if self.keypoints is not None:
            out["keypoints"] = np.array(self.keypoints[a:b], dtype=np.float32)
        if self.rle is not None:
            assert self.rle_off is not None
            off = self.rle_off[a : b + 1]
            if off.size and (int(off[0]) < 0 or int(off[-1]) > self.rle.shape[0]):
                raise PackFormatError(f"{where}{RLE_OFFSETS}: instance outside the file")
            out["masks_rle"] = [
                bytes(self.rle[int(off[j]) : int(off[j + 1])]) for j in range(b - a)
            ]
        if self.semantic is not None:
            out["semantic"] = np.array(self.semantic[i], dtype=np.uint8)
        elif self.png is not None:
            assert self.png_off is not None
            out["semantic"] = self._png(i, h, w)
        return out

    def _png(self, i: int, h: int, w: int) -> np.ndarray:
        import io

        from PIL import Image

        a, b = int(self.png_off[i]), int(self.png_off[i + 1])  # type: ignore[index]
        where = f"{self.root}: {DATA_DIR}/{PNG} image {i}"
        if not 0 <= a <= b <= self.png.shape[0]:  # type: ignore[union-attr]
            raise PackFormatError(f"{where}: outside the file")
        data = bytes(self.png[a:b])  # type: ignore[index]
        try:
            with Image.open(io.BytesIO(data), formats=["PNG"]) as im:
                if im.size != (w, h) or im.mode not in ("L", "P"):
                    raise PackFormatError(
                        f"{where}: a {im.mode} {im.size[0]}x{im.size[1]} PNG for a {w}x{h} "
                        "image; the pack is damaged"
                    )
                im.load()
                return np.array(im, dtype=np.uint8)
        except PackFormatError:
            raise
        except Exception as e:
            raise PackFormatError(
                f"{where}: not a readable PNG ({e}); the pack is damaged"
            ) from None


class DenseColumns:
    """A pack's (or a set's) dense targets. ``categories``: the CategoryMap;
    ``has_masks``, ``has_keypoints``, ``semantic`` (bool); :meth:`read`."""

    def __init__(
        self, parts: list[Any], record: DenseRecord, locate: Any = None, starts: Any = None
    ) -> None:
        self._parts = parts  # one _PackDense, or a callable k -> (_PackDense, release)
        self._locate = locate
        self._starts = starts
        self.record = record
        self.categories = record.categories
        self.has_masks = record.masks
        self.has_keypoints = record.keypoints > 0
        self.semantic = record.semantic is not None
        self.ignore_index = record.ignore_index

    def read(self, indices: Sequence[int] | np.ndarray) -> list[dict[str, Any]]:
        """Each image's targets: ``boxes`` float32 [M, 4] XYXY stored pixels, ``labels``
        int64 [M], ``iscrowd`` uint8 [M], ``area`` float32 [M], ``keypoints`` float32
        [M, K, 3] (if any), ``masks_rle`` (M RLE counts) and ``size`` (h, w) (if masks),
        ``semantic`` uint8 [H, W] (if any), ``image_id`` (the source's id, else the
        image's index)."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        out = []
        if self._locate is None:
            part = self._parts[0]
            n = part.rec.count
            for i in idx.tolist():
                if not 0 <= i < n:
                    raise IndexError(f"image index {i} is outside the pack of {n} images")
                out.append(self._finish(part.row(i), i))
            return out
        shards, rows = self._locate(idx)
        for g, k, r in zip(idx.tolist(), shards.tolist(), rows.tolist()):
            part, release = self._parts[0](k)
            try:
                out.append(self._finish(part.row(r), g))
            finally:
                release()
        return out

    def _finish(self, d: dict[str, Any], i: int) -> dict[str, Any]:
        if d["image_id"] < 0:
            d["image_id"] = int(i)
        if not self.has_masks:
            d.pop("size", None)
        return d


def dense_of(
    pack: Any,
    *,
    max_instances: int = DEFAULT_MAX_INSTANCES,
    max_pixels: int = DEFAULT_MAX_FRAME_PIXELS,
) -> DenseColumns | None:
    """The dense targets of a pack or pack set (``packer.load``'s), or None for one built
    without them. ``max_instances``: the reader's cap on one image's instances (a pack
    whose offsets give an image more is refused); ``max_pixels``: on one image's mask
    frame (as ``packer.load``'s on a stored image). PackFormatError for damaged files."""
    manifests = getattr(pack, "manifests", None)
    if manifests is not None and hasattr(pack, "locate"):  # a pack set: shards are packs
        recs = [getattr(m, "dense", None) for m in manifests]
        if not recs or all(r is None for r in recs):
            return None
        if any(r is None for r in recs):
            raise PackFormatError(f"{pack.path}: some shards hold dense targets and some do not")
        first = recs[0]
        for r in recs[1:]:
            if r.categories != first.categories or r.keypoints != first.keypoints:
                raise PackFormatError(
                    f"{pack.path}: its shards hold different category maps; rebuild the set"
                )
        opened: dict[int, _PackDense] = {}

        def part(k: int) -> tuple[_PackDense, Any]:
            p = opened.get(k)
            if p is not None:
                return p, lambda: None
            # the dense files are small files of the shard, there once the set is open
            # (fetched with its labels from a bucket): read without fetching its images
            store = getattr(pack, "store", None)
            entry = pack.entry(k) if hasattr(pack, "entry") else None
            if store is not None and entry is not None and hasattr(store, "root"):
                folder = Path(store.root) / entry.name
                if (folder / DATA_DIR / OFFSETS).is_file():
                    p = opened[k] = _PackDense(folder, manifests[k], max_instances, max_pixels)
                    return p, lambda: None
            shard = pack.shard(k)
            try:
                p = _PackDense(Path(shard.path), manifests[k], max_instances, max_pixels)
            except BaseException:
                pack.release(k)
                raise
            return p, lambda: pack.release(k)

        return DenseColumns([part], first, locate=pack.locate)
    m = getattr(pack, "manifest", None)
    if m is None or getattr(m, "dense", None) is None:
        return None
    return DenseColumns([_PackDense(Path(pack.path), m, max_instances, max_pixels)], m.dense)


def dense_files_for(root: str | os.PathLike[str]) -> list[str]:
    """The dense files present in a pack folder (for tests and tools)."""
    d = Path(root) / DATA_DIR
    return sorted(f for f in os.listdir(d) if f in ALL_FILES) if d.is_dir() else []
