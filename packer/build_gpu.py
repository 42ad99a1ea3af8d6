"""``imgpack build --device cuda``: JPEGs decoded and resized on the GPU in batches.

Called by :mod:`packer.build` in place of its worker pool's decode; everything else
(plan, journal, resume, finalize, rename) is the CPU build's. Per group of chunks:

    CPU workers read + classify files --GPU-able JPEGs--> packer.jpeg.decode_batch (nvjpeg)
        -> pad_batch -> resize_batch (build's --resize boxes) -> pinned host rows
    the rest (PNG, CMYK, 16-bit, EXIF-rotated, arithmetic, corrupt) -> the CPU
        workers' decode (packer.decode, as the CPU build), in parallel
    -> each chunk's rows pwritten into rows.u8, its SHA-256 journaled as the CPU build does

The batched decode and resize are :mod:`packer.jpeg`'s, the JPEG-pack reader's own.
Pixels differ from the CPU path (nvjpeg vs libjpeg without ``draft()``; integer
crop boxes and torch's antialiased bilinear vs Pillow's): the tolerance is measured
by ``tests/test_build_gpu.py`` and recorded in the manifest as ``build.device``.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np
import torch

from .decode import ResizeSpec
from .errors import PackerError
from .format import digest, image_bytes

log = logging.getLogger(__name__)

GROUP_IMAGES = 256  # about this many images (whole chunks) decoded as one GPU batch


def _gpu_rows(
    datas: list[bytes], spec: ResizeSpec, device: torch.device
) -> list[np.ndarray | None]:
    """Decode and fit JPEGs on ``device`` in one batch: uint8 [3, H, W] rows, None for
    one that fails there (the CPU path then decides)."""
    from .jpeg import decode_batch, pad_batch, resize_batch

    tensors = [torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in datas]
    try:
        imgs: list[torch.Tensor | None] = list(decode_batch(tensors, device))
    except PackerError:
        imgs = []
        for t in tensors:
            try:
                imgs.append(decode_batch([t], device)[0])
            except PackerError:
                imgs.append(None)
    ok = [i for i, x in enumerate(imgs) if x is not None]
    rows: list[np.ndarray | None] = [None] * len(datas)
    if not ok:
        return rows
    batch, sizes = pad_batch([imgs[i] for i in ok])  # type: ignore[misc]
    del imgs
    out = resize_batch(batch, sizes, (spec.height, spec.width), mode=spec.mode)
    host = torch.empty(out.shape, dtype=torch.uint8, pin_memory=device.type == "cuda")
    host.copy_(out, non_blocking=True)
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()
    arr = host.numpy()
    for j, i in enumerate(ok):
        rows[i] = arr[j]
    return rows


def decode_chunks_batched(
    chunks: list[tuple[int, int, list[str]]],
    spec: ResizeSpec,
    rows_path: str,
    device: torch.device,
    pool: ProcessPoolExecutor | None,
    record: Callable[[tuple[Any, ...]], None],
    after_submit: Callable[[], None] = lambda: None,
    ahead: int = 2,
) -> None:
    """Decode ``chunks`` (chunk, first row, paths) into ``rows_path`` on ``device``,
    calling ``record((chunk, skips, sizes, sha, None))`` per chunk in order, as the CPU
    workers' ``_decode_chunk`` results are recorded (None: no worker time split).
    ``after_submit()`` runs once the first reads are queued, before the first record
    (the build writes its plan there, while the workers read).

    The CPU workers read every file and classify it (``build_workers._read_for_gpu``), decoding
    themselves what the GPU cannot take; ``ahead`` groups are in flight there while
    this process decodes the current group's JPEGs on the GPU.
    """
    row = image_bytes(spec.shape)
    fd = os.open(rows_path, os.O_WRONLY)
    per = max(1, GROUP_IMAGES // max(1, len(chunks[0][2]))) if chunks else 1
    groups = [chunks[i : i + per] for i in range(0, len(chunks), per)]
    queue = [_submit_read(pool, [p for c in g for p in c[2]], spec) for g in groups[:ahead]]
    after_submit()
    try:
        for g, group in enumerate(groups):
            found = queue.pop(0)()
            if g + ahead < len(groups):
                nxt = groups[g + ahead]
                queue.append(_submit_read(pool, [p for c in nxt for p in c[2]], spec))
            paths = [p for c in group for p in c[2]]
            gpu = [i for i, f in enumerate(found) if f[0] == "jpeg"]
            rows = _gpu_rows([found[i][1] for i in gpu], spec, device) if gpu else []
            result: dict[int, tuple[bytes | None, Any]] = {}
            retry = []
            for i, f in enumerate(found):
                if f[0] == "row":
                    result[i] = (f[1], f[2])
                elif f[0] == "skip":
                    result[i] = (None, f[1])
            for i, r in zip(gpu, rows):
                if r is None:
                    retry.append(i)
                else:
                    result[i] = (r.tobytes(), found[i][2])
            if retry:  # failed on the GPU: the CPU decides (and names the reason)
                redo = _submit_cpu(pool, [paths[i] for i in retry], spec)()
                for i, r in zip(retry, redo):
                    result[i] = r
            k = 0
            for chunk, start, cpaths in group:
                buf = bytearray(len(cpaths) * row)
                skips: list[list[Any]] = []
                sizes: list[list[int]] = []
                for j in range(len(cpaths)):
                    data, info = result[k + j]
                    if data is None:
                        skips.append([start + j, info])
                        sizes.append([0, 0])
                    else:
                        buf[j * row : (j + 1) * row] = data
                        sizes.append([int(info[0]), int(info[1])])
                k += len(cpaths)
                mv, done = memoryview(buf), 0
                while done < len(mv):
                    done += os.pwrite(fd, mv[done:], start * row + done)
                record((chunk, skips, sizes, digest(mv), None))
    finally:
        os.close(fd)
        for get in queue:  # an error: let the reads in flight finish before returning
            with contextlib.suppress(Exception):
                get()


def _spread(pool: ProcessPoolExecutor | None, fn: Any, paths: list[str], spec: ResizeSpec):
    if not paths:
        return lambda: []
    if pool is None:
        return lambda: fn(paths, spec)
    step = max(1, -(-len(paths) // 16))
    futs = [pool.submit(fn, paths[i : i + step], spec) for i in range(0, len(paths), step)]
    return lambda: [r for f in futs for r in f.result()]


def _submit_read(
    pool: ProcessPoolExecutor | None, paths: list[str], spec: ResizeSpec
) -> Callable[[], list[tuple[str, Any, Any]]]:
    """Start reading/classifying ``paths`` on the CPU workers; return a getter."""
    from .build_workers import _read_for_gpu  # the workers import no torch

    return _spread(pool, _read_for_gpu, paths, spec)


def _submit_cpu(
    pool: ProcessPoolExecutor | None, paths: list[str], spec: ResizeSpec
) -> Callable[[], list[tuple[bytes | None, Any]]]:
    """Start decoding ``paths`` on the CPU workers (spread over them); return a getter."""
    from .build_workers import _decode_paths

    return _spread(pool, _decode_paths, paths, spec)
