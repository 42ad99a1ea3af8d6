"""The dense pass's producer (:mod:`packer.loading.dense_pass` makes each batch):
:class:`DensePass` reads a dense pack's images and targets, ``DenseConfig.group``
batches at a time (:func:`group_size`): one read, one decode call and one pass of the
batched transform for the group (:func:`run_batches`), then hands the batches out one
by one, each with the event after the group's work on the producer's stream
(:class:`DenseItem`). Each batch is the one it would be alone: its own seeded draws
(:func:`packer.loading.order.batch_seed`), its own canvas (on CUDA its pixels within the
rounding of one product: the half-precision products take the group's padded shape).
A group that fails is made again batch by batch, so a damaged batch's error comes after
the batches before it (and a group that fails while its batches do not is said once)."""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import numpy as np
import torch

from ..pack.kinds import StorageKind
from .dense_batched import group_on_device, plan_of, run_grouped
from .dense_pass import GROUP_IMAGES, DenseSetup, _pixels, run_batch
from .order import batch_seed
from .producer import _Pass
from .stats import AUGMENT, COPY, READ, BatchTimes


def run_batches(
    images: list[torch.Tensor],
    records: list[dict[str, Any]],
    setup: DenseSetup,
    gens: list[tuple[int, torch.Generator | None]],
    batched: bool = True,
) -> list[tuple[torch.Tensor, Any]]:
    """Several batches at once (``gens``: each one's size and generator, in order, over
    ``images`` and ``records``): each what :func:`run_batch` makes of it, through one
    pass of the batched path where the op has one (:func:`dense_batched.run_grouped`),
    else one by one."""
    plan = plan_of(setup.op) if images and batched and len(gens) > 1 else None
    if plan is not None:
        items = [_pixels(rec, setup) for rec in records]
        out = run_grouped(images, records, items, setup, gens, plan)
        if out is not None:
            return out
    made, at = [], 0
    for n, g in gens:
        made.append(run_batch(images[at : at + n], records[at : at + n], setup, g, batched))
        at += n
    return made


