"""A warm remote set's kept ``.use`` locks (:class:`packer.storage.cache.RemoteShards`)
and its close: no lock descriptor outlives :meth:`close` (a fetch that was waiting for
its lock when the set closed lets go of it; close twice; a set past its kept-lock cap),
and a garbage-collected set lets go of them without close."""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Any

import pytest
import s3_server as fx
from s3_server import RAW, new_url, write_src

import packer
from helpers.local_server import S3Server
from packer.builder.api import build
from packer.storage import cache

s3, s3_server = fx.s3, fx.s3_server  # the fixtures


def _use_fds() -> list[str]:
    """The cache ``.use`` files this process has open."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.endswith(".use"):
            out.append(target)
    return out


def _set(tmp_path: Path) -> str:
    src = write_src(tmp_path / "src", {"cat": 5, "dog": 5})
    url = new_url()
    build(src, url, RAW)  # 5 shards of 2 images
    return url


def test_a_fetch_waiting_for_its_lock_when_the_set_closes_lets_go_of_it(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = packer.load(_set(tmp_path))
    s.store.fetch(0)
    s.store.release(0)
    real = cache._lock

    def close_meanwhile(*args: Any, **kwargs: Any) -> int:
        fd = real(*args, **kwargs)  # taken just as another thread closes the set
        monkeypatch.setattr(cache, "_lock", real)
        s.store.close()
        return fd

    monkeypatch.setattr(cache, "_lock", close_meanwhile)
    with pytest.raises(RuntimeError, match="the remote set was closed"):
        s.store.fetch(1)
    assert _use_fds() == [] and not s.store._use_fds and not s.store.kept(1)
    assert s.store.downloads == 1  # shard 1 not fetched after the close


def test_kept_locks_past_the_cap_close_twice_and_gc_leave_no_descriptor(
    s3: S3Server, tmp_path: Path
) -> None:
    url = _set(tmp_path)
    before = len(os.listdir("/proc/self/fd"))
    s = packer.load(url)
    s.store.kept_locks = 2
    loader = packer.PackLoader(s, 3, device="cpu", order="shards")
    for e in range(2):
        loader.set_epoch(e)
        assert len(list(loader)) == 4
    assert len(_use_fds()) <= 3 and all(s.store.kept(k) for k in range(5))
    loader.close()
    s.store.close()
    s.store.close()  # again: nothing
    assert _use_fds() == []
    with pytest.raises(RuntimeError, match="the remote set was closed"):
        s.store.fetch(0)
    # never closed: its locks go with it
    s = packer.load(url)
    loader = packer.PackLoader(s, 3, device="cpu", order="shards")
    assert len(list(loader)) == 4 and len(_use_fds()) == 5
    del s, loader
    gc.collect()
    assert _use_fds() == []
    assert len(os.listdir("/proc/self/fd")) <= before + 2  # at most the client's sockets


def test_a_forked_child_reads_the_kept_shards_and_its_close_keeps_the_parents_locks(
    s3: S3Server, tmp_path: Path
) -> None:
    """A child forked after the first epoch reads the kept shards from the inherited
    mappings (no fetch); its close (or exit) closes its copies of the lock descriptors,
    which leaves the parent's locks held: a limited reader still cannot evict them."""
    s = packer.load(_set(tmp_path))
    loader = packer.PackLoader(s, 3, device="cpu", order="shards", shuffle=False)
    first = [x.clone() for x, _ in loader]
    pid = os.fork()
    if pid == 0:  # the child: a pass, then close
        code = 1
        try:
            again = [x for x, _ in loader]
            same = all(a.equal(b) for a, b in zip(first, again, strict=True))
            code = 0 if same and s.store.downloads == 5 else 2
            s.store.close()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    held = [cache._try_lock(s.store.meta / f"{s.store._name(k)}.use") for k in range(5)]
    assert held == [None] * 5  # every shard still locked by the parent
    s.store.close()
    free = [cache._try_lock(s.store.meta / f"{s.store._name(k)}.use") for k in range(5)]
    assert None not in free
    for fd in free:
        os.close(fd)  # type: ignore[arg-type]


def test_the_kept_lock_cap_is_the_processs_across_readers(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two readers without a limit (train and val, or a set opened twice) share the
    process's cap: each taking a quarter of the descriptors would run the process out
    of them with four; past the cap a kept shard is still a count (its mapping)."""
    monkeypatch.setattr(cache, "_kept_locks", lambda: 3)
    url = _set(tmp_path)
    sets = [packer.load(url), packer.load(url)]
    loaders = [packer.PackLoader(s, 3, device="cpu", order="shards") for s in sets]
    for e in range(2):
        for loader in loaders:
            loader.set_epoch(e)
            assert len(list(loader)) == 4
    assert len(_use_fds()) <= 3
    assert all(s.store.kept(k) for s in sets for k in range(5))
    sets[0].store.close()  # its share of the cap goes back
    loaders[1].set_epoch(2)
    assert len(list(loaders[1])) == 4
    assert len(_use_fds()) <= 3
    sets[1].store.close()
    assert _use_fds() == [] and cache._kept_held == 0
