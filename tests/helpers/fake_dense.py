"""An in-memory stand-in for ``packer.pack.dense`` (the reading contract of issue 46's
pack storage), for the loader's tests: ``dense_of(pack) -> DenseColumns | None`` and
``decode_masks(masks_rle, size)``.

:func:`install` puts a module of that name in ``sys.modules`` (through pytest's
monkeypatch) whose ``dense_of`` returns the :class:`FakeColumns` registered for a pack
(by its path) and None for any other pack. :func:`make_columns` draws deterministic
annotations for images of given (h, w) sizes: boxes inside the image, labels, iscrowd,
area, keypoints, COCO RLE instance masks (pycocotools), or semantic masks."""

from __future__ import annotations

import types
from typing import Any

import numpy as np
import pytest
from pycocotools import mask as cocomask

from packer.sources.annotations.model import CategoryMap

CATEGORIES = CategoryMap(
    names=("square", "ell", "person"),
    ids=(3, 7, 12),
    keypoints=((), (), ("nose", "left_eye", "right_eye", "left_hand", "right_hand")),
    flip_map=((), (), ((1, 2), (3, 4))),
)
K = 5


class FakeColumns:
    """``DenseColumns``: ``categories``, ``has_masks``, ``has_keypoints``, ``semantic``,
    ``read(indices) -> list[dict]`` (one record per pack row, as the contract says)."""

    def __init__(
        self,
        records: list[dict[str, Any]],
        has_masks: bool,
        has_keypoints: bool,
        semantic: bool,
    ) -> None:
        self.records = records
        self.categories = CATEGORIES
        self.has_masks, self.has_keypoints, self.semantic = has_masks, has_keypoints, semantic
        self.reads: list[list[int]] = []

    def read(self, indices: Any) -> list[dict[str, Any]]:
        idx = [int(i) for i in np.asarray(indices).reshape(-1)]
        self.reads.append(idx)
        return [dict(self.records[i]) for i in idx]


def make_columns(
    sizes: list[tuple[int, int]],
    *,
    masks: bool = True,
    keypoints: bool = True,
    semantic: bool = False,
    seed: int = 0,
) -> FakeColumns:
    """Records for images of ``sizes`` ((h, w) each, the stored sizes): 0 to 4 boxes
    each (image 1 has none), their masks the boxes' pixels."""
    rng = np.random.default_rng(seed)
    records = []
    for i, (h, w) in enumerate(sizes):
        rec: dict[str, Any] = {"image_id": 1000 + i}
        if semantic:
            sem = rng.integers(0, 4, (h, w), dtype=np.uint8)
            sem[-1] = 255
            rec["semantic"] = sem
            records.append(rec)
            continue
        m = 0 if i == 1 else 1 + i % 4
        x = np.sort(rng.uniform(0, w, (m, 2)), 1)
        y = np.sort(rng.uniform(0, h, (m, 2)), 1)
        x[:, 1] = np.maximum(x[:, 1], x[:, 0] + 2).clip(max=w)
        y[:, 1] = np.maximum(y[:, 1], y[:, 0] + 2).clip(max=h)
        boxes = np.stack([x[:, 0], y[:, 0], x[:, 1], y[:, 1]], 1).astype(np.float32)
        rec["boxes"] = boxes.reshape(m, 4)
        rec["labels"] = rng.integers(0, 3, m).astype(np.int64)
        rec["iscrowd"] = (np.arange(m) == 2).astype(np.uint8)
        rec["area"] = ((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])).astype(np.float32)
        if keypoints:
            kp = np.zeros((m, K, 3), np.float32)
            kp[..., 0] = rng.uniform(0, w - 1, (m, K))
            kp[..., 1] = rng.uniform(0, h - 1, (m, K))
            kp[..., 2] = 2
            rec["keypoints"] = kp
        if masks:
            rles = []
            for x1, y1, x2, y2 in boxes.tolist():
                mk = np.zeros((h, w), np.uint8, order="F")
                mk[int(y1) : int(np.ceil(y2)), int(x1) : int(np.ceil(x2))] = 1
                rles.append(cocomask.encode(mk)["counts"])
            rec["masks_rle"] = rles
            rec["size"] = (h, w)
        records.append(rec)
    return FakeColumns(records, masks and not semantic, keypoints and not semantic, semantic)


def decode_masks(masks_rle: list[bytes], size: tuple[int, int]) -> np.ndarray:
    h, w = (int(v) for v in size)
    if not masks_rle:
        return np.zeros((0, h, w), np.uint8)
    rles = [{"size": [h, w], "counts": c} for c in masks_rle]
    return np.ascontiguousarray(cocomask.decode(rles).transpose(2, 0, 1)).astype(np.uint8)


def install(monkeypatch: pytest.MonkeyPatch) -> dict[str, FakeColumns]:
    """Put the fake ``packer.pack.dense`` in ``sys.modules``; returns its registry
    (pack path -> columns): ``registry[str(pack.path)] = make_columns(...)``."""
    import packer.pack.dense as real  # what the pack's own checks use stays the real one

    registry: dict[str, FakeColumns] = {}
    mod = types.ModuleType("packer.pack.dense")
    mod.__getattr__ = lambda name: getattr(real, name)  # type: ignore[method-assign]

    def dense_of(pack: Any) -> FakeColumns | None:
        return registry.get(str(getattr(pack, "path", "")))

    mod.dense_of = dense_of  # type: ignore[attr-defined]
    mod.decode_masks = decode_masks  # type: ignore[attr-defined]
    mod.DenseColumns = FakeColumns  # type: ignore[attr-defined]
    monkeypatch.setitem(__import__("sys").modules, "packer.pack.dense", mod)
    return registry
