"""The batched dense path's plan: which ops it takes (:func:`batched_ops`, a :class:`Plan`
with the pads' one fill) and their parameters drawn per image (:func:`draw`), as
:mod:`packer.augment.dense_batched` runs them.

Every op one of :data:`BATCHED` (exact types), at most one resampling op (ScaleJitter,
Resize, RandomResize, RandomResizedCrop; bilinear or nearest) and only flips before it,
one image fill (and mask fills) for every op that pads. Others (IoU crop, affine,
rotation, colour ops, bicubic, ...) keep the per-image path.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..imaging.resize import ArgumentError
from . import dense as D
from .dense_compose import Compose
from .dense_kernels import resize_output_size

RESAMPLERS = (D.ScaleJitter, D.Resize, D.RandomResize, D.RandomResizedCrop)
PADDERS = (D.Pad, D.PadTo, D.PadToMultiple, D.RandomZoomOut, D.FixedSizeCrop)
BATCHED = (*RESAMPLERS, *PADDERS, D.RandomHorizontalFlip, D.SanitizeBoundingBoxes)
MODES = ("bilinear", "nearest", "nearest-exact")


@dataclass(frozen=True)
class Plan:
    """A batched op list: ``ops``, the pads' ``fill`` (image), ``mask_fill`` and
    ``semantic_fill``, the resampler's ``mode`` and ``antialias``."""

    ops: tuple
    fill: Any
    mask_fill: int
    semantic_fill: int
    mode: str
    antialias: bool


def _fills(op: Any) -> tuple:
    if isinstance(op, D.FixedSizeCrop):
        return (_fill_key(op.fill), 0, int(op.semantic_fill))
    return (_fill_key(op.fill), int(op.mask_fill), int(op.semantic_fill))


def _fill_key(fill: Any) -> Any:
    if fill is None:
        return 0.0
    if isinstance(fill, numbers.Real):
        return float(fill)
    fill = tuple(float(v) for v in fill)
    return fill[0] if len(fill) == 1 else fill


def batched_ops(op: Any) -> Plan | None:
    """The :class:`Plan` of ``op`` (a dense op or a Compose of them), or None where some
    op has no batched path (then the per-image path runs)."""
    ops = op.ops if type(op) is Compose else [op]
    resampled = moved = False
    fills, mode, aa = set(), "bilinear", True
    for o in ops:
        if type(o) not in BATCHED:
            return None
        if isinstance(o, RESAMPLERS):
            mode = getattr(o.interpolation, "value", o.interpolation)
            if resampled or moved or mode not in MODES:
                return None
            resampled, aa = True, bool(o.antialias)
        if isinstance(o, PADDERS):  # flips may come first: they mirror the source
            moved = True
        if isinstance(o, PADDERS):
            fills.add(_fills(o))
    if len(fills) > 1:
        return None
    fill, mask_fill, semantic_fill = fills.pop() if fills else (0.0, 0, 255)
    return Plan(tuple(ops), fill, mask_fill, semantic_fill, mode, aa)


# ---------------------------------------------------------------- the draws


class _Size:
    """What the batched ops' ``sample_params`` read of a sample: its size."""

    def __init__(self, h: int, w: int) -> None:
        self.size = (h, w)


def draw(plan: Plan, sizes: Sequence[tuple[int, int]], gen: torch.Generator | None) -> list:
    """Per image, per op, the op's parameters (None: skipped), drawn image by image and
    op by op from ``gen`` as the per-image path draws them."""
    out = []
    for h, w in sizes:
        cur, params = _Size(h, w), []
        for o in plan.ops:
            p = o.sample_params(cur, gen)
            params.append(p)
            if p is not None:
                cur = _Size(*out_size(o, p, cur.size))
        out.append(params)
    return out


def out_size(o: Any, p: dict, size: tuple[int, int]) -> tuple[int, int]:
    h, w = size
    if isinstance(o, D.ScaleJitter):
        return p["size"]
    if isinstance(o, D.Resize):
        return resize_output_size(h, w, o.size, o.max_size)
    if isinstance(o, D.RandomResize):
        return resize_output_size(h, w, p["size"])
    if isinstance(o, (D.RandomResizedCrop, D.FixedSizeCrop)):
        return o.size
    if isinstance(o, D.Pad):
        left, top, right, bottom = o.padding
        return h + top + bottom, w + left + right
    if isinstance(o, D.PadTo):
        th, tw = o.size
        if h > th or w > tw:
            raise ArgumentError(f"PadTo: the {h}x{w} image is larger than {th}x{tw}; crop first")
        return o.size
    if isinstance(o, D.PadToMultiple):
        return h + (-h % o.divisor), w + (-w % o.divisor)
    if isinstance(o, D.RandomZoomOut):
        return h + p["top"] + p["bottom"], w + p["left"] + p["right"]
    return size
