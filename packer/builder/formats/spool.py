"""A build's spool of bucket shards: a WebDataset tar of a bucket is fetched by one
streamed GET into a file beside DST, then listed and read by the workers as a tar on
disk, so each shard crosses the network once (before: the listing read it whole in
read-ahead blocks, then each worker read its members again by ranged reads, and waited
on them).

The spool is a folder ``.<DST>.imgpack-spool-XXXXXXXX`` beside DST (the build's own
area: DST's disk, not a RAM-backed ``/tmp``), held under an ``flock`` by its build while
it lives, and removed when the build ends, fails or is interrupted
(:func:`spool_area`); a killed build's spool, its lock gone with its process, is
removed by the next build of the same DST. It is bounded: shards are spooled in their
order while their bytes stay within :attr:`SourceOptions.spool_bytes` (default
:data:`DEFAULT_SPOOL_BYTES`) and half the disk's free space when the listing starts; a
shard past the bound is read in place by ranged reads, as without a spool (0: none
spooled). A spooled shard is fetched with the ETag it was listed with (If-Match) and
must be the size it was listed at, so the listing, the workers and the resume
fingerprint see one object.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import fcntl
import glob
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from .options import SourceOptions

log = logging.getLogger(__name__)

DEFAULT_SPOOL_BYTES = 64 << 30
_PREFIX = ".imgpack-spool-"
# a spool folder that cannot be made beside DST (read-only, full, DST's name too long
# for the spool's): the shards are read in place
_NO_SPOOL = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.ENAMETOOLONG)

# where the build running on this thread may spool (DST), and the spools it made
_AREA: contextvars.ContextVar[tuple[Path, Spools] | None] = contextvars.ContextVar(
    "imgpack_spool_area", default=None
)


class Spool:
    """One build's spool folder beside ``dst``, locked while it lives."""

    def __init__(self, dst: Path) -> None:
        parent = dst.parent
        parent.mkdir(parents=True, exist_ok=True)
        remove_stale(dst)
        while True:
            path = Path(tempfile.mkdtemp(prefix=f".{dst.name}{_PREFIX}", dir=parent))
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:  # another build's stale sweep may have taken it between the two calls
                same = os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        self.path, self._fd = path, fd

    def file(self, i: int, name: str) -> str:
        """The spool file of the ``i``-th shard (``name`` kept for people looking)."""
        # ASCII only: 80 characters of a hostile key stay within a file name's 255 bytes
        safe = "".join(ch if ch.isascii() and (ch.isalnum() or ch in "-_.") else "_" for ch in name)
        safe = safe[-80:]
        return str(self.path / f"{i:06d}-{safe}")

    def remove(self) -> None:
        if self._fd < 0:
            return
        from .common import drop_cached

        drop_cached(str(self.path))  # a build decoding here (one worker) held its shards
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._fd)
        self._fd = -1


def remove_stale(dst: Path) -> None:
    """Remove the spools beside ``dst`` that no living build holds (a killed build's)."""
    # exactly mkdtemp's names (8 of its characters): a folder of the user's named alike
    # (``.pack.imgpack-spool-notes``) is not a spool
    pattern = os.path.join(
        glob.escape(str(dst.parent)), f".{glob.escape(dst.name)}{_PREFIX}" + "[a-z0-9_]" * 8
    )
    for path in glob.glob(pattern):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue  # not a folder (a link, a file): not ours to remove
        if os.fstat(fd).st_uid != os.getuid():
            os.close(fd)
            continue  # another user's: not ours to remove
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # a living build's
        try:
            shutil.rmtree(path, ignore_errors=True)
        finally:
            os.close(fd)


class Spools:
    """The spools a build made (:func:`spool_area`)."""

    def __init__(self) -> None:
        self.made: list[Spool] = []
        self.dirs: list[Path] = []  # DST's missing parents made for them, deepest first

    def remove(self) -> None:
        """Remove every spool made so far (again: nothing), and the folders made for
        them that nothing else went into since (a failed build's DST folder)."""
        while self.made:
            with contextlib.suppress(OSError):
                self.made.pop().remove()
        while self.dirs:
            try:
                os.rmdir(self.dirs.pop(0))
            except OSError:
                self.dirs.clear()  # not empty (DST, its work folder): it and those above stay


@contextlib.contextmanager
def spool_area(dst: str | os.PathLike[str]) -> Iterator[Spools]:
    """While inside, a bucket source listed on this thread may spool its shards beside
    ``dst``; every spool made is removed on the way out, whatever happened."""
    spools = Spools()
    token = _AREA.set((Path(os.path.abspath(dst)), spools))
    try:
        yield spools
    finally:
        _AREA.reset(token)
        spools.remove()


def plan_spool(names: Sequence[str], sizes: Sequence[int], opts: SourceOptions) -> list[str]:
    """The spool file of each shard (``""``: read in place), in shard order while the
    bytes stay within the bound; all ``""`` outside :func:`spool_area`."""
    area = _AREA.get()
    limit = DEFAULT_SPOOL_BYTES if opts.spool_bytes is None else opts.spool_bytes
    if area is None or limit <= 0 or not names:
        return [""] * len(names)
    dst, spools = area
    try:
        missing = [d for d in (dst.parent, *dst.parent.parents) if not d.exists()]
        dst.parent.mkdir(parents=True, exist_ok=True)
        spools.dirs[:0] = missing
        free = shutil.disk_usage(dst.parent).free
    except OSError as e:
        log.info("%s: no spool for the bucket's shards (%s)", dst.parent, e.strerror)
        return [""] * len(names)
    budget = min(limit, free // 2)
    files: list[str] = []
    spool: Spool | None = None
    used = 0
    for i, (name, size) in enumerate(zip(names, sizes, strict=True)):
        if used + size > budget:
            files += [""] * (len(names) - i)  # in order: the rest are read in place
            break
        if spool is None:
            try:
                spool = Spool(dst)
            except OSError as e:
                if e.errno not in _NO_SPOOL:
                    raise
                log.info("%s: no spool for the bucket's shards (%s)", dst.parent, e.strerror)
                return [""] * len(names)
            spools.made.append(spool)
        used += size
        files.append(spool.file(i, name))
    return files
