"""The pack set on disk: its index schema and version, in one place.

A pack set is a directory of immutable shards, each a complete pack (see
:mod:`packer.pack.schema`), plus an index written last, atomically: the commit point.
A reader that finds the index finds every shard it names complete::

    SET/
      imgpack-set.json           the index: :class:`SetIndex`
      00000-3f9a0c1e5b7d2a64/    shard 0, a complete pack (``packer.load`` opens it alone)
      00001-c04e1d9a7f3b8e21/    shard 1, ...

A shard's name is its position and a hash of its inputs (relative paths, sizes,
mtimes, labels, targets) and of the build options, so the same inputs give the same
name and bytes. The index pins each shard by its image count, its data bytes and the
SHA-256 of its manifest's bytes; the manifest holds the SHA-256 of every block of the
shard's data, so the hash pins the shard's bytes without reading them.

The index is read only through :func:`read_index` (bounded read, every field checked)
and each shard's manifest through :func:`read_shard_manifest`, which refuses a name
that is not a plain folder name of the set, a link, a missing shard, and a count,
byte total or hash that differs, naming the shard. This module needs no torch.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import PackFormatError
from .files import (
    JSONNestingError,
    folder_kind,
    loads_json,
    read_bounded,
    write_json_atomic,
)
from .kinds import kind_of
from .schema import (
    MANIFEST,
    MAX_COUNT,
    MAX_MANIFEST_BYTES,
    SET_INDEX,
    STORAGE_KINDS,
    Manifest,
    Skip,
)

INDEX = SET_INDEX  # the index's file name (defined in schema, with the pack's)
SET_FORMAT = "imgpack-set"
SET_VERSION = 1
# ~150 bytes per shard and ~100 per skipped input: a set of 1M shards stays well under
MAX_INDEX_BYTES = 256 << 20
# a shard's folder name: a plain name, never "." or "..", no separator (checked again
# with the filesystem: the folder must be a real directory of the set, not a link)
SHARD_NAME = re.compile(r"[0-9A-Za-z][0-9A-Za-z_.-]{0,127}")
# the build options a shard's bytes depend on, recorded once in the index; --append
# must give the same (the shard size is not one: it only decides where shards end)
OPTION_KEYS = ("size", "resize", "max_pixels", "store", "quality", "max_side", "device")
_HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class ShardEntry:
    """One shard of a set: its folder name, image count, data bytes (the data files its
    manifest lists, at the sizes it gives) and the SHA-256 of its manifest's bytes."""

    name: str
    count: int
    bytes: int
    sha256: str


@dataclass(frozen=True)
class SetIndex:
    """The index of a pack set (``imgpack-set.json``), typed.

    ``image_shape``: (3, H, W) of every image (raw), or the largest stored image over
    all shards (jpeg). ``classes``/``targets``: the class map and target column names
    every shard shares. ``options``: the build options (:data:`OPTION_KEYS`).
    ``skipped``: inputs the set does not hold (unreadable, or a shard of which no image
    decoded); the shards' manifests list the images each build skipped.
    """

    count: int
    image_shape: tuple[int, int, int]
    storage: str
    classes: tuple[str, ...]
    shards: tuple[ShardEntry, ...]
    options: Mapping[str, Any]
    shard_size: int
    targets: tuple[str, ...] = ()
    skipped: tuple[Skip, ...] = ()
    version: int = SET_VERSION

    @property
    def class_to_idx(self) -> dict[str, int]:
        return {c: i for i, c in enumerate(self.classes)}

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": SET_FORMAT,
            "version": self.version,
            "count": self.count,
            "image_shape": list(self.image_shape),
            "storage": self.storage,
            "classes": list(self.classes),
            "targets": list(self.targets),
            "options": dict(self.options),
            "shard_size": self.shard_size,
            "shards": [
                {"name": s.name, "count": s.count, "bytes": s.bytes, "sha256": s.sha256}
                for s in self.shards
            ],
            "skipped": [{"path": s.path, "reason": s.reason} for s in self.skipped],
        }

    @classmethod
    def from_json(cls, obj: Any, where: str) -> SetIndex:
        """Validate a parsed index; PackFormatError naming ``where`` and the field."""
        try:
            return _parse(obj)
        except _Bad as e:
            raise PackFormatError(f"{where}: {e}") from None


class _Bad(Exception):
    pass