def group_size(setup: DenseSetup, batch_size: int, prefetch: int) -> int:
    """Batches a dense pass makes together (``DenseConfig.group``; None: enough for
    :data:`GROUP_IMAGES` images, at most ``prefetch``; 1 without a batched path, and 1 for
    a semantic pack, whose models' steps are device-bound: the host work a group shares
    matters little there, and two a pass was not shown to cost nothing (docs/PERFORMANCE.md,
    "Detection and segmentation fed by packs"))."""
    if setup.group is not None:
        return setup.group
    if plan_of(setup.op) is None or setup.semantic:
        return 1
    return max(1, min(prefetch, -(-GROUP_IMAGES // max(1, batch_size))))


def host_of(setup: DenseSetup) -> str:
    """Where a pass makes its groups' host halves (``DenseConfig.host``; None: "process"
    for a pack with boxes, whose detector's step is mostly Python and gives the
    producer's host work back one for one, "thread" for a semantic pack, whose model's
    step is device-bound (docs/PERFORMANCE.md, "Detection and segmentation fed by
    packs"))."""
    if setup.host is not None:
        return setup.host
    return "thread" if setup.semantic else "process"


def _shares(bt: Any, k: int) -> list[Any]:
    """A group's stage times as ``k`` batches' equal shares (the stats count batches)."""
    if k == 1 or not isinstance(bt, BatchTimes):
        return [bt] * k
    each = BatchTimes(bt.clock)
    each.times = [t / k for t in bt.times]
    return [each] * k


def _group_failed(k: int, e: BaseException) -> str:
    why = (str(e).strip().splitlines() or [""])[0][:200]
    return (
        f"imgpack: a group of {k} dense batches failed ({type(e).__name__}: {why}) and was "
        "made one batch at a time, each fine; if this repeats (the device's memory, say), "
        "pass DenseConfig(group=1)"
    )


class DenseItem:
    """A dense batch handed to the consumer: ``(images, targets)`` and, on CUDA, the
    event after its work on the producer's stream."""

    def __init__(self, images: torch.Tensor, targets: Any, ready: Any) -> None:
        self.images, self.targets, self.ready = images, targets, ready

    def deliver(self, device: torch.device) -> tuple[torch.Tensor, Any]:
        """The batch, the current stream made to wait for it (the GPU waits, not the host)."""
        if self.ready is not None:
            cur = torch.cuda.current_stream(device)
            cur.wait_event(self.ready)
            for t in _tensors((self.images, self.targets)):
                if t.device.type == "cuda":  # not the padded batch's host shapes
                    t.record_stream(cur)
        return self.images, self.targets


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensors(o)]
    return []


class DensePass(_Pass):
    """A dense pack's pass: images and targets read per batch, each image transformed
    with its targets on the device (on CUDA on a side stream, then its event)."""

    @classmethod
    def read_window(cls, cfg: Any) -> int:
        # a group's batches are read together and their shards held until it is made
        return group_size(cfg.dense, cfg.batch_size, cfg.prefetch)

    def __init__(self, cfg: Any, **kw: Any) -> None:
        super().__init__(cfg, **kw)
        self.setup: DenseSetup = cfg.dense
        self.kind: StorageKind = cfg.kind
        self.pack = cfg.pack
        # no larger than the batches this pass makes (a generator is set up per batch)
        self.left = max(1, self.nbatches - self.start)
        self.group = min(group_size(self.setup, cfg.batch_size, cfg.prefetch), self.left)
        self.plan = plan_of(self.setup.op)

    def _images(self, idx: np.ndarray, bt: Any) -> list[torch.Tensor]:
        """The batch's images, uint8 [3, h, w] each, on the device."""
        if self.kind.decoded:
            return list(self.pack.decode(idx, self.device))
        n = len(idx)
        pin = self.device.type == "cuda"  # then one copy that does not wait for the stream
        images = torch.empty((n, *self.shape), dtype=torch.uint8, pin_memory=pin)
        for f in self.submit(idx, images.numpy().reshape(n, -1)):
            bt.add(READ, f.result())
        bt.mark()
        return list(images.to(self.device, non_blocking=pin).unbind(0))

    def _groups(self) -> Any:
        """:meth:`batches` ``self.group`` at a time (the last group may hold fewer)."""
        group: list[tuple[int, np.ndarray]] = []
        for b, idx in self.batches():
            group.append((b, idx))
            if len(group) == self.group:
                yield group
                group = []
        if group:
            yield group

    def _make(
        self, group: list[tuple[int, np.ndarray]], stream: Any, gens: list, drawn: Any = None
    ) -> list | None:
        """The batches of ``group`` made together: a :class:`DenseItem` each. ``drawn``:
        the group's host half from a worker (:mod:`packer.loading.dense_host`): then only
        the images are read, decoded and transformed here, and None is returned where
        they are not the sizes the worker drew for (the group is then made here whole)."""
        st = self.stats
        bt = st.batch()
        idx = np.concatenate([i for _, i in group])
        records = self.setup.columns.read(idx) if drawn is None else None
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            images = self._images(idx, bt)
            if drawn is not None and [tuple(i.shape[-2:]) for i in images] != drawn.drawn.sizes:
                return None
            bt.lap(READ)
            if drawn is None:
                seed, epoch, rank = self.seeds
                for g, (b, _) in zip(gens, group):  # each batch its own draws, as alone
                    g.manual_seed(batch_seed(seed, epoch, rank, b))
                sizes = [(len(i), g) for (_, i), g in zip(group, gens)]
                made = run_batches(images, records, self.setup, sizes)
            else:
                made = group_on_device(images, drawn, self.setup, self.plan)
            ready = None
            if stream is not None:
                ready = torch.cuda.Event()
                ready.record(stream)
            bt.lap(AUGMENT if self.setup.op is not None else COPY)
        # the reads are let go once the group is made: a group that fails is read
        # again batch by batch (see run)
        for b, _ in group:
            self.read_done(b)
        for share in _shares(bt, len(group)):
            st.produced(share)
        return [DenseItem(batch, targets, ready) for batch, targets in made]

    def _hand_out(self, items: list[DenseItem]) -> bool:
        """Put ``items`` in order, each dropped here once put (a batch the consumer is
        done with is not kept alive while the next group is made); False once stopped."""
        while items:
            if not self.put(items.pop(0)):
                return False
        return True

    def _worker(self) -> Any:
        """A :class:`packer.loading.dense_host.HostWorker` for this pass, or None where the
        thread makes the groups (:func:`host_of` "thread", no batched path, a set, no
        fork: the platform, a daemonic process, or a fork that fails, said once and not
        tried again; by default also a pass of one group, which it cannot make ahead)."""
        if host_of(self.setup) != "process" or self.plan is None:
            return None
        if self.units is not None:
            return None
        if self.setup.host is None and self.left == self.group:
            return None  # one group: the fork would be its whole cost
        from .dense_host import HostWorker, fork_failed, forkable

        if not forkable():
            return None
        try:  # the worker reads this pass's pack and columns (inherited), never its path
            return HostWorker(self.pack, self.setup)
        except OSError as e:  # no process left to fork (a limit, memory)
            fork_failed(e)
            warnings.warn(
                f"imgpack: the dense loader could not start its host worker ({e}); its "
                "producer thread makes the batches (DenseConfig(host='thread'))",
                RuntimeWarning,
                stacklevel=1,
            )
            return None

    def _make_any(self, group: list, stream: Any, gens: list, warned: list) -> list | None:
        """The batches of ``group`` made on this thread (:meth:`_make`); a group that
        fails is made again batch by batch and handed out as it goes (then None)."""
        try:
            return self._make(group, stream, gens)
        except Exception as e:
            if len(group) == 1:
                raise
            failed = e
        # some batch of the group fails: the batches made one by one, those before it
        # handed out, then its error raised, as without groups
        for one in group:
            if not self._hand_out(self._make([one], stream, gens)):
                return None
        if not warned:  # every batch made alone: the group itself failed (memory?)
            warned.append(True)
            warnings.warn(_group_failed(len(group), failed), RuntimeWarning, stacklevel=1)
        return []

    def run(self) -> None:
        self.stats.set_workers(read=self.num_threads)
        cuda = self.device.type == "cuda"
        stream = torch.cuda.Stream(self.device) if cuda else None
        gens = [self.gen if self.gen is not None else torch.Generator()]
        gens += [torch.Generator() for _ in range(self.group - 1)]
        warned: list[bool] = []
        worker = self._worker()
        if worker is None:
            for group in self._groups():
                items = self._make_any(group, stream, gens, warned)
                if items is None or not self._hand_out(items):
                    return
        else:
            try:
                if not self._run_with(worker, stream, gens, warned):
                    return
            finally:
                worker.close()
        if stream is not None:
            stream.synchronize()

    def _run_with(self, worker: Any, stream: Any, gens: list, warned: list) -> bool:
        """The pass with ``worker`` making the groups' host halves, two groups ahead; a
        group it could not make (an error, records the batched path declines) is made
        here, as the thread would. False once stopped."""
        groups = self._groups()
        asked: list = []
        alive = True

        def lost(why: str = "ended") -> None:  # this thread makes the rest, said once
            nonlocal alive
            alive = False
            warnings.warn(
                f"imgpack: the dense loader's host worker {why}; its producer thread "
                "makes the batches from here (DenseConfig(host='thread'))",
                RuntimeWarning,
                stacklevel=1,
            )

        def ask() -> None:
            group = next(groups, None)
            if group is not None:
                asked.append(group)
                if alive:
                    try:
                        worker.submit(group, self.seeds)
                    except (OSError, ValueError):  # its pipe closed between two requests
                        lost()

        ask()
        ask()
        while asked:
            group = asked.pop(0)
            ask()
            made, status = None, "error"
            if alive:
                try:
                    status, made = worker.result(self.stop, self.setup.host_wait)
                except TimeoutError as e:  # hung (alive, silent): stopped
                    lost(str(e))
                except (EOFError, OSError):
                    lost()
                if status == "stopped":
                    return False
                if status != "ok":
                    made = None
            items = None
            if made is not None:
                try:
                    items = self._make(group, stream, gens, made)
                except Exception:  # the producer's half (decode, kernels) failed: made
                    items = None  # again below, as the thread would, which meets it there
            if items is None:
                items = self._make_any(group, stream, gens, warned)
                if items is None:
                    return False
            if not self._hand_out(items):
                return False
        return True
