"""The one model every annotation reader returns, and the rules they share (the
categories in :mod:`packer.sources.annotations.categories`, re-exported here).

* :class:`CategoryMap`: categories with contiguous indices ``0..C-1`` (the labels a pack
  stores), their names, the source's original ids (COCO's sparse ids ``1, 3, 90`` map to
  ``0, 1, 2`` and are kept), keypoint names and a per-category ``flip_map`` (the
  (left, right) keypoint pairs a horizontal flip swaps, as
  :func:`packer.augment.dense_kernels.flip_permutation` takes them). It works like
  ``BuildConfig.classes`` (:mod:`packer.sources.classes`): given by the user (a JSON file
  :meth:`CategoryMap.save` writes, or a text file of names) it is fixed across splits,
  its order wins, and a category of the source not in it is refused unless
  ``AnnotationConfig.allow_new_categories`` appends it; derived, it is the source's
  declared order (COCO: by id; YOLO: by class index; VOC: sorted names).
* :class:`ImageTargets`: one image's targets. ``boxes`` float32 [M, 4] XYXY in pixels
  of the image as the annotation sizes it, ``labels`` int64 [M] in ``0..C-1``,
  ``iscrowd`` uint8 [M] (0/1), ``area`` float32 [M], ``keypoints`` float32 [M, K, 3]
  (x, y, visibility) or None, ``masks`` one COCO RLE (``counts`` bytes of an
  ``(h, w)`` mask) per instance or None, ``semantic`` a mask file or None.
* :class:`AnnotationConfig`: the readers' options and the bounds that protect them
  (``max_boxes``, ``max_json_bytes``, ``max_file_bytes``): bounds come from here, never
  from the file being read.
* :class:`Report`: how a bad annotation becomes a :class:`Skip` (file, annotation id,
  reason), or an :class:`~packer.errors.InputError` under ``strict``; and
  :meth:`Report.box`, the one rule for boxes (non-finite or empty: skipped; partly
  outside the image: clipped and counted; wholly outside: dropped, counted and listed).
"""

from __future__ import annotations

import math
import os
import re
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import InputError, UsageError
from ..common import control_char
from .categories import (
    DEFAULT_MAX_FILE_BYTES,
    CategoryMap,
    derive_flip_map,
    load_category_map,
    resolve_categories,
)

# what other modules import from here (the categories live in .categories)
__all__ = [
    "DEFAULT_MAX_BOXES",
    "DEFAULT_MAX_FILE_BYTES",
    "DEFAULT_MAX_JSON_BYTES",
    "FORMATS",
    "AnnotationConfig",
    "Annotations",
    "CategoryMap",
    "ImageTargets",
    "Report",
    "Skip",
    "check_rel",
    "coco_mask",
    "derive_flip_map",
    "header_size",
    "load_category_map",
    "resolve_categories",
    "targets_from",
]

DEFAULT_MAX_BOXES = 10_000
DEFAULT_MAX_JSON_BYTES = 2 << 30
DENSE_EXTRA = "pip install 'imgpack[dense]'"
FORMATS = ("coco", "yolo", "voc", "masks")


def coco_mask() -> Any:
    """``pycocotools.mask``, or a one-line :class:`UsageError` naming the ``dense`` extra."""
    try:
        from pycocotools import mask
    except ImportError:
        raise UsageError(f"COCO masks (polygons and RLE) need pycocotools: {DENSE_EXTRA}") from None
    return mask


# ---------------------------------------------------------------- one image


def _empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    return np.zeros(shape, dtype=dtype)


