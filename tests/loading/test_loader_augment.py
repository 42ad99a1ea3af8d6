"""PackLoader with packer.transforms: every image once per epoch, new crops each epoch."""

from __future__ import annotations

from pathlib import Path

import torch

import packer
from packer.measure.bench.synth import make_random_pack
from packer.transforms import Compose, RandomHorizontalFlip, RandomResizedCrop


def test_augmenting_loader_covers_every_image_once_per_epoch(tmp_path: Path) -> None:
    n = 37
    # labels i mod n: each label names its row, so the labels of an epoch show its coverage
    pack = packer.load(make_random_pack(tmp_path / "p", n, 24, classes=n))
    aug = Compose([RandomResizedCrop(16), RandomHorizontalFlip()])
    loader = packer.PackLoader(pack, 8, device="cpu", seed=1, transform=aug)
    epochs = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        batches = list(loader)
        assert all(x.shape[1:] == (3, 16, 16) and x.dtype == torch.uint8 for x, _ in batches)
        labels = torch.cat([y for _, y in batches])
        assert sorted(labels.tolist()) == list(range(n))
        by_row = torch.empty(n, 3, 16, 16, dtype=torch.uint8)
        by_row[labels] = torch.cat([x for x, _ in batches])
        epochs.append(by_row)
    # a new epoch draws new crops for the same images
    assert not torch.equal(epochs[0], epochs[1])
    # and the same epoch again draws the same ones (seeded per seed, epoch, rank, batch)
    loader.set_epoch(0)
    again = list(loader)
    labels = torch.cat([y for _, y in again])
    by_row = torch.empty(n, 3, 16, 16, dtype=torch.uint8)
    by_row[labels] = torch.cat([x for x, _ in again])
    assert torch.equal(by_row, epochs[0])
