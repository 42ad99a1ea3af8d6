"""Steps an interrupt must not split. Ctrl-C (and SIGTERM under the CLI) raises
KeyboardInterrupt in the main thread between any two bytecodes, so a folder made but
not yet registered for removal (inside ``tempfile.mkdtemp``, or ``TemporaryDirectory``
before its finalizer is set up) was left behind, and a removal in progress was cut
short. :func:`deferred_interrupts` holds SIGINT and SIGTERM back for such a step and
delivers them after it; :func:`temporary_folder` makes and removes a temporary folder
so. Standard library only."""

from __future__ import annotations

import contextlib
import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_HELD = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[None]:
    """SIGINT and SIGTERM arriving while the block runs are noted, not handled; when it
    ends the previous handlers are back and what was noted is delivered to them (a
    KeyboardInterrupt raised then, once the step is whole). Main thread only (Python
    runs signal handlers there); elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []

    def note(signum: int, frame: Any) -> None:
        noted.append(signum)

    previous = {}
    try:
        for sig in _HELD:
            previous[sig] = signal.signal(sig, note)
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(noted):  # each once, in the order they came
            signal.raise_signal(sig)  # (an interrupt wins over an error of the step)


@contextlib.contextmanager
def temporary_folder(prefix: str, dir: Path | None = None) -> Iterator[Path]:
    """A new temporary folder (``tempfile``'s, in ``dir`` or the system's), removed when
    the block ends, however it ends. Made and registered for removal as one step, and
    removed as one step (:func:`deferred_interrupts`): an interrupt arriving meanwhile is
    raised after. Should one land between the two, ``TemporaryDirectory``'s finalizer
    still removes the folder as the block unwinds."""
    tmp = None
    try:
        with deferred_interrupts():
            tmp = tempfile.TemporaryDirectory(prefix=prefix, dir=dir)
        yield Path(tmp.name)
    finally:
        if tmp is not None:
            with deferred_interrupts():
                tmp.cleanup()
