"""Bucket prefixes as build sources with the local engine: a prefix of images (the
folder layouts), or of parquet, tar or zip objects, or brace-ranged shard URLs
(``s3://bucket/shards/train-{000000..000127}.tar``).

Everything goes through :mod:`packer.storage.client` (the client of ``s3://`` and of
whatever schemes it speaks), with its retries, timeouts and credential handling.
Objects are read in place by ranged reads (:class:`RangeFile`): a parquet footer and
row groups, a tar's member headers then each chunk's members, a zip's directory then its
members; an image object whole, capped by ``SourceOptions.max_image_bytes``. Nothing is downloaded
to disk. Each object's size and ETag, as listed, are the resume fingerprint's stamps.
"""

from __future__ import annotations

import io
import logging
import os
import posixpath
import tempfile
import threading
from pathlib import Path
from typing import Any

from ...errors import InputError, UsageError
from .common import SUFFIX_KIND, Container, Fetched, SourceSpec, cached, expand_braces

log = logging.getLogger(__name__)

_BLOCK = 4 << 20  # read-ahead of a RangeFile (two blocks are kept)


def _split(url: str) -> tuple[str, str]:
    """``s3://b/dir/x.tar`` -> (``s3://b/dir``, ``x.tar``)."""
    from ...storage.url import parse_url

    u = parse_url(url)  # first: a URL with a credential is refused, unquoted
    head, _, name = u.prefix.rpartition("/")
    if not name:
        raise UsageError(f"{u}: name an object or a prefix under the bucket")
    return f"{u.scheme}://{u.bucket}" + (f"/{head}" if head else ""), name


def _store(prefix_url: str) -> Any:
    from ...storage.client import open_store
    from ...storage.url import parse_url

    return cached(("store", prefix_url), lambda: open_store(parse_url(prefix_url)))


def _listing(prefix_url: str) -> list[tuple[str, int, str]]:
    from ...storage.client import open_store
    from ...storage.url import parse_url

    return open_store(parse_url(prefix_url)).list_meta()


def bucket_spec(url: str) -> SourceSpec:
    """What a bucket SRC names: shard objects (a brace range, or one object with a
    parquet/arrow/tar/zip suffix), or a prefix of images or of such objects."""
    from ...storage.url import parse_url

    parse_url(url.replace("{", "").replace("}", ""))  # credentials refused before anything
    names = expand_braces(url)
    kinds = {SUFFIX_KIND.get(posixpath.splitext(n)[1].lower()) for n in names}
    if len(names) > 1 or kinds != {None}:
        if None in kinds or len(kinds) != 1:
            raise UsageError(f"{url}: name .parquet, .tar or .zip objects of one kind")
        kind = kinds.pop()
        assert kind is not None
        return SourceSpec(kind, tuple(names), bucket=True)
    u = parse_url(url)
    listing = _listing(str(u))
    if not listing:
        raise InputError(f"{u}: no objects under this prefix")
    top = {k for k, _, _ in listing if "/" not in k}
    if "state.json" in top and "dataset_info.json" in top:
        raise UsageError(
            f"{u}: a datasets save_to_disk folder is read from local disk (Arrow files are "
            "memory-mapped); copy it here, or publish it as parquet"
        )
    from ...sources.scan import is_image_name

    if any(is_image_name(k.rsplit("/", 1)[-1]) for k, _, _ in listing):
        return SourceSpec("object", (str(u),), bucket=True)
    found = sorted(k for k, _, _ in listing if SUFFIX_KIND.get(posixpath.splitext(k)[1].lower()))
    fkinds = {SUFFIX_KIND[posixpath.splitext(k)[1].lower()] for k in found}
    if not found:
        raise InputError(f"{u}: no images, parquet, tar or zip objects under this prefix")
    if len(fkinds) > 1:
        raise UsageError(
            f"{u}: holds objects of several kinds ({', '.join(sorted(fkinds))}); name one with a pattern"
        )
    return SourceSpec(fkinds.pop(), tuple(u.child(k) for k in found), bucket=True)


def object_stamp(url: str) -> str:
    """``size:ETag`` of the object at ``url``, as its prefix lists it."""
    prefix, name = _split(url)
    if prefix not in _LISTINGS:
        _LISTINGS[prefix] = {k: (s, e) for k, s, e in _listing(prefix)}
    stamps = _LISTINGS[prefix]
    if name not in stamps:
        raise InputError(f"{url}: no such object")
    size, etag = stamps[name]
    return f"{size}:{etag}"


# the listings of one index (a prefix listed once for all its shards), never reused by
# a later build: an object changed since must change the fingerprint
_LISTINGS: dict[str, dict[str, tuple[int, str]]] = {}


