"""The dense ops of a whole batch at once: per-image parameters drawn on the host, one
resampling of all images, one gather of all masks, all boxes moved in one vectorized
pass on the host (issue 46's dense pass: O(1) torch calls a batch, not O(images)).

:func:`batched_ops` says whether an op (a :class:`~packer.augment.dense.Compose`) has a
batched path: every op one of :data:`BATCHED` (exact types), at most one resampling op
(ScaleJitter, Resize, RandomResize, RandomResizedCrop; bilinear or nearest) and only
flips before it, one image fill (and mask fills) for every op that pads. Others
(IoU crop, affine, rotation, colour ops, bicubic, ...) keep the per-image path.

:func:`run` takes the batch's images, host targets and masks (flat buffers, as the dense
pass decodes them) and returns the transformed batch on a common canvas (:class:`Out`).
Per image, each axis is a map from output pixel ``o`` to a pixel ``v = off + sign * o``
of the source's crop ``[start, start + length)`` resized to ``n`` pixels (the single
resampling), with crops, pads and flips folded into ``off``, ``sign`` and the size; ``v``
outside ``[0, n)`` is the ops' fill, ``o`` beyond the image the canvas's padding.

The same draws in the same order as the per-image path (image by image, op by op, each
op's own ``sample_params``), so a seed gives the same crops; boxes and keypoints take the
per-image kernels' float32 operations (the same bits), masks the same nearest indices
(identical), images the same filter weights (within the rounding of one product).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..imaging.resize import ArgumentError, overshoots, taps, to_device
from . import dense as D
from .dense_compose import Compose
from .dense_kernels import flip_permutation, resize_output_size

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


@dataclass
class _Axis:
    """One image's axis: output pixel o (< size) reads v = off + sign * o of the crop
    [start, start + length) of the source resized to n pixels (fill outside [0, n));
    the source being the image flipped where ``pre_sign`` is -1 (flips before the
    resize)."""

    start: int
    length: int
    n: int
    off: int = 0
    sign: int = 1
    size: int = 0
    pre_off: int = 0  # source pixel i is the image's pre_off + pre_sign * i (flips first)
    pre_sign: int = 1

    def __post_init__(self) -> None:
        self.size = self.size or self.n

    @property
    def covered(self) -> bool:
        """Every output pixel has a source pixel (no fill)."""
        first, last = self.off, self.off + self.sign * (self.size - 1)
        return min(first, last) >= 0 and max(first, last) < self.n

    def crop(self, first: int, size: int) -> None:
        self.off += self.sign * first
        self.size = size

    def pad(self, before: int, after: int) -> None:
        self.off -= self.sign * before
        self.size += before + after

    def flip(self) -> None:
        self.off += self.sign * (self.size - 1)
        self.sign = -self.sign


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
                cur = _Size(*_out_size(o, p, cur.size))
        out.append(params)
    return out


def _out_size(o: Any, p: dict, size: tuple[int, int]) -> tuple[int, int]:
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


# ---------------------------------------------------------------- host targets


@dataclass
class Targets:
    """The batch's instances on the host: ``boxes`` float32 [R, 4], ``image`` int64 [R]
    (each row's image), ``row`` int64 [R] (its row in the input, for its mask),
    ``labels`` [R], ``keypoints`` float32 [R, K, 3] or None, ``extras`` {name: [R, ...]}."""

    boxes: torch.Tensor
    image: torch.Tensor
    row: torch.Tensor
    labels: torch.Tensor | None
    keypoints: torch.Tensor | None
    extras: dict

    def select(self, keep: torch.Tensor) -> None:
        if bool(keep.all()):
            return
        idx = keep.nonzero().flatten()
        for name in ("boxes", "image", "row", "labels", "keypoints"):
            t = getattr(self, name)
            if t is not None:
                setattr(self, name, t.index_select(0, idx))
        self.extras = {k: v.index_select(0, idx) for k, v in self.extras.items()}


def _per_row(values: Sequence, t: Targets, dtype: torch.dtype) -> torch.Tensor:
    """Per-image ``values`` (a list of numbers or of lists) for each row of ``t``."""
    return torch.tensor(values, dtype=dtype).index_select(0, t.image)


def _clamp(boxes: torch.Tensor, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """clamp_boxes with per-row canvases (h, w float32 [R]): the same float operations."""
    out = boxes.clone()
    xs, ys = out[:, 0::2].clamp_(min=0), out[:, 1::2].clamp_(min=0)
    out[:, 0::2] = torch.minimum(xs, w[:, None])
    out[:, 1::2] = torch.minimum(ys, h[:, None])
    return out


def _hide(kp: torch.Tensor, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    x, y = kp[..., 0], kp[..., 1]
    inside = (x >= 0) & (x < w[:, None]) & (y >= 0) & (y < h[:, None])
    out = kp.clone()
    out[..., 2] = torch.where(inside, kp[..., 2], torch.zeros_like(kp[..., 2]))
    return out


class _Host:
    """The batch's targets moved op by op, every image at once (rows of images an op
    skips are kept as they are)."""

    def __init__(self, t: Targets, sizes: list[tuple[int, int]]) -> None:
        self.t, self.sizes = t, list(sizes)

    def _rows(self, act: list[bool]) -> torch.Tensor:
        return _per_row(act, self.t, torch.bool)

    def shift_clamp(self, act, dx, dy, nh, nw, sign: int) -> None:
        """Boxes ``+ sign * (dx, dy)`` clamped to (nh, nw) where ``act``; keypoints
        moved (and, for a crop, hidden outside)."""
        t = self.t
        if t.boxes.shape[0] == 0:
            return
        rows = self._rows(act)
        d = _per_row([[x, y, x, y] for x, y in zip(dx, dy)], t, torch.float32)
        h, w = _per_row(nh, t, torch.float32), _per_row(nw, t, torch.float32)
        moved = t.boxes + d if sign > 0 else t.boxes - d
        t.boxes = torch.where(rows[:, None], _clamp(moved, h, w), t.boxes)
        if t.keypoints is not None:
            kp = t.keypoints.clone()
            if sign > 0:
                kp[..., :2] += d[:, None, :2]
            else:
                kp[..., :2] -= d[:, None, :2]
                kp = _hide(kp, h, w)
            t.keypoints = torch.where(rows[:, None, None], kp, t.keypoints)

    def scale(self, act, wr, hr) -> None:
        t = self.t
        if t.boxes.shape[0] == 0:
            return
        rows = self._rows(act)
        f = _per_row([[a, b, a, b] for a, b in zip(wr, hr)], t, torch.float32)
        t.boxes = torch.where(rows[:, None], t.boxes.mul(f), t.boxes)
        if t.keypoints is not None:
            kp = t.keypoints.clone()
            kp[..., :2] = kp[..., :2].mul(f[:, None, :2])
            t.keypoints = torch.where(rows[:, None, None], kp, t.keypoints)

    def flip(self, act, widths, flip_map) -> None:
        t = self.t
        if t.boxes.shape[0] == 0:
            return
        rows = self._rows(act)
        w = _per_row(widths, t, torch.float32)
        new = t.boxes.clone()
        new[:, 0::2] = t.boxes[:, 0::2].sub(w[:, None]).neg().flip(-1)
        t.boxes = torch.where(rows[:, None], new, t.boxes)
        if t.keypoints is not None:
            kp = t.keypoints.clone()
            kp[..., 0] = t.keypoints[..., 0].sub(w[:, None] - 1).neg()
            r, k = kp.shape[:2]
            perm = flip_permutation(flip_map, t.labels, r, k, kp.device)
            if perm is not None and r:
                kp = kp.gather(1, perm[..., None].expand(-1, -1, 3))
            t.keypoints = torch.where(rows[:, None, None], kp, t.keypoints)

    def sanitize(self, min_size: float, min_area: float) -> None:
        t = self.t
        b = t.boxes
        h = _per_row([s[0] for s in self.sizes], t, torch.float32)
        w = _per_row([s[1] for s in self.sizes], t, torch.float32)
        ws, hs = b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
        valid = (ws >= min_size) & (hs >= min_size) & (b >= 0).all(dim=-1) & (ws * hs >= min_area)
        valid &= (b[:, 0] <= w) & (b[:, 2] <= w)
        valid &= (b[:, 1] <= h) & (b[:, 3] <= h)
        t.select(valid)


# ---------------------------------------------------------------- the geometry of a batch


@dataclass
class Geometry:
    """Per image its two axes (:class:`_Axis`), after every op."""

    ys: list[_Axis]
    xs: list[_Axis]

    @property
    def sizes(self) -> list[tuple[int, int]]:
        return [(y.size, x.size) for y, x in zip(self.ys, self.xs)]

    def fills(self, canvas_h: int, canvas_w: int) -> tuple[bool, bool]:
        """(whether some pixel is the ops' fill, whether some image is smaller than the
        canvas): the fills the batch needs at all."""
        need_pad = any(y.size < canvas_h for y in self.ys) or any(
            x.size < canvas_w for x in self.xs
        )
        return any(not a.covered for a in (*self.ys, *self.xs)), need_pad

    @property
    def mirrored(self) -> bool:
        """Some image is read mirrored (a flip before its resize)."""
        return any(a.pre_sign != 1 for a in (*self.ys, *self.xs))

    @property
    def resampled(self) -> bool:
        return any(a.n != a.length for a in (*self.ys, *self.xs))


def apply(plan: Plan, params: list, sizes: list[tuple[int, int]], t: Targets | None) -> Geometry:
    """Fold every op's drawn parameters into per-image axis maps, and move ``t`` (the
    host targets) with them, op by op, all images at once."""
    ys = [_Axis(0, h, h) for h, _ in sizes]
    xs = [_Axis(0, w, w) for _, w in sizes]
    host = _Host(t, sizes) if t is not None else None
    b = len(sizes)
    for k, o in enumerate(plan.ops):
        ps = [params[i][k] for i in range(b)]
        act = [p is not None for p in ps]
        cur = [(ys[i].size, xs[i].size) for i in range(b)]
        if isinstance(o, RESAMPLERS):
            _resample(o, ps, cur, ys, xs, host)
        elif isinstance(o, D.FixedSizeCrop):
            _fixed_size_crop(o, ps, cur, ys, xs, host)
        elif isinstance(o, D.RandomHorizontalFlip):
            for i in range(b):
                if act[i]:
                    xs[i].flip()
            if host is not None:
                host.flip(act, [w for _, w in cur], o.flip_map)
        elif isinstance(o, D.SanitizeBoundingBoxes):
            if host is None:
                raise ArgumentError("sanitize: the sample has no boxes")
            host.sizes = cur
            host.sanitize(o.min_size, o.min_area)
        else:  # the pads
            pads = [_pads(o, p, s) if p is not None else None for p, s in zip(ps, cur)]
            act = [p is not None for p in pads]
            for i, p in enumerate(pads):
                if p is not None:
                    left, top, right, bottom = p
                    ys[i].pad(top, bottom)
                    xs[i].pad(left, right)
            if host is not None:
                z = [p or (0, 0, 0, 0) for p in pads]
                nh = [ys[i].size for i in range(b)]
                nw = [xs[i].size for i in range(b)]
                host.shift_clamp(act, [p[0] for p in z], [p[1] for p in z], nh, nw, +1)
    return Geometry(ys, xs)


def _pads(o: Any, p: dict, size: tuple[int, int]) -> tuple[int, int, int, int] | None:
    """(left, top, right, bottom) of a pad op, or None where it leaves the image as is."""
    h, w = size
    if isinstance(o, D.Pad):
        return o.padding
    if isinstance(o, D.PadTo):
        th, tw = _out_size(o, p, size)
        return (0, 0, tw - w, th - h)
    if isinstance(o, D.PadToMultiple):
        right, bottom = -w % o.divisor, -h % o.divisor
        return (0, 0, right, bottom) if (right or bottom) else None
    return (p["left"], p["top"], p["right"], p["bottom"])  # RandomZoomOut


def _resample(o, ps, cur, ys, xs, host: _Host | None) -> None:
    crops, outs = [], []
    for i, (p, (h, w)) in enumerate(zip(ps, cur)):
        if isinstance(o, D.RandomResizedCrop):
            top, left, ch, cw = p["top"], p["left"], p["height"], p["width"]
            size = o.size
        else:
            top, left, ch, cw = 0, 0, h, w
            size = p["size"] if isinstance(o, D.ScaleJitter) else _out_size(o, p, (h, w))
        crops.append((top, left, ch, cw))
        outs.append(tuple(size))
        # the axes so far are flips of the image (no resize, no pad before this one)
        ys[i] = _Axis(top, ch, size[0], pre_off=ys[i].off, pre_sign=ys[i].sign)
        xs[i] = _Axis(left, cw, size[1], pre_off=xs[i].off, pre_sign=xs[i].sign)
    if host is None:
        return
    full = [c == (0, 0, h, w) for c, (h, w) in zip(crops, cur)]
    same = [f and s == hw for f, s, hw in zip(full, outs, cur)]
    cropped = [not f for f in full]
    if any(cropped):
        host.shift_clamp(cropped, [c[1] for c in crops], [c[0] for c in crops],
                         [c[2] for c in crops], [c[3] for c in crops], -1)  # fmt: skip
    wr = [s[1] / c[3] for s, c in zip(outs, crops)]
    hr = [s[0] / c[2] for s, c in zip(outs, crops)]
    host.scale([not s for s in same], wr, hr)


def _fixed_size_crop(o, ps, cur, ys, xs, host: _Host | None) -> None:
    th, tw = o.size
    b = len(cur)
    cut, tops, lefts, nhs, nws = [], [], [], [], []
    for i, (p, (h, w)) in enumerate(zip(ps, cur)):
        nh, nw = min(h, th), min(w, tw)
        top, left = int(p["top"]), int(p["left"])
        for name, v, room in (("top", top, h - nh), ("left", left, w - nw)):
            if not 0 <= v <= room:
                raise ArgumentError(
                    f"fixed_size_crop: {name} {v} leaves the {h}x{w} image (0 to {room} for a "
                    f"{nh}x{nw} crop)"
                )
        cut.append((nh, nw) != (h, w))
        tops.append(top if cut[-1] else 0)
        lefts.append(left if cut[-1] else 0)
        nhs.append(nh)
        nws.append(nw)
        if cut[-1]:
            ys[i].crop(top, nh)
            xs[i].crop(left, nw)
        ys[i].pad(0, th - nh)
        xs[i].pad(0, tw - nw)
    if host is None:
        return
    if any(cut):
        host.shift_clamp(cut, lefts, tops, nhs, nws, -1)
        t = host.t
        bx = t.boxes
        empty = ~((bx[:, 0] < bx[:, 2]) & (bx[:, 1] < bx[:, 3]))
        t.select(~(empty & _per_row(cut, t, torch.bool)))
    host.shift_clamp([True] * b, [0] * b, [0] * b, [th] * b, [tw] * b, +1)


# ---------------------------------------------------------------- device tables


def _tables(geo: Geometry, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 [B, 8] (start, length, n, off, sign, size, pre_off, pre_sign) per image for
    y and for x, on ``device`` in one copy."""
    rows = [
        [a.start, a.length, a.n, a.off, a.sign, a.size, a.pre_off, a.pre_sign]
        for a in (*geo.ys, *geo.xs)
    ]
    both = to_device(torch.tensor(rows, dtype=torch.int64).reshape(2, -1, 8), device)
    return both[0], both[1]