def _want(ok: bool, what: str) -> None:
    if not ok:
        raise _Bad(what)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _parse_shard(k: int, s: Any) -> ShardEntry:
    """Entry ``k`` of the index's ``shards`` list, checked."""
    _want(
        isinstance(s, dict) and set(s) == {"name", "count", "bytes", "sha256"},
        f"shard {k}: must be {{name, count, bytes, sha256}}",
    )
    name = s["name"]
    _want(
        isinstance(name, str) and SHARD_NAME.fullmatch(name) is not None,
        f"shard {k}: name {name!r} is not a plain folder name of the set (no '/', "
        "'..' or absolute path); refusing the set",
    )
    _want(
        _is_int(s["count"]) and 1 <= s["count"] <= MAX_COUNT,
        f"shard {name!r}: count {s['count']!r} is not a positive count",
    )
    _want(
        _is_int(s["bytes"]) and 0 <= s["bytes"] <= 1 << 56,
        f"shard {name!r}: bytes {s['bytes']!r} is not a byte count",
    )
    _want(
        isinstance(s["sha256"], str) and _HEX64.fullmatch(s["sha256"]) is not None,
        f"shard {name!r}: sha256 is not a SHA-256 hex digest",
    )
    return ShardEntry(name, s["count"], s["bytes"], s["sha256"])


def _parse(m: Any) -> SetIndex:
    _want(isinstance(m, dict) and m.get("format") == SET_FORMAT, "not an imgpack set index")
    version = m.get("version")
    _want(_is_int(version) and version >= 1, "field 'version' is missing or not a version")
    _want(
        version <= SET_VERSION,
        f"made by a newer imgpack (set format {version}, this one reads up to "
        f"{SET_VERSION}); upgrade imgpack",
    )
    n = m.get("count")
    _want(_is_int(n) and 0 <= n <= MAX_COUNT, "field 'count' is missing or not a count")
    shape = m.get("image_shape")
    _want(
        isinstance(shape, list)
        and len(shape) == 3
        and shape[0] == 3
        and all(_is_int(v) and 0 < v <= 65536 for v in shape),
        f"field 'image_shape' must be [3, H, W], not {shape!r}",
    )
    storage = m.get("storage")
    _want(
        storage in STORAGE_KINDS,
        f"storage {storage!r} is not one this imgpack reads ({', '.join(STORAGE_KINDS)})",
    )
    classes = m.get("classes")
    _want(
        isinstance(classes, list) and all(isinstance(c, str) for c in classes),
        "field 'classes' must be a list of names",
    )
    _want(len(set(classes)) == len(classes), "class names must be distinct")
    targets = m.get("targets", [])
    _want(
        isinstance(targets, list) and all(isinstance(c, str) and c for c in targets),
        "field 'targets' must be a list of column names",
    )
    options = m.get("options")
    _want(
        isinstance(options, dict) and set(options) == set(OPTION_KEYS),
        f"field 'options' must hold exactly {', '.join(OPTION_KEYS)}",
    )
    _want(
        isinstance(options["size"], list)
        and len(options["size"]) == 2
        and all(_is_int(v) and v > 0 for v in options["size"])
        and all(isinstance(options[k], str) for k in ("resize", "store", "device"))
        and all(_is_int(options[k]) for k in ("max_pixels", "quality"))
        and (options["max_side"] is None or _is_int(options["max_side"])),
        f"field 'options' has a value of the wrong type: {options!r}",
    )
    _want(options["store"] == storage, "options.store and storage differ")
    shard_size = m.get("shard_size")
    _want(_is_int(shard_size) and shard_size > 0, "field 'shard_size' must be a positive integer")
    raw_shards = m.get("shards")
    _want(isinstance(raw_shards, list) and raw_shards, "field 'shards' must list the shards")
    shards = [_parse_shard(k, s) for k, s in enumerate(raw_shards)]
    names: set[str] = set()
    for s in shards:  # a set: linear in the shard count (issue 42.13)
        _want(s.name not in names, f"shard {s.name!r} is listed twice")
        names.add(s.name)
    total = sum(s.count for s in shards)
    _want(total == n, f"the shards hold {total} images, field 'count' says {n}")
    skipped = m.get("skipped", [])
    _want(
        isinstance(skipped, list)
        and all(
            isinstance(s, dict)
            and isinstance(s.get("path"), str)
            and isinstance(s.get("reason"), str)
            for s in skipped
        ),
        "field 'skipped' must hold {path, reason} objects of strings",
    )
    return SetIndex(
        count=n,
        image_shape=(shape[0], shape[1], shape[2]),
        storage=storage,
        classes=tuple(classes),
        shards=tuple(shards),
        options=dict(options),
        shard_size=shard_size,
        targets=tuple(targets),
        skipped=tuple(Skip(s["path"], s["reason"]) for s in skipped),
        version=version,
    )


# ---------------------------------------------------------------- files