class RangeFile(io.RawIOBase):
    """A read-only, seekable file over one object, by ranged GETs with a read-ahead
    block: what pyarrow, zipfile and tarfile read a bucket's objects through."""

    def __init__(self, url: str, block: int = _BLOCK) -> None:
        super().__init__()
        self.url = url
        self.block = block
        self.prefix, self.name = _split(url)
        self.store = _store(self.prefix)
        size = self.store.head(self.name)
        if size is None:
            raise InputError(f"{url}: no such object")
        self.size = size
        self.pos = 0
        self._buf = b""
        self._buf_at = 0
        self._prev = b""  # the block read before, kept: reads step back into it
        self._prev_at = 0
        self._spool: Any = None  # a server without ranged reads: the object, fetched once

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def read_range(self, offset: int, n: int) -> bytes:
        """Bytes [offset, offset + n) (fewer at the end), without the read-ahead."""
        n = min(n, self.size - offset)
        if n <= 0:
            return b""
        if self._spool is None:
            from ...storage.client import NoRanges

            try:
                return self.store.get_range(self.name, start=offset, length=n)
            except NoRanges:
                self._spool = self._fetch_whole()
        return os.pread(self._spool.fileno(), n, offset)

    def _fetch_whole(self) -> Any:
        """The object in an unlinked temporary file of this process (gone with it), for
        a server that answers ranged reads with the whole object's status."""
        log.warning(
            "%s: the server does not answer ranged reads; reading the whole object once", self.url
        )
        fd, path = tempfile.mkstemp(prefix=".imgpack-source-")
        os.close(fd)
        try:
            self.store.download(Path(path), self.name)
            f = open(path, "rb")  # noqa: SIM115 (closed by close())
        finally:
            os.unlink(path)
        if os.fstat(f.fileno()).st_size != self.size:
            f.close()
            raise InputError(f"{self.url}: changed while it was read; run the same command again")
        return f

    def close(self) -> None:
        if self._spool is not None:
            self._spool.close()
            self._spool = None
        super().close()

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self.size - self.pos
        n = min(n, max(0, self.size - self.pos))
        if n <= 0:
            return b""
        end = self.pos + n
        if not (self._buf_at <= self.pos and end <= self._buf_at + len(self._buf)):
            if self._prev_at <= self.pos and end <= self._prev_at + len(self._prev):
                # the block before: a label member read just after the next header
                self._buf, self._prev = self._prev, self._buf
                self._buf_at, self._prev_at = self._prev_at, self._buf_at
            elif n >= self.block:
                data = self.read_range(self.pos, n)
                self.pos += len(data)
                return data
            else:
                self._prev, self._prev_at = self._buf, self._buf_at
                self._buf_at = self.pos
                self._buf = self.read_range(self.pos, max(n, self.block))
        i = self.pos - self._buf_at
        data = self._buf[i : i + n]
        self.pos += len(data)
        return data

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


def open_range(url: str, block: int = _BLOCK) -> RangeFile:
    return RangeFile(url, block)


class SpoolStopped(Exception):
    """A spool fetch ended by its build (:func:`spool_object`'s ``stop``)."""


def spool_object(url: str, path: str, stamp: str, stop: threading.Event | None = None) -> None:
    """The object at ``url`` fetched whole by one streamed GET into the new file
    ``path`` (a build's spool, :mod:`.spool`): the object listed with ``stamp``
    (``size:ETag``; the ETag asked for with If-Match where the listing gave one), else
    InputError naming it. ``stop`` set (the build failed or was interrupted meanwhile):
    SpoolStopped at the next piece received, the request dropped."""
    from ...errors import DiskFullError
    from ...storage.client import TooLarge

    prefix, name = _split(url)
    size_text, _, etag = stamp.partition(":")
    size = int(size_text)
    changed = InputError(f"{url}: changed since it was listed; run the same command again")

    def check(_: int) -> None:
        if stop is not None and stop.is_set():
            raise SpoolStopped(url)

    check(0)
    try:
        got = _store(prefix).download(
            Path(path), name, etag=etag or None, max_bytes=size, sync=False, progress=check
        )
    except TooLarge:
        raise changed from None
    except DiskFullError:
        raise DiskFullError(
            f"{os.path.dirname(path)}: the disk is full while fetching {url} into the "
            "build's spool; free space, or give a smaller SourceOptions.spool_bytes (0: "
            "read the shards in place)"
        ) from None
    if got != size:
        raise changed


def read_objects(c: Container, keys: list[str]) -> list[Fetched]:
    """Image objects ``keys`` under bucket prefix ``c``, each capped."""
    from ...storage.client import NotFound, TooLarge

    store = _store(c.where)
    out = []
    for k in keys:
        try:
            out.append(Fetched(store.get(k, max_bytes=c.cap)))
        except TooLarge:
            out.append(
                Fetched(
                    None,
                    f"over the per-image limit of {c.cap:,} bytes; not read",
                )
            )
        except NotFound:
            out.append(Fetched(None, "no longer in the bucket"))
    return out
