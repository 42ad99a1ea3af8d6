"""Parquet page headers, read without pyarrow (a Thrift compact-protocol walk):
:func:`largest_page` gives the largest page of a column chunk from its page headers (a
few bytes each), so a worker skips a row group holding a page larger than the per-image
cap unread (:func:`packer.builder.formats.parquet.row_group_guard`). Malformed headers
raise ValueError; nesting and lengths are bounded.
"""

from __future__ import annotations

from typing import Any

# ---------------------------------------------------------------- parquet: a worker


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("page header runs past what was read")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _zigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _skip(buf: bytes, pos: int, t: int, depth: int) -> int:
    """Past one Thrift compact value of type ``t`` at ``pos``."""
    if depth > 16:
        raise ValueError("page header nests too deep")
    if t in (1, 2):
        return pos
    if t == 3:
        return pos + 1
    if t in (4, 5, 6):
        return _varint(buf, pos)[1]
    if t == 7:
        return pos + 8
    if t == 8:
        n, pos = _varint(buf, pos)
        return pos + n
    if t in (9, 10):
        if pos >= len(buf):
            raise ValueError("page header runs past what was read")
        h = buf[pos]
        pos += 1
        n, et = h >> 4, h & 0x0F
        if n == 15:
            n, pos = _varint(buf, pos)
        for _ in range(n):
            pos = pos + 1 if et in (1, 2) else _skip(buf, pos, et, depth + 1)
            if pos > len(buf):
                raise ValueError("page header runs past what was read")
        return pos
    if t == 11:
        n, pos = _varint(buf, pos)
        if n:
            kv = buf[pos]
            pos += 1
            for _ in range(n):
                pos = _skip(buf, pos, kv >> 4, depth + 1)
                pos = _skip(buf, pos, kv & 0x0F, depth + 1)
                if pos > len(buf):
                    raise ValueError("page header runs past what was read")
        return pos
    if t == 12:
        return _struct(buf, pos, depth + 1, None)
    raise ValueError(f"page header has an unknown field type {t}")


def _struct(buf: bytes, pos: int, depth: int, sizes: dict[int, int] | None) -> int:
    last = 0
    while True:
        if pos >= len(buf):
            raise ValueError("page header runs past what was read")
        b = buf[pos]
        pos += 1
        if b == 0:
            return pos
        delta, t = b >> 4, b & 0x0F
        if delta:
            fid = last + delta
        else:
            raw, pos = _varint(buf, pos)
            fid = _zigzag(raw)
        last = fid
        if sizes is not None and fid in (2, 3) and t == 5:
            raw, pos = _varint(buf, pos)
            sizes[fid] = _zigzag(raw)
        else:
            pos = _skip(buf, pos, t, depth)


_HEADER_READ = 64 << 10


def largest_page(read_at: Any, start: int, end: int) -> int:
    """The largest page (compressed or not, in bytes) of the column chunk at bytes
    [start, end), from its page headers alone. ``read_at(offset, n)`` reads the file.
    ValueError for a header that cannot be parsed."""
    pos, largest, pages = start, 0, 0
    while pos < end:
        buf = read_at(pos, min(_HEADER_READ, end - pos))
        sizes: dict[int, int] = {}
        hlen = _struct(buf, 0, 0, sizes)
        usize, csize = sizes.get(2, -1), sizes.get(3, -1)
        if usize < 0 or csize < 0:
            raise ValueError("a page header without its sizes")
        largest = max(largest, usize, csize)
        pos += hlen + csize
        pages += 1
    if pos != end:
        raise ValueError("the pages overrun their column chunk")
    return largest