def _positions(tab: torch.Tensor, canvas: int) -> tuple[torch.Tensor, ...]:
    """(v int64 [B, canvas] clamped into [0, n), content bool [B, canvas], inside bool)."""
    o = torch.arange(canvas, device=tab.device)
    n, off, sign, size = tab[:, 2:6].unbind(1)
    v = off[:, None] + sign[:, None] * o
    inside = o < size[:, None]
    content = inside & (v >= 0) & (v < n[:, None])
    return v.clamp(min=0).minimum(n[:, None] - 1), content, inside


def _nearest(tab: torch.Tensor, v: torch.Tensor, mode: str, mirror: bool) -> torch.Tensor:
    """Source pixel of each position: torch's nearest rule for a resize of length ->
    n (float32 scale), as :func:`packer.imaging.resize.filter_weights`."""
    start, length, n = tab[:, 0:1], tab[:, 1:2], tab[:, 2:3]
    scale = length.to(torch.float32) / n.to(torch.float32)
    pos = v.to(torch.float32)
    pos = (pos + 0.5 if mode == "nearest-exact" else pos) * scale
    return _mirrored(tab, start + torch.minimum(pos.floor().to(torch.int64), length - 1), mirror)


def _mirrored(tab: torch.Tensor, index: torch.Tensor, mirror: bool) -> torch.Tensor:
    """Pixels of the source as the image's (``pre_off + pre_sign * i``: flips before the
    resize read the image mirrored, with the same weights); ``mirror``: some image is."""
    if not mirror:
        return index
    extra = (None,) * (index.ndim - 1)
    pre_off, pre_sign = tab[(slice(None), 6, *extra)], tab[(slice(None), 7, *extra)]
    return pre_off + pre_sign * index


