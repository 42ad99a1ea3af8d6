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
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..._fs import loads_json
from ...errors import InputError
from ...sources.common import read_regular
from .common import (
    Container,
    Fetched,
    cached,
    capped,
    file_stamp,
    finish_labels,
    one_line,
    row_location,
)
from .options import SourceOptions

_MAX_JSON = 16 << 20  # a save_to_disk folder's state.json and dataset_info.json, at most
LABEL_NAMES = ("label", "labels", "cls", "class", "target")
_BATCH = 8  # rows per batch a worker reads: pages stream, a few images at a time


def need_pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        from ...errors import UsageError

        raise UsageError(
            "reading parquet and Arrow sources needs pyarrow: pip install 'imgpack[sources]'"
        ) from None
    return pyarrow


# ---------------------------------------------------------------- columns


def hf_features(schema: Any) -> dict[str, Any]:
    """The ``datasets`` features recorded in an Arrow schema's metadata, or {}."""
    meta = schema.metadata or {}
    raw = meta.get(b"huggingface")
    if not raw or len(raw) > 16 << 20:
        return {}
    try:
        doc = loads_json(raw)
        feats = doc.get("info", {}).get("features", {})
    except (ValueError, AttributeError):
        return {}
    return feats if isinstance(feats, dict) else {}


def _type_name(t: Any) -> str:
    return str(t).replace("\n", " ")[:60]


def _column_list(schema: Any) -> str:
    return ", ".join(f"{f.name} ({_type_name(f.type)})" for f in schema)


def _is_image_type(pa: Any, t: Any) -> bool:
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return True
    if pa.types.is_struct(t):
        idx = t.get_field_index("bytes")
        if idx >= 0:
            b = t.field(idx).type
            return pa.types.is_binary(b) or pa.types.is_large_binary(b)
    return False


def _is_label_type(pa: Any, t: Any) -> bool:
    return pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)


def pick_columns(
    schema: Any, features: dict[str, Any], opts: SourceOptions, where: str
) -> tuple[str, str | None, list[str] | None]:
    """(image column, label column or None, ClassLabel names or None) of ``schema``."""
    pa = need_pyarrow()
    types = {f.name: f.type for f in schema}
    listing = _column_list(schema)
    if opts.image_column is not None:
        if opts.image_column not in types:
            raise InputError(f"{where}: no column {opts.image_column!r}; columns: {listing}")
        if not _is_image_type(pa, types[opts.image_column]):
            raise InputError(
                f"{where}: column {opts.image_column!r} holds {_type_name(types[opts.image_column])}, "
                f"not image bytes (an Image feature or binary); columns: {listing}"
            )
        image = opts.image_column
    else:
        hf = [n for n, f in features.items() if isinstance(f, dict) and f.get("_type") == "Image"]
        cands = [n for n in hf if n in types and _is_image_type(pa, types[n])] or [
            n for n, t in types.items() if _is_image_type(pa, t)
        ]
        if len(cands) != 1:
            why = "no column holds image bytes" if not cands else f"{len(cands)} could: {cands}"
            raise InputError(
                f"{where}: cannot tell which column holds the images ({why}); columns: "
                f"{listing}; name it with SourceOptions.image_column"
            )
        image = cands[0]
    names: list[str] | None = None

    def class_names(col: str) -> list[str] | None:
        f = features.get(col)
        if isinstance(f, dict) and f.get("_type") == "ClassLabel":
            ns = f.get("names")
            if isinstance(ns, list) and all(isinstance(n, str) for n in ns):
                return ns
        return None

    if opts.label_column is not None:
        if opts.label_column not in types:
            raise InputError(f"{where}: no column {opts.label_column!r}; columns: {listing}")
        if not _is_label_type(pa, types[opts.label_column]):
            raise InputError(
                f"{where}: column {opts.label_column!r} holds "
                f"{_type_name(types[opts.label_column])}; a label column holds integers or "
                f"strings; columns: {listing}"
            )
        return image, opts.label_column, class_names(opts.label_column)
    ok = {n for n, t in types.items() if n != image and _is_label_type(pa, t)}
    classlabels = [n for n in ok if class_names(n) is not None]
    cands = sorted(classlabels) or sorted(n for n in ok if n.lower() in LABEL_NAMES)
    if len(cands) > 1:
        raise InputError(
            f"{where}: cannot tell which column holds the labels ({len(cands)} could: "
            f"{cands}); columns: {listing}; name it with SourceOptions.label_column"
        )
    if not cands:
        return image, None, None
    names = class_names(cands[0])
    return image, cands[0], names


def _label_values(pa: Any, column: Any) -> list[Any]:
    """A label column chunk as Python values (ints or strings; None for null)."""
    return column.to_pylist()


# ---------------------------------------------------------------- parquet: the parent


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
                values = _label_values(pa, pf.read_row_group(rg, columns=[label]).column(0))
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


