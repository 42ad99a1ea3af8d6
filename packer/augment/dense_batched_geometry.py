"""The batched dense path's geometry: every op's drawn parameters folded into per-image
axis maps (:class:`Geometry`: output pixel -> pixel of the resized source, crops, pads and
flips folded in), the host targets moved with them (:func:`apply`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..imaging.resize import ArgumentError
from . import dense as D
from .dense_batched_plan import RESAMPLERS, Plan, out_size
from .dense_batched_targets import Host, Targets, per_row


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
    host = Host(t, sizes) if t is not None else None
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
        th, tw = out_size(o, p, size)
        return (0, 0, tw - w, th - h)
    if isinstance(o, D.PadToMultiple):
        right, bottom = -w % o.divisor, -h % o.divisor
        return (0, 0, right, bottom) if (right or bottom) else None
    return (p["left"], p["top"], p["right"], p["bottom"])  # RandomZoomOut


def _resample(o, ps, cur, ys, xs, host: Host | None) -> None:
    crops, outs = [], []
    for i, (p, (h, w)) in enumerate(zip(ps, cur)):
        if isinstance(o, D.RandomResizedCrop):
            top, left, ch, cw = p["top"], p["left"], p["height"], p["width"]
            size = o.size
        else:
            top, left, ch, cw = 0, 0, h, w
            size = p["size"] if isinstance(o, D.ScaleJitter) else out_size(o, p, (h, w))
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


def _fixed_size_crop(o, ps, cur, ys, xs, host: Host | None) -> None:
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
        t.select(~(empty & per_row(cut, t, torch.bool)))
    host.shift_clamp([True] * b, [0] * b, [0] * b, [th] * b, [tw] * b, +1)
