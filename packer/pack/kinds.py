"""The registry of storage kinds: each ``storage`` name to its kind.

The interface is :class:`~packer.pack.kind.StorageKind` (:mod:`packer.pack.kind`);
each kind lives in its own file with its pack class (:mod:`packer.pack.raw`,
:mod:`packer.pack.jpeg`). :data:`KINDS` maps a name to its kind and :func:`kind_of`
gives a manifest's (or a name's). A new kind is a subclass registered here, nothing
more. Sharded and remote packs (a pack set) are not kinds: they are lists of shards,
each opened by its kind (see docs/ARCHITECTURE.md, "Storage kinds"). No torch at import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import UsageError
from .jpeg import JPEG, JpegKind, JpegPack
from .kind import Pack, Parts, Progress, StorageKind
from .raw import RAW, RawKind, RawRows, compact_rows

if TYPE_CHECKING:
    from .schema import Manifest  # above the kinds: its fields are their answers

__all__ = [
    "KINDS",
    "JpegKind",
    "JpegPack",
    "Pack",
    "Parts",
    "Progress",
    "RawKind",
    "RawRows",
    "StorageKind",
    "UnknownKindError",
    "compact_rows",
    "kind_of",
    "kind_of_pack",
]

KINDS: dict[str, StorageKind] = {k.name: k for k in (RAW, JPEG)}
# the manifest's parser and the build's options check a name against the schema's
# STORAGE_KINDS, which lists these (tests/pack/test_kinds.py)


class UnknownKindError(UsageError, KeyError):
    """A storage name no registered kind answers to (exit code 2). A KeyError too, as
    the registry's lookup was."""

    def __str__(self) -> str:  # KeyError's str() quotes its message
        return str(self.args[0]) if self.args else ""


def kind_of(m: Manifest | str) -> StorageKind:
    """The kind of a manifest (or of a ``storage`` name). :class:`UnknownKindError`
    naming the known kinds for any other name (the manifest's parser refuses those
    first, as a PackFormatError)."""
    name = getattr(m, "storage", m)  # a manifest, or a name
    try:
        return KINDS[name]
    except (KeyError, TypeError):
        raise UnknownKindError(
            f"storage kind {name!r} is not one this imgpack knows ({', '.join(KINDS)})"
        ) from None


def kind_of_pack(pack: object) -> StorageKind:
    """The kind of a pack object (:class:`Pack`): its ``kind``; an object without one (a
    tensordict of ``images`` made by hand) holds raw rows."""
    kind = getattr(pack, "kind", RAW)
    return kind if isinstance(kind, StorageKind) else RAW