def _image_bytes(arr: Any, i: int, cap: int) -> Fetched:
    pa = need_pyarrow()
    if not arr[i].is_valid:
        return Fetched(None, "no image (the cell is null)")
    if pa.types.is_struct(arr.type):
        if not arr.field("bytes")[i].is_valid:
            path = arr.field("path")[i].as_py() if arr.type.get_field_index("path") >= 0 else None
            named = f" (only a path, {str(path)[:200]!r}; a path is never followed)" if path else ""
            return Fetched(None, f"no image bytes in the cell{named}")
        arr = arr.field("bytes")
    buf = arr[i].as_buffer()
    why = capped(buf.size, cap)
    if why is not None:
        return Fetched(None, why)
    return Fetched(buf.to_pybytes())


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
                            out[at + i] = _image_bytes(col, i, c.cap)
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


# ---------------------------------------------------------------- Arrow (save_to_disk)


def _arrow_files(folder: Path) -> list[Path]:
    try:
        state = loads_json(read_regular(folder / "state.json", _MAX_JSON, "a state.json"))
        files = [f["filename"] for f in state["_data_files"]]
    except (ValueError, KeyError, TypeError) as e:
        raise InputError(
            f"{folder / 'state.json'}: not a datasets save_to_disk state ({one_line(e)})"
        ) from None
    out = []
    for name in files:
        if not isinstance(name, str) or "/" in name or "\\" in name or name in ("", ".", ".."):
            raise InputError(
                f"{folder / 'state.json'}: names a data file {name!r} outside the folder"
            )
        p = folder / name
        if not p.is_file() or p.is_symlink():
            raise InputError(f"{p}: listed in state.json but not a regular file here")
        out.append(p)
    if not out:
        raise InputError(f"{folder}: state.json lists no data files")
    return out


def _open_stream(pa: Any, path: str) -> Any:
    try:
        return pa.ipc.open_stream(pa.memory_map(path, "r"))
    except (pa.ArrowException, OSError, ValueError) as e:
        raise InputError(
            f"{path}: not an Arrow stream file pyarrow can read ({one_line(e)})"
        ) from None


def index_arrow(items: tuple[str, ...], opts: SourceOptions, config: Any) -> Any:
    """The images of a ``save_to_disk`` folder (or of Arrow stream files named one by
    one), in its files' and rows' order."""
    pa = need_pyarrow()
    folder = Path(items[0])
    files = _arrow_files(folder) if folder.is_dir() else [Path(i) for i in items]
    folder = folder if folder.is_dir() else folder.parent
    features: dict[str, Any] = {}
    try:
        info = loads_json(
            read_regular(folder / "dataset_info.json", _MAX_JSON, "a dataset_info.json")
        )
        features = info.get("features") or {}
    except (ValueError, AttributeError):
        pass
    found: list[tuple[str, Any, Any]] = []
    skipped: list[dict[str, str]] = []
    containers: list[Container] = []
    chosen = None
    for path in files:
        reader = _open_stream(pa, str(path))
        feats = hf_features(reader.schema) or features
        cols = pick_columns(reader.schema, feats, opts, str(path))
        chosen = chosen or cols
        image, label, _ = cols
        c = Container("arrow", str(path), path.name, opts.max_image_bytes, image, file_stamp(path))
        containers.append(c)
        row = 0
        try:
            for batch in reader:
                batch.validate(full=True)  # offsets in bounds before a worker slices
                values = batch.column(label).to_pylist() if label else [None] * batch.num_rows
                for i, v in enumerate(values):
                    found.append((row_location(path.name, row + i), (c, row + i), v))
                row += batch.num_rows
        except (pa.ArrowException, OSError, ValueError) as e:
            skipped.append(
                {
                    "path": row_location(path.name, row),
                    "reason": f"unreadable from here on ({one_line(e)})",
                }
            )
    assert chosen is not None
    # the root is a file, as for parquet: `imgpack verify` re-reads sources only from a
    # folder of image files, and these are rows
    return finish_labels(
        found, chosen[2], str(folder), config, root=files[0].resolve(), kind="arrow",
        containers=containers, skipped=skipped,
    )  # fmt: skip


class _ArrowHandle:
    def __init__(self, where: str) -> None:
        pa = need_pyarrow()
        self.table = _open_stream(pa, where).read_all()  # zero-copy over the memory map

    def close(self) -> None:
        self.table = None


def read_arrow_rows(c: Container, rows: list[int]) -> list[Fetched]:
    """The images of ``rows`` of Arrow stream file ``c`` (memory-mapped: only the
    pages of these rows are touched)."""
    h: _ArrowHandle = cached(("arrow", c.where, c.stamp), lambda: _ArrowHandle(c.where))
    col = h.table.column(c.column)
    out = []
    for r in rows:
        if r >= len(col):
            out.append(Fetched(None, "past the end of the file"))
            continue
        chunk = col.slice(r, 1).combine_chunks() if col.num_chunks > 1 else col.chunk(0).slice(r, 1)
        out.append(_image_bytes(chunk, 0, c.cap))
    return out
