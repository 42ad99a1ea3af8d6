"""Semantic masks: an image folder beside a mask folder, paired by file path less its
extension (``images/a/x.jpg`` with ``masks/a/x.png``), as VOC (``JPEGImages`` +
``SegmentationClass``), ADE20K (``images`` + ``annotations``) and most others ship them.

A mask is a one-channel PNG (or any lossless one-channel image): grey (``L``) or a
palette (``P``), whose indices are the class ids, read as they are, never converted to
RGB (VOC's colours are only the palette). ``AnnotationConfig.ignore_index`` (255 by
default) marks pixels to ignore. Pairing reads headers only (no pixel decoded): a mask
whose size is not its image's (EXIF orientation applied), a mask of more than one
channel, an image without a mask and a mask without an image are skips with their
reason. :func:`read_semantic_mask` decodes one mask and checks its values against the
category map (the build's step, per image).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..._fs import NotRegularFile, file_kind, open_if_regular
from ...errors import DecodeError, InputError
from ..scan import list_images
from .model import (
    AnnotationConfig,
    Annotations,
    CategoryMap,
    ImageTargets,
    Report,
    header_size,
)

MASK_MODES = ("L", "P")
# image folder -> mask folder names, in the order detection tries them
MASK_PAIRS = (
    ("images", "masks"),
    ("JPEGImages", "SegmentationClass"),
    ("images", "annotations"),
    ("img", "ann"),
)


def _mask_header(path: Path) -> tuple[tuple[int, int], str]:
    from PIL import Image

    try:
        f = open_if_regular(path)
    except NotRegularFile as e:
        raise OSError(f"{file_kind(e.mode)}, not a regular file") from None
    with f, Image.open(f) as im:
        w, h = im.size
        return (h, w), im.mode


def read_masks(
    images: str | os.PathLike[str],
    masks: str | os.PathLike[str],
    config: AnnotationConfig = AnnotationConfig(),  # noqa: B008 (frozen)
) -> Annotations:
    """Pair the images under ``images`` with the masks under ``masks``.

    Returns :class:`Annotations` (format ``"masks"``): one :class:`ImageTargets` per
    pair, no instances, ``semantic`` the mask's path relative to ``mask_root``; the
    categories are the fixed map (``AnnotationConfig.categories``: ids are the pixel
    values) or None.
    """
    images, masks = Path(images), Path(masks)
    for d, what in ((images, "image"), (masks, "mask")):
        if not d.is_dir():
            raise InputError(f"{d}: no such {what} folder")
    report = Report(config)
    img_scan = list_images(images)
    mask_scan = list_images(masks)
    for s in (*img_scan.skipped, *mask_scan.skipped):
        report.skip(s["path"], s["reason"])
    by_stem: dict[str, list[str]] = {}
    for e in mask_scan.entries:
        by_stem.setdefault(e.rel.rsplit(".", 1)[0], []).append(e.rel)
    used: set[str] = set()
    out = []
    for e in img_scan.entries:
        rel = e.rel
        stem = rel.rsplit(".", 1)[0]
        cands = by_stem.get(stem, [])
        if not cands:
            report.skip(rel, f"no mask named {stem}.* under {masks}")
            continue
        if len(cands) > 1:
            used.update(cands)
            report.skip(rel, f"more than one mask for it: {', '.join(sorted(cands))}")
            continue
        mrel = cands[0]
        used.add(mrel)
        try:
            size = header_size(images / rel)
        except Exception as err:
            report.skip(rel, f"cannot read the image's header ({type(err).__name__}: {err})")
            continue
        try:
            msize, mode = _mask_header(masks / mrel)
        except Exception as err:
            report.skip(rel, f"cannot read its mask {mrel} ({type(err).__name__}: {err})")
            continue
        if mode not in MASK_MODES:
            report.skip(
                rel,
                f"its mask {mrel} is {mode}, not one channel of class ids (grey L or palette P)",
            )
            continue
        if msize != size:
            report.skip(
                rel,
                f"its mask {mrel} is {msize[1]}x{msize[0]}, the image {size[1]}x{size[0]}; "
                "a mask must have its image's size",
            )
            continue
        out.append(ImageTargets(file=rel, size=size, semantic=mrel, image_id=stem))
    for stems in by_stem.values():
        for mrel in stems:
            if mrel not in used:
                report.skip(
                    mrel, f"a mask with no image of that name under {images}", source=str(masks)
                )
    return report.finish(
        "masks", images, config.category_map(), out, mask_root=masks, sources=[str(masks)]
    )


def read_semantic_mask(
    path: str | os.PathLike[str],
    size: tuple[int, int] | None = None,
    categories: CategoryMap | None = None,
    ignore_index: int = 255,
) -> np.ndarray:
    """One mask as uint8 [H, W] of class ids (palette indices as they are, never RGB).

    ``size``: the (h, w) it must have. ``categories``: when given, every value must be a
    category id or ``ignore_index``. Raises :class:`DecodeError` (a per-image skip)
    naming the file and the problem.
    """
    from PIL import Image

    path = Path(path)
    try:
        with open_if_regular(path) as f, Image.open(f) as im:
            if im.mode not in MASK_MODES:
                raise DecodeError(f"{path}: a {im.mode} mask; class ids are one channel (L or P)")
            im.load()
            arr = np.asarray(im, dtype=np.uint8)  # P: the indices, L: the values
    except DecodeError:
        raise
    except Exception as err:
        raise DecodeError(f"{path}: cannot read the mask ({type(err).__name__}: {err})") from None
    if size is not None and arr.shape != tuple(size):
        raise DecodeError(
            f"{path}: a {arr.shape[1]}x{arr.shape[0]} mask for a {size[1]}x{size[0]} image"
        )
    if categories is not None:
        allowed = np.zeros(256, dtype=bool)
        allowed[[i for i in categories.ids if 0 <= i <= 255]] = True
        allowed[ignore_index] = True
        bad = np.unique(arr[~allowed[arr]])
        if bad.size:
            raise DecodeError(
                f"{path}: values {bad[:8].tolist()} are neither category ids nor the ignore "
                f"value {ignore_index}"
            )
    return np.ascontiguousarray(arr)


def is_mask_pair(root: Path) -> tuple[Path, Path] | None:
    """The (images, masks) folders of ``root`` by the usual names, or None. A mask
    folder must hold a PNG (COCO's ``annotations/`` holds JSON)."""
    for a, b in MASK_PAIRS:
        if (root / a).is_dir() and (root / b).is_dir() and next((root / b).rglob("*.png"), None):
            return root / a, root / b
    return None
