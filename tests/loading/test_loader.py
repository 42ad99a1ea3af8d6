from __future__ import annotations

from pathlib import Path

import pytest
import torch

import packer
from packer.errors import UsageError
from packer.loading.order import epoch_indices


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
    "n, world, split",
    [
        (13, 2, "pad"),
        (13, 3, "pad"),
        (13, 4, "trim"),
        (3, 5, "pad"),
        (100, 8, "pad"),
        (3, 5, "trim"),
    ],
)
def test_ranks_disjoint_equal_and_cover(n: int, world: int, split: str) -> None:
    parts = [
        epoch_indices(n, epoch=3, seed=1, shuffle=True, rank=r, world_size=world, even_split=split)
        for r in range(world)
    ]
    assert len({len(p) for p in parts}) == 1
    allidx = torch.cat(parts).tolist()
    if split == "trim":
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
    import packer.loading.producer as producer_mod  # where _Pass looks _take up

    loader = packer.PackLoader(packed, 4, device="cpu", prefetch=1)
    calls = {"n": 0}
    real = producer_mod._take

    def failing_take(*args):
        calls["n"] += 1
        if calls["n"] >= 2:
            raise OSError("disk went away")
        return real(*args)

    monkeypatch.setattr(producer_mod, "_take", failing_take)
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


@pytest.mark.cuda
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


@pytest.mark.cuda
def test_cuda_resident_mode_same_batches(packed: Path) -> None:
    a = packer.PackLoader(packed, 5, device="cuda", seed=1, resident=True)
    b = packer.PackLoader(packed, 5, device="cpu", seed=1)
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        assert torch.equal(xa.cpu(), xb) and torch.equal(ya.cpu(), yb)


@pytest.mark.cuda
def test_cuda_many_batches_with_reused_buffers(tmp_path: Path) -> None:
    """More batches than pinned buffers, consumer slower than producer: no stale data."""
    from packer.measure.bench.synth import make_random_pack

    pack = packer.load(make_random_pack(tmp_path / "r", 600, 16))
    fast = packer.PackLoader(pack, 7, device="cuda", seed=9, prefetch=2, num_threads=3)
    slow = packer.PackLoader(pack, 7, device="cpu", seed=9)
    for (xf, _), (xs, _) in zip(fast, slow, strict=True):
        torch.cuda._sleep(200_000)  # keep the GPU busy so copies queue behind compute
        assert torch.equal(xf.cpu(), xs)


@pytest.mark.parametrize("device", ["mps", "meta", "xla", "nonsense"])
def test_unsupported_devices_refused(packed: Path, device: str) -> None:
    with pytest.raises(UsageError, match="cpu"):
        packer.PackLoader(packed, 4, device=device)


def test_zip_of_one_loader_runs_two_passes(packed: Path) -> None:
    pack = packer.load(packed)
    loader = packer.PackLoader(pack, 4, device="cpu", prefetch=1)
    pairs = list(zip(loader, loader))
    assert len(pairs) == len(loader) == 4
    for side in (0, 1):
        seen = [i for pair in pairs for i in ids_of(pack, pair[side][0])]
        assert sorted(seen) == list(range(13))
    assert loader.epoch == 2  # two passes, epochs 0 and 1


def test_nested_loop_keeps_the_outer_epoch_whole(packed: Path) -> None:
    pack = packer.load(packed)
    loader = packer.PackLoader(pack, 4, device="cpu")
    outer, inner_counts = [], []
    for x, _ in loader:
        outer += ids_of(pack, x)
        inner_counts.append(sum(len(xi) for xi, _ in loader))
    assert sorted(outer) == list(range(13))
    assert inner_counts == [13] * 4


def test_break_then_next_loop_is_the_next_epoch(packed: Path) -> None:
    loader = packer.PackLoader(packed, 13, device="cpu", seed=2)
    for _ in loader:
        break
    assert loader.epoch == 1
    _, y = next(iter(loader))
    assert torch.equal(y, packer.load(packed).labels[loader.indices(1)])


def test_unread_iter_consumes_no_epoch(packed: Path) -> None:
    loader = packer.PackLoader(packed, 4, device="cpu")
    iter(loader)
    iter(loader)
    assert loader.epoch == 0


def test_context_manager_stops_threads(packed: Path) -> None:
    import threading

    before = threading.active_count()
    with packer.PackLoader(packed, 2, device="cpu", num_threads=3) as loader:
        it = iter(loader)
        next(it)
        assert threading.active_count() > before
    assert threading.active_count() == before
    with pytest.raises(StopIteration):
        next(it)


