"""Geometry kernels for one image and its dense targets, with explicit parameters.

A :class:`Sample` holds one image and what lies on it: boxes, labels, instance masks,
a semantic mask, keypoints, and any other per-instance tensors (``extras``: iscrowd,
area, ids). Each kernel here moves every field at once and returns a new Sample, on
the tensors' device (CUDA or CPU: the same torch code), with the parameters given
(as ``torchvision.transforms.v2.functional`` takes them; :mod:`packer.augment.dense`
draws them). The rules are torchvision's on ``tv_tensors``:

- image: the existing batched kernels of :mod:`packer.imaging` on a batch of one
  (:func:`~packer.imaging.resize.resized_crop`, :func:`~packer.imaging.warps.affine`),
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
extras; that boolean selection makes the host wait for the device once per call.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as nnf

from ..imaging.resize import ArgumentError, size_pair, to_device
from ..imaging.resize import resized_crop as resized_crop_images
from ..imaging.warps import affine as affine_images
from ..imaging.warps import interpolation_mode as warp_interpolation

FillArg = float | Sequence[float] | None


@dataclass(frozen=True)
class Sample:
    """One image and its targets, all on one device.

    ``image`` uint8 [C, H, W]; ``boxes`` float32 [M, 4] XYXY pixels; ``labels`` [M]
    (int); ``masks`` uint8 [M, H, W]; ``semantic`` uint8 [H, W]; ``keypoints`` float32
    [M, K, 3] (x, y, visibility); ``extras``: other per-instance tensors [M, ...]
    (iscrowd, area, ids), kept or dropped with their boxes. Any target may be None.
    """

    image: torch.Tensor
    boxes: torch.Tensor | None = None
    labels: torch.Tensor | None = None
    masks: torch.Tensor | None = None
    semantic: torch.Tensor | None = None
    keypoints: torch.Tensor | None = None
    extras: Mapping[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_sample(self)

    @property
    def size(self) -> tuple[int, int]:
        """(height, width) of the image."""
        return int(self.image.shape[-2]), int(self.image.shape[-1])

    @property
    def count(self) -> int | None:
        """M, the number of instances (None when the sample has none of those fields)."""
        for t in (self.boxes, self.labels, self.masks, self.keypoints, *self.extras.values()):
            if t is not None:
                return int(t.shape[0])
        return None


def _bad(name: str, want: str, t: object) -> ArgumentError:
    got = f"{t.dtype} {list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
    return ArgumentError(f"Sample: {name} must be {want}, not {got}")


def check_sample(s: Sample) -> None:
    """Raise ArgumentError naming the first field of the wrong type, shape or device."""
    img = s.image
    if not isinstance(img, torch.Tensor) or img.dtype != torch.uint8 or img.ndim != 3:
        raise _bad("image", "a uint8 tensor [C, H, W]", img)
    h, w = img.shape[-2:]
    if not (h and w):
        raise ArgumentError(f"Sample: image of {h}x{w} pixels holds nothing to transform")
    want = {
        "boxes": (s.boxes, "a float32 tensor [M, 4] (XYXY pixels)"),
        "labels": (s.labels, "an integer tensor [M]"),
        "masks": (s.masks, f"a uint8 tensor [M, {h}, {w}] (the image's size)"),
        "semantic": (s.semantic, f"a uint8 tensor [{h}, {w}] (the image's size)"),
        "keypoints": (s.keypoints, "a float32 tensor [M, K, 3] (x, y, visibility)"),
    }
    ok = {
        "boxes": lambda t: t.dtype == torch.float32 and t.ndim == 2 and t.shape[1] == 4,
        "labels": lambda t: t.ndim == 1 and not t.is_floating_point() and t.dtype != torch.bool,
        "masks": lambda t: t.dtype == torch.uint8 and t.ndim == 3 and tuple(t.shape[1:]) == (h, w),
        "semantic": lambda t: t.dtype == torch.uint8 and tuple(t.shape) == (h, w),
        "keypoints": lambda t: t.dtype == torch.float32 and t.ndim == 3 and t.shape[2] == 3,
    }
    counts = {}
    for name, (t, text) in want.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or not ok[name](t):
            raise _bad(name, text, t)
        if name != "semantic":
            counts[name] = int(t.shape[0])
    if not isinstance(s.extras, Mapping):
        raise ArgumentError(f"Sample: extras must be a dict of tensors, not {type(s.extras)}")
    for name, t in s.extras.items():
        if not isinstance(t, torch.Tensor) or t.ndim < 1:
            raise _bad(f"extras[{name!r}]", "a tensor [M, ...]", t)
        counts[f"extras[{name!r}]"] = int(t.shape[0])
    if len(set(counts.values())) > 1:
        raise ArgumentError(f"Sample: per-instance fields disagree on M: {counts}")
    for name, t in [*((n, v[0]) for n, v in want.items()), *s.extras.items()]:
        if t is not None and t.device != img.device:
            raise ArgumentError(f"Sample: {name} is on {t.device}, the image on {img.device}")


# ---------------------------------------------------------------- helpers


def _vec(values: Sequence[float], like: torch.Tensor) -> torch.Tensor:
    """A small tensor of ``like``'s dtype on its device (no host wait on CUDA)."""
    return to_device(torch.tensor(values, dtype=like.dtype), like.device)


