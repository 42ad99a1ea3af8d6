"""A decode worker's side of the sources of :mod:`packer.builder.formats.base`: a chunk's refs
read into bytes (:func:`fetch_chunk`), then decoded by the very functions that decode
files (:func:`load_resized_item`, :func:`jpeg_for_pack_item`), so a source's pixels
are a folder's, byte for byte.

The bytes reach the decoder in memory (:func:`load_resized_bytes`,
:func:`jpeg_for_pack_bytes`): the file decoder's own code with the bytes for the file
(its size, short-JPEG and whole-image checks unchanged), nothing written anywhere. (An
anonymous file per image, opened by its ``/proc/self/fd`` path, cost about 85 us an
image: 4 % of a 500x375 JPEG's decode.)

Each worker keeps its open containers (a parquet file, a zip's directory, a tar's
descriptor, a bucket client) for the next chunk; a worker forked from the parent
never uses the parent's (a client's connections are not fork-safe).
"""

from __future__ import annotations

from typing import Any

from ...errors import DecodeError
from ...imaging.decode import (
    jpeg_for_pack,
    jpeg_for_pack_bytes,
    load_resized,
    load_resized_bytes,
)
from .common import Fetched, cached, capped

# the worker's handles and the reading helpers live in common (every reader uses them)
__all__ = ["Fetched", "cached", "capped", "fetch_chunk", "jpeg_for_pack_item", "load_resized_item"]


def fetch_chunk(paths: list[Any]) -> list[Any]:
    """A chunk's items as the decode loop takes them: file paths unchanged; refs
    (:data:`packer.builder.formats.base.Ref`) read into :class:`Fetched`, container by container,
    in the chunk's order."""
    if not paths or isinstance(paths[0], str):
        return paths
    out: list[Any] = []
    i = 0
    while i < len(paths):
        container = paths[i][0]
        j = i
        while j < len(paths) and paths[j][0] == container:
            j += 1
        out += _read(container, [p[1] for p in paths[i:j]])
        i = j
    return out


def _read(container: Any, positions: list[Any]) -> list[Fetched]:
    try:
        if container.kind == "parquet":
            from .parquet import read_parquet_rows

            return read_parquet_rows(container, positions)
        if container.kind == "arrow":
            from .parquet import read_arrow_rows

            return read_arrow_rows(container, positions)
        if container.kind == "tar":
            from .webdataset import read_tar_members

            return read_tar_members(container, positions)
        if container.kind == "zip":
            from .archive import read_zip_members

            return read_zip_members(container, positions)
        from .remote import read_objects

        return read_objects(container, positions)
    except DecodeError as e:  # the container itself failed: every image of it here
        return [Fetched(None, str(e)) for _ in positions]


def _item_bytes(item: Fetched) -> bytes:
    if item.error is not None or item.data is None:
        raise DecodeError(item.error or "no image")
    if not item.data:
        raise DecodeError("empty")
    return item.data


def load_resized_item(item: Any, spec: Any) -> Any:
    """:func:`load_resized` of a file path or of a :class:`Fetched` image."""
    if isinstance(item, str):
        return load_resized(item, spec)
    return load_resized_bytes(_item_bytes(item), spec)


def jpeg_for_pack_item(item: Any, *args: Any) -> Any:
    """:func:`jpeg_for_pack` of a file path or of a :class:`Fetched` image."""
    if isinstance(item, str):
        return jpeg_for_pack(item, *args)
    return jpeg_for_pack_bytes(_item_bytes(item), *args)
