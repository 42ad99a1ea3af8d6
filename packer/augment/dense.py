"""Random geometry for detection and segmentation: each op moves one image and all its
targets (boxes, labels, instance and semantic masks, keypoints) at once.

    from packer.augment import dense as D
    ssd = D.Compose([D.RandomZoomOut(fill=(124, 116, 104)), D.RandomIoUCrop(),
                     D.RandomHorizontalFlip(flip_map=FLIP), D.SanitizeBoundingBoxes()])
    out = ssd(D.Sample(image, boxes=boxes, labels=labels, masks=masks), generator=g)

An op is called as ``op(sample, generator=None)`` on a :class:`Sample` (CUDA or CPU
tensors; the work runs where they are) and returns a new Sample. It draws its
parameters on the CPU from ``generator`` (torch's global generator when None) with
the calls, in the order, of ``torchvision.transforms.v2``'s ``make_params``: the same
seed gives the same parameters as torchvision's transform after
``torch.manual_seed``, so the same outputs. ``op.sample_params(sample, generator)``
returns them (None: the op leaves the sample as it is) and ``op.apply(sample,
params)`` applies given ones; the kernels themselves, with explicit parameters, are
:mod:`packer.augment.dense_kernels`.

Colour ops touch the image only: ``ColorOnly(packer.transforms.ColorJitter(...))``.
A torchvision transform, or a ``packer.transforms`` op that would move the image
without its targets, is refused (UsageError naming it) where a dense op is expected.

The ops that set a size (Resize, RandomResize, FixedSizeCrop, the pads, sanitize) are
in :mod:`packer.augment.dense_sizes`; every op is importable from here.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import replace

import torch

from ..imaging.resize import (
    ArgumentError,
    check_antialias,
    interpolation_mode,
    size_pair,
    to_device,
)
from . import dense_kernels as K
from .dense_compose import ColorOnly, Compose, DenseOp, Params, as_dense_op
from .dense_kernels import Sample
from .dense_sizes import (
    _F32,
    FixedSizeCrop,
    Pad,
    PadTo,
    PadToMultiple,
    RandomResize,
    Resize,
    SanitizeBoundingBoxes,
    _rand,
)
from .warps import interpolation_mode as warp_interpolation

__all__ = [
    "ColorOnly",
    "Compose",
    "DenseOp",
    "FixedSizeCrop",
    "Pad",
    "PadTo",
    "PadToMultiple",
    "RandomAffine",
    "RandomHorizontalFlip",
    "RandomIoUCrop",
    "RandomResize",
    "RandomResizedCrop",
    "RandomRotation",
    "RandomZoomOut",
    "Resize",
    "Sample",
    "SanitizeBoundingBoxes",
    "ScaleJitter",
    "as_dense_op",
]


def _uniform(lo: float, hi: float, g: torch.Generator | None) -> float:
    """torchvision's ``torch.empty(1).uniform_(lo, hi).item()``."""
    return torch.empty(1).uniform_(lo, hi, generator=g).item()


def _coin(p: float, g: torch.Generator | None) -> bool:
    """torchvision's ``_RandomApplyTransform``: apply unless ``torch.rand(1) >= p`` (the
    comparison in float32, as torch's)."""
    return bool(_rand(g) < _F32(p))


def _prob(p: object, op: str) -> float:
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 <= p <= 1.0:
        raise ArgumentError(f"{op}: p must be a probability in [0, 1], not {p!r}")
    return float(p)


def _pair(value: object, name: str, op: str, lo: float = -math.inf) -> tuple[float, float]:
    if not isinstance(value, Sequence) or len(value) != 2:
        raise ArgumentError(f"{op}: {name} must be (min, max), not {value!r}")
    a, b = (float(v) for v in value)
    if not (lo <= a <= b) or not math.isfinite(b):
        raise ArgumentError(
            f"{op}: {name} must be finite (min, max), min <= max, >= {lo}: {value!r}"
        )
    return a, b


