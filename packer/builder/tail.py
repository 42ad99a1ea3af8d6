"""The last wave of a build's chunks cut into parts, so that the workers finish together.

A chunk (one checksum block of the pack, :func:`packer.pack.writer.block_rows_for`: up to
64 rows) is the build's unit of work and of its journal. With W workers the last W
chunks start at staggered times, and the workers that finish first wait for the last:
about half a chunk's decode of the whole machine (63 images, ~0.24 s on 16 cores at the
decode ceiling's speed, ~3% of a 16,000-image build). So the last W chunks are decoded
as up to :data:`PARTS` parts each (:func:`packer.builder.workers._decode_part`: rows
written, nothing hashed); once every part of a chunk is written, its rows are read back
(from the page cache) and hashed in a thread of this process (hashlib and ``pread``
release the GIL), and the chunk is journaled as a whole one is: the same SHA-256, sizes
and skips, so the journal, the manifest and the pack's bytes do not change. A chunk is
journaled only whole: a part finished before a worker died is done again with its chunk.
"""

from __future__ import annotations

import os
import queue
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from ..pack.hashing import digest
from .workers import _decode_part

PARTS = 4  # parts of each chunk of the last wave
MIN_PART_ROWS = 4  # no part smaller: a chunk of fewer than 8 rows is not cut
HASH_THREADS = 4

_Chunk = tuple[int, int, list[str]]


def cut_tail(
    chunks: list[_Chunk], workers: int
) -> tuple[list[tuple[_Chunk, bool]], dict[int, int]]:
    """The tasks for ``chunks`` on ``workers`` processes, each with whether it is a part:
    every chunk whole but the last ``workers`` ones, cut into up to :data:`PARTS` parts of
    at least :data:`MIN_PART_ROWS` rows (in row order); and the number of parts of each
    cut chunk. Nothing is cut when the chunks make one wave or less."""
    if len(chunks) <= workers:
        return [(c, False) for c in chunks], {}
    tasks = [(c, False) for c in chunks[:-workers]]
    cut: dict[int, int] = {}
    for k, start, paths in chunks[-workers:]:
        q = min(PARTS, len(paths) // MIN_PART_ROWS)
        if q < 2:
            tasks.append(((k, start, paths), False))
            continue
        step = -(-len(paths) // q)
        pieces = [(k, start + i, paths[i : i + step]) for i in range(0, len(paths), step)]
        cut[k] = len(pieces)
        tasks += [(p, True) for p in pieces]
    return tasks, cut


def hash_rows(rows_path: str | os.PathLike[str], offset: int, nbytes: int) -> str:
    """SHA-256 of ``nbytes`` of the rows file from ``offset`` (as a worker hashes its
    chunk's buffer)."""
    fd = os.open(rows_path, os.O_RDONLY)
    try:
        data = bytearray(nbytes)
        view, got = memoryview(data), 0
        while got < nbytes:
            n = os.preadv(fd, [view[got:]], offset + got)
            if n == 0:
                raise OSError(f"{rows_path}: ends before byte {offset + nbytes:,}")
            got += n
        return digest(view)
    finally:
        os.close(fd)


def run_with_tail(
    pool: ProcessPoolExecutor,
    chunks: list[_Chunk],
    workers: int,
    rows_path: Path,
    row_bytes: int,
    done: dict[int, dict[str, Any]],
    record: Callable[..., None],
    fn: Callable[[_Chunk], tuple[Any, ...]],
    times: dict[str, Any],
    after_submit: Callable[[], None],
) -> bool:
    """:func:`packer.builder.chunks._run_chunks` with the last wave cut (:func:`cut_tail`):
    run ``fn`` on the whole chunks and the parts on ``pool``, record each chunk once it
    is whole (``record(result, sync=...)``: the chunks that arrived together are journaled
    with one fsync); False if the pool broke (a worker died), after recording every whole
    chunk that had finished before."""
    tasks, cut = cut_tail(chunks, workers)
    if cut:  # how many parts, for the build's time split
        times["tail_parts"] = times.get("tail_parts", 0) + sum(cut.values())
    start_of = {k: start for k, start, _ in chunks}
    rows_of = {k: len(paths) for k, _, paths in chunks}
    arrived: queue.SimpleQueue[Future[Any]] = queue.SimpleQueue()
    part_start: dict[Future[Any], int] = {}  # a part's future -> its first row
    whole: list[Future[Any]] = []
    broken = False
    try:
        for task, part in tasks:
            fut = pool.submit(_decode_part if part else fn, task)
            if part:
                part_start[fut] = task[1]
            else:
                whole.append(fut)
            fut.add_done_callback(arrived.put)
    except BrokenProcessPool:  # a worker died while chunks were still being submitted
        broken = True
    after_submit()  # this process's own work, while the workers decode
    if broken:
        return _after_break(whole, done, record)
    parts: dict[int, list[tuple[int, tuple[Any, ...]]]] = {}
    hashing: dict[Future[Any], int] = {}
    hasher = ThreadPoolExecutor(min(HASH_THREADS, max(1, len(cut))), "imgpack-hash")
    try:
        left = len(tasks) + len(cut)
        while left:
            t = time.perf_counter()
            batch = [arrived.get()]  # and all that came meanwhile: one fsync for them all
            times["wait"] += time.perf_counter() - t
            while True:
                try:
                    batch.append(arrived.get_nowait())
                except queue.Empty:
                    break
            left -= len(batch)
            ready: list[tuple[Any, ...]] = []  # whole chunks to journal, in arrival order
            for fut in batch:
                if fut in hashing:
                    k = hashing.pop(fut)
                    ready.append(_whole(k, parts.pop(k), fut.result()))
                    continue
                try:
                    res = fut.result()
                except BrokenProcessPool:
                    _journal(ready, record)
                    return _after_break(whole, done, record)
                if fut not in part_start:
                    ready.append(res)
                    continue
                times["chunks"].append(res[4])
                k = res[0]
                parts.setdefault(k, []).append((part_start[fut], res))
                if len(parts[k]) == cut[k]:  # every row written: hash them as a worker would
                    h = hasher.submit(
                        hash_rows, rows_path, start_of[k] * row_bytes, rows_of[k] * row_bytes
                    )
                    hashing[h] = k
                    h.add_done_callback(arrived.put)
            _journal(ready, record)
        return True
    finally:
        hasher.shutdown(wait=True)


def _journal(ready: list[tuple[Any, ...]], record: Callable[..., None]) -> None:
    """Journal ``ready``'s chunks, the file fsynced once after the last line (a line is
    never relied on before its fsync: a rerun trusts only what the journal holds)."""
    for i, res in enumerate(ready):
        record(res, sync=i == len(ready) - 1)


def _whole(k: int, parts: list[tuple[int, tuple[Any, ...]]], sha: str) -> tuple[Any, ...]:
    """Chunk ``k``'s result from its parts' (skips, sizes in row order) and its hash; no
    worker time split (each part's was counted as it came)."""
    skips: list[list[Any]] = []
    sizes: list[list[int]] = []
    for _, res in sorted(parts, key=lambda p: p[0]):
        skips += res[1]
        sizes += res[2]
    return (k, skips, sizes, sha, None)


def _after_break(
    whole: list[Future[Any]],
    done: dict[int, dict[str, Any]],
    record: Callable[[tuple[Any, ...]], None],
) -> bool:
    """Record the whole chunks that finished before the pool broke; False."""
    for fut in whole:
        finished = fut.done() and not fut.cancelled() and fut.exception() is None
        if finished and fut.result()[0] not in done:
            record(fut.result())
    return False
