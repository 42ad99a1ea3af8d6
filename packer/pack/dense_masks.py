"""Instance masks as COCO compressed RLE, checked (the dense columns' masks,
:mod:`packer.pack.dense`): :func:`rle_counts` reads a counts string's run lengths and
checks they cover exactly the frame (pycocotools writes past its buffer otherwise),
:func:`mask_runs` and :func:`decode_masks` (uint8 [M, h, w]) check every RLE before
pycocotools sees it, :func:`encode_masks` writes them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import PackFormatError
from .dense_record import DEFAULT_MAX_FRAME_PIXELS, MAX_FRAME_SIDE


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
