"""``imgpack build --device cuda``: JPEGs decoded and resized on the GPU in batches.

Called by :mod:`packer.build` in place of its worker pool's decode; everything else
(plan, journal, resume, finalize, rename) is the CPU build's. Per group of chunks:

    CPU workers read + classify files --GPU-able JPEGs: length + SHA-256-->
        reader threads read them again (page cache) -> packer.jpeg.decode_batch (nvjpeg)
        -> packer.jpeg.resize_images (build's --resize boxes) -> pinned host rows (reused)
    the rest (PNG, CMYK, 16-bit, EXIF-rotated, arithmetic, corrupt) -> the CPU
        workers' decode (packer.decode, as the CPU build), in parallel
    -> each chunk's rows pwritten into rows.u8, its SHA-256 journaled as the CPU build does

The batched decode and resize are :mod:`packer.jpeg`'s, the JPEG-pack reader's own.
Pixels differ from the CPU path (nvjpeg vs libjpeg without ``draft()``; integer
crop boxes and torch's antialiased bilinear vs Pillow's): the tolerance is measured
by ``tests/test_build_gpu.py`` and recorded in the manifest as ``build.device``.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import functools
import logging
import os
import queue
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from .build_workers import _writeback_fn
from .decode import ResizeSpec, open_regular
from .errors import DecodeError, PackerError
from .format import digest, image_bytes

log = logging.getLogger(__name__)

GROUP_IMAGES = 256  # about this many images (whole chunks) decoded as one GPU batch
_WRITERS = 4  # threads writing and hashing finished groups (pwrite and SHA-256 free the GIL)
_READERS = 4  # parent threads rereading and hashing the JPEGs (read and SHA-256 free the GIL)
_READ_AHEAD = 6  # groups being read and classified by the CPU workers ahead of the decode


def _read_files(paths: list[str], seen: list[tuple[int, str]]) -> list[torch.Tensor | None]:
    """In a reader thread: each JPEG the workers classified, read again (from the page
    cache) into a uint8 tensor of its own; None where it is no longer the file they saw
    (``seen``: its length and SHA-256; changed, gone): the CPU path then decides."""
    out: list[torch.Tensor | None] = []
    for p, (n, sha) in zip(paths, seen):
        buf = bytearray(max(n, 4))
        try:
            with open_regular(p) as f:
                ok = f.readinto(buf) == n and not f.read(1)  # the whole file, no more
        except (DecodeError, OSError):
            ok = False
        ok = ok and n >= 4 and buf[-2:] == b"\xff\xd9" and digest(buf) == sha
        out.append(torch.frombuffer(buf, dtype=torch.uint8) if ok else None)
    return out


def _decode_list(
    datas: Future[list[torch.Tensor | None]], device: torch.device
) -> list[torch.Tensor | None]:
    """In the decoder thread: the JPEGs ``datas`` reads, decoded in one batch; per image
    the image, or None for one that fails to read or decode (the CPU path then decides,
    and names the reason)."""
    from .jpeg import decode_batch

    files = datas.result()
    imgs: list[torch.Tensor | None] = [None] * len(files)
    have = [i for i, d in enumerate(files) if d is not None]
    tensors = [files[i] for i in have]
    if not tensors:
        return imgs
    try:
        for i, img in zip(have, decode_batch(tensors, device, ends_checked=True)):
            imgs[i] = img
    except PackerError:
        for i, t in zip(have, tensors):
            with contextlib.suppress(PackerError):
                imgs[i] = decode_batch([t], device, ends_checked=True)[0]
    return imgs


def _warm_up(device: torch.device, spec: ResizeSpec) -> None:
    """On a thread of its own while the workers read the first groups: the CUDA context,
    nvjpeg and the crop kernel (loaded, or compiled for an image 1.5x the output, the
    typical scale), which take seconds in a fresh process."""
    from torchvision.io import encode_jpeg

    from .jpeg import decode_batch, resize_images

    h, w = spec.height, spec.width
    data = encode_jpeg(torch.zeros((3, h * 3 // 2, w * 3 // 2), dtype=torch.uint8))
    with torch.cuda.device(device):
        imgs = decode_batch([data, data], device, ends_checked=True)
        resize_images(imgs, (h, w), mode=spec.mode)
        torch.cuda.synchronize(device)


def _write_group(
    fd: int,
    row: int,
    group: list[tuple[int, int, list[str]]],
    found: list[tuple[str, Any, Any]],
    at: dict[int, int],
    host: torch.Tensor | None,
    copied: Any,
    redo: Callable[[], list[tuple[bytes | None, Any]]],
    retry: list[int],
    writeback: Any,
    release: Callable[[], None] = lambda: None,
) -> list[tuple[Any, ...]]:
    """In a writer thread: each chunk of a group into its place in the rows file, hashed;
    returns the chunks' results in order (as the CPU workers' ``_decode_chunk``).

    ``at``: position in the group -> row of ``host`` (the GPU's rows, pinned, valid once
    ``copied`` has completed); other positions are the workers' rows or skips in
    ``found``, or (``retry``) the CPU decode of what failed on the GPU (``redo()``).
    A chunk made only of GPU rows is written straight from ``host``. ``release()``
    hands ``host`` back for reuse once it is written (or the write failed).
    """
    try:
        if copied is not None:
            copied.synchronize()
        arr = host.numpy().reshape(len(host), row) if host is not None else None
        again = dict(zip(retry, redo())) if retry else {}
        out = []
        k = 0
        for chunk, start, cpaths in group:
            n = len(cpaths)
            skips: list[list[Any]] = []
            sizes: list[list[int]] = []
            first = at.get(k)
            if (
                arr is not None
                and first is not None
                and all(at.get(k + j) == first + j for j in range(n))
            ):
                mv = memoryview(arr[first : first + n]).cast("B")
                sizes = [[int(found[k + j][2][0]), int(found[k + j][2][1])] for j in range(n)]
            else:
                buf = np.zeros((n, row), dtype=np.uint8)
                for j in range(n):
                    i = k + j
                    if i in at and arr is not None:  # decoded on the GPU
                        buf[j], info = arr[at[i]], found[i][2]
                    elif i in again:  # failed there: the CPU workers' decode decided
                        data, info = again[i]
                        if data is None:
                            skips.append([start + j, info])
                            sizes.append([0, 0])
                            continue
                        buf[j] = np.frombuffer(data, dtype=np.uint8)
                    elif found[i][0] == "row":  # decoded by a CPU worker (not for the GPU)
                        buf[j], info = np.frombuffer(found[i][1], dtype=np.uint8), found[i][2]
                    else:  # "skip": unreadable or broken, with its reason
                        skips.append([start + j, found[i][1]])
                        sizes.append([0, 0])
                        continue
                    sizes.append([int(info[0]), int(info[1])])
                mv = memoryview(buf).cast("B")
            done = 0
            while done < len(mv):
                done += os.pwrite(fd, mv[done:], start * row + done)
            sha = digest(mv)
            if writeback is not None:  # start writing it to disk now: a short final fsync
                writeback(fd, ctypes.c_int64(start * row), ctypes.c_int64(len(mv)), 2)
            out.append((chunk, skips, sizes, sha, None))
            k += n
        return out
    finally:
        release()


def decode_chunks_batched(
    chunks: list[tuple[int, int, list[str]]],
    spec: ResizeSpec,
    rows_path: str,
    device: torch.device,
    pool: ProcessPoolExecutor | None,
    record: Callable[..., None],
    after_submit: Callable[[], None] = lambda: None,
) -> None:
    """Decode ``chunks`` (chunk, first row, paths) into ``rows_path`` on ``device``,
    calling ``record((chunk, skips, sizes, sha, None), sync=...)`` per chunk in order,
    from one journal thread, as the CPU workers' ``_decode_chunk`` results are recorded
    (None: no worker time split; ``sync`` False for all but the last chunk of a group:
    one journal fsync per group). ``after_submit()`` runs once the first reads are queued, before the first
    record (the build writes its plan there, while the workers read).

    A pipeline, each stage on its own threads, so none waits for another:

    * the CPU workers read every file and classify it (``build_workers._read_for_gpu``),
      decoding themselves what the GPU cannot take, ``_READ_AHEAD`` groups ahead;
    * ``_READERS`` threads read the JPEGs again into tensors (the workers send each one's
      length and SHA-256, not its bytes: unpickling 8 MB per group held this process's
      GIL longer; a file that changed since goes to the CPU workers);
    * a decoder thread decodes a group's JPEGs in one nvjpeg batch
      (:func:`packer.jpeg.decode_ahead`, the JPEG-pack reader's own), 3 groups ahead;
    * this thread crops/resizes the group in one kernel (:func:`packer.jpeg.resize_images`)
      and starts its copy into a pinned buffer (``2 * _WRITERS + 2`` of them, reused);
    * ``_WRITERS`` threads wait for the copy, then pwrite and hash each chunk; a journal
      thread records the chunks in order as their groups complete (one fsync per
      group), so this thread never waits on the disk.

    In a fresh process CUDA, nvjpeg and the crop kernel start (:func:`_warm_up`) while
    the workers read the first groups and ``after_submit()`` runs.
    """
    from .jpeg import decode_ahead, resize_images

    row = image_bytes(spec.shape)
    cuda = device.type == "cuda"
    per = max(1, GROUP_IMAGES // max(1, len(chunks[0][2]))) if chunks else 1
    groups = [chunks[i : i + per] for i in range(0, len(chunks), per)]
    reads: collections.deque[Callable[[], Any]] = collections.deque(
        _submit_read(pool, _paths(g), spec) for g in groups[:_READ_AHEAD]
    )
    warm = ThreadPoolExecutor(1, thread_name_prefix="imgpack-warm") if cuda else None
    warmed = warm.submit(_warm_up, device, spec) if warm is not None else None
    try:
        after_submit()
    finally:
        if warm is not None:  # on an error too: not left running behind it
            warm.shutdown(wait=True)
    if warmed is not None:
        warmed.result()
    writeback = _writeback_fn()
    stream = torch.cuda.Stream(device) if cuda else None
    fd = os.open(rows_path, os.O_WRONLY)
    writers = ThreadPoolExecutor(_WRITERS, thread_name_prefix="imgpack-write")

    def jobs() -> Iterator[tuple[Any, Callable[[], Any]]]:
        for g, group in enumerate(groups):
            get = reads.popleft()
            if g + _READ_AHEAD < len(groups):
                reads.append(_submit_read(pool, _paths(groups[g + _READ_AHEAD]), spec))

            found = get()
            gpu = [i for i, f in enumerate(found) if f[0] == "jpeg"]  # checked by the workers
            paths = _paths(group)
            seen = [found[i][1] for i in gpu]  # (length, SHA-256) the workers classified
            files = readers.submit(_read_files, [paths[i] for i in gpu], seen)
            yield (group, found, gpu), functools.partial(_decode_list, files, device)

    def journal(written: Future[list[tuple[Any, ...]]]) -> None:
        """In the journal thread, group after group in order: one fsync per group."""
        recs = written.result()
        for j, rec in enumerate(recs):
            record(rec, sync=j == len(recs) - 1)

    def check(block: bool) -> None:
        """Raise a writer's or the journal's error here; bound the groups in flight."""
        while journaled and (block or journaled[0].done() or len(journaled) > 2 * _WRITERS):
            journaled.popleft().result()

    # pinned host buffers for the groups' rows, reused: a fresh 50 MB pinned allocation
    # per group costs this thread more than the group's crop
    cap = max(len(_paths(g)) for g in groups) if groups else 0
    free: queue.SimpleQueue[torch.Tensor] = queue.SimpleQueue()
    made = [0]

    def take() -> torch.Tensor:
        if made[0] < 2 * _WRITERS + 2:
            with contextlib.suppress(queue.Empty):
                return free.get_nowait()
            made[0] += 1
            return torch.empty((cap, row), dtype=torch.uint8, pin_memory=cuda)
        return free.get()  # all in use: wait for a writer to finish one

    readers = ThreadPoolExecutor(_READERS, thread_name_prefix="imgpack-read")
    journaler = ThreadPoolExecutor(1, thread_name_prefix="imgpack-journal")
    journaled: collections.deque[Future[None]] = collections.deque()
    decoded = decode_ahead(jobs(), device, stream, ahead=3)
    try:
        for (group, found, gpu), imgs in decoded:
            ok = [i for i, x in zip(gpu, imgs) if x is not None]
            retry = [i for i, x in zip(gpu, imgs) if x is None]
            host = copied = buf = None
            if ok:
                with torch.cuda.stream(stream) if cuda else contextlib.nullcontext():
                    rows = resize_images(
                        [x for x in imgs if x is not None],
                        (spec.height, spec.width),
                        mode=spec.mode,
                    )
                    buf = take()
                    host = buf[: len(ok)].view(rows.shape)
                    host.copy_(rows, non_blocking=cuda)
                    if cuda:
                        copied = torch.cuda.Event()
                        copied.record(stream)
                del rows
            del imgs
            paths = _paths(group)
            redo = _submit_cpu(pool, [paths[i] for i in retry], spec) if retry else list
            at = {i: j for j, i in enumerate(ok)}
            release = functools.partial(free.put, buf) if buf is not None else lambda: None
            written = writers.submit(
                _write_group,
                fd, row, group, found, at, host, copied, redo, retry, writeback, release,
            )  # fmt: skip
            journaled.append(journaler.submit(journal, written))
            check(block=False)
        check(block=True)
    finally:
        decoded.close()
        readers.shutdown(wait=True, cancel_futures=True)
        writers.shutdown(wait=True, cancel_futures=True)
        journaler.shutdown(wait=True, cancel_futures=True)
        os.close(fd)
        for get in reads:  # an error: let the reads in flight finish before returning
            with contextlib.suppress(Exception):
                get()


def _paths(group: list[tuple[int, int, list[str]]]) -> list[str]:
    return [p for c in group for p in c[2]]


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