@dataclass(frozen=True, eq=False)
class ImageTargets:
    """One image's targets (M instances, K keypoints).

    ``file``: the image, a POSIX path relative to :attr:`Annotations.root`.
    ``size``: (h, w) of the image as the annotation gives it (COCO/VOC) or its header
    says (YOLO, masks; EXIF orientation applied, as the build decodes it).
    ``boxes`` float32 [M, 4] XYXY pixels, inside [0, w] x [0, h]; ``labels`` int64 [M]
    in ``0..C-1``; ``iscrowd`` uint8 [M] 0/1; ``area`` float32 [M] (the annotation's,
    else the mask's or box's pixels); ``keypoints`` float32 [M, K, 3] (x, y, v with v in
    {0, 1, 2}) or None; ``masks``: one COCO RLE ``counts`` (bytes) of an ``size`` mask
    per instance, or None (:meth:`decode_masks`); ``semantic``: the mask file, POSIX
    relative to :attr:`Annotations.mask_root`, or None; ``image_id``: the source's id
    (COCO's ``id``, else the file's stem path); ``difficult`` uint8 [M] (VOC) or None.
    """

    file: str
    size: tuple[int, int]
    boxes: np.ndarray = field(default_factory=lambda: _empty((0, 4), np.float32))
    labels: np.ndarray = field(default_factory=lambda: _empty((0,), np.int64))
    iscrowd: np.ndarray = field(default_factory=lambda: _empty((0,), np.uint8))
    area: np.ndarray = field(default_factory=lambda: _empty((0,), np.float32))
    keypoints: np.ndarray | None = None
    masks: tuple[bytes, ...] | None = None
    semantic: str | None = None
    image_id: int | str | None = None
    difficult: np.ndarray | None = None

    def __post_init__(self) -> None:
        m = int(self.boxes.shape[0])
        want = [
            ("boxes", self.boxes, np.float32, (m, 4)),
            ("labels", self.labels, np.int64, (m,)),
            ("iscrowd", self.iscrowd, np.uint8, (m,)),
            ("area", self.area, np.float32, (m,)),
        ]
        if self.keypoints is not None:
            want.append(("keypoints", self.keypoints, np.float32, (m, self.keypoints.shape[1], 3)))
        if self.difficult is not None:
            want.append(("difficult", self.difficult, np.uint8, (m,)))
        for name, a, dtype, shape in want:
            if a.dtype != dtype or a.shape != shape:
                raise ValueError(
                    f"ImageTargets.{name}: {a.dtype} {a.shape}, want {np.dtype(dtype)} {shape}"
                )
        if self.masks is not None and len(self.masks) != m:
            raise ValueError(f"ImageTargets.masks: {len(self.masks)} masks for {m} boxes")

    @property
    def count(self) -> int:
        """M, the number of instances."""
        return int(self.boxes.shape[0])

    def decode_masks(self) -> np.ndarray:
        """The instance masks, uint8 [M, h, w] of 0/1 (pycocotools' decode)."""
        h, w = self.size
        if self.masks is None:
            raise ValueError(f"{self.file}: no instance masks")
        if not self.masks:
            return np.zeros((0, h, w), dtype=np.uint8)
        rles = [{"size": [h, w], "counts": c} for c in self.masks]
        with warnings.catch_warnings():  # pycocotools 2.0.11 on numpy 2: a copy= warning
            warnings.simplefilter("ignore", DeprecationWarning)
            out = coco_mask().decode(rles)  # [h, w, M], Fortran order
        return np.ascontiguousarray(out.transpose(2, 0, 1), dtype=np.uint8)


@dataclass(frozen=True)
class Skip:
    """A bad input left out: ``file`` (the image, or the annotation file when no image
    is known), ``reason``, the annotation's id where one is named, and the annotation
    file it came from."""

    file: str
    reason: str
    annotation: int | str | None = None
    source: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """As a pack's manifest lists skips: ``{"path", "reason"}``, and the annotation."""
        out: dict[str, Any] = {"path": self.file, "reason": self.reason}
        if self.annotation is not None:
            out["annotation"] = self.annotation
        if self.source is not None:
            out["source"] = self.source
        return out


@dataclass(eq=False)
class Annotations:
    """What a reader returns: ``images`` sorted by ``file``; ``root``: the folder their
    files are relative to (``mask_root``: the semantic masks'); ``categories`` (None for
    masks read without a map); ``skipped``; ``clipped``: boxes cut to the image;
    ``outside``: boxes dropped wholly outside it (each also a skip)."""

    format: str
    root: Path
    categories: CategoryMap | None
    images: list[ImageTargets]
    skipped: list[Skip] = field(default_factory=list)
    clipped: int = 0
    outside: int = 0
    mask_root: Path | None = None
    sources: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- options and reports


