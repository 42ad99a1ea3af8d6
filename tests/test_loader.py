from __future__ import annotations

from pathlib import Path

import pytest
import torch

import packer
from packer.errors import UsageError
from packer.loader import epoch_indices

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def ids_of(pack: packer.ImagePack, images: torch.Tensor) -> list[int]:
    """Which pack rows a batch holds (rows are distinct in the fixtures)."""
    flat = pack.images.reshape(len(pack), -1)
    return [int((flat == x.reshape(1, -1).cpu()).all(1).nonzero()[0]) for x in images]


def test_every_image_once_per_epoch_last_batch_short(packed: Path) -> None:
    pack = packer.load(packed)
    loader = packer.PackLoader(pack, 4, device="cpu")
    assert len(loader) == 4
    batches = list(loader)
    assert [len(x) for x, _ in batches] == [4, 4, 4, 1]
    seen = [i for x, _ in batches for i in ids_of(pack, x)]
    assert sorted(seen) == list(range(13))
    labels = torch.cat([y for _, y in batches])
    assert labels.tolist() == pack.labels[seen].tolist()


def test_drop_last(packed: Path) -> None:
    loader = packer.PackLoader(packed, 4, device="cpu", drop_last=True)
    assert len(loader) == 3 and [len(x) for x, _ in loader] == [4, 4, 4]


def test_epochs_reshuffle_reproducibly(packed: Path) -> None:
    a = packer.PackLoader(packed, 13, device="cpu", seed=5)
    b = packer.PackLoader(packed, 13, device="cpu", seed=5)
    e0, e1 = next(iter(a))[1], next(iter(a))[1]  # two passes: epochs 0 and 1
    b.set_epoch(0)
    assert torch.equal(next(iter(b))[1], e0)
    b.set_epoch(1)
    assert torch.equal(next(iter(b))[1], e1)
    assert not torch.equal(a.indices(0), a.indices(1))


def test_no_shuffle_is_pack_order(packed: Path) -> None:
    pack = packer.load(packed)
    x, y = next(iter(packer.PackLoader(pack, 13, device="cpu", shuffle=False)))
    assert torch.equal(x, pack.images[:]) and torch.equal(y, pack.labels[:])


@pytest.mark.parametrize(
    "n, world, drop_last",
    [(13, 2, False), (13, 3, False), (13, 4, True), (3, 5, False), (100, 8, False)],
)
def test_ranks_disjoint_equal_and_cover(n: int, world: int, drop_last: bool) -> None:
    parts = [
        epoch_indices(
            n, epoch=3, seed=1, shuffle=True, rank=r, world_size=world, drop_last=drop_last
        )
        for r in range(world)
    ]
    assert len({len(p) for p in parts}) == 1
    allidx = torch.cat(parts).tolist()
    if drop_last:
        assert len(set(allidx)) == len(allidx) == (n // world) * world
    else:
        assert set(allidx) == set(range(n))
        assert len(allidx) - n == (-n) % world  # only the documented padding repeats


def test_rank_loaders_have_equal_batch_counts(packed: Path) -> None:
    loaders = [packer.PackLoader(packed, 3, device="cpu", rank=r, world_size=3) for r in range(3)]
    counts = [len(list(ld)) for ld in loaders]
    assert counts == [len(loaders[0])] * 3 == [2, 2, 2]


def test_bad_rank(packed: Path) -> None:
    with pytest.raises(UsageError, match="outside world_size"):
        packer.PackLoader(packed, 3, device="cpu", rank=3, world_size=3)


def test_background_error_reaches_the_consumer(
    packed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loader = packer.PackLoader(packed, 4, device="cpu")
    calls = {"n": 0}
    real = loader._thread_pool

    def failing_pool():
        calls["n"] += 1
        if calls["n"] >= 2:
            raise OSError("disk went away")
        return real()

    monkeypatch.setattr(loader, "_thread_pool", failing_pool)
    it = iter(loader)
    next(it)
    with pytest.raises(OSError, match="disk went away"):
        for _ in it:
            pass


def test_early_break_then_new_epoch(packed: Path) -> None:
    loader = packer.PackLoader(packed, 2, device="cpu")
    for _ in loader:
        break
    assert sum(len(x) for x, _ in loader) == 13
    loader.close()


def test_normalize_matches_reference() -> None:
    x = torch.randint(0, 256, (2, 3, 5, 4), dtype=torch.uint8)
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    ref = (x.double() / 255 - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(
        1, 3, 1, 1
    )
    out = packer.Normalize(mean, std)(x)
    assert out.dtype == torch.float32
    assert torch.allclose(out.double(), ref, atol=1e-5)
    assert torch.allclose(packer.Normalize(mean, std)(x.float() / 255).double(), ref, atol=1e-5)
    assert packer.Normalize(dtype=torch.bfloat16)(x).dtype == torch.bfloat16


def test_normalize_keeps_channels_last() -> None:
    x = torch.randint(0, 256, (2, 3, 8, 8), dtype=torch.uint8).contiguous(
        memory_format=torch.channels_last
    )
    assert packer.Normalize()(x).is_contiguous(memory_format=torch.channels_last)


@cuda
def test_cuda_nonblocking_equals_synchronized(packed: Path) -> None:
    pack = packer.load(packed)
    fast = packer.PackLoader(pack, 4, device="cuda", seed=3, prefetch=2)
    slow = packer.PackLoader(pack, 4, device="cpu", seed=3)
    norm = packer.Normalize().cuda()
    for _epoch in range(3):
        for (xf, yf), (xs, ys) in zip(fast, slow, strict=True):
            assert xf.device.type == "cuda" and xf.dtype == torch.uint8
            y = norm(xf)  # consume on the GPU right away: the copy must be complete
            torch.cuda.synchronize()
            assert torch.equal(xf.cpu(), xs) and torch.equal(yf.cpu(), ys)
            assert torch.allclose(y.cpu(), packer.Normalize()(xs))


@cuda
def test_cuda_resident_mode_same_batches(packed: Path) -> None:
    a = packer.PackLoader(packed, 5, device="cuda", seed=1, resident=True)
    b = packer.PackLoader(packed, 5, device="cpu", seed=1)
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        assert torch.equal(xa.cpu(), xb) and torch.equal(ya.cpu(), yb)


@cuda
def test_cuda_many_batches_with_reused_buffers(tmp_path: Path) -> None:
    """More batches than pinned buffers, consumer slower than producer: no stale data."""
    from packer.bench.synth import make_random_pack

    pack = packer.load(make_random_pack(tmp_path / "r", 600, 16))
    fast = packer.PackLoader(pack, 7, device="cuda", seed=9, prefetch=2, num_threads=3)
    slow = packer.PackLoader(pack, 7, device="cpu", seed=9)
    for (xf, _), (xs, _) in zip(fast, slow, strict=True):
        torch.cuda._sleep(200_000)  # keep the GPU busy so copies queue behind compute
        assert torch.equal(xf.cpu(), xs)
