"""Pack sets and mixed packs as one source for :class:`packer.loading.loader.PackLoader`.

:class:`Units` lays the shards of one or more packs and pack sets end to end (a single
pack is one unit, a set one unit per shard): global image ``i`` is row ``i -
offsets[u]`` of unit ``u``. It holds the labels, targets and (JPEG) stored sizes of all
of them, reads a raw batch's rows through one :class:`packer.loading.rowspace.RowSpace`
(a single ``np.take``), and a JPEG batch's bytes shard by shard.

:class:`Schedule` is one pass's use of the units: which units each batch reads, so a
unit is fetched (and, from object storage, pinned in the cache) before the first batch
that reads it, prefetched a few shards ahead, and let go after the last. On local disk
every unit is mapped once and stays mapped. :func:`working_set` is the most bytes of
shard data a pass holds at once; the loader refuses a cache limit below it before the
first batch.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..errors import UsageError
from ..pack.kinds import kind_of_pack
from ..pack.schema import Layout
from . import rowspace


class Units:
    """The units (single packs, shards of sets) of what a loader streams, in order.

    ``sources``: the packs and :class:`packer.storage.packset.PackSet` s given, each a
    contiguous range of global indices (``starts[j]`` is source ``j``'s first)."""

    def __init__(self, sources: Sequence[Any]) -> None:
        self.sources = list(sources)
        self.units: list[tuple[Any, int | None]] = []  # (PackSet, shard) or (pack, None)
        counts, nbytes = [], []
        for src in self.sources:
            if _is_set(src):
                for k, entry in enumerate(src.index.shards):
                    self.units.append((src, k))
                    counts.append(entry.count)
                    nbytes.append(entry.bytes)
            else:
                self.units.append((src, None))
                counts.append(len(src))
                nbytes.append(0)
        self.counts = np.asarray(counts, dtype=np.int64)
        self.bytes = np.asarray(nbytes, dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)
        sizes = [len(s) for s in self.sources]
        self.starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        first = self.sources[0]
        self.kind = kind_of_pack(first)  # the mixture checked that every source's is one
        self.storage = self.kind.name
        self.labels = _cat([s.labels for s in self.sources], torch.int64)
        t = [getattr(s, "targets", None) for s in self.sources]
        self.targets = None if t[0] is None else torch.cat(t)
        self.sizes = (
            _cat([s.sizes for s in self.sources], torch.int64) if self.kind.decoded else None
        )
        self.remote = any(_is_set(s) and s.store.remote for s in self.sources)
        self._held: dict[int, Any] = {}  # unit -> its opened pack, while held
        self._holds: dict[int, int] = {}
        self._lock = threading.Lock()
        # a unit's first hold (fetch, map) and last let-go (unmap, release) run whole under
        # its lock: two passes (zip(loader, loader)) may hold and let go of one unit at once,
        # and a hold that slipped between a let-go's count and its unmap read an unmapped slot
        self._unit_locks = [threading.Lock() for _ in self.units]
        self.space: rowspace.RowSpace | None = None
        self.row = 0
        if not self.kind.decoded:  # rows of one size: one address space over every shard
            shape = tuple(first.image_shape) if _is_set(first) else tuple(first.images.shape[1:])
            self.row = int(np.prod(shape))
            if rowspace.supported():
                self.space = rowspace.RowSpace(self.row, self.counts.tolist())
        self.path = getattr(first, "path", None)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    @property
    def array(self) -> np.ndarray:
        """Raw rows of every held unit, uint8 [V, row] (virtual rows: :meth:`translate`)."""
        assert self.space is not None
        return self.space.array

    def unit_of(self, idx: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.offsets, idx, side="right") - 1

    def translate(self, idx: np.ndarray) -> np.ndarray:
        """Virtual rows (of :attr:`array`) of global indices ``idx``."""
        assert self.space is not None
        u = self.unit_of(idx)
        return self.space.base[u] + (idx - self.offsets[u])

    # ---- holding units
    def hold(self, u: int) -> None:
        """Open unit ``u`` (fetch a remote shard first) and map it; counted."""
        with self._unit_locks[u]:
            with self._lock:
                if self._holds.get(u, 0):
                    self._holds[u] += 1
                    return
            src, k = self.units[u]
            pack = src if k is None else src.shard(k)
            try:
                if self.space is not None:
                    rows = Layout(pack.path).images if k is not None else _rows_file(pack)
                    self.space.map(u, rows)
            except BaseException:
                if k is not None:
                    src.release(k)
                raise
            with self._lock:
                self._held[u] = pack
                self._holds[u] = self._holds.get(u, 0) + 1

    def let_go(self, u: int) -> None:
        """Undo one :meth:`hold`; the last one unmaps a unit of a remote set."""
        with self._unit_locks[u]:
            with self._lock:
                left = self._holds.get(u, 0) - 1
                if left < 0:
                    return
                self._holds[u] = left
                if left:
                    return
                self._held.pop(u, None)
            src, k = self.units[u]
            if k is None:
                return
            if not src.store.keeps_released and self.space is not None:
                self.space.unmap(u)  # its file may be evicted once released
            src.release(k)

    def warm(self, us: Sequence[int]) -> bool:
        """Whether every unit of ``us`` is on local disk or a remote shard this process
        keeps fetched and mapped for good (a store without a limit: ``kept``): a pass
        over them then holds them all up front, as on local disk, with no work a batch."""
        for u in us:
            src, k = self.units[u]
            if k is not None and src.store.remote:
                kept = getattr(src.store, "kept", None)
                if not (src.store.keeps_released and kept is not None and kept(k)):
                    return False
        return True

    def held(self, u: int) -> bool:
        return self._holds.get(u, 0) > 0

    def prefetch(self, us: Sequence[int]) -> None:
        by_set: dict[int, tuple[Any, list[int]]] = {}
        for u in us:
            src, k = self.units[u]
            if k is not None and src.store.remote:
                by_set.setdefault(id(src), (src, []))[1].append(k)
        for src, ks in by_set.values():
            src.prefetch(ks)

    def take(self, idx: np.ndarray, out: np.ndarray) -> None:
        """Raw rows of global ``idx`` into ``out`` [n, row], unit by unit (the way where
        no :class:`RowSpace` can be made: a copy through a buffer per unit)."""
        u = self.unit_of(idx)
        for unit in np.unique(u).tolist():
            sel = np.flatnonzero(u == unit)
            pack = self._held[unit]
            rows = pack.images.numpy().reshape(len(pack), -1)
            out[sel] = np.take(rows, idx[sel] - self.offsets[unit], 0)

    # ---- JPEG units: the reader the JPEG pass sees
    def read(self, indices: Any, check_ends: bool = False) -> list[torch.Tensor]:
        """The stored bytes of global images ``indices`` (their units held)."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        u = self.unit_of(idx)
        out: list[Any] = [None] * len(idx)
        for unit in np.unique(u).tolist():
            sel = np.flatnonzero(u == unit)
            pack = self._held.get(unit)
            if pack is None:
                raise RuntimeError(f"imgpack: shard {unit} read before it was fetched")
            for j, data in zip(sel.tolist(), pack.read(idx[sel] - self.offsets[unit], check_ends)):
                out[j] = data
        return out

    def close(self) -> None:
        if self.space is not None:
            self.space.close()


def _rows_file(pack: Any) -> Any:
    path = getattr(pack, "path", None)
    if path is None:
        raise UsageError("mixing packs needs whole packs from packer.load(), not slices")
    return Layout(path).images


def _cat(parts: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    return torch.cat(parts) if parts else torch.empty(0, dtype=dtype)


def _is_set(obj: Any) -> bool:
    from ..storage.packset import PackSet

    return isinstance(obj, PackSet)


class Schedule:
    """One pass's use of the units: ``before(b)`` holds what batch ``b`` reads (and
    prefetches ahead), ``after(b)`` lets go of what no later batch reads. On local disk,
    and over remote shards this process keeps (:meth:`Units.warm`), every unit the pass
    reads is held at its start and kept (``keep``)."""

    def __init__(
        self, units: Units, order: np.ndarray, batch_size: int, start: int, depth: int
    ) -> None:
        self.units = units
        unit = units.unit_of(np.asarray(order, dtype=np.int64))
        nb = -(-len(order) // batch_size) if len(order) else 0
        batch = np.arange(len(order)) // batch_size
        ids = np.unique(unit)
        self.first: dict[int, int] = {}
        self.last: dict[int, int] = {}
        if len(ids):
            # first and last batch reading each unit (of the batches from ``start``)
            keep = batch >= start
            u, b = unit[keep], batch[keep]
            for x, y in zip(*_first_last(u, b)):
                self.first[int(x)] = int(y[0])
                self.last[int(x)] = int(y[1])
        self.start_of: dict[int, list[int]] = {}
        for u, b in self.first.items():
            self.start_of.setdefault(b, []).append(u)
        self.end_of: dict[int, list[int]] = {}
        for u, b in self.last.items():
            self.end_of.setdefault(b, []).append(u)
        self.upcoming = sorted(self.first, key=lambda u: (self.first[u], u))
        self.depth = depth
        self.nbatches = nb
        # local disk, or a warm remote set's next pass: every unit held at the start
        self.keep = not units.remote or units.warm(self.upcoming)
        self.holding: set[int] = set()
        self.lock = threading.Lock()

    def open(self) -> None:
        """Hold every unit up front when nothing is fetched (local disk: a map each)."""
        if self.keep:
            for u in self.upcoming:
                self._hold(u)

    def _hold(self, u: int) -> None:
        with self.lock:
            if u in self.holding:
                return
        self.units.hold(u)
        with self.lock:
            self.holding.add(u)

    def before(self, b: int) -> None:
        if self.keep:
            return
        starting = self.start_of.get(b, [])
        if self.depth and starting:
            # the shards after those this batch starts (fetched on demand just below)
            i = self.upcoming.index(starting[0]) + len(starting)
            self.units.prefetch(self.upcoming[i : i + self.depth])
        for u in starting:
            self._hold(u)

    def after(self, b: int) -> None:
        if self.keep:
            return
        for u in self.end_of.get(b, []):
            with self.lock:
                if u not in self.holding:
                    continue
                self.holding.discard(u)
            self.units.let_go(u)

    def close(self) -> None:
        """Let go of everything this pass holds (its reads have ended)."""
        with self.lock:
            held, self.holding = list(self.holding), set()
        for u in held:
            self.units.let_go(u)


def _first_last(unit: np.ndarray, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct units and the (first, last) batch each appears in."""
    order = np.lexsort((batch, unit))
    u, b = unit[order], batch[order]
    starts = np.flatnonzero(np.r_[True, u[1:] != u[:-1]])
    ends = np.r_[starts[1:], len(u)] - 1
    return u[starts], np.stack([b[starts], b[ends]], 1)


