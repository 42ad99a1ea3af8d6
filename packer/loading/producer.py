"""The background half of a :class:`packer.loading.loader.PackLoader` pass: :class:`_Pass`.

A producer thread per pass (:func:`_produce`) runs its strategy's loop (``_Pass.run``,
:mod:`packer.loading.strategies`) over the loader's gather threads (:func:`_take`),
pinned slots (:class:`_Slots`, shared through :class:`_Shared`) and streams, and puts
each batch, :data:`_DONE` or a :class:`_Failure` on a bounded queue (:class:`_Handoff`).
It refers to no iterator and no loader (see the lifetime note in
:mod:`packer.loading.loader`). Here too: the threads' lifetime rules, :func:`populate`.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import itertools
import math
import os
import queue
import threading
import weakref
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import numpy as np
import torch

from .stats import NoStats, timed

_MADV_POPULATE_READ = 22
_JOIN_TIMEOUT_S = 10.0
_TASK_BYTES = 8 << 20  # bytes a gather task copies at least (see _Pass.submit)
GATHER_MODES = ("cpu", "device")  # PackLoader(gather=): who copies a raw pack's rows


def populate(t: torch.Tensor) -> bool:
    """Map a memory-mapped tensor's page-cached pages into this process now (Linux 5.14+).

    Saves the minor page faults of the first epoch. Reads the file from disk
    if it is not cached. Returns False where the kernel does not support it.
    """
    if t.numel() == 0 or not hasattr(os, "sysconf"):
        return False
    page = os.sysconf("SC_PAGE_SIZE")
    start = t.data_ptr() // page * page
    length = t.data_ptr() + t.numel() * t.element_size() - start
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return (
            libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(length), _MADV_POPULATE_READ) == 0
        )
    except (OSError, AttributeError):
        return False


def _take(src: np.ndarray, idx: np.ndarray, out: np.ndarray) -> None:
    """Copy rows ``idx`` of ``src`` into ``out`` (a memcpy per row, GIL released)."""
    np.take(src, idx, 0, out, "clip")


def _take_units(units: Any, idx: np.ndarray, out: np.ndarray) -> None:
    """Copy global rows ``idx`` of a set into ``out``, shard by shard (where no RowSpace)."""
    units.take(idx, out)


# Lifetime. Garbage collection may run a finalizer inside any code of any thread: in
# the middle of an import (holding the module's import lock), or of a pool's submit
# (holding its lock). A finalizer that joined a thread, waited on the GPU or took a lock
# could then wait on its own thread: a dropped loader's threads waiting for the import
# lock a new loader's gather thread held while its import collected the old loader hung
# for good. So the finalizers (:meth:`_Pass.signal_stop`, :meth:`_Shared.release`) only signal
# and drop references; the joins, the pool shutdown and the unregistering of the GPU's
# mapping of the pack run on explicit close() (the context manager's exit), in the
# producer thread as it ends, at the next pass or close, and at interpreter exit.
_LIVE: weakref.WeakSet[_Pass] = weakref.WeakSet()  # passes whose producer may run
_UNRELEASED: list[Any] = []  # PackRows of collected loaders: closed at the next safe point
_AT_EXIT: list[bool] = []  # the exit hook is registered


def release_deferred() -> None:
    """Close the GPU mappings that collected loaders left (never from a finalizer)."""
    while True:
        try:
            rows = _UNRELEASED.pop()  # list.pop is atomic: no lock that GC could hold
        except IndexError:
            return
        rows.close()


def _join_at_exit() -> None:
    """Stop and join every producer still running, before CUDA tears down (a finalizer
    run at exit only signals them)."""
    for p in list(_LIVE):
        p.stop_and_join()
    release_deferred()


def track(p: _Pass) -> None:
    """Note a pass whose producer is starting, for :func:`_join_at_exit`."""
    if not _AT_EXIT:
        _AT_EXIT.append(True)
        atexit.register(_join_at_exit)
    _LIVE.add(p)


class _Shared:
    """What a loader's passes share: the gather threads and the pinned slots (one process).

    ``active``: passes whose producer runs. The pack's GPU mapping (``rows``) is closed by
    :meth:`close`, or, once the loader was collected (:meth:`release`), by the last
    producer to end."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.pool: ThreadPoolExecutor | None = None
        self.free_slots: list[_Slots] = []
        self.lock = threading.Lock()
        self.rows: Any = None  # packer.loading.device_gather.PackRows once registered
        self.rows_why: str | None = None  # why the GPU cannot read the pack in place
        self.rows_tried = False
        self.active = 0
        self.closed = False

    def device_rows(
        self, images: torch.Tensor, labels: torch.Tensor, targets: torch.Tensor | None
    ) -> Any:
        """The pack's files registered for the GPU to read (the first call registers
        them), or None when that is not possible here (``rows_why`` says why)."""
        with self.lock:
            if not self.rows_tried:
                self.rows_tried = True
                from .device_gather import open_rows

                self.rows, self.rows_why = open_rows(images, labels, targets)
            return self.rows

    def thread_pool(self, n: int) -> ThreadPoolExecutor:
        with self.lock:
            if self.pool is None:
                self.pool = ThreadPoolExecutor(n, thread_name_prefix="imgpack-gather")
            return self.pool

    def take_slots(
        self, k: int, bs: int, shape: tuple[int, ...], ntargets: int | None, dev: torch.device
    ) -> _Slots:
        """Pinned buffers for one pass: a free set from an earlier pass, else new ones
        (allocating pinned memory costs far more than filling it)."""
        with self.lock:
            if self.free_slots:
                return self.free_slots.pop()
        return _Slots(k, bs, shape, ntargets, dev)

    def give_slots(self, slots: _Slots) -> None:
        with self.lock:
            if not self.closed:
                self.free_slots.append(slots)

    def pass_started(self) -> None:
        with self.lock:
            self.active += 1

    def pass_ended(self) -> None:
        """A producer has ended (on its own thread): the last one of a collected loader
        closes the pack's GPU mapping, its kernels having finished (run_device syncs)."""
        with self.lock:
            self.active -= 1
            rows = None
            if self.closed and self.active == 0:
                rows, self.rows = self.rows, None
        if rows is not None:
            rows.close()

    def close(self) -> None:
        """Explicit close (``PackLoader.close``, the context manager; the passes were
        stopped and joined first): shut the gather threads down and wait for them, close
        the pack's GPU mapping after every kernel reading it."""
        if self.pid != os.getpid():
            return  # the parent's threads do not exist in a forked child
        with self.lock:
            self.closed = True
            pool, self.pool = self.pool, None
            self.free_slots = []
            rows = None
            if self.active == 0:
                rows, self.rows = self.rows, None
        if rows is not None:
            rows.close()
        if pool is not None:
            mine = threading.current_thread() in getattr(pool, "_threads", ())
            pool.shutdown(wait=not mine)
        release_deferred()

    def release(self) -> None:
        """The loader was collected (its finalizer). Blocks on nothing and takes no lock
        (see the lifetime note above): the pool is only dropped, so its idle threads end
        by themselves once no pass holds it (concurrent.futures wakes them when the pool
        is collected); passes still running keep what they use, and the last of them
        closes the GPU mapping; with none running it is left for the next safe point."""
        if self.pid != os.getpid():
            return
        self.closed = True
        self.pool = None
        self.free_slots = []
        if self.active == 0 and self.rows is not None:
            rows, self.rows = self.rows, None
            _UNRELEASED.append(rows)


