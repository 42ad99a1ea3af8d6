"""WebDataset tar shards as build sources: ``shards/train-{000000..000127}.tar``, local
or in a bucket.

A sample is a run of consecutive members sharing a key (the member name up to the
first dot of its base name, as WebDataset groups them); its image is the member with
extension ``jpg``, ``jpeg``, ``png`` or ``webp`` (that preference), its label the
``cls`` member, or with ``--label-field NAME`` that field of the ``json`` member.

The shard is never unpacked: listing reads the member headers, seeking over the data
(:func:`plain_members` reads the header blocks of a shard of plain ustar, GNU or PAX
headers itself; tarfile reads any other), and the small label members; a worker reads
its images' bytes at their offsets, a run of nearby members in one read. A bucket's
shard is first fetched whole by one streamed GET into the build's spool beside DST
(:mod:`.spool`, bounded), then listed and read there as a shard on disk; past the
spool's bound, in place by ranged reads. Never read, each skipped with its location and
reason: a member whose name leads outside the shard (``../x.jpg``, ``/etc/x.jpg``), a
link or device member, an image over the per-image cap, a member cut short by the end
of the shard; a header that cannot be parsed ends that shard's listing (what came
before is kept).
"""

from __future__ import annotations

import os
import re
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..._fs import loads_json
from ...errors import InputError
from ...sources.scan import printable
from .common import (
    MAX_LABEL_BYTES,
    Container,
    Fetched,
    cached,
    capped,
    file_stamp,
    finish_labels,
    member_location,
    one_line,
)
from .options import SourceOptions

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")
_KEY = re.compile(r"^((?:.*/|)[^./]+)\.([^/]*)$")
_LIST_THREADS = 16  # bucket shards listed at once
_TAR_ERRORS = (tarfile.TarError, EOFError, ValueError, UnicodeError, OSError, OverflowError)


_DRIVE = re.compile(r"[A-Za-z]:")
_CONTROL = re.compile(r"[\x00-\x1f]")


def unsafe_name(name: str) -> str | None:
    """Why a member name must not be used, or None."""
    if not name.isascii():
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:  # tarfile's surrogate escapes of undecodable bytes
            return "a member name that is not valid UTF-8; not read"
    if name.startswith("/") or "\\" in name or _DRIVE.match(name):
        return "a member name leading outside the shard (absolute path); not read"
    if ".." in name and ".." in name.split("/"):
        return "a member name leading outside the shard (path traversal '..'); not read"
    if _CONTROL.search(name):
        return "a member name with control characters; not read"
    return None


class _Shard:
    """One open shard: ``read_at(offset, n)`` and its size."""

    def __init__(self, where: str, read_ahead: int = 4 << 20) -> None:
        self.where = where
        if "://" in where:
            from .remote import open_range

            self.f: Any = open_range(where, read_ahead)
            self.size = self.f.size
        else:
            self.f = open(where, "rb")  # noqa: SIM115 (closed by close())
            self.size = os.fstat(self.f.fileno()).st_size

    def read_at(self, offset: int, n: int) -> bytes:
        if "://" in self.where:
            return self.f.read_range(offset, n)
        return os.pread(self.f.fileno(), n, offset)

    def small(self, offset: int, n: int) -> bytes:
        """Bytes ``[offset, offset + n)`` (fewer at the end) for the listing: a header
        or a label, by one pread (a mapping's unmap cost more than the reads), or
        through the object's read-ahead (one request a block, not one a read)."""
        if "://" in self.where:
            self.f.seek(offset)
            return self.f.read(n)
        return os.pread(self.f.fileno(), n, offset)

    def close(self) -> None:
        self.f.close()


def _label_of(
    shard: _Shard, members: dict[str, Any], opts: SourceOptions
) -> tuple[Any, str | None]:
    """(label text or None, why the sample must be skipped or None)."""
    ext = "json" if opts.label_field else "cls"
    m = members.get(ext)
    if m is None:
        return None, None
    if m.size > MAX_LABEL_BYTES:
        return None, f"its {ext} member is {m.size:,} bytes, over {MAX_LABEL_BYTES:,}; not read"
    if m.offset_data + m.size > shard.size:
        return None, f"its {ext} member is cut short by the end of the shard"
    raw = shard.small(m.offset_data, m.size)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None, f"its {ext} member is not UTF-8 text"
    if not opts.label_field:
        return text.strip(), None
    try:
        doc = loads_json(text)
    except ValueError as e:
        return None, f"its json member is not JSON ({one_line(e)})"
    if not isinstance(doc, dict) or opts.label_field not in doc:
        return None, None
    v = doc[opts.label_field]
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        return None, f"json field {opts.label_field!r} is {v!r}, not a class name or an integer"
    return str(v), None


