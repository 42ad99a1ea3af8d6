"""``imgpack info`` of a pack with dense targets (issue 46.6): instances per category,
boxes per image, crowd and keypoint instances, and the semantic masks' pixel classes.

Numpy only (``imgpack info`` imports no torch): the dense files are mapped through
:class:`~packer.pack.dense._PackDense`, checked as every reader checks them. A pack set
is summed over its shards (each shard's manifest checked against the set's index).

The pixel histogram of semantic masks reads at most ``sample`` images
(:data:`DEFAULT_SAMPLE`; 0: every image), spread evenly over the pack (or set) in
pack order, so the same pack gives the same figures; ``semantic.images`` says how many
were read.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from .dense import DEFAULT_MAX_INSTANCES, DenseRecord, _PackDense

DEFAULT_SAMPLE = 1000  # images whose semantic masks the histogram reads (0: all)


def _parts(path: Path) -> tuple[list[tuple[Path, Any]], DenseRecord | None]:
    """(folder, manifest) of the pack, or of each shard of a set, and the first dense
    record (None: the pack holds no dense targets)."""
    from .describe import is_pack
    from .files import read_manifest
    from .index import read_index, read_shard_manifest

    if is_pack(path):
        parts = [(path, read_manifest(path))]
    else:
        index = read_index(path)
        parts = [(path / e.name, read_shard_manifest(path, e, index)) for e in index.shards]
    recs = [getattr(m, "dense", None) for _, m in parts]
    first = next((r for r in recs if r is not None), None)
    return parts, first


def _spread(n: int, sample: int) -> np.ndarray:
    """``sample`` indices of ``0..n-1`` spread evenly (all of them when sample is 0 or
    at least n)."""
    if sample <= 0 or sample >= n:
        return np.arange(n, dtype=np.int64)
    return np.unique(np.linspace(0, n - 1, sample).round().astype(np.int64))


def dense_summary(path: str | os.PathLike[str], sample: int = DEFAULT_SAMPLE) -> dict | None:
    """The dense targets' counts of the pack or set at ``path``, as ``imgpack info
    --json`` prints them under ``"dense"``; None for a pack without dense targets.

    Keys: ``images``, ``instances``, ``categories`` ({name: instances}),
    ``boxes_per_image`` ({min, median, max}), ``crowd``, ``keypoint_instances``
    (instances with a visible or labelled keypoint), ``masks`` (instance masks
    stored), ``dropped`` (boxes the build's resize left outside the image) and
    ``semantic``: None, or ``{images, of, ignore_index, ignore_share, classes:
    {name: share}}`` (shares of the pixels read; a pixel value not in the category
    map is named by its value)."""
    root = Path(path)
    parts, rec = _parts(root)
    if rec is None:
        return None
    cats = rec.categories
    names = list(cats.names)
    per_cat = np.zeros(len(names), dtype=np.int64)
    per_image: list[np.ndarray] = []
    crowd = kp_inst = instances = dropped = 0
    opened: list[_PackDense] = []
    for folder, m in parts:
        d = _PackDense(folder, m, DEFAULT_MAX_INSTANCES)
        opened.append(d)
        labels = np.asarray(d.labels)
        instances += int(labels.shape[0])
        per_cat += np.bincount(labels, minlength=len(names))[: len(names)]
        per_image.append(np.diff(d.offsets))
        crowd += int(np.count_nonzero(np.asarray(d.iscrowd)))
        if d.keypoints is not None and d.keypoints.shape[0]:
            kp_inst += int(np.count_nonzero((np.asarray(d.keypoints)[:, :, 2] > 0).any(axis=1)))
        dropped += m.dense.dropped
    counts = np.concatenate(per_image) if per_image else np.zeros(0, np.int64)
    n = int(counts.shape[0])
    boxes = (
        {"min": int(counts.min()), "median": float(np.median(counts)), "max": int(counts.max())}
        if n
        else {"min": 0, "median": 0.0, "max": 0}
    )
    return {
        "images": n,
        "instances": instances,
        "categories": dict(zip(names, per_cat.tolist())),
        "boxes_per_image": boxes,
        "crowd": crowd,
        "keypoint_instances": kp_inst,
        "masks": bool(rec.masks),
        "dropped": dropped,
        "semantic": _semantic(opened, rec, sample) if rec.semantic else None,
    }


def _semantic(parts: list[_PackDense], rec: DenseRecord, sample: int) -> dict[str, Any]:
    """The pixel-class histogram over ``sample`` images spread over the parts."""
    sizes = [p.rec.count for p in parts]
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    n = int(starts[-1])
    hist = np.zeros(256, dtype=np.int64)
    picked = _spread(n, sample)
    for g in picked.tolist():
        k = int(np.searchsorted(starts, g, side="right") - 1)
        p, i = parts[k], g - int(starts[k])
        if p.semantic is not None:
            mask = np.asarray(p.semantic[i])
        else:
            h, w = int(p.frames[i, 0]), int(p.frames[i, 1])
            mask = p._png(i, h, w)
        hist += np.bincount(mask.reshape(-1), minlength=256)
    total = int(hist.sum())
    ign = rec.ignore_index
    by_id = dict(zip(rec.categories.ids, rec.categories.names))
    classes = {}
    for v in np.flatnonzero(hist).tolist():
        if v != ign:
            classes[str(by_id.get(v, v))] = hist[v] / total
    return {
        "images": int(picked.shape[0]),
        "of": n,
        "ignore_index": ign,
        "ignore_share": float(hist[ign] / total) if total else 0.0,
        "classes": {k: float(v) for k, v in classes.items()},
    }
