"""Which rows a :class:`packer.loading.loader.PackLoader` pass streams, in yield order
(:class:`Positions`, a base class of it), and whether a remote set's shards for them fit.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch

from ..errors import UsageError
from .arguments import check_distinct
from .mixture import image_shape
from .order import (
    _check_dtypes,
    _check_indices,
    _cut_digest,
    _rows_digest,
    epoch_indices,
    shard_sequence,
)


class Positions:
    """The order of :class:`PackLoader` (a base class of it): this rank's positions into the
    streamed rows for an epoch (``_positions``, ``order="shards"``'s ``_shard_positions``),
    the pack rows at them (``_rows_at``), and the cache check of a pass over a remote set
    (``_check_working_set``). They read the arguments ``PackLoader.__init__`` sets."""

    def _stream_rows(self, pack: Any, units: Any, mix: Any, indices: Any) -> None:
        """Set the streamed arrays (``_images``, ``_labels``, ``_targets``) of ``pack`` or
        ``units``, the rows streamed (``_rows``: ``indices`` checked, or None for all; ``_n``
        of them, or ``mix.size``), a yielded image's ``_shape`` and the ``_digest`` a state
        carries. Reads ``_kind``, ``_crop`` and ``order``."""
        if units is None:
            self._images = self._kind.source_tensor(pack)
            self._labels = pack.labels
            self._targets: torch.Tensor | None = getattr(pack, "targets", None)
            total = len(pack)
            raw_shape = None if self._kind.decoded else tuple(pack.images.shape[1:])
        else:
            self._images = None
            self._labels, self._targets = units.labels, units.targets
            total = len(units)
            raw_shape = None if self._kind.decoded else image_shape(units.sources[0])
        _check_dtypes(
            None if self._kind.decoded else self._images, self._labels, self._targets, total
        )
        self._rows = None if indices is None else _check_indices(indices, total)
        check_distinct(self._rows, self.order)
        self._n = (
            (mix.size if mix is not None else total) if self._rows is None else len(self._rows)
        )
        self._shape = (3, *self._crop.size) if self._kind.decoded else raw_shape
        extra = "" if mix is None else mix.key
        self._digest = _rows_digest(self._rows, total, self._shape, extra)
        # where the shards end: what order="shards" orders by (a state carries it)
        counts = [total] if units is None else [int(c) for c in units.counts]
        self._cut = _cut_digest(counts)

    def _per_rank(self) -> int:
        """This rank's rows per epoch, before ``drop_last`` (the split of ``epoch_indices``)."""
        if self.world_size == 1:
            return self._n
        if self.even_split == "trim":
            return self._n // self.world_size
        return math.ceil(self._n / self.world_size)

    def _positions(self, epoch: int, trim: bool = True) -> torch.Tensor:
        """Positions into the streamed rows for ``epoch``, in yield order, int64 [M];
        ``trim`` False: before ``drop_last`` (a BatchSampler applies it)."""
        order = epoch_indices(
            self._n,
            epoch=epoch,
            seed=self.seed,
            shuffle=self.shuffle and self.order == "global",
            rank=self.rank,
            world_size=self.world_size,
            even_split=self.even_split,
            repeats=self.repeats,
        )
        if self.order == "shards" and len(order):
            order = self._shard_positions(epoch)[order]
        if trim and self.drop_last:
            order = order[: len(self) * self.batch_size]
        return order

    def _shard_positions(self, epoch: int) -> torch.Tensor:
        """``order="shards"``: the epoch's sequence (:func:`shard_sequence`) as positions
        into the streamed rows (a subset given by ``indices`` keeps its images' places)."""
        counts = self._units.counts if self._units is not None else [len(self._labels)]
        seq = shard_sequence(
            counts,
            seed=self.seed,
            epoch=epoch,
            shuffle=self.shuffle,
            parts=self.canonical_ranks,
            window=self.shard_window,
        )
        if self._rows is None:
            return seq
        place = torch.full((len(self._labels),), -1, dtype=torch.int64)
        place[self._rows] = torch.arange(len(self._rows))
        pos = place[seq]
        return pos[pos >= 0]

    def _rows_at(self, epoch: int, pos: torch.Tensor) -> torch.Tensor:
        """The pack (or set) rows at positions ``pos`` of ``epoch``'s streamed rows."""
        if self._mix is not None:
            return self._mix.rows(epoch, self.seed)[pos]
        return pos if self._rows is None else self._rows[pos]

    def _fetch_ahead(self) -> int:
        """Shards a remote set fetches ahead of need (its store's prefetch depth)."""
        if self._units is None:
            return 0
        return max(
            (getattr(s, "store", None) and s.store.prefetch_depth) or 0 for s in self._units.sources
        )

    def working_set(self, epoch: int | None = None) -> tuple[int, int]:
        """``(bytes, shards)`` of a set's shard data that one pass of ``epoch`` (default:
        the current one) holds at once, as this loader reads (its order, batch size,
        device and read-ahead, and its store's prefetch depth): the least ``cache_limit``
        a set in object storage streams with, per rank of a node. ``(0, 0)`` for a pack.
        """
        if self._units is None:
            return 0, 0
        from .sets import working_set
        from .strategies import PassConfig, choose

        e = self.epoch if epoch is None else int(epoch)
        rows = self._rows_at(e, self._positions(e))
        cfg = PassConfig.of(self)
        window = choose(cfg).read_window(cfg)
        return working_set(self._units, rows.numpy(), self.batch_size, self._fetch_ahead(), window)

    def _check_working_set(self, rows: torch.Tensor, window: int = 1) -> None:
        """Refuse a pass whose shards cannot fit the cache of a set fetched from object
        storage, before its first batch: both numbers in the message. The ranks of one
        node share its cache (``LOCAL_WORLD_SIZE`` of them, torchrun's variable)."""
        units = self._units
        if units is None or not units.remote:
            return
        from .sets import working_set

        limits = [
            s.store.limit for s in units.sources if getattr(s, "store", None) and s.store.limit
        ]
        if not limits:
            return
        need, shards = working_set(
            units, rows.numpy(), self.batch_size, self._fetch_ahead(), window
        )
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
        if need * local > min(limits):
            raise UsageError(
                f"the cache limit of {min(limits):,} bytes is below this pass's working set of "
                f"{need * local:,} bytes ({shards} shards held at once by each of {local} "
                f"rank(s) of this node, order={self.order!r}); raise cache_limit, or use "
                "order='shards' with a smaller shard_window"
            )