# the largest single read tarfile may make while listing: a header block is 512 bytes; a
# PAX extended header or a GNU long name is read whole, and a hostile one can claim GBs
MAX_HEADER_BYTES = 1 << 20


class _HeadersOnly:
    """The shard as tarfile reads it while listing: seeks pass through; a read larger
    than :data:`MAX_HEADER_BYTES` (an extended header claiming more) is refused."""

    def __init__(self, f: Any) -> None:
        self._f = f

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0 or n > MAX_HEADER_BYTES:
            raise ValueError(
                f"a member header of {'unknown' if n is None or n < 0 else format(n, ',')} "
                f"bytes, over {MAX_HEADER_BYTES:,}"
            )
        return self._f.read(n)

    def seek(self, *args: Any) -> int:
        return self._f.seek(*args)

    def tell(self) -> int:
        return self._f.tell()


def _tarfile_members(c: Container, shard: _Shard, skipped: list[dict[str, str]]) -> Iterator[Any]:
    """The shard's members as tarfile reads their headers (every kind of member and
    header, and every fault: a fault is a skip naming where it came, and ends the
    shard)."""
    shard.f.seek(0)  # tarfile starts where the file is
    try:
        tf = tarfile.open(fileobj=_HeadersOnly(shard.f), mode="r:")  # noqa: SIM115 (the shard's, closed with it)
    except _TAR_ERRORS as e:
        skipped.append({"path": c.name, "reason": f"not a tar file ({one_line(e)}); shard skipped"})
        return
    last = ""
    while True:
        try:
            m = tf.next()
        except _TAR_ERRORS as e:
            after = f" after member {last}" if last else ""
            skipped.append(
                {
                    "path": c.name,
                    "reason": f"unreadable{after} ({one_line(e)}); the rest of the shard is skipped",
                }
            )
            return
        if m is None:
            # tarfile ends quietly at a header cut short: what follows must be zeros
            rest = shard.size - tf.offset
            tail = shard.read_at(tf.offset, min(rest, 1024)) if rest > 0 else b""
            if tail.strip(b"\0"):
                after = f" after member {last}" if last else ""
                skipped.append(
                    {"path": c.name, "reason": f"unreadable{after} (a member header cut short: "
                     f"{rest:,} bytes left); the rest of the shard is skipped"}
                )  # fmt: skip
            return
        tf.members = []  # headers only, one at a time: a shard of a million members is fine
        last = m.name
        yield m


class _Member:
    """A regular member or a folder, as :func:`plain_members` lists it (the
    attributes of a ``tarfile.TarInfo`` the listing uses)."""

    __slots__ = ("_dir", "name", "offset_data", "size")

    def __init__(self, name: str, offset_data: int, size: int, is_dir: bool) -> None:
        self.name, self.offset_data, self.size, self._dir = name, offset_data, size, is_dir

    def isdir(self) -> bool:
        return self._dir

    def isfile(self) -> bool:
        return not self._dir

    def issym(self) -> bool:
        return False

    def islnk(self) -> bool:
        return False


_MAGICS = (b"ustar\x0000", b"ustar  \x00")  # POSIX (ustar, pax), GNU
_PAX_IGNORED = {b"mtime", b"atime", b"ctime", b"uid", b"gid", b"uname", b"gname", b"comment"}


def _octal(field: bytes) -> int | None:
    """A header's octal number field, or None for anything else (base-256: a size of
    8 GiB or more; stray characters)."""
    text = field.split(b"\0", 1)[0].strip()
    if not text.isdigit():  # no sign, no underscore, no space inside
        return None if text else 0
    try:
        return int(text, 8)
    except ValueError:  # an 8 or a 9
        return None


def _pax(data: bytes) -> tuple[str | None, int | None] | None:
    """(path, size) of a PAX extended header's records, or None for anything this
    lister leaves to tarfile (another keyword, a malformed record, non-UTF-8)."""
    name = size = None
    pos = 0
    while pos < len(data):
        sp = data.find(b" ", pos, pos + 20)
        if sp < 0 or not data[pos:sp].isdigit():
            return None
        n = int(data[pos:sp])
        rec = data[sp + 1 : pos + n]
        if n <= 0 or pos + n > len(data) or not rec.endswith(b"\n") or b"=" not in rec:
            return None
        key, _, value = rec[:-1].partition(b"=")
        if key == b"path":
            try:
                name = value.decode("utf-8")
            except UnicodeDecodeError:
                return None
        elif key == b"size":
            if not value.isdigit():
                return None
            size = int(value)
        elif key not in _PAX_IGNORED:
            return None
        pos += n
    return name, size


class NotPlain(Exception):
    """A shard :func:`plain_members` leaves to tarfile."""


