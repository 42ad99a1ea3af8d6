"""Where the data is, decided once (issue 45.4): :func:`where` says whether a path is an
object-storage URL, a pack set's folder (or a set's folder in the object-storage cache)
or a single pack, and :func:`load` (``packer.load``), :func:`describe` (``imgpack info``)
and :func:`read_class_map` (``--classes``) follow it; ``packer.verify_pack``
(:mod:`packer.measure.verify_pack`) asks it too. Below this edge no module asks whether
a string is a URL or a folder a set: :func:`packer.pack.reader.open_pack` opens one
local pack, :func:`packer.storage.packset.open_set` one local set,
:func:`packer.storage.remote.open_remote` one URL.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..errors import UsageError
from ..pack.files import folder_kind
from .url import is_url, redact

# a set's folder in the object-storage cache holds this file (cache.META_DIR /
# remote.POINTER), spelt out so that deciding where a path is imports neither
_POINTER = (".imgpack-cache", "url")


@dataclass(frozen=True)
class Where:
    """What a path names: ``kind`` ``"url"`` (``path`` the URL, a str), ``"set"`` (a
    local set's folder), or ``"pack"`` (a single pack's folder, or whatever else is
    there: its reader says what is wrong). ``cached``: a set's folder in the
    object-storage cache (a DataLoader worker reopening a PackDataset's path)."""

    kind: Literal["url", "set", "pack"]
    path: str | Path
    cached: bool = False


def where(path: str | os.PathLike[str]) -> Where:
    """Decide once what ``path`` is. A URL only as a ``str`` (``s3://``, ``gs://``,
    ``az://``); a URL that pathlib folded (``Path("s3://b/p")`` is ``s3:/b/p``) is a
    UsageError saying so. PackFormatError for a folder that holds both a set index and
    a pack manifest (:func:`packer.pack.files.folder_kind`)."""
    if is_url(path):
        return Where("url", str(path))
    root = Path(path)
    if str(root).startswith(("s3:/", "gs:/", "az:/")) and not root.exists():
        raise UsageError(
            f"{redact(str(root))}: looks like an object-storage URL folded by pathlib (its "
            "'//' became '/'); pass the URL as a str, e.g. packer.load('s3://bucket/prefix')"
        )
    cached = root.joinpath(*_POINTER).is_file()
    kind = folder_kind(root) if root.is_dir() else None
    return Where("set" if kind == "set" else "pack", root, cached)


def load(
    path: str | os.PathLike[str],
    manifest: Any = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | None = None,
    max_pixels: int | None = None,
) -> Any:
    """``packer.load``: the pack, set or URL at ``path`` opened read-only, without
    running anything from it: an :class:`~packer.pack.reader.ImagePack` or
    :class:`~packer.pack.reader.JpegPack` for a pack, a
    :class:`~packer.storage.packset.PackSet` for a set or an object-storage URL
    (``s3://bucket/prefix``, gs://, az://; opened through a local cache:
    ``cache_dir``, default the user's cache folder, and ``cache_limit`` in bytes apply
    to URLs only).

    A pack's ``images``, ``labels`` and ``targets`` are memory-mapped copy-on-write
    (see :func:`packer.pack.reader.open_pack`). Raises PackFormatError for a missing,
    damaged, untrusted or newer-format pack or set.

    ``manifest``: one already read (and its files checked) by the caller, as
    ``verify`` does: ``path`` is then a single pack, parsed and walked once.

    ``max_pixels``: the most pixels one stored JPEG may decode to (JPEG packs and sets;
    default :data:`packer.imaging.decode.DEFAULT_MAX_PIXELS`, 100 million). The
    reader's bound: a pack's own record can lower it, never raise it.
    """
    from ..pack.reader import open_pack, read_max_pixels

    if manifest is not None:
        return open_pack(path, manifest, max_pixels=max_pixels)
    w = where(path)
    if w.kind == "url":
        from ..imaging.decode import DEFAULT_MAX_PIXELS

        if read_max_pixels(max_pixels) != DEFAULT_MAX_PIXELS:
            raise UsageError(
                "max_pixels= applies to packs and sets on this machine; a set in object "
                "storage is read with the default bound"
            )
        from .remote import open_remote  # obstore: only for a URL

        return open_remote(str(w.path), cache_dir, cache_limit)
    if w.cached:
        from .remote import reopen_cached

        return reopen_cached(Path(w.path))
    if w.kind == "set":
        from .packset import open_set

        return open_set(w.path, max_pixels=max_pixels)
    return open_pack(w.path, max_pixels=max_pixels)


def describe(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What ``imgpack info --json`` prints for the pack, set or URL at ``path``:
    :func:`packer.pack.describe.describe` of a pack,
    :func:`~packer.pack.describe.describe_set` of a set, and
    :func:`packer.storage.remote.describe_remote` of a URL (the index and small files
    fetched). Reads JSON and file sizes only: no torch, no data mapped."""
    w = where(path)
    if w.kind == "url":
        from .remote import describe_remote

        return describe_remote(str(w.path))
    from ..pack.describe import describe as describe_pack
    from ..pack.describe import describe_set

    out = describe_set(w.path) if w.kind == "set" else describe_pack(w.path)
    out["path"] = str(path)
    return out


def read_class_map(source: str | os.PathLike[str]) -> list[str]:
    """``--classes FILE|PACK|SET|URL``: the class names, in index order, of a class-map
    file, a pack, a pack set, or any of these at an object-storage URL
    (:func:`packer.storage.remote.read_remote_class_map`). Only JSON and text are read:
    nothing is unpickled or imported. InputError naming the file and the problem."""
    if is_url(source):
        from .remote import read_remote_class_map

        return read_remote_class_map(str(source))
    from ..pack.reader import read_local_class_map

    return read_local_class_map(source)
