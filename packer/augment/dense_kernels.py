"""Geometry kernels for one image and its dense targets, with explicit parameters.

A :class:`Sample` holds one image and what lies on it: boxes, labels, instance masks,
a semantic mask, keypoints, and any other per-instance tensors (``extras``: iscrowd,
area, ids). Each kernel here moves every field at once and returns a new Sample, on
the tensors' device (CUDA or CPU: the same torch code), with the parameters given
(as ``torchvision.transforms.v2.functional`` takes them; :mod:`packer.augment.dense`
draws them). The rules are torchvision's on ``tv_tensors``:

- image: the existing batched kernels of :mod:`packer.imaging` on a batch of one
  (:func:`~packer.imaging.resize.resized_crop`, :func:`~packer.augment.warps.affine`),
  slicing and padding as torchvision's;
- boxes: float32 ``[M, 4]`` XYXY pixels, moved by torchvision's arithmetic (same
  float32 operations), clamped to the canvas after crops, pads and warps;
- masks (instance ``[M, H, W]`` and semantic ``[H, W]``, uint8): nearest neighbour
  (``interpolate(mode="nearest")``, torchvision's grid for the warps): identical;
- keypoints ``[M, K, 3]`` (x, y, visibility): x, y as ``tv_tensors.KeyPoints`` (a
  flip maps x to ``W - 1 - x``; coordinates are never clamped) and a flip swaps the
  left/right pairs by the category's ``flip_map``. Where a crop or a warp moves a
  point outside ``[0, W) x [0, H)`` its visibility becomes 0.

Boxes are dropped only by :func:`sanitize` (and :func:`fixed_size_crop`, as the
detection reference's ``FixedSizeCrop``), with their labels, masks, keypoints and
extras; that selection makes the host wait for the device once per call when the
boxes are on the device, never when they are host targets (on the CPU beside device
pixels, as the dense pass keeps them: :data:`~packer.augment.dense_sample.PIXEL_FIELDS`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import torch
import torch.nn.functional as nnf

from ..imaging.resize import ArgumentError, size_pair, to_device
from ..imaging.resize import resized_crop as resized_crop_images
from .dense_sample import (
    FillArg,
    Sample,
    check_sample,
    clamp_boxes,
    crop_pixels,
    hide_outside,
    masks_apply,
    pad_image,
    resize_nearest,
    select,
    vec,
)
from .dense_warps import affine, affine_matrix, rotate

__all__ = [
    "FillArg",
    "Sample",
    "affine",
    "affine_matrix",
    "box_iou",
    "check_sample",
    "crop",
    "fixed_size_crop",
    "flip_permutation",
    "horizontal_flip",
    "pad",
    "pad_image",
    "pad_to_multiple",
    "resize",
    "resize_output_size",
    "resized_crop",
    "rotate",
    "sanitize",
    "sanitize_mask",
    "select",
]


# ---------------------------------------------------------------- flip


def flip_permutation(
    flip_map: object, labels: torch.Tensor | None, m: int, k: int, device: torch.device
) -> torch.Tensor | None:
    """Per instance, the keypoint order after a horizontal flip: int64 [M, K] on
    ``device``, or None (no swap).

    ``flip_map``: None; one map for every category; or a dict {category label: map}
    (categories not in it keep their order). A map is a permutation of range(K)
    (``new[i] = old[map[i]]``) or a list of (left, right) index pairs to swap.
    """
    if flip_map is None:
        return None
    if isinstance(flip_map, Mapping):
        if labels is None:
            raise ArgumentError("horizontal_flip: a flip_map per category needs the labels")
        keys = sorted(int(c) for c in flip_map)
        if not keys:
            return None
        if keys[0] < 0:
            raise ArgumentError(f"horizontal_flip: flip_map categories must be >= 0, not {keys[0]}")
        ident = list(range(k))
        rows = [ident] * (keys[-1] + 2)  # the last row: categories beyond the map
        for c in keys:
            rows[c] = _permutation(flip_map[c], k, c)
        table = to_device(torch.tensor(rows, dtype=torch.int64), device)
        lab = labels.to(torch.int64)
        idx = torch.where((lab >= 0) & (lab <= keys[-1]), lab, keys[-1] + 1)
        return table[idx]
    perm = torch.tensor(_permutation(flip_map, k, None), dtype=torch.int64)
    return to_device(perm, device).expand(m, k)


def _permutation(spec: object, k: int, category: int | None) -> list[int]:
    where = "flip_map" if category is None else f"flip_map[{category}]"
    if not isinstance(spec, Sequence) or isinstance(spec, str):
        raise ArgumentError(f"horizontal_flip: {where} must be a list, not {spec!r}")
    if spec and all(isinstance(p, Sequence) and len(p) == 2 for p in spec):
        perm = list(range(k))
        for a, b in spec:
            if not (0 <= int(a) < k and 0 <= int(b) < k):
                raise ArgumentError(f"horizontal_flip: {where} pair {(a, b)} is outside 0..{k - 1}")
            perm[int(a)], perm[int(b)] = int(b), int(a)
        return perm
    perm = [int(p) for p in spec]
    if sorted(perm) != list(range(k)):
        raise ArgumentError(
            f"horizontal_flip: {where} must be a permutation of 0..{k - 1} or (left, right) "
            f"pairs, not {list(spec)!r}"
        )
    return perm


def horizontal_flip(s: Sample, flip_map: object = None) -> Sample:
    """Mirror left-right. Boxes ``x -> W - x`` (x1 and x2 swapped), keypoints ``x ->
    W - 1 - x`` (torchvision's) then reordered by ``flip_map`` (:func:`flip_permutation`)."""
    _, w = s.size
    boxes = s.boxes
    if boxes is not None:
        boxes = boxes.clone()  # x1, x2 = W - x2, W - x1 (strided views: no index copy)
        boxes[:, 0::2] = s.boxes[:, 0::2].sub(w).neg().flip(-1)
    kp = s.keypoints
    if kp is not None:
        kp = kp.clone()
        kp[..., 0] = s.keypoints[..., 0].sub(w - 1).neg()
        perm = flip_permutation(flip_map, s.labels, kp.shape[0], kp.shape[1], kp.device)
        if perm is not None and kp.shape[0]:
            kp = kp.gather(1, perm[..., None].expand(-1, -1, 3))
    masks, semantic = masks_apply(s, lambda m, _: m.flip(-1))
    return replace(
        s, image=s.image.flip(-1), boxes=boxes, masks=masks, semantic=semantic, keypoints=kp
    )


# ---------------------------------------------------------------- crop, pad, resize


def crop(s: Sample, top: int, left: int, height: int, width: int) -> Sample:
    """torchvision's ``crop``: the box (top, left, height, width) of every field; pixels
    outside the image are 0; boxes shifted and clamped to the new canvas."""
    top, left, height, width = int(top), int(left), int(height), int(width)
    if height < 1 or width < 1:
        raise ArgumentError(f"crop: height and width must be positive, not {height}x{width}")
    boxes = s.boxes
    if boxes is not None:
        boxes = clamp_boxes(boxes - vec([left, top, left, top], boxes), height, width)
    kp = s.keypoints
    if kp is not None:
        moved = kp.clone()
        moved[..., :2] -= vec([left, top], kp)
        kp = hide_outside(moved, height, width)
    masks, semantic = masks_apply(s, lambda m, _: crop_pixels(m, top, left, height, width))
    image = crop_pixels(s.image, top, left, height, width)
    return replace(s, image=image, boxes=boxes, masks=masks, semantic=semantic, keypoints=kp)


def pad(
    s: Sample,
    left: int,
    top: int,
    right: int,
    bottom: int,
    fill: FillArg = 0,
    mask_fill: int = 0,
    semantic_fill: int = 255,
) -> Sample:
    """torchvision's ``pad`` (constant): ``fill`` the image's value (a number or one
    per channel), ``mask_fill`` the instance masks', ``semantic_fill`` the semantic
    mask's (255, the usual ignore value, by default); boxes and keypoints shifted."""
    pads = [int(v) for v in (left, top, right, bottom)]
    if min(pads) < 0:
        raise ArgumentError(f"pad: padding must be >= 0, not {pads}")
    left, top, right, bottom = pads
    h, w = s.size
    nh, nw = h + top + bottom, w + left + right
    boxes = s.boxes
    if boxes is not None:
        boxes = clamp_boxes(boxes + vec([left, top, left, top], boxes), nh, nw)
    kp = s.keypoints
    if kp is not None:
        kp = kp.clone()
        kp[..., :2] += vec([left, top], kp)

    def pad_mask(m: torch.Tensor, name: str) -> torch.Tensor:
        value = mask_fill if name == "masks" else semantic_fill
        return nnf.pad(m, [left, right, top, bottom], mode="constant", value=float(value))

    masks, semantic = masks_apply(s, pad_mask)
    image = pad_image(s.image, left, top, right, bottom, fill)
    return replace(s, image=image, boxes=boxes, masks=masks, semantic=semantic, keypoints=kp)


def pad_to_multiple(
    s: Sample, divisor: int = 32, fill: FillArg = 0, mask_fill: int = 0, semantic_fill: int = 255
) -> Sample:
    """Pad right and bottom to the next multiple of ``divisor`` (32: what FPN backbones
    need); a size already divisible is kept."""
    if isinstance(divisor, bool) or not isinstance(divisor, int) or divisor < 1:
        raise ArgumentError(f"pad_to_multiple: divisor must be a positive int, not {divisor!r}")
    h, w = s.size
    right, bottom = -w % divisor, -h % divisor
    if not (right or bottom):
        return s
    return pad(s, 0, 0, right, bottom, fill, mask_fill, semantic_fill)


def resize_output_size(
    height: int, width: int, size: int | Sequence[int], max_size: int | None = None
) -> tuple[int, int]:
    """torchvision's ``Resize`` rule: (h, w) as given, or an int (or [int]) for the
    shorter side (the longer one ``int(size * long / short)``), capped by ``max_size``."""
    if isinstance(size, Sequence) and len(size) == 2:
        if max_size is not None:
            raise ArgumentError("resize: max_size needs size to be one int (the shorter side)")
        return size_pair(size)
    if isinstance(size, Sequence) and len(size) == 1:
        size = size[0]
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ArgumentError(f"resize: size must be a positive int or (h, w), not {size!r}")
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = size, int(size * long / short)
    if max_size is not None:
        if max_size <= size:
            raise ArgumentError(f"resize: max_size {max_size} must exceed size {size}")
        if new_long > max_size:
            new_short, new_long = int(max_size * new_short / new_long), max_size
    nw, nh = (new_short, new_long) if width <= height else (new_long, new_short)
    return size_pair((nh, nw))


def resize(
    s: Sample,
    size: int | Sequence[int],
    interpolation: object = "bilinear",
    antialias: bool | None = True,
    max_size: int | None = None,
) -> Sample:
    """torchvision's ``resize``: the image by :func:`~packer.imaging.resize.resized_crop`
    (``interpolation``, ``antialias``), masks nearest, boxes and keypoints scaled."""
    h, w = s.size
    nh, nw = resize_output_size(h, w, size, max_size)
    return _resized(s, 0, 0, h, w, (nh, nw), interpolation, antialias)


def resized_crop(
    s: Sample,
    top: int,
    left: int,
    height: int,
    width: int,
    size: int | Sequence[int],
    interpolation: object = "bilinear",
    antialias: bool | None = True,
) -> Sample:
    """torchvision's ``resized_crop``: :func:`crop` then :func:`resize` to ``size`` (h, w)."""
    return _resized(s, top, left, height, width, size_pair(size), interpolation, antialias)


def _resized(s, top, left, height, width, size, interpolation, antialias) -> Sample:
    h, w = s.size
    top, left, height, width = int(top), int(left), int(height), int(width)
    inside = top >= 0 and left >= 0 and top + height <= h and left + width <= w
    if not inside:  # rare (explicit parameters only): crop with padding, then resize
        c = crop(s, top, left, height, width)
        return _resized(c, 0, 0, height, width, size, interpolation, antialias)
    if height < 1 or width < 1:
        raise ArgumentError(
            f"resized_crop: height and width must be positive, not {height}x{width}"
        )
    nh, nw = size
    full = (top, left, height, width) == (0, 0, h, w)
    if full and (nh, nw) == (h, w):
        return s
    box = torch.tensor([[top, left, height, width]], dtype=torch.int64)
    image = resized_crop_images(
        s.image[None], box, (nh, nw), interpolation=interpolation, antialias=antialias
    )[0]
    wr, hr = nw / width, nh / height
    boxes = s.boxes
    if boxes is not None:
        if not full:
            boxes = clamp_boxes(boxes - vec([left, top, left, top], boxes), height, width)
        boxes = boxes.mul(vec([wr, hr, wr, hr], boxes))
    kp = s.keypoints
    if kp is not None:
        kp = kp.clone()
        if not full:
            kp[..., :2] -= vec([left, top], kp)
            kp = hide_outside(kp, height, width)
        kp[..., :2] = kp[..., :2].mul(vec([wr, hr], kp))
    mode = getattr(interpolation, "value", interpolation)
    mode = "nearest-exact" if mode == "nearest-exact" else "nearest"

    def resize_mask(m: torch.Tensor, _: str) -> torch.Tensor:
        if not full:
            m = m[..., top : top + height, left : left + width]
        return resize_nearest(m, (nh, nw), mode)

    masks, semantic = masks_apply(s, resize_mask)
    return replace(s, image=image, boxes=boxes, masks=masks, semantic=semantic, keypoints=kp)


def fixed_size_crop(
    s: Sample,
    top: int,
    left: int,
    height: int,
    width: int,
    fill: FillArg = 0,
    semantic_fill: int = 255,
) -> Sample:
    """The detection reference's ``FixedSizeCrop`` (LSJ) with its drawn offset: crop
    to at most (``height``, ``width``) at (``top``, ``left``), drop the boxes left
    empty (with their instances), then pad right and bottom to exactly that size
    (``fill`` for the image, 0 for instance masks, ``semantic_fill`` for the semantic
    mask)."""
    h, w = s.size
    height, width = size_pair((height, width), "fixed_size_crop size")
    nh, nw = min(h, height), min(w, width)
    for name, v, room in (("top", top, h - nh), ("left", left, w - nw)):
        if not 0 <= int(v) <= room:
            raise ArgumentError(
                f"fixed_size_crop: {name} {v} leaves the {h}x{w} image (0 to {room} for a "
                f"{nh}x{nw} crop)"
            )
    out = s
    if (nh, nw) != (h, w):
        out = crop(s, top, left, nh, nw)
        if out.boxes is not None:
            b = out.boxes
            out = select(out, (b[:, 0] < b[:, 2]) & (b[:, 1] < b[:, 3]))
    return pad(out, 0, 0, width - nw, height - nh, fill, 0, semantic_fill)


# ---------------------------------------------------------------- sanitize


def sanitize_mask(s: Sample, min_size: float = 1.0, min_area: float = 1.0) -> torch.Tensor:
    """torchvision's ``SanitizeBoundingBoxes`` rule: bool [M], True for boxes at least
    ``min_size`` wide and high, of area at least ``min_area``, inside the canvas."""
    b = s.boxes
    if b is None:
        raise ArgumentError("sanitize: the sample has no boxes")
    for name, v in (("min_size", min_size), ("min_area", min_area)):
        if not v >= 1:  # torchvision's bound (NaN fails it too)
            raise ArgumentError(f"sanitize: {name} must be >= 1, not {v}")
    h, w = s.size
    ws, hs = b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
    valid = (ws >= min_size) & (hs >= min_size) & (b >= 0).all(dim=-1) & (ws * hs >= min_area)
    valid &= (b[:, 0] <= w) & (b[:, 2] <= w)
    valid &= (b[:, 1] <= h) & (b[:, 3] <= h)
    return valid


def sanitize(s: Sample, min_size: float = 1.0, min_area: float = 1.0) -> Sample:
    """Drop the boxes :func:`sanitize_mask` rejects, with their labels, masks,
    keypoints and extras."""
    return select(s, sanitize_mask(s, min_size, min_area))


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torchvision.ops.box_iou (XYXY), its operations in its order: [N, M]."""
    area1 = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area2 = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    lt = torch.max(a[:, None, :2], b[:, :2])
    rb = torch.min(a[:, None, 2:], b[:, 2:])
    wh = (rb - lt).clamp(min=0)
    inter = wh[:, :, 0] * wh[:, :, 1]
    union = area1[:, None] + area2 - inter
    return inter / union