@dataclass(frozen=True)
class AnnotationConfig:
    """How annotations are found and read, and the bounds that protect the reader.

    ``format``: ``"auto"`` (detect: :func:`packer.sources.annotations.detect_layout`) or
    one of ``coco``, ``yolo``, ``voc``, ``masks``. ``annotations``: a COCO JSON file
    (else found under ``annotations/``). ``split``: which split to read (``train2017``:
    ``instances_train2017.json``; YOLO's ``images/<split>``; VOC's
    ``ImageSets/Main/<split>.txt``; ``images/<split>`` beside ``masks/<split>``).
    ``images`` / ``masks``: the image and mask folders when not the usual ones.
    ``categories``: a fixed :class:`CategoryMap` (a file for
    :func:`load_category_map`), shared by every split; ``allow_new_categories`` appends
    the source's others. ``strict``: a bad annotation is an error, not a skip.
    ``max_boxes``: the most instances one image may have (an image with more is
    skipped); ``max_json_bytes``: the largest COCO JSON read (read whole, so it holds
    several times its size in memory: checked from the file's size before reading);
    ``max_file_bytes``: the largest per-image file (YOLO labels, VOC XML), ``data.yaml``
    or category map. ``ignore_index``: the semantic mask value that marks pixels to ignore.
    """

    format: str = "auto"
    annotations: str | os.PathLike[str] | None = None
    split: str | None = None
    images: str | os.PathLike[str] | None = None
    masks: str | os.PathLike[str] | None = None
    categories: CategoryMap | str | os.PathLike[str] | None = None
    allow_new_categories: bool = False
    strict: bool = False
    max_boxes: int = DEFAULT_MAX_BOXES
    max_json_bytes: int = DEFAULT_MAX_JSON_BYTES
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    ignore_index: int = 255

    def __post_init__(self) -> None:
        if self.format != "auto" and self.format not in FORMATS:
            raise UsageError(
                f"AnnotationConfig.format {self.format!r} is not one of auto, {', '.join(FORMATS)}",
                field="AnnotationConfig.format",
            )
        for name in ("max_boxes", "max_json_bytes", "max_file_bytes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UsageError(
                    f"AnnotationConfig.{name} must be a positive integer, not {v!r}",
                    field=f"AnnotationConfig.{name}",
                )
        v = self.ignore_index
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 255:
            raise UsageError(
                f"AnnotationConfig.ignore_index must be an integer in 0..255, not {v!r}",
                field="AnnotationConfig.ignore_index",
            )

    def category_map(self) -> CategoryMap | None:
        """The fixed map, read from its file where a path was given."""
        if self.categories is None or isinstance(self.categories, CategoryMap):
            return self.categories
        return load_category_map(self.categories, max_bytes=self.max_file_bytes)


class Report:
    """The skips and counts of one read; under ``strict`` the first skip raises."""

    def __init__(self, config: AnnotationConfig, source: str | None = None) -> None:
        self.config = config
        self.source = source
        self.skipped: list[Skip] = []
        self.clipped = 0
        self.outside = 0

    def skip(
        self, file: str, reason: str, annotation: int | str | None = None, source: str | None = None
    ) -> None:
        """Record ``file`` (and ``annotation``) as skipped for ``reason``, or raise
        :class:`InputError` under ``AnnotationConfig.strict``."""
        src = source if source is not None else self.source
        if self.config.strict:
            where = f"{src}: " if src is not None and src != file else ""
            ann = f" annotation {annotation}" if annotation is not None else ""
            raise InputError(
                f"{where}{file}{ann}: {reason} (AnnotationConfig.strict refuses bad "
                "annotations; fix it, or read without strict to skip it)",
                field="AnnotationConfig.strict",
            )
        self.skipped.append(Skip(file, reason, annotation, src))

    def too_many(self, file: str, count: int | str) -> None:
        """``file`` has more instances than ``AnnotationConfig.max_boxes``: skipped whole."""
        self.skip(
            file,
            f"{count} boxes, more than AnnotationConfig.max_boxes ({self.config.max_boxes}); "
            "raise it to keep this image",
        )

    def box(
        self,
        xyxy: Sequence[float],
        size: tuple[int, int],
        file: str,
        annotation: int | str | None = None,
    ) -> tuple[float, float, float, float] | None:
        """The box ``xyxy`` (pixels) inside an image of ``size`` (h, w), or None when it
        is skipped: a non-finite coordinate, a width or height <= 0, or wholly outside
        the image (also counted in ``outside``). A box partly outside is clipped to the
        image and counted in ``clipped``."""
        x1, y1, x2, y2 = (float(v) for v in xyxy)
        h, w = size
        if not all(math.isfinite(v) for v in (x1, y1, x2, y2)):
            self.skip(file, f"box {_fmt((x1, y1, x2, y2))} has a non-finite coordinate", annotation)
            return None
        if x2 - x1 <= 0 or y2 - y1 <= 0:
            self.skip(
                file,
                f"box {_fmt((x1, y1, x2, y2))} has width {_num(x2 - x1)} and height "
                f"{_num(y2 - y1)}; both must be > 0",
                annotation,
            )
            return None
        if x2 <= 0 or y2 <= 0 or x1 >= w or y1 >= h:
            self.outside += 1
            self.skip(
                file,
                f"box {_fmt((x1, y1, x2, y2))} lies wholly outside the {w}x{h} image",
                annotation,
            )
            return None
        c = (max(x1, 0.0), max(y1, 0.0), min(x2, float(w)), min(y2, float(h)))
        if c != (x1, y1, x2, y2):
            self.clipped += 1
        return c

    def finish(
        self,
        fmt: str,
        root: Path,
        categories: CategoryMap | None,
        images: Iterable[ImageTargets],
        **kw: Any,
    ) -> Annotations:
        return Annotations(
            format=fmt,
            root=root,
            categories=categories,
            images=sorted(images, key=lambda t: t.file),
            skipped=self.skipped,
            clipped=self.clipped,
            outside=self.outside,
            **kw,
        )


