"""Writing a pack's dense columns (:mod:`packer.pack.dense` has the format):
:class:`DenseArrays` (the columns of N images before they are written), :func:`write_dense`
(each file written under a temporary name and renamed into place, its size and SHA-256
in the returned :class:`~packer.pack.dense_record.DenseRecord`), :func:`encode_png`
(a semantic mask beside JPEG files).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._fs import write_atomic
from .dense_record import (
    AREA,
    BOXES,
    FRAMES,
    IMAGE_IDS,
    ISCROWD,
    KEYPOINTS,
    LABELS,
    OFFSETS,
    PNG,
    PNG_OFFSETS,
    RLE,
    RLE_OFFSETS,
    SEMANTIC,
    DenseRecord,
    _sha,
)


@dataclass
class DenseArrays:
    """The columns of N images, in pack order, before they are written (the build's
    :mod:`packer.builder.dense` fills them). ``masks``: M RLE counts (or None);
    ``semantic``: N uint8 [h, w] arrays (or None)."""

    offsets: np.ndarray  # int64 [N+1]
    frames: np.ndarray  # int64 [N, 2]
    image_ids: np.ndarray  # int64 [N]
    boxes: np.ndarray  # float32 [M, 4]
    labels: np.ndarray  # int64 [M]
    iscrowd: np.ndarray  # uint8 [M]
    area: np.ndarray  # float32 [M]
    keypoints: np.ndarray | None = None  # float32 [M, K, 3]
    masks: list[bytes] | None = None
    semantic: list[np.ndarray] | None = None


def _ragged(items: Sequence[bytes]) -> tuple[np.ndarray, bytes]:
    lengths = np.fromiter((len(b) for b in items), dtype=np.int64, count=len(items))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype("<i8")
    return offsets, b"".join(items)


def encode_png(mask: np.ndarray) -> bytes:
    """A uint8 [h, w] mask as a grey PNG (deterministic bytes)."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(mask, dtype=np.uint8), mode="L").save(buf, "PNG")
    return buf.getvalue()


def write_dense(
    data_dir: Path,
    cols: DenseArrays,
    categories: Any,
    *,
    semantic: str | None,
    ignore_index: int = 255,
    dropped: int = 0,
    source: Mapping[str, Any] | None = None,
) -> DenseRecord:
    """Write ``cols`` into ``data_dir`` (each file whole or not at all) and return the
    manifest's record of them. ``semantic``: how semantic masks are stored beside this
    pack's images (``"rows"`` [N, H, W] or ``"png"``; the kind's answer), None for none."""
    n = int(cols.frames.shape[0])
    m = int(cols.boxes.shape[0])
    blobs: dict[str, bytes] = {
        OFFSETS: np.ascontiguousarray(cols.offsets, "<i8").tobytes(),
        FRAMES: np.ascontiguousarray(cols.frames, "<i8").tobytes(),
        IMAGE_IDS: np.ascontiguousarray(cols.image_ids, "<i8").tobytes(),
        BOXES: np.ascontiguousarray(cols.boxes, "<f4").tobytes(),
        LABELS: np.ascontiguousarray(cols.labels, "<i8").tobytes(),
        ISCROWD: np.ascontiguousarray(cols.iscrowd, np.uint8).tobytes(),
        AREA: np.ascontiguousarray(cols.area, "<f4").tobytes(),
    }
    k = 0
    if cols.keypoints is not None:
        k = int(cols.keypoints.shape[1])
        blobs[KEYPOINTS] = np.ascontiguousarray(cols.keypoints, "<f4").tobytes()
    if cols.masks is not None:
        off, data = _ragged(cols.masks)
        blobs[RLE_OFFSETS], blobs[RLE] = off.tobytes(), data
    sem_store = None
    if cols.semantic is not None:
        sem_store = semantic or "rows"
        if sem_store == "rows":
            blobs[SEMANTIC] = b"".join(
                np.ascontiguousarray(s, np.uint8).tobytes() for s in cols.semantic
            )
        else:
            off, data = _ragged([encode_png(s) for s in cols.semantic])
            blobs[PNG_OFFSETS], blobs[PNG] = off.tobytes(), data
    files = {}
    for name, data in blobs.items():
        write_atomic(Path(data_dir) / name, data)
        files[name] = (len(data), _sha(data))
    return DenseRecord(
        categories=categories,
        count=n,
        instances=m,
        keypoints=k,
        masks=cols.masks is not None,
        semantic=sem_store,
        ignore_index=ignore_index,
        dropped=dropped,
        files=files,
        source=dict(source or {}),
    )