def _weights(tab: torch.Tensor, v: torch.Tensor, k: int, aa: bool, mirror: bool) -> tuple:
    """Bilinear windows (index, weight) [B, canvas, k] of positions ``v``, as
    :func:`packer.imaging.resize.filter_weights` computes them for one image."""
    start, length = tab[:, 0, None, None], tab[:, 1, None, None]
    length_f = length.to(torch.float32)
    scale = length_f / tab[:, 2, None, None].to(torch.float32)
    stretch = scale.clamp(min=1.0) if aa else torch.ones_like(scale)
    centre = scale * (v.to(torch.float32)[..., None] + 0.5)
    first = (centre - stretch + 0.5).floor().clamp(min=0)
    j = first + torch.arange(k, device=v.device, dtype=torch.float32)
    w = (1.0 - ((j - centre + 0.5) / stretch).abs()).clamp(min=0.0)
    w = torch.where(j < length_f, w, 0.0)
    w = w / w.sum(-1, keepdim=True).clamp(min=1e-12)
    return _mirrored(tab, start + torch.minimum(j.to(torch.int64), length - 1), mirror), w


def _dense(index: torch.Tensor, weight: torch.Tensor, in_size: int) -> torch.Tensor:
    b, out, _ = index.shape
    m = torch.zeros(b, out, in_size, device=index.device, dtype=torch.float32)
    return m.scatter_add_(2, index, weight)


