"""Which annotation layout a folder holds, decided once: :func:`detect_layout` finds it
(or takes ``AnnotationConfig.format``), :func:`read_annotations` reads it.

Looked for, in this order:

1. COCO: ``AnnotationConfig.annotations`` (a JSON file), else ``instances_*.json`` or
   ``person_keypoints_*.json`` in ``annotations/`` or in the folder itself (with
   several splits, ``AnnotationConfig.split`` picks ``*_<split>.json``; an
   ``instances_`` file wins over the ``person_keypoints_`` file of its split);
2. YOLO: ``data.yaml`` / ``data.yml``, or ``images/`` beside ``labels/`` of ``.txt`` files;
3. Pascal VOC: ``Annotations/`` beside ``JPEGImages/``;
4. semantic masks: ``images/`` + ``masks/``, ``JPEGImages/`` + ``SegmentationClass/``,
   ``images/`` + ``annotations/`` (ADE20K), ``img/`` + ``ann/``, the mask folder holding
   PNGs (``AnnotationConfig.images``/``masks`` name other folders).

A folder that matches none is an error listing all of these.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ...errors import InputError
from .coco import read_coco
from .masks import MASK_PAIRS, is_mask_pair, read_masks
from .model import FORMATS, AnnotationConfig, Annotations
from .voc import read_voc
from .yolo import is_yolo, read_yolo

__all__ = ["FORMATS", "Layout", "detect_layout", "read_annotations"]

COCO_PREFIXES = ("instances_", "person_keypoints_")

LOOKED_FOR = (
    "a COCO JSON (AnnotationConfig.annotations, or annotations/instances_*.json or "
    "person_keypoints_*.json), YOLO (data.yaml, or images/ beside labels/), Pascal VOC "
    "(Annotations/ beside JPEGImages/), image + mask folders ("
    + ", ".join(f"{a}/ + {b}/" for a, b in MASK_PAIRS)
    + ", the masks PNG)"
)


@dataclass(frozen=True)
class Layout:
    """A detected layout: ``format``, ``root``, and for COCO the JSON file; for masks
    the image and mask folders."""

    format: str
    root: Path
    annotations: Path | None = None
    images: Path | None = None
    masks: Path | None = None


def _coco_files(root: Path) -> list[Path]:
    out: list[Path] = []
    for d in (root / "annotations", root):
        if d.is_dir():
            out += sorted(
                p for p in d.iterdir() if p.suffix == ".json" and p.name.startswith(COCO_PREFIXES)
            )
    return out


def _split_of(p: Path) -> str:
    for pre in COCO_PREFIXES:
        if p.name.startswith(pre):
            return p.stem[len(pre) :]
    return p.stem


def _pick_coco(root: Path, files: list[Path], split: str | None) -> Path:
    if split is not None:
        files = [p for p in files if _split_of(p) == split]
        if not files:
            raise InputError(
                f"{root}: no COCO JSON of split {split!r} (looked for instances_{split}.json and "
                f"person_keypoints_{split}.json in annotations/ and the folder)",
                field="AnnotationConfig.split",
            )
    by_split: dict[str, Path] = {}
    for p in files:  # instances_ sorts before person_keypoints_: it wins its split
        by_split.setdefault(_split_of(p), p)
    if len(by_split) > 1:
        raise InputError(
            f"{root}: COCO JSON files of several splits ({', '.join(sorted(by_split))}); "
            "choose one with AnnotationConfig.split",
            field="AnnotationConfig.split",
        )
    return next(iter(by_split.values()))


def detect_layout(
    src: str | os.PathLike[str],
    config: AnnotationConfig = AnnotationConfig(),  # noqa: B008 (frozen)
) -> Layout:
    """The annotation layout of the folder ``src`` (see the module's doc), or the one
    ``config.format`` names. Raises :class:`InputError` listing what was looked for."""
    root = Path(src)
    if not root.is_dir() and not (
        config.annotations is not None and config.format in ("auto", "coco")
    ):
        raise InputError(f"{root}: no such folder")
    fmt = config.format
    if fmt in ("auto", "coco"):
        if config.annotations is not None:
            return Layout("coco", root, annotations=Path(config.annotations))
        files = _coco_files(root)
        if files:
            return Layout("coco", root, annotations=_pick_coco(root, files, config.split))
        if fmt == "coco":
            raise InputError(
                f"{root}: no COCO JSON: looked for annotations/instances_*.json, "
                "annotations/person_keypoints_*.json and the same in the folder; name the file "
                "with AnnotationConfig.annotations",
                field="AnnotationConfig.annotations",
            )
    if fmt == "yolo" or (fmt == "auto" and is_yolo(root)):
        return Layout("yolo", root)
    if fmt == "voc" or (
        fmt == "auto" and (root / "Annotations").is_dir() and (root / "JPEGImages").is_dir()
    ):
        return Layout("voc", root)
    if config.images is not None and config.masks is not None:
        return Layout("masks", root, images=Path(config.images), masks=Path(config.masks))
    pair = is_mask_pair(root)
    if pair is not None and fmt in ("auto", "masks"):
        images, masks = pair
        if config.split is not None:
            images, masks = images / config.split, masks / config.split
        return Layout("masks", root, images=images, masks=masks)
    if fmt == "masks":
        raise InputError(
            f"{root}: no image + mask folders: looked for "
            + ", ".join(f"{a}/ + {b}/" for a, b in MASK_PAIRS)
            + " (the masks PNG); name them with AnnotationConfig.images and AnnotationConfig.masks",
            field="AnnotationConfig.masks",
        )
    raise InputError(
        f"{root}: no annotations found: looked for {LOOKED_FOR}; name the format with "
        "AnnotationConfig.format",
        field="AnnotationConfig.format",
    )


def read_annotations(
    src: str | os.PathLike[str],
    config: AnnotationConfig = AnnotationConfig(),  # noqa: B008 (frozen)
) -> Annotations:
    """Detect ``src``'s layout (:func:`detect_layout`) and read it with its reader."""
    layout = detect_layout(src, config)
    if layout.format == "coco":
        assert layout.annotations is not None
        return read_coco(layout.annotations, config.images, config)
    if layout.format == "yolo":
        return read_yolo(layout.root, config)
    if layout.format == "voc":
        return read_voc(layout.root, config)
    assert layout.images is not None and layout.masks is not None
    return read_masks(layout.images, layout.masks, config)
