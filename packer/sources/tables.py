"""Label tables (``--labels TABLE [--targets COL,...]``): read a file into a :class:`LabelTable`.

:func:`read_table` reads ``.csv`` / ``.tsv`` (stdlib ``csv``) or ``.parquet`` (needs
pyarrow). Columns: ``path`` (relative to SRC), ``label`` (class names or integers) and
the target columns. ``label`` may be left out only when targets are given (a
regression table); every label is then ``-1``. What each cell may hold is
:mod:`packer.sources.cells`'s rule.

Row numbers in every error count like a spreadsheet: each record's number in the
file, blank rows included, so with the header on row 1 the first data row is row 2
(for parquet too, whose column names play the header). Each message says which row
the header is on, e.g. ``labels.csv row 7 (header = row 1): ...``.

A table is read only if it is a regular file (after following links): a FIFO or a
device is refused, never waited on.
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from ..errors import InputError, UsageError
from .cells import LABEL_COLUMN, PATH_COLUMN, cell_text, labels_from_text, norm_path, target_value
from .common import UNLABELED, match_key, read_regular

TABLE_SUFFIXES = (".csv", ".tsv", ".parquet")
_MAX_TABLE_BYTES = 4 << 30


@dataclass(frozen=True, eq=False)
class LabelTable:
    """A validated label table, one row per listed image, in the table's order.

    ``paths``: each row's path relative to SRC, normalised (POSIX, no ``./``), in the
    Unicode form the table wrote it (matching folds forms, see :func:`packer.sources.labels.apply_table`).
    ``labels``: int64 ``[N]``, class index or -1 (read-only).
    ``targets``: float32 ``[N, K]`` (read-only), finite values, or None without targets.
    ``classes``: names of the label indices; ``[]`` for integer labels without a map.
    ``new_classes``: names appended to the given map (``allow_new_classes``).
    ``fixed_classes``: how many leading ``classes`` stay whatever the match: the map's,
    or all of them for integer labels; the rest (names found in the table) are kept
    by :func:`packer.sources.labels.apply_table` only when a row naming them matches an image.
    ``sha256``: of the table's bytes, exactly those parsed.
    """

    paths: list[str]
    labels: np.ndarray
    classes: list[str]
    targets: np.ndarray | None
    target_names: list[str]
    source: Path
    new_classes: list[str] = field(default_factory=list)
    row_numbers: list[int] | None = None
    fixed_classes: int | None = None
    sha256: str | None = None
    _index: dict[str, int] = field(init=False, repr=False)
    _folded: dict[str, list[int]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # read_table makes these arrays; the pack format's rule
        # (packer.pack.parse.check_label_arrays) checks them again where a pack is written
        for what, a, want in (
            ("labels", self.labels, np.int64),
            ("targets", self.targets, np.float32),
        ):
            if a is not None and a.dtype != want:
                raise InputError(
                    f"{self.source}: {what} are {a.dtype}, expected {np.dtype(want)}; "
                    "imgpack does not cast labels (float labels belong in BuildConfig.targets)"
                )
        if self.labels.ndim != 1 or (self.targets is not None and self.targets.ndim != 2):
            raise ValueError("LabelTable: labels must be [N] and targets [N, K]")
        n = len(self.labels)
        k = None if self.targets is None else self.targets.shape[1]
        index = {p: i for i, p in enumerate(self.paths)}
        if self.row_numbers is not None and len(self.row_numbers) != n:
            raise ValueError(f"LabelTable: {len(self.row_numbers)} row numbers for {n} rows")
        if n != len(self.paths) or len(index) != n or (k or 0) != len(self.target_names):
            raise ValueError(
                f"LabelTable: {len(self.paths)} paths ({len(index)} distinct), {n} labels, "
                f"{k} target columns for {len(self.target_names)} names"
            )
        folded: dict[str, list[int]] = {}
        for i, p in enumerate(self.paths):
            folded.setdefault(match_key(p), []).append(i)
        object.__setattr__(self, "_index", index)
        object.__setattr__(self, "_folded", folded)

    def __len__(self) -> int:
        return len(self.paths)

    def row_number(self, i: int) -> int:
        """The row number of data row ``i`` (0-based) as errors print it: the record's
        number in the file, so the header is row 1 and blank rows count."""
        return self.row_numbers[i] if self.row_numbers is not None else i + 2

    def lookup(self, rel: str) -> int | None:
        """The 0-based data row for a path relative to SRC (normalised like the table's
        paths), or None when the table does not list it: the row that writes it exactly,
        else the one row that writes it in another Unicode form (NFC vs NFD)."""
        rel = PurePosixPath(rel).as_posix()
        i = self._index.get(rel)
        if i is not None:
            return i
        rows = self._folded.get(match_key(rel), [])
        return rows[0] if len(rows) == 1 else None

    def kept_from(self) -> int:
        return len(self.classes) if self.fixed_classes is None else self.fixed_classes


def _read_delimited(
    path: Path, data: bytes, delimiter: str
) -> tuple[list[str], list[list[Any]], list[int], int]:
    """Header, data rows, their row numbers (blank rows count but are skipped) and
    the header's row number (1 unless blank rows come first)."""
    f = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8-sig", newline="")
    rows: list[list[Any]] = []
    numbers: list[int] = []
    header: list[str] | None = None
    header_row = 1
    rowno = 0
    with f:
        reader = csv.reader(f, delimiter=delimiter, strict=True)
        try:
            for record in reader:
                rowno += 1
                if not record or all(not c.strip() for c in record):
                    continue
                if header is None:
                    header = [c.strip() for c in record]
                    header_row = rowno
                    continue
                if len(record) != len(header):
                    raise InputError(
                        f"{path} row {rowno} (header = row {header_row}): {len(record)} field(s), the header has "
                        f"{len(header)}; check the quoting and the separator"
                    )
                rows.append(record)
                numbers.append(rowno)
        except UnicodeDecodeError as e:
            raise InputError(
                f"{path}: not UTF-8 text ({e.reason}); save the table as UTF-8"
            ) from None
        except csv.Error as e:
            note = f" (header = row {header_row})" if header is not None else ""
            raise InputError(f"{path} row {rowno + 1}{note}: cannot parse ({e})") from None
    if header is None:
        raise InputError(
            f"{path}: empty; a label table needs a header row with '{PATH_COLUMN}' and "
            f"'{LABEL_COLUMN}' columns"
        )
    return header, rows, numbers, header_row