def _products(images: torch.Tensor, ry: torch.Tensor, rx: torch.Tensor, clamp: bool):
    """``Ry @ X @ Rx^T`` per image (:func:`packer.imaging.resize.resized_crop`'s
    products and rounding): uint8 [B, C, oh, ow]."""
    b, c, h, w = images.shape
    oh, ow = ry.shape[1], rx.shape[1]
    dt = torch.float16 if images.device.type == "cuda" else torch.float32
    x = torch.empty((b, h, c, w), dtype=dt, device=images.device)
    x.copy_(images.permute(0, 2, 1, 3))
    t = torch.bmm(x.view(b, h * c, w), rx.to(dt).transpose(1, 2)).view(b, h, c * ow)
    if clamp:
        t = t.add_(0.5).floor_().clamp_(0, 255)
    y = torch.bmm(ry.to(dt), t).view(b, oh, c, ow)
    y = y.float() if dt != torch.float32 else y
    out = torch.empty((b, c, oh, ow), dtype=torch.uint8, device=images.device)
    out.copy_(y.add_(0.5).clamp_(0, 255).permute(0, 2, 1, 3))
    return out


def _fill_tensor(fill: Any, c: int, device: torch.device) -> torch.Tensor:
    if isinstance(fill, tuple):
        if len(fill) != c:
            raise ArgumentError(f"pad: fill has {len(fill)} values for an image of {c} channels")
        values = list(fill)
    else:
        values = [fill] * c
    t = torch.tensor(values).to(torch.uint8).reshape(1, c, 1, 1)
    return to_device(t, device)


