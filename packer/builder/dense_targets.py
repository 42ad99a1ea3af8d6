"""A dense build's targets moved onto the stored images (:mod:`packer.builder.dense`
plans the build): :func:`frame_map` (the affine ``x' = a x + b`` per axis from an
annotation's pixels to the stored image's, for ``crop``, ``stretch`` and ``pad``),
:func:`move_targets` (boxes scaled, shifted and clipped, empty ones dropped and counted,
keypoints moved, area scaled), :func:`remap_nearest` (masks nearest neighbour), and
:func:`derive_columns` / :func:`write_dense_targets` (finalize's step, and
``verify --source``'s re-derivation).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InputError, PackerError, UsageError
from ..sources.annotations.model import (
    CategoryMap,
    ImageTargets,
)

if TYPE_CHECKING:
    from .dense import DensePlan  # the plan plan_dense returns


# ---------------------------------------------------------------- geometry


def frame_map(
    mode: str, ann_hw: tuple[int, int], src_hw: tuple[int, int], out_hw: tuple[int, int]
) -> tuple[float, float, float, float]:
    """``(ax, bx, ay, by)``: a point ``(x, y)`` in pixels of an annotation of size
    ``ann_hw`` lands at ``(ax x + bx, ay y + by)`` in the stored image of ``out_hw``,
    made from a source decoded at ``src_hw`` by the resize ``mode`` (as
    :func:`packer.imaging.decode._fit` fits it)."""
    ah, aw = ann_hw
    h, w = src_hw
    oh, ow = out_hw
    rx, ry = w / aw, h / ah  # annotation pixels -> the decoded source's
    if mode == "stretch":
        sx, sy, ox, oy = ow / w, oh / h, 0.0, 0.0
    elif mode == "crop":  # Pillow's resize of the centred box (x0, y0, x0 + bw, y0 + bh)
        s = max(ow / w, oh / h)
        bw, bh = min(w, ow / s), min(h, oh / s)
        sx, sy = ow / bw, oh / bh
        ox, oy = -(w - bw) / 2 * sx, -(h - bh) / 2 * sy
    elif mode == "pad":
        s = min(ow / w, oh / h)
        nw, nh = max(1, round(w * s)), max(1, round(h * s))
        sx, sy = nw / w, nh / h
        ox, oy = float((ow - nw) // 2), float((oh - nh) // 2)
    else:
        raise UsageError(f"BuildConfig.resize {mode!r} is not crop, stretch or pad")
    return rx * sx, ox, ry * sy, oy


def _nearest_index(n_out: int, a: float, b: float, n_in: int) -> np.ndarray:
    """Source index of each output pixel under ``x' = a x + b`` (nearest neighbour as
    ``torch.nn.functional.interpolate(mode="nearest")``: ``floor((u - b) / a)``); -1
    where it falls outside the source."""
    u = np.arange(n_out, dtype=np.float64)
    src = np.floor((u - b) / a + 1e-9).astype(np.int64)
    src[(src < 0) | (src >= n_in)] = -1
    return src


def remap_nearest(
    masks: np.ndarray, axes: tuple[float, float, float, float], out_hw: tuple[int, int], fill: int
) -> np.ndarray:
    """``masks`` (uint8 [..., h, w]) moved by ``frame_map``'s ``axes`` into ``out_hw``,
    nearest neighbour; pixels with no source get ``fill``."""
    ax, bx, ay, by = axes
    h, w = masks.shape[-2:]
    xi = _nearest_index(out_hw[1], ax, bx, w)
    yi = _nearest_index(out_hw[0], ay, by, h)
    out = masks[..., np.clip(yi, 0, None)[:, None], np.clip(xi, 0, None)[None, :]]
    out = np.ascontiguousarray(out, dtype=np.uint8)
    out[..., yi < 0, :] = fill
    out[..., :, xi < 0] = fill
    return out


def move_targets(
    t: ImageTargets,
    axes: tuple[float, float, float, float],
    out_hw: tuple[int, int],
    num_keypoints: int,
) -> tuple[dict[str, Any], int]:
    """One image's targets moved into the stored image (see the module's doc); returns
    the arrays and how many boxes were dropped."""
    ax, bx, ay, by = axes
    oh, ow = out_hw
    b = t.boxes.astype(np.float64)
    moved = np.stack(
        [b[:, 0] * ax + bx, b[:, 1] * ay + by, b[:, 2] * ax + bx, b[:, 3] * ay + by], 1
    )
    clipped = moved.copy()
    clipped[:, 0::2] = clipped[:, 0::2].clip(0, ow)
    clipped[:, 1::2] = clipped[:, 1::2].clip(0, oh)
    wh = clipped[:, 2:] - clipped[:, :2]
    keep = (wh[:, 0] > 0) & (wh[:, 1] > 0)
    full = (moved[:, 2] - moved[:, 0]) * (moved[:, 3] - moved[:, 1])
    share = np.where(full > 0, wh[:, 0] * wh[:, 1] / np.where(full > 0, full, 1), 0)
    area = t.area.astype(np.float64) * ax * ay * share
    out: dict[str, Any] = {
        "boxes": clipped[keep].astype(np.float32).reshape(-1, 4),
        "labels": t.labels[keep].astype(np.int64),
        "iscrowd": t.iscrowd[keep].astype(np.uint8),
        "area": area[keep].astype(np.float32),
    }
    if num_keypoints:
        kp = np.zeros((t.count, num_keypoints, 3), dtype=np.float64)
        if t.keypoints is not None:
            kp[:, : t.keypoints.shape[1]] = t.keypoints
        kx, ky = kp[..., 0] * ax + bx, kp[..., 1] * ay + by
        vis = kp[..., 2]
        inside = (kx >= 0) & (kx < ow) & (ky >= 0) & (ky < oh)
        kp = np.stack([kx, ky, np.where(inside, vis, 0.0)], -1)
        kp[vis == 0] = 0.0
        out["keypoints"] = kp[keep].astype(np.float32)
    if t.masks is not None:
        from ..pack.dense import encode_masks

        kept = [c for c, k in zip(t.masks, keep) if k]
        if kept:
            dec = replace(t, masks=tuple(kept), boxes=t.boxes[keep], labels=t.labels[keep],
                          iscrowd=t.iscrowd[keep], area=t.area[keep], keypoints=None,
                          difficult=None).decode_masks()  # fmt: skip
            out["masks"] = encode_masks(remap_nearest(dec, axes, out_hw, 0))
        else:
            out["masks"] = []
    return out, int((~keep).sum())


def write_dense_targets(
    plan: Any, config: Any, keep: list[int], sizes: list[list[int]], data_dir: Path
) -> tuple[Any, dict[str, Any]]:
    """Finalize's step: the dense columns of the kept images, written into ``data_dir``
    (beside the assembled images); returns the manifest's record and the result's
    summary. ``sizes``: each planned image's decoded (w, h)."""
    rels = [plan.scan.entries[i].rel for i in keep]
    wh = [(int(sizes[i][0]), int(sizes[i][1])) for i in keep]
    return derive_columns(
        plan.dense, rels, wh, config.kind, config.spec.shape, config.resize, data_dir, data_dir
    )


