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

The parts: ``dense_record`` (the file names, the manifest's record, the files' checks),
``dense_write`` (writing the columns), ``dense_masks`` (RLE, checked). This module reads.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import PackFormatError
from .dense_masks import decode_masks, encode_masks, mask_runs, rle_counts
from .dense_record import (
    ALL_FILES,
    AREA,
    BOXES,
    DEFAULT_MAX_FRAME_PIXELS,
    DEFAULT_MAX_INSTANCES,
    DEFAULT_MAX_RLE_BYTES,
    FRAMES,
    IMAGE_IDS,
    ISCROWD,
    KEYPOINTS,
    LABELS,
    MAX_FRAME_SIDE,
    OFFSETS,
    PNG,
    PNG_OFFSETS,
    RLE,
    RLE_OFFSETS,
    SEMANTIC,
    DenseRecord,
    check_dense_files,
    parse_record,
    record_files,
    verify_dense,
)
from .dense_write import DenseArrays, encode_png, write_dense
from .layout import DATA_DIR

# what other modules import from here (the format's parts live in dense_record,
# dense_write and dense_masks)
__all__ = [
    "BOXES",
    "DEFAULT_MAX_INSTANCES",
    "FRAMES",
    "LABELS",
    "OFFSETS",
    "PNG",
    "PNG_OFFSETS",
    "RLE",
    "RLE_OFFSETS",
    "DenseArrays",
    "DenseColumns",
    "DenseRecord",
    "check_dense_files",
    "decode_masks",
    "dense_files_for",
    "dense_of",
    "encode_masks",
    "encode_png",
    "mask_runs",
    "parse_record",
    "record_files",
    "rle_counts",
    "verify_dense",
    "write_dense",
]

# ---------------------------------------------------------------- writing
# ---------------------------------------------------------------- RLE, checked
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
    # a plain ndarray view of the map (which it keeps open): np.memmap's Python-level
    # __getitem__ and __array_finalize__ ran for every slice, a dozen a record read
    return np.asarray(np.memmap(path, dtype=dtype, mode="r", shape=(rows, *row)))


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