def working_set(
    units: Units, order: np.ndarray, batch_size: int, depth: int, window: int = 1
) -> tuple[int, int]:
    """``(bytes, shards)`` of remote shard data one pass over ``order`` holds at most at
    once: the units read by ``window`` consecutive batches (those whose reads may be
    under way together), plus ``depth`` prefetched (the largest)."""
    if not len(order):
        return 0, 0
    unit = units.unit_of(np.asarray(order, dtype=np.int64))
    batch = np.arange(len(order)) // batch_size
    u, fl = _first_last(unit, batch)
    nb = int(batch[-1]) + 2
    # a unit is held from its first batch until the reads of its last are done, while
    # the reads of up to ``window - 1`` later batches have already begun
    fl[:, 1] = np.minimum(fl[:, 1] + max(1, window) - 1, nb - 1)
    delta = np.zeros(nb + 1, dtype=np.int64)
    count = np.zeros(nb + 1, dtype=np.int64)
    np.add.at(delta, fl[:, 0], units.bytes[u])
    np.add.at(delta, fl[:, 1] + 1, -units.bytes[u])
    np.add.at(count, fl[:, 0], 1)
    np.add.at(count, fl[:, 1] + 1, -1)
    most = int(np.cumsum(delta).max())
    shards = int(np.cumsum(count).max())
    extra = int(np.sort(units.bytes)[::-1][:depth].sum()) if depth else 0
    # a prefetch fetches only shards the pass reads and does not hold yet: never more
    # than the shards this pass reads, nor their bytes (issue 42.9: an 8-shard set
    # held all 8 and counted one prefetched beside them, 9)
    return (
        min(most + extra, int(units.bytes[u].sum())),
        min(shards + min(depth, len(units.bytes)), len(u)),
    )


def fetch_ahead(units: Units | None) -> int:
    """Shards a remote set fetches ahead of need (its store's prefetch depth); 0 for a pack."""
    if units is None:
        return 0
    return max((getattr(s, "store", None) and s.store.prefetch_depth) or 0 for s in units.sources)


def check_working_set(
    units: Units | None, rows: torch.Tensor, batch_size: int, window: int, order: str
) -> None:
    """Refuse a pass whose shards cannot fit the cache of a set fetched from object
    storage, before its first batch: both numbers in the message. The ranks of one
    node share its cache (``LOCAL_WORLD_SIZE`` of them, torchrun's variable)."""
    if units is None or not units.remote:
        return
    limits = [s.store.limit for s in units.sources if getattr(s, "store", None) and s.store.limit]
    if not limits:
        return
    need, shards = working_set(units, rows.numpy(), batch_size, fetch_ahead(units), window)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    if need * local > min(limits):
        raise UsageError(
            f"the cache limit of {min(limits):,} bytes is below this pass's working set of "
            f"{need * local:,} bytes ({shards} shards held at once by each of {local} "
            f"rank(s) of this node, order={order!r}); raise cache_limit, or use "
            "order='shards' with a smaller shard_window"
        )
