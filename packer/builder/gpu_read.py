"""The GPU build's readers: each file of a group read once and classified from its
header bytes; the JPEGs the GPU takes as they are go on to its batch decode, the rest
(and what nvjpeg refuses) to the CPU workers' decode, started at once.

Used by :mod:`packer.builder.gpu`'s pipeline, on its reader threads.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any, NamedTuple

import numpy as np
import torch

from .._fs import NotRegularFile, open_fd_if_regular
from ..imaging.decode import ResizeSpec
from ..imaging.jpeg_header import plain_jpeg_size

# the CPU build's decode of some paths, started: its results' getter, per path
# (row bytes, (w, h)), or (None, reason) for a skip
CpuDecode = Callable[[list[str]], Callable[[], list[tuple[bytes | None, Any]]]]


class GroupRead(NamedTuple):
    """A group's files as a reader thread left them (positions in the group)."""

    gpu: list[int]  # the JPEGs for the GPU,
    datas: list[torch.Tensor]  # their bytes (uint8),
    sizes: list[tuple[int, int]]  # their (w, h);
    cpu: list[int]  # the rest, for the CPU build's decode,
    decoded: Callable[[], list[tuple[bytes | None, Any]]]  # its results' getter


def _read_whole(path: str) -> np.ndarray | None:
    """A regular file's bytes (uint8), or None where it cannot be read whole at once
    (gone, unreadable, not a regular file, changing size): the CPU build's decode then
    names the reason. A bare descriptor (:func:`packer._fs.open_fd_if_regular`) and
    memory nothing zeroes first: the readers' time with the GIL is what paces them,
    and a file object and a zeroed buffer took a third of it (docs/PERFORMANCE.md,
    section "Figures behind the code", row "GPU build's reader")."""
    try:
        fd, st = open_fd_if_regular(path)
    except (OSError, NotRegularFile):
        return None
    try:
        buf = np.empty(st.st_size + 1, dtype=np.uint8)  # a byte more: a file that grew shows
        n = os.readv(fd, [buf])
    except OSError:
        return None
    finally:
        os.close(fd)
    return buf[:n] if n == st.st_size else None


def read_group(
    paths: list[str],
    max_pixels: int,
    cpu_decode: CpuDecode,
) -> GroupRead:
    """In a reader thread: each file read once and classified from those bytes (what
    the GPU decodes is what was classified: no second read, no race). The JPEGs the
    GPU takes as they are (:func:`packer.imaging.jpeg_header.plain_jpeg_size`) go to the decoder;
    the CPU build's decode of the rest (``cpu_decode``: on the CPU workers) starts now,
    so it runs beside the GPU's."""
    gpu: list[int] = []
    datas: list[torch.Tensor] = []
    sizes: list[tuple[int, int]] = []
    cpu: list[int] = []
    for i, p in enumerate(paths):
        data = _read_whole(p)
        size = None if data is None else plain_jpeg_size(memoryview(data), max_pixels)
        if size is None or data is None:
            cpu.append(i)
            continue
        gpu.append(i)
        datas.append(torch.from_numpy(data))
        sizes.append(size)
    decoded = cpu_decode([paths[i] for i in cpu]) if cpu else list
    return GroupRead(gpu, datas, sizes, cpu, decoded)


def group_paths(group: list[tuple[int, int, list[str]]]) -> list[str]:
    """The paths of a group's chunks, in row order."""
    return [p for c in group for p in c[2]]


def _spread(pool: ProcessPoolExecutor | None, fn: Any, paths: list[str], spec: ResizeSpec):
    if not paths:
        return lambda: []
    if pool is None:
        return lambda: fn(paths, spec)
    step = max(1, -(-len(paths) // 16))
    futs = [pool.submit(fn, paths[i : i + step], spec) for i in range(0, len(paths), step)]
    return lambda: [r for f in futs for r in f.result()]


def submit_cpu(
    pool: ProcessPoolExecutor | None, paths: list[str], spec: ResizeSpec
) -> Callable[[], list[tuple[bytes | None, Any]]]:
    """Start decoding ``paths`` on the CPU workers (spread over them); return a getter."""
    from .workers import _decode_paths

    return _spread(pool, _decode_paths, paths, spec)
