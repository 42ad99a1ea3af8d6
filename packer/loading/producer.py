"""The background half of a :class:`packer.loading.loader.PackLoader` pass: :class:`_Pass`.

A producer thread per pass (:func:`_produce`) gathers rows over the loader's gather
threads (:func:`_take`) into pinned slots (:class:`_Slots`, shared through
:class:`_Shared`), copies them to the device on a side stream (or, ``gather="device"``,
has the GPU read them from the registered pack: :meth:`_Pass.run_device`), runs the
transform there and puts each batch, :data:`_DONE` or a :class:`_Failure` on a bounded
queue. It refers to no iterator and no loader (see the lifetime note in
:mod:`packer.loading.loader`).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import ctypes
import functools
import itertools
import math
import os
import queue
import threading
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from ..errors import PackerError, PackFormatError, UsageError
from .order import batch_seed

_MADV_POPULATE_READ = 22
_JOIN_TIMEOUT_S = 10.0
_TASK_BYTES = 8 << 20  # bytes a gather task copies at least (see _Pass.submit)
_DECODE_AHEAD = 2  # JPEG packs: batches read and decoded ahead of the one being cropped
_CPU_TASK = 4  # JPEG packs: images a CPU decode task takes at most
GATHER_MODES = ("cpu", "device")  # PackLoader(gather=): who copies a raw pack's rows


def _transform_name(transform: Callable[..., Any]) -> str:
    return getattr(transform, "__qualname__", None) or type(transform).__name__


def _check_transformed(
    transform: Callable[..., Any], images: torch.Tensor, out: Any
) -> torch.Tensor:
    """What a transform returned, if it can be yielded as the batch's images beside its
    labels: a Tensor [B, 3, h, w] (the same B as its input, h and w >= 1), uint8 or
    floating point, on the input's device. Metadata only, so no host sync on CUDA."""
    name = _transform_name(transform)
    if not isinstance(out, torch.Tensor):
        raise UsageError(
            f"transform {name} returned {type(out).__name__}, not a Tensor; a transform "
            "maps a uint8 batch [B, 3, H, W] to a Tensor [B, 3, h, w]"
        )
    b = images.shape[0]
    if out.dim() == 0 or out.shape[0] != b:
        raise UsageError(
            f"transform {name} returned shape {list(out.shape)} for a batch of {b}; it must "
            f"keep the batch size (first dimension {b}) so images and labels stay paired"
        )
    if out.dim() != 4 or out.shape[1] != images.shape[1] or min(out.shape[2:]) < 1:
        raise UsageError(
            f"transform {name} returned shape {list(out.shape)}; it must return images "
            f"[B, 3, h, w] ({b} images of 3 channels), as it is given"
        )
    if out.dtype != torch.uint8 and not out.dtype.is_floating_point:
        raise UsageError(
            f"transform {name} returned {out.dtype}; a transform returns uint8 or floating "
            "point images"
        )
    if out.device != images.device:
        raise UsageError(
            f"transform {name} returned images on {out.device}, not on the loader's device "
            f"{images.device}"
        )
    return out


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


def _apply_transform(
    transform: Callable[..., torch.Tensor] | None,
    images: torch.Tensor,
    gen: torch.Generator | None,
    seeds: tuple[int, int, int],
    b: int,
) -> torch.Tensor:
    if transform is None:
        return images
    if gen is None:
        return _check_transformed(transform, images, transform(images))
    gen.manual_seed(batch_seed(seeds[0], seeds[1], seeds[2], b))
    return _check_transformed(transform, images, transform(images, generator=gen))