def _padded(images: Sequence[torch.Tensor]) -> torch.Tensor:
    """The images [C, h_i, w_i] as one batch [B, C, Hmax, Wmax] (zeros beyond each)."""
    if isinstance(images, torch.Tensor):
        return images
    if len({tuple(i.shape) for i in images}) == 1:
        return torch.stack(list(images))
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "nested tensors are a prototype"
            nested = torch.nested.as_nested_tensor(list(images))
        return nested.to_padded_tensor(0)
    except (RuntimeError, NotImplementedError):  # a build without them: one copy each
        c = images[0].shape[0]
        h, w = max(i.shape[-2] for i in images), max(i.shape[-1] for i in images)
        out = images[0].new_zeros((len(images), c, h, w))
        for k, i in enumerate(images):
            out[k, :, : i.shape[-2], : i.shape[-1]] = i
        return out


@dataclass
class Planes:
    """Masks in one flat uint8 buffer on the device: plane ``r`` starts at ``base[r]``,
    of (h, w) ``sizes[r]``, stored row-major (semantic masks) or column-major (instance
    masks, as COCO's RLE decodes); ``flat`` holds at least ``max(h, w)`` bytes after the
    last plane (see :func:`gather_planes`)."""

    flat: torch.Tensor
    base: list[int]
    sizes: list[tuple[int, int]]
    column_major: bool


