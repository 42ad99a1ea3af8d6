"""Labels people actually have: a fixed class map, labels from a table, float targets.

Three sources of labels, all ending in the same two arrays per pack:

* ``labels``  int64 ``[N]``: a class index in ``[0, len(classes))``, or ``-1`` for an
  image without a label (a flat folder, or a table row whose label is ``-1``).
* ``targets`` float32 ``[N, K]`` (optional): the numeric table columns named by
  ``--targets``, in that order; any finite float32 value.

Class maps (``--classes FILE|PACK``) are :mod:`packer.sources.classes`'s; label tables
(``--labels TABLE [--targets COL,...]``) are read by :mod:`packer.sources.tables`, their
cells checked by :mod:`packer.sources.cells`. This module matches a table's rows to
the images found under SRC.

:func:`apply_table` keeps the found order (ImageFolder's sorted order, as
:func:`list_source_images` returns it), not the table's, so reordering a table does
not reorder the pack. A row matches the file it writes exactly, else the one file
whose name differs only in Unicode form (NFC vs NFD); when several files fold to it,
or two rows reach one file, the build is refused. Rows whose file is not found are
skips with a reason (the first :data:`MAX_MISSING_LISTED`; the rest are counted) and
name no class: without a map, the classes are those of the rows that matched an
image. Images with no row are ignored and counted.

Manifest fields (the schema is :mod:`packer.pack.schema`'s: :class:`~packer.pack.schema.Manifest`
writes them for every pack and checks them on load; :func:`~packer.pack.parse.label_fields`
and :func:`~packer.pack.parse.check_label_fields` are the same rules on plain arrays
and dicts)::

    "label_dtype": "int64",
    "label_shape": [N],
    "targets": {"names": ["col1", ...], "dtype": "float32", "shape": [N, K]}   # only with targets

Anything else is refused, never cast (:func:`~packer.pack.parse.check_label_arrays`).

How :func:`packer.builder.run.build` (one pack) uses these modules (:func:`packer.builder.plan.plan_labels`):
without a table, ``scan_tree`` then :func:`~packer.sources.classes.resolve_classes` and
:func:`~packer.sources.classes.apply_class_map` against the ``--classes`` map; with one,
:func:`~packer.sources.tables.read_table` (the map passed as ``classes``),
:func:`packer.sources.scan.list_images` and :func:`apply_table`, whose ``missing`` rows
become skips and whose ``ignored`` count is reported. The targets are subset by the same
kept rows as the labels (images that fail to decode), written beside ``labels`` as
``targets.memmap`` (float32 C-order) and checksummed; the resume fingerprint holds the
table's SHA-256, the class map and the targets' bytes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import InputError
from .common import UNLABELED, match_key
from .scan import IMAGE_EXTENSIONS, Entry, is_image_name, list_images
from .tables import LabelTable

log = logging.getLogger(__name__)

MAX_MISSING_LISTED = 1000  # table rows with no image listed one by one; the rest counted


def list_source_images(src: str | os.PathLike[str]) -> list[str]:
    """Every image under ``src``, recursively, as POSIX paths relative to it, sorted as
    ImageFolder sorts (folder path, then name). For table labels: unlike
    :func:`packer.sources.scan.scan_tree`, images directly in ``src`` count too."""
    return [e.rel for e in list_images(src).entries]


@dataclass(frozen=True, eq=False)
class TableMatch:
    """The table applied to the images found under SRC.

    ``entries``: one per matched image, in found (ImageFolder-sorted) order; ``rel`` is
    the path as found on disk, ``label`` an index into ``classes``.
    ``rows``: int64 ``[M]``, the 0-based table row of each entry.
    ``targets``: float32 ``[M, K]``, the entries' targets, or None.
    ``classes``: the table's classes less the names (found in the table, not given by a
    map) that only rows with no image carry; ``new_classes`` likewise.
    ``missing``: ``(rel, reason)`` of the first :data:`MAX_MISSING_LISTED` table rows
    with no image, in table order; ``missing_count`` counts them all.
    ``ignored``: how many found images the table does not list.
    """

    entries: list[Entry]
    rows: np.ndarray
    targets: np.ndarray | None
    missing: list[tuple[str, str]]
    ignored: int
    classes: list[str] = field(default_factory=list)
    new_classes: list[str] = field(default_factory=list)
    missing_count: int = 0


def _match_rows(table: LabelTable, found_rels: Sequence[str]) -> dict[str, int]:
    """Found path -> table row. A row matches the file it writes exactly; failing that,
    the one file whose name is the same in another Unicode form (tables typed on one
    system, files named on another). Two files that differ only in form (distinct on
    Linux) and a row naming neither exactly, or two rows reaching one file, is refused:
    a row labels one file."""
    found = set(found_rels)
    by_form: dict[str, list[str]] = {}
    for rel in found_rels:
        by_form.setdefault(match_key(rel), []).append(rel)
    out: dict[str, int] = {}
    for i, p in enumerate(table.paths):
        if p in found:
            rel = p
        else:
            same = by_form.get(match_key(p), [])
            if not same:
                continue
            if len(same) > 1:
                raise InputError(
                    f"{table.source} row {table.row_number(i)}: {p!r} matches "
                    f"{' and '.join(repr(r) for r in same)} under SRC, the same name in "
                    "different Unicode forms (distinct files); write the row with the exact "
                    "bytes of the file's name"
                )
            rel = same[0]
        if rel in out:
            raise InputError(
                f"{table.source}: rows {table.row_number(out[rel])} and "
                f"{table.row_number(i)} both name {rel!r} (in different Unicode forms); "
                "each image may have one row"
            )
        out[rel] = i
    return out


def apply_table(
    table: LabelTable,
    found_rels: Sequence[str],
    *,
    src: str | os.PathLike[str] | None = None,
) -> TableMatch:
    """Match ``table`` to the images found under SRC (``found_rels``, POSIX relative
    paths in the order the pack should have, e.g. :func:`list_source_images`).

    Classes named only by rows with no image are dropped (unless a ``--classes`` map
    gives them), so a missing file never shifts the indices. ``src``, when given,
    sharpens a missing row's reason (a folder, or a file that is not an image by its
    extension); only the first :data:`MAX_MISSING_LISTED` missing rows get a reason.
    """
    row_of = _match_rows(table, found_rels)
    rel_rows = [(rel, row_of[rel]) for rel in found_rels if rel in row_of]
    ignored = len(found_rels) - len(rel_rows)
    keep_from = table.kept_from()
    used = {int(table.labels[i]) for _, i in rel_rows}
    remap = {k: 0 for k in range(len(table.classes)) if k < keep_from or k in used}
    remap = {k: j for j, k in enumerate(remap)}  # old index -> new, in the old order
    kept = [table.classes[k] for k in remap]
    entries = []
    for rel, i in rel_rows:
        label = int(table.labels[i])
        if label != UNLABELED and keep_from < len(table.classes):
            label = remap[label]  # integer labels (nothing to drop) stay as they are
        entries.append(Entry(rel, label))
    rows = [i for _, i in rel_rows]
    kept_set = set(kept)
    new_classes = [c for c in table.new_classes if c in kept_set]

    matched = set(rows)
    missing: list[tuple[str, str]] = []
    missing_count = 0
    folded: dict[str, str] | None = None
    for i, rel in enumerate(table.paths):
        if i in matched:
            continue
        missing_count += 1
        if len(missing) >= MAX_MISSING_LISTED:
            continue
        where = f"listed in {table.source} row {table.row_number(i)}"
        reason = f"{where} but not found under SRC"
        path = Path(src) / rel if src is not None else None
        if path is not None and path.is_dir():
            reason = f"{where} but is a folder, not an image"
        elif path is not None and path.is_file() and not is_image_name(rel):
            reason = f"{where} but not an image imgpack reads ({', '.join(IMAGE_EXTENSIONS)})"
        else:
            if folded is None:
                folded = {match_key(r).casefold(): r for r in found_rels}
            other = folded.get(match_key(rel).casefold())
            if other is not None:
                reason += f" (there is {other!r}, which differs in case)"
        missing.append((rel, reason))
    row_arr = np.asarray(rows, dtype=np.int64)
    targets = table.targets[row_arr] if table.targets is not None else None
    if missing_count:
        log.warning(
            "%s: %d row(s) name no image under SRC, e.g. %s",
            table.source,
            missing_count,
            missing[0][0],
        )
    return TableMatch(
        entries=entries,
        rows=row_arr,
        targets=targets,
        missing=missing,
        ignored=ignored,
        classes=kept,
        new_classes=new_classes,
        missing_count=missing_count,
    )
