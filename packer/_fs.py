"""The ground floor shared by the commands that write files (``build``, ``compress``):
how many processes to use, and what a failed write to the destination means. Depends
on :mod:`packer.errors` only."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from .errors import DiskFullError, InputError


def default_workers() -> int:
    """Cores this process may run on (its CPU affinity), at least 1."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def destination_error(e: OSError, dst: Path) -> Exception:
    """A write error that is the destination's fault, as a one-line PackerError.

    Other errors come back unchanged (a bug or a failing disk keeps its traceback).
    """
    where = e.filename or dst
    if e.errno == errno.ENOSPC:
        return DiskFullError(
            f"{dst}: the disk is full ({e.strerror}); free space and run the "
            "same command again: the finished part is kept"
        )
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return InputError(
            f"{where}: cannot write there ({e.strerror}); choose a writable destination "
            "or fix its permissions"
        )
    return e
