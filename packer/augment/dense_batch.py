"""Batches of augmented :class:`~packer.augment.dense_kernels.Sample`s, in the two shapes
detection and segmentation models take.

- :func:`detection_targets`: per image a dict as torchvision's detection models and
  references expect (``boxes`` float32 [M, 4] XYXY, ``labels`` int64 [M], ``masks``
  uint8 [M, H, W], ``keypoints`` float32 [M, K, 3], ``image_id``, ``area`` float32 [M],
  ``iscrowd`` int64 [M]), beside the list of images [C, H, W];
- :func:`collate_padded` (``targets="padded"``): one padded batch with counts, for
  models that take fixed shapes: images padded to the largest (optionally a multiple
  of 32), boxes [B, N, 4] and labels [B, N] padded to the most boxes, ``counts`` [B],
  ``valid`` [B, N], masks, keypoints and semantic masks padded likewise.

Everything ends on the images' device (host targets, boxes and the like left on the
CPU by the dense pass, are moved there: :func:`on_device`, one copy per dtype), but for
a padded batch's shapes: ``image_sizes`` and ``counts`` (and the loader's ``image_ids``)
stay on the host, as torchvision's ``ImageList.image_sizes``, so cutting the batch into
images and their boxes by them makes the host wait for nothing. Shapes come from the
host, so nothing here makes the host wait for the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
import torch.nn.functional as nnf

from ..imaging.resize import ArgumentError, to_device
from .dense_kernels import Sample

_TARGETS = ("boxes", "labels", "keypoints")


def on_device(samples: Sequence[Sample], device: torch.device) -> list[Sample]:
    """``samples`` with their host targets (boxes, labels, keypoints, extras on the
    CPU beside images elsewhere) on ``device``: all of one dtype in one copy that does
    not make the host wait (pinned), each field a view of it."""
    samples = list(samples)
    if device.type == "cpu":
        return samples
    groups: dict[torch.dtype, list[torch.Tensor]] = {}
    for s in samples:
        for t in (*(getattr(s, f) for f in _TARGETS), *s.extras.values()):
            if t is not None and t.device != device:
                groups.setdefault(t.dtype, []).append(t)
    moved: dict[int, torch.Tensor] = {}
    for ts in groups.values():
        flat = to_device(torch.cat([t.reshape(-1) for t in ts]), device)
        for t, part in zip(ts, flat.split([t.numel() for t in ts])):
            moved[id(t)] = part.view(t.shape)
    if not moved:
        return samples

    def get(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else moved.get(id(t), t)

    return [
        replace(
            s,
            **{f: get(getattr(s, f)) for f in _TARGETS},
            extras={k: get(v) for k, v in s.extras.items()},
        )
        for s in samples
    ]


def _check(samples: Sequence[Sample], where: str) -> None:
    if not samples or not all(isinstance(s, Sample) for s in samples):
        raise ArgumentError(f"{where}: takes a non-empty list of packer.augment.dense.Sample")
    devices = {s.image.device for s in samples}
    if len(devices) > 1:
        raise ArgumentError(f"{where}: samples on several devices: {sorted(map(str, devices))}")
    channels = {s.image.shape[0] for s in samples}
    if len(channels) > 1:
        raise ArgumentError(f"{where}: images of {sorted(channels)} channels in one batch")


def area(s: Sample) -> torch.Tensor:
    """float32 [M]: each instance mask's pixel count where the sample has masks (COCO's
    segment area), else each box's width x height."""
    if s.masks is not None:
        return s.masks.flatten(1).sum(1, dtype=torch.int64).to(torch.float32)
    if s.boxes is None:
        raise ArgumentError("area: the sample has neither masks nor boxes")
    b = s.boxes
    return (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])


def detection_target(s: Sample, image_id: int, areas: torch.Tensor | None = None) -> dict:
    """One image's target dict as torchvision's detection models take it (``areas``:
    its ``area`` when known, else :func:`area`)."""
    if s.boxes is None or s.labels is None:
        raise ArgumentError("detection_target: the sample needs boxes and labels")
    m = s.boxes.shape[0]
    iscrowd = s.extras.get("iscrowd")
    target = {
        "boxes": s.boxes,
        "labels": s.labels.to(torch.int64),
        "image_id": int(image_id),
        "area": area(s) if areas is None else areas,
        "iscrowd": (
            iscrowd.to(torch.int64)
            if iscrowd is not None
            else torch.zeros(m, dtype=torch.int64, device=s.boxes.device)
        ),
    }
    if s.masks is not None:
        target["masks"] = s.masks
    if s.keypoints is not None:
        target["keypoints"] = s.keypoints
    return target


