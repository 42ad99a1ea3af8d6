"""PackLoader over pack sets: the global order (same batches as one pack), the
shard-aware order (coverage, locality, purity), elastic resume, mixing packs with
weights, and a store that fetches shards (held, prefetched and let go in time)."""

from __future__ import annotations

import shutil
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

import packer
from conftest import write_image
from packer.builder.api import BuildConfig, build
from packer.errors import UsageError
from packer.loading.order import shard_sequence
from packer.storage.packset import PackSet, ShardStore, open_set

N = 30
RAW = BuildConfig(size=(8, 6), workers=1)


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """30 images in 3 classes as one raw pack, a raw set of 10 shards (3 a shard), a
    JPEG pack and a JPEG set of several shards."""
    root = tmp_path_factory.mktemp("sets")
    for i in range(N):
        write_image(root / "src" / f"c{i % 3}" / f"{i:02d}.png", (20, 16), seed=i)
    out = {}
    build(root / "src", root / "one", RAW)
    build(root / "src", root / "set", replace(RAW, shard_size=3 * 144))
    jpeg = replace(RAW, store="jpeg")
    build(root / "src", root / "jone", jpeg)
    build(root / "src", root / "jset", replace(jpeg, shard_size=2500))
    for k in ("one", "set", "jone", "jset"):
        out[k] = root / k
    return out


def _ids(loader: packer.PackLoader, pack: object) -> list[int]:
    """Each yielded image's index in ``pack`` (images are distinct)."""
    ref = pack.images.reshape(len(pack), -1) if hasattr(pack, "images") else None
    out = []
    for x, *_ in loader:
        flat = x.reshape(len(x), -1)
        out += [int((ref == r).all(1).nonzero()[0]) for r in flat]
    return out


def _labels(loader: packer.PackLoader, epoch: int | None = None) -> list[list[int]]:
    if epoch is not None:
        loader.set_epoch(epoch)
    return [y.tolist() for _, y in loader]


def test_a_set_streams_the_same_batches_as_one_pack(packs: dict[str, Path]) -> None:
    one, s = packer.load(packs["one"]), packer.load(packs["set"])
    assert isinstance(s, PackSet) and len(s.index.shards) == 10
    for epoch in (0, 1):
        a = packer.PackLoader(one, 7, device="cpu", seed=3)
        b = packer.PackLoader(s, 7, device="cpu", seed=3)
        a.set_epoch(epoch)
        b.set_epoch(epoch)
        for (xa, ya), (xb, yb) in zip(a, b, strict=True):
            assert xa.equal(xb) and ya.equal(yb)
    assert _ids(packer.PackLoader(packs["set"], 8, device="cpu"), one)  # a path opens too


def test_a_jpeg_set_streams_the_same_batches_as_one_jpeg_pack(packs: dict[str, Path]) -> None:
    one, s = packer.load(packs["jone"]), packer.load(packs["jset"])
    assert len(s.index.shards) >= 3
    a = packer.PackLoader(one, 5, device="cpu", seed=1, image_size=8)
    b = packer.PackLoader(s, 5, device="cpu", seed=1, image_size=8)
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        assert xa.equal(xb) and ya.equal(yb)