def plain_members(shard: _Shard) -> Iterator[_Member]:
    """The members of a shard made only of regular files and folders under ustar,
    GNU or PAX (path, size) headers, read straight from the header blocks (tarfile's
    parsing of each header was most of a listing's time), ending in zero blocks, one by
    one as the listing goes (a label read next to its header is in the read-ahead);
    :class:`NotPlain` at anything else (a link, a long-name or global header, a bad
    checksum, a member cut short, bytes after the end): :func:`_tarfile_members` then
    reads the shard again, with every check and skip."""
    size, pos = shard.size, 0
    pax: tuple[str | None, int | None] | None = None
    while True:
        h = shard.small(pos, 512)
        if len(h) != 512:
            raise NotPlain
        if not h.strip(b"\0"):  # the end: what follows must be zeros
            if pax or shard.small(pos, 1024).strip(b"\0"):
                raise NotPlain
            return
        magic = h[257:265]
        if magic not in _MAGICS or _octal(h[148:156]) != 256 + sum(h[:148]) + sum(h[156:]):
            raise NotPlain
        n = _octal(h[124:136])
        kind = h[156:157]
        if n is None or pos + 512 + n > size:
            raise NotPlain
        if kind == b"x":
            if pax is not None or n > MAX_HEADER_BYTES:
                raise NotPlain
            pax = _pax(shard.small(pos + 512, n))
            if pax is None:
                raise NotPlain
            pos += 512 + -(-n // 512) * 512
            continue
        if kind not in (b"0", b"\0", b"5"):
            raise NotPlain
        prefix = h[345:500].split(b"\0", 1)[0]
        if prefix and magic != _MAGICS[0]:
            raise NotPlain
        try:
            name = h[:100].split(b"\0", 1)[0].decode("utf-8")
            if prefix:
                name = prefix.decode("utf-8") + "/" + name
        except UnicodeDecodeError:
            raise NotPlain from None
        is_dir = kind == b"5" or (kind == b"\0" and name.endswith("/"))
        if pax is not None:
            name = pax[0] if pax[0] is not None else name
            n = pax[1] if pax[1] is not None else n
            pax = None
            if pos + 512 + n > size:
                raise NotPlain
        if is_dir:
            name = name.rstrip("/")
        yield _Member(name, pos + 512, n, is_dir)
        pos += 512 + (0 if is_dir else -(-n // 512) * 512)


def _index_shard(
    c: Container,
    shard: _Shard,
    opts: SourceOptions,
    found: list[Any],
    skipped: list[dict[str, str]],
) -> None:
    got: list[Any] = []
    why: list[dict[str, str]] = []
    try:
        _index_members(c, shard, opts, plain_members(shard), got, why)
    except NotPlain:
        got, why = [], []
        _index_members(c, shard, opts, _tarfile_members(c, shard, why), got, why)
    found += got
    skipped += why


def _index_members(
    c: Container,
    shard: _Shard,
    opts: SourceOptions,
    listed: Iterator[Any],
    found: list[Any],
    skipped: list[dict[str, str]],
) -> None:
    key: str | None = None
    members: dict[str, Any] = {}
    used: set[str] = set()  # locations of this shard's samples: a repeated name is one skip

    at = member_location(c.name, "")  # "NAME member ", once a shard

    def finish() -> None:
        if key is None:
            return
        img = next((members[e] for e in IMAGE_EXTS if e in members), None)
        where = at + printable(img.name if img else key)
        if img is None:
            skipped.append(
                {
                    "path": where,
                    "reason": "no image member (.jpg, .jpeg, .png or .webp) in this sample",
                }
            )
            return
        why = None
        if img.offset_data + img.size > shard.size:
            why = (
                f"cut short: the shard ends at byte {shard.size:,}, the member needs "
                f"{img.offset_data + img.size:,}"
            )
        else:
            why = capped(img.size, c.cap)
        if why is None and where in used:
            why = "a second member of the same name in this shard; only the first is read"
        used.add(where)
        label, bad = (None, None) if why else _label_of(shard, members, opts)
        why = why or bad
        if why:
            skipped.append({"path": where, "reason": why})
        else:
            found.append((where, (c, (img.offset_data, img.size)), label))

    for m in listed:
        if m.isdir():
            continue
        why = unsafe_name(m.name)
        if why is None and (m.issym() or m.islnk()):
            why = "a link member, not an image; not read"
        elif why is None and not m.isfile():
            why = "not a regular member (device or fifo); not read"
        mk = _KEY.match(m.name)
        if why is not None:
            finish()
            key, members = None, {}
            skipped.append({"path": member_location(c.name, m.name), "reason": why})
            continue
        if mk is None:
            continue  # no extension: not part of a sample
        k, ext = mk.group(1), mk.group(2).lower()
        if k != key:
            finish()
            key, members = k, {}
        members.setdefault(ext, m)
    finish()


def index_tars(items: tuple[str, ...], opts: SourceOptions, config: Any) -> Any:
    """The samples of WebDataset shards (local paths or URLs), shard by shard, in
    member order."""
    found: list[Any] = []
    skipped: list[dict[str, str]] = []
    containers: list[Container] = []
    bases = [os.path.basename(i) for i in items]
    unique = len(set(bases)) == len(bases)
    names = [base if unique else item for item, base in zip(items, bases)]
    bucket = "://" in items[0]
    if bucket:
        from .remote import object_stamp
        from .spool import plan_spool

        stamps = [object_stamp(item) for item in items]
        # a bucket's shards fetched whole, once, into the build's spool (as far as its
        # bound allows): listed there, and read there by the workers
        local = plan_spool(names, [int(s.split(":", 1)[0]) for s in stamps], opts)
    else:
        stamps = [file_stamp(item) for item in items]
        local = [""] * len(items)
    for item, name, stamp, copy in zip(items, names, stamps, local):
        containers.append(Container("tar", item, name, opts.max_image_bytes, "", stamp, copy))

    stop = threading.Event()

    def index_one(c: Container) -> tuple[list[Any], list[dict[str, str]]]:
        got: list[Any] = []
        why: list[dict[str, str]] = []
        if c.local:
            from .remote import spool_object

            spool_object(c.where, c.local, c.stamp, stop)
            shard = _Shard(c.local)
        else:
            shard = _Shard(c.where, opts._read_ahead)
        try:
            _index_shard(c, shard, opts, got, why)
        finally:
            shard.close()
        return got, why

    # a bucket's shards fetched and listed side by side (a spooled one by one streamed
    # GET, another a round trip per read-ahead block); the results joined in shard order
    threads = min(_LIST_THREADS, len(containers)) if bucket else 1
    if threads > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(threads, thread_name_prefix="imgpack-tar-list") as ex:
            try:
                parts = list(ex.map(index_one, containers))
            except BaseException:  # Ctrl-C, a shard refused: the fetches in flight end
                stop.set()  # now, not when each has its whole shard (the pool waits)
                raise
    else:
        parts = [index_one(c) for c in containers]
    for got, why in parts:
        found += got
        skipped += why
    root = Path(items[0]) if bucket else Path(items[0]).resolve()
    where = (
        items[0] if len(items) == 1 else f"{os.path.dirname(items[0]) or '.'} ({len(items)} shards)"
    )
    if not found and not skipped:
        raise InputError(f"{where}: no samples with an image (.jpg, .jpeg, .png, .webp) found")
    return finish_labels(
        found, None, where, config, root=root, kind="tar", containers=containers,
        skipped=skipped,
    )  # fmt: skip


def _open_shard(c: Container) -> _Shard:
    """A worker's shard: its copy in the build's spool, or (none, or gone) the shard."""
    if c.local:
        try:
            return _Shard(c.local)
        except OSError:
            pass
    return _Shard(c.where)


_SPAN_GAP = 64 << 10  # members this close are read in one request (headers, padding)
_SPAN_MAX = 64 << 20  # the most one request reads


def read_tar_members(c: Container, positions: list[tuple[int, int]]) -> list[Fetched]:
    """The bytes of the members at ``positions`` ((offset, size)) of shard ``c``: a run of
    nearby members in one read (one request from a bucket), each capped."""
    shard: _Shard = cached(("tar", c.where, c.stamp, c.local), lambda: _open_shard(c))
    out: list[Fetched | None] = [None] * len(positions)
    spans: list[list[int]] = []  # indices into positions, read together
    for i, (offset, size) in enumerate(positions):
        why = capped(size, c.cap)
        if why:
            out[i] = Fetched(None, why)
            continue
        if spans:
            first, last = positions[spans[-1][0]], positions[spans[-1][-1]]
            end = last[0] + last[1]
            if 0 <= offset - end <= _SPAN_GAP and offset + size - first[0] <= _SPAN_MAX:
                spans[-1].append(i)
                continue
        spans.append([i])
    for span in spans:
        base = positions[span[0]][0]
        end = max(positions[i][0] + positions[i][1] for i in span)
        try:
            data = shard.read_at(base, end - base)
        except OSError as e:
            for i in span:
                out[i] = Fetched(None, f"cannot read the shard ({e.strerror or one_line(e)})")
            continue
        for i in span:
            offset, size = positions[i]
            piece = data[offset - base : offset - base + size]
            if len(piece) != size:
                out[i] = Fetched(None, f"cut short: {len(piece):,} of {size:,} bytes in the shard")
            else:
                out[i] = Fetched(piece)
    return [f if f is not None else Fetched(None, "not read") for f in out]
