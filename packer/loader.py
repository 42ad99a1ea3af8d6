"""Stream a pack in shuffled batches to a device: :class:`PackLoader` and :class:`Normalize`.

The hot path, per batch (CUDA)::

    background thread: pick a free pinned buffer -> T threads gather random rows
    from the page-cached memmap into it (np.take, GIL released, memcpy per row;
    several batches in flight so no thread waits at a batch boundary)
    -> in order: async H2D copy on a side stream -> event -> bounded queue
    consumer: queue.get -> current stream waits on the event (the GPU waits,
    never the host) -> uint8 images [B, 3, H, W] and int64 labels [B] on device

Bytes cross the bus as uint8; normalisation to float happens on the GPU in
:class:`Normalize`. A pinned buffer is refilled only after the copy out of it
has finished (its event). An exception in the background is re-raised in the
consumer's ``__next__``. On the CPU the same pipeline runs without pinning or
streams, giving fresh tensors each batch.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import itertools
import math
import os
import queue
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .errors import UsageError
from .pack import ImagePack, open_pack

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_MADV_POPULATE_READ = 22


def epoch_indices(
    n: int, *, epoch: int, seed: int, shuffle: bool, rank: int, world_size: int, drop_last: bool
) -> torch.Tensor:
    """This rank's sample order for one epoch, int64 [M].

    Same rule as ``torch.utils.data.DistributedSampler``: a permutation from
    ``seed + epoch``; with several ranks, padded by repeating its head up to a
    multiple of world_size (or, with drop_last, trimmed to one), then rank r
    takes every world_size-th index starting at r. Every rank gets the same M.
    """
    if shuffle:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        order = torch.randperm(n, generator=g)
    else:
        order = torch.arange(n)
    if world_size > 1:
        if drop_last:
            order = order[: (n // world_size) * world_size]
        else:
            total = math.ceil(n / world_size) * world_size
            pad = total - n
            if pad:
                reps = math.ceil(pad / max(n, 1))
                order = torch.cat([order, order.repeat(reps)[:pad]])
        order = order[rank::world_size]
    return order


def _dist_defaults(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is None or world_size is None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank = dist.get_rank() if rank is None else rank
            world_size = dist.get_world_size() if world_size is None else world_size
    rank = 0 if rank is None else rank
    world_size = 1 if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise UsageError(f"rank {rank} is outside world_size {world_size}")
    return rank, world_size


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


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


_DONE = object()


class PackLoader:
    """Iterate a pack in batches of ``(images, labels)`` on ``device``.

    Args:
      pack: an :class:`ImagePack` from :func:`packer.load`, or a pack's path.
      batch_size: images per batch.
      shuffle, seed: each pass uses the permutation of ``seed + epoch``.
      device: where batches land ("cuda", "cuda:1", "cpu", torch.device).
      drop_last: drop the short last batch (and, with several ranks, trim
        instead of pad the epoch).
      rank, world_size: this process's part; default torch.distributed's when
        initialised, else 0 and 1. Parts are disjoint and of equal length,
        padded as DistributedSampler pads (see :func:`epoch_indices`).
      num_threads: threads gathering rows (default min(8, cores)).
      prefetch: batches in flight, one pinned buffer each.
      resident: copy the whole pack to ``device`` once and gather there (for
        packs that fit in GPU memory; fastest).
      populate: pre-map the page-cached pack before the first batch (Linux).

    Yields:
      images: Tensor[B, 3, H, W], uint8 in [0, 255], on ``device``.
      labels: Tensor[B], int64, on ``device``.

    Each ``iter()`` uses the next epoch's order (first: epoch 0);
    ``set_epoch(e)`` chooses it explicitly, as with DistributedSampler; call it
    every epoch when training on several processes.
    """

    def __init__(
        self,
        pack: ImagePack | str | os.PathLike[str],
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        device: str | torch.device = "cuda",
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        num_threads: int | None = None,
        prefetch: int = 4,
        resident: bool = False,
        populate: bool = False,
    ) -> None:
        if isinstance(pack, (str, os.PathLike)):
            pack = open_pack(Path(pack))
        if not isinstance(batch_size, int) or batch_size < 1:
            raise UsageError(f"batch_size must be a positive integer, not {batch_size!r}")
        if prefetch < 1:
            raise UsageError("prefetch must be at least 1")
        self.pack = pack
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.device = torch.device(device)
        if self.device.type == "cuda":
            if not torch.cuda.is_available():
                raise UsageError("device is CUDA but torch sees no CUDA device; use device='cpu'")
            if self.device.index is None:
                self.device = torch.device("cuda", torch.cuda.current_device())
        self.rank, self.world_size = _dist_defaults(rank, world_size)
        self.num_threads = num_threads or min(8, os.cpu_count() or 1)
        self.prefetch = prefetch
        self.resident = resident
        self._populate = populate
        self._epoch = 0
        self._images = pack.images
        self._labels = pack.labels
        n = len(pack)
        self._n = n
        self._shape = tuple(pack.images.shape[1:])
        self._pool: ThreadPoolExecutor | None = None
        self._resident: tuple[torch.Tensor, torch.Tensor] | None = None
        self._active: _EpochIterator | None = None
        self._slots: _Slots | None = None

    # ---- size and order
    def _per_rank(self) -> int:
        if self.world_size == 1:
            return self._n
        if self.drop_last:
            return self._n // self.world_size
        return math.ceil(self._n / self.world_size)

    def __len__(self) -> int:
        m = self._per_rank()
        return m // self.batch_size if self.drop_last else math.ceil(m / self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s order for the next pass."""
        self._epoch = int(epoch)

    @property
    def epoch(self) -> int:
        """The epoch the next pass will use."""
        return self._epoch

    def indices(self, epoch: int) -> torch.Tensor:
        """This rank's sample indices for ``epoch``, in yield order (int64 [M])."""
        order = epoch_indices(
            self._n,
            epoch=epoch,
            seed=self.seed,
            shuffle=self.shuffle,
            rank=self.rank,
            world_size=self.world_size,
            drop_last=self.drop_last,
        )
        if self.drop_last:
            order = order[: len(self) * self.batch_size]
        return order

    # ---- iteration
    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self._active is not None:
            self._active.close()
            if self._active.thread.is_alive():  # stuck past close()'s timeout: share nothing
                self._slots = None
        order = self.indices(self._epoch)
        self._epoch += 1
        if self.resident:
            return self._iter_resident(order)
        if self._populate:
            populate(self._images)
            self._populate = False
        self._active = _EpochIterator(self, order)
        return self._active

    def _pinned_slots(self) -> _Slots:
        """The pinned buffers and copy stream, made once and reused by every epoch
        (allocating pinned memory costs far more than filling it)."""
        if self._slots is None:
            self._slots = _Slots(self.prefetch, self.batch_size, self._shape, self.device)
        return self._slots

    def _thread_pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.num_threads, thread_name_prefix="imgpack-gather")
        return self._pool

    def _iter_resident(self, order: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self._resident is None:
            self._resident = self._load_resident()
        images, labels = self._resident
        order = order.to(self.device, non_blocking=True)
        for b in range(len(self)):
            idx = order[b * self.batch_size : (b + 1) * self.batch_size]
            yield images.index_select(0, idx), labels.index_select(0, idx)

    def _load_resident(self) -> tuple[torch.Tensor, torch.Tensor]:
        images = torch.empty((self._n, *self._shape), dtype=torch.uint8, device=self.device)
        labels = torch.empty((self._n,), dtype=torch.int64, device=self.device)
        step = max(1, (256 << 20) // max(1, math.prod(self._shape)))
        seq = PackLoader(
            self.pack,
            step,
            shuffle=False,
            device=self.device,
            rank=0,
            world_size=1,
            num_threads=self.num_threads,
            prefetch=2,
        )
        start = 0
        for x, y in seq:
            images[start : start + len(x)].copy_(x)
            labels[start : start + len(y)].copy_(y)
            start += len(x)
        seq.close()
        return images, labels

    def close(self) -> None:
        """Stop background work and release threads (also done when garbage-collected)."""
        if self._active is not None:
            self._active.close()
            self._active = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._slots = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


class _Slots:
    """``k`` pinned batch buffers, the event after the last copy out of each, a copy stream."""

    def __init__(self, k: int, bs: int, shape: tuple[int, ...], device: torch.device) -> None:
        self.images = [
            torch.empty((bs, *shape), dtype=torch.uint8, pin_memory=True) for _ in range(k)
        ]
        self.labels = [torch.empty((bs,), dtype=torch.int64, pin_memory=True) for _ in range(k)]
        self.freed: list[torch.cuda.Event | None] = [None] * k
        self.stream = torch.cuda.Stream(device)


class _EpochIterator:
    """One pass: a producer thread fills a bounded queue; ``__next__`` consumes it."""

    def __init__(self, loader: PackLoader, order: torch.Tensor) -> None:
        self.loader = loader
        self.order = order.numpy().astype(np.intp)
        self.nbatches = len(loader)
        self.cuda = loader.device.type == "cuda"
        self.queue: queue.Queue[Any] = queue.Queue(maxsize=loader.prefetch)
        self.stop = threading.Event()
        self.closed = False
        src = loader._images
        row = math.prod(loader._shape)
        # 2-D byte views: each row is one image; np.take copies whole rows (memcpy).
        self.src = src.numpy().reshape(len(src), row) if len(src) else np.empty((0, row), np.uint8)
        self.labels = loader._labels.numpy()
        self.thread = threading.Thread(target=self._run, name="imgpack-producer", daemon=True)
        self.thread.start()

    # ---- producer side
    def _submit(self, idx: np.ndarray, out: np.ndarray) -> list[Future[Any]]:
        """Start copying rows ``idx`` of the pack into ``out`` on the gather threads."""
        pool = self.loader._thread_pool()
        parts = min(self.loader.num_threads, max(1, len(idx) // 8))
        bounds = np.linspace(0, len(idx), parts + 1).astype(int)
        return [
            pool.submit(np.take, self.src, idx[a:b], 0, out[a:b], "clip")
            for a, b in itertools.pairwise(bounds)
            if b > a
        ]

    def _gather(self, idx: np.ndarray, out: np.ndarray) -> None:
        for f in self._submit(idx, out):
            f.result()

    def _put(self, item: Any) -> bool:
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            if self.cuda:
                with torch.cuda.device(self.loader.device):
                    self._run_cuda()
            else:
                self._run_cpu()
            self._put(_DONE)
        except BaseException as e:  # re-raised in the consumer
            self._put(_Failure(e))

    def _batches(self) -> Iterator[np.ndarray]:
        bs = self.loader.batch_size
        for b in range(self.nbatches):
            if self.stop.is_set():
                return
            yield self.order[b * bs : (b + 1) * bs]

    def _run_cpu(self) -> None:
        shape = self.loader._shape
        for idx in self._batches():
            images = torch.empty((len(idx), *shape), dtype=torch.uint8)
            self._gather(idx, images.numpy().reshape(len(idx), -1))
            labels = torch.from_numpy(self.labels[idx].astype(np.int64))
            if not self._put((images, labels, None)):
                return

    def _run_cuda(self) -> None:
        """Gather several batches at once (one pinned slot each), ship them in order.

        Up to ``prefetch`` batches are being gathered by the thread pool at a
        time, so gather threads never idle at a batch boundary. A slot is
        refilled only after the H2D copy out of it has completed.
        """
        ld = self.loader
        dev = ld.device
        k = ld.prefetch
        slots = ld._pinned_slots()
        pinned, pinned_lab, freed, stream = slots.images, slots.labels, slots.freed, slots.stream
        pending: collections.deque[tuple[np.ndarray, int, list[Future[Any]]]] = collections.deque()

        def ship() -> bool:
            idx, s, futs = pending.popleft()
            for f in futs:
                f.result()
            n = len(idx)
            buf, lab = pinned[s][:n], pinned_lab[s][:n]
            np.take(self.labels, idx, out=lab.numpy(), mode="clip")
            with torch.cuda.stream(stream):
                images = buf.to(dev, non_blocking=True)
                labels = lab.to(dev, non_blocking=True)
                ev = torch.cuda.Event()
                ev.record(stream)
            freed[s] = ev
            return self._put((images, labels, ev))

        for b, idx in enumerate(self._batches()):
            s = b % k
            if len(pending) == k and not ship():
                return
            if freed[s] is not None:
                freed[s].synchronize()  # the copy out of this slot is done
            n = len(idx)
            pending.append((idx, s, self._submit(idx, pinned[s][:n].numpy().reshape(n, -1))))
            while pending and all(f.done() for f in pending[0][2]):
                if not ship():
                    return
        while pending:
            if not ship():
                return
        stream.synchronize()

    # ---- consumer side
    def __iter__(self) -> _EpochIterator:
        return self

    def __len__(self) -> int:
        return self.nbatches

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.closed:
            raise StopIteration
        while True:
            try:
                item = self.queue.get(timeout=1.0)
                break
            except queue.Empty:
                if not self.thread.is_alive():
                    self.close()
                    raise RuntimeError("imgpack loader thread died without a result") from None
        if item is _DONE:
            self.close()
            raise StopIteration
        if isinstance(item, _Failure):
            self.close()
            raise item.exc
        images, labels, ev = item
        if ev is not None:
            cur = torch.cuda.current_stream(self.loader.device)
            cur.wait_event(ev)  # the GPU waits for the copy; the host does not
            images.record_stream(cur)
            labels.record_stream(cur)
        return images, labels

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.stop.set()
        with contextlib.suppress(queue.Empty):
            while True:
                self.queue.get_nowait()
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout=10)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


class Normalize(nn.Module):
    """Images to normalized floats, for the front of a model.

    Input: Tensor[B, 3, H, W], uint8 in [0, 255] (scaled by 1/255 first) or
    float in [0, 1]. Output: ``(x - mean) / std`` per channel, in ``dtype``
    (default float32), same device and memory format. ``mean`` and ``std``
    are in [0, 1] units (torchvision convention); defaults: ImageNet's.
    One fused multiply-add on the device.
    """

    def __init__(
        self,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        m = torch.as_tensor(mean, dtype=torch.float64).reshape(1, -1, 1, 1)
        s = torch.as_tensor(std, dtype=torch.float64).reshape(1, -1, 1, 1)
        if m.numel() != s.numel() or bool((s <= 0).any()):
            raise ValueError("mean and std need the same length and std > 0")
        self.dtype = dtype
        self.register_buffer("scale_u8", (1 / (255 * s)).float(), persistent=False)
        self.register_buffer("scale_f", (1 / s).float(), persistent=False)
        self.register_buffer("shift", (-m / s).float(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.scale_u8 if x.dtype == torch.uint8 else self.scale_f
        y = torch.addcmul(self.shift, x.to(torch.float32), scale)
        return y if self.dtype == torch.float32 else y.to(self.dtype)
