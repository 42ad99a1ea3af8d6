"""The bounded cache's byte count against downloads that end while an evictor counts
(packer/storage/cache.py): the interleavings forced with events, against the real S3
test server. (A full suite once saw a set's loader cache 5 shards under a limit of 4:
a prefetch ended between its demand fetch's two reads, the files, then the
reservations, and was counted in neither.)"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import s3_server as fx
from s3_server import RAW, built

import packer
from helpers.local_server import S3Server
from packer.storage.cache import META_DIR, RemoteShards

s3, s3_server = fx.s3, fx.s3_server  # the fixtures
SHARD = 288  # RAW's 2 rows of 3x6x8 bytes
WAIT_S = 30.0  # a bound on each hand-off, so a broken schedule fails rather than hangs


def _wait(event: threading.Event, what: str) -> None:
    assert event.wait(WAIT_S), f"never reached: {what}"


class _Thread(threading.Thread):
    """Runs ``fn``; ``result()`` re-raises what it raised."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.fn, self.error = fn, None

    def run(self) -> None:
        try:
            self.fn()
        except BaseException as e:  # handed to the test's thread
            self.error = e

    def result(self) -> None:
        self.join(WAIT_S)
        assert not self.is_alive()
        if self.error is not None:
            raise self.error


def _pause_downloads(store: RemoteShards) -> tuple[threading.Event, threading.Event]:
    """(started, go): the store's next download stops at its first piece (its bytes
    reserved, nothing at the final name yet) until ``go``."""
    started, go = threading.Event(), threading.Event()

    def hook(_n: int) -> None:
        started.set()
        _wait(go, "the download let go on")

    store.on_download = hook
    return started, go


def _pause_between_counts(
    monkeypatch: pytest.MonkeyPatch, store: RemoteShards, thread: list[threading.Thread]
) -> tuple[threading.Event, threading.Event]:
    """(paused, go): ``store``'s make-room, on ``thread[0]``, stops between its two reads
    (the big files in place, the reservations of downloads in flight; whichever it reads
    first) until ``go``."""
    paused, go = threading.Event(), threading.Event()
    calls: list[str] = []

    def wrap(name: str) -> None:
        real = getattr(store, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            if thread and threading.current_thread() is thread[0]:
                calls.append(name)
                if len(calls) == 2:
                    paused.set()
                    _wait(go, "the count let go on")
            return real(*args, **kwargs)

        monkeypatch.setattr(store, name, counted)

    wrap("cached")
    wrap("reservations")
    return paused, go


@pytest.mark.parametrize("b_limited", [True, False], ids=["limited", "no-limit"])
def test_a_download_that_ends_while_another_counts_is_counted(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, b_limited: bool
) -> None:
    """Reader A (limit: two shards) has shard 0 cached; reader B's download of shard 1
    is in flight. A's fetch of shard 2 counts the cache, and B's download ends (its file
    in place, its reservation gone) between A's two reads. Before, A read the files
    first, then the reservations: shard 1 was in neither, A admitted shard 2 beside 0
    and 1 (three shards under a limit of two). A reader without a limit (B) did not
    reserve at all: A never counted its download in flight."""
    url, _ = built(tmp_path, RAW, n=4)
    limit = 2 * SHARD
    a = packer.load(url, cache_limit=limit)
    names = [e.name for e in a.index.shards]
    b = packer.load(url, cache_limit=limit if b_limited else None)  # as another process
    a.shard(0)
    a.release(0)  # cached, nobody holds it
    downloading, finish = _pause_downloads(b.store)
    evictor: list[threading.Thread] = []
    counting, count_on = _pause_between_counts(monkeypatch, a.store, evictor)
    tb = _Thread(lambda: b.shard(1))  # B holds it: A cannot make room by evicting it
    tb.start()
    _wait(downloading, "B's download of shard 1")
    assert (a.path / META_DIR / f"{names[1]}.reserved").read_text() == str(SHARD)
    ta = _Thread(lambda: a.shard(2))
    evictor.append(ta)
    ta.start()
    _wait(counting, "A's count, between its two reads")
    finish.set()
    tb.result()  # B's shard is in place, its reservation gone
    assert not (a.path / META_DIR / f"{names[1]}.reserved").exists()
    count_on.set()
    ta.result()
    # A counted shard 1 once (not twice: it evicted shard 0 only, and needed no more)
    assert {name for _, name, _, _ in a.store.cached()} == {names[1], names[2]}
    assert a.store.cached_bytes() == limit
    a.release(2)
    b.release(1)
    a.store.close()
    b.store.close()
