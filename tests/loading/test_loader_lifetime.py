"""PackLoader's background work ends with its iterator, its loader, the interpreter; fork-safe."""

from __future__ import annotations

import ctypes
import gc
import json
import os
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

import packer
from conftest import subprocess_env
from helpers.interpreted import run_fresh
from packer.loading import producer as producer_mod


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _trim() -> None:
    """Hand freed heap back to the OS so RSS shows what is still referenced."""
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _reachable() -> tuple[float, int]:
    """The MiB of every CPU tensor Python can still reach, and the number of passes alive
    (``producer._Pass`` objects): one walk of the collector's objects for both (a walk
    of a test process's objects takes about 0.2 CPU-seconds)."""
    nbytes, passes = 0, 0
    for o in gc.get_objects():
        if type(o) is torch.Tensor:
            nbytes += o.untyped_storage().nbytes()
        elif isinstance(o, producer_mod._Pass):
            passes += 1
    return nbytes / 2**20, passes


def _tensor_mb() -> float:
    """Bytes of every CPU tensor Python can still reach."""
    return _reachable()[0]


def _cycles(pack: packer.ImagePack) -> tuple[list[float], list[float]]:
    """Three cycles of 40 loaders dropped mid-epoch, each with full queues. Checks that
    nothing stays referenced (threads, passes, tensors) after each cycle; returns the MiB
    of RSS above the start while the loaders live (``held``) and after they are dropped
    (``after``)."""
    with packer.PackLoader(pack, 32, device="cpu", num_threads=2) as warm:
        next(iter(warm))
    _trim()
    threads, rss, tensors = threading.active_count(), _rss_mb(), _tensor_mb()
    before = set(threading.enumerate())
    held, after = [], []
    for cycle in range(3):
        loaders, iters = [], []
        for i in range(40):
            ld = packer.PackLoader(pack, 32, device="cpu", num_threads=2, seed=cycle * 40 + i)
            it = iter(ld)
            next(it)
            loaders.append(ld)
            iters.append(it)
        for it in iters:  # let every producer fill its queue: 4 batches of 384 KiB each
            while not it._pass.queue.full():
                it._pass.stop.wait(0.001)
        # each loader runs its producer and at least one gather thread (the pool starts
        # its second thread only when the first is busy at the second submit: under
        # load it may not be, so 3 a loader is not certain)
        assert threading.active_count() >= threads + 40 * 2
        held.append(_rss_mb() - rss)
        assert _tensor_mb() > tensors + 40 * 4 * 0.375
        del loaders, iters, ld, it
        _trim()
        # a collected loader's finalizer only signals its threads (it never joins them:
        # that could deadlock inside the collection); each then ends on its own. A gather
        # pool may start its second thread late, after a first look: looked at again
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            started = [t for t in threading.enumerate() if t not in before]
            if not started:
                break
            for t in started:
                t.join(timeout=max(0.0, deadline - time.monotonic()))
        assert threading.active_count() == threads
        mb, passes = _reachable()
        assert passes == 0
        assert mb <= tensors
        after.append(_rss_mb() - rss)
    return held, after


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
def test_dropped_mid_epoch_loaders_free_threads_and_memory(tmp_path: Path) -> None:
    from packer.measure.bench.synth import make_random_pack

    pack = packer.load(make_random_pack(tmp_path / "r", 256, 64))  # 12 KiB images
    _cycles(pack)  # threads, passes and tensors checked inside
    # RSS is checked in a clean child (the next test): here it depends on what earlier
    # tests left free in this process's heap (seen: 39 MiB held where 75 are expected)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
