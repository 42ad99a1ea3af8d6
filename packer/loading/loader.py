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
import math
import os
import queue
import warnings
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.utils.data

from ..errors import UsageError
from ..imaging.normalize import IMAGENET_MEAN as IMAGENET_MEAN  # re-exported: old import path
from ..imaging.normalize import IMAGENET_STD as IMAGENET_STD
from ..imaging.normalize import Normalize as Normalize
from ..pack.kinds import kind_of
from ..pack.reader import ImagePack, open_pack
from .order import (
    _EVEN_SPLITS,
    _MAX_EPOCH,
    _MAX_REPEATS,
    _MAX_SEED,
    _STATE_VERSION,
    _bool_arg,
    _check_device,
    _check_dtypes,
    _check_indices,
    _dist_defaults,
    _int_arg,
    _rows_digest,
    _size_arg,
    epoch_indices,
)
from .order import batch_seed as batch_seed  # re-exported: old import path
from .producer import (
    _DONE,
    GATHER_MODES,
    _Failure,
    _Pass,
    _Shared,
    populate,
    release_deferred,
    track,
)
from .strategies import PassConfig, Resident, choose

log = logging.getLogger(__name__)


class PackLoader:
    """Iterate a pack in batches of ``(images, labels)`` on ``device``, or of
    ``(images, labels, targets)`` when the pack has targets (``pack.targets`` is not None).

    Args:
      pack: an :class:`ImagePack` from :func:`packer.load`, or a pack's path.
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
        :mod:`packer.imaging.per_image`, also inside a torchvision ``Compose``,
        an ``nn.Sequential`` or a ``packer.transforms.Compose``) is refused with
        UsageError: here it would draw once for the whole batch. Use the
        ``packer.transforms`` op of the same name, or wrap it in
        ``packer.transforms.PerImage`` (a loop over images, slow).
      gather: raw packs on CUDA: who copies a batch's rows out of the pack. "cpu"
        (default): ``num_threads`` threads copy them into pinned buffers, then the copy
        engine moves them. "device": the GPU reads them itself from the page cache
        (the pack's files are mapped read-only and registered with CUDA, which locks
        them in RAM; a Triton kernel copies the rows; no CPU copy, no pinned buffers):
        1.1-2.5x the streaming rate on an H100, but its copy kernels cost a model
        beside them up to 2.4% (ResNet-18), so it is for loading-bound work (small
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
      decode: JPEG packs: who decodes. "device": in batches on ``device`` (nvjpeg on
        CUDA, then one batched crop; on the CPU torchvision's decode on the threads,
        then one crop of the padded batch). "cpu": image by image on the loader's
        ``num_threads`` threads (torchvision's libjpeg decode, then only the box
        resampled by Pillow), then copied to ``device``. "auto" (default): "device" on
        CUDA, "cpu" on the CPU, the faster on each (docs/BENCHMARKS.md, "Who
        decodes"). Boxes and flips are the seed's whichever decodes; the CPU ways
        differ by resampling rounding (±1-2/255), nvjpeg from libjpeg by about 1/255
        on average (chroma upsampling); each gives the same pixels from run to run.

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
    another pack shape. Use as
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
    ) -> None:
        if isinstance(pack, (str, os.PathLike)):
            pack = open_pack(Path(pack))
        batch_size = _int_arg("batch_size", batch_size, 1)
        prefetch = _int_arg("prefetch", prefetch, 1)
        seed = _int_arg("seed", seed, -_MAX_SEED, _MAX_SEED)
        repeats = _int_arg("repeats", repeats, 1, _MAX_REPEATS)
        if num_threads is not None:
            num_threads = _int_arg("num_threads", num_threads, 1)
        from ..imaging.jpeg import DECODE_MODES, decodes_on_cpu

        if not isinstance(decode, str) or decode not in DECODE_MODES:
            raise UsageError(f"decode must be 'auto', 'device' or 'cpu', not {decode!r}")
        if not isinstance(gather, str) or gather not in GATHER_MODES:
            raise UsageError(f"gather must be 'cpu' or 'device', not {gather!r}")
        shuffle = _bool_arg("shuffle", shuffle)
        drop_last = _bool_arg("drop_last", drop_last)
        resident = _bool_arg("resident", resident)
        populate = _bool_arg("populate", populate)
        if transform is not None and not callable(transform):
            raise UsageError(f"transform must be callable, not {type(transform).__name__}")
        if transform is not None:
            from ..imaging.per_image import refuse_batch_wide

            refuse_batch_wide(transform)
        train = _bool_arg("train", train)
        self._crop = None
        # a pack object names its kind (JpegPack.storage); ImagePack, also hand-made, is raw
        self._kind = kind_of(getattr(pack, "storage", "raw"))
        if self._kind.decoded:
            from ..imaging.jpeg import crop_for

            if resident:
                raise UsageError("resident=True is for raw packs; a JPEG pack is decoded")
            if image_size is not None:
                image_size = _size_arg("image_size", image_size)
            try:
                self._crop = crop_for(transform, image_size, train)
            except ValueError as e:
                raise UsageError(str(e)) from None
            if gather != "cpu":
                raise UsageError("gather= is for raw packs; a JPEG pack's images are decoded")
        elif decode != "auto":
            raise UsageError("decode= is for JPEG packs; a raw pack's rows are not decoded")
        elif image_size is not None:
            raise UsageError(
                "image_size is for JPEG packs; a raw pack's images have the size it was "
                "built with (crop or resize them with transform=)"
            )
        if not isinstance(even_split, str) or even_split not in _EVEN_SPLITS:
            raise UsageError(f"even_split must be 'pad' or 'trim', not {even_split!r}")
        self.pack = pack
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.even_split = even_split
        self.repeats = repeats
        self.device = _check_device(device)
        if gather == "device" and self.device.type != "cuda":
            raise UsageError(
                f"gather='device' has a CUDA GPU read the pack; device is {self.device}"
            )
        self._gather = gather
        self.rank, self.world_size = _dist_defaults(rank, world_size)
        self.transform = transform
        self.num_threads = num_threads or min(8, os.cpu_count() or 1)
        self.prefetch = prefetch
        self.resident = resident
        self._populate = populate
        self._images = self._kind.source_tensor(pack)
        self._labels = pack.labels
        self._targets: torch.Tensor | None = getattr(pack, "targets", None)
        _check_dtypes(
            None if self._kind.decoded else self._images, self._labels, self._targets, len(pack)
        )
        self._rows = None if indices is None else _check_indices(indices, len(pack))
        self._n = len(pack) if self._rows is None else len(self._rows)
        self._shape = (3, *self._crop.size) if self._kind.decoded else tuple(pack.images.shape[1:])
        self._digest = _rows_digest(self._rows, len(pack), self._shape)
        self._epoch = 0
        self._resume: tuple[int, int] | None = None  # (epoch, batches already yielded)
        self._serial = 0  # passes started; the latest one is what state_dict() describes
        self._progress: tuple[int, int, bool] | None = None  # (epoch, yielded, exhausted)
        # Whether the caller names the epoch (set_epoch since the latest pass started) or
        # carries it in a saved state; a counted epoch restarts at 0 in a resumed process.
        self._epoch_named = False
        self._epoch_in_state = False
        self._warned_counted = False
        self._live: weakref.WeakSet[_EpochIterator] = weakref.WeakSet()
        self._resident: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None = None
        # JPEG packs: decoded image by image on the threads (decode=)
        self._on_cpu = self._crop is not None and decodes_on_cpu(decode, self.device)
        self._new_shared()
        if len(self) == 0:
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
            self._live = weakref.WeakSet()
            if self._resident is not None and self._resident[0].device.type != "cpu":
                self._resident = None
        return self._shared

    # ---- size and order
    def _per_rank(self) -> int:
        if self.world_size == 1:
            return self._n
        if self.even_split == "trim":
            return self._n // self.world_size
        return math.ceil(self._n / self.world_size)

    def __len__(self) -> int:
        m = self._per_rank()
        return m // self.batch_size if self.drop_last else math.ceil(m / self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s order for the next pass (keeps a resume point of that epoch)."""
        epoch = _int_arg("epoch", epoch, 0, _MAX_EPOCH)
        if self._resume is not None and self._resume[0] != epoch:
            self._resume = None
        self._epoch = epoch
        self._epoch_named = True

    @property
    def epoch(self) -> int:
        """The epoch the next pass will use."""
        return self._resume[0] if self._resume is not None else self._epoch

    @property
    def dataset(self) -> ImagePack:
        """The pack (the whole pack, also when ``indices`` picks a subset)."""
        return self.pack

    @property
    def sampler(self) -> PackSampler:
        """An object with ``set_epoch(e)`` and ``len()`` driving this loader's order: a
        ``RandomSampler`` to ``isinstance`` when shuffling, else a ``SequentialSampler``."""
        return _RandomPackSampler(self) if self.shuffle else _SequentialPackSampler(self)

    @property
    def batch_sampler(self) -> torch.utils.data.BatchSampler:
        """This loader's batches as a DataLoader's ``batch_sampler``: lists of pack rows
        of the next pass, ``len()`` batches. Frameworks read the ``sampler`` inside it
        (Lightning: whether the order is shuffled, and to call ``set_epoch``)."""
        return torch.utils.data.BatchSampler(self.sampler, self.batch_size, self.drop_last)

    def _positions(self, epoch: int) -> torch.Tensor:
        """Positions into the streamed rows for ``epoch``, in yield order, int64 [M]."""
        order = epoch_indices(
            self._n,
            epoch=epoch,
            seed=self.seed,
            shuffle=self.shuffle,
            rank=self.rank,
            world_size=self.world_size,
            even_split=self.even_split,
            repeats=self.repeats,
        )
        if self.drop_last:
            order = order[: len(self) * self.batch_size]
        return order

    def indices(self, epoch: int) -> torch.Tensor:
        """This rank's pack rows for ``epoch``, in yield order (int64 [M])."""
        pos = self._positions(_int_arg("epoch", epoch, 0, _MAX_EPOCH))
        return pos if self._rows is None else self._rows[pos]

    # ---- resumable state
    def state_dict(self) -> dict[str, Any]:
        """Where the loader is: the next batch it will yield. Small and plain (ints, strs).

        ``epoch`` and ``batches`` (already yielded in that epoch) describe the
        latest pass; the rest identifies the order, so a mismatched restore is
        refused. Ranks of one run hold equal positions, so any rank's state
        restores every rank.
        """
        self._epoch_in_state = True
        if self._resume is not None:
            epoch, batches = self._resume
        elif self._progress is not None and not self._progress[2]:
            epoch, batches = self._progress[0], self._progress[1]
        else:
            epoch, batches = self._epoch, 0
        return {
            "version": _STATE_VERSION,
            "epoch": epoch,
            "batches": batches,
            "seed": self.seed,
            "shuffle": bool(self.shuffle),
            "batch_size": self.batch_size,
            "drop_last": bool(self.drop_last),
            "even_split": self.even_split,
            "repeats": self.repeats,
            "samples": self._n,
            "rank": self.rank,
            "world_size": self.world_size,
            "rows": self._digest,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next pass yields exactly the batches that
        were left of that epoch, then epochs go on as in the saved run.

        Mid-epoch, the order must be the same (seed, shuffle, batch size,
        drop_last, even_split, repeats, number of samples, world size, and the rows
        streamed: the ``rows`` digest of the pack's count, image shape and
        ``indices``); a mismatch is always refused. At an epoch boundary
        (``batches == 0``) only the epoch is taken, so the next epoch may use
        other rows or ranks. States saved before ``rows`` existed have no
        digest and are checked without it; states saved before ``repeats`` existed
        were saved with 1. Fields of the wrong type (a bool,
        float or string for an int) are refused, never cast.
        """
        if not isinstance(state, dict):
            raise UsageError(
                "not a PackLoader state: pass the dict PackLoader.state_dict() returned, "
                f"not {type(state).__name__}"
            )
        try:
            version, epoch, batches = state["version"], state["epoch"], state["batches"]
        except KeyError:
            raise UsageError(
                "not a PackLoader state: pass what PackLoader.state_dict() returned"
            ) from None
        if (
            isinstance(version, (bool, np.bool_))
            or not isinstance(version, (int, np.integer))
            or version != _STATE_VERSION
        ):
            raise UsageError(
                f"state['version'] {version!r} is not {_STATE_VERSION} (an int): pass what "
                "PackLoader.state_dict() returned"
            )
        epoch = _int_arg("state['epoch']", epoch, 0, _MAX_EPOCH)
        batches = _int_arg("state['batches']", batches, 0)
        _check_state_fields(state)
        if batches:
            mine = self.state_dict()
            if "rows" in state and state["rows"] != mine["rows"]:
                raise UsageError(
                    "cannot resume mid-epoch: the state was saved by a loader streaming other "
                    f"rows (rows digest {state['rows']!r}, this loader's {mine['rows']!r}: "
                    "another pack or other indices); use the same pack and indices, or "
                    "resume from an epoch boundary"
                )
            for key in ("world_size", "samples", "batch_size", "seed", "shuffle"):
                if state.get(key) != mine[key]:
                    raise UsageError(
                        f"cannot resume mid-epoch with {key}={mine[key]!r}: the state was saved "
                        f"with {key}={state.get(key)!r}; use the same {key}, or resume from an "
                        "epoch boundary"
                    )
            for key in ("drop_last", "even_split"):
                if state.get(key, mine[key]) != mine[key]:
                    raise UsageError(
                        f"cannot resume mid-epoch with {key}={mine[key]!r}: the state was saved "
                        f"with {key}={state.get(key)!r}"
                    )
            saved = state.get("repeats", 1)
            if isinstance(saved, bool) or saved != self.repeats:
                raise UsageError(
                    f"cannot resume mid-epoch with repeats={self.repeats}: the state was saved "
                    f"with repeats={saved!r}, and repeats changes which images the epoch "
                    f"holds; use repeats={saved!r}, or resume from an epoch boundary"
                )
            if not 0 <= batches <= len(self):
                raise UsageError(f"state has {batches} batches done of an epoch of {len(self)}")
        self._resume = (epoch, batches)
        self._epoch = epoch
        self._progress = None
        self._epoch_in_state = True

    # ---- iteration
    def __iter__(self) -> _EpochIterator:
        self._shared_here()
        it = _EpochIterator(self, self._pass_config())
        self._live.add(it)
        return it

    def _pass_config(self) -> PassConfig:
        """What a pass takes from this loader, frozen when the pass is made."""
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
        )

    def _resident_data(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The streamed rows on the device, loaded by the first resident pass."""
        if self._resident is None:
            self._resident = self._load_resident()
        return self._resident

    def _populate_once(self) -> None:
        """``populate=True``: map the pack's pages before the first streamed pass."""
        if self._populate:
            populate(self._images)
            self._populate = False

    def _start_pass(self, it: _EpochIterator) -> tuple[int, int, int]:
        """Give the next pass its epoch and first batch; move the counter on."""
        if self._serial and self.shuffle and not self._warned_counted:
            self._warn_counted(it)
        self._epoch_named = False
        if self._resume is not None:
            epoch, start = self._resume
            self._resume = None
        else:
            epoch, start = self._epoch, 0
        self._epoch = epoch + 1
        self._serial += 1
        self._progress = (epoch, start, False)
        return epoch, start, self._serial

    def _warn_counted(self, it: _EpochIterator) -> None:
        """Warn (once) that this pass's epoch comes from the pass counter alone, which a
        resumed process starts at 0 again. Passes running side by side (zip(loader,
        loader)) take consecutive epochs by design: no warning then."""
        if self._epoch_named or self._epoch_in_state:
            return
        if any(o is not it and o.started and not o.closed for o in self._live):
            return
        self._warned_counted = True
        epoch = self.epoch
        warnings.warn(
            f"PackLoader: a pass started without set_epoch() since the last one, so it takes "
            f"epoch {epoch} from the loader's own count of passes. A new process counts from "
            f"0 again: a run resumed from a checkpoint then replays epoch 0's order as epoch "
            f"{epoch}. Call loader.set_epoch(epoch) at the start of every epoch (also on one "
            "GPU, not only when distributed), or save and restore loader.state_dict().",
            UserWarning,
            stacklevel=5,  # the caller's loop: above __next__ <- _start <- _start_pass <- here
        )

    def _note(self, serial: int, epoch: int, yielded: int, exhausted: bool) -> None:
        if serial == self._serial:
            self._progress = (epoch, yielded, exhausted)

    def _load_resident(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The streamed rows on the device, in ``indices`` order (or the whole pack):
        images uint8 [M, 3, H, W], labels int64 [M], targets float32 [M, K] or None."""
        images = torch.empty((self._n, *self._shape), dtype=torch.uint8, device=self.device)
        labels = torch.empty((self._n,), dtype=torch.int64, device=self.device)
        targets = None
        if self._targets is not None:
            k = self._targets.shape[1]
            targets = torch.empty((self._n, k), dtype=torch.float32, device=self.device)
        step = max(1, (256 << 20) // max(1, math.prod(self._shape)))
        with PackLoader(
            self.pack,
            step,
            shuffle=False,
            device=self.device,
            rank=0,
            world_size=1,
            indices=self._rows,
            num_threads=self.num_threads,
            prefetch=2,
            gather=self._gather,
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


def _check_state_fields(state: dict[str, Any]) -> None:
    """The fields of a loader state besides version, epoch and batches, each of the type
    and range ``state_dict()`` gives, when present (older states lack some): UsageError
    naming the field, never a cast (``2.0`` is not a batch size, nor ``"0.5"`` a seed)."""
    ints = {
        "seed": (-_MAX_SEED, _MAX_SEED),
        "batch_size": (1, None),
        "samples": (0, None),
        "world_size": (1, None),
    }
    for key, (lo, hi) in ints.items():
        if key in state:
            _int_arg(f"state[{key!r}]", state[key], lo, hi)
    if "rank" in state:
        world = state.get("world_size")
        _int_arg("state['rank']", state["rank"], 0, world)
    for key in ("shuffle", "drop_last"):
        if key in state:
            _bool_arg(f"state[{key!r}]", state[key])
    if "even_split" in state and state["even_split"] not in _EVEN_SPLITS:
        raise UsageError(
            f"state['even_split'] must be 'pad' or 'trim', not {state['even_split']!r}"
        )
    if "rows" in state and not isinstance(state["rows"], str):
        raise UsageError(
            f"state['rows'] must be the digest string state_dict() gives, not "
            f"{type(state['rows']).__name__}"
        )


class PackSampler(torch.utils.data.Sampler[int]):
    """A :class:`PackLoader`'s order as a sampler: ``set_epoch(e)`` sets the loader's
    epoch, ``len()`` is this rank's samples per epoch, iterating yields its pack
    rows for the loader's next epoch (usable with a DataLoader over PackDataset)."""

    def __init__(self, loader: PackLoader) -> None:
        self.loader = loader
        self.data_source = loader.dataset  # the name torch's samplers give what they index

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def __len__(self) -> int:
        return self.loader._per_rank()

    def __iter__(self) -> Iterator[int]:
        ld = self.loader
        pos = epoch_indices(
            ld._n,
            epoch=ld.epoch,
            seed=ld.seed,
            shuffle=ld.shuffle,
            rank=ld.rank,
            world_size=ld.world_size,
            even_split=ld.even_split,
            repeats=ld.repeats,
        )
        rows = pos if ld._rows is None else ld._rows[pos]
        return iter(rows.tolist())


class _RandomPackSampler(PackSampler, torch.utils.data.RandomSampler):
    """A shuffling loader's order. A ``RandomSampler`` because ``isinstance`` is how
    Lightning (``_is_dataloader_shuffled``) and others ask whether an order is shuffled;
    it is one: a new permutation each epoch (of ``seed + epoch``), without replacement."""

    replacement = False

    @property
    def num_samples(self) -> int:
        return len(self)


class _SequentialPackSampler(PackSampler, torch.utils.data.SequentialSampler):
    """A loader's order without shuffling (this rank's part of the rows, in order)."""


class _EpochIterator:
    """One pass. It takes its epoch at the first ``__next__``; a background
    :class:`_Pass` (its strategy: :func:`packer.loading.strategies.choose`) fills a
    bounded queue, or, resident, batches are gathered on the device here. It reads
    its :class:`PassConfig`; of the loader it asks only the epoch (``_start_pass``,
    ``_positions``), its threads (``_shared_here``) and resident rows, and reports
    progress (``_note``)."""

    def __init__(self, loader: PackLoader, cfg: PassConfig) -> None:
        self.loader = loader
        self.cfg = cfg
        self.nbatches = len(loader)
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

    def __iter__(self) -> _EpochIterator:
        return self

    def __len__(self) -> int:
        return self.nbatches

    def _start(self) -> None:
        ld, cfg = self.loader, self.cfg
        self.started = True
        self.epoch, self.next_batch, self.serial = ld._start_pass(self)
        pos = ld._positions(self.epoch)
        if cfg.seeded:
            self._gen = torch.Generator()
        strategy = choose(cfg)
        if strategy is Resident:
            self._resident = Resident(cfg, ld._resident_data(), pos, self._gen, self.epoch)
            return
        ld._populate_once()
        if self.next_batch >= self.nbatches:
            return  # nothing left (an empty epoch, or resumed at its end): no thread
        rows = pos if cfg.rows is None else cfg.rows[pos]
        shared = ld._shared_here()
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
        self.loader._note(self.serial, self.epoch, self.next_batch, False)
        return out

    def _finish(self) -> Any:
        self.loader._note(self.serial, self.epoch, self.next_batch, True)
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
