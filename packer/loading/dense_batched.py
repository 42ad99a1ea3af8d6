"""The dense pass's batched path: a batch whose transform has one
(:func:`packer.augment.dense_batched.batched_ops`: flips, LSJ's ScaleJitter and
FixedSizeCrop, resizes, pads, sanitize) runs it over the whole batch at once, with a
fixed number of torch calls however many images and boxes it holds, and collates it
into the same ``(images, targets)`` as :func:`packer.loading.dense_pass.collate` of the
per-image path: the targets' values the same bits, the masks identical, the images
within the rounding of one product.

The records' boxes, labels, keypoints and iscrowd are stacked on the host (one row per
instance, with its image), moved there by every op at once, and copied to the device
once per dtype; instance masks are decoded into one buffer and gathered from it by one
index (:func:`packer.loading.dense_pass.decode_flat`); semantic masks likewise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..augment import dense_batched as DB
from ..imaging.resize import to_device


def plan_of(op: Any) -> DB.Plan | None:
    """The batched plan of the dense pass's op, or None (no op, or one without)."""
    return None if op is None else DB.batched_ops(op)


def _upload(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor onto ``device`` without making the host wait (pinned on CUDA)."""
    if device.type == "cuda" and not t.is_pinned():
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


def decode_flat(items: list[Any], device: torch.device, slack: int = 0) -> tuple:
    """Instance masks on ``device`` from their run lengths (column-major 0s then 1s, as
    COCO's RLE and pycocotools' decoder), the batch's in one buffer: ``(flat, bases)``,
    image ``i``'s masks [M, w, h] (column-major) from ``flat[bases[i]]``, and ``slack``
    zeros after the last. The runs are copied in one go and expanded by one
    ``repeat_interleave`` of a known length (no host wait)."""
    runs = [r for it in items if it is not None for r in it[0]]
    counts = np.concatenate([np.zeros(0, np.int64), *runs, np.array([slack], np.int64)])
    values = np.concatenate(
        [np.zeros(0, np.uint8), *((np.arange(len(r)) & 1).astype(np.uint8) for r in runs),
         np.zeros(1, np.uint8)]
    )  # fmt: skip
    total = int(counts.sum())
    flat = torch.repeat_interleave(
        _upload(torch.from_numpy(values), device),
        _upload(torch.from_numpy(counts), device),
        output_size=total,
    )
    bases, offset = [], 0
    for it in items:
        bases.append(offset)
        if it is not None:
            offset += len(it[0]) * it[1][0] * it[1][1]
    return flat, bases


def upload_flat(arrays: list[Any], device: torch.device, slack: int = 0) -> tuple:
    """The batch's masks (uint8 arrays, or None) on ``device`` in one copy: ``(flat,
    bases)``, array ``i`` from ``flat[bases[i]]``, ``slack`` bytes after the last: one
    (pinned, on CUDA) host buffer copied without making the host wait (a copy per
    image from pageable memory may make the host wait for the stream)."""
    sizes = [0 if a is None else a.size for a in arrays]
    pin = device.type == "cuda" and torch.cuda.is_available()
    buf = torch.zeros(sum(sizes) + slack, dtype=torch.uint8, pin_memory=pin)
    flat = buf.numpy()
    bases, offset = [], 0
    for a, n in zip(arrays, sizes):
        bases.append(offset)
        if a is not None:
            flat[offset : offset + n] = a.reshape(-1)
        offset += n
    return buf.to(device, non_blocking=True), bases  # pinned on CUDA; a no-op on the CPU


def _host_targets(records: list[dict[str, Any]]) -> DB.Targets | None:
    """The records' instances stacked: one row each, with its image (None where the
    records disagree on keypoints: the per-image path handles those)."""
    has_kp = {"keypoints" in r for r in records}
    if len(has_kp) > 1:
        return None
    boxes = [np.reshape(np.asarray(r["boxes"], np.float32), (-1, 4)) for r in records]
    counts = [len(b) for b in boxes]
    image = torch.from_numpy(np.repeat(np.arange(len(records)), counts).astype(np.int64))
    keypoints = None
    if has_kp == {True}:
        kps = [np.asarray(r["keypoints"], np.float32) for r in records]
        k = max([kp.shape[1] for kp in kps if kp.ndim == 3] or [0])
        kps = [kp.reshape(-1, k, 3) for kp in kps]
        keypoints = torch.from_numpy(np.concatenate(kps)) if k else torch.zeros(sum(counts), 0, 3)
    return DB.Targets(
        boxes=torch.from_numpy(np.concatenate([np.zeros((0, 4), np.float32), *boxes])),
        image=image,
        row=torch.arange(sum(counts)),
        labels=torch.from_numpy(_cat([r["labels"] for r in records], np.int64)),
        keypoints=keypoints,
        extras={"iscrowd": torch.from_numpy(_cat([r["iscrowd"] for r in records], np.int64))},
    )


def _agree(sizes: list[tuple[int, int]], records: list[dict[str, Any]], items: list[Any],
           semantic: bool) -> bool:  # fmt: skip
    """Every record's fields agree with its image's (h, w) ``sizes`` (masks of its size,
    one label, mask and keypoint row per box): else the per-image path, whose checks name
    the field."""
    for hw, rec, it in zip(sizes, records, items):
        if semantic:
            if it is not None and tuple(it.shape) != hw:
                return False
            continue
        m = int(np.size(rec["boxes"])) // 4
        if np.size(rec["labels"]) != m or np.size(rec["iscrowd"]) != m:
            return False
        kp = rec.get("keypoints")
        if kp is not None and (np.ndim(kp) != 3 or np.shape(kp)[0] != m) and np.size(kp):
            return False
        if it is not None and (len(it[0]) != m or tuple(it[1]) != hw):
            return False
    return True


def _cat(arrays: list[Any], dtype: Any) -> np.ndarray:
    return np.concatenate([np.zeros(0, dtype), *(np.asarray(a).astype(dtype) for a in arrays)])


def _planes(items: list[Any], setup: Any, dev: torch.device) -> Any:
    """The batch's masks (``dense_pass._pixels`` of each record) as
    :class:`~packer.augment.dense_batched.Planes`, None when it has none (every record
    has them or none: :func:`drawn_group` checks)."""
    if all(i is None for i in items):
        return None
    if setup.semantic:
        slack = max(a.shape[1] for a in items)
        flat, bases = upload_flat(items, dev, slack)
        return DB.Planes(flat, bases, [tuple(a.shape) for a in items], False)
    slack = max(size[0] for _, size in items)
    flat, image_bases = decode_flat(items, dev, slack)
    base, sizes = [], []
    for (runs, (h, w)), b in zip(items, image_bases):
        base.extend(b + j * h * w for j in range(len(runs)))
        sizes.extend([(h, w)] * len(runs))
    return DB.Planes(flat, base, sizes, True)


def run_batched(
    images: list[torch.Tensor],
    records: list[dict[str, Any]],
    items: list[Any],
    setup: Any,
    gen: torch.Generator | None,
    plan: DB.Plan,
) -> tuple[torch.Tensor, Any] | None:
    """One batch through ``plan`` and collated, or None where this batch needs the
    per-image path (records that disagree on masks or keypoints, or with their image). ``items``: each
    record's masks (``dense_pass._pixels``); ``setup``: the pass's ``DenseSetup``."""
    out = run_grouped(images, records, items, setup, [(len(images), gen)], plan)
    return None if out is None else out[0]


def run_grouped(
    images: list[torch.Tensor],
    records: list[dict[str, Any]],
    items: list[Any],
    setup: Any,
    gens: list[tuple[int, torch.Generator | None]],
    plan: DB.Plan,
) -> list[tuple[torch.Tensor, Any]] | None:
    """Several batches through ``plan`` at once, collated one by one: ``gens`` gives each
    batch's size and generator, in order (``images``, ``records`` and ``items`` hold the
    batches one after another). Each batch is what :func:`run_batched` makes of it alone
    (the same draws, pixels and targets; its own canvas), while the torch calls a pass
    makes, a fixed number, are made once for them all. None as :func:`run_batched`.
    :func:`drawn_group` (the host's half) then :func:`group_on_device`."""
    sizes = [(int(i.shape[-2]), int(i.shape[-1])) for i in images]
    made = drawn_group(sizes, records, items, setup, gens, plan)
    return None if made is None else group_on_device(images, made, setup, plan)


@dataclass
class DrawnGroup:
    """:func:`run_grouped`'s host half: what the records, the draws and the geometry
    give before any pixel moves. Plain data (numpy, CPU tensors, numbers): a worker
    process may make it for the producer (``DenseConfig.host="process"``)."""

    drawn: DB.Drawn
    items: list[Any]  # each record's masks (dense_pass._pixels), host
    targets: DB.Targets | None  # moved by the geometry, sanitized
    bounds: list[int]  # image bounds of the batches
    rows: list[int]  # target-row bounds of the batches
    counts: list[int]  # instances an image
    area: torch.Tensor | None  # per row from the boxes (None: from the masks, on the device)
    collated: list[dict[str, Any]]  # per batch, its targets' host half


def drawn_group(
    sizes: list[tuple[int, int]],
    records: list[dict[str, Any]],
    items: list[Any],
    setup: Any,
    gens: list[tuple[int, torch.Generator | None]],
    plan: DB.Plan,
) -> DrawnGroup | None:
    """The host half of :func:`run_grouped` for images of (h, w) ``sizes``; None where
    the batches need the per-image path (records that disagree with their images or with
    each other on masks or keypoints)."""
    if not _agree(sizes, records, items, setup.semantic):
        return None
    if any(i is None for i in items) and not all(i is None for i in items):
        return None
    bounds = np.cumsum([0] + [n for n, _ in gens]).tolist()
    if setup.semantic:
        made = DB.drawn(plan, sizes, None, gens, setup.size_divisible)
        return DrawnGroup(made, items, None, bounds, [0] * len(bounds), [], None, [])
    targets = _host_targets(records)
    if targets is None:
        return None
    made = DB.drawn(plan, sizes, targets, gens, setup.size_divisible)
    counts = torch.bincount(targets.image, minlength=len(sizes)).tolist()
    area = None
    if all(i is None for i in items):  # else COCO's segment area: the masks' pixels
        bx = targets.boxes
        area = (bx[:, 2] - bx[:, 0]) * (bx[:, 3] - bx[:, 1])
    rows = np.cumsum([0, *counts]).tolist()  # the rows run image by image
    row_bounds = [rows[b] for b in bounds]
    ids = [int(r["image_id"]) for r in records]
    collated = []
    for k, part in enumerate(_target_parts(targets, bounds, row_bounds)):
        lo, hi, r0, r1 = bounds[k], bounds[k + 1], row_bounds[k], row_bounds[k + 1]
        a = None if area is None else area[r0:r1]
        host = _padded_host if setup.targets == "padded" else _dicts_host
        collated.append(host(part, counts[lo:hi], a, ids[lo:hi], made.out_sizes[lo:hi]))
    return DrawnGroup(made, items, targets, bounds, row_bounds, counts, area, collated)


def group_on_device(
    images: list[torch.Tensor], made: DrawnGroup, setup: Any, plan: DB.Plan
) -> list[tuple[torch.Tensor, Any]]:
    """The device half of :func:`run_grouped`: ``images`` (those ``made`` was drawn
    for) resampled, the masks gathered, each batch cut to its canvas and its targets
    moved (one copy per dtype a batch)."""
    dev = images[0].device
    planes = _planes(made.items, setup, dev)
    out = DB.on_device(plan, images, made.drawn, made.targets, planes, setup.fill,
                       setup.semantic_fill)  # fmt: skip
    cut = _parts(out, made.bounds, made.rows, setup.size_divisible)
    if setup.semantic:
        return [(part.images, part.semantic) for part in cut]
    area = made.area
    if out.masks is not None:  # COCO's segment area: the transformed masks' pixels
        area = out.masks.flatten(1).sum(1, dtype=torch.int64).to(torch.float32)
    result = []
    for k, part in enumerate(cut):
        r0, r1 = made.rows[k], made.rows[k + 1]
        on_dev = None if made.area is not None else area[r0:r1]
        device = _padded_device if setup.targets == "padded" else _dicts_device
        result.append((part.images, device(made.collated[k], part.masks, on_dev, dev)))
    return result


def _cut(t: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """``t`` [..., H, W] cut to [..., h, w] (a copy: a batch's own, contiguous)."""
    return t if tuple(t.shape[-2:]) == (h, w) else t[..., :h, :w].contiguous()


def _parts(out: DB.Out, bounds: list[int], rows: list[int], divisible: int) -> list[DB.Out]:
    """Batch ``k`` of ``out``: images ``bounds[k]:bounds[k + 1]``, masks of target rows
    ``rows[k]:rows[k + 1]``, on its own canvas (the largest of its images, rounded up to
    ``divisible`` when their sizes differ: what it would have alone); its targets are
    :func:`_target_parts`'s."""
    if len(bounds) == 2:
        return [out]
    parts = []
    for lo, hi, r0, r1 in zip(bounds, bounds[1:], rows, rows[1:]):
        sizes = out.sizes[lo:hi]
        d = 1 if len(set(sizes)) == 1 else divisible
        h = -(-max(s[0] for s in sizes) // d) * d
        w = -(-max(s[1] for s in sizes) // d) * d
        parts.append(
            DB.Out(
                _cut(out.images[lo:hi], h, w),
                sizes,
                None,
                None if out.masks is None else _cut(out.masks[r0:r1], h, w),
                None if out.semantic is None else _cut(out.semantic[lo:hi], h, w),
            )
        )
    return parts


def _target_parts(t: DB.Targets, bounds: list[int], rows: list[int]) -> list[DB.Targets]:
    """Batch ``k``'s targets: rows ``rows[k]:rows[k + 1]``, their images counted from
    the batch's first."""
    if len(bounds) == 2:
        return [t]
    return [
        DB.Targets(
            boxes=t.boxes[r0:r1],
            image=t.image[r0:r1] - lo,
            row=t.row[r0:r1],
            labels=None if t.labels is None else t.labels[r0:r1],
            keypoints=None if t.keypoints is None else t.keypoints[r0:r1],
            extras={k: v[r0:r1] for k, v in t.extras.items()},
        )
        for lo, r0, r1 in zip(bounds, rows, rows[1:])
    ]


def _moved(parts: dict[str, torch.Tensor], dev: torch.device) -> dict[str, torch.Tensor]:
    """Host tensors onto ``dev``: one copy per dtype, each a view of it."""
    out: dict[str, torch.Tensor] = {k: v for k, v in parts.items() if v.device == dev}
    by_dtype: dict[torch.dtype, list[str]] = {}
    for k, v in parts.items():
        if k not in out:
            by_dtype.setdefault(v.dtype, []).append(k)
    for keys in by_dtype.values():
        flat = to_device(torch.cat([parts[k].reshape(-1) for k in keys]), dev)
        for k, piece in zip(keys, flat.split([parts[k].numel() for k in keys])):
            out[k] = piece.view(parts[k].shape)
    return out


def _dicts_host(t: DB.Targets, counts: list[int], area, ids: list[int], sizes) -> dict:
    """:func:`_dicts_device`'s host half: the targets' host tensors (``area`` None: the
    masks' pixels, on the device)."""
    parts = {"boxes": t.boxes, "labels": t.labels, "iscrowd": t.extras["iscrowd"]}
    if area is not None:
        parts["area"] = area
    if t.keypoints is not None:
        parts["keypoints"] = t.keypoints
    return {"parts": parts, "counts": counts, "ids": ids}


def _dicts_device(host: dict, masks, area, dev) -> list[dict]:
    """Per image a dict as torchvision's detection models take it, its tensors views of
    one copy per dtype."""
    moved = _moved(host["parts"], dev)
    if area is not None:
        moved["area"] = area
    if masks is not None:
        moved["masks"] = masks
    split = {k: v.split(host["counts"]) for k, v in moved.items()}
    tail = [k for k in ("masks", "keypoints") if k in split]
    return [
        {
            "boxes": split["boxes"][i],
            "labels": split["labels"][i],
            "image_id": image_id,
            "area": split["area"][i],
            "iscrowd": split["iscrowd"][i],
            **{k: split[k][i] for k in tail},
        }
        for i, image_id in enumerate(host["ids"])
    ]


def _padded_host(t: DB.Targets, counts: list[int], area, ids: list[int], sizes) -> dict:
    """:func:`_padded_device`'s host half: the padded host tensors, the shapes, and each
    row's slot in the padding (``area`` None: the masks' pixels, on the device)."""
    b, n = len(counts), max(counts)
    slot = t.image * n + torch.cat([torch.arange(c) for c in counts] or [torch.zeros(0)]).long()

    def pad(rows: torch.Tensor, value: float) -> torch.Tensor:
        return _pad_rows(rows, slot, b, n, value)

    shapes = {  # on the host (collate_padded's): slicing by them waits for nothing
        "image_sizes": torch.tensor(sizes, dtype=torch.int64).reshape(b, 2),
        "counts": torch.tensor(counts, dtype=torch.int64),
        "image_ids": torch.tensor(ids, dtype=torch.int64),
    }
    host = {
        "valid": torch.arange(n).expand(b, n).lt(torch.tensor(counts)[:, None]),
        "boxes": pad(t.boxes, 0.0),
        "labels": pad(t.labels, -1),
        "iscrowd": pad(t.extras["iscrowd"], 0),
    }
    if t.keypoints is not None:
        host["keypoints"] = pad(t.keypoints, 0.0)
    if area is not None:
        host["area"] = pad(area, 0.0)
    return {"host": host, "shapes": shapes, "slot": slot, "b": b, "n": n}


def _padded_device(host: dict, masks, area, dev) -> dict:
    """:func:`packer.augment.dense_batch.collate_padded`'s dict (plus ``image_ids``):
    the host half moved (one copy per dtype), the masks and their areas padded on the
    device."""
    b, n = host["b"], host["n"]
    result = _moved(host["host"], dev)
    rows = {"area": (area, 0.0), "masks": (masks, 0)}  # on the device, in this order
    slot = None
    for key, (t, value) in rows.items():
        if t is not None:
            slot = to_device(host["slot"], t.device) if slot is None else slot
            result[key] = _pad_rows(t, slot, b, n, value)
    return {**result, **host["shapes"]}


def _pad_rows(rows: torch.Tensor, slot: torch.Tensor, b: int, n: int, value: float):
    """``rows`` [R, ...] at their ``slot`` of a [b, n, ...] padding of ``value``."""
    full = rows.new_full((b * n, *rows.shape[1:]), value)
    full.index_copy_(0, slot, rows)
    return full.view(b, n, *rows.shape[1:])