def _angles(value: object, name: str, op: str, sizes: tuple[int, ...]) -> tuple[float, ...]:
    """torchvision's ``_setup_angle``: a number d >= 0 is (-d, d)."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        if value < 0:
            raise ArgumentError(f"{op}: {name} must be >= 0 when one number, not {value!r}")
        return (-float(value), float(value))
    if not isinstance(value, Sequence) or len(value) not in sizes:
        raise ArgumentError(f"{op}: {name} must be a number or {sizes} numbers, not {value!r}")
    return tuple(float(v) for v in value)


class RandomHorizontalFlip(DenseOp):
    """Mirror with probability ``p``; keypoints reordered by ``flip_map`` (one map for
    all categories or {label: map}; a map is a permutation of the K keypoints or a
    list of (left, right) pairs: :func:`~packer.augment.dense_kernels.flip_permutation`)."""

    def __init__(self, p: float = 0.5, flip_map: object = None) -> None:
        self.p = _prob(p, "RandomHorizontalFlip")
        self.flip_map = flip_map

    def sample_params(self, s: Sample, generator: torch.Generator | None = None) -> Params:
        return {} if _coin(self.p, generator) else None

    def apply(self, s: Sample, params: Params) -> Sample:
        return K.horizontal_flip(s, self.flip_map)


class RandomResizedCrop(DenseOp):
    """torchvision's RandomResizedCrop: a box of ``scale`` of the area and ``ratio``
    aspect (10 tries, then the centre crop), resized to ``size``."""

    def __init__(
        self,
        size: int | Sequence[int],
        scale: Sequence[float] = (0.08, 1.0),
        ratio: Sequence[float] = (3.0 / 4.0, 4.0 / 3.0),
        interpolation: object = "bilinear",
        antialias: bool | None = True,
    ) -> None:
        op = "RandomResizedCrop"
        self.size = size_pair(size, f"{op} size")
        self.scale = _pair(scale, "scale", op, lo=0.0)
        self.ratio = _pair(ratio, "ratio", op, lo=0.0)
        if self.ratio[0] <= 0:
            raise ArgumentError(f"{op}: ratio must be positive, not {ratio!r}")
        self.interpolation = interpolation_mode(interpolation, op)
        self.antialias = check_antialias(self.interpolation, antialias, op)
        self._log_ratio = torch.log(torch.tensor(self.ratio))

    def sample_params(self, s: Sample, generator: torch.Generator | None = None) -> Params:
        height, width = s.size
        area = height * width
        lr0, lr1 = float(self._log_ratio[0]), float(self._log_ratio[1])
        for _ in range(10):
            target_area = area * _uniform(*self.scale, generator)
            aspect_ratio = torch.exp(torch.empty(1).uniform_(lr0, lr1, generator=generator)).item()
            w = round(math.sqrt(target_area * aspect_ratio))
            h = round(math.sqrt(target_area / aspect_ratio))
            if 0 < w <= width and 0 < h <= height:
                i = int(torch.randint(0, height - h + 1, size=(1,), generator=generator))
                j = int(torch.randint(0, width - w + 1, size=(1,), generator=generator))
                return dict(top=i, left=j, height=h, width=w)
        in_ratio = float(width) / float(height)
        if in_ratio < min(self.ratio):
            w, h = width, round(width / min(self.ratio))
        elif in_ratio > max(self.ratio):
            h, w = height, round(height * max(self.ratio))
        else:
            w, h = width, height
        return dict(top=(height - h) // 2, left=(width - w) // 2, height=h, width=w)

    def apply(self, s: Sample, params: Params) -> Sample:
        return K.resized_crop(s, **params, size=self.size, interpolation=self.interpolation,
                              antialias=self.antialias)  # fmt: skip


class RandomIoUCrop(DenseOp):
    """SSD's crop (torchvision's RandomIoUCrop): pick a minimum IoU from
    ``sampler_options`` (1.0 or more: keep the sample), then up to ``trials`` crops of
    ``min_scale``..``max_scale`` per side with an aspect in the bounds, holding some box
    centre and one such box at that IoU. Boxes whose centre falls outside become 0
    (follow with :class:`SanitizeBoundingBoxes`, as torchvision asks).

    The draw reads the boxes on the CPU (on CUDA one wait for the device per image).
    torchvision draws forever when no crop can succeed; here after ``max_rounds``
    options the sample is kept.
    """

    def __init__(
        self,
        min_scale: float = 0.3,
        max_scale: float = 1.0,
        min_aspect_ratio: float = 0.5,
        max_aspect_ratio: float = 2.0,
        sampler_options: Sequence[float] | None = None,
        trials: int = 40,
        max_rounds: int = 1000,
    ) -> None:
        op = "RandomIoUCrop"
        self.min_scale, self.max_scale = _pair((min_scale, max_scale), "scale", op, lo=0.0)
        self.min_aspect_ratio, self.max_aspect_ratio = _pair(
            (min_aspect_ratio, max_aspect_ratio), "aspect ratio", op, lo=0.0
        )
        if sampler_options is None:
            sampler_options = [0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0]
        if not sampler_options:
            raise ArgumentError(f"{op}: sampler_options must hold at least one IoU")
        self.options = [float(o) for o in sampler_options]
        for name, v in (("trials", trials), ("max_rounds", max_rounds)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ArgumentError(f"{op}: {name} must be a positive int, not {v!r}")
        self.trials, self.max_rounds = trials, max_rounds

    def sample_params(self, s: Sample, generator: torch.Generator | None = None) -> Params:
        if s.boxes is None:
            raise ArgumentError("RandomIoUCrop: needs the sample's boxes")
        orig_h, orig_w = s.size
        boxes = s.boxes.cpu()
        cx = 0.5 * (boxes[..., 0] + boxes[..., 2])
        cy = 0.5 * (boxes[..., 1] + boxes[..., 3])
        g = generator
        for _ in range(self.max_rounds):
            idx = int(torch.randint(low=0, high=len(self.options), size=(1,), generator=g))
            min_iou = self.options[idx]
            if min_iou >= 1.0:
                return None
            for _ in range(self.trials):
                r = self.min_scale + (self.max_scale - self.min_scale) * torch.rand(2, generator=g)
                new_w, new_h = int(orig_w * r[0]), int(orig_h * r[1])
                if new_h == 0 or not (
                    self.min_aspect_ratio <= new_w / new_h <= self.max_aspect_ratio
                ):
                    continue
                r = torch.rand(2, generator=g)
                left, top = int((orig_w - new_w) * r[0]), int((orig_h - new_h) * r[1])
                right, bottom = left + new_w, top + new_h
                if left == right or top == bottom:
                    continue
                within = (left < cx) & (cx < right) & (top < cy) & (cy < bottom)
                if not within.any():
                    continue
                crop = torch.tensor([[left, top, right, bottom]], dtype=boxes.dtype)
                if K.box_iou(boxes[within], crop).max() < min_iou:
                    continue
                return dict(top=top, left=left, height=new_h, width=new_w, within=within)
        return None

    def apply(self, s: Sample, params: Params) -> Sample:
        p = dict(params)
        within = p.pop("within")
        out = K.crop(s, **p)
        keep = to_device(within, out.boxes.device)[:, None]  # host boxes: no copy at all
        return replace(out, boxes=torch.where(keep, out.boxes, torch.zeros_like(out.boxes)))


class ScaleJitter(DenseOp):
    """Large scale jitter (torchvision's ScaleJitter): resize by ``min(target_size[1] /
    H, target_size[0] / W) * U(scale_range)``, torchvision's arithmetic (float32)."""

    def __init__(
        self,
        target_size: Sequence[int],
        scale_range: Sequence[float] = (0.1, 2.0),
        interpolation: object = "bilinear",
        antialias: bool | None = True,
    ) -> None:
        op = "ScaleJitter"
        self.target_size = size_pair(target_size, f"{op} target_size")
        self.scale_range = _pair(scale_range, "scale_range", op, lo=0.0)
        self.interpolation = interpolation_mode(interpolation, op)
        self.antialias = check_antialias(self.interpolation, antialias, op)

    def sample_params(self, s: Sample, generator: torch.Generator | None = None) -> Params:
        h, w = s.size
        lo, hi = self.scale_range
        # torchvision's float32 tensor arithmetic, on float32 scalars (the same bits)
        scale = _F32(lo) + _rand(generator) * _F32(hi - lo)
        r = _F32(min(self.target_size[1] / h, self.target_size[0] / w)) * scale
        return dict(size=(max(int(_F32(h) * r), 1), max(int(_F32(w) * r), 1)))

    def apply(self, s: Sample, params: Params) -> Sample:
        return K.resize(s, params["size"], self.interpolation, self.antialias)