class _Slots:
    """``k`` pinned batch buffers (images, labels, targets if ``ntargets`` is not None),
    the event after the last copy out of each, a copy stream."""

    def __init__(
        self,
        k: int,
        bs: int,
        shape: tuple[int, ...],
        ntargets: int | None,
        device: torch.device,
    ) -> None:
        self.images = [
            torch.empty((bs, *shape), dtype=torch.uint8, pin_memory=True) for _ in range(k)
        ]
        self.labels = [torch.empty((bs,), dtype=torch.int64, pin_memory=True) for _ in range(k)]
        self.targets: list[torch.Tensor] | None = None
        if ntargets is not None:
            self.targets = [
                torch.empty((bs, ntargets), dtype=torch.float32, pin_memory=True) for _ in range(k)
            ]
        self.freed: list[torch.cuda.Event | None] = [None] * k
        self.stream = torch.cuda.Stream(device)


class _Handoff:
    """The bounded queue from a producer thread to its consumer, both ends in C
    (``queue.SimpleQueue``): ``maxsize`` tokens of room, one taken per item put, one
    given back per item got.

    The consumer waits here for every batch and must take the GIL back to return it,
    while 8 gather threads and the producer want it too. ``queue.Queue``'s get goes
    through Python-level locks and condition variables, taking the GIL back several
    times per item; this takes it back once.
    """

    def __init__(self, maxsize: int) -> None:
        self.items: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.room: queue.SimpleQueue[None] = queue.SimpleQueue()
        for _ in range(maxsize):
            self.room.put(None)

    def put(self, item: Any, timeout: float) -> None:
        """Raises queue.Full when there was no room for ``timeout`` seconds."""
        try:
            self.room.get(timeout=timeout)
        except queue.Empty:
            raise queue.Full from None
        self.items.put(item)

    def get(self, timeout: float) -> Any:
        """Raises queue.Empty when nothing came for ``timeout`` seconds."""
        item = self.items.get(timeout=timeout)
        self.room.put(None)
        return item

    def get_nowait(self) -> Any:
        item = self.items.get_nowait()
        self.room.put(None)
        return item

    def full(self) -> bool:
        return self.room.empty()


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


