"""A warm remote set's next epochs (issue 47, the ``az://`` figure): a reader without a
cache limit keeps the shards it fetched mapped and locked, so an epoch after a loader's
first takes no lock, stats no file and sends no request per shard; the batches are the
local set's. A changed set is seen at the next ``packer.load`` (its one index GET),
never in the middle of a loader, which reads the bytes it checked."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import s3_server as fx
import torch
from s3_server import RAW, new_url, write_src

import packer
from helpers.local_server import S3Server
from packer.builder.api import build
from packer.storage import cache
from packer.storage.client import ObjectStore

s3, s3_server = fx.s3, fx.s3_server  # the fixtures

KW: dict[str, Any] = {"device": "cpu", "order": "shards", "shuffle": True, "seed": 5}


def _counting(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts of the cache's lock takes and stats, and of every request of the client."""
    calls = {"lock": 0, "present": 0, "request": 0}

    def count(name: str, fn: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return fn(*args, **kwargs)

        return counted

    monkeypatch.setattr(cache, "_lock", count("lock", cache._lock))
    monkeypatch.setattr(
        cache.RemoteShards, "_present", count("present", cache.RemoteShards._present)
    )
    for m in ("_body", "_signed_range", "head", "_listing"):
        monkeypatch.setattr(ObjectStore, m, count("request", getattr(ObjectStore, m)))
    return calls


def _epoch(loader: Any, e: int) -> tuple[torch.Tensor, torch.Tensor]:
    loader.set_epoch(e)
    xs, ys = zip(*loader, strict=True)
    return torch.cat(xs), torch.cat(ys)


def test_a_warm_next_epoch_takes_no_lock_stat_or_request_a_shard(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = write_src(tmp_path / "src", {"cat": 5, "dog": 5})
    url = new_url()
    build(src, url, RAW)  # 5 shards of 2 images
    build(src, tmp_path / "ref", RAW)
    s = packer.load(url)
    calls = _counting(monkeypatch)
    remote = packer.PackLoader(s, 3, **KW)
    local = packer.PackLoader(packer.load(tmp_path / "ref"), 3, **KW)
    for e in range(3):
        before = dict(calls)
        xa, ya = _epoch(remote, e)
        xb, yb = _epoch(local, e)
        assert xa.equal(xb) and ya.equal(yb) and len(ya) == 10
        if e == 0:  # the loader's first epoch fetches and locks each shard
            assert calls["lock"] - before["lock"] >= len(s.index.shards), calls
        else:  # the next ones: none of it
            assert {k: calls[k] - before[k] for k in calls} == {k: 0 for k in calls}
        assert not any(s.store._pins.values())  # every shard let go at the end
    s.store.close()
    assert not s.store._use_fds  # the locks kept go with the store


def test_kept_locks_are_capped_and_past_the_cap_a_kept_shard_is_still_a_count(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One descriptor a kept lock: a set of more shards than a process may open files is
    fine; a kept shard past the cap lets go of its lock, and is still read from its
    mapping without a lock or a request."""
    src = write_src(tmp_path / "src", {"cat": 5, "dog": 5})
    url = new_url()
    build(src, url, RAW)  # 5 shards
    build(src, tmp_path / "ref", RAW)
    s = packer.load(url)
    s.store.kept_locks = 2
    remote = packer.PackLoader(s, 3, **KW)
    local = packer.PackLoader(packer.load(tmp_path / "ref"), 3, **KW)
    _epoch(remote, 0)
    assert len(s.store._use_fds) <= 3 and all(s.store.kept(k) for k in range(5))
    calls = _counting(monkeypatch)
    xa, ya = _epoch(remote, 1)
    xb, yb = _epoch(local, 1)
    assert xa.equal(xb) and ya.equal(yb)
    assert calls == {"lock": 0, "present": 0, "request": 0}
    s.store.close()
    assert not s.store._use_fds


def test_a_changed_set_is_seen_at_the_next_load_not_inside_a_loader(
    s3: S3Server, tmp_path: Path
) -> None:
    url = new_url()
    first = write_src(tmp_path / "first", {"cat": 3, "dog": 3})
    build(first, url, RAW)
    build(first, tmp_path / "ref1", RAW)
    s = packer.load(url)
    loader = packer.PackLoader(s, 4, **KW)
    xa, _ = _epoch(loader, 0)
    second = write_src(tmp_path / "second", {"cat": 4, "dog": 4}, "JPEG")
    build(second, url, replace(RAW, overwrite=True))  # the set at the URL replaced
    build(second, tmp_path / "ref2", RAW)
    # the running loader reads the snapshot it checked (no request: nothing re-validated)
    xb, _ = _epoch(loader, 0)
    assert xa.equal(xb) and xa.equal(
        _epoch(packer.PackLoader(packer.load(tmp_path / "ref1"), 4, **KW), 0)[0]
    )
    s.store.close()
    # the next load GETs the index: the new set, its shards fetched and checked
    again = packer.load(url)
    assert len(again) == 8
    got = _epoch(packer.PackLoader(again, 4, **KW), 0)
    want = _epoch(packer.PackLoader(packer.load(tmp_path / "ref2"), 4, **KW), 0)
    assert got[0].equal(want[0]) and got[1].equal(want[1])
    assert again.store.downloads == len(again.index.shards)
    again.store.close()