class RandomZoomOut(DenseOp):
    """SSD's zoom out (torchvision's RandomZoomOut): with probability ``p``, place the
    image on a canvas ``U(side_range)`` times its size at a random spot; ``fill`` the
    image's background, ``mask_fill`` / ``semantic_fill`` the masks'."""

    def __init__(
        self,
        fill: K.FillArg = 0,
        side_range: Sequence[float] = (1.0, 4.0),
        p: float = 0.5,
        mask_fill: int = 0,
        semantic_fill: int = 255,
    ) -> None:
        self.fill = fill
        self.side_range = _pair(side_range, "side_range", "RandomZoomOut", lo=1.0)
        self.p = _prob(p, "RandomZoomOut")
        self.mask_fill, self.semantic_fill = mask_fill, semantic_fill

    def sample_params(self, s: Sample, generator: torch.Generator | None = None) -> Params:
        if not _coin(self.p, generator):
            return None
        orig_h, orig_w = s.size
        lo, hi = self.side_range
        r = lo + torch.rand(1, generator=generator) * (hi - lo)
        canvas_w, canvas_h = int(orig_w * r), int(orig_h * r)
        r = torch.rand(2, generator=generator)
        left = int((canvas_w - orig_w) * r[0])
        top = int((canvas_h - orig_h) * r[1])
        right, bottom = canvas_w - (left + orig_w), canvas_h - (top + orig_h)
        return dict(left=left, top=top, right=right, bottom=bottom)

    def apply(self, s: Sample, params: Params) -> Sample:
        return K.pad(s, **params, fill=self.fill, mask_fill=self.mask_fill,
                     semantic_fill=self.semantic_fill)  # fmt: skip


