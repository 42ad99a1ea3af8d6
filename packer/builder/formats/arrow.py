"""``datasets`` ``save_to_disk`` folders (Arrow streams) as build sources: the parent
lists a folder's ``.arrow`` files (``state.json`` read within a cap) and indexes each
stream's label column batch by batch (:func:`index_arrow`); a worker reads only its
rows' images (:func:`read_arrow_rows`), each within the per-image cap. Columns are picked
as for parquet (:mod:`packer.builder.formats.table_columns`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..._fs import loads_json
from ...errors import InputError
from ...sources.common import read_regular
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
from .table_columns import hf_features, image_bytes, need_pyarrow, pick_columns

_MAX_JSON = 16 << 20  # a save_to_disk folder's state.json and dataset_info.json, at most


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
        out.append(image_bytes(chunk, 0, c.cap))
    return out
