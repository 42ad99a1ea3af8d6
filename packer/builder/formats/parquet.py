"""Parquet shards and ``datasets`` ``save_to_disk`` folders (Arrow) as build sources.

The image column is the ``datasets`` ``Image`` feature (a struct of ``bytes`` and
``path``) or a binary column; the label column a ``ClassLabel`` (its names are the class
map, in their order), or integers, or strings (a label table's rules). Where the schema
does not say, ``--image-column`` / ``--label-column`` name them, and the error lists the
columns.

Memory stays bounded: the parent reads each file's footer and its label column, one
row group at a time; a worker reads only its chunk's row groups, in small batches, and
never a page larger than the per-image cap (``SourceOptions.max_image_bytes``): when a row group's
image column is larger than the cap, its page headers are read first (a few bytes
each), and a row group holding a larger page is skipped unread, with its rows named.
A footer that points past the end of the file, or that pyarrow cannot read, is a
one-line error (exit 2); a row group whose data lies past the end is skipped.

The parts: ``table_columns`` (picking the image and label columns), ``parquet_pages``
(page headers), ``arrow`` (``save_to_disk`` folders). This module reads parquet.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ...errors import InputError
from .arrow import index_arrow, read_arrow_rows
from .common import (
    Container,
    Fetched,
    cached,
    file_stamp,
    finish_labels,
    one_line,
    row_location,
)
from .options import SourceOptions
from .parquet_pages import largest_page
from .table_columns import hf_features, image_bytes, label_values, need_pyarrow, pick_columns

# what other modules import from here (Arrow folders: .arrow; page headers: .parquet_pages)
__all__ = [
    "_chunk_span",
    "index_arrow",
    "index_parquet",
    "largest_page",
    "read_arrow_rows",
    "read_parquet_rows",
]

# ---------------------------------------------------------------- parquet: the parent

_BATCH = 8  # rows per batch a worker reads: pages stream, a few images at a time


def _open_parquet(where: str) -> Any:
    """A ParquetFile reading ``where`` (a path or URL) without pre-buffering whole
    column chunks: pages stream through a small buffer."""
    pa = need_pyarrow()
    import pyarrow.parquet as pq

    if "://" in where:
        from .remote import open_range

        source: Any = open_range(where)
    else:
        source = where
    try:
        return pq.ParquetFile(source, pre_buffer=False, buffer_size=1 << 20)
    except (pa.ArrowException, OSError, ValueError) as e:
        raise InputError(f"{where}: not a parquet file pyarrow can read ({one_line(e)})") from None


def _leaf_chunks(md: Any, rg: int, column: str) -> list[Any]:
    g = md.row_group(rg)
    out = []
    for j in range(g.num_columns):
        c = g.column(j)
        p = c.path_in_schema
        if p == column or p.startswith(column + "."):
            out.append(c)
    return out


def _chunk_span(c: Any) -> tuple[int, int]:
    start = c.data_page_offset
    if c.has_dictionary_page and c.dictionary_page_offset and c.dictionary_page_offset > 0:
        start = min(start, c.dictionary_page_offset)
    return start, start + c.total_compressed_size


def bad_row_group(md: Any, rg: int, columns: list[str], size: int) -> str | None:
    """Why row group ``rg``'s data cannot be where its footer says, or None."""
    for col in columns:
        for c in _leaf_chunks(md, rg, col):
            start, end = _chunk_span(c)
            if start < 4 or c.total_compressed_size < 0 or end > size:
                return (
                    f"row group {rg}: its column {c.path_in_schema!r} lies past the end of the "
                    f"file (bytes {start:,} to {end:,} of {size:,}: truncated or corrupt)"
                )
    return None


def index_parquet(paths: list[Any], opts: SourceOptions, config: Any) -> Any:
    """The images of parquet files (local paths or URLs), in file then row order."""
    need_pyarrow()
    found: list[tuple[str, Any, Any]] = []
    skipped: list[dict[str, str]] = []
    containers: list[Container] = []
    chosen: tuple[str, str | None, list[str] | None] | None = None
    items = [str(p) for p in paths]
    bases = [os.path.basename(i) for i in items]
    unique = len(set(bases)) == len(bases)
    for where, base in zip(items, bases):
        name = base if unique else where
        if "://" in where:
            from .remote import object_stamp

            stamp = object_stamp(where)
            size = int(stamp.split(":", 1)[0])
        else:
            stamp, size = file_stamp(where), os.path.getsize(where)
        pf = _open_parquet(where)
        try:
            cols = pick_columns(pf.schema_arrow, hf_features(pf.schema_arrow), opts, where)
            if chosen is None:
                chosen = cols
            elif cols[:2] != chosen[:2]:
                raise InputError(
                    f"{where}: its image and label columns {cols[:2]} differ from the first "
                    f"file's {chosen[:2]}; name them with SourceOptions.image_column and SourceOptions.label_column"
                )
            image, label, _ = cols
            c = Container("parquet", where, name, opts.max_image_bytes, image, stamp)
            containers.append(c)
            _index_file(pf, c, label, size, found, skipped)
        finally:
            pf.close()
    assert chosen is not None
    first = items[0]
    root = Path(first) if "://" in first else Path(first).resolve()
    where = (
        first
        if len(items) == 1
        else f"{os.path.dirname(first) or '.'} ({len(items)} parquet files)"
    )
    return finish_labels(
        found, chosen[2], where, config, root=root, kind="parquet",
        containers=containers, skipped=skipped,
    )  # fmt: skip