@pytest.mark.xdist_group("fresh-interpreter")  # one zygote (helpers.interpreted.run_fresh)
def test_dropped_loaders_hand_their_memory_back(tmp_path: Path) -> None:
    """RSS, in a child whose glibc keeps 2 malloc arenas: with one arena per thread (8 per
    core), freed batches stay in arenas that later threads may not reuse, so RSS after a
    cycle depends on the core count (seen on 16 cores: +86, +159, +180 MiB with nothing
    referenced). With the arena count fixed, a leak still shows as growth by about one
    cycle's batches each cycle; what the allocator keeps does not grow. The child is a
    fork of an interpreter that imported torch and nothing of packer
    (helpers.interpreted.run_fresh: a fresh one importing torch and tensordict took 4 of
    its 7 CPU-s); its arena limit is glibc's ``mallopt(M_ARENA_MAX, 2)``, what
    ``MALLOC_ARENA_MAX=2`` sets as a process starts, set before its first thread."""
    from packer.measure.bench.synth import make_random_pack

    path = make_random_pack(tmp_path / "r", 256, 64)
    code = textwrap.dedent(
        f"""
        import ctypes, json, sys, threading
        assert threading.active_count() == 1  # no thread yet: every later one is limited
        assert ctypes.CDLL(None).mallopt(-8, 2) == 1  # M_ARENA_MAX
        sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[1])!r}]
        import packer, test_loader_lifetime as t
        print(json.dumps(t._cycles(packer.load({str(path)!r}))))
        """
    )
    p = run_fresh(code, env=subprocess_env(), timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    held, after = json.loads(p.stdout.strip().splitlines()[-1])
    assert min(held) > 40, held
    assert after[-1] - after[0] < 0.5 * min(held), (held, after)


def test_dropping_the_iterator_alone_stops_its_thread(packed: Path) -> None:
    loader = packer.PackLoader(packed, 2, device="cpu", num_threads=1)
    it = iter(loader)
    next(it)
    producer = it._pass.thread
    assert producer.is_alive()
    del it
    gc.collect()  # the finalizer signals the producer (never waits for it): it ends soon
    producer.join(timeout=10)
    assert not producer.is_alive()
    assert sum(len(x) for x, _ in loader) == 13  # the loader itself still works


def test_collecting_a_loader_never_waits_for_its_threads(packed: Path) -> None:
    """Garbage collection can run a dropped loader's finalizers in a thread holding what
    that loader's threads wait for: a new loader's gather thread, inside its first
    import, held the import lock the old gather threads needed, and the old loader's
    finalizer joined them: a hang. Here the one gather thread waits on a gate the
    collecting thread holds shut: collection must return (the finalizers only signal),
    and every thread ends once the gate opens."""
    gate = threading.Event()
    loader = packer.PackLoader(packed, 2, device="cpu", num_threads=1)
    it = iter(loader)
    next(it)
    stuck = loader._shared.pool.submit(gate.wait)  # its only thread now waits on the gate
    threads = [it._pass.thread, *loader._shared.pool._threads]
    held = [loader, it]
    del loader, it
    collected = threading.Event()

    def collect() -> None:
        held.clear()  # the last references: the finalizers run here
        gc.collect()
        collected.set()

    t = threading.Thread(target=collect)
    t.start()
    try:
        assert collected.wait(10), "collecting a loader waited for its threads"
    finally:
        gate.set()
        t.join()
    stuck.result(timeout=30)
    gc.collect()
    for th in threads:
        th.join(timeout=30)
        assert not th.is_alive(), th.name


def test_close_still_waits_for_the_threads(packed: Path) -> None:
    """The explicit ways (close(), the context manager) join, as before."""
    with packer.PackLoader(packed, 2, device="cpu", num_threads=2) as loader:
        it = iter(loader)
        next(it)
        threads = [it._pass.thread, *loader._shared.pool._threads]
    assert not any(th.is_alive() for th in threads)


_EXIT_SCRIPT = textwrap.dedent(
    """
    import atexit, sys, threading
    def check():  # registered first, so it runs after imgpack's exit hooks
        left = [t.name for t in threading.enumerate() if t.name.startswith("imgpack")]
        if left:
            sys.stderr.write(f"LEFT {left}\\n")
            sys.stderr.flush()
    atexit.register(check)
    import packer
    keep = []
    for i in range(6):
        ld = packer.PackLoader(sys.argv[1], 1, device="cpu", num_threads=2, prefetch=2, seed=i)
        it = iter(ld)
        next(it)
        keep.append(it)
    if sys.argv[2] == "raise":
        raise SystemExit(0)
    """
)


@pytest.mark.slow
@pytest.mark.xdist_group("fresh-interpreter")  # one zygote (helpers.interpreted.run_fresh)
def test_exit_mid_epoch_is_clean(packed: Path) -> None:
    """Each way out ends the process as Python ends it: the interpreter's own exit (its
    atexit functions, its finalization, the C runtime's exit), in a fork of an
    interpreter that has imported torch and nothing of packer (helpers.interpreted:
    two fresh interpreters importing torch and tensordict took 10 CPU-s)."""
    for how in ("fall-off", "raise"):
        p = run_fresh(_EXIT_SCRIPT, [packed, how], env=subprocess_env(), timeout=120, exit=True)
        assert p.returncode == 0, p.stderr
        assert "LEFT" not in p.stderr and "terminate" not in p.stderr, p.stderr


class _FromLoader(torch.utils.data.IterableDataset):
    def __init__(self, loader: packer.PackLoader) -> None:
        self.loader = loader

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        self.loader.set_epoch(10 + info.id)
        for _, y in self.loader:
            yield y


def test_loader_used_in_forked_dataloader_workers(packed: Path) -> None:
    loader = packer.PackLoader(packed, 4, device="cpu", num_threads=2)
    assert sum(len(x) for x, _ in loader) == 13  # threads exist in the parent
    it = iter(loader)
    next(it)  # and a pass is running while the workers fork
    dl = torch.utils.data.DataLoader(
        _FromLoader(loader),
        batch_size=None,
        num_workers=2,
        multiprocessing_context="fork",
        timeout=60,
    )
    got = list(dl)
    assert len(got) == 2 * len(loader)
    labels = packer.load(packed).labels
    want = sorted(labels[loader.indices(10)].tolist() + labels[loader.indices(11)].tolist())
    assert sorted(torch.cat(got).tolist()) == want
    assert sum(len(x) for x, _ in it) == 13 - 4  # the parent's pass is unharmed
