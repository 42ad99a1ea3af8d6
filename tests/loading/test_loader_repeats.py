"""PackLoader(repeats=k): repeated augmentation, as torchvision's RASampler."""

from __future__ import annotations

import collections
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import packer
from packer.errors import UsageError
from packer.loading.order import epoch_indices
from packer.measure.bench.synth import make_random_pack
from packer.transforms import RandomResizedCrop


def parts(n: int, world: int, k: int, split: str = "pad", epoch: int = 0) -> list[list[int]]:
    return [
        epoch_indices(
            n,
            epoch=epoch,
            seed=7,
            shuffle=True,
            rank=r,
            world_size=world,
            even_split=split,
            repeats=k,
        ).tolist()
        for r in range(world)
    ]


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(0, 60),
    world=st.integers(1, 9),
    k=st.integers(1, 5),
    split=st.sampled_from(["pad", "trim"]),
)
def test_the_documented_counts(n: int, world: int, k: int, split: str) -> None:
    got = parts(n, world, k, split)
    m = n // world if split == "trim" else math.ceil(n / world)
    assert [len(p) for p in got] == [m] * world  # every rank the length of repeats=1
    perm = epoch_indices(n, epoch=0, seed=7, shuffle=True, rank=0, world_size=1).tolist()
    total = m * world
    counts = collections.Counter(i for p in got for i in p)
    if n * k >= total:  # no head padding: the documented counts exactly
        want = {perm[j]: k for j in range(total // k)}
        if total % k:
            want[perm[total // k]] = total % k
        assert counts == want
        if world >= k:  # every copy of an image on its own rank
            for img in want:
                holders = [r for r, p in enumerate(got) for i in p if i == img]
                assert len(holders) == len(set(holders))
    else:  # fewer entries than ranks need: padded by the head, everything at least k times
        assert set(counts) == set(range(n))
        assert min(counts.values()) >= k


@pytest.mark.parametrize("n, world", [(0, 1), (13, 1), (13, 3), (3, 5), (100, 8)])
def test_repeats_1_is_the_old_order(n: int, world: int) -> None:
    for split in ("pad", "trim"):
        a = parts(n, world, 1, split)
        base = epoch_indices(n, epoch=0, seed=7, shuffle=True, rank=0, world_size=1)
        if world == 1:
            assert a == [base.tolist()]
        # DistributedSampler's rule, written out
        if split == "pad" and n:
            padded = torch.cat([base, base.repeat(world)])[: math.ceil(n / world) * world]
        else:
            padded = base[: (n // world) * world]
        assert a == [padded[r::world].tolist() for r in range(world)]


def test_each_epoch_picks_other_images() -> None:
    first = {i for p in parts(40, 4, 4, epoch=0) for i in p}
    second = {i for p in parts(40, 4, 4, epoch=1) for i in p}
    assert len(first) == len(second) == 10 and first != second


@pytest.fixture(scope="module")
def rows_pack(tmp_path_factory: pytest.TempPathFactory) -> packer.ImagePack:
    """24 random 16x16 images, label i = row i (a label names its image)."""
    n = 24
    return packer.load(make_random_pack(tmp_path_factory.mktemp("rp") / "p", n, 16, classes=n))


def loaders(pack: packer.ImagePack, world: int, k: int, **kw: object) -> list[packer.PackLoader]:
    return [
        packer.PackLoader(pack, 4, device="cpu", seed=3, rank=r, world_size=world, repeats=k, **kw)
        for r in range(world)
    ]


def test_loaders_stream_each_image_k_times_on_k_ranks(rows_pack: packer.ImagePack) -> None:
    lds = loaders(rows_pack, 3, 3)
    got = [[y.tolist() for _, y in ld] for ld in lds]
    assert [len(b) for b in got] == [len(ld) for ld in lds] == [2, 2, 2]  # equal batch counts
    per_rank = [[i for b in batches for i in b] for batches in got]
    assert [len(p) for p in per_rank] == [8, 8, 8]  # 24 / 3, as without repeats
    counts = collections.Counter(i for p in per_rank for i in p)
    assert sorted(counts.values()) == [3] * 8  # 8 images, 3 copies each
    for img in counts:
        assert sum(img in p for p in per_rank) == 3  # one copy per rank
    assert per_rank == [ld.indices(0).tolist() for ld in lds]  # labels name rows
    assert all(list(ld.sampler) == ld.indices(1).tolist() for ld in lds)  # next epoch


def test_copies_in_one_batch_draw_their_own_crop(rows_pack: packer.ImagePack) -> None:
    (ld,) = loaders(rows_pack, 1, 2, transform=RandomResizedCrop(8))
    x, y = next(iter(ld))
    assert y[0] == y[1] and y[2] == y[3]  # one process: an image's copies side by side
    assert not torch.equal(x[0], x[1]) and not torch.equal(x[2], x[3])


def test_resume_mid_epoch_equals_uninterrupted(rows_pack: packer.ImagePack) -> None:
    kw = dict(transform=RandomResizedCrop(8))
    (ref,) = loaders(rows_pack, 1, 3, **kw)
    want = [[(x, y) for x, y in ref] for _ in range(2)]
    (a,) = loaders(rows_pack, 1, 3, **kw)
    it = iter(a)
    for _ in range(2):
        next(it)
    state = a.state_dict()
    assert state["repeats"] == 3 and state["batches"] == 2
    (b,) = loaders(rows_pack, 1, 3, **kw)
    b.load_state_dict(state)
    rest = list(b)
    assert len(rest) == len(want[0]) - 2
    for (x, y), (wx, wy) in zip(rest, want[0][2:]):
        assert torch.equal(x, wx) and torch.equal(y, wy)
    for (x, y), (wx, wy) in zip(b, want[1]):
        assert torch.equal(x, wx) and torch.equal(y, wy)


def test_other_repeats_refused_mid_epoch_fine_at_a_boundary(rows_pack: packer.ImagePack) -> None:
    (a,) = loaders(rows_pack, 1, 3)
    it = iter(a)
    next(it)
    (b,) = loaders(rows_pack, 1, 1)
    with pytest.raises(UsageError, match=r"repeats=1: the state was saved with repeats=3"):
        b.load_state_dict(a.state_dict())
    old = {k: v for k, v in b.state_dict().items() if k != "repeats"}  # before repeats existed
    old["batches"] = 1
    with pytest.raises(UsageError, match=r"repeats=3: the state was saved with repeats=1"):
        a.load_state_dict(old)
    list(it)
    b.load_state_dict(a.state_dict())  # epoch boundary: only the epoch is taken
    assert b.epoch == 1


def test_bad_repeats(rows_pack: packer.ImagePack) -> None:
    for bad, match in [
        (0, r"in \[1, \d+\), not 0"),
        (True, "an integer, not bool"),
        (2.0, "an integer"),
    ]:
        with pytest.raises(UsageError, match=f"^repeats must be {match}"):
            packer.PackLoader(rows_pack, 4, device="cpu", repeats=bad)