_DONE = object()


class _Pass:
    """Everything a producer thread uses; it refers to no iterator and no loader,
    so dropping the iterator collects it and its finalizer stops this.

    A strategy (:mod:`packer.loading.strategies`) subclasses it with ``run()``, the
    producer's loop; ``prepare(cfg, shared)`` gives what it takes besides (pinned
    slots, the pack's GPU mapping), before its thread starts."""

    @classmethod
    def read_window(cls, cfg: Any) -> int:
        """Batches whose reads of a set's shards may be under way at once in this pass
        (their shards are held together): the batch being read, and those a
        strategy reads ahead of it. A cache must hold their shards (the working set)."""
        return 1

    def __init__(
        self,
        cfg: Any,  # a strategies.PassConfig
        *,
        order: np.ndarray,
        start: int,
        nbatches: int,
        shared: _Shared,
        gen: torch.Generator | None,
        epoch: int,
        slots: _Slots | None = None,
        rows: Any = None,
    ) -> None:
        src = cfg.src
        units = cfg.units  # a pack set or mixed packs (packer.loading.sets.Units), or None
        self.units = units
        self.sched = None
        if units is not None:
            from .sets import Schedule

            self.sched = Schedule(units, order, cfg.batch_size, start, cfg.fetch_ahead)
        self.jpeg = None
        if cfg.kind.decoded:
            self.jpeg = (cfg.pack if units is None else units, cfg.crop, cfg.on_cpu)
        self.rows = rows
        if units is not None:
            self.shape = tuple(cfg.shape)
            # one np.take over every shard's rows mapped side by side (sets.RowSpace)
            self.src = units.array if units.space is not None else None
        else:
            row = 1 if cfg.kind.decoded else math.prod(src.shape[1:])
            # 2-D byte views: each row is one image; np.take copies whole rows (memcpy).
            self.src = (
                src.numpy().reshape(len(src), row) if len(src) else np.empty((0, row), np.uint8)
            )
            self.shape = tuple(src.shape[1:])
        self._inflight: list[Future[Any]] = []  # reads of the mapped data not yet done
        self.labels = cfg.labels.numpy()
        self.targets = None if cfg.targets is None else cfg.targets.numpy()
        self.order = order
        self.batch_size = cfg.batch_size
        self.start = start
        self.nbatches = nbatches
        self.device = cfg.device
        self.pool = shared.thread_pool(cfg.num_threads)
        self.num_threads = cfg.num_threads
        self.slots = slots
        self.shared = shared
        self.transform = cfg.transform
        self.stats = cfg.stats if cfg.stats is not None else NoStats()
        self.gen = gen
        self.seeds = (cfg.seed, epoch, cfg.rank)
        self.pid = os.getpid()
        self.queue = _Handoff(cfg.prefetch)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=_produce, args=(self,), name="imgpack-producer")
        self.thread.daemon = True  # a leftover never blocks exit; stop_and_join runs at exit

    @classmethod
    def prepare(cls, cfg: Any, shared: _Shared) -> dict[str, Any]:
        """Keyword arguments of this strategy's constructor taken from ``shared``."""
        return {}

    def run(self) -> None:
        """The producer's loop: each batch from :meth:`batches`, :meth:`put` in order."""
        raise NotImplementedError

    def signal_stop(self) -> None:
        """Tell the producer to stop and free the batches it queued; no wait, no lock of
        ours (the iterator's finalizer: see the lifetime note above). The producer then
        ends on its own and hands its slots back."""
        if self.pid != os.getpid():
            return  # a forked child: this pass's thread only ever existed in the parent
        self.stop.set()
        self._drain()  # unblocks a producer waiting to put

    def stop_and_join(self) -> None:
        """Stop the producer and wait for it (an explicit close, and at exit)."""
        if self.pid != os.getpid():
            return
        self.signal_stop()
        if threading.current_thread() is not self.thread and self.thread.ident is not None:
            self.thread.join(timeout=_JOIN_TIMEOUT_S)
        self._drain()

    def finish(self) -> None:
        """The producer's last act, on its thread: its slots back to the loader for the
        next pass (the copies out of them are fenced by their events), the pass off
        the shared count."""
        slots, self.slots = self.slots, None
        if slots is not None:
            self.shared.give_slots(slots)
        if self.sched is not None:
            # a failed batch may leave reads of a shard running: they end before it goes
            wait(self._inflight)
            self._inflight = []
            self.sched.close()
        self.shared.pass_ended()

    def _drain(self) -> None:
        with contextlib.suppress(queue.Empty):
            while True:
                self.queue.get_nowait()

    # ---- producer side (runs in self.thread)
    def submit(
        self, idx: np.ndarray, out: np.ndarray, pipelined: bool = False
    ) -> list[Future[Any]]:
        """Start copying rows ``idx`` of the pack into ``out`` on the gather threads; with
        stats on, each future's result is the seconds its copy took.

        ``pipelined`` (several batches in flight): a task copies at least
        ``_TASK_BYTES``. Each np.take must take the GIL back when its copy ends; with
        2 MB tasks (batch 128 split 8 ways) the threads spent about half their time
        queueing for it (scripts/probe_stream.py, docs/BENCHMARKS.md), and the batches
        in flight keep every thread busy with fewer, larger tasks.
        """
        parts = min(self.num_threads, max(1, len(idx) // 8))
        if pipelined:
            parts = min(parts, max(1, len(idx) * out.shape[1] // _TASK_BYTES))
        bounds = np.linspace(0, len(idx), parts + 1).astype(int)
        src, take = self.src, _take
        if self.units is not None:
            if self.src is not None:
                idx = self.units.translate(idx)
            else:  # no RowSpace on this platform: shard by shard
                src, take = self.units, _take_units
        clock = self.stats.clock
        if clock is None:
            futs = [
                self.pool.submit(take, src, idx[a:b], out[a:b])
                for a, b in itertools.pairwise(bounds)
                if b > a
            ]
        else:  # each task's result: the seconds it took (the batch's read stage)
            futs = [
                self.pool.submit(timed, clock, take, src, idx[a:b], out[a:b])
                for a, b in itertools.pairwise(bounds)
                if b > a
            ]
        if self.sched is not None:
            self._inflight = [f for f in self._inflight if not f.done()] + futs
        return futs

    def read_done(self, b: int) -> None:
        """Batch ``b`` no longer reads the pack's data (a set's shards it alone read may go)."""
        if self.sched is not None:
            self.sched.after(b)

    def put(self, item: Any) -> bool:
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def batches(self) -> Iterator[tuple[int, np.ndarray]]:
        bs = self.batch_size
        for b in range(self.start, self.nbatches):
            if self.stop.is_set():
                return
            if self.sched is not None:
                self.sched.before(b)  # fetch and map the shards this batch reads
            yield b, self.order[b * bs : (b + 1) * bs]


def _produce(p: _Pass) -> None:
    try:
        _run(p)
    finally:
        p.finish()


def _run(p: _Pass) -> None:
    try:
        if p.device.type == "cuda":
            with torch.cuda.device(p.device):
                p.run()
        else:
            p.run()
        p.put(_DONE)
    except BaseException as e:  # re-raised in the consumer
        p.put(_Failure(e))
