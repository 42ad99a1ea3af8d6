"""A real lightning.Trainer on the CPU drives PackLoader's epochs and resumes it mid-epoch."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import pytest
import torch

import packer


@pytest.fixture(autouse=True)
def quiet():
    pytest.importorskip("lightning.pytorch")  # here, not at collection: every worker collects
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@pytest.fixture
def lm():
    """tests/loading/lightning_models.py (lightning imported with it)."""
    import lightning_models

    return lightning_models


def _by_epoch(seen: list[tuple[int, list[int]]]) -> list[list[int]]:
    out: list[list[int]] = [[] for _ in range(3)]
    for e, y in seen:
        out[e] += y
    return out


def test_trainer_epochs_match_a_hand_loop(lm, packed: Path, tmp_path: Path) -> None:
    pack = packer.load(packed)
    model = lm.Tiny(packer.PackLoader(pack, 4, device="cpu", seed=5))
    lm.trainer(tmp_path).fit(model)
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


def test_trainer_resumes_mid_epoch(lm, packed: Path, tmp_path: Path) -> None:
    ckpt = tmp_path / "mid.ckpt"
    full = lm.Tiny(packer.PackLoader(packed, 2, device="cpu", seed=1))
    lm.trainer(tmp_path, callbacks=[lm.SaveAt(ckpt, epoch=1, batch=2)]).fit(full)
    assert ckpt.exists()
    saved_at = 7 + 3  # 7 batches in epoch 0, then 3 in epoch 1
    resumed = lm.Tiny(packer.PackLoader(packed, 2, device="cpu", seed=1))
    lm.trainer(tmp_path).fit(resumed, ckpt_path=ckpt)
    assert resumed.seen == full.seen[saved_at:]
    assert len(resumed.seen) == 4 + 7


def test_trainer_validates_tests_and_predicts_from_pack_loaders(
    lm, packed: Path, tmp_path: Path
) -> None:
    labels = packer.load(packed).labels.tolist()  # 13 images, streamed in order by each hook
    model = lm.Evaluated(packed)
    trainer = lm.trainer(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model)
    assert not [w for w in caught if "PackLoader" in str(w.message)]  # it names each epoch
    assert model.val_seen == [labels] * 3  # one validation run per epoch, every image
    assert len(model.seen) == 3 * 4
    trainer.test(model)
    assert model.test_seen == labels
    out = trainer.predict(model)
    assert [len(y) for _, y in out] == [4, 4, 4, 1]
    assert torch.cat([y for _, y in out]).tolist() == labels
    assert all(p.shape == (len(y), 3) for p, y in out)


def test_lightning_reads_whether_a_pack_loader_shuffles(packed: Path) -> None:
    from lightning.fabric.utilities.data import _set_sampler_epoch
    from lightning.pytorch.utilities.data import _is_dataloader_shuffled

    shuffled = packer.PackLoader(packed, 4, device="cpu")
    in_order = packer.PackLoader(packed, 4, device="cpu", shuffle=False)
    assert _is_dataloader_shuffled(shuffled) is True
    assert _is_dataloader_shuffled(in_order) is False
    batches = list(shuffled.batch_sampler)  # the rows of the next pass, batch by batch
    assert len(batches) == len(shuffled.batch_sampler) == len(shuffled) == 4
    assert [r for b in batches for r in b] == shuffled.indices(0).tolist()
    _set_sampler_epoch(shuffled, 2)  # what the loops call: reaches the loader
    assert shuffled.epoch == 2
    assert [r for b in shuffled.batch_sampler for r in b] == shuffled.indices(2).tolist()
    dropped = packer.PackLoader(packed, 4, device="cpu", drop_last=True)
    assert [len(b) for b in dropped.batch_sampler] == [4, 4, 4] == [4] * len(dropped)


def test_trainer_warns_of_a_shuffled_val_loader_truthfully(
    lm, packed: Path, tmp_path: Path
) -> None:
    from lightning.pytorch.utilities.warnings import PossibleUserWarning

    model = lm.Evaluated(packed, val_shuffle=True)
    with pytest.warns(PossibleUserWarning, match="val_dataloader`'s sampler has shuffling"):
        lm.trainer(tmp_path, max_epochs=1).fit(model)
    assert sorted(model.val_seen[0]) == sorted(packer.load(packed).labels.tolist())
