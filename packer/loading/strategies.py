"""How a pass produces its batches, chosen once per pass from its :class:`PassConfig`
and the pack's storage kind (:func:`choose`).

* :class:`CpuGather`: the CPU; the gather threads copy rows into fresh tensors, the
  transform runs on the producer thread.
* :class:`PinnedGather`: CUDA, ``gather="cpu"``; several batches gathered at once into
  pinned slots, each copied on a side stream, then transformed there.
* :class:`DeviceGather`: CUDA, ``gather="device"``; the GPU reads rows from the
  registered pack itself.
* :class:`packer.loading.jpeg_pass.JpegDecode`: a kind that decodes (JPEG bytes).
* :class:`Resident`: ``resident=True``; the streamed rows live on the device and each
  batch is gathered there by the consumer (no thread).

The streaming ones are :class:`packer.loading.producer._Pass` subclasses: the producer
thread runs their ``run()``.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import UsageError
from ..pack.kinds import StorageKind
from .batch_transform import _transform_batch
from .producer import _Pass, _Shared
from .stats import AUGMENT, COPY, READ, NoStats


@dataclass(frozen=True)
class PassConfig:
    """What a loader's pass needs, fixed when the pass is made (``iter(loader)``).

    ``src``: the kind's mapped images (raw uint8 rows [N, 3, H, W], or JPEG bytes);
    ``labels`` int64 [N]; ``targets`` float32 [N, K] or None; ``rows`` the streamed pack
    rows (``indices=``) or None for all; ``shape`` (3, h, w) of a yielded image;
    ``crop`` a :class:`packer.loading.crop.JpegCrop` (kinds that decode) or None;
    ``decoding`` who decodes their batches (:class:`packer.loading.jpeg_pass.Decoding`)."""

    kind: StorageKind
    pack: Any
    src: torch.Tensor
    labels: torch.Tensor
    targets: torch.Tensor | None
    rows: torch.Tensor | None
    shape: tuple[int, ...]
    batch_size: int
    prefetch: int
    device: torch.device
    num_threads: int
    transform: Callable[..., Any] | None
    seed: int
    rank: int
    gather: str
    resident: bool
    crop: Any = None
    on_cpu: bool = False
    units: Any = None  # packer.loading.sets.Units for a pack set or mixed packs
    fetch_ahead: int = 0  # shards a remote set prefetches ahead of need
    decoding: Any = None  # kinds that decode, in batches: a jpeg_pass.Decoding
    stats: Any = None  # the loader's stats.Stats or stats.NoStats; None: NoStats
    dense: Any = None  # a dense pack's dense_pass.DenseSetup (images + targets), or None

    @property
    def seeded(self) -> bool:
        """Whether batches draw random parameters from a generator seeded per batch."""
        t = self.transform
        return (
            getattr(t, "accepts_generator", False)
            or getattr(t, "mixes_labels", False)
            or (self.crop is not None and self.crop.random)
            or (self.dense is not None and self.dense.op is not None)
        )


def choose(cfg: PassConfig) -> type:
    """The strategy of a pass: :class:`Resident`, or the :class:`_Pass` subclass whose
    ``run()`` the producer thread runs."""
    if cfg.dense is not None:
        from .dense_producer import DensePass

        return DensePass
    if cfg.resident:
        return Resident
    if cfg.kind.decoded:
        from .jpeg_pass import JpegDecode

        return JpegDecode
    if cfg.device.type != "cuda":
        return CpuGather
    return DeviceGather if cfg.gather == "device" else PinnedGather


class CpuGather(_Pass):
    """The CPU: rows gathered by the threads into a fresh tensor per batch."""

    def run(self) -> None:
        st = self.stats
        st.set_workers(read=self.num_threads)
        for b, idx in self.batches():
            bt = st.batch()
            images = torch.empty((len(idx), *self.shape), dtype=torch.uint8)
            for f in self.submit(idx, images.numpy().reshape(len(idx), -1)):
                bt.add(READ, f.result())
            bt.mark()
            self.read_done(b)
            labels = torch.from_numpy(np.take(self.labels, idx, 0))
            targets = None
            if self.targets is not None:
                targets = torch.from_numpy(np.take(self.targets, idx, 0))
            bt.lap(READ)
            images, labels = _transform_batch(
                self.transform, images, labels, self.gen, self.seeds, b
            )
            bt.lap(AUGMENT)
            st.produced(bt)
            if not self.put((images, labels, targets, None)):
                return


class PinnedGather(_Pass):
    """CUDA: rows gathered into pinned slots, copied and transformed on a side stream."""

    @classmethod
    def read_window(cls, cfg: PassConfig) -> int:
        return cfg.prefetch + 1  # up to ``prefetch`` gathered batches wait to ship

    @classmethod
    def prepare(cls, cfg: PassConfig, shared: _Shared) -> dict[str, Any]:
        ntargets = None if cfg.targets is None else cfg.targets.shape[1]
        slots = shared.take_slots(cfg.prefetch, cfg.batch_size, cfg.shape, ntargets, cfg.device)
        return {"slots": slots}

    def run(self) -> None:
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
        st = self.stats
        st.set_workers(read=self.num_threads)
        pending: collections.deque[tuple[int, np.ndarray, int, list[Future[Any]], Any]] = (
            collections.deque()
        )

        def ship() -> bool:
            b, idx, s, futs, bt = pending.popleft()
            for f in futs:
                bt.add(READ, f.result())
            bt.mark()
            self.read_done(b)
            n = len(idx)
            buf, lab = pinned[s][:n], pinned_lab[s][:n]
            np.take(self.labels, idx, out=lab.numpy(), mode="clip")
            tgt = None
            if pinned_tgt is not None:
                tgt = pinned_tgt[s][:n]
                np.take(self.targets, idx, 0, out=tgt.numpy(), mode="clip")
            bt.lap(READ)
            with torch.cuda.stream(stream):
                images = buf.to(dev, non_blocking=True)
                labels = lab.to(dev, non_blocking=True)
                targets = None if tgt is None else tgt.to(dev, non_blocking=True)
                copied = torch.cuda.Event()
                copied.record(stream)
                ready = copied
                bt.lap(COPY)
                if self.transform is not None:
                    images, labels = _transform_batch(
                        self.transform, images, labels, self.gen, self.seeds, b
                    )
                    ready = torch.cuda.Event()
                    ready.record(stream)
                    bt.lap(AUGMENT)
            freed[s] = copied
            st.produced(bt)
            return self.put((images, labels, targets, ready))

        for j, (b, idx) in enumerate(self.batches()):
            s = j % k
            if len(pending) == k and not ship():
                return
            bt = st.batch()
            if freed[s] is not None:
                freed[s].synchronize()  # the copy out of this slot is done
                bt.lap(COPY)  # the host waited for the copy engine
            n = len(idx)
            out = pinned[s][:n].numpy().reshape(n, -1)
            pending.append((b, idx, s, self.submit(idx, out, pipelined=True), bt))
            while pending and all(f.done() for f in pending[0][3]):
                if not ship():
                    return
        while pending:
            if not ship():
                return
        stream.synchronize()


class DeviceGather(_Pass):
    """CUDA: the GPU reads each batch's rows from the registered pack itself."""

    @classmethod
    def read_window(cls, cfg: PassConfig) -> int:
        return 1 << 40  # the whole pass is mapped for the GPU at once

    @classmethod
    def prepare(cls, cfg: PassConfig, shared: _Shared) -> dict[str, Any]:
        with torch.cuda.device(cfg.device):
            in_place = shared.device_rows(cfg.src, cfg.labels, cfg.targets)
        if in_place is None:
            raise UsageError(
                f"gather='device': the GPU cannot read this pack in place: "
                f"{shared.rows_why}; use gather='cpu' (the default)"
            )
        return {"rows": in_place}

    def run(self) -> None:
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
        st = self.stats
        with torch.cuda.stream(stream):
            order = torch.from_numpy(np.ascontiguousarray(self.order, np.int64)).to(dev)
            for b, idx in self.batches():
                bt = st.batch()
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
                bt.lap(READ)  # the time to queue the copy kernels
                if self.transform is not None:
                    images, labels = _transform_batch(
                        self.transform, images, labels, self.gen, self.seeds, b
                    )
                ready = torch.cuda.Event()
                ready.record(stream)
                bt.lap(AUGMENT)
                st.produced(bt)
                if not self.put((images, labels, targets, ready)):
                    return