def _read_parquet(path: Path, data: bytes) -> tuple[list[str], list[list[Any]], list[int], int]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise InputError(
            f"{path}: reading .parquet tables needs pyarrow (pip install pyarrow), "
            "or convert the table to CSV"
        ) from None
    try:
        t = pq.read_table(io.BytesIO(data))
    except Exception as e:  # pyarrow raises its own ArrowInvalid / OSError kinds
        raise InputError(f"{path}: not a readable parquet file ({e})") from None
    header = [str(c) for c in t.column_names]
    columns = [t.column(i).to_pylist() for i in range(len(header))]
    rows = [list(r) for r in zip(*columns)] if columns else []
    # The column names play the header's part, so data rows count from 2 as in a CSV.
    return header, rows, [i + 2 for i in range(len(rows))], 1


def read_table(
    path: str | os.PathLike[str],
    *,
    targets: Sequence[str] | None = None,
    classes: Sequence[str] | None = None,
    allow_new_classes: bool = False,
) -> LabelTable:
    """Read and validate a label table (see the module docstring for the rules).

    ``targets``: names of numeric columns to keep as float32 ``[N, K]`` in that order.
    ``classes``: the fixed class map from ``--classes``, or None.
    Raises :class:`InputError` (exit 2) naming the table, the row (header = row 1)
    and what is wrong; :class:`UsageError` for a bad ``targets`` list.
    """
    path = Path(path)
    target_names = list(targets or [])
    check_target_names(target_names)
    suffix = path.suffix.lower()
    if suffix not in TABLE_SUFFIXES:
        raise InputError(
            f"{path}: unknown label table type {path.suffix or '(no extension)'!r}; "
            "give a .csv, .tsv or .parquet file"
        )
    if not path.exists():
        raise InputError(f"{path}: no such label table; check the path")
    data = read_regular(path, _MAX_TABLE_BYTES, "a label table")
    if suffix == ".parquet":
        header, rows, numbers, header_row = _read_parquet(path, data)
    else:
        header, rows, numbers, header_row = _read_delimited(
            path, data, "," if suffix == ".csv" else "\t"
        )
    note = f"(header = row {header_row})"  # says which way rows are counted
    _check_header(path, header, header_row, target_names)
    if not rows:
        raise InputError(f"{path}: no data rows under the header; nothing to label")

    col = {c: i for i, c in enumerate(header)}
    paths = _row_paths([r[col[PATH_COLUMN]] for r in rows], numbers, path, note)
    if LABEL_COLUMN in col:
        texts = [
            cell_text(r[col[LABEL_COLUMN]], LABEL_COLUMN, f"{path} row {n} {note}")
            for r, n in zip(rows, numbers)
        ]
        label_list, final_classes, new, fixed = labels_from_text(
            texts, numbers, path, note, classes, allow_new_classes
        )
    else:
        label_list = [UNLABELED] * len(rows)
        final_classes, new = (list(classes) if classes is not None else []), []
        fixed = len(final_classes)
    labels = np.asarray(label_list, dtype=np.int64)

    target_arr: np.ndarray | None = None
    if target_names:
        values = [
            [target_value(r[col[c]], c, f"{path} row {n} {note}") for c in target_names]
            for r, n in zip(rows, numbers)
        ]
        target_arr = np.asarray(values, dtype=np.float64).astype(np.float32)
        target_arr.setflags(write=False)
    labels.setflags(write=False)
    return LabelTable(
        paths=paths,
        labels=labels,
        classes=final_classes,
        targets=target_arr,
        target_names=target_names,
        source=path,
        new_classes=new,
        row_numbers=numbers,
        fixed_classes=fixed,
        sha256=hashlib.sha256(data).hexdigest(),
    )