def _index_file(
    pf: Any,
    c: Container,
    label: str | None,
    size: int,
    found: list[tuple[str, Any, Any]],
    skipped: list[dict[str, str]],
) -> None:
    pa = need_pyarrow()
    md = pf.metadata
    row = 0
    for rg in range(md.num_row_groups):
        n = md.row_group(rg).num_rows
        if n < 0:
            raise InputError(f"{c.where}: row group {rg} has {n} rows; the footer is corrupt")
        why = bad_row_group(md, rg, [c.column] + ([label] if label else []), size)
        values: list[Any] = [None] * n
        if why is None and label is not None:
            try:
                values = label_values(pa, pf.read_row_group(rg, columns=[label]).column(0))
            except (pa.ArrowException, OSError, ValueError) as e:
                why = f"row group {rg}: its labels cannot be read ({one_line(e)})"
        if why is not None:
            skipped.append(
                {
                    "path": row_location(c.name, row),
                    "reason": f"{why}; rows {row:,} to {row + n - 1:,} skipped",
                }
            )
        else:
            for i, v in enumerate(values):
                found.append((row_location(c.name, row + i), (c, row + i), v))
        row += n


def _read_at_fn(pf_source: Any) -> Any:
    def read_at(offset: int, n: int) -> bytes:
        pf_source.seek(offset)
        return pf_source.read(n)

    return read_at


def row_group_guard(c: Container, md: Any, rg: int, raw: Any) -> str | None:
    """Why row group ``rg``'s image column must not be read within the per-image cap
    (a page larger than it, or unparseable page headers), or None. ``raw``: a binary
    file object of the parquet file (page headers are read through it)."""
    chunks = _leaf_chunks(md, rg, c.column)
    if (
        sum(x.total_uncompressed_size for x in chunks) <= c.cap
        and sum(x.total_compressed_size for x in chunks) <= c.cap
    ):
        return None  # no page can be larger than the whole chunk
    read_at = _read_at_fn(raw)
    for x in chunks:
        start, end = _chunk_span(x)
        try:
            big = largest_page(read_at, start, end)
        except (ValueError, IndexError, OSError) as e:
            return f"row group {rg}: its page headers cannot be read ({one_line(e)}); not read"
        if big > c.cap + (1 << 20):
            return (
                f"row group {rg} stores its images in a page of {big:,} bytes, over the "
                f"per-image limit of {c.cap:,}; not read"
            )
    return None


class _ParquetHandle:
    def __init__(self, where: str) -> None:
        self.pf = _open_parquet(where)
        md = self.pf.metadata
        self.starts = [0]
        for rg in range(md.num_row_groups):
            self.starts.append(self.starts[-1] + md.row_group(rg).num_rows)
        self.guards: dict[tuple[int, str, int], str | None] = {}
        self.where = where
        self._raw: Any = None

    def raw(self) -> Any:
        if self._raw is None:
            if "://" in self.where:
                from .remote import open_range

                self._raw = open_range(self.where)
            else:
                self._raw = open(self.where, "rb")  # noqa: SIM115 (kept open per worker)
        return self._raw

    def close(self) -> None:
        self.pf.close()
        if self._raw is not None:
            self._raw.close()


def read_parquet_rows(c: Container, rows: list[int]) -> list[Fetched]:
    """The images of ``rows`` (ascending) of parquet container ``c``."""
    import bisect

    pa = need_pyarrow()
    h: _ParquetHandle = cached(("parquet", c.where, c.stamp), lambda: _ParquetHandle(c.where))
    out: dict[int, Fetched] = {}
    by_group: dict[int, list[int]] = {}
    for r in rows:
        by_group.setdefault(bisect.bisect_right(h.starts, r) - 1, []).append(r)
    md = h.pf.metadata
    for rg, want in by_group.items():
        key = (rg, c.column, c.cap)  # the handle outlives a build: another cap, another answer
        if key not in h.guards:
            h.guards[key] = row_group_guard(c, md, rg, h.raw())
        if (why := h.guards[key]) is not None:
            for r in want:
                out[r] = Fetched(None, why)
            continue
        first, last, base = min(want), max(want), h.starts[rg]
        wanted = set(want)
        try:
            at = base
            for batch in h.pf.iter_batches(
                batch_size=_BATCH, row_groups=[rg], columns=[c.column], use_threads=False
            ):
                n = batch.num_rows
                if at + n > first:
                    col = batch.column(0)
                    for i in range(max(0, first - at), min(n, last - at + 1)):
                        if at + i in wanted:
                            out[at + i] = image_bytes(col, i, c.cap)
                at += n
                if at > last:
                    break
        except (pa.ArrowException, OSError, ValueError, MemoryError) as e:
            why = f"row group {rg} cannot be read ({one_line(e)})"
            for r in want:
                out.setdefault(r, Fetched(None, why))
        for r in want:
            out.setdefault(r, Fetched(None, f"row group {rg} ends before this row"))
    return [out[r] for r in rows]