class _Warp(DenseOp):
    def _warp_args(self, interpolation, fill, center, mask_fill, semantic_fill, op) -> None:
        self.interpolation = warp_interpolation(interpolation, op)
        self.fill = fill
        if center is not None and (not isinstance(center, Sequence) or len(center) != 2):
            raise ArgumentError(f"{op}: center must be (x, y) pixels or None, not {center!r}")
        self.center = None if center is None else tuple(float(c) for c in center)
        self.mask_fill, self.semantic_fill = mask_fill, semantic_fill

    def _fills(self) -> dict:
        return dict(interpolation=self.interpolation, fill=self.fill, center=self.center,
                    mask_fill=self.mask_fill, semantic_fill=self.semantic_fill)  # fmt: skip


class RandomRotation(_Warp):
    """torchvision's RandomRotation (``expand=False``): an angle ``U(degrees)``
    counter-clockwise; pixels from outside the image are ``fill`` (masks
    ``mask_fill``, ``semantic_fill``); boxes the box around their rotated corners."""

    def __init__(
        self,
        degrees: float | Sequence[float],
        interpolation: object = "nearest",
        center: Sequence[float] | None = None,
        fill: K.FillArg = 0,
        mask_fill: int | None = 0,
        semantic_fill: int | None = 255,
    ) -> None:
        self.degrees = _angles(degrees, "degrees", "RandomRotation", (2,))
        self._warp_args(interpolation, fill, center, mask_fill, semantic_fill, "RandomRotation")

    def sample_params(self, s: Sample, generator: torch.Generator | None = None) -> Params:
        return dict(angle=_uniform(*self.degrees, generator))

    def apply(self, s: Sample, params: Params) -> Sample:
        return K.rotate(s, params["angle"], **self._fills())


class RandomAffine(_Warp):
    """torchvision's RandomAffine: angle ``U(degrees)``, translation ``round(U(+-a W))``,
    ``round(U(+-b H))``, scale ``U(scale)``, shear x ``U(shear[0:2])`` (y
    ``U(shear[2:4])``), drawn in that order; fields as :class:`RandomRotation`."""

    def __init__(
        self,
        degrees: float | Sequence[float],
        translate: Sequence[float] | None = None,
        scale: Sequence[float] | None = None,
        shear: float | Sequence[float] | None = None,
        interpolation: object = "nearest",
        fill: K.FillArg = 0,
        center: Sequence[float] | None = None,
        mask_fill: int | None = 0,
        semantic_fill: int | None = 255,
    ) -> None:
        op = "RandomAffine"
        self.degrees = _angles(degrees, "degrees", op, (2,))
        if translate is not None:
            translate = _pair(translate, "translate", op, lo=0.0)
            if max(translate) > 1.0 or min(translate) < 0:
                raise ArgumentError(f"{op}: translate values must lie in [0, 1], not {translate}")
        self.translate = translate
        self.scale = None if scale is None else _pair(scale, "scale", op, lo=0.0)
        if self.scale is not None and self.scale[0] <= 0:
            raise ArgumentError(f"{op}: scale values must be positive, not {scale!r}")
        self.shear = None if shear is None else _angles(shear, "shear", op, (2, 4))
        self._warp_args(interpolation, fill, center, mask_fill, semantic_fill, op)

    def sample_params(self, s: Sample, generator: torch.Generator | None = None) -> Params:
        g = generator
        height, width = s.size
        angle = _uniform(*self.degrees, g)
        translate = (0, 0)
        if self.translate is not None:
            max_dx, max_dy = float(self.translate[0] * width), float(self.translate[1] * height)
            translate = (
                round(_uniform(-max_dx, max_dx, g)),
                round(_uniform(-max_dy, max_dy, g)),
            )
        scale = _uniform(*self.scale, g) if self.scale is not None else 1.0
        shear_x = shear_y = 0.0
        if self.shear is not None:
            shear_x = _uniform(self.shear[0], self.shear[1], g)
            if len(self.shear) == 4:
                shear_y = _uniform(self.shear[2], self.shear[3], g)
        return dict(angle=angle, translate=translate, scale=scale, shear=(shear_x, shear_y))

    def apply(self, s: Sample, params: Params) -> Sample:
        return K.affine(s, **params, **self._fills())
