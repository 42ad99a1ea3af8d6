"""One pass of a :class:`packer.loading.loader.PackLoader`: :class:`_EpochIterator`,
the consumer side (waits on each batch's ready event, never the host)."""

from __future__ import annotations

import os
import queue
import weakref
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import numpy as np
import torch

from ..errors import UsageError
from .epochs import Epochs
from .producer import _DONE, _Failure, _Pass, _Shared, release_deferred, track
from .sets import check_working_set
from .stats import NoStats
from .strategies import PassConfig, Resident, choose


class PassHost(NamedTuple):
    """What a pass asks of the loader that made it, as calls: ``shared()`` this
    process's threads and buffers, ``resident()`` the streamed rows on the device (made
    by the first resident pass), ``populate()`` the pack's pages mapped once, and
    ``live()`` the loader's passes (side by side passes take consecutive epochs)."""

    shared: Callable[[], _Shared]
    resident: Callable[[], tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]
    populate: Callable[[], None]
    live: Callable[[], Iterable[Any]]


class _EpochIterator:
    """One pass. It takes its epoch from :class:`Epochs` at the first ``__next__``; a
    background :class:`_Pass` (its strategy: :func:`packer.loading.strategies.choose`)
    fills a bounded queue, or, resident, batches are gathered on the device here. It
    reads its :class:`PassConfig`, asks ``epochs`` for its epoch and order
    (``start_pass``, ``positions``, ``rows_at``) and reports progress (``note``); of the
    loader it holds only the :class:`PassHost` calls."""

    def __init__(self, epochs: Epochs, cfg: PassConfig, host: PassHost) -> None:
        self.epochs = epochs
        self.cfg = cfg
        self.host = host
        self.nbatches = len(epochs)
        self.pid = os.getpid()
        self.closed = False
        self.started = False
        self.epoch = -1
        self.serial = 0
        self.next_batch = 0
        self._pass: _Pass | None = None
        self._finalizer: weakref.finalize | None = None
        self._resident: Resident | None = None
        self._gen: torch.Generator | None = None
        self.stats = cfg.stats if cfg.stats is not None else NoStats()
        self._handed: float | None = None  # the clock at this pass's latest hand-over

    def __iter__(self) -> _EpochIterator:
        return self

    def __len__(self) -> int:
        return self.nbatches

    def _start(self) -> None:
        ep, cfg, host = self.epochs, self.cfg, self.host
        self.started = True
        self.epoch, self.next_batch, self.serial = ep.start_pass(self, host.live())
        pos = ep.positions(self.epoch)
        if cfg.seeded:
            self._gen = torch.Generator()
        strategy = choose(cfg)
        if strategy is Resident:
            self._resident = Resident(cfg, host.resident(), pos, self._gen, self.epoch)
            return
        host.populate()
        if self.next_batch >= self.nbatches:
            return  # nothing left (an empty epoch, or resumed at its end): no thread
        rows = ep.rows_at(self.epoch, pos)
        ahead = rows[self.next_batch * cfg.batch_size :]
        check_working_set(cfg.units, ahead, cfg.batch_size, strategy.read_window(cfg), ep.order)
        shared = host.shared()
        try:
            prepared = strategy.prepare(cfg, shared)
        except UsageError:
            self.close()
            raise
        p = strategy(
            cfg,
            order=rows.numpy().astype(np.intp),
            start=self.next_batch,
            nbatches=self.nbatches,
            shared=shared,
            gen=self._gen,
            epoch=self.epoch,
            **prepared,
        )
        self._pass = p
        if p.sched is not None:
            try:
                p.sched.open()  # local shards: all mapped now, on this thread
            except BaseException:
                p.sched.close()
                raise
        # collected: the finalizer only signals the producer (it must never wait: see
        # _producer's lifetime note); close() joins it
        self._finalizer = weakref.finalize(self, _Pass.signal_stop, p)
        if cfg.kind.decoded:
            # import the decoders here, before any gather thread would (an import runs
            # under the module's lock, and collecting an old loader may run meanwhile)
            from ..imaging.jpeg import import_decoders

            import_decoders(cfg.device)
        release_deferred()
        shared.pass_started()
        track(p)
        try:
            p.thread.start()
        except BaseException:
            shared.pass_ended()
            raise

    def __next__(self) -> tuple[torch.Tensor, ...]:
        # one frame (no wrapper): the epoch warning's stacklevel names the caller's line
        clock = self.stats.clock
        t0 = clock() if clock is not None else 0.0
        if self.closed:
            raise StopIteration
        if self.pid != os.getpid() and self.started:
            raise UsageError(
                "this PackLoader pass was started in another process (before a fork); "
                "call iter(loader) again in this one"
            )
        if not self.started:
            self._start()
        if self.next_batch >= self.nbatches:
            return self._finish()
        res = self._resident
        out = res.batch(self.next_batch) if res is not None else self._next_streamed()
        self.next_batch += 1
        self.epochs.note(self.serial, self.epoch, self.next_batch, False)
        if clock is not None:
            # the host's wait: on CUDA the stream then waits for the batch on the GPU
            t1 = clock()
            self.stats.consumed(t0, t1, self._handed, out[0].shape[0])
            self._handed = t1
        return out

    def _finish(self) -> Any:
        self.epochs.note(self.serial, self.epoch, self.next_batch, True)
        self.close()
        raise StopIteration

    def _next_streamed(self) -> tuple[torch.Tensor, ...]:
        p = self._pass
        assert p is not None
        while True:
            try:
                item = p.queue.get(timeout=1.0)
                break
            except queue.Empty:
                if not p.thread.is_alive():
                    self.close()
                    raise RuntimeError("imgpack loader thread died without a result") from None
        if item is _DONE:  # the producer ran out early: only if stopped
            return self._finish()
        if isinstance(item, _Failure):
            self.close()
            raise item.exc
        if not isinstance(item, tuple):  # a dense pack's batch: (images, targets)
            return item.deliver(self.cfg.device)
        images, labels, targets, ev = item
        if ev is not None:
            cur = torch.cuda.current_stream(self.cfg.device)
            cur.wait_event(ev)  # the GPU waits for the copy; the host does not
            images.record_stream(cur)
            labels.record_stream(cur)
            if targets is not None:
                targets.record_stream(cur)
        if targets is None:
            return images, labels
        return images, labels, targets

    def close(self) -> None:
        """Stop this pass's producer and wait for it (never called from a finalizer)."""
        if self.closed:
            return
        self.closed = True
        if self._finalizer is not None and self._finalizer.detach() is not None:
            assert self._pass is not None
            self._pass.stop_and_join()
        self._resident = None