def detection_targets(
    samples: Sequence[Sample], image_ids: Sequence[int] | None = None
) -> tuple[list[torch.Tensor], list[dict]]:
    """(images, targets): the list of uint8 images [C, H, W] (sizes may differ; the
    models' transform batches them) and one :func:`detection_target` each. ``image_ids``
    default to 0..B-1."""
    _check(samples, "detection_targets")
    ids = range(len(samples)) if image_ids is None else image_ids
    if len(ids) != len(samples):
        raise ArgumentError(f"detection_targets: {len(ids)} image_ids for {len(samples)} samples")
    return [s.image for s in samples], [detection_target(s, i) for s, i in zip(samples, ids)]


def _pad_to(t: torch.Tensor, h: int, w: int, value: float) -> torch.Tensor:
    return nnf.pad(t, [0, w - t.shape[-1], 0, h - t.shape[-2]], value=float(value))


def _stack_padded(rows: list[torch.Tensor], n: int, value: float) -> torch.Tensor:
    """[M_i, ...] tensors into [B, n, ...], rows beyond M_i ``value``."""
    out = rows[0].new_full((len(rows), n, *rows[0].shape[1:]), value)
    for i, r in enumerate(rows):
        out[i, : r.shape[0]] = r
    return out


def collate_padded(
    samples: Sequence[Sample],
    size_divisible: int = 1,
    fill: int = 0,
    label_pad: int = -1,
    semantic_fill: int = 255,
) -> dict[str, torch.Tensor]:
    """One padded batch (``targets="padded"``).

    Returns ``images`` uint8 [B, C, H, W] (bottom/right padded with ``fill`` to the
    largest image, rounded up to ``size_divisible``), ``image_sizes`` int64 [B, 2] (h, w
    before padding) and ``counts`` int64 [B], both on the host (the shapes: slicing by
    them makes no host wait), ``valid`` bool [B, N] (N = the most
    instances), ``boxes`` float32 [B, N, 4] (zeros beyond a count), ``labels`` int64
    [B, N] (``label_pad``), and, where every sample has them, ``masks`` uint8 [B, N, H,
    W], ``keypoints`` float32 [B, N, K, 3] (zeros), ``semantic`` uint8 [B, H, W]
    (``semantic_fill``, the ignore value, outside each image), extras [B, N, ...].
    """
    _check(samples, "collate_padded")
    if (
        isinstance(size_divisible, bool)
        or not isinstance(size_divisible, int)
        or size_divisible < 1
    ):
        raise ArgumentError(
            f"collate_padded: size_divisible must be a positive int, not {size_divisible!r}"
        )
    d = size_divisible
    hmax = -(-max(s.size[0] for s in samples) // d) * d
    wmax = -(-max(s.size[1] for s in samples) // d) * d
    dev = samples[0].image.device
    out: dict[str, torch.Tensor] = {
        "images": torch.stack([_pad_to(s.image, hmax, wmax, fill) for s in samples]),
    }
    shapes = {"image_sizes": torch.tensor([s.size for s in samples], dtype=torch.int64)}
    if all(s.semantic is not None for s in samples):
        out["semantic"] = torch.stack(
            [_pad_to(s.semantic, hmax, wmax, semantic_fill) for s in samples]
        )
    counts = [s.count for s in samples]
    if any(c is None for c in counts):
        if any(c is not None for c in counts):
            raise ArgumentError("collate_padded: some samples have instances and some none")
        return {**_moved(out, dev), **shapes}
    n = max(counts)
    shapes["counts"] = torch.tensor(counts, dtype=torch.int64)
    out["valid"] = torch.arange(n).expand(len(samples), n).lt(torch.tensor(counts)[:, None])
    if all(s.boxes is not None for s in samples):
        out["boxes"] = _stack_padded([s.boxes for s in samples], n, 0.0)
    if all(s.labels is not None for s in samples):
        out["labels"] = _stack_padded([s.labels.to(torch.int64) for s in samples], n, label_pad)
    if all(s.masks is not None for s in samples):
        out["masks"] = _stack_padded([_pad_to(s.masks, hmax, wmax, 0) for s in samples], n, 0)
    if all(s.keypoints is not None for s in samples):
        ks = {s.keypoints.shape[1] for s in samples}
        if len(ks) > 1:
            raise ArgumentError(f"collate_padded: keypoints of {sorted(ks)} points in one batch")
        out["keypoints"] = _stack_padded([s.keypoints for s in samples], n, 0.0)
    for key in samples[0].extras:
        if all(key in s.extras for s in samples):
            out[key] = _stack_padded([s.extras[key] for s in samples], n, 0)
    return {**_moved(out, dev), **shapes}


def _moved(out: dict[str, torch.Tensor], dev: torch.device) -> dict[str, torch.Tensor]:
    """Every tensor of ``out`` on ``dev``; those made on the host (``valid``, host
    targets padded there) copied without making the host wait."""
    return {k: to_device(v, dev) for k, v in out.items()}
