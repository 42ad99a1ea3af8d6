"""Labels people actually have: a fixed class map, labels from a table, float targets.

Three sources of labels, all ending in the same two arrays per pack:

* ``labels``  int64 ``[N]``: a class index in ``[0, len(classes))``, or ``-1`` for an
  image without a label (a flat folder, or a table row whose label is ``-1``).
* ``targets`` float32 ``[N, K]`` (optional): the numeric table columns named by
  ``--targets``, in that order; any finite float32 value.

Class maps (``--classes FILE|PACK``)
    :func:`read_class_file` reads a text file (one class name per line, blank lines
    skipped, surrounding whitespace stripped, UTF-8 with or without BOM) or the
    ``classes`` of an existing pack's manifest. :func:`resolve_classes` fixes the
    class -> index map: the map's order wins, classes of the map with no images are
    kept (count 0), a class found in SRC but not in the map is an error unless
    ``allow_new`` appends it (new ones sorted, at the end). Without a map the classes
    are the sorted found names, which is ``torchvision.datasets.ImageFolder``'s rule.

Label tables (``--labels TABLE [--targets COL,...]``)
    :func:`read_table` reads ``.csv`` / ``.tsv`` (stdlib ``csv``) or ``.parquet``
    (needs pyarrow). Columns: ``path`` (relative to SRC), ``label`` (class names or
    integers) and the target columns. ``label`` may be left out only when targets
    are given (a regression table); every label is then ``-1``.

    Row numbers in every error count like a spreadsheet: each record's number in the
    file, blank rows included, so with the header on row 1 the first data row is row 2
    (for parquet too, whose column names play the header). Each message says which
    row the header is on, e.g. ``labels.csv row 7 (header = row 1): ...``.

    Labels, per table, are of one kind:

    * class names: indexed through ``classes`` when a map is given (a name not in the
      map is an error unless ``allow_new_classes`` appends it), else through the
      sorted set of the names;
    * integers: used as they are, and ``classes`` stays ``[]`` unless a map is given,
      in which case each must be in ``[0, len(classes))``;
    * ``-1`` is "no label" in either kind (the flat-folder convention); any other
      negative integer, an integer above ``2**31 - 1``, an empty cell, a float
      (``inf`` and ``nan`` included) or a mix of names and integers is an error, and
      so is a class name holding a control character (a quoted newline). When a map is given and every label is one of its names, the labels are
      names, even if they look like integers (class folders named ``0`` .. ``9``).

    Targets are plain decimal or scientific notation (``1000``, ``-2.5e-3``); ``1_000``,
    ``nan``, ``inf``, values beyond float32 and non-zero values float32 stores as 0 are
    errors.

    Paths are normalised to POSIX relative form (``./a//b.jpg`` -> ``a/b.jpg``);
    absolute paths, drive letters, ``..`` and backslashes are refused, since a row
    applies only to the file it names under SRC. A row matches the file it writes
    exactly, else the one file whose name differs only in Unicode form (NFC vs NFD);
    when several files fold to it, or two rows reach one file, the build is refused.

    Tables and class maps are read only if they are regular files (after following
    links): a FIFO or a device is refused, never waited on.

    :func:`apply_table` matches the rows to the images found under SRC. The pack keeps
    the found order (ImageFolder's sorted order, as :func:`list_source_images` returns
    it), not the table's, so reordering a table does not reorder the pack. Rows whose
    file is not found are skips with a reason (the first :data:`MAX_MISSING_LISTED`;
    the rest are counted) and name no class: without a map, the classes are those of
    the rows that matched an image. Images with no row are ignored and counted.

Manifest fields (the schema is :mod:`packer.pack.format`'s: :class:`~packer.pack.format.Manifest`
writes them for every pack and checks them on load; :func:`label_fields` and
:func:`check_label_fields` here are the same rules on plain arrays and dicts)::

    "label_dtype": "int64",
    "label_shape": [N],
    "targets": {"names": ["col1", ...], "dtype": "float32", "shape": [N, K]}   # only with targets

Anything else is refused, never cast (:func:`check_label_arrays`).

How :func:`packer.build.run.build` uses this module (``_plan_labels`` there): without a
table, ``scan_tree`` then :func:`resolve_classes` and :func:`apply_class_map` against
the ``--classes`` map; with one, :func:`read_table` (the map passed as ``classes``),
:func:`packer.sources.scan.list_images` and :func:`apply_table`, whose ``missing`` rows become
skips and whose ``ignored`` count is reported. The targets are subset by the same kept
rows as the labels (images that fail to decode), written beside ``labels`` as
``targets.memmap`` (float32 C-order) and checksummed; the resume fingerprint holds the
table's SHA-256, the class map and the targets' bytes.
"""

from __future__ import annotations

