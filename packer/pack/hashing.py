"""SHA-256 of a pack's bytes: :func:`digest` of a buffer, :func:`hash_blocks` of a data
file's checksum blocks, and :func:`image_bytes` of one row's shape. The storage kinds and
the writer both checksum with these; they import nothing of the format. No torch."""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def digest(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def image_bytes(shape: Iterable[int]) -> int:
    return int(math.prod(shape))


def hash_blocks(
    path: Path,
    block_bytes: int,
    blocks: int,
    progress: Callable[[int], None] | None = None,
    workers: int | None = None,
) -> list[str]:
    """SHA-256 of each of ``blocks`` consecutive ``block_bytes`` slices of ``path``
    (the last may be short), on a thread pool: hashlib and pread release the GIL.
    ``progress(k)`` is called with the index of each finished block, in order."""
    if blocks == 0:
        return []
    fd = os.open(path, os.O_RDONLY)
    try:

        def one(k: int) -> str:
            # in pieces: a block of 64 large images can be hundreds of MB
            h, pos, end = hashlib.sha256(), k * block_bytes, (k + 1) * block_bytes
            while pos < end and (piece := os.pread(fd, min(8 << 20, end - pos), pos)):
                h.update(piece)
                pos += len(piece)
            return h.hexdigest()

        with ThreadPoolExecutor(workers or min(32, os.cpu_count() or 1)) as pool:
            out = []
            for k, sha in enumerate(pool.map(one, range(blocks))):
                out.append(sha)
                if progress:
                    progress(k)
            return out
    finally:
        os.close(fd)
