"""The order of a :class:`packer.loading.loader.PackLoader`'s passes and where they are:
one :class:`Epochs` object the loader holds (issue 45.6), composed, not inherited.

:func:`streamed` fixes what a loader streams (the arrays, the rows ``indices=`` picks, a
yielded image's shape, the digests a state carries). :class:`Epochs` holds the order's
arguments and the epoch counter: this rank's positions into the streamed rows for an
epoch (:meth:`Epochs.positions`, ``order="shards"``'s sequence), the pack rows at them
(:meth:`Epochs.rows_at`), ``set_epoch``, what a pass asks when it starts
(:meth:`Epochs.start_pass`) and as it yields (:meth:`Epochs.note`), and the resumable
state (:meth:`Epochs.state_dict`, :meth:`Epochs.load_state_dict`: exact mid-epoch,
refused when the order differs). The loader's pass (:mod:`.epoch_iterator`) and sampler
(:mod:`.sampler`) take this object, never the loader.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import UsageError
from .arguments import check_distinct
from .mixture import image_shape
from .order import (
    _EVEN_SPLITS,
    _MAX_EPOCH,
    _MAX_RANKS,
    _MAX_SEED,
    _MAX_WINDOW,
    _STATE_VERSION,
    _bool_arg,
    _check_dtypes,
    _check_indices,
    _cut_digest,
    _int_arg,
    _rows_digest,
    epoch_indices,
    shard_sequence,
)


@dataclass(frozen=True)
class Streamed:
    """What a loader streams: ``images`` (the kind's mapped source; None for a set or
    mixed packs, read unit by unit), ``labels`` int64 [N], ``targets`` float32 [N, K] or
    None, ``rows`` (``indices`` checked, or None for all), ``n`` rows an epoch streams
    (or the mixture's ``size``), a yielded image's ``shape``, the ``digest`` and ``cut``
    a state carries, and the ``counts`` of rows per unit (one for a pack)."""

    images: torch.Tensor | None
    labels: torch.Tensor
    targets: torch.Tensor | None
    rows: torch.Tensor | None
    n: int
    shape: tuple[int, ...] | None
    digest: str
    cut: str
    counts: list[int]


def streamed(
    kind: Any, crop: Any, order: str, pack: Any, units: Any, mix: Any, indices: Any
) -> Streamed:
    """The :class:`Streamed` of ``pack`` or ``units`` (``mix``: mixed packs), checked:
    dtypes, ``indices`` (distinct with ``order="shards"``)."""
    if units is None:
        images = kind.source_tensor(pack)
        labels = pack.labels
        targets: torch.Tensor | None = getattr(pack, "targets", None)
        total = len(pack)
        raw_shape = None if kind.decoded else tuple(pack.images.shape[1:])
    else:
        images = None
        labels, targets = units.labels, units.targets
        total = len(units)
        raw_shape = None if kind.decoded else image_shape(units.sources[0])
    _check_dtypes(None if kind.decoded else images, labels, targets, total)
    rows = None if indices is None else _check_indices(indices, total)
    check_distinct(rows, order)
    n = (mix.size if mix is not None else total) if rows is None else len(rows)
    shape = (3, *crop.size) if kind.decoded else raw_shape
    digest = _rows_digest(rows, total, shape, "" if mix is None else mix.key)
    # where the shards end: what order="shards" orders by (a state carries it)
    counts = [total] if units is None else [int(c) for c in units.counts]
    return Streamed(images, labels, targets, rows, n, shape, digest, _cut_digest(counts), counts)


class Epochs:
    """A loader's order and its epoch counter (see the module's docstring). The order
    is a pure function of the arguments, the streamed rows and the epoch; the counter
    says which epoch the next pass takes and where a resumed one starts."""

    def __init__(
        self,
        rows: Streamed,
        mix: Any,
        *,
        batch_size: int,
        seed: int,
        shuffle: bool,
        drop_last: bool,
        even_split: str,
        rank: int,
        world_size: int,
        repeats: int,
        order: str,
        shard_window: int,
        canonical_ranks: int,
    ) -> None:
        self.streamed = rows
        self.mix = mix
        self.n = rows.n
        self.digest, self.cut = rows.digest, rows.cut
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.even_split = even_split
        self.rank, self.world_size = rank, world_size
        self.repeats = repeats
        self.order = order
        self.shard_window = shard_window
        self.canonical_ranks = canonical_ranks
        self._epoch = 0
        self._resume: tuple[int, int] | None = None  # (epoch, batches already yielded)
        self._serial = 0  # passes started; the latest one is what state_dict() describes
        self._progress: tuple[int, int, bool] | None = None  # (epoch, yielded, exhausted)
        # Whether the caller names the epoch (set_epoch since the latest pass started) or
        # carries it in a saved state; a counted epoch restarts at 0 in a resumed process.
        self._epoch_named = False
        self._epoch_in_state = False
        self._warned_counted = False

    # ---- size and order
    def per_rank(self) -> int:
        """This rank's rows per epoch, before ``drop_last`` (the split of ``epoch_indices``)."""
        if self.world_size == 1:
            return self.n
        if self.even_split == "trim":
            return self.n // self.world_size
        return math.ceil(self.n / self.world_size)

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        m = self.per_rank()
        return m // self.batch_size if self.drop_last else math.ceil(m / self.batch_size)

    def positions(self, epoch: int, trim: bool = True) -> torch.Tensor:
        """Positions into the streamed rows for ``epoch``, in yield order, int64 [M];
        ``trim`` False: before ``drop_last`` (a BatchSampler applies it)."""
        order = epoch_indices(
            self.n,
            epoch=epoch,
            seed=self.seed,
            shuffle=self.shuffle and self.order == "global",
            rank=self.rank,
            world_size=self.world_size,
            even_split=self.even_split,
            repeats=self.repeats,
        )
        if self.order == "shards" and len(order):
            order = self._shard_positions(epoch)[order]
        if trim and self.drop_last:
            order = order[: len(self) * self.batch_size]
        return order

    def _shard_positions(self, epoch: int) -> torch.Tensor:
        """``order="shards"``: the epoch's sequence (:func:`shard_sequence`) as positions
        into the streamed rows (a subset given by ``indices`` keeps its images' places)."""
        seq = shard_sequence(
            self.streamed.counts,
            seed=self.seed,
            epoch=epoch,
            shuffle=self.shuffle,
            parts=self.canonical_ranks,
            window=self.shard_window,
        )
        rows = self.streamed.rows
        if rows is None:
            return seq
        place = torch.full((len(self.streamed.labels),), -1, dtype=torch.int64)
        place[rows] = torch.arange(len(rows))
        pos = place[seq]
        return pos[pos >= 0]

    def rows_at(self, epoch: int, pos: torch.Tensor) -> torch.Tensor:
        """The pack (or set) rows at positions ``pos`` of ``epoch``'s streamed rows."""
        if self.mix is not None:
            return self.mix.rows(epoch, self.seed)[pos]
        rows = self.streamed.rows
        return pos if rows is None else rows[pos]

    def indices(self, epoch: int) -> torch.Tensor:
        """This rank's pack rows for ``epoch``, in yield order (int64 [M])."""
        epoch = _int_arg("epoch", epoch, 0, _MAX_EPOCH)
        return self.rows_at(epoch, self.positions(epoch))

    # ---- the counter
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
            "samples": self.n,
            "rank": self.rank,
            "world_size": self.world_size,
            "rows": self.digest,
            "cut": self.cut,
            "order": self.order,
            "canonical_ranks": self.canonical_ranks,
            "shard_window": self.shard_window,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next pass yields exactly the batches that
        were left of that epoch, then epochs go on as in the saved run.

        Mid-epoch, the order must be the same (seed, shuffle, order, drop_last,
        even_split, repeats, number of samples, and the rows streamed: the ``rows``
        digest of the pack's count, image shape and ``indices``; with ``order="shards"``
        also the ``cut`` digest of where the shards end) and so must the global
        batch (``batch_size * world_size``); a mismatch is always refused. The rank
        count may change (elastic resume): a state saved on 4 ranks of batch 64 resumes
        on 2 ranks of batch 128, and the epoch goes on from the same global batch, so no
        image is repeated or skipped (the head padding of the epoch's last global batch
        follows the new rank count; augmentations are drawn per rank, so they differ).
        ``order="shards"`` takes the state's ``canonical_ranks`` and ``shard_window``,
        which define the epoch's order. At an epoch boundary
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
            saved_order = state.get("order", "global")
            if saved_order != mine["order"]:
                raise UsageError(
                    f"cannot resume mid-epoch with order={mine['order']!r}: the state was saved "
                    f"with order={saved_order!r}; use the same order, or resume from an epoch "
                    "boundary"
                )
            if saved_order == "shards" and "cut" in state and state["cut"] != mine["cut"]:
                raise UsageError(
                    "cannot resume mid-epoch with order='shards': the state was saved over "
                    f"another shard cut (cut digest {state['cut']!r}, this loader's "
                    f"{mine['cut']!r}: the same images in other shards, such as another "
                    "shard size), and the shards' sizes define the epoch's order; use the "
                    "set the state was saved over, or resume from an epoch boundary"
                )
            global_batch = (state.get("batch_size"), state.get("world_size"))
            if global_batch != (self.batch_size, self.world_size):
                # elastic: another rank count with the same global batch continues the same
                # sequence of global batches (epoch_indices), so nothing repeats or is skipped
                got = _global_batch(state)
                if got != self.batch_size * self.world_size:
                    raise UsageError(
                        f"cannot resume mid-epoch with batch_size={self.batch_size} on "
                        f"{self.world_size} rank(s) (global batch "
                        f"{self.batch_size * self.world_size}): the state was saved with "
                        f"batch_size={state.get('batch_size')!r} on {state.get('world_size')!r} "
                        f"rank(s) (global batch {got}); keep the global batch "
                        "(batch_size x world_size), or resume from an epoch boundary"
                    )
            for key in ("samples", "seed", "shuffle"):
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
            if saved_order == "shards":
                # the saved run's canonical rank count and window define this epoch's order
                # (taken only once the state is accepted: a refused one changes nothing)
                parts = _int_arg(
                    "state['canonical_ranks']", state.get("canonical_ranks"), 1, _MAX_RANKS
                )
                window = _int_arg(
                    "state['shard_window']", state.get("shard_window"), 1, _MAX_WINDOW
                )
            if not 0 <= batches <= len(self):
                raise UsageError(f"state has {batches} batches done of an epoch of {len(self)}")
            if saved_order == "shards":
                self.canonical_ranks, self.shard_window = parts, window
        self._resume = (epoch, batches)
        self._epoch = epoch
        self._progress = None
        self._epoch_in_state = True

    def start_pass(self, it: Any, live: Iterable[Any]) -> tuple[int, int, int]:
        """Give the next pass ``it`` its epoch, first batch and serial; move the counter
        on. ``live``: the passes of the loader (side by side passes take consecutive
        epochs by design: no warning then)."""
        if self._serial and self.shuffle and not self._warned_counted:
            self._warn_counted(it, live)
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

    def _warn_counted(self, it: Any, live: Iterable[Any]) -> None:
        """Warn (once) that this pass's epoch comes from the pass counter alone, which a
        resumed process starts at 0 again. Passes running side by side (zip(loader,
        loader)) take consecutive epochs by design: no warning then."""
        if self._epoch_named or self._epoch_in_state:
            return
        if any(o is not it and o.started and not o.closed for o in live):
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
            stacklevel=5,  # the caller's loop: above __next__ <- _start <- start_pass <- here
        )

    def note(self, serial: int, epoch: int, yielded: int, exhausted: bool) -> None:
        """Pass ``serial`` of ``epoch`` has yielded ``yielded`` batches (``exhausted``: all
        of them); only the latest pass is what :meth:`state_dict` describes."""
        if serial == self._serial:
            self._progress = (epoch, yielded, exhausted)


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
    for key in ("rows", "cut"):
        if key in state and not isinstance(state[key], str):
            raise UsageError(
                f"state[{key!r}] must be the digest string state_dict() gives, not "
                f"{type(state[key]).__name__}"
            )


def _global_batch(state: dict[str, Any]) -> int | None:
    b, w = state.get("batch_size"), state.get("world_size")
    if isinstance(b, int) and isinstance(w, int):
        return b * w
    return None
