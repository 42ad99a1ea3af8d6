"""PackLoader as a training-loop citizen: resumable state, sampler, epochs, ranks, subsets."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import packer
from conftest import cpu_loader as _loader
from packer.errors import UsageError


def labels_of(loader: packer.PackLoader) -> list[list[int]]:
    return [y.tolist() for _, y in loader]


def rows_of(pack: packer.ImagePack, loader: packer.PackLoader) -> list[list[int]]:
    flat = pack.images.reshape(len(pack), -1)
    return [[int((flat == r.reshape(1, -1)).all(1).nonzero()[0]) for r in x] for x, _ in loader]


@pytest.mark.parametrize("resident", [False, True])
def test_resume_mid_epoch_yields_the_rest_then_goes_on(packed: Path, resident: bool) -> None:
    pack = packer.load(packed)
    kw = dict(device="cpu", seed=4, resident=resident)
    ref = packer.PackLoader(pack, 3, **kw)
    want = [rows_of(pack, ref) for _ in range(3)]  # epochs 0, 1, 2 uninterrupted

    a = packer.PackLoader(pack, 3, **kw)
    rows_of(pack, a)  # epoch 0
    it = iter(a)
    for _ in range(2):
        next(it)
    state = a.state_dict()
    assert state["epoch"] == 1 and state["batches"] == 2
    json.dumps(state)  # plain
    assert all(isinstance(v, (int, str, bool)) for v in state.values())

    b = packer.PackLoader(pack, 3, **kw)
    b.load_state_dict(state)
    b.set_epoch(1)  # as Lightning does after restoring: same epoch keeps the resume point
    assert rows_of(pack, b) == want[1][2:]
    assert rows_of(pack, b) == want[2]


def test_state_at_epoch_end_and_boundary(packed: Path) -> None:
    a = packer.PackLoader(packed, 4, device="cpu")
    list(a)
    assert (a.state_dict()["epoch"], a.state_dict()["batches"]) == (1, 0)
    b = packer.PackLoader(packed, 4, device="cpu", rank=0, world_size=2)
    b.load_state_dict(a.state_dict())  # other world size at a boundary: fine
    assert b.epoch == 1


def test_resume_refused_with_other_world_size_mid_epoch(packed: Path) -> None:
    a = packer.PackLoader(packed, 2, device="cpu", rank=0, world_size=2)
    it = iter(a)
    next(it)
    state = a.state_dict()
    b = packer.PackLoader(packed, 2, device="cpu", rank=0, world_size=3)
    with pytest.raises(UsageError, match="world_size"):
        b.load_state_dict(state)
    c = packer.PackLoader(packed, 2, device="cpu", rank=1, world_size=2)
    c.load_state_dict(state)  # rank 0's state restores rank 1: same position
    assert len(list(c)) == len(c) - 1
    with pytest.raises(UsageError, match="PackLoader state"):
        c.load_state_dict({"epoch": 1})


def test_set_epoch_and_auto_counter_agree(packed: Path) -> None:
    auto = packer.PackLoader(packed, 5, device="cpu", seed=1)
    explicit = packer.PackLoader(packed, 5, device="cpu", seed=1)
    via_sampler = packer.PackLoader(packed, 5, device="cpu", seed=1)
    for epoch in range(3):
        explicit.set_epoch(epoch)
        via_sampler.sampler.set_epoch(epoch)
        iter(via_sampler)  # probes such as Lightning's consume nothing
        a, b, c = labels_of(auto), labels_of(explicit), labels_of(via_sampler)
        assert a == b == c
        assert explicit.epoch == epoch + 1
    assert labels_of(auto) != labels_of(auto)  # epochs 3 and 4 differ


def test_a_second_pass_without_set_epoch_warns_once(packed: Path) -> None:
    loader = packer.PackLoader(packed, 5, device="cpu", seed=1)
    first = labels_of(loader)
    with pytest.warns(UserWarning, match=r"set_epoch\(epoch\) at the start of every epoch") as w:
        second = labels_of(loader)  # epoch 1 by the count, which a resumed process restarts
    assert "takes epoch 1" in str(w[0].message) and w[0].filename == __file__
    assert first != second  # the order did move on, in this process
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="PackLoader")
        labels_of(loader)  # once per loader


def test_no_epoch_warning_when_the_epoch_is_named_or_saved(packed: Path) -> None:
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="PackLoader")
        named = packer.PackLoader(packed, 5, device="cpu")
        for epoch in (0, 1, 1, 2):  # the same value twice is explicit too
            named.set_epoch(epoch)
            labels_of(named)
        via_sampler = packer.PackLoader(packed, 5, device="cpu")
        for epoch in range(3):
            via_sampler.sampler.set_epoch(epoch)
            labels_of(via_sampler)
        in_order = packer.PackLoader(packed, 5, device="cpu", shuffle=False)
        assert labels_of(in_order) == labels_of(in_order)  # no order to replay
        saved = packer.PackLoader(packed, 5, device="cpu")
        for _ in range(3):  # the epoch travels in the saved state
            labels_of(saved)
            saved.state_dict()
        side_by_side = packer.PackLoader(packed, 5, device="cpu")
        pairs = list(zip(side_by_side, side_by_side))  # two passes at once, by design
        assert len(pairs) == 3


def test_sampler_and_dataset(packed: Path) -> None:
    pack = packer.load(packed)
    loader = packer.PackLoader(pack, 4, device="cpu", rank=1, world_size=3, seed=2)
    assert loader.dataset is pack
    assert len(loader.sampler) == 5  # ceil(13 / 3)
    loader.sampler.set_epoch(6)
    assert list(loader.sampler) == loader.indices(6).tolist()
    assert torch.cat([y for _, y in loader]).tolist() == pack.labels[loader.indices(6)].tolist()


# (n, world, batch, drop_last, even_split) -> per-rank batch sizes
RANK_TABLE = [
    (10, 3, 4, False, "pad", [4]),
    (10, 3, 4, True, "pad", [4]),  # drop_last=True no longer empties every rank
    (10, 3, 4, False, "trim", [3]),
    (10, 3, 4, True, "trim", []),
    (10, 3, 3, True, "pad", [3]),
    (13, 2, 4, False, "pad", [4, 3]),
    (13, 2, 4, True, "pad", [4]),
    (2, 3, 4, False, "pad", [1]),  # fewer images than ranks: padded
    (2, 3, 4, False, "trim", []),
    (2, 3, 4, True, "pad", []),
    (13, 1, 4, True, "trim", [4, 4, 4]),
]


@pytest.mark.parametrize("n, world, bs, drop_last, split, sizes", RANK_TABLE)
def test_drop_last_by_even_split_rank_table(
    packed: Path, n: int, world: int, bs: int, drop_last: bool, split: str, sizes: list[int]
) -> None:
    idx = torch.arange(n)
    loaders = [
        packer.PackLoader(
            packed,
            bs,
            device="cpu",
            indices=idx,
            rank=r,
            world_size=world,
            drop_last=drop_last,
            even_split=split,
        )
        for r in range(world)
    ]
    got = [[len(y) for _, y in ld] for ld in loaders]
    assert got == [sizes] * world
    assert all(len(ld) == len(sizes) for ld in loaders)
    rows = torch.cat([ld.indices(0) for ld in loaders]).tolist()
    if split == "trim" and not drop_last:
        assert len(set(rows)) == len(rows)  # trimmed: no repeats
    if split == "pad" and not drop_last:
        assert set(rows) == set(range(n))  # padded: everything


def test_defaults_unchanged(packed: Path) -> None:
    loaders = [packer.PackLoader(packed, 3, device="cpu", rank=r, world_size=3) for r in range(3)]
    assert [len(ld) for ld in loaders] == [2, 2, 2]
    assert loaders[0].even_split == "pad" and not loaders[0].drop_last


@pytest.mark.parametrize("kind", ["int", "mask"])
def test_indices_stream_a_subset_per_epoch_and_rank(packed: Path, kind: str) -> None:
    pack = packer.load(packed)
    subset = torch.tensor([0, 2, 3, 7, 8, 11, 12])
    arg = subset if kind == "int" else torch.isin(torch.arange(13), subset)
    loaders = [
        packer.PackLoader(pack, 2, device="cpu", indices=arg, rank=r, world_size=2, seed=3)
        for r in range(2)
    ]
    epochs = []
    for _ in range(2):
        seen = [i for ld in loaders for b in rows_of(pack, ld) for i in b]
        assert set(seen) == set(subset.tolist()) and len(seen) == 8  # 7 + 1 pad
        epochs.append(seen)
    assert epochs[0] != epochs[1]
    assert pack.images.data_ptr() == loaders[0].pack.images.data_ptr()  # no copy


def test_bad_indices(packed: Path) -> None:
    with pytest.raises(UsageError, match=r"\[0, 13\)"):
        packer.PackLoader(packed, 2, device="cpu", indices=torch.tensor([0, 13]))
    with pytest.raises(UsageError, match="13 entries"):
        packer.PackLoader(packed, 2, device="cpu", indices=torch.ones(5, dtype=torch.bool))
    with pytest.raises(UsageError, match="integers"):
        packer.PackLoader(packed, 2, device="cpu", indices=torch.tensor([0.5]))


def test_state_of_other_rows_refused_mid_epoch(pack6) -> None:
    a = _loader(pack6, indices=[0, 1, 2])
    it = iter(a)
    next(it)
    state = a.state_dict()
    assert isinstance(state["rows"], str)
    with pytest.raises(UsageError, match="streaming other rows"):
        _loader(pack6, indices=[3, 4, 5]).load_state_dict(state)
    with pytest.raises(UsageError, match="streaming other rows"):
        _loader(pack6, indices=[2, 1, 0]).load_state_dict(state)
    b = _loader(pack6, indices=[0, 1, 2])
    b.load_state_dict(state)  # the same rows: fine
    assert [y.tolist() for _, y in b] == [[pack6.labels[2].item()]]
    # at an epoch boundary only the epoch is taken: another subset may go on from there
    boundary = dict(state, batches=0, epoch=3)
    c = _loader(pack6, indices=[3, 4, 5])
    c.load_state_dict(boundary)
    assert c.epoch == 3


@pytest.mark.parametrize(
    ("change", "name"),
    [
        (dict(epoch="x"), "epoch"),
        (dict(epoch=None), "epoch"),
        (dict(epoch=2**70), "epoch"),
        (dict(epoch=2.9), "epoch"),
        (dict(epoch=-1), "epoch"),
        (dict(batches=True), "batches"),
        (dict(batches=1.5), "batches"),
        (dict(batches="1"), "batches"),
        (dict(batches=-1), "batches"),
        (dict(version=True), "version"),
    ],
)
def test_bad_state_fields(pack6, change: dict, name: str) -> None:
    a = _loader(pack6)
    next(iter(a))
    state = dict(a.state_dict(), **change)
    with pytest.raises(UsageError, match=name):
        _loader(pack6).load_state_dict(state)


@pytest.mark.parametrize("state", [[1, 2], "abc", None])
def test_state_not_a_dict(pack6, state: object) -> None:
    with pytest.raises(UsageError, match="not a PackLoader state"):
        _loader(pack6).load_state_dict(state)  # type: ignore[arg-type]


def test_set_epoch_refuses_non_int(pack6) -> None:
    for bad in (1.5, "2", True):
        with pytest.raises(UsageError, match="epoch"):
            _loader(pack6).set_epoch(bad)  # type: ignore[arg-type]
        with pytest.raises(UsageError, match="epoch"):
            _loader(pack6).indices(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "mask",
    [
        torch.tensor([1, 0] * 6 + [1], dtype=torch.uint8),  # a ByteTensor 0/1 mask
        np.array([1, 0] * 6 + [1], dtype=np.uint8),
        np.array([0, 3], dtype=np.uint16),
        torch.tensor([0, 3], dtype=torch.uint32),
    ],
)
def test_unsigned_indices_are_refused_not_read_as_rows(packed: Path, mask: object) -> None:
    """A uint8 0/1 mask was taken as rows 0 and 1: any unsigned dtype is refused, naming
    the argument and the two ways to say it (a bool mask, integer rows)."""
    msg = r"indices must be integer rows \(int64 or int32\) or a bool mask, not uint\d+: .*bool"
    with pytest.raises(UsageError, match=msg):
        packer.PackLoader(packed, 2, device="cpu", indices=mask)
    with pytest.raises(UsageError, match=msg):
        packer.class_histogram(packed, mask)
    as_bool = torch.as_tensor(np.asarray(mask)).bool() if len(mask) == 13 else None
    if as_bool is not None:  # the mask said as bool, and its rows as int32, both work
        rows = as_bool.nonzero().flatten()
        ld = packer.PackLoader(packed, 13, device="cpu", indices=as_bool, shuffle=False)
        ld32 = packer.PackLoader(packed, 13, device="cpu", indices=rows.int(), shuffle=False)
        assert torch.equal(ld.indices(0), rows) and torch.equal(ld32.indices(0), rows)
        hist = packer.class_histogram(packed, as_bool)
        assert sum(hist.values()) == 7 and hist == packer.class_histogram(packed, rows.int())


@pytest.mark.parametrize(
    ("change", "name"),
    [
        (dict(version=1.0), r"state\['version'\]"),
        (dict(version="1"), r"state\['version'\]"),
        (dict(rank=99), r"state\['rank'\] must be in \[0, 1\), not 99"),
        (dict(rank=-5), r"state\['rank'\] must be in \[0, 1\), not -5"),
        (dict(rank=1.0), r"state\['rank'\] must be an integer"),
        (dict(world_size=0), r"state\['world_size'\] must be at least 1"),
        (dict(batch_size=2.0), r"state\['batch_size'\] must be an integer"),
        (dict(samples=-1), r"state\['samples'\] must be at least 0"),
        (dict(seed="4"), r"state\['seed'\] must be an integer"),
        (dict(shuffle=1), r"state\['shuffle'\] must be True or False"),
        (dict(drop_last="no"), r"state\['drop_last'\] must be True or False"),
        (dict(even_split="cut"), r"state\['even_split'\] must be 'pad' or 'trim'"),
        (dict(rows=7), r"state\['rows'\] must be the digest string"),
    ],
)
@pytest.mark.parametrize("batches", [0, 1])
def test_state_fields_of_the_wrong_type_or_range_are_refused(
    packed: Path, change: dict, name: str, batches: int
) -> None:
    """Refused by name at an epoch boundary as mid-epoch, never cast (``1.0 == 1``)."""
    ld = packer.PackLoader(packed, 3, device="cpu")
    state = dict(ld.state_dict(), batches=batches, **change)
    with pytest.raises(UsageError, match=name):
        packer.PackLoader(packed, 3, device="cpu").load_state_dict(state)
    packer.PackLoader(packed, 3, device="cpu").load_state_dict(ld.state_dict())  # as saved
