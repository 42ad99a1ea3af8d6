"""Class maps (``--classes FILE|PACK``): which class name has which index.

:func:`read_class_file` reads a text file (one class name per line, blank lines
skipped, surrounding whitespace stripped, UTF-8 with or without BOM); a pack's map is
read by :func:`packer.pack.reader.read_class_map`, which calls it for files.
:func:`resolve_classes` fixes the class -> index map: the map's order wins, classes of
the map with no images are kept (count 0), a class found in SRC but not in the map is
an error unless ``allow_new`` appends it (new ones sorted, at the end). Without a map
the classes are the sorted found names, which is ``torchvision.datasets.ImageFolder``'s
rule. :func:`apply_class_map` re-indexes a folder scan into the final map.

A class map is read only if it is a regular file (after following links): a FIFO or a
device is refused, never waited on.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from ..errors import InputError
from .common import UNLABELED, control_char, read_regular
from .scan import Entry, Scan

_MAX_CLASS_FILE_BYTES = 64 << 20
_LINE_RE = re.compile(r"\r\n|\n|\r")


def _check_unique(names: Sequence[str], where: str, line_of: Sequence[int] | None = None) -> None:
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in seen:
            if line_of is None:
                raise InputError(
                    f"{where}: class {name!r} appears twice; class names must be unique"
                )
            raise InputError(
                f"{where}: class {name!r} on line {line_of[i]} repeats line "
                f"{line_of[seen[name]]}; class names must be unique"
            )
        seen[name] = i


def read_class_file(source: str | os.PathLike[str]) -> list[str]:
    """The class names, in index order, of a class-map file (a pack's: :func:`packer.pack.reader.read_class_map`).

    ``source`` is a text file with one class name per line (UTF-8, an optional BOM,
    whitespace around a name stripped, blank lines skipped), or a pack directory whose
    manifest's ``classes`` is reused. Only the manifest's JSON is read: nothing of the
    pack is unpickled or imported. Raises :class:`InputError` naming the file and the
    problem (missing, not UTF-8, no classes, a duplicate with both line numbers).
    """
    path = Path(source)
    if not path.exists():
        raise InputError(
            f"{path}: no such class map; give a text file with one class per line or a pack"
        )
    if path.is_dir() or path.name == "imgpack.json":
        # a pack's class map is read by packer.pack.reader.read_class_map, which calls
        # this function for files: this layer knows files, not packs
        raise InputError(
            f"{path}: a folder or a pack manifest; give a text file with one class per line"
        )
    if path.suffix.lower() == ".json":
        # Read as lines, a JSON file would give "class names" like '{"format": ...'.
        raise InputError(
            f"{path}: a JSON file; give a text file with one class name per line, or a pack folder"
        )
    data = read_regular(path, _MAX_CLASS_FILE_BYTES, "a class map (one class name per line)")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputError(
            f"{path}: not UTF-8 text ({e.reason} at byte {e.start}); save the class map as UTF-8"
        ) from None
    names: list[str] = []
    lines: list[int] = []
    # Split on line ends only: any other control character is refused below, not
    # taken as a line break (str.splitlines breaks on \x1c, \x85, U+2028 ...).
    for lineno, line in enumerate(_LINE_RE.split(text), 1):
        name = line.strip()
        if name:
            bad = control_char(name)
            if bad is not None:
                raise InputError(
                    f"{path} line {lineno}: class name {name!r} holds the control character "
                    f"{bad!r}; class names are printable text"
                )
            names.append(name)
            lines.append(lineno)
    if not names:
        raise InputError(f"{path}: no class names; write one class name per line")
    _check_unique(names, str(path), lines)
    return names


def resolve_classes(
    found: Iterable[str],
    fixed: Sequence[str] | None,
    allow_new: bool = False,
    *,
    map_source: str | os.PathLike[str] | None = None,
) -> tuple[list[str], list[str]]:
    """The final class list and the classes appended to the map.

    ``found``: class names seen in the source (folders or table labels), any order.
    ``fixed``: the map from ``--classes`` (its order is the index), or None.
    Without a map: ``(sorted(found), [])``, ImageFolder's indices. With one: the map,
    plus found classes not in it appended in sorted order when ``allow_new``; otherwise
    such a class raises :class:`InputError` naming it (and ``map_source`` if given).
    Classes of the map with no images are kept, so every split shares the indices.
    """
    found_set = set(found)
    if fixed is None:
        return sorted(found_set), []
    known = set(fixed)
    new = sorted(found_set - known)
    if new and not allow_new:
        names = ", ".join(repr(c) for c in new)
        where = f" {map_source}" if map_source is not None else ""
        raise InputError(
            f"class{'es' if len(new) > 1 else ''} {names} not in the class map{where}; "
            "pass BuildConfig.allow_new_classes to append them at the end, or fix the map",
            field="BuildConfig.allow_new_classes",
        )
    return [*fixed, *new], new


def apply_class_map(scan: Scan, classes: Sequence[str]) -> Scan:
    """``scan`` with every label re-indexed from ``scan.classes`` into ``classes``.

    ``classes`` must hold every class of ``scan`` (as :func:`resolve_classes` returns);
    labels of ``-1`` (a flat folder) stay ``-1``.
    """
    index = {c: i for i, c in enumerate(classes)}
    missing = [c for c in scan.classes if c not in index]
    if missing:
        raise InputError(f"{scan.root}: classes {missing} are not in the class map")
    remap = [index[c] for c in scan.classes]
    entries = [e if e.label == UNLABELED else Entry(e.rel, remap[e.label]) for e in scan.entries]
    return Scan(root=scan.root, classes=list(classes), entries=entries, skipped=scan.skipped)
