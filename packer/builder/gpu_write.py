"""The GPU build's write side: a group's resized rows copied into reused pinned buffers
(:class:`HostRows`), then each chunk pwritten into the rows file and hashed.

Used by :mod:`packer.builder.gpu`'s pipeline: :func:`resize_to_host` on its main thread,
:func:`write_group` on its writer threads.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import queue
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..imaging.decode import ResizeSpec
from ..pack.writer import digest


def write_group(
    fd: int,
    row: int,
    group: list[tuple[int, int, list[str]]],
    at: dict[int, int],
    sizes: dict[int, tuple[int, int]],
    host: torch.Tensor | None,
    copied: Any,
    cpu: list[tuple[list[int], Callable[[], list[tuple[bytes | None, Any]]]]],
    writeback: Any,
    release: Callable[[], None] = lambda: None,
) -> list[tuple[Any, ...]]:
    """In a writer thread: each chunk of a group into its place in the rows file, hashed;
    returns the chunks' results in order (as the CPU workers' ``_decode_chunk``).

    ``at``: position in the group -> row of ``host`` (the GPU's rows, pinned, valid once
    ``copied`` has completed), with the source's (w, h) in ``sizes``. Every other
    position is in one of ``cpu``'s (positions, getter) pairs: the CPU build's decode,
    (row bytes, (w, h)) or (None, reason: a skip). A chunk made only of GPU rows is
    written straight from ``host``. ``release()`` hands ``host`` back for reuse once it
    is written (or the write failed).
    """
    try:
        if copied is not None:
            copied.synchronize()
        arr = host.numpy().reshape(len(host), row) if host is not None else None
        other = {i: res for where, get in cpu for i, res in zip(where, get())}
        out = []
        k = 0
        for chunk, start, cpaths in group:
            n = len(cpaths)
            skips: list[list[Any]] = []
            wh: list[list[int]] = []
            first = at.get(k)
            if (
                arr is not None
                and first is not None
                and all(at.get(k + j) == first + j for j in range(n))
            ):
                mv = memoryview(arr[first : first + n]).cast("B")
                wh = [list(sizes[k + j]) for j in range(n)]
            else:
                buf = np.zeros((n, row), dtype=np.uint8)
                for j in range(n):
                    i = k + j
                    if i in at and arr is not None:  # decoded on the GPU
                        buf[j], info = arr[at[i]], sizes[i]
                    else:  # the CPU build's decode decided
                        data, info = other[i]
                        if data is None:  # unreadable or broken, with its reason
                            skips.append([start + j, info])
                            wh.append([0, 0])
                            continue
                        buf[j] = np.frombuffer(data, dtype=np.uint8)
                    wh.append([int(info[0]), int(info[1])])
                mv = memoryview(buf).cast("B")
            done = 0
            while done < len(mv):
                done += os.pwrite(fd, mv[done:], start * row + done)
            sha = digest(mv)
            if writeback is not None:  # start writing it to disk now: a short final fsync
                writeback(fd, ctypes.c_int64(start * row), ctypes.c_int64(len(mv)), 2)
            out.append((chunk, skips, wh, sha, None))
            k += n
        return out
    finally:
        release()


class HostRows:
    """Pinned host buffers for the groups' resized rows, reused (at most ``most``, of at
    least ``least`` rows each): a fresh 50 MB pinned allocation per group costs more than
    its crop."""

    def __init__(self, row: int, pinned: bool, most: int, least: int) -> None:
        self.row, self.pinned = row, pinned
        self.most, self.least = most, least
        self.free: queue.SimpleQueue[torch.Tensor] = queue.SimpleQueue()
        self.made = 0

    def take(self, n: int) -> torch.Tensor:
        """A buffer of at least ``n`` rows; when all are in use, waits for a writer to
        hand one back."""
        buf = None
        if self.made < self.most:
            with contextlib.suppress(queue.Empty):
                buf = self.free.get_nowait()
        else:
            buf = self.free.get()  # all in use: wait for a writer to finish one
        if buf is not None and len(buf) >= n:
            return buf
        if buf is None:
            self.made += 1
        shape = (max(n, self.least), self.row)
        return torch.empty(shape, dtype=torch.uint8, pin_memory=self.pinned)

    def releaser(self, buf: torch.Tensor | None) -> Callable[[], None]:
        """What hands ``buf`` back once its group is written."""
        return functools.partial(self.free.put, buf) if buf is not None else lambda: None


def resize_to_host(
    imgs: list[torch.Tensor | None],
    spec: ResizeSpec,
    stream: Any,
    host_rows: HostRows,
) -> tuple[torch.Tensor, Any, torch.Tensor]:
    """A group's decoded JPEGs (None: refused) resized in one kernel on ``stream``, their
    copy into a pinned buffer started: (the rows in it, the copy's event or None on the
    CPU, the buffer)."""
    from ..imaging.jpeg import resize_images

    cuda = stream is not None
    copied = None
    with torch.cuda.stream(stream) if cuda else contextlib.nullcontext():
        rows = resize_images(
            [x for x in imgs if x is not None], (spec.height, spec.width), mode=spec.mode
        )
        buf = host_rows.take(len(rows))
        host = buf[: len(rows)].view(rows.shape)
        host.copy_(rows, non_blocking=cuda)
        if cuda:
            copied = torch.cuda.Event()
            copied.record(stream)
    return host, copied, buf
