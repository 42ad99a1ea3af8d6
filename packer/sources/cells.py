"""What a label table's cells may hold: a path under SRC, a label, a target value.

Labels, per table, are of one kind:

* class names: indexed through ``classes`` when a map is given (a name not in the
  map is an error unless ``allow_new_classes`` appends it), else through the
  sorted set of the names;
* integers: used as they are, and ``classes`` stays ``[]`` unless a map is given,
  in which case each must be in ``[0, len(classes))``;
* ``-1`` is "no label" in either kind (the flat-folder convention); any other
  negative integer, an integer above ``2**31 - 1``, an empty cell, a float
  (``inf`` and ``nan`` included) or a mix of names and integers is an error, and
  so is a class name holding a control character (a quoted newline). When a map is
  given and every label is one of its names, the labels are names, even if they look
  like integers (class folders named ``0`` .. ``9``).

Targets are plain decimal or scientific notation (``1000``, ``-2.5e-3``); ``1_000``,
``nan``, ``inf``, values beyond float32 and non-zero values float32 stores as 0 are
errors.

Paths are normalised to POSIX relative form (``./a//b.jpg`` -> ``a/b.jpg``);
absolute paths, drive letters, ``..`` and backslashes are refused, since a row
applies only to the file it names under SRC.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from ..errors import InputError
from .classes import resolve_classes
from .common import UNLABELED, control_char

PATH_COLUMN = "path"
LABEL_COLUMN = "label"
MAX_LABEL = (1 << 31) - 1  # integer labels lie in [0, MAX_LABEL] (or are -1)
_INT_RE = re.compile(r"[+-]?[0-9]+")
_NUMBER_RE = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_NONFINITE_WORDS = frozenset({"inf", "infinity", "nan"})
_DRIVE_RE = re.compile(r"^[A-Za-z]:")


def _is_nonfinite_word(text: str) -> bool:
    """``inf``, ``-Infinity``, ``NaN``...: what ``float()`` reads as a non-finite number."""
    return text.lower().lstrip("+-") in _NONFINITE_WORDS


def norm_path(raw: str, where: str) -> str:
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


def cell_text(value: Any, column: str, where: str) -> str:
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


def target_value(value: Any, column: str, where: str) -> float:
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


def labels_from_text(
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
                "names or class indices, numeric values go in a BuildConfig.targets column"
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
                + "; pass BuildConfig.allow_new_classes to append it, or fix the map or the "
                "table",
                field="BuildConfig.allow_new_classes",
            )
    final, new = resolve_classes(names, classes, allow_new)
    index = {c: i for i, c in enumerate(final)}
    labels = [UNLABELED if t == unlabeled else index[t] for t in texts]
    return labels, final, new, (len(classes) if classes is not None else 0)
