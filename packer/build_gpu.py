"""``imgpack build --device cuda``: JPEGs decoded and resized on the GPU in batches.

Called by :mod:`packer.build` in place of its worker pool's decode; everything else
(plan, journal, resume, finalize, rename) is the CPU build's. Per group of chunks:

    read files + classify (threads) --GPU-able JPEGs--> packer.jpeg.decode_batch (nvjpeg)
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

import io
import logging
import os
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from .decode import _EXIF_ORIENTATION, ResizeSpec, jpeg_frame, open_image
from .errors import PackerError
from .format import digest, image_bytes

log = logging.getLogger(__name__)

GROUP_CHUNKS = 4  # chunks (<= 64 images each) decoded as one GPU batch


def _classify(path: str, max_pixels: int) -> tuple[bytes | None, tuple[int, int] | None]:
    """(bytes, (w, h)) of a JPEG the GPU decodes as the CPU path would see it
    (baseline/progressive 8-bit, YCbCr or grey, no EXIF rotation, ending with its EOI
    marker), else (None, None). CMYK fails in nvjpeg; a truncated file decodes there
    without an error (scripts/check_nvjpeg.py, H100, torchvision 0.26)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
        frame = jpeg_frame(data)
        if frame is None or frame[0] not in (0xC0, 0xC1, 0xC2) or frame[1] != 8:
            return None, None
        if not data.endswith(b"\xff\xd9"):  # truncated: batched nvjpeg would not say so
            return None, None
        with open_image(io.BytesIO(data), path) as im:
            if im.mode not in ("RGB", "L") or im.size[0] * im.size[1] > max_pixels:
                return None, None
            if im.getexif().get(_EXIF_ORIENTATION, 1) not in (0, 1):
                return None, None
            return data, im.size
    except Exception:  # anything odd: the CPU path decides, and names the reason
        return None, None


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
    threads: int | None = None,
) -> None:
    """Decode ``chunks`` (chunk, first row, paths) into ``rows_path`` on ``device``,
    calling ``record((chunk, skips, sizes, sha))`` per chunk in order, as the CPU
    workers' ``_decode_chunk`` results are recorded."""
    row = image_bytes(spec.shape)
    io_pool = ThreadPoolExecutor(threads or min(16, os.cpu_count() or 1))
    fd = os.open(rows_path, os.O_WRONLY)
    groups = [chunks[i : i + GROUP_CHUNKS] for i in range(0, len(chunks), GROUP_CHUNKS)]

    def classify(group: list[tuple[int, int, list[str]]]) -> list[Future[Any]]:
        return [io_pool.submit(_classify, p, spec.max_pixels) for c in group for p in c[2]]

    try:
        ahead = classify(groups[0]) if groups else []
        for g, group in enumerate(groups):
            found = [f.result() for f in ahead]
            if g + 1 < len(groups):
                ahead = classify(groups[g + 1])  # the next group's reads overlap this one
            paths = [p for c in group for p in c[2]]
            gpu = [i for i, (d, _) in enumerate(found) if d is not None]
            cpu = [i for i, (d, _) in enumerate(found) if d is None]
            cpu_fut = _submit_cpu(pool, [paths[i] for i in cpu], spec)
            rows = _gpu_rows([found[i][0] for i in gpu], spec, device) if gpu else []
            result: dict[int, tuple[bytes | None, Any]] = {}
            retry = []
            for i, r in zip(gpu, rows):
                if r is None:
                    retry.append(i)
                else:
                    result[i] = (r.tobytes(), found[i][1])
            for i, r in zip(cpu, cpu_fut()):
                result[i] = r
            if retry:  # failed on the GPU: the CPU decides (and names the reason)
                for i, r in zip(retry, _submit_cpu(pool, [paths[i] for i in retry], spec)()):
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
                record((chunk, skips, sizes, digest(mv)))
    finally:
        os.close(fd)
        io_pool.shutdown(wait=True, cancel_futures=True)


def _submit_cpu(
    pool: ProcessPoolExecutor | None, paths: list[str], spec: ResizeSpec
) -> Callable[[], list[tuple[bytes | None, Any]]]:
    """Start decoding ``paths`` on the CPU workers (spread over them); return a getter."""
    from .build import _decode_paths  # in build: the workers import no torch

    if not paths:
        return lambda: []
    if pool is None:
        return lambda: _decode_paths(paths, spec)
    step = max(1, -(-len(paths) // 16))
    futs = [
        pool.submit(_decode_paths, paths[i : i + step], spec) for i in range(0, len(paths), step)
    ]
    return lambda: [r for f in futs for r in f.result()]
