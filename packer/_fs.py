"""The ground floor: how every module opens a file it did not write (regular files only,
checked on the opened descriptor: :func:`open_if_regular`), writes one whole or not at
all (:func:`write_atomic`), makes a rename durable (:func:`fsync_dir`), how many
processes to use, and what a failed write to the destination means. Depends on
:mod:`packer.errors` only."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

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


class NotRegularFile(Exception):
    """What :func:`open_if_regular` opened is not a regular file (``mode``: its st_mode)."""

    def __init__(self, mode: int) -> None:
        super().__init__(mode)
        self.mode = mode


def open_if_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """Open ``path`` for reading if it is a regular file (symlinks followed).

    The check is made on the opened descriptor (no race with a swap), and the open
    does not block (``O_NONBLOCK``: opening a FIFO would wait for a writer). Raises
    the open's OSError, or NotRegularFile; callers word them for their own users.
    """
    fd, _ = open_fd_if_regular(path)
    try:
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def open_fd_if_regular(path: str | os.PathLike[str]) -> tuple[int, os.stat_result]:
    """:func:`open_if_regular` as a bare descriptor (non-blocking, which a regular file
    ignores), with its stat: no file object, for hot loops of whole-file reads."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(st.st_mode)
        return fd, st
    except BaseException:
        os.close(fd)
        raise


def file_kind(mode: int) -> str:
    """What a file that is not a regular file is, in words ("a FIFO", "a folder", ...)."""
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "a special file"


# a folder fsync the filesystem does not offer (some network and FUSE filesystems)
_NO_DIR_FSYNC = {errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF, errno.EACCES}


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make the renames and creations in folder ``path`` durable. One policy: where the
    filesystem does not fsync folders (EINVAL, ENOTSUP, EBADF, EACCES on the folder) it is
    skipped, since the rename itself stands; any other failure (the folder gone, an I/O
    error) raises, since what it guards may not be on disk."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as e:
        if e.errno in _NO_DIR_FSYNC:
            return
        raise
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in _NO_DIR_FSYNC:
            raise
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike[str], data: bytes, *, tmp: Path | None = None) -> None:
    """``data`` to ``path`` whole or not at all: written to a temporary name beside it
    (``tmp``, default ``path`` + ".tmp"), fsynced, renamed over ``path``. On any failure
    the temporary file is removed and the error raised; ``path`` keeps what it held."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp") if tmp is None else tmp
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


class JSONNestingError(ValueError):
    """JSON nested deeper than Python's parser can follow (a hostile or garbage file)."""


def loads_json(data: bytes | str) -> Any:
    """``json.loads`` for files imgpack reads back (manifests, plans, journals, records).

    Nesting too deep for the parser's recursion raises :class:`JSONNestingError`, a
    ``ValueError``, like any other invalid JSON, so every caller that already treats
    ``ValueError`` as "not valid" is safe from ``RecursionError`` too.
    """
    try:
        return json.loads(data)
    except RecursionError:
        raise JSONNestingError("JSON nested too deeply") from None
