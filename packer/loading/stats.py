"""What a :class:`packer.loading.loader.PackLoader` spends its time on, and whether
the consumer waits for it: :class:`Stats` records, :class:`LoaderStats` reports.

Per batch the consumer's ``__next__`` records its wait (from being asked for the batch
to handing it over) and the interval since the previous hand-over of its pass (the
first batch of a pass: its wait); the wall time of a window is the sum of those
intervals, so the time between passes (validation, say) is not in it, and the wait
share is ``wait / wall``. The producer records each batch's stage times (read, decode,
crop, augment, copy). All are host times read from one clock: on CUDA the work a stage
queues on a stream counts for the time it takes to queue (or the time the host waits
for it), never for the GPU's own time, and no stage syncs the device to measure it.

Cost: a clock read at each stage's end and one lock per batch on each side (a few
microseconds a batch); ``PackLoader(stats=False)`` records nothing.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..errors import UsageError

log = logging.getLogger(__name__)

STAGES = ("read", "decode", "crop", "augment", "copy")
READ, DECODE, CROP, AUGMENT, COPY = range(len(STAGES))


@dataclass(frozen=True)
class StatsConfig:
    """How a loader keeps its stats (``PackLoader(stats=StatsConfig(...))``).

    ``clock``: seconds, monotonic (tests pass a fake one). ``warn_share``: log one
    warning (per loader) when the consumer waited more than this share of the wall time
    over ``warn_window`` batches (the first batch of each pass, which waits for the
    pipeline to fill, left out); None never warns. ``sample``: consumer waits kept for
    the percentiles (beyond it, a uniform sample of the window's waits)."""

    clock: Callable[[], float] = time.perf_counter
    warn_share: float | None = 0.05
    warn_window: int = 50
    sample: int = 4096

    def validate(self) -> None:
        if not callable(self.clock):
            raise UsageError(f"StatsConfig.clock must be callable, not {self.clock!r}")
        w = self.warn_share
        if w is not None and (
            isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 <= w <= 1
        ):
            raise UsageError(f"StatsConfig.warn_share must be in [0, 1] or None, not {w!r}")
        for name in ("warn_window", "sample"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UsageError(f"StatsConfig.{name} must be an int >= 1, not {v!r}")


@dataclass(frozen=True)
class LoaderStats:
    """A loader's stats over a window: since the previous ``stats()`` call (or since the
    loader was made), over every pass in it. Times in seconds, host times.

    ``batches``, ``images``: handed to the consumer. ``wall_s``: the sum of the batches'
    intervals (each from the previous hand-over of its pass, or the pass's first
    request, to its own hand-over). ``wait_s``, ``wait_p50_s``, ``wait_p99_s``: the
    consumer's waits in ``__next__``, total and percentiles (linear interpolation);
    ``wait_share``: ``wait_s / wall_s`` (0 with no batch). ``produced``: batches the
    producer finished (up to the prefetch depth ahead of ``batches``). ``stage_s``: each
    stage's total time (summed over the threads that share it: the gather threads' reads,
    the CPU decode threads); ``stage_batch_s``: per produced batch; ``stage_workers``:
    threads running the stage at once; ``slowest_stage``: the stage with the most time
    per batch per worker (None before any). ``decode_path``: JPEG packs, per decode lane,
    what its latest batch ran (as ``loader.decode_path``); ``lane_batches``: batches each
    lane decoded in the window. Both None for raw packs.
    """

    batches: int
    images: int
    wall_s: float
    wait_s: float
    wait_p50_s: float
    wait_p99_s: float
    wait_share: float
    produced: int
    stage_s: dict[str, float] = field(default_factory=dict)
    stage_batch_s: dict[str, float] = field(default_factory=dict)
    stage_workers: dict[str, int] = field(default_factory=dict)
    slowest_stage: str | None = None
    decode_path: tuple[str, ...] | None = None
    lane_batches: tuple[int, ...] | None = None

    def as_dict(self) -> dict[str, Any]:
        """Plain values (JSON): the fields, tuples as lists."""
        d = asdict(self)
        for k in ("decode_path", "lane_batches"):
            if d[k] is not None:
                d[k] = list(d[k])
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LoaderStats:
        """The inverse of :meth:`as_dict`."""
        tup = {k: None if d[k] is None else tuple(d[k]) for k in ("decode_path", "lane_batches")}
        return cls(**{**d, **tup})

    def summary(self) -> list[str]:
        """A few lines for people: the wait, then each stage's time per batch."""
        ms = 1e3
        lines = [
            f"{self.batches} batches, {self.images} images in {self.wall_s:.3f} s; the "
            f"consumer waited {self.wait_share:.1%} of it (p50 {self.wait_p50_s * ms:.2f} ms, "
            f"p99 {self.wait_p99_s * ms:.2f} ms, total {self.wait_s:.3f} s)"
        ]
        parts = [
            f"{s} {self.stage_batch_s[s] * ms:.2f}"
            + (f"/{self.stage_workers[s]}" if self.stage_workers[s] > 1 else "")
            for s in STAGES
            if self.stage_s[s] > 0
        ]
        if parts:
            slow = f"; slowest: {self.slowest_stage}" if self.slowest_stage else ""
            lines.append(f"stages, ms a batch (/threads): {', '.join(parts)}{slow}")
        if self.decode_path is not None:
            lanes = self.lane_batches or ()
            for k, p in enumerate(self.decode_path):
                n = f" ({lanes[k]} batches)" if k < len(lanes) and lanes[k] else ""
                lines.append(f"decode lane {k}: {p}{n}")
        return lines


class BatchTimes:
    """One produced batch's stage times, filled on the thread that runs its stages.

    ``lap(stage)`` adds the time since the previous mark to ``stage``; ``mark()`` starts
    from now (after a wait that belongs to no stage); ``add(stage, s)`` adds seconds a
    worker thread measured itself."""

    __slots__ = ("clock", "t", "times")

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.times = [0.0] * len(STAGES)
        self.t = clock()

    def mark(self) -> None:
        self.t = self.clock()

    def lap(self, stage: int) -> None:
        now = self.clock()
        self.times[stage] += now - self.t
        self.t = now

    def add(self, stage: int, seconds: float | None) -> None:
        if seconds is not None:
            self.times[stage] += seconds


class _NoTimes:
    """:class:`BatchTimes` when stats are off: records nothing."""

    __slots__ = ()

    def mark(self) -> None:
        pass

    def lap(self, stage: int) -> None:
        pass

    def add(self, stage: int, seconds: float | None) -> None:
        pass


_NO_TIMES = _NoTimes()


def timed(clock: Callable[[], float], fn: Callable[..., Any], *args: Any) -> float:
    """Run ``fn(*args)`` (its result dropped) and return the seconds it took by ``clock``:
    a worker thread's task measuring itself."""
    t = clock()
    fn(*args)
    return clock() - t


def timed_call(clock: Callable[[], float], fn: Callable[[], Any]) -> tuple[Any, float]:
    """``(fn(), the seconds it took by clock)``: a decode thread's job measuring itself."""
    t = clock()
    out = fn()
    return out, clock() - t


class _Window:
    """Sums over one window of batches (under :class:`Stats`' lock)."""

    def __init__(self, sample: int) -> None:
        self.batches = 0
        self.images = 0
        self.wait = 0.0
        self.wall = 0.0
        self.produced = 0
        self.stages = [0.0] * len(STAGES)
        self.lanes: dict[int, int] = {}
        self.waits = np.empty(sample, np.float64) if sample else None
        self.kept = 0

    def keep(self, wait: float, rng: random.Random) -> None:
        """A uniform sample of the window's waits (reservoir sampling past its size)."""
        w = self.waits
        if w is None:
            return
        if self.kept < len(w):
            w[self.kept] = wait
            self.kept += 1
            return
        j = rng.randrange(self.batches)  # this wait is the window's batches-th
        if j < len(w):
            w[j] = wait

    def slowest(self, workers: list[int]) -> int | None:
        """The stage with the most time per batch per worker, or None before any."""
        per = [t / max(1, k) for t, k in zip(self.stages, workers, strict=True)]
        best = max(range(len(per)), key=per.__getitem__)
        return best if per[best] > 0 else None


class Stats:
    """A loader's recorder: the consumer's waits (:meth:`consumed`), the producers' stage
    times (:meth:`batch`, :meth:`produced`), both from any thread; :meth:`snapshot`.

    Memory is bounded: sums, and ``config.sample`` waits for the percentiles."""

    enabled = True

    def __init__(self, config: StatsConfig | None = None) -> None:
        self.config = config = config if config is not None else StatsConfig()
        self.clock = config.clock
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._rng = random.Random(0)
        self._win = _Window(config.sample)
        self._warn = _Window(0)
        self._warned = False
        self._workers = [1] * len(STAGES)

    def fresh(self) -> Stats:
        """A new recorder with the same config (a forked child's: the parent's lock may
        be held by a thread that does not exist here)."""
        return type(self)(self.config)

    def set_workers(self, **workers: int) -> None:
        """Threads that run a stage at once, by stage name (the others keep theirs)."""
        with self._lock:
            for name, k in workers.items():
                self._workers[STAGES.index(name)] = max(1, int(k))

    # ---- producer side
    def batch(self) -> BatchTimes:
        """A new batch's :class:`BatchTimes`, its clock started."""
        return BatchTimes(self.clock)

    def produced(self, times: BatchTimes | _NoTimes, lane: int | None = None) -> None:
        """A batch's stages are done; ``lane``: the decode lane that decoded it."""
        assert isinstance(times, BatchTimes)
        t = times.times
        with self._lock:
            for w in (self._win, self._warn):
                w.produced += 1
                s = w.stages
                for k in range(len(s)):
                    s[k] += t[k]
                if lane is not None:
                    w.lanes[lane] = w.lanes.get(lane, 0) + 1

    # ---- consumer side
    def consumed(self, start: float, end: float, prev_end: float | None, images: int) -> None:
        """A batch of ``images`` handed over at ``end``, asked for at ``start``; the pass's
        previous hand-over was at ``prev_end`` (None: this is the pass's first batch)."""
        wait = end - start
        interval = end - (start if prev_end is None else prev_end)
        warn = None
        with self._lock:
            w = self._win
            w.batches += 1
            w.images += images
            w.wait += wait
            w.wall += interval
            w.keep(wait, self._rng)
            if prev_end is not None and not self._warned and self.config.warn_share is not None:
                warn = self._judge(wait, interval)
        if warn is not None:
            log.warning(*warn)

    def _judge(self, wait: float, interval: float) -> tuple[Any, ...] | None:
        """Add a batch to the warning's window; when it is full, the warning's arguments
        if the wait share was above the threshold (then never again), and a new window."""
        v = self._warn
        v.batches += 1
        v.wait += wait
        v.wall += interval
        if v.batches < self.config.warn_window:
            return None
        share = v.wait / v.wall if v.wall > 0 else 0.0
        slow = v.slowest(self._workers)
        per = v.stages[slow] / max(1, v.produced) if slow is not None else 0.0
        self._warn = _Window(0)
        if share <= self.config.warn_share:  # type: ignore[operator]
            return None
        self._warned = True
        where = (
            f"the slowest stage is {STAGES[slow]} ({per * 1e3:.2f} ms a batch over "
            f"{self._workers[slow]} thread(s))"
            if slow is not None
            else "no stage was timed"
        )
        return (
            "PackLoader: the model waited for batches %.1f%% of the time over %d batches "
            "(above %.1f%%); %s; see loader.stats()",
            100 * share,
            v.batches,
            100 * self.config.warn_share,  # type: ignore[operator]
            where,
        )

    # ---- report
    def snapshot(
        self, reset: bool = True, decode_path: tuple[str, ...] | None = None
    ) -> LoaderStats:
        """The window so far as a :class:`LoaderStats`; ``reset`` starts a new window.
        ``decode_path``: the decode lanes' paths (the loader knows them)."""
        with self._lock:
            w = self._win
            if reset:
                self._win = _Window(self.config.sample)
            workers = list(self._workers)
        kept = w.waits[: w.kept] if w.waits is not None else np.empty(0)
        p50, p99 = (float(x) for x in np.percentile(kept, [50, 99])) if len(kept) else (0.0, 0.0)
        slow = w.slowest(workers)
        lanes = None
        if decode_path is not None:
            n = max(len(decode_path), max(w.lanes, default=-1) + 1)
            lanes = tuple(w.lanes.get(k, 0) for k in range(n))
        return LoaderStats(
            batches=w.batches,
            images=w.images,
            wall_s=w.wall,
            wait_s=w.wait,
            wait_p50_s=p50,
            wait_p99_s=p99,
            wait_share=w.wait / w.wall if w.wall > 0 else 0.0,
            produced=w.produced,
            stage_s=dict(zip(STAGES, w.stages, strict=True)),
            stage_batch_s={
                s: t / w.produced if w.produced else 0.0
                for s, t in zip(STAGES, w.stages, strict=True)
            },
            stage_workers=dict(zip(STAGES, workers, strict=True)),
            slowest_stage=None if slow is None else STAGES[slow],
            decode_path=decode_path,
            lane_batches=lanes,
        )


class NoStats:
    """``PackLoader(stats=False)``: the same calls, recording nothing."""

    enabled = False
    clock = None

    def fresh(self) -> NoStats:
        return self

    def set_workers(self, **workers: int) -> None:
        pass

    def batch(self) -> _NoTimes:
        return _NO_TIMES

    def produced(self, times: Any, lane: int | None = None) -> None:
        pass

    def consumed(self, start: float, end: float, prev_end: float | None, images: int) -> None:
        pass


def stats_for(arg: Any) -> Stats | NoStats:
    """The recorder of ``PackLoader(stats=arg)``: True (default config), False (off), or
    a :class:`StatsConfig`; UsageError otherwise."""
    if arg is True:
        return Stats()
    if arg is False:
        return NoStats()
    if isinstance(arg, StatsConfig):
        arg.validate()
        return Stats(arg)
    raise UsageError(f"stats must be True, False or a StatsConfig, not {arg!r}")
