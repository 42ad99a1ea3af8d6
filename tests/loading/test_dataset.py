"""PackDataset in DataLoader and StatefulDataLoader; packer.split; class_histogram."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Subset

import packer
from packer.errors import UsageError


def test_items_and_batched_fetch(packed: Path) -> None:
    pack = packer.load(packed)
    ds = packer.PackDataset(pack)
    assert len(ds) == 13
    x, y = ds[5]
    assert x.dtype == torch.uint8 and x.shape == (3, 24, 32)
    assert torch.equal(x, pack.images[5]) and y == int(pack.labels[5])
    items = ds.__getitems__([3, 0, 12])
    assert [int(y) for _, y in items] == pack.labels[[3, 0, 12]].tolist()
    assert torch.equal(items[2][0], pack.images[12])
    with pytest.raises(IndexError, match="outside"):
        ds[13]


def test_pickles_as_a_path(packed: Path) -> None:
    ds = packer.PackDataset(packer.load(packed), transform=None)
    ds[0]
    blob = pickle.dumps(ds)
    assert len(blob) < 2000  # no arrays inside
    assert torch.equal(pickle.loads(blob)[4][0], ds[4][0])


def _hflip(x: torch.Tensor) -> torch.Tensor:
    return x.flip(-1)


def test_dataloader_with_workers_and_transform(packed: Path) -> None:
    pack = packer.load(packed)
    ds = packer.PackDataset(packed, transform=_hflip)
    dl = DataLoader(ds, batch_size=4, num_workers=2, shuffle=False)
    xs, ys = zip(*dl)
    assert torch.equal(torch.cat(xs), pack.images[:].flip(-1))
    assert torch.equal(torch.cat(ys), pack.labels[:])


def test_stateful_dataloader_resumes_mid_epoch(packed: Path) -> None:
    StatefulDataLoader = pytest.importorskip("torchdata.stateful_dataloader").StatefulDataLoader

    def make() -> StatefulDataLoader:
        g = torch.Generator()
        g.manual_seed(0)
        return StatefulDataLoader(
            packer.PackDataset(packed), batch_size=3, shuffle=True, num_workers=1, generator=g
        )

    ref = [y.tolist() for _, y in make()]
    a = make()
    it = iter(a)
    head = [next(it)[1].tolist() for _ in range(2)]
    state = a.state_dict()
    b = make()
    b.load_state_dict(state)
    tail = [y.tolist() for _, y in b]
    assert head + tail == ref and len(tail) == 3


def test_split_deterministic_disjoint_complete_stratified(tmp_path: Path) -> None:

    from packer.measure.bench.synth import make_random_pack

    pack = packer.load(make_random_pack(tmp_path / "r", 103, 4, classes=5))
    parts = packer.split(pack, fractions=(0.7, 0.2, 0.1), seed=3)
    again = packer.split(pack, fractions=(0.7, 0.2, 0.1), seed=3)
    assert all(torch.equal(a, b) for a, b in zip(parts, again))
    allrows = torch.cat(parts)
    assert sorted(allrows.tolist()) == list(range(103))
    assert [len(p) for p in parts] == [72, 21, 10]  # 72.1, 20.6, 10.3 -> sum 103
    labels = pack.labels[:]
    for c in range(5):
        n_c = int((labels == c).sum())
        for p, f in zip(parts, (0.7, 0.2, 0.1)):
            assert abs(int((labels[p] == c).sum()) - f * n_c) < 3
    other = packer.split(pack, fractions=(0.7, 0.2, 0.1), seed=4)
    assert not torch.equal(parts[1], other[1])
    flat = packer.split(pack, (0.5, 0.5), seed=0, stratify=False)
    assert sorted(torch.cat(flat).tolist()) == list(range(103))
    assert [len(p) for p in flat] == [52, 51] or [len(p) for p in flat] == [51, 52]
    hist = packer.class_histogram(pack, parts[1])
    assert list(hist) == pack.classes and sum(hist.values()) == 21
    # a split part feeds both roads
    ld = packer.PackLoader(pack, 8, device="cpu", indices=parts[1], shuffle=False)
    assert torch.equal(torch.cat([y for _, y in ld]), labels[parts[1]])
    assert len(Subset(packer.PackDataset(pack), parts[1].tolist())) == 21


def test_split_bad_fractions(packed: Path) -> None:
    with pytest.raises(UsageError, match="sum to 1"):
        packer.split(packed, (0.5, 0.4))
    with pytest.raises(UsageError, match="positive"):
        packer.split(packed, (1.2, -0.2))


@pytest.mark.parametrize(
    "fractions", [("0.5", "0.5"), (True, False), (0.5, "0.5"), [b"1"], (np.bool_(True),)]
)
def test_split_refuses_fractions_that_are_not_numbers(packed: Path, fractions) -> None:
    """Strings were converted by float() and bools taken as 1 and 0; as the docs say,
    they are refused, naming the argument."""
    with pytest.raises(UsageError, match=r"fractions must be numbers, not (str|bool|bytes)"):
        packer.split(packed, fractions)
    parts = packer.split(packed, (np.float32(0.5), 0.5))  # numpy numbers are numbers
    assert sum(len(p) for p in parts) == 13


def test_class_histogram_whole_pack(packed: Path) -> None:
    hist = packer.class_histogram(packed)
    assert hist == {"cat": 4, "dog": 4, "zebra": 5}


def test_dataset_indices_are_not_truncated(pack6) -> None:
    ds = packer.PackDataset(pack6)
    for bad in (0.9, True, "1"):
        with pytest.raises(TypeError, match="integer"):
            ds[bad]  # type: ignore[index]
    with pytest.raises(TypeError, match="integer"):
        ds.__getitems__([3.7])
    assert ds[np.int64(1)][1] == ds[1][1] == ds[torch.tensor(1)][1]
    with pytest.raises(UsageError, match="indices"):
        packer.class_histogram(pack6, torch.tensor([2.9, 3.9]))
    with pytest.raises(UsageError, match="seed"):
        packer.split(pack6, seed=1.5)


def test_class_histogram_counts_out_of_range_and_huge_labels(pack6) -> None:
    class Fake:
        def __init__(self) -> None:
            self.classes = ["cat", "dog"]
            self.labels = torch.tensor([0, 1, 5, 2**63 - 1, -1, 5], dtype=torch.int64)

        def __len__(self) -> int:
            return 6

    hist = packer.class_histogram(Fake())  # type: ignore[arg-type]
    assert hist == {"cat": 1, "dog": 1, "5": 2, str(2**63 - 1): 1, "(unlabeled)": 1}
    assert list(hist)[:2] == ["cat", "dog"]
    assert packer.class_histogram(pack6, torch.tensor([True] * 6)) == {"cat": 3, "dog": 3}