def _num(v: float) -> str:
    return f"{v:g}"


def _fmt(box: Sequence[float]) -> str:
    return "[" + ", ".join(_num(v) for v in box) + "]"


def targets_from(
    file: str,
    size: tuple[int, int],
    boxes: list[tuple[float, float, float, float]],
    labels: list[int],
    *,
    iscrowd: list[int] | None = None,
    area: list[float] | None = None,
    keypoints: list[np.ndarray] | None = None,
    num_keypoints: int = 0,
    masks: list[bytes] | None = None,
    image_id: int | str | None = None,
    difficult: list[int] | None = None,
) -> ImageTargets:
    """An :class:`ImageTargets` from per-instance lists (the readers' last step);
    ``area`` defaults to the boxes' areas, ``keypoints`` (each [k, 3], k <= K) are
    padded with invisible points to ``num_keypoints``."""
    m = len(boxes)
    b = np.asarray(boxes, dtype=np.float32).reshape(m, 4)
    if area is None:
        area_a = ((b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])).astype(np.float32)
    else:
        area_a = np.asarray(area, dtype=np.float32).reshape(m)
    kp = None
    if keypoints is not None:
        kp = np.zeros((m, num_keypoints, 3), dtype=np.float32)
        for i, k in enumerate(keypoints):
            kp[i, : k.shape[0]] = k
    return ImageTargets(
        file=file,
        size=size,
        boxes=b,
        labels=np.asarray(labels, dtype=np.int64).reshape(m),
        iscrowd=np.asarray(iscrowd if iscrowd is not None else [0] * m, dtype=np.uint8).reshape(m),
        area=area_a,
        keypoints=kp,
        masks=tuple(masks) if masks is not None else None,
        image_id=image_id,
        difficult=None if difficult is None else np.asarray(difficult, dtype=np.uint8).reshape(m),
    )


def header_size(path: Path) -> tuple[int, int]:
    """(h, w) of the image at ``path`` from its header (Pillow, lazy: no pixel is
    decoded), EXIF orientation applied as the build's decoder applies it. Raises
    :class:`OSError` (also for a FIFO or a device, never waited on) or Pillow's errors
    for an unreadable file."""
    from PIL import Image

    from ..._fs import NotRegularFile, file_kind, open_if_regular

    try:
        f = open_if_regular(path)
    except NotRegularFile as e:
        raise OSError(f"{file_kind(e.mode)}, not a regular file") from None
    with f, Image.open(f) as im:
        w, h = im.size
        try:
            orientation = im.getexif().get(0x0112)
        except Exception:  # a damaged EXIF block: the decoder ignores it too
            orientation = None
    return (w, h) if orientation in (5, 6, 7, 8) else (h, w)


def check_rel(rel: object) -> str | None:
    """Why a file name an annotation gives cannot name a file under the image folder
    (absolute, ``..``, empty, a control character), or None."""
    if not isinstance(rel, str) or not rel:
        return f"file name {rel!r} is not a non-empty string"
    if "\x00" in rel or control_char(rel) is not None:
        return f"file name {rel!r} holds a control character"
    parts = rel.replace("\\", "/").split("/")
    if rel.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", rel) or ".." in parts:
        return f"file name {rel!r} leads outside the image folder"
    return None
