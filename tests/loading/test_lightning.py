"""A real lightning.Trainer on the CPU drives PackLoader's epochs and resumes it mid-epoch."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import pytest
import torch

import packer

pl = pytest.importorskip("lightning.pytorch")


class Tiny(pl.LightningModule):
    def __init__(self, loader: packer.PackLoader) -> None:
        super().__init__()
        self.loader = loader
        self.net = torch.nn.Linear(3, 3)
        self.seen: list[tuple[int, list[int]]] = []  # (epoch, labels of the batch)

    def train_dataloader(self) -> packer.PackLoader:
        return self.loader

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.seen.append((self.current_epoch, y.tolist()))
        return torch.nn.functional.cross_entropy(self.net(x.float().mean((2, 3))), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _trainer(tmp_path: Path, **kw) -> pl.Trainer:
    return pl.Trainer(
        max_epochs=3,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        **kw,
    )


@pytest.fixture(autouse=True)
def quiet():
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _by_epoch(seen: list[tuple[int, list[int]]]) -> list[list[int]]:
    out: list[list[int]] = [[] for _ in range(3)]
    for e, y in seen:
        out[e] += y
    return out


def test_trainer_epochs_match_a_hand_loop(packed: Path, tmp_path: Path) -> None:
    pack = packer.load(packed)
    model = Tiny(packer.PackLoader(pack, 4, device="cpu", seed=5))
    _trainer(tmp_path).fit(model)
    got = _by_epoch(model.seen)
    hand = packer.PackLoader(pack, 4, device="cpu", seed=5)
    want = []
    for epoch in range(3):
        hand.set_epoch(epoch)
        want.append(torch.cat([y for _, y in hand]).tolist())
    assert got == want
    for epoch in range(3):  # every image once per epoch, in a new order
        assert sorted(hand.indices(epoch).tolist()) == list(range(13))
    assert hand.indices(0).tolist() != hand.indices(1).tolist()
    assert model.loader.epoch == 3  # advanced once per epoch, not more


class SaveAt(pl.Callback):
    def __init__(self, path: Path, epoch: int, batch: int) -> None:
        self.path, self.epoch, self.batch = path, epoch, batch

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.current_epoch == self.epoch and batch_idx == self.batch:
            trainer.save_checkpoint(self.path)


def test_trainer_resumes_mid_epoch(packed: Path, tmp_path: Path) -> None:
    ckpt = tmp_path / "mid.ckpt"
    full = Tiny(packer.PackLoader(packed, 2, device="cpu", seed=1))
    _trainer(tmp_path, callbacks=[SaveAt(ckpt, epoch=1, batch=2)]).fit(full)
    assert ckpt.exists()
    saved_at = 7 + 3  # 7 batches in epoch 0, then 3 in epoch 1
    resumed = Tiny(packer.PackLoader(packed, 2, device="cpu", seed=1))
    _trainer(tmp_path).fit(resumed, ckpt_path=ckpt)
    assert resumed.seen == full.seen[saved_at:]
    assert len(resumed.seen) == 4 + 7
