"""The batched dense path's device side: per image and axis the output pixels' source
positions (:func:`axis_maps`, from :class:`~packer.augment.dense_batched_geometry.Geometry`
in one copy), all images resampled by per-image filter matrices or gathered in one go
(:func:`resample`: the same filter weights as :func:`packer.imaging.resize.filter_weights`,
within the rounding of one product), fills by one ``where`` (:func:`fill_in`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..imaging.resize import ArgumentError, overshoots, taps, to_device
from .dense_batched_geometry import Geometry
from .dense_batched_plan import Plan


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


def nearest(tab: torch.Tensor, v: torch.Tensor, mode: str, mirror: bool) -> torch.Tensor:
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


def fill_tensor(fill: Any, c: int, device: torch.device) -> torch.Tensor:
    if isinstance(fill, tuple):
        if len(fill) != c:
            raise ArgumentError(f"pad: fill has {len(fill)} values for an image of {c} channels")
        values = list(fill)
    else:
        values = [fill] * c
    t = torch.tensor(values).to(torch.uint8).reshape(1, c, 1, 1)
    return to_device(t, device)


def padded(images: Sequence[torch.Tensor]) -> torch.Tensor:
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


def u8(v: int) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.uint8)  # a host scalar: no copy to the device


def fill_in(x: torch.Tensor, axes: tuple, fill, pad, flags: tuple[bool, bool]) -> torch.Tensor:
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


@dataclass
class Maps:
    """The batch's axis maps on the device: ``ty``, ``tx`` int64 [B, 8] (see
    :func:`_tables`), the canvas positions' pixels of the resized source ``vy`` [B, H],
    ``vx`` [B, W] (clamped into it), ``axes`` (content y, content x, inside y, inside x:
    bool [B, H] or [B, W]), ``flags`` (:meth:`Geometry.fills`: the fills the batch needs
    at all) and ``mirrored`` (some image is read mirrored)."""

    ty: torch.Tensor
    tx: torch.Tensor
    vy: torch.Tensor
    vx: torch.Tensor
    axes: tuple
    flags: tuple[bool, bool]
    mirrored: bool


def axis_maps(geo: Geometry, canvas_h: int, canvas_w: int, device: torch.device) -> Maps:
    """The :class:`Maps` of ``geo`` on a canvas of ``canvas_h`` x ``canvas_w``: one copy
    to ``device``, then device ops only."""
    ty, tx = _tables(geo, device)
    vy, cy, iny = _positions(ty, canvas_h)
    vx, cx, inx = _positions(tx, canvas_w)
    flags = geo.fills(canvas_h, canvas_w)
    return Maps(ty, tx, vy, vx, (cy, cx, iny, inx), flags, geo.mirrored)


def resample(plan: Plan, geo: Geometry, maps: Maps, src: torch.Tensor) -> torch.Tensor:
    """``src`` uint8 [B, C, h, w] on the canvas, fills not yet in: one resampling of all
    images by per-image filter matrices (``plan.mode``, ``plan.antialias``), or one gather
    where no image is resized."""
    ty, tx, vy, vx, mirror = maps.ty, maps.tx, maps.vy, maps.vx, maps.mirrored
    cy, cx = maps.axes[0], maps.axes[1]
    dev = src.device
    if geo.resampled:
        hk = taps(max(a.length / a.n for a in geo.ys), plan.mode, plan.antialias)
        wk = taps(max(a.length / a.n for a in geo.xs), plan.mode, plan.antialias)
        if plan.mode == "bilinear":
            iy, wy = _weights(ty, vy, hk, plan.antialias, mirror)
            ix, wx = _weights(tx, vx, wk, plan.antialias, mirror)
        else:
            iy = nearest(ty, vy, plan.mode, mirror)[..., None]
            ix = nearest(tx, vx, plan.mode, mirror)[..., None]
            wy, wx = torch.ones(iy.shape, device=dev), torch.ones(ix.shape, device=dev)
        ry = _dense(iy, wy * cy[..., None], src.shape[-2])
        rx = _dense(ix, wx * cx[..., None], src.shape[-1])
        return _products(src, ry, rx, overshoots(plan.mode))
    b = torch.arange(src.shape[0], device=dev)
    sy = _mirrored(ty, ty[:, 0:1] + vy, mirror)  # crops without a resize
    sx = _mirrored(tx, tx[:, 0:1] + vx, mirror)
    pixels = src.permute(0, 2, 3, 1)[b[:, None, None], sy[:, :, None], sx[:, None, :]]
    return pixels.permute(0, 3, 1, 2)
