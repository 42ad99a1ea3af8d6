"""A :class:`packer.loading.loader.PackLoader`'s order as a torch sampler
(``loader.sampler``): :class:`PackSampler`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.utils.data

from .epochs import Epochs


class PackSampler(torch.utils.data.Sampler[int]):
    """A :class:`PackLoader`'s order as a sampler, over its :class:`Epochs`:
    ``set_epoch(e)`` sets the loader's epoch, ``len()`` is this rank's samples per
    epoch, iterating yields its pack rows for the loader's next epoch (usable with a
    DataLoader over PackDataset). ``data_source``: the pack the rows index."""

    def __init__(self, epochs: Epochs, data_source: Any) -> None:
        self.epochs = epochs
        self.data_source = data_source  # the name torch's samplers give what they index

    def set_epoch(self, epoch: int) -> None:
        self.epochs.set_epoch(epoch)

    def __len__(self) -> int:
        return self.epochs.per_rank()

    def __iter__(self) -> Iterator[int]:
        ep = self.epochs
        # the loader's own order, before drop_last (a BatchSampler applies it): the
        # shard-aware sequence, and the mixed epoch's rows
        epoch = ep.epoch
        return iter(ep.rows_at(epoch, ep.positions(epoch, trim=False)).tolist())


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
