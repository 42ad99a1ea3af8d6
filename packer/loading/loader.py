"""Stream a pack in shuffled batches to a device: :class:`PackLoader`.

The hot path, per batch (CUDA), ``gather="cpu"`` (the default)::

    background thread: pick a free pinned buffer -> T threads gather random rows
    from the page-cached memmap into it (np.take, GIL released, memcpy per row;
    several batches in flight so no thread waits at a batch boundary)
    -> in order: async H2D copy on a side stream -> [transform on that stream]
    -> event -> bounded queue

``gather="device"``::

    background thread: the pass's order on the device once -> per batch, a Triton
    kernel reads its rows straight from the page-cached pack (mapped read-only,
    registered with CUDA) into device memory, labels and targets likewise
    -> [transform] on that side stream -> event -> bounded queue

Either way the consumer: queue.get -> current stream waits on the event (the GPU
waits, never the host) -> uint8 images [B, 3, H, W] and int64 labels [B] on device
(and float32 targets [B, K] when the pack has them, gathered by the same rows)

Bytes cross the bus as uint8; normalisation to float happens on the GPU in
:class:`packer.Normalize`. A pinned buffer is refilled only after the copy out
of it has finished (its event). An exception in the background is re-raised
in the consumer's ``__next__``. On the CPU the same pipeline runs without
pinning or streams, giving fresh tensors each batch.

Lifetime: the producer thread holds only a :class:`_Pass` (queue, stop flag,
arrays, buffers), never the iterator or the loader, so dropping an iterator
mid-epoch collects it; a ``weakref.finalize`` on the iterator then signals its
thread to stop, and one on the loader drops its gather threads, which end on
their own. A finalizer never joins or waits (garbage collection can run it in
the middle of an import, holding the lock a thread it would join waits for):
``close()`` and the context manager's exit join, and an exit hook joins what is
left before CUDA tears down. After ``os.fork`` the child builds its own threads
and buffers (the parent's threads do not exist there).
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils.data

from ..errors import UsageError
from ..pack.kinds import kind_of_pack
from ..pack.reader import ImagePack
from .arguments import check_modes, check_transform, crop_args, refuse_combinations
from .dense_pass import DenseConfig, StoredSize, dense_setup, refuse_dense
from .epoch_iterator import PassHost, _EpochIterator
from .epochs import Epochs, streamed
from .mixture import sources
from .order import (
    _DEFAULT_WINDOW,
    _EVEN_SPLITS,
    _MAX_PREFETCH,
    _MAX_RANKS,
    _MAX_REPEATS,
    _MAX_SEED,
    _MAX_THREADS,
    _MAX_WINDOW,
    ORDERS,
    _bool_arg,
    _capped_arg,
    _check_device,
    _dist_defaults,
    _int_arg,
)
from .producer import (
    _Shared,
    populate,
)
from .sampler import PackSampler, _RandomPackSampler, _SequentialPackSampler
from .sets import fetch_ahead, working_set
from .stats import LoaderStats, StatsConfig, stats_for
from .strategies import PassConfig, Resident, choose

log = logging.getLogger(__name__)


def _names_cuda(device: Any) -> bool:
    """Whether ``device`` names a CUDA device (without starting CUDA; False for
    anything :func:`_check_device` will refuse)."""
    try:
        return torch.device(device).type == "cuda"
    except (RuntimeError, TypeError, ValueError):
        return False


class PackLoader:
    """Iterate a pack in batches of ``(images, labels)`` on ``device``, or of
    ``(images, labels, targets)`` when the pack has targets (``pack.targets`` is not None).

    Args:
      pack: an :class:`ImagePack`, :class:`JpegPack` or :class:`packer.PackSet` from
        :func:`packer.load`, or a path to one; or a list of them to stream together
        (shards and packs end to end: global index ``i`` runs over the first, then the
        next; they must share storage, image shape, class map and target columns, else
        UsageError says how they differ). A set streams as one pack: every shard is
        mapped into one range (one gather per batch, as for a single pack), and the
        global order gives exactly the batches of the same images built as one pack.
      order: "global" (default): the epoch's permutation of every image, as below.
        "shards": for sets whose shards are fetched (object storage): the shard order
        is shuffled each epoch, shards are cut into ``canonical_ranks`` parts, each part
        read in windows of ``shard_window`` shards whose images are shuffled together
        (:func:`packer.loading.order.shard_sequence`), and ranks split the sequence as
        for the global order, so every rank gets the same number of batches and, when
        ``world_size`` divides ``canonical_ranks``, reads only its own parts' shards. A
        pure function of (seed, epoch, shard sizes, canonical_ranks, shard_window).
        Memory: a rank holds about ``(shard_window + 1) * canonical_ranks / world_size``
        shards at once, plus the store's prefetch depth; a cache smaller than that
        working set is refused before the first batch, with both numbers.
      shard_window: shards whose images ``order="shards"`` shuffles together (>= 1,
        default 2).
      canonical_ranks: the parts ``order="shards"`` cuts an epoch into (default: this
        run's world_size). Keep it when the rank count changes; a state carries it.
      weights, epoch_size: mixing (with a list of packs): each epoch draws
        ``epoch_size`` images (default: all of them together) in the proportions
        ``weights`` (positive, one per pack, normalized): pack ``j`` gives
        ``round(weights[j] * epoch_size)`` images (largest remainder), whole passes over
        it and then a subset without replacement drawn from (seed, epoch, j); the
        loader then shuffles them as one epoch. ``len(loader)`` follows
        ``epoch_size``. Not with ``indices``, ``resident`` or ``order="shards"``.
      batch_size: images per batch (an int >= 1).
      shuffle, seed: each pass uses the permutation of ``seed + epoch``
        (seed: an int with ``abs(seed) < 2**63``).
      device: where batches land: "cuda", "cuda:1", "cpu" or a torch.device
        of those types (others raise UsageError).
      drop_last: drop the short last batch of each rank's epoch.
      even_split: how an epoch is split into equal parts across ranks, as
        DistributedSampler does: "pad" (default) repeats the head of the
        permutation, "trim" drops the tail (so with fewer images than ranks
        every rank gets none).
      rank, world_size: this process's part; default torch.distributed's when
        initialised, else 0 and 1. Parts are disjoint (up to the padding) and
        of equal length (see :func:`epoch_indices`).
      repeats: repeated augmentation (torchvision's ``RASampler``), an int >= 1
        (default 1: off). Each image the epoch picks is streamed ``repeats``
        times, its copies on different ranks where ``world_size >= repeats``,
        each copy with its own augmentation draw. The epoch keeps its length: M =
        ``ceil(n / world_size)`` rows per rank ("trim": ``n // world_size``), the
        same for every rank, so ``len(loader)`` does not change; so it holds the
        first ``(M * world_size) // repeats`` images of the epoch's permutation
        ``repeats`` times each, the next one ``(M * world_size) % repeats`` times,
        and none of the others (each epoch's permutation picks others). With
        fewer ranks than ``repeats`` an image's copies share a rank, next to each
        other in the order (usually one batch). See :func:`epoch_indices`.
      indices: stream only these pack rows: signed-integer (int64, int32) tensor/array/
        list [M] (repeats allowed; ``[]`` streams nothing) or bool mask [N]. An unsigned
        dtype (a uint8 0/1 mask) is refused with UsageError: pass ``mask.bool()``.
        Shuffled per epoch and split across ranks like the whole pack; the images are
        never copied.
      transform: a callable on each uint8 batch [B, 3, H, W] on ``device``,
        returning the images to yield: a Tensor [B, 3, h, w] with the same B (any
        h, w >= 1), uint8 or floating point, on ``device``; anything else (another
        rank, batch size or channel count) raises UsageError naming the transform.
        Called as ``transform(images, generator=g)`` if it has ``accepts_generator =
        True``, with ``g`` a CPU generator seeded by :func:`batch_seed` (seed,
        epoch, rank, batch index); else ``transform(images)``. Runs in the
        background, on CUDA on the loader's copy stream. A transform with
        ``mixes_labels = True`` (``packer.transforms.MixUp``, ``CutMix``,
        ``RandomChoice`` of them, a ``Compose`` ending in one) is called as
        ``transform(images, labels, generator=g)`` and returns ``(images,
        soft_labels)``; the loader then yields those soft labels (float [B, K] on
        ``device``) in place of the int64 labels. A torchvision transform that
        draws random parameters (anything from ``torchvision.transforms`` or
        ``.v2`` not on the short list of deterministic ones in
        :mod:`packer.augment.per_image`, also inside a torchvision ``Compose``,
        an ``nn.Sequential`` or a ``packer.transforms.Compose``) is refused with
        UsageError: here it would draw once for the whole batch. Use the
        ``packer.transforms`` op of the same name, or wrap it in
        ``packer.transforms.PerImage`` (a loop over images, slow).
      gather: raw packs on CUDA: who copies a batch's rows out of the pack. "cpu"
        (default): ``num_threads`` threads copy them into pinned buffers, then the copy
        engine moves them. "device": the GPU reads them itself from the page cache
        (the pack's files are mapped read-only and registered with CUDA, which locks
        them in RAM; a Triton kernel copies the rows; no CPU copy, no pinned buffers):
        a faster stream, but its copy kernels slow a model beside them (see
        docs/PERFORMANCE.md, section "Figures behind the code", row "device
        gather"), so it is for loading-bound work (small
        models, inference or embedding passes over a pack). Needs whole pack files
        taking at most half the machine's RAM; otherwise the first batch raises
        UsageError saying why. Same batches either way, bit for bit
        (docs/BENCHMARKS.md, "The GPU reads the pack itself").
      num_threads: threads gathering rows, >= 1 (default min(8, cores)).
      prefetch: batches in flight, >= 1 (one pinned buffer each on the "cpu" way).
      resident: copy the streamed rows to ``device`` once and gather there (for
        packs that fit in GPU memory; fastest).
      populate: pre-map the page-cached pack before the first batch (Linux).
      image_size, train: JPEG packs only (``imgpack build --store jpeg``): the side
        (an int, or (h, w) ints, 1 to 16384) of the yielded images, and the default
        crop (a bool): ``train=True`` RandomResizedCrop + horizontal flip, ``False``
        the centre 87.5% of the shorter side (Resize(S/0.875) + CenterCrop(S)).
        Anything else raises UsageError naming the argument. A ``transform`` starting with
        RandomResizedCrop/CenterCrop/Resize((h, w)) replaces the default crop, its
        boxes drawn relative to each image's own size (its stored size, checked
        against the decoded one). A damaged offset, size or JPEG raises
        PackFormatError naming the image.
      decode: JPEG packs: who decodes. "device": in batches on ``device`` through the
        decode interface (:mod:`packer.imaging.decoders`): on CUDA torchcodec and
        torchvision, a batch each at once, where both run (each keeps its own nvjpeg
        decoder: faster than one), else the first of torchcodec, torchvision, nvImageCodec
        that runs here (the measured order: nvjpeg's batched decode fed ResNet-50 best;
        docs/PERFORMANCE.md, section "Figures behind the code", rows "decoder lanes" and
        "decoder order"), then one batched crop;
        on the CPU torchvision's decode on the threads, then one crop of the padded
        batch. A decoder's name ("nvimgcodec", "torchcodec", "torchvision"): that one
        (UsageError saying how to install it if it does not run here). A decoder object
        (``packer.imaging.decoders.get_decoder(...)``): that one,
        for ``device``'s type. A list of names and decoder objects: those, a batch
        each at once (each on a thread and CUDA stream of its own; batches in order). A decoder that decodes regions (nvImageCodec) decodes only
        each image's crop box, then the crops are resized in one batched call; others,
        or where ROI does not work on the installed version, decode whole and crop.
        ``decode_path`` (and the repr) says which ran. "cpu": image by image on the
        loader's ``num_threads`` threads (torchvision's libjpeg decode, then only the box
        resampled by Pillow), then copied to ``device``. "auto" (default): "device" on
        CUDA, "cpu" on the CPU, the faster on each (docs/BENCHMARKS.md, "Who
        decodes"). Boxes and flips are the seed's whichever decodes; the CPU ways
        differ by resampling rounding (±1-2/255), nvjpeg and nvImageCodec's ROI from
        libjpeg by about 1.5/255 on average (chroma upsampling; nvImageCodec decoding
        whole gives libjpeg's pixels); each gives the same pixels from run to run.
      stats: True (default): keep :meth:`stats` (the consumer's waits, each stage's time;
        a few microseconds a batch) and log one warning when the consumer waits more than
        5% of the time; a :class:`packer.loading.stats.StatsConfig` sets the threshold,
        the window and the clock; False: keep none (``stats()`` then raises UsageError).
      dense, dense_transform, targets: packs with detection or segmentation targets
        (found by ``packer.pack.dense.dense_of``; :mod:`packer.loading.dense_pass`) yield
        ``(images, targets)``: ``dense_transform`` (or a dense ``transform``) is a
        :mod:`packer.augment.dense` op run per image on the image and all its targets,
        from a generator seeded per batch; ``targets`` "dicts" (default: one
        torchvision-style dict per image) or "padded" (one dict of padded tensors with
        counts); a semantic pack yields uint8 masks [B, H, W]. ``dense`` a
        :class:`packer.loading.dense_pass.DenseConfig` holds them and the padding
        (batches of different sizes are padded to a multiple of 32). UsageError on a
        pack without targets, for a torchvision op (named), with ``resident``,
        ``gather="device"``, ``image_size`` or a list of packs.

    Yields:
      images: Tensor[B, 3, H, W], uint8 in [0, 255], on ``device`` (or what
        ``transform`` returns).
      labels: Tensor[B], int64, on ``device``: class index, or -1 unlabeled.
        With a label-mixing transform: Tensor[B, K] float32 (what it returns),
        on ``device``, each row the mixed class weights.
      targets: only for a pack with targets (built with ``--targets``):
        Tensor[B, K], float32, on ``device``, any finite values; row i belongs
        to image i (the same pack rows as ``labels``), columns in
        ``pack.target_names`` order (never mixed by a label-mixing transform).
        A pack without targets yields 2-tuples.

    ``B`` is ``batch_size`` except for a short last batch. An epoch can have
    no batches (fewer rows per rank than ``batch_size`` with ``drop_last``, or
    fewer rows than ranks with ``even_split="trim"``, or empty ``indices``):
    the loader then logs a warning when it is built. Dtypes are the
    pack's, never cast (a hand-built pack with other dtypes is refused).

    Epochs: a pass takes the loader's epoch counter when its first batch is
    asked for, and moves the counter on by one. ``set_epoch(e)`` (or
    ``loader.sampler.set_epoch(e)``) sets the counter. So within one process a
    loop that calls ``set_epoch(epoch)`` every epoch and one that never does see
    the same epochs 0, 1, 2, ...; an ``iter()`` that is never read consumes
    nothing. A new process counts from 0 again, so a run resumed from a
    checkpoint replays epoch 0's order unless it calls ``set_epoch(epoch)``
    every epoch (also on one GPU) or restores ``state_dict()``: a shuffling
    loader warns once when a pass starts after an earlier one with none of
    ``set_epoch``, ``state_dict`` or ``load_state_dict`` called.
    Several iterators may run at once (``zip(loader, loader)``, nested loops):
    each is its own pass, with its own pinned buffers.

    ``state_dict()`` / ``load_state_dict()`` resume mid-epoch exactly; a state
    is refused mid-epoch when the loader streams other rows (``indices``) or
    another pack shape. The rank count may change mid-epoch when the global batch
    (``batch_size * world_size``) stays (elastic resume: saved on 4 ranks, resumed on 2,
    no image repeated or skipped). Use as
    a context manager, or call ``close()``, to stop background work at once;
    dropping an iterator or the loader also stops it.
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
        even_split: str = "pad",
        rank: int | None = None,
        world_size: int | None = None,
        repeats: int = 1,
        indices: torch.Tensor | None = None,
        transform: Callable[..., torch.Tensor] | None = None,
        num_threads: int | None = None,
        prefetch: int = 4,
        resident: bool = False,
        populate: bool = False,
        image_size: int | tuple[int, int] | None = None,
        train: bool = True,
        decode: str = "auto",
        gather: str = "cpu",
        order: str = "global",
        shard_window: int = _DEFAULT_WINDOW,
        canonical_ranks: int | None = None,
        weights: Sequence[float] | None = None,
        epoch_size: int | None = None,
        stats: bool | StatsConfig = True,
        dense: DenseConfig | None = None,
        dense_transform: Any = None,
        targets: str | None = None,
    ) -> None:
        self._stats = stats_for(stats)
        pack, units, mix = sources(pack, weights, epoch_size)
        # detection / segmentation packs (packer.loading.dense_pass): (images, targets)
        self._dense, transform = dense_setup(pack, transform, dense_transform, targets, dense)
        batch_size = _int_arg("batch_size", batch_size, 1)
        prefetch = _capped_arg("prefetch", prefetch, 1, _MAX_PREFETCH)
        seed = _int_arg("seed", seed, -_MAX_SEED, _MAX_SEED)
        repeats = _int_arg("repeats", repeats, 1, _MAX_REPEATS)
        if num_threads is not None:
            num_threads = _capped_arg("num_threads", num_threads, 1, _MAX_THREADS)
        check_modes(decode, gather)
        shuffle = _bool_arg("shuffle", shuffle)
        drop_last = _bool_arg("drop_last", drop_last)
        resident = _bool_arg("resident", resident)
        populate = _bool_arg("populate", populate)
        check_transform(transform)
        train = _bool_arg("train", train)
        if not isinstance(order, str) or order not in ORDERS:
            raise UsageError(f"order must be 'global' or 'shards', not {order!r}")
        shard_window = _capped_arg("shard_window", shard_window, 1, _MAX_WINDOW)
        # a pack object names its kind (pack.kind); a hand-made tensordict is raw
        # mixed packs: ``pack`` is their list, and the kind they share is the units'
        self._kind = units.kind if units is not None else kind_of_pack(pack)
        self._units = units
        refuse_combinations(units, mix, gather, resident, indices, order)
        refuse_dense(self._dense, pack, self._kind, resident, gather, image_size, decode)
        self._crop = None
        if self._dense is None:
            self._crop = crop_args(
                self._kind, transform, image_size, train, resident, gather, decode
            )
        if not isinstance(even_split, str) or even_split not in _EVEN_SPLITS:
            raise UsageError(f"even_split must be 'pad' or 'trim', not {even_split!r}")
        self.pack = pack
        self.batch_size = batch_size
        if self._crop is not None and _names_cuda(device):
            # a JPEG loader on CUDA asks for the decoders' queues before anything here
            # starts CUDA (_check_device's current_device() does): in time where the
            # caller has not started it yet
            from ..imaging.cuda_queues import claim

            claim()  # packer.configure_cuda_queues(): 32 queues unless too late or set
        self.device = _check_device(device)
        if gather == "device" and self.device.type != "cuda":
            raise UsageError(
                f"gather='device' has a CUDA GPU read the pack; device is {self.device}"
            )
        self._gather = gather
        rank, world_size = _dist_defaults(rank, world_size)
        if canonical_ranks is not None:
            canonical_ranks = _capped_arg("canonical_ranks", canonical_ranks, 1, _MAX_RANKS)
        self.transform = transform
        self.num_threads = num_threads or min(8, os.cpu_count() or 1)
        self.prefetch = prefetch
        self.resident = resident
        self._populate = populate
        # a dense JPEG pack streams its images at their stored sizes
        sized = StoredSize() if self._dense is not None and self._kind.decoded else self._crop
        rows = streamed(self._kind, sized, order, pack, units, mix, indices)
        self._images, self._labels, self._targets = rows.images, rows.labels, rows.targets
        self._rows, self._n, self._shape = rows.rows, rows.n, rows.shape
        # the order and the epoch counter, one object (issue 45.6): the passes and the
        # sampler ask it, and state_dict/load_state_dict are its
        self.epochs = Epochs(
            rows,
            mix,
            batch_size=batch_size,
            seed=seed,
            shuffle=shuffle,
            drop_last=drop_last,
            even_split=even_split,
            rank=rank,
            world_size=world_size,
            repeats=repeats,
            order=order,
            shard_window=shard_window,
            canonical_ranks=world_size if canonical_ranks is None else canonical_ranks,
        )
        self._live: weakref.WeakSet[_EpochIterator] = weakref.WeakSet()
        self._resident: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None = None
        # JPEG packs: who decodes (decode=): a decoder in batches, else image by image on
        # the threads (made here, on the caller's thread: a decoder imports its library)
        self._decoding = None
        if self._crop is not None:
            from .jpeg_pass import decoding_for, lane_tuning_for

            tuning = lane_tuning_for(pack, batch_size) if self.device.type == "cuda" else None
            self._decoding = decoding_for(decode, self.device, tuning)
            if self._decoding is not None and self.device.type == "cuda":
                from ..imaging.cuda_queues import warn_once

                warn_once()
        self._on_cpu = self._crop is not None and self._decoding is None
        self._new_shared()
        if len(self) == 0:
            self._warn_empty()

    @property
    def decode_path(self) -> str | None:
        """JPEG packs: who decodes and how the latest batch ran: "<decoder>: roi" (only
        the crop boxes decoded), "<decoder>: roi (no fancy upsampling)", "<decoder>:
        full+crop" (whole, then cropped), "<decoder>: not yet run", or "cpu threads:
        decode + crop per image" (``decode="cpu"``). None for raw packs."""
        if self._crop is None:
            return None
        if self._decoding is None:
            return "cpu threads: decode + crop per image"
        return self._decoding.path

    def stats(self, reset: bool = True) -> LoaderStats:
        """What the loader did since the previous call (or since it was made): batches
        and images handed over, the consumer's wait per batch (p50, p99, total, share of
        the wall time), each stage's time per batch (read, decode, crop, augment, copy),
        the slowest stage, and for JPEG packs the decode path of each lane
        (:class:`packer.loading.stats.LoaderStats`). ``reset``: start a new window.

        Host times: on CUDA the consumer's wait is the time ``__next__`` takes on the
        host (its stream then waits on the GPU for the batch's ready event, unmeasured),
        and a stage's time is what it takes the host to queue its GPU work (or to wait
        for it), never the GPU's own time; nothing syncs the device to measure.
        UsageError when made with ``stats=False``."""
        if not self._stats.enabled:
            raise UsageError(
                "this PackLoader keeps no stats (made with stats=False); make it with "
                "stats=True (the default) to call stats()"
            )
        paths = None
        if self._crop is not None:
            paths = (self.decode_path,) if self._decoding is None else tuple(self._decoding.paths)
        return self._stats.snapshot(reset, decode_path=paths)  # type: ignore[union-attr]

    def __repr__(self) -> str:
        where = getattr(self.pack, "path", None)
        head = f"PackLoader({str(where)!r}, " if where is not None else "PackLoader("
        extra = ""
        if self._crop is not None:
            extra = f", image_size={self._crop.size}, decode={self.decode_path!r}"
        return (
            f"{head}batch_size={self.batch_size}, device={str(self.device)!r}, "
            f"shuffle={self.shuffle}, images={self._n}{extra})"
        )

    def _warn_empty(self) -> None:
        """Log that every epoch of this loader has no batches, and why it may."""
        log.warning(
            "PackLoader: every epoch has 0 batches on rank %d (%d row(s) streamed, "
            "world_size %d, even_split=%r, batch_size %d, drop_last=%s); iterating it "
            "yields nothing",
            self.rank,
            self._n,
            self.world_size,
            self.even_split,
            self.batch_size,
            self.drop_last,
        )

    def _new_shared(self) -> None:
        self._shared = _Shared()
        # collected: only signal (a finalizer must never wait: see _producer's lifetime note)
        self._finalizer = weakref.finalize(self, _Shared.release, self._shared)

    def _shared_here(self) -> _Shared:
        """This process's threads and buffers; after a fork the child makes its own."""
        if self._shared.pid != os.getpid():
            self._finalizer.detach()
            self._new_shared()
            self._stats = self._stats.fresh()
            self._live = weakref.WeakSet()
            if self._resident is not None and self._resident[0].device.type != "cpu":
                self._resident = None
        return self._shared

    # ---- size and order: the Epochs object's
    def __len__(self) -> int:
        return len(self.epochs)

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s order for the next pass (keeps a resume point of that epoch)."""
        self.epochs.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        """The epoch the next pass will use."""
        return self.epochs.epoch

    def state_dict(self) -> dict[str, Any]:
        """Where the loader is: the next batch it will yield (:meth:`Epochs.state_dict`).
        Small and plain (ints, strs); any rank's state restores every rank."""
        return self.epochs.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (:meth:`Epochs.load_state_dict`: exact mid-epoch, and
        refused when the order differs; the rank count may change when the global batch
        stays)."""
        self.epochs.load_state_dict(state)

    # the order's arguments, read from the Epochs object (load_state_dict may take a
    # state's canonical_ranks and shard_window)
    seed = property(lambda self: self.epochs.seed, doc="The order's seed.")
    shuffle = property(lambda self: self.epochs.shuffle, doc="Whether epochs shuffle.")
    drop_last = property(lambda self: self.epochs.drop_last, doc="Drop a short last batch.")
    even_split = property(lambda self: self.epochs.even_split, doc="'pad' or 'trim'.")
    repeats = property(lambda self: self.epochs.repeats, doc="Repeated augmentation.")
    rank = property(lambda self: self.epochs.rank, doc="This process's part.")
    world_size = property(lambda self: self.epochs.world_size, doc="The parts an epoch has.")
    order = property(lambda self: self.epochs.order, doc="'global' or 'shards'.")
    shard_window = property(lambda self: self.epochs.shard_window, doc="order='shards'.")
    canonical_ranks = property(lambda self: self.epochs.canonical_ranks, doc="order='shards'.")

    @property
    def dataset(self) -> ImagePack:
        """The pack (the whole pack, also when ``indices`` picks a subset)."""
        return self.pack

    @property
    def sampler(self) -> PackSampler:
        """An object with ``set_epoch(e)`` and ``len()`` driving this loader's order: a
        ``RandomSampler`` to ``isinstance`` when shuffling, else a ``SequentialSampler``."""
        kind = _RandomPackSampler if self.shuffle else _SequentialPackSampler
        return kind(self.epochs, self.dataset)

    @property
    def batch_sampler(self) -> torch.utils.data.BatchSampler:
        """This loader's batches as a DataLoader's ``batch_sampler``: lists of pack rows
        of the next pass, ``len()`` batches. Frameworks read the ``sampler`` inside it
        (Lightning: whether the order is shuffled, and to call ``set_epoch``)."""
        return torch.utils.data.BatchSampler(self.sampler, self.batch_size, self.drop_last)

    def indices(self, epoch: int) -> torch.Tensor:
        """This rank's pack rows for ``epoch``, in yield order (int64 [M]); for a pack
        set or mixed packs, global indices (shards, then packs, end to end)."""
        return self.epochs.indices(epoch)

    def working_set(self, epoch: int | None = None) -> tuple[int, int]:
        """``(bytes, shards)`` of a set's shard data that one pass of ``epoch`` (default:
        the current one) holds at once, as this loader reads (its order, batch size,
        device and read-ahead, and its store's prefetch depth): the least ``cache_limit``
        a set in object storage streams with, per rank of a node. ``(0, 0)`` for a pack.
        """
        if self._units is None:
            return 0, 0
        e = self.epochs.epoch if epoch is None else int(epoch)
        rows = self.epochs.rows_at(e, self.epochs.positions(e))
        cfg = self._pass_config()
        window = choose(cfg).read_window(cfg)
        return working_set(self._units, rows.numpy(), self.batch_size, cfg.fetch_ahead, window)

    # ---- iteration
    def __iter__(self) -> _EpochIterator:
        self._shared_here()
        host = PassHost(self._shared_here, self._resident_data, self._populate_once, self._passes)
        it = _EpochIterator(self.epochs, self._pass_config(), host)
        self._live.add(it)
        return it

    def _passes(self) -> weakref.WeakSet[_EpochIterator]:
        return self._live

    def _pass_config(self) -> PassConfig:
        """What a pass takes from this loader, frozen when the pass is made (``iter``)."""
        return PassConfig(
            kind=self._kind,
            pack=self.pack,
            src=self._images,
            labels=self._labels,
            targets=self._targets,
            rows=self._rows,
            shape=self._shape,
            batch_size=self.batch_size,
            prefetch=self.prefetch,
            device=self.device,
            num_threads=self.num_threads,
            transform=self.transform,
            seed=self.seed,
            rank=self.rank,
            gather=self._gather,
            resident=self.resident,
            crop=self._crop,
            on_cpu=self._on_cpu,
            units=self._units,
            fetch_ahead=fetch_ahead(self._units),
            decoding=self._decoding,
            stats=self._stats,
            dense=self._dense,
        )

    def _resident_data(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The streamed rows on the device, loaded by the first resident pass."""
        if self._resident is None:
            self._resident = Resident.load(self)
        return self._resident

    def _populate_once(self) -> None:
        """``populate=True``: map the pack's pages before the first streamed pass."""
        if self._populate and self._images is None:
            self._populate = False  # a set's shards are mapped as passes reach them
        if self._populate:
            populate(self._images)
            self._populate = False

    def close(self) -> None:
        """Stop background work and release threads and buffers (also done when
        garbage-collected). The loader can be iterated again afterwards."""
        for it in list(self._live):
            it.close()
        self._live = weakref.WeakSet()
        self._finalizer.detach()
        self._shared.close()  # here, not from a finalizer, it may wait for the threads
        self._new_shared()

    def __enter__(self) -> PackLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
