"""CUDA's hardware work queues, for the GPU JPEG decoders that share a GPU with a model.

nvjpeg (behind torchcodec and torchvision) decodes on about fourteen CUDA streams of its
own per decoder. CUDA maps every stream of a process onto ``CUDA_DEVICE_MAX_CONNECTIONS``
hardware queues (8 unless set), so some of those streams share a queue with the
model's: a copy or kernel of the decoder then waits behind everything the training loop
has queued (up to a whole step), the loader falls behind, and the model waits for its
batches. With 32 queues that stall is gone: ResNet-50 fed by a JPEG pack trains closer
to its resident rate (docs/PERFORMANCE.md, section "Figures behind the code", row "32
hardware queues").

CUDA reads the variable once, when the process's CUDA context starts, so it is set by an
explicit call, never by ``import packer``: :func:`configure`
(``packer.configure_cuda_queues()``), made before the first CUDA call, sets it to 32
unless it is set already (the user's choice stands) or CUDA has started (too late). A JPEG
loader on CUDA makes the same call when it is constructed (in time where CUDA has not
started yet) and logs once where the context has fewer queues (:func:`advice`).
"""

from __future__ import annotations

import logging
import os
import sys

VAR = "CUDA_DEVICE_MAX_CONNECTIONS"
WANT = 32  # CUDA's maximum
ENOUGH = 16
_DEFAULT = 8  # CUDA's, when the variable is not set

log = logging.getLogger("packer")
_seen: dict[str, object] = {}


def _cuda_started() -> bool:
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        return bool(cuda is not None and cuda.is_initialized())
    except Exception:  # a half-imported torch: treat as not started
        return False


def claim() -> None:
    """Ask CUDA for :data:`WANT` hardware queues, unless the variable is set (the
    user's choice stands) or this process's CUDA context has started (too late: it has
    the queues it started with). Records which, for :func:`advice`."""
    started = _cuda_started()
    user = os.environ.get(VAR)
    if user is None and not started:
        os.environ[VAR] = str(WANT)
    _seen.update(started=started, user=user)


def configure() -> int | None:
    """``packer.configure_cuda_queues()``: give this process's CUDA context
    :data:`WANT` (32) hardware queues, so that a JPEG loader's GPU decodes do not wait
    behind the model's work. Call it before the first CUDA call (creating a tensor or a
    model on the GPU); it sets ``CUDA_DEVICE_MAX_CONNECTIONS=32`` in ``os.environ``
    unless the variable is set already (your value stands) or CUDA has started (then
    it changes nothing: export the variable before the process starts instead).
    Returns the queues the context has or will have, None where that cannot be known
    (an unparsable value). A JPEG :class:`~packer.PackLoader` on CUDA calls it too, and
    logs once where the context has fewer than it needs."""
    claim()
    return queues()


def queues() -> int | None:
    """The hardware queues this process's CUDA context has or will have, where known:
    the variable's value at the latest :func:`claim` when CUDA had not started by then
    (or its value now if packer set none), CUDA's default where it had started with none
    set, None where it cannot be known (or before any :func:`claim`)."""
    if not _seen:
        return None
    if _seen["started"]:
        user = _seen["user"]
        return _DEFAULT if user is None else _parse(str(user))
    return _parse(os.environ.get(VAR, str(_DEFAULT)))


def _parse(value: str) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


def advice() -> str | None:
    """A line to log when a JPEG loader decodes on CUDA with fewer than :data:`ENOUGH`
    hardware queues; None where it has enough or the count is unknown."""
    n = queues()
    if n is None or n >= ENOUGH:
        return None
    why = (
        "CUDA started before packer.configure_cuda_queues()"
        if _seen.get("started") and _seen.get("user") is None
        else f"{VAR}={n}"
    )
    return (
        f"JPEG pack on CUDA with {n} hardware queues ({why}): nvjpeg's streams share them "
        f"with the model's and the decode stalls behind its steps (ResNet-50 ran at "
        f"0.95 of resident instead of 0.98); export {VAR}={WANT}, or call "
        "packer.configure_cuda_queues() before the first CUDA call"
    )


def warn_once() -> None:
    """Log :func:`advice` once per process."""
    line = advice()
    if line is not None and not _seen.get("warned"):
        _seen["warned"] = True
        log.warning("%s", line)
