"""Several shards' raw rows seen as one array: :class:`RowSpace`.

A raw pack set's images are one ``images.memmap`` per shard. The loader's gather is a
single ``np.take`` over one 2-D array (a memcpy per row, the GIL released), so the set's
files are mapped side by side into one reserved range of address space, each at a
multiple of ``lcm(row bytes, page size)``: row ``i`` of shard ``k`` is then row
``base[k] + i`` of one array, and a batch's global indices are translated once
(:meth:`RowSpace.rows`). The gaps between shards are never mapped (reading one would
fault), and no index ever points into them. Reserving costs address space only.

A shard is mapped when a pass first needs it (:meth:`map`) and unmapped when a store
that fetches may evict it (:meth:`unmap`: the slot is reserved again). Linux and macOS;
elsewhere :func:`supported` is False and the loader gathers shard by shard instead.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import os
import sys
import threading
from pathlib import Path

import numpy as np

_MAP_FIXED = 0x10  # Linux and macOS
_MAP_NORESERVE = {"linux": 0x4000, "darwin": 0x40}
_FAILED = ctypes.c_void_p(-1).value
_PROT_NONE = 0


def supported() -> bool:
    return sys.platform in _MAP_NORESERVE and hasattr(mmap, "MAP_ANONYMOUS")


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.restype = ctypes.c_int
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


class RowSpace:
    """Shards of ``row`` bytes per image, ``counts[k]`` images each, in one address range.

    ``array``: uint8 [V, row] over the whole range (only mapped slots may be read);
    ``base``: int64 [S], the virtual row of each shard's first image."""

    def __init__(self, row: int, counts: list[int]) -> None:
        self.row = row
        self.counts = [int(c) for c in counts]
        page = mmap.PAGESIZE
        align = row * page // math.gcd(row, page)  # a slot starts on a page and a row
        sizes = [-(-c * row // align) * align for c in self.counts]
        starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)
        self.total = int(starts[-1]) or align
        self.base = (starts[:-1] // row).astype(np.int64)
        self._starts = starts
        self._libc = _libc()
        self._flags = _MAP_NORESERVE[sys.platform]
        addr = self._libc.mmap(
            None,
            self.total,
            _PROT_NONE,
            mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | self._flags,
            -1,
            0,
        )
        if addr in (None, _FAILED):
            err = ctypes.get_errno()
            raise OSError(err, f"cannot reserve {self.total:,} bytes of address space")
        self.addr = int(addr)
        buf = (ctypes.c_uint8 * self.total).from_address(self.addr)
        self.array = np.frombuffer(buf, dtype=np.uint8).reshape(self.total // row, row)
        self.mapped = [False] * len(self.counts)
        self._lock = threading.Lock()
        self._closed = False

    def map(self, k: int, path: Path) -> None:
        """Map shard ``k``'s rows file (``counts[k] * row`` bytes) read-only into its slot."""
        with self._lock:
            if self.mapped[k] or self._closed:
                return
            length = self.counts[k] * self.row
            if length == 0:
                self.mapped[k] = True
                return
            fd = os.open(path, os.O_RDONLY)
            try:
                size = os.fstat(fd).st_size
                if size != length:
                    raise OSError(f"{path} is {size:,} bytes, {length:,} expected")
                got = self._libc.mmap(
                    self.addr + int(self._starts[k]),
                    length,
                    mmap.PROT_READ,
                    mmap.MAP_SHARED | _MAP_FIXED,
                    fd,
                    0,
                )
            finally:
                os.close(fd)  # the mapping keeps the file
            if got in (None, _FAILED):
                raise OSError(ctypes.get_errno(), f"cannot map {path}")
            self.mapped[k] = True

    def unmap(self, k: int) -> None:
        """Drop shard ``k``'s mapping (its slot is reserved again, never readable)."""
        with self._lock:
            if not self.mapped[k] or self._closed:
                return
            self.mapped[k] = False
            length = self.counts[k] * self.row
            if length:
                self._reserve(self.addr + int(self._starts[k]), length)

    def _reserve(self, addr: int, length: int) -> None:
        got = self._libc.mmap(
            addr,
            length,
            _PROT_NONE,
            mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | self._flags | _MAP_FIXED,
            -1,
            0,
        )
        if got in (None, _FAILED):
            raise OSError(ctypes.get_errno(), "cannot release a shard's mapping")

    def rows(self, shard: np.ndarray, row: np.ndarray) -> np.ndarray:
        """Virtual rows of images ``row`` of shards ``shard`` (int arrays of one shape)."""
        return self.base[shard] + row

    def close(self) -> None:
        """Unmap everything (nothing may read ``array`` afterwards)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.mapped = [False] * len(self.counts)
            self._libc.munmap(self.addr, self.total)

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()