class Resident:
    """``resident=True``: the streamed rows on the device (images uint8 [M, 3, H, W],
    labels, targets), each batch gathered there in the consumer's ``__next__`` and
    transformed on its current stream."""

    @classmethod
    def read_window(cls, cfg: PassConfig) -> int:
        return 1 << 40  # every streamed row is copied to the device up front

    def __init__(
        self,
        cfg: PassConfig,
        data: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None],
        pos: torch.Tensor,
        gen: torch.Generator | None,
        epoch: int,
    ) -> None:
        self.images, self.labels, self.targets = data
        self.pos = pos.to(cfg.device, non_blocking=True)
        self.transform, self.bs, self.gen = cfg.transform, cfg.batch_size, gen
        self.seeds = (cfg.seed, epoch, cfg.rank)
        self.stats = cfg.stats if cfg.stats is not None else NoStats()

    def batch(self, b: int) -> tuple[torch.Tensor, ...]:
        st = self.stats
        bt = st.batch()
        bs = self.bs
        idx = self.pos[b * bs : (b + 1) * bs]
        x = self.images.index_select(0, idx)
        labels = self.labels.index_select(0, idx)
        targets = None if self.targets is None else self.targets.index_select(0, idx)
        bt.lap(READ)
        x, y = _transform_batch(self.transform, x, labels, self.gen, self.seeds, b)
        bt.lap(AUGMENT)
        st.produced(bt)
        if targets is None:
            return x, y
        return x, y, targets

    @staticmethod
    def load(loader: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The streamed rows on the device, in ``indices`` order (or the whole pack):
        images uint8 [M, 3, H, W], labels int64 [M], targets float32 [M, K] or None.
        ``loader``: the :class:`PackLoader`, streamed once in order."""
        images = torch.empty((loader._n, *loader._shape), dtype=torch.uint8, device=loader.device)
        labels = torch.empty((loader._n,), dtype=torch.int64, device=loader.device)
        targets = None
        if loader._targets is not None:
            k = loader._targets.shape[1]
            targets = torch.empty((loader._n, k), dtype=torch.float32, device=loader.device)
        step = max(1, (256 << 20) // max(1, math.prod(loader._shape)))
        with type(loader)(
            loader.pack,
            step,
            shuffle=False,
            device=loader.device,
            rank=0,
            world_size=1,
            indices=loader._rows,
            num_threads=loader.num_threads,
            prefetch=2,
            gather=loader._gather,
            stats=False,  # a copy loop, not a model: nothing to report or warn about
        ) as seq:
            start = 0
            for batch in seq:
                x = batch[0]
                images[start : start + len(x)].copy_(x)
                labels[start : start + len(x)].copy_(batch[1])
                if targets is not None:
                    targets[start : start + len(x)].copy_(batch[2])
                start += len(x)
        return images, labels, targets