def _check_header(path: Path, header: list[str], header_row: int, targets: list[str]) -> None:
    """Refuse a header with a column twice or without the columns the table needs."""
    dup = sorted({c for c in header if header.count(c) > 1})
    if dup:
        raise InputError(
            f"{path} row {header_row} (the header): column(s) {', '.join(map(repr, dup))} "
            "appear twice"
        )
    need = [PATH_COLUMN] + ([] if targets else [LABEL_COLUMN]) + targets
    missing = [c for c in need if c not in header]
    if missing:
        raise InputError(
            f"{path} row {header_row} (the header): missing column(s) "
            f"{', '.join(map(repr, missing))}; it has "
            f"{', '.join(map(repr, header)) or 'none'}. A label table needs '{PATH_COLUMN}' "
            f"(relative to SRC) and '{LABEL_COLUMN}' (class names or integers)"
        )


def _row_paths(cells: list[Any], numbers: list[int], path: Path, note: str) -> list[str]:
    """The path cells normalised (:func:`packer.sources.cells.norm_path`), each image listed once."""
    paths: list[str] = []
    first_row: dict[str, int] = {}
    for cell, n in zip(cells, numbers):
        where = f"{path} row {n} {note}"
        rel = norm_path(cell_text(cell, PATH_COLUMN, where), where)
        if rel in first_row:
            raise InputError(
                f"{path}: rows {first_row[rel]} and {n} {note} both list {rel!r}; "
                "each image may have one row"
            )
        first_row[rel] = n
        paths.append(rel)
    return paths


def check_target_names(names: list[str]) -> None:
    """UsageError naming ``BuildConfig.targets`` for an empty, padded, reserved or
    repeated column name."""
    f = "BuildConfig.targets"
    for c in names:
        if not c or c != c.strip():
            raise UsageError(f"{f}: empty or padded column name {c!r}", field=f)
        if c in (PATH_COLUMN, LABEL_COLUMN):
            raise UsageError(f"{f}: {c!r} is not a target column; name numeric columns", field=f)
    dup = sorted({c for c in names if names.count(c) > 1})
    if dup:
        raise UsageError(f"{f}: column(s) {', '.join(map(repr, dup))} named twice", field=f)
