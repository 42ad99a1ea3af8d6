"""The batched dense path's host targets: the batch's instances (:class:`Targets`) and
:class:`Host`, which moves their boxes and keypoints op by op, every image at once, with
the per-image kernels' float32 operations (the same bits)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .dense_kernels import flip_permutation


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


def per_row(values: Sequence, t: Targets, dtype: torch.dtype) -> torch.Tensor:
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


class Host:
    """The batch's targets moved op by op, every image at once (rows of images an op
    skips are kept as they are)."""

    def __init__(self, t: Targets, sizes: list[tuple[int, int]]) -> None:
        self.t, self.sizes = t, list(sizes)

    def _rows(self, act: list[bool]) -> torch.Tensor:
        return per_row(act, self.t, torch.bool)

    def shift_clamp(self, act, dx, dy, nh, nw, sign: int) -> None:
        """Boxes ``+ sign * (dx, dy)`` clamped to (nh, nw) where ``act``; keypoints
        moved (and, for a crop, hidden outside)."""
        t = self.t
        if t.boxes.shape[0] == 0:
            return
        rows = self._rows(act)
        d = per_row([[x, y, x, y] for x, y in zip(dx, dy)], t, torch.float32)
        h, w = per_row(nh, t, torch.float32), per_row(nw, t, torch.float32)
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
        f = per_row([[a, b, a, b] for a, b in zip(wr, hr)], t, torch.float32)
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
        w = per_row(widths, t, torch.float32)
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
        h = per_row([s[0] for s in self.sizes], t, torch.float32)
        w = per_row([s[1] for s in self.sizes], t, torch.float32)
        ws, hs = b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
        valid = (ws >= min_size) & (hs >= min_size) & (b >= 0).all(dim=-1) & (ws * hs >= min_area)
        valid &= (b[:, 0] <= w) & (b[:, 2] <= w)
        valid &= (b[:, 1] <= h) & (b[:, 3] <= h)
        t.select(valid)