import csv
import hashlib
import io
import logging
import math
import os
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

import numpy as np

from ..errors import InputError, UsageError
from .scan import (
    IMAGE_EXTENSIONS,
    Entry,
    NotRegularFile,
    Scan,
    is_image_name,
    list_images,
    open_if_regular,
)

log = logging.getLogger(__name__)

UNLABELED = -1
PATH_COLUMN = "path"
LABEL_COLUMN = "label"
TABLE_SUFFIXES = (".csv", ".tsv", ".parquet")
_MAX_CLASS_FILE_BYTES = 64 << 20
_MAX_TABLE_BYTES = 4 << 30
MAX_LABEL = (1 << 31) - 1  # integer labels lie in [0, MAX_LABEL] (or are -1)
MAX_MISSING_LISTED = 1000  # table rows with no image listed one by one; the rest counted
_INT_RE = re.compile(r"[+-]?[0-9]+")
_NUMBER_RE = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_NONFINITE_WORDS = frozenset({"inf", "infinity", "nan"})
_DRIVE_RE = re.compile(r"^[A-Za-z]:")
_LINE_RE = re.compile(r"\r\n|\n|\r")


def _is_nonfinite_word(text: str) -> bool:
    """``inf``, ``-Infinity``, ``NaN``...: what ``float()`` reads as a non-finite number."""
    return text.lower().lstrip("+-") in _NONFINITE_WORDS


def control_char(name: str) -> str | None:
    """The first control or line-separator character of a class name, or None."""
    for ch in name:
        if unicodedata.category(ch) in ("Cc", "Zl", "Zp"):
            return ch
    return None


def _open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading if it is a regular file (:func:`packer.sources.scan.open_if_regular`:
    the open never blocks, and the check is made on the open descriptor)."""
    try:
        return open_if_regular(path)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file; check the path") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read it ({e.strerror})") from None
    except NotRegularFile:
        raise InputError(f"{path}: not a regular file") from None


def _read_regular(path: Path, limit: int, what: str) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them."""
    with _open_regular(path) as f:
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise InputError(f"{path}: cannot read it ({e.strerror})") from None
    if len(data) > limit:
        raise InputError(f"{path}: larger than {limit >> 20} MiB, too large for {what}")
    return data


# ---------------------------------------------------------------- class maps


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
    data = _read_regular(path, _MAX_CLASS_FILE_BYTES, "a class map (one class name per line)")
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
            "pass --allow-new-classes to append them at the end, or fix the map"
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


def list_source_images(src: str | os.PathLike[str]) -> list[str]:
    """Every image under ``src``, recursively, as POSIX paths relative to it, sorted as
    ImageFolder sorts (folder path, then name). For table labels: unlike
    :func:`packer.sources.scan.scan_tree`, images directly in ``src`` count too."""
    return [e.rel for e in list_images(src).entries]


# ---------------------------------------------------------------- label tables


@dataclass(frozen=True, eq=False)
class LabelTable:
    """A validated label table, one row per listed image, in the table's order.

    ``paths``: each row's path relative to SRC, normalised (POSIX, no ``./``), in the
    Unicode form the table wrote it (matching folds forms, see :func:`apply_table`).
    ``labels``: int64 ``[N]``, class index or -1 (read-only).
    ``targets``: float32 ``[N, K]`` (read-only), finite values, or None without targets.
    ``classes``: names of the label indices; ``[]`` for integer labels without a map.
    ``new_classes``: names appended to the given map (``allow_new_classes``).
    ``fixed_classes``: how many leading ``classes`` stay whatever the match: the map's,
    or all of them for integer labels; the rest (names found in the table) are kept
    by :func:`apply_table` only when a row naming them matches an image.
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
        # (packer.pack.format.check_label_arrays) checks them again where a pack is written
        for what, a, want in (
            ("labels", self.labels, np.int64),
            ("targets", self.targets, np.float32),
        ):
            if a is not None and a.dtype != want:
                raise InputError(
                    f"{self.source}: {what} are {a.dtype}, expected {np.dtype(want)}; "
                    "imgpack does not cast labels (float labels belong in --targets)"
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
            folded.setdefault(_match_key(p), []).append(i)
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
        rows = self._folded.get(_match_key(rel), [])
        return rows[0] if len(rows) == 1 else None

    def kept_from(self) -> int:
        return len(self.classes) if self.fixed_classes is None else self.fixed_classes


def _match_key(rel: str) -> str:
    # Tables typed on one system and files named on another (macOS keeps NFD names)
    # must still match, so both sides compare in NFC.
    return unicodedata.normalize("NFC", rel)


def _norm_path(raw: str, where: str) -> str:
    """A table cell as a POSIX path relative to SRC, or InputError saying why not."""
    s = raw.strip()
    if not s:
        raise InputError(f"{where}: empty path")
    if "\\" in s:
        raise InputError(
            f"{where}: path {s!r} has a backslash; write paths relative to SRC with '/'"
        )
    p = PurePosixPath(s)
    if p.is_absolute() or _DRIVE_RE.match(s):
        raise InputError(
            f"{where}: path {s!r} is absolute; a row names a file by its path relative to SRC"
        )
    if ".." in p.parts:
        raise InputError(f"{where}: path {s!r} contains '..'; a row may only name a file under SRC")
    rel = p.as_posix()
    if rel in ("", "."):
        raise InputError(f"{where}: path {s!r} names no file")
    return rel


def _cell_text(value: Any, column: str, where: str) -> str:
    """A label or path cell as text; parquet cells arrive typed."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value.strip()
    if (
        column == LABEL_COLUMN
        and isinstance(value, (int, np.integer))
        and not isinstance(value, (bool, np.bool_))
    ):
        return str(int(value))
    raise InputError(
        f"{where}: {column} {value!r} is of type {type(value).__name__}; "
        f"{'labels are class names or integers' if column == LABEL_COLUMN else 'paths are text'}"
    )


