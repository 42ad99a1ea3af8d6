"""Clocks done right: the one timer of ``verify``, ``bench`` and the benchmark scripts.

Every timed region starts and ends with the device synchronized (CUDA work is
asynchronous: a clock read without a sync measures the launch, not the work),
follows a warm-up, and is repeated; callers report the median. Every clock read
is in :func:`median_rate`; :func:`time_call` (seconds per call) and
:func:`time_loader` (images/s of a loader) are built on it.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import UsageError

if TYPE_CHECKING:
    import torch


def check_device_name(device: str, field: str = "device") -> None:
    """Refuse a device name other than auto, cpu, cuda, cuda:N (no torch import).
    ``field``: how the message names the option (``VerifyConfig.device``; the error's
    ``field``, which the CLI shows as its flag)."""
    if device not in ("auto", "cpu", "cuda") and not (
        device.startswith("cuda:") and device[5:].isdigit()
    ):
        raise UsageError(f"{field} must be auto, cpu, cuda or cuda:N, not {device!r}", field=field)


def resolve_device(device: str | torch.device, field: str = "device") -> torch.device:
    """The one place a device name becomes a ``torch.device``: ``auto`` -> ``cuda``
    when torch sees a GPU, else ``cpu``; CUDA without a GPU is refused. A
    ``torch.device`` passes through (checked the same way), so a caller that
    resolved already can hand its result on. ``field``: as :func:`check_device_name`'s."""
    import torch

    if isinstance(device, torch.device):
        dev = device
    else:
        check_device_name(device, field)
        if device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(
            f"{field} {dev}, but torch sees no CUDA device; use {field} cpu or auto", field=field
        )
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        n = torch.cuda.device_count()
        raise UsageError(
            f"{field} {dev}, but torch sees {n} CUDA device{'s' * (n != 1)} "
            f"(cuda:0 to cuda:{n - 1}); use one of those or auto",
            field=field,
        )
    if dev.type not in ("cpu", "cuda"):
        raise UsageError(
            f"{field} must be auto, cpu, cuda or cuda:N, not {str(dev)!r}", field=field
        )
    return dev


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(
    fn: Callable[[], Any],
    device: torch.device,
    *,
    repeats: int = 5,
    target_s: float = 0.05,
    max_calls: int = 1000,
) -> float:
    """Median seconds per call of ``fn``.

    Two warm-up calls (the second also sizes the repeat), then ``repeats``
    timed runs of k calls each, k chosen so a run lasts about ``target_s``:
    short calls are not lost in clock resolution and launch overhead.
    """
    fn()
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    once = max(time.perf_counter() - t0, 1e-7)
    k = max(1, min(max_calls, math.ceil(target_s / once)))

    def run() -> int:
        for _ in range(k):
            fn()
        return k

    # calls/s, inverted: with an odd number of repeats, the median run's seconds per call
    return 1.0 / median_rate(run, device, repeats)


def each_pass(loader: Any) -> Callable[[], Any]:
    """``make_iter`` for :func:`time_loader`: a new pass over ``loader``, naming its
    epoch (the loader's next) first when it has ``set_epoch``, as a training loop
    should, so a PackLoader does not take the timing's passes for a loop without
    ``set_epoch`` (and warn)."""

    def start() -> Any:
        if hasattr(loader, "set_epoch") and hasattr(loader, "epoch"):
            loader.set_epoch(loader.epoch)
        return iter(loader)

    return start


def time_loader(
    make_iter: Callable[[], Any],
    consume: Callable[[Any], Any],
    device: torch.device,
    batches: int,
    repeats: int,
    warmup: int = 3,
    on_warm: Callable[[], Any] | None = None,
) -> float:
    """Median images/s of ``repeats`` runs of ``batches`` batches, after warm-up.

    ``make_iter()`` starts a new pass when one ends, so a run may cross epochs
    (as training does); ``consume(batch)`` returns the images it used. ``on_warm()``
    runs after the warm-up (``loader.stats`` there starts the loader's stats afresh).
    """
    it = make_iter()

    def next_batch() -> Any:
        nonlocal it
        try:
            return next(it)
        except StopIteration:
            it = make_iter()
            return next(it)

    for _ in range(warmup):
        consume(next_batch())
    if on_warm is not None:
        on_warm()

    def one_run() -> int:
        return sum(len(consume(next_batch())) for _ in range(batches))

    return median_rate(one_run, device, repeats)


def median_rate(
    work: Callable[[], int],
    device: torch.device,
    repeats: int = 3,
    *,
    barrier: Callable[[], None] | None = None,
) -> float:
    """Median over ``repeats`` runs of ``work()``'s count (images, bytes) per second.

    The device is synchronized, and ``barrier()`` called when given (several
    processes timed together, e.g. ``torch.distributed.barrier``), before each
    clock read. Warm up before calling: every run is timed.
    """
    rates = []
    for _ in range(repeats):
        sync(device)
        if barrier is not None:
            barrier()
        t0 = time.perf_counter()
        n = work()
        sync(device)
        if barrier is not None:
            barrier()
        rates.append(n / (time.perf_counter() - t0))
    return statistics.median(rates)
