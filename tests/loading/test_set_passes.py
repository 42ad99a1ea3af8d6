"""Loading pack sets, round 4 (issue 42): a resume state saved over another shard cut
is refused (7); the working set is never more than the set (9)."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

import packer
from conftest import write_image
from packer.builder.api import BuildConfig, build
from packer.errors import UsageError
from packer.storage.packset import PackSet, ShardStore, open_set

N = 24
RAW = BuildConfig(size=(8, 6), workers=1)  # a row is 144 bytes


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same 24 images as a set of 8 shards (3 a shard), of 6 shards (4 a shard),
    and as one pack."""
    root = tmp_path_factory.mktemp("sets4")
    for i in range(N):
        write_image(root / "src" / f"c{i % 3}" / f"{i:02d}.png", (20, 16), seed=i)
    build(root / "src", root / "by3", replace(RAW, shard_size=3 * 144))
    build(root / "src", root / "by4", replace(RAW, shard_size=4 * 144))
    build(root / "src", root / "one", RAW)
    return {k: root / k for k in ("by3", "by4", "one")}


def _ids(batch: object, ref: object) -> list[int]:
    flat = ref.images.reshape(len(ref), -1)
    return [int((flat == r.reshape(-1)).all(1).nonzero()[0]) for r in batch]


@pytest.mark.parametrize("other", ["by4", "one"])
def test_a_shards_state_over_another_shard_cut_is_refused(
    sets: dict[str, Path], other: str
) -> None:
    """Issue 42.7: a mid-epoch order="shards" state saved over 8 shards was taken by a
    loader over the same images in 6 shards, and the rest of the epoch repeated and
    skipped images silently."""
    a = packer.PackLoader(packer.load(sets["by3"]), 4, device="cpu", order="shards", seed=5)
    a.set_epoch(1)
    it = iter(a)
    next(it), next(it)
    state = a.state_dict()
    b = packer.PackLoader(packer.load(sets[other]), 4, device="cpu", order="shards", seed=5)
    with pytest.raises(UsageError, match=r"saved over another shard cut .*another shard size"):
        b.load_state_dict(state)
    # the same cut resumes exactly: the rest of the epoch, every image once over the epoch
    ref = packer.load(sets["one"])
    c = packer.PackLoader(packer.load(sets["by3"]), 4, device="cpu", order="shards", seed=5)
    c.load_state_dict(state)
    rest = [i for x, _ in c for i in _ids(x, ref)]
    a.set_epoch(1)
    whole = [i for x, _ in a for i in _ids(x, ref)]
    assert rest == whole[8:] and sorted(whole) == list(range(N))
    # at an epoch boundary the next epoch may be cut otherwise; the global order is the
    # same over any cut, so its states are not tied to one
    b.load_state_dict({**state, "batches": 0})
    g = packer.PackLoader(packer.load(sets["by3"]), 4, device="cpu", seed=5)
    next(iter(g))
    packer.PackLoader(packer.load(sets["by4"]), 4, device="cpu", seed=5).load_state_dict(
        g.state_dict()
    )
    with pytest.raises(UsageError, match=r"state\['cut'\] must be the digest string"):
        b.load_state_dict({**state, "cut": 7})


class _Fetching(ShardStore):
    """A store that copies a shard into a cache folder when fetched (remote, so the
    loader checks its working set against ``limit``)."""

    remote = True

    def __init__(self, root: Path, cache: Path, limit: int | None, depth: int) -> None:
        self.root, self.cache, self.limit, self.prefetch_depth = root, cache, limit, depth
        self.index = packer.load(root).index

    def fetch(self, k: int) -> Path:
        dst = self.cache / self.index.shards[k].name
        if not dst.exists():
            shutil.copytree(self.root / self.index.shards[k].name, dst)
        return dst


@pytest.mark.parametrize("depth", [1, 3, 20])
@pytest.mark.parametrize("order", ["global", "shards"])
def test_the_working_set_is_never_more_than_the_set(
    sets: dict[str, Path], tmp_path: Path, depth: int, order: str
) -> None:
    """Issue 42.9: order="global" over 8 shards counted 9 (every shard held, plus one
    prefetched), so a cache_limit of the whole set was refused."""
    local = open_set(sets["by3"])
    total = local.index.bytes
    store = _Fetching(sets["by3"], tmp_path, total, depth)
    s = PackSet(local.path, local.index, local.manifests, store)
    ld = packer.PackLoader(s, 4, device="cpu", order=order)
    need, held = ld.working_set()
    assert held <= len(local.index.shards) == 8 and need <= total
    if order == "global":
        assert (need, held) == (total, 8)  # the global order holds every shard
    assert len([y for _, y in ld]) == N // 4  # a cache of the whole set streams