def _target_value(value: Any, column: str, where: str) -> float:
    if isinstance(value, str):
        text = value.strip()
        if not text:
            raise InputError(f"{where}: target {column!r} is empty; every row needs a number")
        if _is_nonfinite_word(text):
            raise InputError(f"{where}: target {column!r} is {text}; targets must be finite")
        # Plain decimal or scientific notation only: float() also takes "1_000", a
        # typo's likelier reading than a thousand.
        if not _NUMBER_RE.fullmatch(text):
            raise InputError(
                f"{where}: target {column!r} is {text!r}, not a number (write plain decimal "
                "or scientific notation, e.g. 1000, -0.5 or 2.5e-3)"
            )
        v = float(text)
    elif isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_)
    ):
        v = float(value)
    elif value is None:
        raise InputError(f"{where}: target {column!r} is empty; every row needs a number")
    else:
        raise InputError(f"{where}: target {column!r} is {value!r}, not a number")
    if not math.isfinite(v):
        raise InputError(f"{where}: target {column!r} is {v}; targets must be finite")
    with np.errstate(over="ignore"):
        overflows = not math.isfinite(float(np.float32(v)))
    if overflows:
        raise InputError(
            f"{where}: target {column!r} is {v}, beyond float32's range (about 3.4e38)"
        )
    if v != 0 and float(np.float32(v)) == 0:
        raise InputError(
            f"{where}: target {column!r} is {v}, which float32 stores as 0 (its smallest "
            "non-zero magnitude is about 1.4e-45); rescale the column"
        )
    return v


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
    data = _read_regular(path, _MAX_TABLE_BYTES, "a label table")
    if suffix == ".parquet":
        header, rows, numbers, header_row = _read_parquet(path, data)
    else:
        header, rows, numbers, header_row = _read_delimited(
            path, data, "," if suffix == ".csv" else "\t"
        )
    note = f"(header = row {header_row})"  # says which way rows are counted

    dup = sorted({c for c in header if header.count(c) > 1})
    if dup:
        raise InputError(
            f"{path} row {header_row} (the header): column(s) {', '.join(map(repr, dup))} "
            "appear twice"
        )
    need = [PATH_COLUMN] + ([] if target_names else [LABEL_COLUMN]) + target_names
    missing = [c for c in need if c not in header]
    if missing:
        raise InputError(
            f"{path} row {header_row} (the header): missing column(s) "
            f"{', '.join(map(repr, missing))}; it has "
            f"{', '.join(map(repr, header)) or 'none'}. A label table needs '{PATH_COLUMN}' "
            f"(relative to SRC) and '{LABEL_COLUMN}' (class names or integers)"
        )
    if not rows:
        raise InputError(f"{path}: no data rows under the header; nothing to label")

    col = {c: i for i, c in enumerate(header)}
    paths: list[str] = []
    first_row: dict[str, int] = {}
    for r, n in zip(rows, numbers):
        where = f"{path} row {n} {note}"
        rel = _norm_path(_cell_text(r[col[PATH_COLUMN]], PATH_COLUMN, where), where)
        if rel in first_row:
            raise InputError(
                f"{path}: rows {first_row[rel]} and {n} {note} both list {rel!r}; "
                "each image may have one row"
            )
        first_row[rel] = n
        paths.append(rel)

    if LABEL_COLUMN in col:
        texts = [
            _cell_text(r[col[LABEL_COLUMN]], LABEL_COLUMN, f"{path} row {n} {note}")
            for r, n in zip(rows, numbers)
        ]
        label_list, final_classes, new, fixed = _labels_from_text(
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
            [_target_value(r[col[c]], c, f"{path} row {n} {note}") for c in target_names]
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


def check_target_names(names: list[str]) -> None:
    for c in names:
        if not c or c != c.strip():
            raise UsageError(f"--targets: empty or padded column name {c!r}")
        if c in (PATH_COLUMN, LABEL_COLUMN):
            raise UsageError(f"--targets: {c!r} is not a target column; name numeric columns")
    dup = sorted({c for c in names if names.count(c) > 1})
    if dup:
        raise UsageError(f"--targets: column(s) {', '.join(map(repr, dup))} named twice")


def _labels_from_text(
    texts: list[str],
    numbers: list[int],
    path: Path,
    note: str,
    classes: Sequence[str] | None,
    allow_new: bool,
) -> tuple[list[int], list[str], list[str], int]:
    """Label indices, final classes, appended classes, and how many leading classes
    are fixed (the map's; all for integer labels) from label cells."""

    def where(i: int) -> str:
        return f"{path} row {numbers[i]} {note}"

    for i, t in enumerate(texts):
        if not t:
            raise InputError(
                f"{where(i)}: empty label; give a class name, a class index, or -1 for no label"
            )
    index = {c: i for i, c in enumerate(classes)} if classes is not None else {}
    unlabeled = str(UNLABELED)
    # Names of the map win over integer readings: class folders named "0".."9" are
    # names, and a table using them means those folders.
    if classes is not None and all(t in index or t == unlabeled for t in texts):
        labels = [UNLABELED if t == unlabeled and t not in index else index[t] for t in texts]
        return labels, list(classes), [], len(classes)

    for i, t in enumerate(texts):
        if (
            t not in index
            and not _INT_RE.fullmatch(t)
            and (_NUMBER_RE.fullmatch(t) or _is_nonfinite_word(t))
        ):
            # 0.1, 0.2 and 0.3 were once all cast to class 0; they are neither
            # indices nor plausible class names, so say where they belong.
            raise InputError(
                f"{where(i)}: label {t!r} is a number but not an integer; labels are class "
                "names or class indices, numeric values go in a --targets column"
            )
    is_int = [bool(_INT_RE.fullmatch(t)) for t in texts]
    if all(is_int):
        labels = [int(t) for t in texts]
        for i, v in enumerate(labels):
            if v < UNLABELED:
                raise InputError(
                    f"{where(i)}: label {v} is negative; class indices start at 0 and -1 "
                    "means no label"
                )
            if v > MAX_LABEL:
                raise InputError(
                    f"{where(i)}: label {texts[i]} out of range; class indices lie in "
                    f"[0, {MAX_LABEL}] and -1 means no label"
                )
            if classes is not None and v >= len(classes):
                raise InputError(
                    f"{where(i)}: label {v} is out of range for the {len(classes)} classes of "
                    f"the class map (0 to {len(classes) - 1})"
                )
        final = list(classes) if classes is not None else []
        return labels, final, [], len(final)

    first_name = next(i for i, ok in enumerate(is_int) if not ok)
    for i, ok in enumerate(is_int):
        if ok and texts[i] != unlabeled and texts[i] not in index:
            raise InputError(
                f"{path}: labels mix class names (row {numbers[first_name]}: "
                f"{texts[first_name]!r}) and integers (row {numbers[i]}: {texts[i]!r}) "
                f"{note}; use one kind"
            )
    names = [t for t in texts if t != unlabeled]
    for i, t in enumerate(texts):
        bad = control_char(t)
        if bad is not None and t not in index:
            raise InputError(
                f"{where(i)}: label {t!r} holds the control character {bad!r}; class names "
                "are printable text (check the quoting)"
            )
    if classes is not None:
        unknown = [i for i, t in enumerate(texts) if t != unlabeled and t not in index]
        if unknown and not allow_new:
            i = unknown[0]
            more = len({texts[j] for j in unknown}) - 1
            raise InputError(
                f"{where(i)}: label {texts[i]!r} is not a class of the class map"
                + (f" (nor are {more} other name(s))" if more else "")
                + "; pass --allow-new-classes to append it, or fix the map or the table"
            )
    final, new = resolve_classes(names, classes, allow_new)
    index = {c: i for i, c in enumerate(final)}
    labels = [UNLABELED if t == unlabeled else index[t] for t in texts]
    return labels, final, new, (len(classes) if classes is not None else 0)


# ---------------------------------------------------------------- matching


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
        by_form.setdefault(_match_key(rel), []).append(rel)
    out: dict[str, int] = {}
    for i, p in enumerate(table.paths):
        if p in found:
            rel = p
        else:
            same = by_form.get(_match_key(p), [])
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
                folded = {_match_key(r).casefold(): r for r in found_rels}
            other = folded.get(_match_key(rel).casefold())
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
