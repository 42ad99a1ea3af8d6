"""PackLoader over a pack set in object storage (a real S3 server): every image once per
epoch on 1, 2 and 3 ranks, raw and JPEG, the same batches as the local set; the
working-set refusal; resume mid-epoch; PackDataset in DataLoader workers."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import s3_server as fx
import torch
from s3_server import RAW, new_url, write_src

import packer
from helpers.local_server import S3Server
from packer.builder.api import build
from packer.errors import UsageError

s3, s3_server = fx.s3, fx.s3_server  # the fixtures

N = 15
JPEG = replace(RAW, store="jpeg", shard_size=1500)


@pytest.fixture(scope="module")
def sets(
    s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, tuple[str, Path]]]:
    """A raw set (8 shards) and a JPEG set of the same 15 images, in the bucket and on
    local disk: kind -> (url, local set)."""
    root = tmp_path_factory.mktemp("remote-sets")
    src = write_src(root / "src", {"a": 5, "b": 5, "c": 5}, "JPEG")
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in s3_server.env().items():
            mp.setenv(k, v)
        mp.setenv("IMGPACK_CACHE_DIR", str(root / "cache"))
        for kind, config in (("raw", RAW), ("jpeg", JPEG)):
            url = new_url()
            build(src, url, config)
            build(src, root / kind, config)
            out[kind] = (url, root / kind)
    yield out


def _kw(kind: str) -> dict[str, int]:
    return {"image_size": 8} if kind == "jpeg" else {}


@pytest.mark.parametrize("kind", ["raw", "jpeg"])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_image_once_per_epoch_across_ranks(
    s3: S3Server, sets: dict[str, tuple[str, Path]], kind: str, world: int
) -> None:
    url, local = sets[kind]
    assert len(packer.load(local).index.shards) >= 3
    seen: list[int] = []
    for rank in range(world):
        # raw: room for 6 of its 8 shards (the pass holds 5 at once): some are evicted
        s = packer.load(url, cache_limit=1900 if kind == "raw" else None)
        kw = {"device": "cpu", "order": "shards", "rank": rank, "world_size": world, "seed": 4}
        remote = packer.PackLoader(s, 2, **kw, **_kw(kind))
        ref = packer.PackLoader(packer.load(local), 2, **kw, **_kw(kind))
        remote.set_epoch(1)
        ref.set_epoch(1)
        for (xa, ya), (xb, yb) in zip(remote, ref, strict=True):
            assert xa.equal(xb) and ya.equal(yb)  # the local set's batches, byte for byte
        seen += remote.indices(1).tolist()
        assert not any(s.store._pins.values())  # every shard let go at the end
        if s.store.limit:
            assert s.store.cached_bytes() <= s.store.limit
        s.store.close()
    counts = Counter(seen)
    assert set(counts) == set(range(N))
    assert sum(c - 1 for c in counts.values()) == -(-N // world) * world - N  # the pad only


def test_a_cache_limit_below_the_working_set_is_refused_before_the_first_batch(
    s3: S3Server, sets: dict[str, tuple[str, Path]]
) -> None:
    url, _ = sets["raw"]
    s = packer.load(url, cache_limit=300)
    ld = packer.PackLoader(s, 4, device="cpu")  # the global order holds every shard
    with pytest.raises(UsageError, match=r"cache limit of 300 bytes is below .* working set of"):
        next(iter(ld))
    assert s.store.downloads == 0
    s.store.close()


def test_resume_mid_epoch_from_a_warm_cache(
    s3: S3Server, sets: dict[str, tuple[str, Path]]
) -> None:
    url, local = sets["raw"]
    full = [y for _, y in packer.PackLoader(packer.load(local), 3, device="cpu", order="shards")]
    s = packer.load(url)
    ld = packer.PackLoader(s, 3, device="cpu", order="shards")
    it = iter(ld)
    first = [next(it)[1] for _ in range(2)]
    state = ld.state_dict()
    it.close()
    s.store.close()
    again = packer.load(url)  # the same cache: what the first run fetched is not fetched again
    ld = packer.PackLoader(again, 3, device="cpu", order="shards")
    ld.load_state_dict(state)
    rest = [y for _, y in ld]
    assert torch.cat(first + rest).tolist() == torch.cat(full).tolist()
    assert again.store.downloads < len(again.index.shards)
    again.store.close()


def test_pack_dataset_in_forked_dataloader_workers(
    s3: S3Server, sets: dict[str, tuple[str, Path]]
) -> None:
    url, local = sets["raw"]
    s = packer.load(url)
    ds = packer.PackDataset(s)
    cold = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=1)
    # a forked worker cannot run the client its parent started: a clear error, no hang
    it = iter(cold)
    with pytest.raises(UsageError, match="forked from one that used object storage"):
        next(it)
    # its worker stopped now, as its __del__ would: the iterator is kept alive by the
    # error's traceback until a later garbage collection, which ran __del__ inside an
    # import, and there its stop never reached the worker (torch waited out the 5 s
    # join timeout, then terminated it)
    it._shutdown_workers()
    for _ in packer.PackLoader(s, 8, device="cpu"):  # every shard now cached
        pass
    warm = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=1)
    got = torch.cat([x for x, _ in warm])  # the workers read the cache, no request
    ref = torch.cat([x for x, _ in torch.utils.data.DataLoader(packer.PackDataset(local), 4)])
    assert got.equal(ref)
    s.store.close()


def test_the_prefetch_depth_is_shards_ahead_of_the_one_read(
    s3: S3Server, sets: dict[str, tuple[str, Path]]
) -> None:
    """A store fetches ``prefetch_depth`` shards ahead: when a pass starts a shard, the
    next two it will read are queued (the shard it starts is fetched on demand)."""
    url, _ = sets["raw"]
    s = packer.load(url)
    store = s.store
    started: dict[int, set[int]] = {}
    fetch = store.fetch

    def record_fetch(k: int) -> Path:
        started.setdefault(k, set(store._queued))  # the prefetches queued so far
        return fetch(k)

    store.fetch = record_fetch  # type: ignore[method-assign]
    ld = packer.PackLoader(s, 2, device="cpu", order="shards", shuffle=False, shard_window=1)
    order = list(dict.fromkeys(s.locate(ld.indices(0).numpy())[0].tolist()))
    assert store.prefetch_depth == 2 and len(order) == len(s.index.shards)
    for _ in ld:
        pass
    for i, k in enumerate(order[:-2]):
        assert set(order[i + 1 : i + 3]) <= started[k], (k, started[k])
    store.close()


def test_a_warm_shard_stays_mapped_between_epochs_only_without_a_limit(
    s3: S3Server, sets: dict[str, tuple[str, Path]]
) -> None:
    """No limit: nothing evicts a released shard, so the next epoch reuses its checked,
    mapped pack; with a limit it is dropped on release (it may be evicted); closing the
    store drops every mapping."""
    url, _ = sets["raw"]
    s = packer.load(url)
    assert s.store.keeps_released
    list(packer.PackLoader(s, 3, device="cpu", order="shards"))
    kept = {k: s.shard(k) for k in range(len(s.index.shards))}
    for k in kept:
        s.release(k)
    assert all(s.shard(k) is kept[k] for k in kept)  # the same objects: not reopened
    for k in kept:
        s.release(k)
    s.store.close()
    assert not s._open
    limited = packer.load(url, cache_limit=10**9)
    assert not limited.store.keeps_released
    list(packer.PackLoader(limited, 3, device="cpu", order="shards"))
    assert not limited._open  # every shard let go and unmapped
    limited.store.close()
