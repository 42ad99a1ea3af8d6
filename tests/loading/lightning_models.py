"""The lightning modules and callback of tests/loading/test_lightning.py, in a module of
their own: they subclass lightning's classes, and lightning (0.8 CPU-s to import) is
imported only by the worker that runs those tests, not at collection by every worker
(issue 45, item 12)."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import torch

import packer


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


def trainer(tmp_path: Path, max_epochs: int = 3, **kw) -> pl.Trainer:
    return pl.Trainer(
        max_epochs=max_epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        **kw,
    )


class SaveAt(pl.Callback):
    def __init__(self, path: Path, epoch: int, batch: int) -> None:
        self.path, self.epoch, self.batch = path, epoch, batch

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.current_epoch == self.epoch and batch_idx == self.batch:
            trainer.save_checkpoint(self.path)


class Evaluated(Tiny):
    """Tiny with every loader hook: val, test and predict each stream the pack in order."""

    def __init__(self, pack: Path, val_shuffle: bool = False) -> None:
        super().__init__(packer.PackLoader(pack, 4, device="cpu", seed=5))
        self.pack, self.val_shuffle = pack, val_shuffle
        self.val_seen: list[list[int]] = []  # labels of each validation run (sanity check not)
        self.test_seen: list[int] = []

    def _eval_loader(self, shuffle: bool = False) -> packer.PackLoader:
        return packer.PackLoader(self.pack, 4, device="cpu", shuffle=shuffle)

    def val_dataloader(self) -> packer.PackLoader:
        return self._eval_loader(self.val_shuffle)

    def test_dataloader(self) -> packer.PackLoader:
        return self._eval_loader()

    def predict_dataloader(self) -> packer.PackLoader:
        return self._eval_loader()

    def on_validation_epoch_start(self) -> None:
        if not self.trainer.sanity_checking:
            self.val_seen.append([])

    def validation_step(self, batch, batch_idx):
        if not self.trainer.sanity_checking:
            self.val_seen[-1] += batch[1].tolist()

    def test_step(self, batch, batch_idx):
        self.test_seen += batch[1].tolist()

    def predict_step(self, batch, batch_idx):
        return self.net(batch[0].float().mean((2, 3))), batch[1]