@pytest.mark.parametrize("order", ["global", "shards"])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("kind", ["set", "jset"])
def test_every_image_once_per_epoch_and_equal_batches(
    packs: dict[str, Path], order: str, world: int, kind: str
) -> None:
    s = packer.load(packs[kind])
    extra = {"image_size": 8} if kind == "jset" else {}
    for epoch in (0, 1):
        seen: list[int] = []
        lengths = set()
        for rank in range(world):
            ld = packer.PackLoader(
                s, 4, device="cpu", order=order, rank=rank, world_size=world, **extra
            )
            rows = ld.indices(epoch)
            lengths.add((len(ld), len(rows)))
            seen += rows.tolist()
        assert len(lengths) == 1  # every rank the same number of batches and images
        per = -(-N // world)
        assert len(seen) == per * world
        counts = Counter(seen)
        assert set(counts) == set(range(N))
        assert sum(c - 1 for c in counts.values()) == per * world - N  # only the documented pad


def test_the_shard_order_streams_what_its_indices_say(packs: dict[str, Path]) -> None:
    s, one = packer.load(packs["set"]), packer.load(packs["one"])
    ld = packer.PackLoader(s, 4, device="cpu", order="shards", seed=5)
    ld.set_epoch(2)
    assert _ids(ld, one) == ld.indices(2).tolist()


def test_each_rank_reads_few_shards_under_the_shard_order(packs: dict[str, Path]) -> None:
    s = packer.load(packs["set"])
    spread = {}
    for order in ("global", "shards"):
        shards = []
        for rank in range(2):
            ld = packer.PackLoader(s, 3, device="cpu", order=order, rank=rank, world_size=2)
            shards.append(set(s.locate(ld.indices(0))[0].tolist()))
        spread[order] = shards
    # shard order: the 10 shards fall into two disjoint parts (one shard may straddle)
    a, b = spread["shards"]
    assert len(a & b) <= 1 and len(a) <= 6 and len(b) <= 6
    assert len(spread["global"][0]) >= 8  # the global order reads nearly every shard


def test_the_shard_order_is_a_pure_function_of_seed_and_epoch() -> None:
    counts = [5, 7, 3, 9, 4, 6]
    kw = {"seed": 11, "shuffle": True, "parts": 2, "window": 2}
    a = shard_sequence(counts, epoch=3, **kw)
    torch.manual_seed(123)  # no global RNG state is read
    np.random.seed(7)
    torch.rand(5)
    assert shard_sequence(counts, epoch=3, **kw).equal(a)
    assert not shard_sequence(counts, epoch=4, **kw).equal(a)
    assert sorted(a.tolist()) == list(range(sum(counts)))
    # windows: the first window of each part holds images of at most window + 1 shards
    off = np.concatenate([[0], np.cumsum(counts)])
    first = a[0::2][:12].numpy()  # part 0's first 12 images (window = 2 * 6 images)
    assert len(set((np.searchsorted(off, first, side="right") - 1).tolist())) <= 3
    flat = shard_sequence(counts, epoch=0, seed=0, shuffle=False, parts=1, window=2)
    assert flat.tolist() == list(range(sum(counts)))


@pytest.mark.parametrize("order", ["global", "shards"])
@pytest.mark.parametrize(("before", "after"), [((4, 2), (2, 4)), ((2, 3), (3, 2))])
def test_elastic_resume_covers_the_epoch_once(
    packs: dict[str, Path], order: str, before: tuple[int, int], after: tuple[int, int]
) -> None:
    """Saved on W ranks of batch B mid-epoch, resumed on W' ranks of batch B' with the
    same global batch: the batches seen before and after hold every image once."""
    s = packer.load(packs["set"])
    (w0, b0), (w1, b1) = before, after
    assert w0 * b0 == w1 * b1
    seen: list[int] = []
    state = None
    for rank in range(w0):
        ld = packer.PackLoader(s, b0, device="cpu", order=order, rank=rank, world_size=w0, seed=9)
        ld.set_epoch(1)
        it = iter(ld)
        for _ in range(2):
            next(it)
        seen += ld.indices(1)[: 2 * b0].tolist()
        state = ld.state_dict()
        it.close()
    assert state is not None and state["batches"] == 2
    for rank in range(w1):
        ld = packer.PackLoader(s, b1, device="cpu", order=order, rank=rank, world_size=w1, seed=9)
        ld.load_state_dict(state)
        rows = ld.indices(1)
        rest = rows[2 * b1 :].tolist()
        got = [y for _, y in ld]
        assert len(got) == len(ld) - 2
        assert torch.cat(got).tolist() == s.labels[rest].tolist()
        seen += rest
    counts = Counter(seen)
    assert set(counts) == set(range(N))
    pad = -(-N // w1) * w1 - N
    assert sum(c - 1 for c in counts.values()) == pad


def test_resume_refuses_another_global_batch_or_order(packs: dict[str, Path]) -> None:
    s = packer.load(packs["set"])
    ld = packer.PackLoader(s, 4, device="cpu", rank=0, world_size=2)
    it = iter(ld)
    next(it)
    state = ld.state_dict()
    it.close()
    other = packer.PackLoader(s, 4, device="cpu", rank=0, world_size=1)
    with pytest.raises(UsageError, match=r"global batch 4\).*global batch 8"):
        other.load_state_dict(state)
    shards = packer.PackLoader(s, 4, device="cpu", rank=0, world_size=2, order="shards")
    with pytest.raises(UsageError, match=r"order='shards'.*saved with order='global'"):
        shards.load_state_dict(state)


def test_the_shard_order_state_carries_its_canonical_ranks(packs: dict[str, Path]) -> None:
    s = packer.load(packs["set"])
    ld = packer.PackLoader(s, 3, device="cpu", order="shards", rank=0, world_size=2)
    it = iter(ld)
    next(it)
    state = ld.state_dict()
    it.close()
    assert state["canonical_ranks"] == 2 and state["order"] == "shards"
    one = packer.PackLoader(s, 6, device="cpu", order="shards")
    one.load_state_dict(state)
    assert one.canonical_ranks == 2  # the saved order goes on, not one of 1 part


def test_mixing_draws_fixed_proportions_per_epoch(packs: dict[str, Path]) -> None:
    one, s = packer.load(packs["one"]), packer.load(packs["set"])
    ld = packer.PackLoader([one, s], 6, device="cpu", weights=(0.8, 0.2), epoch_size=20)
    assert len(ld) == 4
    for epoch in (0, 1):
        rows = ld.indices(epoch)
        assert len(rows) == 20
        assert int((rows < N).sum()) == 16 and int((rows >= N).sum()) == 4
        assert len(set(rows[rows < N].tolist())) == 16  # drawn without replacement
    assert not ld.indices(0).equal(ld.indices(1))
    again = packer.PackLoader([one, s], 6, device="cpu", weights=(0.8, 0.2), epoch_size=20)
    assert again.indices(1).equal(ld.indices(1))
    got = torch.cat([y for _, y in ld])
    both = torch.cat([one.labels, s.labels])
    ld.set_epoch(0)
    assert got.tolist() == both[ld.indices(0)].tolist()
    over = packer.PackLoader([one, s], 10, device="cpu", weights=(3, 1), epoch_size=80)
    rows = over.indices(0)
    assert Counter((rows < N).tolist())[True] == 60  # more than the pack holds: whole passes


def test_mixing_refuses_packs_that_differ(packs: dict[str, Path]) -> None:
    one, j = packer.load(packs["one"]), packer.load(packs["jone"])
    with pytest.raises(UsageError, match=r"packs to mix must share storage: .*'raw'.*'jpeg'"):
        packer.PackLoader([one, j], 4, device="cpu", weights=(1, 1))
    with pytest.raises(UsageError, match=r"weights must be 2 positive numbers"):
        packer.PackLoader([one, one], 4, device="cpu", weights=(1, 0))
    with pytest.raises(UsageError, match="weights= and epoch_size= mix several packs"):
        packer.PackLoader(one, 4, device="cpu", weights=(1,))


class _Fetching(ShardStore):
    """A store that copies each shard into a cache folder when fetched and removes it
    when the last hold goes: a reader that used a shard after letting go would fail."""

    remote = True
    prefetch_depth = 1

    def __init__(self, root: Path, cache: Path, limit: int | None = None) -> None:
        self.root, self.cache, self.limit = root, cache, limit
        self.index = packer.load(root).index
        self.holds: Counter[int] = Counter()
        self.most = 0
        self.fetches = 0
        self.prefetched: list[int] = []

    def fetch(self, k: int) -> Path:
        name = self.index.shards[k].name
        dst = self.cache / name
        if not dst.exists():
            shutil.copytree(self.root / name, dst)
            self.fetches += 1
        self.holds[k] += 1
        self.most = max(self.most, sum(1 for v in self.holds.values() if v))
        return dst

    def release(self, k: int) -> None:
        self.holds[k] -= 1
        if not self.holds[k]:
            shutil.rmtree(self.cache / self.index.shards[k].name)

    def prefetch(self, ks: list[int]) -> None:
        self.prefetched += list(ks)


@pytest.mark.parametrize(
    "kind, device",
    [("set", "cpu"), ("jset", "cpu"), pytest.param("set", "cuda", marks=pytest.mark.cuda)],
)
def test_a_fetching_store_holds_only_the_shards_in_use(
    packs: dict[str, Path], tmp_path: Path, kind: str, device: str
) -> None:
    local = open_set(packs[kind])
    store = _Fetching(packs[kind], tmp_path)
    s = PackSet(local.path, local.index, local.manifests, store)
    extra = {"image_size": 8} if kind == "jset" else {}
    a = packer.PackLoader(local, 3, device=device, order="shards", seed=2, **extra)
    b = packer.PackLoader(s, 3, device=device, order="shards", seed=2, num_threads=2, **extra)
    need, held = b.working_set()
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        assert xa.equal(xb) and ya.equal(yb)
    shards = len(local.index.shards)
    assert store.fetches == shards and not any(store.holds.values())  # all let go at the end
    # a JPEG pass decodes two batches ahead, a CUDA one gathers `prefetch` batches ahead:
    # their shards are held too, and the working set (less the prefetched) covers them
    most = {("set", "cpu"): 3, ("jset", "cpu"): 5}.get((kind, device), shards)
    assert store.most <= most and store.prefetched
    assert device == "cuda" or most < shards  # on the CPU, a few shards at a time
    assert store.most <= held <= shards  # never more than the set (issue 42.9)
    assert need >= sum(sorted((e.bytes for e in local.index.shards), reverse=True)[: store.most])
    assert not list(tmp_path.iterdir())


def test_a_cache_below_the_working_set_is_refused_before_the_first_batch(
    packs: dict[str, Path], tmp_path: Path
) -> None:
    local = open_set(packs["set"])
    store = _Fetching(packs["set"], tmp_path, limit=2 * 432)
    s = PackSet(local.path, local.index, local.manifests, store)
    ld = packer.PackLoader(s, 3, device="cpu")  # the global order holds every shard
    with pytest.raises(UsageError, match=r"cache limit of 864 bytes is below .* working set of"):
        next(iter(ld))
    assert store.fetches == 0


def test_dataset_split_and_histogram_take_a_set(packs: dict[str, Path]) -> None:
    s, one = packer.load(packs["set"]), packer.load(packs["one"])
    ds = packer.PackDataset(s)
    assert len(ds) == N
    for i in (0, 4, 29):
        x, y = ds[i]
        assert x.equal(one.images[i]) and y == int(one.labels[i])
    assert packer.class_histogram(s) == packer.class_histogram(one)
    assert [p.tolist() for p in packer.split(s, seed=1)] == [
        p.tolist() for p in packer.split(one, seed=1)
    ]
    ld = packer.PackLoader(s, 4, device="cpu", indices=packer.split(s)[1], order="shards")
    assert sorted(torch.cat([y for _, y in ld]).tolist()) == sorted(
        s.labels[packer.split(s)[1]].tolist()
    )


def test_set_loader_arguments_are_checked(packs: dict[str, Path]) -> None:
    s = packer.load(packs["set"])
    with pytest.raises(UsageError, match="order must be 'global' or 'shards', not 'x'"):
        packer.PackLoader(s, 4, device="cpu", order="x")
    with pytest.raises(UsageError, match="indices= must not repeat rows"):
        packer.PackLoader(s, 4, device="cpu", order="shards", indices=[1, 1])
    with pytest.raises(UsageError, match="canonical_ranks must be at least 1"):
        packer.PackLoader(s, 4, device="cpu", canonical_ranks=0)


def test_a_mixed_loader_resumes_mid_epoch_exactly(packs: dict[str, Path]) -> None:
    one, s = packer.load(packs["one"]), packer.load(packs["set"])

    def make() -> packer.PackLoader:
        return packer.PackLoader([one, s], 4, device="cpu", weights=(2, 1), seed=4)

    full = make()
    full.set_epoch(3)
    want = [y.tolist() for _, y in full]
    first = make()
    first.set_epoch(3)
    it = iter(first)
    got = [next(it)[1].tolist() for _ in range(5)]
    state = first.state_dict()
    it.close()
    again = make()
    again.load_state_dict(state)
    got += [y.tolist() for _, y in again]
    assert got == want
    other = packer.PackLoader([one, s], 4, device="cpu", weights=(1, 1), seed=4)
    with pytest.raises(UsageError, match="streaming other rows"):
        other.load_state_dict(state)


def test_a_unit_held_while_its_last_let_go_unmaps_stays_mapped(
    packs: dict[str, Path], tmp_path: Path
) -> None:
    """Two passes over one fetched set (zip(loader, loader)): one lets go of a shard as the
    other holds it. A hold that slipped between the let-go's count and its unmap left the
    shard held but unmapped, and the next gather read an unmapped slot (a segfault)."""
    import threading

    from packer.loading.sets import Units

    local = open_set(packs["set"])
    store = _Fetching(packs["set"], tmp_path)
    units = Units([PackSet(local.path, local.index, local.manifests, store)])
    assert units.space is not None
    units.hold(0)
    unmap = units.space.unmap
    other = threading.Thread(target=units.hold, args=(0,))

    def unmap_as_another_pass_holds(k: int) -> None:
        other.start()
        other.join(timeout=0.2)  # the buggy code let it finish here; a fixed one blocks it
        unmap(k)

    units.space.unmap = unmap_as_another_pass_holds  # type: ignore[method-assign]
    units.let_go(0)
    other.join()
    assert units.held(0) and units.space.mapped[0] and store.holds[0] == 1
    assert units.array[units.translate(np.array([0]))].any()  # readable, not a segfault
    units.space.unmap = unmap  # type: ignore[method-assign]
    units.let_go(0)
    assert not units.space.mapped[0] and store.holds[0] == 0
    units.close()


def test_a_refused_shard_order_state_leaves_the_loader_unchanged(packs: dict[str, Path]) -> None:
    s = packer.load(packs["set"])
    ld = packer.PackLoader(s, 3, device="cpu", order="shards", canonical_ranks=4, shard_window=3)
    it = iter(ld)
    next(it)
    state = {**ld.state_dict(), "batches": 99}
    it.close()
    other = packer.PackLoader(s, 3, device="cpu", order="shards")
    want = other.indices(0).tolist()
    with pytest.raises(UsageError, match="state has 99 batches done of an epoch of 10"):
        other.load_state_dict(state)
    assert (other.canonical_ranks, other.shard_window) == (1, 2)
    assert other.indices(0).tolist() == want


def test_the_sampler_yields_the_rows_the_loader_streams(packs: dict[str, Path]) -> None:
    """``loader.sampler`` / ``batch_sampler`` (what Lightning and a DataLoader over
    PackDataset read) follow order='shards' and mixing, not the global permutation."""
    one, s = packer.load(packs["one"]), packer.load(packs["set"])
    for ld in (
        packer.PackLoader(s, 4, device="cpu", order="shards", rank=1, world_size=2, seed=3),
        packer.PackLoader([one, s], 4, device="cpu", weights=(0.9, 0.1), seed=3),
    ):
        ld.set_epoch(2)
        want = ld.indices(2).tolist()
        assert list(ld.sampler) == want and len(ld.sampler) == len(want)
        assert [r for b in ld.batch_sampler for r in b] == want


def test_jpeg_packs_and_sets_mix(packs: dict[str, Path]) -> None:
    """A list of JPEG sources decodes: the kind is the sources' storage, not the list's
    (which has none, and was taken for raw: image_size refused, nothing decoded)."""
    one, s = packer.load(packs["jone"]), packer.load(packs["jset"])
    labels = torch.cat([one.labels, s.labels])
    for kw in ({}, {"weights": (1, 3), "epoch_size": 20}):
        ld = packer.PackLoader([one, s], 4, device="cpu", image_size=8, seed=1, **kw)
        ld.set_epoch(0)
        got = [(x, y) for x, y in ld]
        assert all(x.shape[1:] == (3, 8, 8) for x, _ in got)
        assert torch.cat([y for _, y in got]).tolist() == labels[ld.indices(0)].tolist()


def test_without_a_row_space_a_set_is_gathered_shard_by_shard(
    packs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where shards cannot be mapped side by side (rowspace.supported() False: neither
    Linux nor macOS) the same batches come, shard by shard, also from a fetching store."""
    from packer.loading import rowspace

    s = open_set(packs["set"])
    want = [y.tolist() for _, y in packer.PackLoader(s, 7, device="cpu", seed=3)]
    one = packer.load(packs["one"])
    monkeypatch.setattr(rowspace, "supported", lambda: False)
    store = _Fetching(packs["set"], tmp_path)
    fetched = PackSet(s.path, s.index, s.manifests, store)
    for src in (s, fetched):
        ld = packer.PackLoader(src, 7, device="cpu", seed=3)
        assert ld._units.space is None
        got = list(ld)
        assert [y.tolist() for _, y in got] == want
        assert all(x.equal(one.images[i]) for (x, _), i in zip(got, ld.indices(0).split(7)))
    assert not any(store.holds.values())
