"""The batched decoder's pinned pool (``nvbatch.c``) under load and failure, on the CPU
against a stand-in CUDA runtime built here: several threads taking and giving back
blocks (never one block held twice), more blocks than PINNED_KEPT (the rest freed
for real, each once), a runtime whose events cannot be made or recorded (a block
given back then is freed, never handed out again unordered), a failed cudaHostAlloc."""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import pytest

from helpers import fake_cudart
from packer.imaging import nvbatch

pytestmark = pytest.mark.skipif(nvbatch.available() is not None, reason=str(nvbatch.available()))

KEPT = 64  # PINNED_KEPT in nvbatch.c

_fake, _counts = fake_cudart.build, fake_cudart.counts


def _take(lib: ctypes.CDLL, pools: int, size: int) -> int:
    p = ctypes.c_void_p()
    assert lib.nvb_pools_pinned(pools, ctypes.byref(p), size, 0) == 0
    assert p.value
    return p.value


def _give(lib: ctypes.CDLL, pools: int, ptr: int, size: int) -> None:
    assert lib.nvb_pools_pinned(pools, ctypes.byref(ctypes.c_void_p(ptr)), size, 1) == 0


def test_threads_taking_and_giving_back_never_share_a_block(tmp_path: Path) -> None:
    path, fake = _fake(tmp_path, "threads")
    lib = nvbatch.library()
    pools = lib.nvb_pools_open(path.encode(), 0, 0)
    held: set[int] = set()
    guard = threading.Lock()
    twice: list[int] = []

    def work(seed: int) -> None:
        mine: list[tuple[int, int]] = []
        for i in range(400):
            size = 64 << ((seed + i) % 6)
            ptr = _take(lib, pools, size)
            with guard:
                if ptr in held:
                    twice.append(ptr)
                held.add(ptr)
            mine.append((ptr, size))
            if len(mine) > 3 or i % 7 == 0:  # hold a few at a time, up to 8 threads x 4
                ptr, size = mine.pop(0)
                with guard:
                    held.discard(ptr)
                _give(lib, pools, ptr, size)
        for ptr, size in mine:
            with guard:
                held.discard(ptr)
            _give(lib, pools, ptr, size)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not twice
    got = _counts(fake)
    # at most 32 held at once: the pool grew to that, and each reuse waited for its event
    assert got["host_alloc"] <= KEPT and got["host_free"] == 0
    assert got["syncs"] == 8 * 400 - got["host_alloc"]
    lib.nvb_pools_close(pools)
    assert _counts(fake)["host_free"] == got["host_alloc"]  # each kept block, once


def test_blocks_past_pinned_kept_are_freed_for_real_each_once(tmp_path: Path) -> None:
    path, fake = _fake(tmp_path, "past")
    lib = nvbatch.library()
    pools = lib.nvb_pools_open(path.encode(), 0, 0)
    n = KEPT + 6
    blocks = [_take(lib, pools, 1000) for _ in range(n)]
    assert len(set(blocks)) == n and _counts(fake)["host_alloc"] == n
    for b in blocks:
        _give(lib, pools, b, 1000)
    assert _counts(fake)["host_free"] == 6  # the ones past the kept: freed when given back
    again = [_take(lib, pools, 1000) for _ in range(KEPT)]
    assert set(again) <= set(blocks[:KEPT]) and len(set(again)) == KEPT
    assert _counts(fake)["host_alloc"] == n  # all from the kept blocks
    extra = _take(lib, pools, 1000)  # the 65th while 64 are held: a new one, not kept
    assert _counts(fake)["host_alloc"] == n + 1 and extra not in again
    _give(lib, pools, extra, 1000)
    assert _counts(fake)["host_free"] == 7
    for b in again:
        _give(lib, pools, b, 1000)
    lib.nvb_pools_close(pools)
    assert _counts(fake)["host_free"] == n + 1  # every block, each once


@pytest.mark.parametrize("fails", ["fail_event_create", "fail_record"])
def test_a_block_whose_stream_cannot_be_marked_is_freed_not_reused(
    tmp_path: Path, fails: str
) -> None:
    """No event recorded on the stream that gave a block back: nothing orders its next
    user after that stream's copies, so the block is freed (cudaFreeHost waits for the
    device), never handed out again."""
    path, fake = _fake(tmp_path, fails)
    lib = nvbatch.library()
    pools = lib.nvb_pools_open(path.encode(), 0, 0)
    kept = _take(lib, pools, 1000)
    _give(lib, pools, kept, 1000)  # an event made and recorded: kept
    ctypes.c_int.in_dll(fake, fails).value = 1
    a = _take(lib, pools, 1000)
    assert a == kept and _counts(fake)["syncs"] == 1
    _give(lib, pools, a, 1000)  # its event cannot be recorded (or made): not kept
    b = _take(lib, pools, 1000)
    got = _counts(fake)
    if fails == "fail_event_create":  # the kept block already had its event: reused
        assert b == kept and got["syncs"] == 2
        fresh = _take(lib, pools, 1000)  # a new block: its event cannot be made
        _give(lib, pools, fresh, 1000)
        assert _counts(fake)["host_free"] == 1
        c = _take(lib, pools, 1000)
        assert _counts(fake)["host_alloc"] == 3  # the freed one never handed out again
        _give(lib, pools, c, 1000)
    else:
        assert got["host_free"] == 1 and got["host_alloc"] == 2  # freed, and a new one
    _give(lib, pools, b, 1000)
    lib.nvb_pools_close(pools)
    got = _counts(fake)
    assert got["host_free"] == got["host_alloc"]  # each block freed once


def test_a_failed_host_alloc_is_returned_and_keeps_no_slot(tmp_path: Path) -> None:
    path, fake = _fake(tmp_path, "nohost")
    lib = nvbatch.library()
    pools = lib.nvb_pools_open(path.encode(), 0, 0)
    ctypes.c_int.in_dll(fake, "fail_host_alloc").value = 1
    p = ctypes.c_void_p()
    assert lib.nvb_pools_pinned(pools, ctypes.byref(p), 1000, 0) == 2
    ctypes.c_int.in_dll(fake, "fail_host_alloc").value = 0
    ok = _take(lib, pools, 1000)
    _give(lib, pools, ok, 1000)
    lib.nvb_pools_close(pools)
    assert _counts(fake)["host_free"] == 1  # the failed one was never kept nor freed