def is_set(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a folder holding a set index (a committed pack set), by
    :func:`folder_kind` (PackFormatError for a folder that also holds a manifest)."""
    return folder_kind(path) == "set" and os.path.isfile(os.path.join(path, INDEX))


def write_index(root: Path, index: SetIndex) -> None:
    """Write the index into ``root`` (temporary name, fsync, rename, fsync of the
    folder): the commit point of a set build, whole or absent."""
    write_json_atomic(Path(root) / INDEX, index.to_json())
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_index(root: str | os.PathLike[str]) -> SetIndex:
    """Read and validate the index of the set at ``root`` (bounded, nesting-guarded).
    Raises PackFormatError naming the set and the problem."""
    root = Path(root)
    folder_kind(root)  # a folder that is also a pack is refused, as everywhere
    try:
        data = read_bounded(root, root / INDEX, MAX_INDEX_BYTES, head=b"{[")
    except FileNotFoundError:
        raise PackFormatError(
            f"{root}: not a pack set ({INDEX} is missing); build one with "
            "`imgpack build --shard-size SIZE`"
        ) from None
    try:
        raw = loads_json(data)
    except JSONNestingError:
        raise PackFormatError(f"{root}: {INDEX} is nested too deeply to be an index") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise PackFormatError(
            f"{root}: {INDEX} is not valid JSON ({e}); the set is damaged"
        ) from None
    return SetIndex.from_json(raw, where=f"{root}: {INDEX}")


def manifest_digest(data: bytes) -> str:
    """A shard's content hash: SHA-256 of its manifest's bytes (which hold the SHA-256
    of every block of its data, its labels and targets)."""
    return hashlib.sha256(data).hexdigest()


def data_bytes(m: Manifest) -> int:
    """Bytes of a pack's data files, as its manifest gives them."""
    return sum((m.count if f.rows is None else f.rows) * f.row_bytes for f in m.fields)


def shard_root(root: Path, entry: ShardEntry) -> Path:
    """The folder of ``entry`` in the set at ``root``, once it is known to be a real
    folder inside the set: a link (wherever it points), a file or a missing folder is
    refused with PackFormatError naming the shard."""
    where = f"{root}: shard {entry.name!r}"
    if SHARD_NAME.fullmatch(entry.name) is None:  # from_json checked; kept for any caller
        raise PackFormatError(f"{where}: not a plain folder name of the set; refusing the set")
    path = root / entry.name
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise PackFormatError(
            f"{where} is missing; the set is incomplete (rerun the build that made it)"
        ) from None
    except OSError as e:
        raise PackFormatError(f"{where} cannot be read ({e.strerror})") from None
    if stat.S_ISLNK(st.st_mode):
        raise PackFormatError(
            f"{where} is a symbolic link (to {os.readlink(path)!r}); a set's shards are "
            "folders inside it, refusing the set"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise PackFormatError(f"{where} is not a folder; the set is damaged")
    if not path.resolve().is_relative_to(root.resolve()):
        raise PackFormatError(f"{where} leaves the set; refusing it")
    return path


def read_shard_manifest(root: Path, entry: ShardEntry, index: SetIndex) -> Manifest:
    """The manifest of shard ``entry``, read once and checked against the index: its
    SHA-256, count and data bytes, and the set's storage, class map, targets, shape and
    resize. PackFormatError naming the shard for any difference."""
    path = shard_root(root, entry)
    where = f"{root}: shard {entry.name!r}"
    folder_kind(path)  # a shard that is also a set is refused, as everywhere
    try:
        data = read_bounded(path, path / MANIFEST, MAX_MANIFEST_BYTES, head=b"{[")
    except FileNotFoundError:
        raise PackFormatError(f"{where}: {MANIFEST} is missing; the shard is incomplete") from None
    if manifest_digest(data) != entry.sha256:
        raise PackFormatError(
            f"{where}: {MANIFEST} does not match the SHA-256 the index gives; the shard was "
            "changed or replaced, rebuild the set"
        )
    try:
        raw = loads_json(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise PackFormatError(f"{where}: {MANIFEST} is not valid JSON ({e})") from None
    m = Manifest.from_json(raw, where=f"{where}: {MANIFEST}")
    _want_shard(
        m.count == entry.count, where, f"holds {m.count} images, the index says {entry.count}"
    )
    got = data_bytes(m)
    _want_shard(
        got == entry.bytes, where, f"has {got:,} data bytes, the index says {entry.bytes:,}"
    )
    _want_shard(
        m.storage == index.storage, where, f"stores {m.storage!r}, the set {index.storage!r}"
    )
    _want_shard(m.classes == index.classes, where, "has another class map than the set")
    _want_shard(m.targets == index.targets, where, "has other target columns than the set")
    _want_shard(m.resize == index.options["resize"], where, "was built with another resize")
    _want_shard(
        kind_of(index.storage).shape_fits(m.image_shape, index.image_shape),
        where,
        f"has images of {list(m.image_shape)}, the set {list(index.image_shape)}",
    )
    return m


def _want_shard(ok: bool, where: str, what: str) -> None:
    if not ok:
        raise PackFormatError(f"{where}: {what}; the set is damaged, rebuild it")