def _transform_batch(
    transform: Callable[..., Any] | None,
    images: torch.Tensor,
    labels: torch.Tensor,
    gen: torch.Generator | None,
    seeds: tuple[int, int, int],
    b: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch through the loader's transform: ``(images, labels)``, the labels mixed
    (float [B, K]) by a transform with ``mixes_labels``, else as they came."""
    if not getattr(transform, "mixes_labels", False):
        return _apply_transform(transform, images, gen, seeds, b), labels
    if gen is not None:
        gen.manual_seed(batch_seed(seeds[0], seeds[1], seeds[2], b))
    return _mix(transform, images, labels, gen)


def _mix(
    transform: Callable[..., Any],
    images: torch.Tensor,
    labels: torch.Tensor,
    gen: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``transform(images, labels, generator=gen)`` for a label-mixing transform, its
    result checked: images as :func:`_check_transformed`, soft labels a floating point
    Tensor [B, K] on the images' device. Metadata only, so no host sync on CUDA."""
    out = transform(images, labels, generator=gen)
    name = _transform_name(transform)
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise UsageError(
            f"transform {name} mixes labels (mixes_labels = True) but returned "
            f"{type(out).__name__}, not (images, soft_labels)"
        )
    mixed, soft = out
    mixed = _check_transformed(transform, images, mixed)
    b = images.shape[0]
    if (
        not isinstance(soft, torch.Tensor)
        or not soft.dtype.is_floating_point
        or soft.dim() != 2
        or soft.shape[0] != b
    ):
        got = (
            f"{soft.dtype} {list(soft.shape)}"
            if isinstance(soft, torch.Tensor)
            else type(soft).__name__
        )
        raise UsageError(
            f"transform {name} returned soft labels {got}; a label-mixing transform "
            f"returns float labels [{b}, num_classes]"
        )
    if soft.device != images.device:
        raise UsageError(
            f"transform {name} returned soft labels on {soft.device}, not on the loader's "
            f"device {images.device}"
        )
    return mixed, soft


def _stored_sizes(stored: np.ndarray, idx: np.ndarray, path: object) -> np.ndarray:
    """The pack's (h, w) [n, 2] of images ``idx``; PackFormatError naming the first
    that is not a positive size (the boxes are drawn from these before decoding)."""
    hw = stored[idx]
    bad = (hw < 1).any(1)
    if bad.any():
        j = int(bad.argmax())
        raise PackFormatError(
            f"{path}: image {int(idx[j])}: the pack gives its size as {hw[j, 1]}x{hw[j, 0]}; "
            "the pack is damaged, rebuild it"
        )
    return hw


def _check_sizes(got: torch.Tensor, stored: torch.Tensor, idx: np.ndarray) -> None:
    """Decoded (h, w) [g, 2] against the pack's stored sizes: the boxes were drawn from
    those, so a mismatch is a damaged pack, named by its first image."""
    if not torch.equal(got, stored):
        from ..imaging.jpeg import size_mismatch

        j = int((got != stored).any(1).int().argmax())
        raise size_mismatch(int(idx[j]), got[j].tolist(), stored[j].tolist())


def _raise(e: BaseException) -> None:
    raise e


def _take(src: np.ndarray, idx: np.ndarray, out: np.ndarray) -> None:
    """Copy rows ``idx`` of ``src`` into ``out`` (a memcpy per row, GIL released)."""
    np.take(src, idx, 0, out, "clip")


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
    so dropping the iterator collects it and its finalizer stops this."""

    def __init__(
        self,
        *,
        src: torch.Tensor,
        labels: torch.Tensor,
        targets: torch.Tensor | None,
        order: np.ndarray,
        batch_size: int,
        start: int,
        nbatches: int,
        prefetch: int,
        device: torch.device,
        pool: ThreadPoolExecutor,
        num_threads: int,
        slots: _Slots | None,
        shared: _Shared,
        transform: Callable[..., torch.Tensor] | None,
        gen: torch.Generator | None,
        seeds: tuple[int, int, int],
        jpeg: tuple[Any, Any, bool] | None = None,
        rows: Any = None,
    ) -> None:
        self.jpeg = jpeg
        self.rows = rows
        row = math.prod(src.shape[1:]) if jpeg is None else 1
        # 2-D byte views: each row is one image; np.take copies whole rows (memcpy).
        self.src = src.numpy().reshape(len(src), row) if len(src) else np.empty((0, row), np.uint8)
        self.shape = tuple(src.shape[1:])
        self.labels = labels.numpy()
        self.targets = None if targets is None else targets.numpy()
        self.order = order
        self.batch_size = batch_size
        self.start = start
        self.nbatches = nbatches
        self.device = device
        self.pool = pool
        self.num_threads = num_threads
        self.slots = slots
        self.shared = shared
        self.transform = transform
        self.gen = gen
        self.seeds = seeds
        self.pid = os.getpid()
        self.queue = _Handoff(prefetch)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=_produce, args=(self,), name="imgpack-producer")
        self.thread.daemon = True  # a leftover never blocks exit; stop_and_join runs at exit

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
        self.shared.pass_ended()

    def _drain(self) -> None:
        with contextlib.suppress(queue.Empty):
            while True:
                self.queue.get_nowait()

    # ---- producer side (runs in self.thread)
    def submit(
        self, idx: np.ndarray, out: np.ndarray, pipelined: bool = False
    ) -> list[Future[Any]]:
        """Start copying rows ``idx`` of the pack into ``out`` on the gather threads.

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
        return [
            self.pool.submit(_take, self.src, idx[a:b], out[a:b])
            for a, b in itertools.pairwise(bounds)
            if b > a
        ]

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
            yield b, self.order[b * bs : (b + 1) * bs]

    def run_cpu(self) -> None:
        for b, idx in self.batches():
            images = torch.empty((len(idx), *self.shape), dtype=torch.uint8)
            for f in self.submit(idx, images.numpy().reshape(len(idx), -1)):
                f.result()
            labels = torch.from_numpy(np.take(self.labels, idx, 0))
            targets = None
            if self.targets is not None:
                targets = torch.from_numpy(np.take(self.targets, idx, 0))
            images, labels = _transform_batch(
                self.transform, images, labels, self.gen, self.seeds, b
            )
            if not self.put((images, labels, targets, None)):
                return

    def run_jpeg(self) -> None:
        """JPEG packs: per batch, read the files (offsets and end markers checked), draw
        every image's box from its stored size, decode and crop the batch, run the rest
        of the transform.

        On the device (``on_cpu`` False) the batch is decoded in one call and cropped in
        one batched call; the decodes run ``_DECODE_AHEAD`` batches ahead on a thread of
        their own (:func:`packer.imaging.jpeg.decode_ahead`) while this thread reads the next
        batches' bytes and crops each batch, in batch order, on a side stream; the batch
        carries a ready event, as the raw path's batches do. With ``on_cpu`` each image
        is decoded and its box resampled on the loader's threads as soon as its batch is
        read (:func:`packer.imaging.jpeg.decode_crop_cpu`), into a new buffer (pinned, then
        copied, when the batch goes to CUDA). Either way the boxes, and the generator
        state the rest of the transform continues from, depend on the seed alone.
        """
        from ..imaging.jpeg import decode_ahead, decode_batch, resize_images, sizes_of
        from ..imaging.transforms import _to

        pack, crop, on_cpu = self.jpeg  # type: ignore[misc]
        dev = self.device
        cuda = dev.type == "cuda"
        stream = torch.cuda.Stream(dev) if cuda else None
        pool = None if cuda else self.pool
        stored = pack.sizes.numpy()

        def jobs() -> Iterator[tuple[Any, Callable[[], list[torch.Tensor]]]]:
            # the reads (offsets and end markers checked) run here, on the producer
            # thread: the decoder thread, the pipeline's slowest stage, only decodes
            # (a damaged offset raises when its batch comes, not while an earlier one waits)
            for b, idx in self.batches():
                try:
                    datas = pack.read(idx, check_ends=True)
                    sizes = torch.from_numpy(_stored_sizes(stored, idx, pack.path))
                    if self.gen is not None:
                        self.gen.manual_seed(batch_seed(*self.seeds, b))
                    boxes, flip = crop.boxes(sizes, self.gen)
                except (PackerError, ValueError) as e:
                    yield (b, idx, None), functools.partial(_raise, e)
                    continue
                state = None if self.gen is None else self.gen.get_state()
                if on_cpu:  # decoded on the threads from now on; the decoder thread idles
                    cpu = self._decode_on_cpu(datas, idx, sizes, boxes, flip, crop.size)
                    yield (b, idx, (sizes, boxes, flip, state, cpu)), list
                    continue
                kw = {"indices": idx.tolist(), "pool": pool, "ends_checked": True, "sizes": sizes}
                decode = functools.partial(decode_batch, datas, dev, **kw)
                yield (b, idx, (sizes, boxes, flip, state, None)), decode

        decoded = decode_ahead(jobs(), dev, stream, ahead=_DECODE_AHEAD)
        try:
            for (_, idx, meta), imgs in decoded:
                sizes, boxes, flip, state, cpu = meta
                if state is not None:
                    self.gen.set_state(state)  # type: ignore[union-attr]
                with torch.cuda.stream(stream) if cuda else contextlib.nullcontext():
                    if cpu is None:
                        got = sizes_of(imgs)
                        _check_sizes(got, sizes, idx)
                        images = resize_images(imgs, crop.size, boxes=boxes, flip=flip, sizes=got)
                    else:
                        out, futs = cpu
                        for f in futs:
                            f.result()
                        images = out.to(dev, non_blocking=True) if cuda else out
                    del imgs
                    labels = torch.from_numpy(np.take(self.labels, idx, 0))
                    targets = None
                    if self.targets is not None:
                        targets = torch.from_numpy(np.take(self.targets, idx, 0))
                    if cuda:
                        labels = _to(labels, dev)
                        if targets is not None:
                            targets = _to(targets, dev)
                    if getattr(crop.rest, "mixes_labels", False):
                        images, labels = _mix(crop.rest, images, labels, self.gen)
                    else:
                        out = crop.after(images, self.gen)
                        images = (
                            out if crop.rest is None else _check_transformed(crop.rest, images, out)
                        )
                    ready = None
                    if cuda:
                        ready = torch.cuda.Event()
                        ready.record(stream)
                if not self.put((images, labels, targets, ready)):
                    return
        finally:
            decoded.close()

    def _decode_on_cpu(
        self,
        datas: list[torch.Tensor],
        idx: np.ndarray,
        sizes: torch.Tensor,
        boxes: torch.Tensor,
        flip: torch.Tensor | None,
        size: tuple[int, int],
    ) -> tuple[torch.Tensor, list[Future[Any]]]:
        """Start decoding a batch image by image on the CPU threads into one new
        uint8 [n, 3, *size] buffer (pinned when the batch goes to CUDA)."""
        from ..imaging.jpeg import decode_crop_cpu

        n = len(idx)
        out = torch.empty((n, 3, *size), dtype=torch.uint8, pin_memory=self.device.type == "cuda")
        o, hw, bx = out.numpy(), sizes.numpy(), boxes.numpy()
        fl = np.zeros(n, bool) if flip is None else flip.numpy()

        def run(a: int, z: int) -> None:
            for j in range(a, z):
                decode_crop_cpu(datas[j], int(idx[j]), hw[j], bx[j], bool(fl[j]), o[j])

        # a few images a task: one submit per image would cost more GIL than it spares
        step = max(1, min(_CPU_TASK, -(-n // self.num_threads)))
        return out, [self.pool.submit(run, a, min(a + step, n)) for a in range(0, n, step)]

    def run_cuda(self) -> None:
        """Gather several batches at once (one pinned slot each), ship them in order.

        Up to ``prefetch`` batches are being gathered by the thread pool at a
        time, so gather threads never idle at a batch boundary. A slot is
        refilled only after the H2D copy out of it has completed. The
        transform runs on the copy stream after the copy, before the batch's
        ready event, so the consumer's stream waits for it on the GPU.
        """
        assert self.slots is not None
        dev = self.device
        slots = self.slots
        k = len(slots.images)
        pinned, pinned_lab, freed, stream = slots.images, slots.labels, slots.freed, slots.stream
        pinned_tgt = slots.targets
        # np.take into a buffer of another dtype would cast: the loader refused such packs
        assert self.labels.dtype == np.int64 and pinned_lab[0].dtype == torch.int64
        assert (self.targets is None) == (pinned_tgt is None)
        if self.targets is not None and pinned_tgt is not None:
            assert self.targets.dtype == np.float32 and pinned_tgt[0].dtype == torch.float32
            assert pinned_tgt[0].shape[1] == self.targets.shape[1]
        pending: collections.deque[tuple[int, np.ndarray, int, list[Future[Any]]]] = (
            collections.deque()
        )

        def ship() -> bool:
            b, idx, s, futs = pending.popleft()
            for f in futs:
                f.result()
            n = len(idx)
            buf, lab = pinned[s][:n], pinned_lab[s][:n]
            np.take(self.labels, idx, out=lab.numpy(), mode="clip")
            tgt = None
            if pinned_tgt is not None:
                tgt = pinned_tgt[s][:n]
                np.take(self.targets, idx, 0, out=tgt.numpy(), mode="clip")
            with torch.cuda.stream(stream):
                images = buf.to(dev, non_blocking=True)
                labels = lab.to(dev, non_blocking=True)
                targets = None if tgt is None else tgt.to(dev, non_blocking=True)
                copied = torch.cuda.Event()
                copied.record(stream)
                ready = copied
                if self.transform is not None:
                    images, labels = _transform_batch(
                        self.transform, images, labels, self.gen, self.seeds, b
                    )
                    ready = torch.cuda.Event()
                    ready.record(stream)
            freed[s] = copied
            return self.put((images, labels, targets, ready))

        for j, (b, idx) in enumerate(self.batches()):
            s = j % k
            if len(pending) == k and not ship():
                return
            if freed[s] is not None:
                freed[s].synchronize()  # the copy out of this slot is done
            n = len(idx)
            out = pinned[s][:n].numpy().reshape(n, -1)
            pending.append((b, idx, s, self.submit(idx, out, pipelined=True)))
            while pending and all(f.done() for f in pending[0][3]):
                if not ship():
                    return
        while pending:
            if not ship():
                return
        stream.synchronize()

    def run_device(self) -> None:
        """The GPU reads each batch's rows from the registered pack itself
        (:mod:`packer.loading.device_gather`): no CPU copy, no pinned buffer. The pass's
        order goes to the device once; per batch, three copy kernels (images,
        labels, targets) and the transform run on a side stream, then its event."""
        rows = self.rows
        dev = self.device
        bs = self.batch_size
        stream = torch.cuda.Stream(dev)
        try:
            self._gather_on_device(rows, dev, bs, stream)
        finally:
            # the kernels read the registered pack: none may run once the pass has ended
            # (the last pass of a collected loader then unregisters it, without a wait)
            stream.synchronize()

    def _gather_on_device(
        self, rows: Any, dev: torch.device, bs: int, stream: torch.cuda.Stream
    ) -> None:
        with torch.cuda.stream(stream):
            order = torch.from_numpy(np.ascontiguousarray(self.order, np.int64)).to(dev)
            for b, idx in self.batches():
                n = len(idx)
                pos = order[b * bs : b * bs + n]
                images = torch.empty((n, *self.shape), dtype=torch.uint8, device=dev)
                rows.images.gather(pos, images)
                labels = torch.empty((n,), dtype=torch.int64, device=dev)
                rows.labels.gather(pos, labels)
                targets = None
                if rows.targets is not None and self.targets is not None:
                    k = self.targets.shape[1]
                    targets = torch.empty((n, k), dtype=torch.float32, device=dev)
                    rows.targets.gather(pos, targets)
                if self.transform is not None:
                    images, labels = _transform_batch(
                        self.transform, images, labels, self.gen, self.seeds, b
                    )
                ready = torch.cuda.Event()
                ready.record(stream)
                if not self.put((images, labels, targets, ready)):
                    return


def _produce(p: _Pass) -> None:
    try:
        _run(p)
    finally:
        p.finish()


def _run(p: _Pass) -> None:
    try:
        if p.jpeg is not None:
            if p.device.type == "cuda":
                with torch.cuda.device(p.device):
                    p.run_jpeg()
            else:
                p.run_jpeg()
        elif p.rows is not None:
            with torch.cuda.device(p.device):
                p.run_device()
        elif p.slots is not None:
            with torch.cuda.device(p.device):
                p.run_cuda()
        else:
            p.run_cpu()
        p.put(_DONE)
    except BaseException as e:  # re-raised in the consumer
        p.put(_Failure(e))
