"""The batched dense path's masks: every mask of the batch in one flat buffer
(:class:`Planes`), gathered onto the canvas in one go by the masks' nearest indices (the
per-image path's, identical): instance masks [R, H, W], semantic masks [B, H, W]."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..imaging.resize import to_device
from .dense_batched_plan import Plan
from .dense_batched_resample import Maps, fill_in, nearest, u8
from .dense_batched_targets import Targets


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


def _lines(flat: torch.Tensor, starts: torch.Tensor, line_max: int) -> torch.Tensor:
    """[*starts.shape, line_max]: ``flat[k : k + line_max]`` for each k of ``starts``,
    read by one ``index_select`` of overlapping windows of ``flat`` (a view)."""
    windows = flat.unfold(0, line_max, 1)
    return windows.index_select(0, starts.reshape(-1)).view(*starts.shape, line_max)


def _nearest_mask(tab: torch.Tensor, v: torch.Tensor, plan: Plan, mirror: bool) -> torch.Tensor:
    """Masks' source pixels: nearest-exact where the image's mode is, else nearest."""
    return nearest(tab, v, "nearest-exact" if plan.mode == "nearest-exact" else "nearest", mirror)


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
        return fill_in(out, per_row, u8(plan.mask_fill), u8(0), flags)
    return out


def _semantic(planes, my, mx, axes, plan, pad_semantic, flags, dev) -> torch.Tensor:
    host = torch.tensor([planes.base, [s[1] for s in planes.sizes]], dtype=torch.int64)
    base, widths = to_device(host, dev).unbind(0)
    starts = base[:, None] + my * widths[:, None]
    wmax = max(s[1] for s in planes.sizes)
    lines = _lines(planes.flat, starts, wmax)  # [B, H, wmax]: the rows
    m = lines.gather(2, mx[:, None, :].expand(-1, lines.shape[1], -1))  # [B, H, W]
    return fill_in(m, axes, u8(plan.semantic_fill), u8(pad_semantic), flags)


def gather_masks(
    planes: Planes, targets: Targets | None, plan: Plan, maps: Maps, pad_semantic: int, dev
) -> tuple:
    """(instance masks uint8 [R, H, W] or None, semantic masks uint8 [B, H, W] or None):
    ``planes`` on the canvas of ``maps``, one gather each; the pads' mask fills from
    ``plan``, semantic masks padded with ``pad_semantic`` beyond each image."""
    my = _nearest_mask(maps.ty, maps.vy, plan, maps.mirrored)
    mx = _nearest_mask(maps.tx, maps.vx, plan, maps.mirrored)
    if planes.column_major:
        masks = _instance_masks(planes, targets, my, mx, maps.axes, plan, maps.flags, dev)
        return masks, None
    return None, _semantic(planes, my, mx, maps.axes, plan, pad_semantic, maps.flags, dev)
