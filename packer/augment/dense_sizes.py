"""The dense ops that set an image's size (:mod:`packer.augment.dense` has the random
crops and warps, and re-exports these): :class:`Resize`, :class:`RandomResize` (the
shorter side drawn), :class:`FixedSizeCrop` (the detection reference's LSJ crop),
:class:`Pad`, :class:`PadTo`, :class:`PadToMultiple`, and
:class:`SanitizeBoundingBoxes`. Each moves the image and all its targets at once, with
torchvision v2's draws (``make_params``) from a ``torch.Generator``.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import numpy as np
import torch

from ..imaging.resize import (
    ArgumentError,
    check_antialias,
    interpolation_mode,
    size_pair,
)
from . import dense_kernels as K
from .dense_compose import DenseOp, Params
from .dense_kernels import Sample

_F32 = np.float32  # torch computes a float32 tensor with a Python number in float32


def _rand(g: torch.Generator | None) -> np.float32:
    """torchvision's ``torch.rand(1)``, as a float32 scalar: the draw's arithmetic then
    runs on the host's scalars (the same float32 operations, the same bits) rather than
    as a handful of tensor ops an image (host time the loader's thread holds the GIL for)."""
    return _F32(torch.rand(1, generator=g).item())


class Resize(DenseOp):
    """torchvision's Resize: ``size`` (h, w), or one int for the shorter side (with
    ``max_size`` capping the longer one)."""

    def __init__(
        self,
        size: int | Sequence[int],
        interpolation: object = "bilinear",
        max_size: int | None = None,
        antialias: bool | None = True,
    ) -> None:
        K.resize_output_size(100, 100, size, max_size)  # checks the arguments
        self.size, self.max_size = size, max_size
        self.interpolation = interpolation_mode(interpolation, "Resize")
        self.antialias = check_antialias(self.interpolation, antialias, "Resize")

    def apply(self, s: Sample, params: Params) -> Sample:
        return K.resize(s, self.size, self.interpolation, self.antialias, self.max_size)


class RandomResize(DenseOp):
    """torchvision's RandomResize: the shorter side to ``randint(min_size, max_size)``
    (max excluded; one draw, ``torch.randint``), as :class:`Resize` with that size (the
    segmentation reference's RandomResize(lo, hi) is ``RandomResize(lo, hi + 1)``)."""

    def __init__(
        self,
        min_size: int,
        max_size: int,
        interpolation: object = "bilinear",
        antialias: bool | None = True,
    ) -> None:
        for name, v in (("min_size", min_size), ("max_size", max_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ArgumentError(f"RandomResize: {name} must be a positive int, not {v!r}")
        if max_size <= min_size:
            raise ArgumentError(
                f"RandomResize: max_size {max_size} must exceed min_size {min_size} (excluded)"
            )
        self.min_size, self.max_size = min_size, max_size
        self.interpolation = interpolation_mode(interpolation, "RandomResize")
        self.antialias = check_antialias(self.interpolation, antialias, "RandomResize")

    def sample_params(self, s: Sample, generator: torch.Generator | None = None) -> Params:
        size = torch.randint(self.min_size, self.max_size, (1,), generator=generator)
        return dict(size=int(size))

    def apply(self, s: Sample, params: Params) -> Sample:
        return K.resize(s, params["size"], self.interpolation, self.antialias)


class FixedSizeCrop(DenseOp):
    """The detection reference's FixedSizeCrop (LSJ's second step): crop to at most
    ``size`` at ``int(offset * r)`` (one ``r = rand()`` for both axes), drop the boxes
    left empty, pad right and bottom to exactly ``size`` with ``fill``."""

    def __init__(self, size: int | Sequence[int], fill: K.FillArg = 0, semantic_fill: int = 255):
        self.size = size_pair(size, "FixedSizeCrop size")
        self.fill, self.semantic_fill = fill, semantic_fill

    def sample_params(self, s: Sample, generator: torch.Generator | None = None) -> Params:
        h, w = s.size
        ch, cw = self.size
        top = left = 0
        if min(h, ch) != h or min(w, cw) != w:
            r = _rand(generator)  # torchvision's float32 products, on scalars
            top, left = int(_F32(max(h - ch, 0)) * r), int(_F32(max(w - cw, 0)) * r)
        return dict(top=top, left=left)

    def apply(self, s: Sample, params: Params) -> Sample:
        return K.fixed_size_crop(s, params["top"], params["left"], *self.size, self.fill,
                                 self.semantic_fill)  # fmt: skip


class Pad(DenseOp):
    """A fixed padding (left, top, right, bottom) of every field."""

    def __init__(self, padding: Sequence[int], fill: K.FillArg = 0, mask_fill: int = 0,
                 semantic_fill: int = 255) -> None:  # fmt: skip
        if not isinstance(padding, Sequence) or len(padding) != 4:
            raise ArgumentError(f"Pad: padding must be (left, top, right, bottom), not {padding!r}")
        self.padding = tuple(int(p) for p in padding)
        self.fill, self.mask_fill, self.semantic_fill = fill, mask_fill, semantic_fill

    def apply(self, s: Sample, params: Params) -> Sample:
        return K.pad(s, *self.padding, self.fill, self.mask_fill, self.semantic_fill)


class PadTo(DenseOp):
    """Pad right and bottom to exactly ``size`` (h, w); a larger image is refused."""

    def __init__(self, size: int | Sequence[int], fill: K.FillArg = 0, mask_fill: int = 0,
                 semantic_fill: int = 255) -> None:  # fmt: skip
        self.size = size_pair(size, "PadTo size")
        self.fill, self.mask_fill, self.semantic_fill = fill, mask_fill, semantic_fill

    def apply(self, s: Sample, params: Params) -> Sample:
        (h, w), (th, tw) = s.size, self.size
        if h > th or w > tw:
            raise ArgumentError(f"PadTo: the {h}x{w} image is larger than {th}x{tw}; crop first")
        return K.pad(s, 0, 0, tw - w, th - h, self.fill, self.mask_fill, self.semantic_fill)


class PadToMultiple(DenseOp):
    """Pad right and bottom to multiples of ``divisor`` (32 by default)."""

    def __init__(self, divisor: int = 32, fill: K.FillArg = 0, mask_fill: int = 0,
                 semantic_fill: int = 255) -> None:  # fmt: skip
        self.divisor = divisor
        self.fill, self.mask_fill, self.semantic_fill = fill, mask_fill, semantic_fill
        K.pad_to_multiple(Sample(torch.zeros(1, 1, 1, dtype=torch.uint8)), divisor)

    def apply(self, s: Sample, params: Params) -> Sample:
        return K.pad_to_multiple(s, self.divisor, self.fill, self.mask_fill, self.semantic_fill)


class SanitizeBoundingBoxes(DenseOp):
    """Drop boxes under ``min_size`` a side or ``min_area`` (or outside the canvas),
    with their labels, masks, keypoints and extras (torchvision's rule)."""

    def __init__(self, min_size: float = 1.0, min_area: float = 1.0) -> None:
        for name, v in (("min_size", min_size), ("min_area", min_area)):
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not v >= 1:
                raise ArgumentError(f"SanitizeBoundingBoxes: {name} must be >= 1, not {v!r}")
        self.min_size, self.min_area = float(min_size), float(min_area)

    def apply(self, s: Sample, params: Params) -> Sample:
        return K.sanitize(s, self.min_size, self.min_area)
