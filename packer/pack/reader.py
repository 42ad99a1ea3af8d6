"""Open a pack read-only: :func:`open_pack` (``packer.load``) maps its files and hands
them to its kind (:mod:`packer.pack.kinds`), which wraps them as its pack class
(:class:`~packer.pack.raw.ImagePack`, :class:`~packer.pack.jpeg.JpegPack`); and
:func:`read_local_class_map` (``--classes``)."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import InputError, PackFormatError
from .files import check_files, folder_kind, read_manifest
from .index import read_index
from .jpeg import JPEG_MAX_SIDE, JpegPack, check_stored_sizes, read_max_pixels
from .kind import PACK_ATTRIBUTES, map_fields, pack_dir
from .kinds import kind_of
from .raw import image_pack_class, set_reader
from .schema import MANIFEST, Manifest

# the pack classes and the reader's bounds, importable here as before
__all__ = [
    "JPEG_MAX_SIDE",
    "PACK_ATTRIBUTES",
    "ImagePack",
    "JpegPack",
    "check_stored_sizes",
    "open_pack",
    "pack_dir",
    "read_local_class_map",
    "read_max_pixels",
]


def open_pack(
    path: str | os.PathLike[str],
    manifest: Manifest | None = None,
    *,
    max_pixels: int | None = None,
) -> ImagePack:
    """Open the single pack at ``path`` read-only, without running anything from it.

    A pack's folder only: ``packer.load`` (:func:`packer.storage.open.load`) decides
    whether a path is a pack, a set or a URL, and calls this for a pack.

    Returns an :class:`ImagePack` (``len(pack)`` is N) whose ``images``
    (uint8 [N, 3, H, W], 0-255, RGB), ``labels`` (int64 [N]) and ``targets``
    (float32 [N, K], or None) are memory-mapped copy-on-write: reads come from the
    page cache, and in-place edits stay in this process. ``pack.classes``,
    ``pack.class_to_idx``, ``pack.target_names``, ``pack.sources`` and
    ``pack.manifest`` come from the manifest. Raises PackFormatError for a
    missing, damaged, untrusted or newer-format pack, and for labels or targets
    recorded with another dtype or shape (never cast).

    ``manifest``: one already read (and its files checked) by the caller, as
    ``verify`` does, so the pack is parsed and walked once.

    ``max_pixels``: the most pixels one stored JPEG may decode to (JPEG packs and sets;
    default :data:`packer.imaging.decode.DEFAULT_MAX_PIXELS`, 100 million). The
    reader's bound: a pack's own record can lower it, never raise it. Give a pack built
    with a larger ``--max-pixels`` the same figure here.
    """
    root = Path(path)
    if manifest is None:
        manifest = read_manifest(root)
        check_files(root, manifest)
    return kind_of(manifest).open(root, manifest, map_fields(root, manifest), max_pixels=max_pixels)


# ImagePack's class-level loaders (ImagePack.load, tensordict's load_memmap) open a pack
# as this reader does: the reader sits above the kinds, so it hands itself down to them
set_reader(open_pack)
ImagePack = image_pack_class()  # torch and tensordict: the reader maps with them anyway


def read_local_class_map(source: str | os.PathLike[str]) -> list[str]:
    """The class names, in index order, of a class-map file, an existing pack or a pack
    set on this machine (``--classes FILE|PACK|SET``; a URL is
    :func:`packer.storage.open.read_class_map`'s).

    ``source`` is a text file with one class name per line
    (:func:`packer.sources.classes.read_class_file`), or a pack directory (or its
    ``imgpack.json``) whose manifest's ``classes`` is reused. Only the manifest's JSON
    is read: nothing of the pack is unpickled or imported. Raises :class:`InputError`
    naming the file and the problem.
    """
    path = Path(source)
    if path.is_dir() and folder_kind(path) == "set":  # both files: refused there
        return _set_classes(path)
    if path.is_dir():
        return _pack_classes(path)
    if path.name == MANIFEST and path.exists():
        return _pack_classes(path.parent)
    from ..sources.classes import read_class_file  # the CSV/text reader, only when asked

    return read_class_file(path)


def _set_classes(root: Path) -> list[str]:
    """The class map of a pack set's index (``--classes SET``); InputError as a pack's."""
    try:
        classes = list(read_index(root).classes)
    except PackFormatError as e:
        raise InputError(f"{e} (given as a class map)") from None
    if not classes:
        raise InputError(
            f"{root}: the set has no classes (built from a flat folder or integer labels); "
            "it cannot fix a class map"
        )
    return classes


def _pack_classes(root: Path) -> list[str]:
    from ..sources.common import control_char

    manifest = root / MANIFEST
    if not manifest.is_file():
        raise InputError(
            f"{root}: a folder but not an imgpack pack ({MANIFEST} is missing); give a pack "
            "or a text file with one class per line"
        )
    try:
        # format's reader: size-bounded, depth-guarded, the whole schema checked (class
        # names are distinct strings)
        classes = list(read_manifest(root).classes)
    except PackFormatError as e:
        raise InputError(f"{e} (given as a class map)") from None
    for i, c in enumerate(classes):
        bad = control_char(c)
        if bad is not None:
            raise InputError(
                f"{manifest}: class {i} {c!r} holds the control character {bad!r}; "
                "the pack's class map cannot be reused"
            )
    if not classes:
        raise InputError(
            f"{root}: the pack has no classes (built from a flat folder or integer labels); "
            "it cannot fix a class map"
        )
    return classes
