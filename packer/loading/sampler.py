"""A :class:`packer.loading.loader.PackLoader`'s order as a torch sampler
(``loader.sampler``): :class:`PackSampler`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
import torch.utils.data

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
        # the loader's own order, before drop_last (a BatchSampler applies it): the
        # shard-aware sequence, and the mixed epoch's rows
        pos = ld._positions(ld.epoch, trim=False)
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
