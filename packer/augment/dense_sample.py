"""One image and its targets (:class:`Sample`), and what the dense kernels share: the
field checks, the per-field helpers (masks as torchvision's mask kernels take them,
box clamping, keypoint visibility), constant padding and cropping of pixels, and the
selection of instances (:func:`select`)."""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as nnf

from ..imaging.resize import ArgumentError, to_device

FillArg = float | Sequence[float] | None


# The fields on the image's device; the others (boxes, labels, keypoints, extras) may
# also stay on the CPU beside a CUDA image: their arithmetic is a few floats, and the
# boxes dropped (FixedSizeCrop, SanitizeBoundingBoxes) are then known to the host
# without waiting for the device (the dense pass keeps them there, and moves them in
# one copy per batch at the end).
PIXEL_FIELDS = frozenset({"image", "masks", "semantic"})


@dataclass(frozen=True)
class Sample:
    """One image and its targets, on the image's device (boxes, labels, keypoints and
    extras may instead be on the CPU: host targets, see :data:`PIXEL_FIELDS`).

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
        if t is None or t.device == img.device:
            continue
        if t.device.type == "cpu" and name not in PIXEL_FIELDS:
            continue  # host targets (:data:`PIXEL_FIELDS`)
        raise ArgumentError(f"Sample: {name} is on {t.device}, the image on {img.device}")


# ---------------------------------------------------------------- helpers


def vec(values: Sequence[float], like: torch.Tensor) -> torch.Tensor:
    """A small tensor of ``like``'s dtype on its device (no host wait on CUDA)."""
    return to_device(torch.tensor(values, dtype=like.dtype), like.device)


def clamp_boxes(boxes: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """torchvision's ``clamp_bounding_boxes`` for XYXY: x in [0, W], y in [0, H]."""
    out = boxes.clone()
    out[..., 0::2].clamp_(min=0, max=width)
    out[..., 1::2].clamp_(min=0, max=height)
    return out


def hide_outside(kp: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Visibility 0 for points outside [0, W) x [0, H); coordinates kept."""
    x, y = kp[..., 0], kp[..., 1]
    inside = (x >= 0) & (x < width) & (y >= 0) & (y < height)
    out = kp.clone()
    out[..., 2] = torch.where(inside, kp[..., 2], torch.zeros_like(kp[..., 2]))
    return out


def masks_apply(s: Sample, fn) -> tuple[torch.Tensor | None, torch.Tensor | None]:
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
    value = _fill_value(tuple(fill), img.dtype, img.device)
    if min(pads) >= 0:  # two kernels: the fill, then the image into it
        h, w = img.shape[-2:]
        out = img.new_empty((*img.shape[:-2], top + h + bottom, left + w + right))
        out[...] = value
        out[..., top : top + h, left : left + w] = img
        return out
    out = nnf.pad(img, pads, mode="constant", value=0.0)
    if top > 0:
        out[..., :top, :] = value
    if left > 0:
        out[..., :, :left] = value
    if bottom > 0:
        out[..., -bottom:, :] = value
    if right > 0:
        out[..., :, -right:] = value
    return out


_FILLS: dict[tuple, torch.Tensor] = {}


def _fill_value(fill: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """One value per channel, [C, 1, 1] on ``device``: copied there once per fill (the
    detection recipes pad every image with the same mean colour), per CUDA stream (a
    value is used on the stream that copied it)."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (fill, dtype, device, stream)
    value = _FILLS.get(key)
    if value is None:
        if len(_FILLS) >= 64:
            _FILLS.clear()
        value = to_device(torch.tensor(fill).to(dtype).reshape(-1, 1, 1), device)
        _FILLS[key] = value
    return value


def crop_pixels(img: torch.Tensor, top: int, left: int, height: int, width: int) -> torch.Tensor:
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


def resize_nearest(m: torch.Tensor, size: tuple[int, int], mode: str = "nearest") -> torch.Tensor:
    """torchvision's ``resize_mask``: [..., H, W] uint8, nearest (or nearest-exact)."""
    if tuple(m.shape[-2:]) == size or m.numel() == 0:
        return m if tuple(m.shape[-2:]) == size else m.new_zeros((*m.shape[:-2], *size))
    flat = m.reshape(1, -1, *m.shape[-2:])
    out = nnf.interpolate(flat, size=list(size), mode=mode)
    return out.reshape(*m.shape[:-2], *size)


# ---------------------------------------------------------------- selection


def select(s: Sample, keep: torch.Tensor) -> Sample:
    """The instances where ``keep`` (bool [M]) holds, in every per-instance field.

    A ``keep`` on the CPU (from host boxes) costs the host no wait: the fields on the
    device take its indices, copied without a wait. A ``keep`` on the device costs one
    wait (its count), not one per field. Nothing is copied when every instance stays."""
    idx = keep.nonzero().flatten()  # on the device: the one wait (how many are kept)
    if idx.numel() == keep.numel():
        return s
    on: dict[torch.device, torch.Tensor] = {idx.device: idx}

    def take(t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None:
            return None
        i = on.get(t.device)
        if i is None:
            i = on[t.device] = to_device(idx, t.device)
        return t.index_select(0, i)

    return replace(
        s,
        boxes=take(s.boxes),
        labels=take(s.labels),
        masks=take(s.masks),
        keypoints=take(s.keypoints),
        extras={k: take(v) for k, v in s.extras.items()},
    )