def derive_columns(
    dense: DensePlan,
    rels: list[str],
    sizes: list[tuple[int, int]],
    kind: Any,
    image_shape: Any,
    resize: str,
    images_dir: Path,
    out_dir: Path,
) -> tuple[Any, dict[str, Any]]:
    """The dense columns of the images ``rels`` (pack order; ``sizes``: each one's decoded
    (w, h)) stored by ``kind`` in ``images_dir``, written into ``out_dir``: the build's
    step, and ``imgpack verify``'s re-derivation from the source annotations."""
    from ..pack.dense import DenseArrays, write_dense
    from ..sources.annotations.masks import read_semantic_mask

    mode, frames = kind.stored_frames(images_dir, len(rels), image_shape, resize)
    cats = dense.categories
    k = cats.num_keypoints if cats is not None else 0
    offsets = [0]
    boxes, labels, iscrowd, area, kps, masks, semantic, ids = [], [], [], [], [], [], [], []
    any_masks = any(t.masks is not None for t in dense.by_file.values())
    any_sem = any(t.semantic is not None for t in dense.by_file.values())
    lut = None
    if any_sem and cats is not None:
        lut = np.full(256, -1, dtype=np.int64)
        lut[dense.ignore_index] = dense.ignore_index
        for idx, cid in enumerate(cats.ids):
            if 0 <= cid <= 255:
                lut[cid] = idx
    dropped = 0
    top = -1
    for j, rel in enumerate(rels):
        t = dense.by_file[rel]
        out_hw = frames[j]
        src_hw = (int(sizes[j][1]), int(sizes[j][0]))
        axes = frame_map(mode, t.size, src_hw, out_hw)
        moved, gone = move_targets(t, axes, out_hw, k)
        dropped += gone
        boxes.append(moved["boxes"])
        labels.append(moved["labels"])
        iscrowd.append(moved["iscrowd"])
        area.append(moved["area"])
        if k:
            kps.append(moved["keypoints"])
        if any_masks:
            ms = moved.get("masks")
            if ms is None:  # an image of the source without masks: empty ones
                ms = encode_masks_empty(len(moved["labels"]), out_hw)
            masks.extend(ms)
        offsets.append(offsets[-1] + len(moved["labels"]))
        ids.append(
            t.image_id if isinstance(t.image_id, int) and not isinstance(t.image_id, bool) else -1
        )
        if any_sem:
            if t.semantic is None or dense.mask_root is None:
                sem = np.full(out_hw, dense.ignore_index, np.uint8)
            else:
                try:
                    raw = read_semantic_mask(
                        dense.mask_root / t.semantic, t.size, cats, dense.ignore_index
                    )
                except PackerError as e:
                    raise InputError(f"{e}; no pack was written") from None
                if lut is not None:
                    raw = lut[raw].astype(np.uint8)
                else:
                    vals = raw[raw != dense.ignore_index]
                    top = max(top, int(vals.max()) if vals.size else -1)
                sem = remap_nearest(raw, axes, out_hw, dense.ignore_index)
            semantic.append(sem)
    if cats is None:  # semantic masks without a map: ids 0..the largest value, as themselves
        n = max(top + 1, 1)
        cats = CategoryMap.build([f"class_{v}" for v in range(n)], list(range(n)))
    cols = DenseArrays(
        offsets=np.asarray(offsets, np.int64),
        frames=np.asarray(frames, np.int64).reshape(-1, 2),
        image_ids=np.asarray(ids, np.int64),
        boxes=np.concatenate(boxes).reshape(-1, 4) if boxes else np.zeros((0, 4), np.float32),
        labels=np.concatenate(labels) if labels else np.zeros(0, np.int64),
        iscrowd=np.concatenate(iscrowd) if iscrowd else np.zeros(0, np.uint8),
        area=np.concatenate(area) if area else np.zeros(0, np.float32),
        keypoints=np.concatenate(kps).reshape(-1, k, 3) if k else None,
        masks=masks if any_masks else None,
        semantic=semantic if any_sem else None,
    )
    record = write_dense(
        out_dir,
        cols,
        cats,
        semantic=kind.semantic_store,
        ignore_index=dense.ignore_index,
        dropped=dropped,
        source=dense.source,
    )
    summary = {
        "format": dense.format,
        "categories": list(cats.names),
        "instances": record.instances,
        "dropped": dropped,
        "clipped": dense.clipped,
        "outside": dense.outside,
        "masks": record.masks,
        "keypoints": record.keypoints,
        "semantic": record.semantic,
    }
    return record, summary


def encode_masks_empty(m: int, hw: tuple[int, int]) -> list[bytes]:
    from ..pack.dense import encode_masks

    return encode_masks(np.zeros((m, *hw), dtype=np.uint8))
