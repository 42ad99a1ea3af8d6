"""A :class:`packer.loading.loader.PackLoader`'s order as a torch sampler
(``loader.sampler``): :class:`PackSampler`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
import torch.utils.data

from .order import epoch_indices

if TYPE_CHECKING:
    from .loader import PackLoader


class PackSampler(torch.utils.data.Sampler[int]):
    """A :class:`PackLoader`'s order as a sampler: ``set_epoch(e)`` sets the loader's
    epoch, ``len()`` is this rank's samples per epoch, iterating yields its pack
    rows for the loader's next epoch (usable with a DataLoader over PackDataset)."""

    def __init__(self, loader: PackLoader) -> None:
        self.loader = loader
        self.data_source = loader.dataset  # the name torch's samplers give what they index

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def __len__(self) -> int:
        return self.loader._per_rank()

    def __iter__(self) -> Iterator[int]:
        ld = self.loader
        pos = epoch_indices(
            ld._n,
            epoch=ld.epoch,
            seed=ld.seed,
            shuffle=ld.shuffle and ld.order == "global",
            rank=ld.rank,
            world_size=ld.world_size,
            even_split=ld.even_split,
            repeats=ld.repeats,
        )
        # the loader's own order (PackLoader._positions, before drop_last, which a
        # BatchSampler applies): the shard-aware sequence, and the mixed epoch's rows
        if ld.order == "shards" and len(pos):
            pos = ld._shard_positions(ld.epoch)[pos]
        return iter(ld._rows_at(ld.epoch, pos).tolist())


class _RandomPackSampler(PackSampler, torch.utils.data.RandomSampler):
    """A shuffling loader's order. A ``RandomSampler`` because ``isinstance`` is how
    Lightning (``_is_dataloader_shuffled``) and others ask whether an order is shuffled;
    it is one: a new permutation each epoch (of ``seed + epoch``), without replacement."""

    replacement = False

    @property
    def num_samples(self) -> int:
        return len(self)


class _SequentialPackSampler(PackSampler, torch.utils.data.SequentialSampler):
    """A loader's order without shuffling (this rank's part of the rows, in order)."""