class RecordingTransform:
    """Flips every image and records its generator's first draw (stands in for
    packer.transforms): output has a different width than the pack."""

    accepts_generator = True

    def __init__(self) -> None:
        self.draws: list[int] = []

    def __call__(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        assert images.dtype == torch.uint8 and images.dim() == 4
        self.draws.append(int(torch.randint(0, 2**31, (1,), generator=generator)))
        return images[..., :-2].flip(-1)


def _draw(seed: int, epoch: int, rank: int, batch: int) -> int:
    g = torch.Generator()
    g.manual_seed(packer.batch_seed(seed, epoch, rank, batch))
    return int(torch.randint(0, 2**31, (1,), generator=g))


@pytest.mark.parametrize("resident", [False, True])
def test_transform_applied_with_per_batch_generator(packed: Path, resident: bool) -> None:
    pack = packer.load(packed)
    t = RecordingTransform()
    loader = packer.PackLoader(
        pack, 4, device="cpu", seed=3, rank=1, world_size=2, transform=t, resident=resident
    )
    plain = packer.PackLoader(pack, 4, device="cpu", seed=3, rank=1, world_size=2)
    for epoch in range(2):
        got = list(loader)
        ref = list(plain)
        assert len(got) == len(ref) == 2
        for (x, y), (xr, yr) in zip(got, ref, strict=True):
            assert x.shape == (len(xr), 3, 24, 30)  # the transform's shape, not the pack's
            assert torch.equal(x, xr[..., :-2].flip(-1)) and torch.equal(y, yr)
        assert t.draws[-2:] == [_draw(3, epoch, 1, b) for b in range(2)]
    assert len(set(t.draws)) == 4
    assert _draw(3, 0, 0, 0) != _draw(3, 0, 1, 0)  # ranks draw differently


def test_transform_without_generator_and_error(packed: Path) -> None:
    loader = packer.PackLoader(packed, 4, device="cpu", transform=lambda x: x.float() / 255)
    x, _ = next(iter(loader))
    assert x.dtype == torch.float32 and float(x.max()) <= 1

    def broken(x: torch.Tensor) -> torch.Tensor:
        raise ValueError("bad crop size")

    with pytest.raises(ValueError, match="bad crop size"):
        next(iter(packer.PackLoader(packed, 4, device="cpu", transform=broken)))
    with pytest.raises(UsageError, match="callable"):
        packer.PackLoader(packed, 4, device="cpu", transform=3)


def _grey_transform(x: torch.Tensor) -> torch.Tensor:
    return x.float().mean(1)  # [B, H, W]: one channel dropped with the others


@pytest.mark.parametrize(
    ("transform", "shape"),
    [
        (_grey_transform, r"\[4, 24, 32\]"),
        (lambda x: x[:, :1], r"\[4, 1, 24, 32\]"),
        (lambda x: x.reshape(4, -1), r"\[4, 2304\]"),
        (lambda x: x[..., None], r"\[4, 3, 24, 32, 1\]"),
        (lambda x: x[:, :, :0], r"\[4, 3, 0, 32\]"),
    ],
)
@pytest.mark.parametrize("resident", [False, True])
def test_transform_must_return_images_of_three_channels(
    packed: Path, transform, shape: str, resident: bool
) -> None:
    """Only the batch size was checked, so [B, H, W] passed: the whole [B, 3, h, w]
    contract is (rank, batch, channels), naming the transform and what it returned."""
    ld = packer.PackLoader(packed, 4, device="cpu", transform=transform, resident=resident)
    with pytest.raises(UsageError, match=rf"transform .* returned shape {shape}; .*\[B, 3, h, w\]"):
        next(iter(ld))


def test_a_jpeg_packs_transform_is_checked_after_its_crop(tmp_path: Path) -> None:
    from conftest import write_image
    from packer.builder import BuildConfig, build
    from packer.transforms import Compose, RandomResizedCrop

    for i in range(4):
        write_image(tmp_path / "src" / f"{i}.jpg", (30, 20), seed=i)
    build(tmp_path / "src", tmp_path / "p", BuildConfig(store="jpeg", workers=1))
    bad = Compose([RandomResizedCrop(8), _grey_transform])
    for transform, kw in ((bad, {}), (_grey_transform, {"image_size": 8})):
        ld = packer.PackLoader(tmp_path / "p", 2, device="cpu", transform=transform, **kw)
        with pytest.raises(UsageError, match=r"returned shape \[2, 8, 8\]; .*\[B, 3, h, w\]"):
            next(iter(ld))


def test_normalize_still_importable_from_loader() -> None:
    from packer.imaging.normalize import IMAGENET_MEAN, Normalize

    assert Normalize is packer.Normalize and IMAGENET_MEAN[0] == 0.485


@pytest.mark.cuda
def test_cuda_concurrent_passes_and_transform_match_cpu(packed: Path) -> None:
    pack = packer.load(packed)
    kw = dict(seed=2, prefetch=2, transform=RecordingTransform())
    fast = packer.PackLoader(pack, 4, device="cuda", **kw)
    slow = packer.PackLoader(pack, 4, device="cpu", **{**kw, "transform": RecordingTransform()})
    for (a, b), (c, d) in zip(zip(fast, fast), zip(slow, slow), strict=True):
        torch.cuda._sleep(100_000)  # consumer busy: copies and transforms queue up
        assert a[0].shape == c[0].shape and a[0].device.type == "cuda"
        assert torch.equal(a[0].cpu(), c[0]) and torch.equal(b[0].cpu(), d[0])
        assert torch.equal(a[1].cpu(), c[1]) and torch.equal(b[1].cpu(), d[1])
    assert sorted(fast.transform.draws) == sorted(slow.transform.draws)  # two threads each


@pytest.mark.cuda
def test_cuda_resume_and_dropped_loaders(packed: Path) -> None:
    import gc
    import sys
    import threading
    import traceback

    a = packer.PackLoader(packed, 3, device="cuda", seed=6)
    ref = [y.cpu().tolist() for _, y in a]
    b = packer.PackLoader(packed, 3, device="cuda", seed=6)
    it = iter(b)
    next(it)
    next(it)
    c = packer.PackLoader(packed, 3, device="cuda", seed=6)
    c.load_state_dict(b.state_dict())
    assert [y.cpu().tolist() for _, y in c] == ref[2:]
    before = threading.active_count()
    names = {t.name for t in threading.enumerate()}
    loaders = [packer.PackLoader(packed, 1, device="cuda", num_threads=2) for _ in range(8)]
    iters = [iter(ld) for ld in loaders]
    for i in iters:
        next(i)
    del loaders, iters, it, b, i  # (the loop variable holds the last iterator)
    gc.collect()
    left = [t for t in threading.enumerate() if t.name not in names]
    frames = sys._current_frames()
    where = {
        t.name: traceback.format_stack(frames[t.ident])[-3:] for t in left if t.ident in frames
    }
    assert threading.active_count() <= before, where