@dataclass
class Out:
    """The transformed batch: ``images`` uint8 [B, C, H, W] (each image at the top left,
    ``sizes`` (h, w) each, padded beyond), ``targets`` (host), ``masks`` uint8 [R, H, W]
    (one per row of ``targets``) or None, ``semantic`` uint8 [B, H, W] or None."""

    images: torch.Tensor
    sizes: list[tuple[int, int]]
    targets: Targets | None
    masks: torch.Tensor | None
    semantic: torch.Tensor | None


def _lines(flat: torch.Tensor, starts: torch.Tensor, line_max: int) -> torch.Tensor:
    """[*starts.shape, line_max]: ``flat[k : k + line_max]`` for each k of ``starts``,
    read by one ``index_select`` of overlapping windows of ``flat`` (a view)."""
    windows = flat.unfold(0, line_max, 1)
    return windows.index_select(0, starts.reshape(-1)).view(*starts.shape, line_max)


def run(
    plan: Plan,
    images: Sequence[torch.Tensor],
    targets: Targets | None,
    planes: Planes | None,
    gen: torch.Generator | None,
    divisible: int = 32,
    pad_fill: int = 0,
    pad_semantic: int = 255,
) -> Out:
    """The batch through ``plan``: parameters drawn per image from ``gen``, targets moved
    on the host, images resampled (or gathered) in one go, masks gathered in one go;
    every image on a canvas of the largest output size (rounded up to ``divisible``
    when the sizes differ), padded with ``pad_fill`` (masks 0, semantic masks
    ``pad_semantic``). The host waits for the device nowhere."""
    sizes = [(int(i.shape[-2]), int(i.shape[-1])) for i in images]
    params = draw(plan, sizes, gen)
    geo = apply(plan, params, sizes, targets)
    out_sizes = geo.sizes
    d = 1 if len(set(out_sizes)) == 1 else divisible
    ch = -(-max(s[0] for s in out_sizes) // d) * d
    cw = -(-max(s[1] for s in out_sizes) // d) * d
    src = _padded(images)
    dev = src.device
    ty, tx = _tables(geo, dev)
    vy, cy, iny = _positions(ty, ch)
    vx, cx, inx = _positions(tx, cw)
    if geo.resampled:
        hk = taps(max(a.length / a.n for a in geo.ys), plan.mode, plan.antialias)
        wk = taps(max(a.length / a.n for a in geo.xs), plan.mode, plan.antialias)
        if plan.mode == "bilinear":
            iy, wy = _weights(ty, vy, hk, plan.antialias, geo.mirrored)
            ix, wx = _weights(tx, vx, wk, plan.antialias, geo.mirrored)
        else:
            iy = _nearest(ty, vy, plan.mode, geo.mirrored)[..., None]
            ix = _nearest(tx, vx, plan.mode, geo.mirrored)[..., None]
            wy, wx = torch.ones(iy.shape, device=dev), torch.ones(ix.shape, device=dev)
        ry = _dense(iy, wy * cy[..., None], src.shape[-2])
        rx = _dense(ix, wx * cx[..., None], src.shape[-1])
        pixels = _products(src, ry, rx, overshoots(plan.mode))
    else:
        b = torch.arange(src.shape[0], device=dev)
        sy = _mirrored(ty, ty[:, 0:1] + vy, geo.mirrored)  # crops without a resize
        sx = _mirrored(tx, tx[:, 0:1] + vx, geo.mirrored)
        pixels = src.permute(0, 2, 3, 1)[b[:, None, None], sy[:, :, None], sx[:, None, :]]
        pixels = pixels.permute(0, 3, 1, 2)
    c = src.shape[1]
    flags = geo.fills(ch, cw)
    axes = (cy, cx, iny, inx)
    fill = _fill_tensor(plan.fill, c, dev)
    out_images = _fill_in(pixels, axes, fill, _u8(pad_fill), flags)
    masks = semantic = None
    if planes is not None:
        my, mx = (
            _nearest_mask(ty, vy, plan, geo.mirrored),
            _nearest_mask(tx, vx, plan, geo.mirrored),
        )
        if planes.column_major:
            masks = _instance_masks(planes, targets, my, mx, axes, plan, flags, dev)
        else:
            semantic = _semantic(planes, my, mx, axes, plan, pad_semantic, flags, dev)
    return Out(out_images, out_sizes, targets, masks, semantic)


def _u8(v: int) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.uint8)  # a host scalar: no copy to the device


def _fill_in(x: torch.Tensor, axes: tuple, fill, pad, flags: tuple[bool, bool]) -> torch.Tensor:
    """``x`` [N, (C,) H, W] with the ops' ``fill`` where an image's pixel has no source
    (a pad) and ``pad`` beyond the image on the canvas; ``axes``: (content y [N, H],
    content x [N, W], inside y, inside x); ``flags``: whether either occurs at all."""
    need_fill, need_pad = flags
    if not (need_fill or need_pad):
        return x.contiguous()
    cy, cx, iny, inx = axes
    extra = (None,) * (x.ndim - 3)
    content = (cy[:, :, None] & cx[:, None, :])[(slice(None), *extra)]
    if need_fill and need_pad:
        inside = (iny[:, :, None] & inx[:, None, :])[(slice(None), *extra)]
        other = torch.where(inside, fill, pad)
    else:
        other = fill if need_fill else pad
    return torch.where(content, x, other).contiguous()


def _nearest_mask(tab: torch.Tensor, v: torch.Tensor, plan: Plan, mirror: bool) -> torch.Tensor:
    """Masks' source pixels: nearest-exact where the image's mode is, else nearest."""
    return _nearest(tab, v, "nearest-exact" if plan.mode == "nearest-exact" else "nearest", mirror)


def _instance_masks(planes, targets, my, mx, axes, plan, flags, dev) -> torch.Tensor:
    """Every kept instance's mask on the canvas [R, H, W]: each output column is a
    source column (a line of the column-major plane, or the zeros after the last plane
    where it has none), transposed, then each output row a row of that (or a zero row):
    two ``index_select`` and a copy, no index as large as the output."""
    rows = targets.row
    img = targets.image
    r = int(rows.shape[0])
    heights = torch.tensor([s[0] for s in planes.sizes] or [0], dtype=torch.int64)
    base = torch.tensor(planes.base or [0], dtype=torch.int64)
    host = torch.cat([img, base.index_select(0, rows), heights.index_select(0, rows)])
    img_d, base_d, h_d = to_device(host, dev).view(3, r).unbind(0)
    per_row = tuple(a.index_select(0, img_d) for a in axes)
    cy, cx = per_row[0], per_row[1]
    hmax = max([s[0] for s in planes.sizes] or [1])
    zeros = planes.flat.shape[0] - hmax  # the slack after the last plane: zeros
    # column x of plane r starts at base + x * h (column-major), then y within it
    starts = torch.where(cx, base_d[:, None] + mx.index_select(0, img_d) * h_d[:, None], zeros)
    cols = _lines(planes.flat, starts, hmax)  # [R, W, hmax]
    t = cols.new_empty((r, hmax + 1, cols.shape[1]))
    t[:, hmax].zero_()  # the row an output row without a source reads
    t[:, :hmax].copy_(cols.transpose(1, 2))
    ys = torch.where(cy, my.index_select(0, img_d), hmax)
    ys = ys + torch.arange(r, device=ys.device)[:, None] * (hmax + 1)
    w = cols.shape[1]
    out = t.view(r * (hmax + 1), w).index_select(0, ys.reshape(-1)).view(r, ys.shape[1], w)
    if plan.mask_fill != 0 and flags[0]:  # the pads' own mask value
        return _fill_in(out, per_row, _u8(plan.mask_fill), _u8(0), flags)
    return out


def _semantic(planes, my, mx, axes, plan, pad_semantic, flags, dev) -> torch.Tensor:
    host = torch.tensor([planes.base, [s[1] for s in planes.sizes]], dtype=torch.int64)
    base, widths = to_device(host, dev).unbind(0)
    starts = base[:, None] + my * widths[:, None]
    wmax = max(s[1] for s in planes.sizes)
    lines = _lines(planes.flat, starts, wmax)  # [B, H, wmax]: the rows
    m = lines.gather(2, mx[:, None, :].expand(-1, lines.shape[1], -1))  # [B, H, W]
    return _fill_in(m, axes, _u8(plan.semantic_fill), _u8(pad_semantic), flags)
