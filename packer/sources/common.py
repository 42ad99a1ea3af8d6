"""What the class-map, label-table and matching modules share: the no-label value,
reading a small regular file the user named, and the form two names compare in."""

from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import BinaryIO

from .._fs import NotRegularFile, open_if_regular
from ..errors import InputError

UNLABELED = -1


def control_char(name: str) -> str | None:
    """The first control or line-separator character of a class name, or None."""
    for ch in name:
        if unicodedata.category(ch) in ("Cc", "Zl", "Zp"):
            return ch
    return None


def match_key(rel: str) -> str:
    """The form a table's path and a found file's path compare in."""
    # Tables typed on one system and files named on another (macOS keeps NFD names)
    # must still match, so both sides compare in NFC.
    return unicodedata.normalize("NFC", rel)


def _open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading if it is a regular file (:func:`packer._fs.open_if_regular`:
    the open never blocks, and the check is made on the open descriptor)."""
    try:
        return open_if_regular(path)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file; check the path") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read it ({e.strerror})") from None
    except NotRegularFile:
        raise InputError(f"{path}: not a regular file") from None


def read_regular(path: Path, limit: int, what: str) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them."""
    with _open_regular(path) as f:
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise InputError(f"{path}: cannot read it ({e.strerror})") from None
    if len(data) > limit:
        raise InputError(f"{path}: larger than {limit >> 20} MiB, too large for {what}")
    return data