def _clamp_boxes(boxes: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """torchvision's ``clamp_bounding_boxes`` for XYXY: x in [0, W], y in [0, H]."""
    out = boxes.clone()
    out[..., 0::2].clamp_(min=0, max=width)
    out[..., 1::2].clamp_(min=0, max=height)
    return out


def _hide_outside(kp: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Visibility 0 for points outside [0, W) x [0, H); coordinates kept."""
    x, y = kp[..., 0], kp[..., 1]
    inside = (x >= 0) & (x < width) & (y >= 0) & (y < height)
    out = kp.clone()
    out[..., 2] = torch.where(inside, kp[..., 2], torch.zeros_like(kp[..., 2]))
    return out


def _masks_as_image(s: Sample, fn) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``fn`` on the instance masks [M, H, W] and on the semantic mask [1, H, W] (as
    torchvision's mask kernels take them: the leading dims are channels)."""
    masks = fn(s.masks, "masks") if s.masks is not None else None
    semantic = fn(s.semantic[None], "semantic")[0] if s.semantic is not None else None
    return masks, semantic


def pad_image(
    img: torch.Tensor, left: int, top: int, right: int, bottom: int, fill
) -> torch.Tensor:
    """torchvision's ``pad_image`` (constant mode) of [..., C, H, W]: a number or one
    value per channel (negative padding crops, as ``torch.nn.functional.pad``)."""
    if fill is None:
        fill = 0
    if isinstance(fill, Sequence) and len(fill) == 1:
        fill = fill[0]
    pads = [left, right, top, bottom]
    if isinstance(fill, numbers.Real):
        return nnf.pad(img, pads, mode="constant", value=float(fill))
    if len(fill) != img.shape[-3]:
        raise ArgumentError(
            f"pad: fill has {len(fill)} values for an image of {img.shape[-3]} channels"
        )
    out = nnf.pad(img, pads, mode="constant", value=0.0)
    value = to_device(torch.tensor(fill).to(img.dtype).reshape(-1, 1, 1), img.device)
    if top > 0:
        out[..., :top, :] = value
    if left > 0:
        out[..., :, :left] = value
    if bottom > 0:
        out[..., -bottom:, :] = value
    if right > 0:
        out[..., :, -right:] = value
    return out


def _crop_pixels(img: torch.Tensor, top: int, left: int, height: int, width: int) -> torch.Tensor:
    """torchvision's ``crop_image``: a slice, zero-padded where the box leaves the image."""
    h, w = img.shape[-2:]
    right, bottom = left + width, top + height
    if left < 0 or top < 0 or right > w or bottom > h:
        part = img[..., max(top, 0) : bottom, max(left, 0) : right]
        pads = [
            max(min(right, 0) - left, 0),
            max(right - max(w, left), 0),
            max(min(bottom, 0) - top, 0),
            max(bottom - max(h, top), 0),
        ]
        return nnf.pad(part, pads, mode="constant", value=0.0)
    return img[..., top:bottom, left:right]


def _resize_nearest(m: torch.Tensor, size: tuple[int, int], mode: str = "nearest") -> torch.Tensor:
    """torchvision's ``resize_mask``: [..., H, W] uint8, nearest (or nearest-exact)."""
    if tuple(m.shape[-2:]) == size or m.numel() == 0:
        return m if tuple(m.shape[-2:]) == size else m.new_zeros((*m.shape[:-2], *size))
    flat = m.reshape(1, -1, *m.shape[-2:])
    out = nnf.interpolate(flat, size=list(size), mode=mode)
    return out.reshape(*m.shape[:-2], *size)


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
        boxes = boxes.clone()
        boxes[:, [2, 0]] = s.boxes[:, [0, 2]].sub(w).neg()
    kp = s.keypoints
    if kp is not None:
        kp = kp.clone()
        kp[..., 0] = s.keypoints[..., 0].sub(w - 1).neg()
        perm = flip_permutation(flip_map, s.labels, kp.shape[0], kp.shape[1], kp.device)
        if perm is not None and kp.shape[0]:
            kp = kp.gather(1, perm[..., None].expand(-1, -1, 3))
    masks, semantic = _masks_as_image(s, lambda m, _: m.flip(-1))
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
        boxes = _clamp_boxes(boxes - _vec([left, top, left, top], boxes), height, width)
    kp = s.keypoints
    if kp is not None:
        moved = kp.clone()
        moved[..., :2] -= _vec([left, top], kp)
        kp = _hide_outside(moved, height, width)
    masks, semantic = _masks_as_image(s, lambda m, _: _crop_pixels(m, top, left, height, width))
    image = _crop_pixels(s.image, top, left, height, width)
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
        boxes = _clamp_boxes(boxes + _vec([left, top, left, top], boxes), nh, nw)
    kp = s.keypoints
    if kp is not None:
        kp = kp.clone()
        kp[..., :2] += _vec([left, top], kp)

    def pad_mask(m: torch.Tensor, name: str) -> torch.Tensor:
        value = mask_fill if name == "masks" else semantic_fill
        return nnf.pad(m, [left, right, top, bottom], mode="constant", value=float(value))

    masks, semantic = _masks_as_image(s, pad_mask)
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
            boxes = _clamp_boxes(boxes - _vec([left, top, left, top], boxes), height, width)
        boxes = boxes.mul(_vec([wr, hr, wr, hr], boxes))
    kp = s.keypoints
    if kp is not None:
        kp = kp.clone()
        if not full:
            kp[..., :2] -= _vec([left, top], kp)
            kp = _hide_outside(kp, height, width)
        kp[..., :2] = kp[..., :2].mul(_vec([wr, hr], kp))
    mode = getattr(interpolation, "value", interpolation)
    mode = "nearest-exact" if mode == "nearest-exact" else "nearest"

    def resize_mask(m: torch.Tensor, _: str) -> torch.Tensor:
        if not full:
            m = m[..., top : top + height, left : left + width]
        return _resize_nearest(m, (nh, nw), mode)

    masks, semantic = _masks_as_image(s, resize_mask)
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


# ---------------------------------------------------------------- affine, rotate


def affine_matrix(
    center: Sequence[float],
    angle: float,
    translate: Sequence[float],
    scale: float,
    shear: Sequence[float],
    inverted: bool = True,
) -> list[float]:
    """torchvision's ``_get_inverse_affine_matrix`` (Python floats, float64): the 2x3
    matrix row-major, output -> input pixel when ``inverted`` else input -> output."""
    rot = math.radians(angle)
    sx, sy = math.radians(shear[0]), math.radians(shear[1])
    cx, cy = center
    tx, ty = translate
    cos_sy = math.cos(sy)
    tan_sx = math.tan(sx)
    rot_minus_sy = rot - sy
    cx_plus_tx, cy_plus_ty = cx + tx, cy + ty
    a = math.cos(rot_minus_sy) / cos_sy
    b = -(a * tan_sx + math.sin(rot))
    c = math.sin(rot_minus_sy) / cos_sy
    d = math.cos(rot) - c * tan_sx
    if inverted:
        m = [d / scale, -b / scale, 0.0, -c / scale, a / scale, 0.0]
        m[2] += cx - m[0] * cx_plus_tx - m[1] * cy_plus_ty
        m[5] += cy - m[3] * cx_plus_tx - m[4] * cy_plus_ty
    else:
        m = [a * scale, b * scale, 0.0, c * scale, d * scale, 0.0]
        m[2] += cx_plus_tx - m[0] * cx - m[1] * cy
        m[5] += cy_plus_ty - m[3] * cx - m[4] * cy
    return m


def _warp_nearest(m: torch.Tensor, matrix: list[float], fill: float | None) -> torch.Tensor:
    """torchvision's ``affine_image`` of a mask [C, H, W], nearest: its grid
    (``_affine_grid``) and fill rule (``_apply_grid_transform``), op for op."""
    _, h, w = m.shape
    if m.numel() == 0:
        return m.clone()
    dev = m.device
    theta = _vec(matrix, torch.empty(0, dtype=torch.float32, device=dev)).reshape(1, 2, 3)
    base = torch.empty(1, h, w, 3, dtype=torch.float32, device=dev)
    base[..., 0].copy_(torch.linspace((1.0 - w) * 0.5, (w - 1.0) * 0.5, steps=w, device=dev))
    ys = torch.linspace((1.0 - h) * 0.5, (h - 1.0) * 0.5, steps=h, device=dev).unsqueeze_(-1)
    base[..., 1].copy_(ys)
    base[..., 2].fill_(1)
    half = _vec([0.5 * w, 0.5 * h], theta)
    grid = base.view(1, h * w, 3).bmm(theta.transpose(1, 2).div_(half)).view(1, h, w, 2)
    x = m[None].to(torch.float32)
    if fill is not None:
        x = torch.cat((x, torch.ones((1, 1, h, w), dtype=torch.float32, device=dev)), dim=1)
    x = nnf.grid_sample(x, grid, mode="nearest", padding_mode="zeros", align_corners=False)
    if fill is not None:
        x, inside = torch.tensor_split(x, indices=(-1,), dim=-3)
        x = torch.where(inside.expand_as(x) < 0.5, torch.full_like(x, float(fill)), x)
    return x.round_().to(m.dtype)[0]


def _move_points(pts: torch.Tensor, matrix: list[float]) -> torch.Tensor:
    """Points [..., 2] through the forward 2x3 ``matrix`` as torchvision's matmul does."""
    t = _vec(matrix, pts).reshape(2, 3).T
    flat = pts.reshape(-1, 2)
    ones = torch.ones(flat.shape[0], 1, device=pts.device, dtype=pts.dtype)
    return torch.matmul(torch.cat([flat, ones], dim=-1), t).reshape(pts.shape)


def _warp_targets(s: Sample, angle: float, translate, scale, shear, center) -> tuple:
    """Boxes and keypoints through torchvision's forward matrix (``inverted=False``)."""
    h, w = s.size
    ctr = [w * 0.5, h * 0.5] if center is None else [float(c) for c in center]
    fwd = affine_matrix(ctr, angle, translate, scale, shear, inverted=False)
    boxes = s.boxes
    if boxes is not None and boxes.numel():
        corners = boxes[:, [[0, 1], [2, 1], [2, 3], [0, 3]]]
        moved = _move_points(corners, fwd)
        lo, hi = torch.aminmax(moved, dim=1)
        boxes = _clamp_boxes(torch.cat([lo, hi], dim=1), h, w)
    kp = s.keypoints
    if kp is not None and kp.numel():
        kp = kp.clone()
        kp[..., :2] = _move_points(kp[..., :2].contiguous(), fwd)
        kp = _hide_outside(kp, h, w)
    return boxes, kp


def _shear_pair(shear: float | Sequence[float]) -> list[float]:
    if isinstance(shear, numbers.Real):
        return [float(shear), 0.0]
    shear = [float(v) for v in shear]
    if len(shear) == 1:
        return [shear[0], shear[0]]
    if len(shear) != 2:
        raise ArgumentError(f"affine: shear must be a number or (x, y), not {shear!r}")
    return shear


def affine(
    s: Sample,
    angle: float,
    translate: Sequence[float] = (0.0, 0.0),
    scale: float = 1.0,
    shear: float | Sequence[float] = (0.0, 0.0),
    interpolation: object = "nearest",
    fill: FillArg = 0,
    center: Sequence[float] | None = None,
    mask_fill: float | None = 0,
    semantic_fill: float | None = 255,
) -> Sample:
    """torchvision's ``affine`` (``angle`` clockwise degrees, ``translate`` pixels,
    ``scale`` > 0, ``shear`` degrees, about ``center`` or the image centre): the image
    by :func:`packer.imaging.warps.affine`, masks nearest on torchvision's grid
    (outside pixels ``mask_fill`` / ``semantic_fill``; None: zero padding), boxes the
    box around their moved corners (clamped), keypoints moved."""
    angle, scale = float(angle), float(scale)
    if not scale > 0:
        raise ArgumentError(f"affine: scale must be positive, not {scale}")
    translate = [float(t) for t in translate]
    if len(translate) != 2:
        raise ArgumentError(f"affine: translate must be (tx, ty), not {translate!r}")
    shear = _shear_pair(shear)
    mode = warp_interpolation(interpolation, "affine")
    h, w = s.size
    image = affine_images(s.image[None], angle, translate, scale, shear, mode, fill, center)[0]
    ctr = [0.0, 0.0] if center is None else [float(c) - d * 0.5 for c, d in zip(center, (w, h))]
    inverse = affine_matrix(ctr, angle, translate, scale, shear)

    def warp_mask(m: torch.Tensor, name: str) -> torch.Tensor:
        return _warp_nearest(m, inverse, mask_fill if name == "masks" else semantic_fill)

    masks, semantic = _masks_as_image(s, warp_mask)
    boxes, kp = _warp_targets(s, angle, translate, scale, shear, center)
    return replace(s, image=image, boxes=boxes, masks=masks, semantic=semantic, keypoints=kp)


def _rot90(t: torch.Tensor, angle: float, square: bool) -> torch.Tensor | None:
    """torchvision's ``rotate_image`` shortcuts (no centre given): 0, 180, and 90/270
    on square images are exact transposes; None where the warp runs."""
    if angle == 0:
        return t.clone()
    if angle == 180:
        return torch.rot90(t, k=2, dims=(-2, -1))
    if square and angle in (90, 270):
        return torch.rot90(t, k=1 if angle == 90 else 3, dims=(-2, -1))
    return None


def rotate(
    s: Sample,
    angle: float,
    interpolation: object = "nearest",
    fill: FillArg = 0,
    center: Sequence[float] | None = None,
    mask_fill: float | None = 0,
    semantic_fill: float | None = 255,
) -> Sample:
    """torchvision's ``rotate`` (``expand=False``): ``angle`` degrees counter-clockwise
    about ``center`` or the image centre; fields as :func:`affine`."""
    angle = float(angle)
    h, w = s.size
    mod = angle % 360
    mode = warp_interpolation(interpolation, "rotate")
    fast = center is None and _rot90(s.image, mod, h == w) is not None
    if fast:
        image = _rot90(s.image, mod, h == w)
    else:
        zero = [0.0, 0.0]
        image = affine_images(s.image[None], -mod, zero, 1.0, zero, mode, fill, center)[0]
    ctr = [0.0, 0.0] if center is None else [float(c) - d * 0.5 for c, d in zip(center, (w, h))]
    inverse = affine_matrix(ctr, -mod, [0.0, 0.0], 1.0, [0.0, 0.0])

    def warp_mask(m: torch.Tensor, name: str) -> torch.Tensor:
        if fast:
            return _rot90(m, mod, h == w)
        return _warp_nearest(m, inverse, mask_fill if name == "masks" else semantic_fill)

    masks, semantic = _masks_as_image(s, warp_mask)
    boxes, kp = _warp_targets(s, -angle, [0.0, 0.0], 1.0, [0.0, 0.0], center)
    return replace(s, image=image, boxes=boxes, masks=masks, semantic=semantic, keypoints=kp)


# ---------------------------------------------------------------- selection


def select(s: Sample, keep: torch.Tensor) -> Sample:
    """The instances where ``keep`` (bool [M]) holds, in every per-instance field."""

    def take(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t[keep]

    extras = {k: v[keep] for k, v in s.extras.items()}
    return replace(
        s,
        boxes=take(s.boxes),
        labels=take(s.labels),
        masks=take(s.masks),
        keypoints=take(s.keypoints),
        extras=extras,
    )


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
