"""The build's crash-safe work folder: its lock, plan, journal and names.

Everything a build writes goes to ``.<DST>.imgpack-partial`` beside DST, which
becomes DST by one rename when the pack is complete. Its contents:

* ``plan.json``: the fingerprint of inputs and options this work belongs to,
  and, once the pack inside is fully assembled, ``"assembled": true``;
* ``journal.jsonl``: one fsynced line per finished chunk of rows;
* ``rows.u8``: the preallocated rows, later the pack's data files.

The work folder is also the lock: a build holds an ``flock`` on the folder
itself, so no lock file is ever left beside DST, and the lock moves with the
folder when it is renamed into place. Every name imgpack gives its own files
starts with ``.`` and holds ``imgpack-`` (:func:`packer.sources.scan.is_own_name`), so
scanning never mistakes them for images.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import logging
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import DiskFullError, InputError, PackBusyError
from ..pack.files import loads_json, write_json_atomic

log = logging.getLogger(__name__)

ROWS_FILE = "rows.u8"
JOURNAL = "journal.jsonl"
PLAN = "plan.json"


def refuse_symlink_destination(dst: str | os.PathLike[str]) -> None:
    """Refuse a DST that is a symbolic link (to a folder, a pack, or nothing).

    The pack is put in place by renaming the work folder onto DST, and a rename
    replaces the link itself, not the folder it points to; ``--overwrite`` would
    move the link aside and then fail to remove it. So the user names the real
    folder instead. Only DST's last component matters: links higher up the path
    are resolved by the kernel like any other folder.
    """
    p = Path(os.path.abspath(dst))
    if p.is_symlink():
        try:
            real = f"it points to {os.path.realpath(p)}"
        except OSError:
            real = "it cannot be resolved"
        raise InputError(f"{dst}: is a symbolic link; give the real folder ({real})")


def work_dir_for(dst: Path) -> Path:
    return dst.parent / f".{dst.name}.imgpack-partial"


def trash_dir_for(dst: Path) -> Path:
    """Where an old pack waits while ``--overwrite`` moves the new one in."""
    return dst.parent / f".{dst.name}.imgpack-old"


@contextlib.contextmanager
def dest_lock(dst: Path) -> Iterator[Path]:
    """Hold DST's work folder (created if missing) under an exclusive lock; yield it.

    The lock is an ``flock`` on the folder itself, released by the kernel when
    the process ends, even on a crash. An empty work folder is removed on exit,
    so a build that wrote nothing leaves nothing beside DST. A DST that is a
    symbolic link is refused before anything is created
    (:func:`refuse_symlink_destination`).
    """
    refuse_symlink_destination(dst)
    work = work_dir_for(dst)
    while True:
        with contextlib.suppress(FileExistsError):
            work.mkdir()
        fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise PackBusyError(
                f"{dst}: another imgpack process is writing this destination "
                f"(it holds {work}); wait for it to finish"
            ) from None
        # the previous holder may have renamed or removed the folder we opened: lock
        # the folder now at that path, not a stale one
        try:
            same = os.stat(work).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        yield work
    finally:
        with contextlib.suppress(OSError):
            work.rmdir()  # only when empty; a partial build is kept for the rerun
        os.close(fd)


def recover_trash(dst: Path) -> None:
    """Finish or undo an ``--overwrite`` swap that a crash interrupted (lock held).

    Old pack aside and no DST: the new one never arrived, so the old one goes
    back. Both present: the swap completed, the old one is removed. A leftover
    that is a symbolic link (an older imgpack moved a linked DST aside) is only
    unlinked: what it points to is the user's, and rmtree refuses links.
    """
    trash = trash_dir_for(dst)
    if not (trash.exists() or trash.is_symlink()):
        return
    if dst.exists() or dst.is_symlink():
        if trash.is_symlink() or not trash.is_dir():
            trash.unlink()
        else:
            shutil.rmtree(trash)
    else:
        log.info("restoring %s: an interrupted build had moved it aside", dst)
        os.replace(trash, dst)


@dataclass
class WorkState:
    """What an existing work folder holds: finished chunks, and whether the pack is assembled."""

    done: dict[int, dict[str, Any]] = field(default_factory=dict)
    assembled: bool = False


def read_journal(path: Path) -> dict[int, dict[str, Any]]:
    done: dict[int, dict[str, Any]] = {}
    if not path.exists():
        return done
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                rec = loads_json(line)
                done[int(rec["chunk"])] = rec
            except (ValueError, KeyError, TypeError):
                break  # a torn last line from a crash: that chunk is simply redone
    return done


def _read_plan(work: Path) -> dict[str, Any]:
    try:
        plan = loads_json((work / PLAN).read_bytes())
        return plan if isinstance(plan, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_plan(work: Path, plan: dict[str, Any]) -> None:
    write_json_atomic(work / PLAN, plan)


def mark_assembled(work: Path, fingerprint: str) -> None:
    """Record that the pack in ``work`` is complete: a rerun only has to move it into place."""
    _write_plan(work, {"fingerprint": fingerprint, "assembled": True})


def clear_work_dir(work: Path) -> None:
    """Empty the folder but keep it: it is the lock this process holds."""
    for entry in os.scandir(work):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)


def is_fresh_work_dir(work: Path) -> bool:
    """True when ``work`` is empty: nothing to resume, a build starts afresh."""
    return not any(work.iterdir())


def start_plan(work: Path, fingerprint: str) -> None:
    """Write the plan of a work folder started with ``prepare_work_dir(work, None, ...)``:
    must come before its first journal line."""
    _write_plan(work, {"fingerprint": fingerprint})


def prepare_work_dir(work: Path, fingerprint: str | None, total_bytes: int) -> WorkState:
    """Reuse a matching partial build in ``work``, else start afresh there.

    A partial build is reused when its plan has the same fingerprint and its
    journal still lists its chunks (or its pack is already assembled); anything
    else (other inputs or options, a plan or journal lost in a crash) is
    discarded, never mixed. ``fingerprint`` None: ``work`` is known to be empty
    (:func:`is_fresh_work_dir`); the rows are preallocated and the caller writes the
    plan later with :func:`start_plan`, before any journal line (rows without a plan
    are discarded by a rerun).
    """
    if fingerprint is None:
        _preallocate(work / ROWS_FILE, total_bytes)
        return WorkState()
    plan = _read_plan(work)
    if plan.get("fingerprint") == fingerprint:
        if plan.get("assembled") is True:
            return WorkState(assembled=True)
        done = read_journal(work / JOURNAL)
        if done or (work / ROWS_FILE).exists():  # rows there, or moved by finalize
            return WorkState(done=done)
    if any(work.iterdir()):
        log.info("discarding %s: it was started with other inputs or options", work)
        clear_work_dir(work)
    _preallocate(work / ROWS_FILE, total_bytes)
    _write_plan(work, {"fingerprint": fingerprint})
    return WorkState()


def _preallocate(path: Path, total_bytes: int) -> None:
    """The rows file at its full size, its blocks reserved now: a full disk is found
    before any decode, and the rows lie in one piece. In memory (tmpfs, ramfs) there is
    nothing to lay out, and reserving would zero every page the rows then overwrite
    (docs/PERFORMANCE.md, section "Figures behind the code", row "rows file in
    memory"): there the free room is
    checked, and the writes take the pages."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if total_bytes:
            if _in_memory(fd):
                if shutil.disk_usage(path.parent).free < total_bytes:
                    raise _no_room(path, total_bytes)
                os.ftruncate(fd, total_bytes)
                return
            try:
                os.posix_fallocate(fd, 0, total_bytes)
            except OSError as e:
                if e.errno == errno.ENOSPC:
                    raise _no_room(path, total_bytes) from None
                if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                os.ftruncate(fd, total_bytes)
    finally:
        os.close(fd)


def _no_room(path: Path, total_bytes: int) -> DiskFullError:
    free = shutil.disk_usage(path.parent).free
    return DiskFullError(
        f"{path.parent.parent}: not enough disk space for the pack (needs "
        f"{total_bytes / 1e9:.2f} GB, {free / 1e9:.2f} GB free); free space "
        "and run the same command again"
    )


_IN_MEMORY = {0x01021994, 0x858458F6}  # statfs f_type of tmpfs, ramfs


def _in_memory(fd: int) -> bool:
    """Whether ``fd``'s file system keeps its files in memory (Linux; else False)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        buf = ctypes.create_string_buffer(256)  # struct statfs, its f_type (a long) first
        if ctypes.CDLL(None, use_errno=True).fstatfs(fd, buf) != 0:
            return False
        return ctypes.c_long.from_buffer(buf).value in _IN_MEMORY
    except (OSError, AttributeError):
        return False
