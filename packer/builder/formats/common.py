"""What every reader of a non-folder source shares (parquet and Arrow tables, WebDataset
tars, zip archives, bucket prefixes), below them and below the dispatchers that pick one
(:mod:`packer.builder.formats.base` in the parent, :mod:`packer.builder.formats.fetch` in
a decode worker): a source's :class:`Container` and :data:`Ref`, its :class:`SourceScan`,
what SRC names (:class:`SourceSpec`, :func:`expand_braces`), locations, labels
(:func:`finish_labels`), and a worker's side (:class:`Fetched`, :func:`cached`,
:func:`capped`). Imports none of the readers or dispatchers; every name is importable
from :mod:`~packer.builder.formats.base` (and the worker's from
:mod:`~packer.builder.formats.fetch`) as well. Nothing here imports pyarrow, Pillow or
numpy at module level.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import InputError, UsageError
from ...sources.scan import Entry, Scan

# A label member (``cls``, ``json``) of a WebDataset sample, at most
MAX_LABEL_BYTES = 1 << 20

KINDS = ("parquet", "arrow", "tar", "zip", "object")
SUFFIX_KIND = {".parquet": "parquet", ".arrow": "arrow", ".tar": "tar", ".zip": "zip"}


@dataclass(frozen=True)
class Container:
    """One file or object a source's images are read from (or, kind ``object``, the
    bucket prefix whose objects are images). ``where``: a local path or an
    ``s3://`` (``gs://``, ``az://``) URL; ``name``: what locations call it; ``column``:
    a table's image column; ``stamp``: size and mtime (or ETag) when it was listed;
    ``local``: a bucket object's copy in the build's spool (:mod:`.spool`), read
    instead of ``where`` (not part of the fingerprint: the same object)."""

    kind: str
    where: str
    name: str
    cap: int
    column: str = ""
    stamp: str = ""
    local: str = ""


Ref = tuple[Container, Any]


@dataclass(frozen=True)
class SourceScan(Scan):
    """A :class:`Scan` of a source that is not a folder: ``refs[entry.rel]`` says where
    each image's bytes are; ``containers`` are what the fingerprint stamps."""

    refs: dict[str, Ref] = field(default_factory=dict)
    containers: tuple[Container, ...] = ()
    kind: str = ""
    # BuildResult.classes_from: "dataset" (a ClassLabel's names, fixed by the data),
    # "source" (the sorted label names found in it), "folders" (a zip's or bucket's
    # class folders), or "" (no classes)
    classes_from: str = ""

    def chunk_items(self) -> list[Ref]:
        """The build's "paths" of the entries, in order: refs a worker reads."""
        return [self.refs[e.rel] for e in self.entries]

    def stamps(self) -> bytes:
        """What the images' bytes depend on, for the resume fingerprint."""
        rows = [[c.kind, c.where, c.column, c.cap, c.stamp] for c in self.containers]
        return json.dumps(["sources", self.kind, rows]).encode()


def row_location(name: str, row: int) -> str:
    """``train-00003.parquet row 1,204``."""
    return f"{name} row {row:,}"


def member_location(name: str, member: str) -> str:
    """``train-000017.tar member 000123.jpg`` (bytes that are not UTF-8 as ``\\xNN``)."""
    from ...sources.scan import printable

    return f"{printable(name)} member {printable(member)}"


def one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:300]


# ---------------------------------------------------------------- what SRC is

_BRACE = re.compile(r"\{(\d+)\.\.(\d+)\}")


def expand_braces(text: str) -> list[str]:
    """``train-{000000..000003}.tar`` -> the four names (zero padding kept), as
    WebDataset's brace notation; several ranges multiply out. Other text is unchanged."""
    m = _BRACE.search(text)
    if m is None:
        return [text]
    a, b = m.group(1), m.group(2)
    lo, hi = int(a), int(b)
    if hi < lo:
        raise UsageError(f"{text}: the range {{{a}..{b}}} runs backwards")
    if hi - lo >= 1_000_000:
        raise UsageError(f"{text}: the range {{{a}..{b}}} names over a million shards")
    width = len(a) if a.startswith("0") else 0
    out: list[str] = []
    for i in range(lo, hi + 1):
        out += expand_braces(text[: m.start()] + str(i).zfill(width) + text[m.end() :])
    return out


def _kind_of_name(name: str) -> str | None:
    return SUFFIX_KIND.get(os.path.splitext(name)[1].lower())


def is_saved_dataset(path: Path) -> bool:
    """A ``datasets`` ``save_to_disk`` folder: Arrow files with ``state.json`` and
    ``dataset_info.json``."""
    return (
        path.is_dir() and (path / "state.json").is_file() and (path / "dataset_info.json").is_file()
    )


@dataclass(frozen=True)
class SourceSpec:
    """What SRC names, once expanded: ``kind`` and the local files or URLs."""

    kind: str
    items: tuple[str, ...]
    bucket: bool = False


def file_stamp(path: str | os.PathLike[str]) -> str:
    st = os.stat(path)
    return f"{st.st_size}:{st.st_mtime_ns}"


# ---------------------------------------------------------------- labels


def finish_labels(
    found: list[tuple[str, Ref, Any]],
    names: Sequence[str] | None,
    where: str,
    config: Any,
    *,
    root: Path,
    kind: str,
    containers: Sequence[Container],
    skipped: list[dict[str, str]],
    folders: str | None = None,
) -> Any:
    """The ``_Labels`` of a listed source. ``found``: (location, ref, label) in the
    source's order, where label is an index into ``names`` (a ClassLabel's), or a text
    (a class name or an integer), or None (no label). ``--classes`` fixes the map as for
    a folder; texts follow a label table's rules (:func:`labels_from_text`)."""
    from ...sources.cells import labels_from_text
    from ...sources.classes import resolve_classes
    from ..config import _Labels

    fixed = None
    if config.classes is not None:
        from ...storage.open import read_class_map

        fixed = read_class_map(config.classes)
    class_map = (
        None
        if config.classes is None
        else config.classes
        if isinstance(config.classes, str)
        else str(config.classes.resolve())
    )
    new: list[str] = []
    classes_from = ""
    if not found:
        first = f" (first skipped: {skipped[0]['path']}: {skipped[0]['reason']})" if skipped else ""
        raise InputError(f"{where}: no images found{first}")
    if names is not None:  # a ClassLabel: an index outside its names is a broken row
        keep = []
        for rel, ref, lab in found:
            if lab is not None and (not isinstance(lab, int) or not -1 <= lab < len(names)):
                skipped.append(
                    {"path": rel, "reason": f"label {lab} is not a class of the {len(names)} named"}
                )
            else:
                keep.append((rel, ref, lab))
        found = keep
        if not found:
            raise InputError(f"{where}: no row has a usable label")
        used = sorted({lab for _, _, lab in found if lab is not None and lab >= 0})
        if fixed is None:
            classes = list(names)
        else:
            classes, new = resolve_classes(
                [names[i] for i in used], fixed, config.allow_new_classes, map_source=config.classes
            )
        index = {c: i for i, c in enumerate(classes)}
        labels = [-1 if lab is None or lab < 0 else index[names[lab]] for _, _, lab in found]
        classes_from = "dataset" if folders is None else folders
    elif any(lab is not None for _, _, lab in found):
        texts = ["-1" if lab is None else str(lab).strip() for _, _, lab in found]
        numbers = list(range(len(found)))
        labels, classes, new, _ = labels_from_text(
            texts, numbers, Path(where), "(counted from 0)", fixed, config.allow_new_classes
        )
        classes_from = "source"
    else:
        labels, classes = [-1] * len(found), list(fixed or [])
    entries = [Entry(rel, int(lab)) for (rel, _, _), lab in zip(found, labels)]
    refs = {rel: ref for rel, ref, _ in found}
    if len(refs) != len(found):
        raise InputError(f"{where}: two images have the same location; cannot tell them apart")
    scan = SourceScan(
        root=root,
        classes=list(classes),
        entries=entries,
        skipped=skipped,
        refs=refs,
        containers=tuple(containers),
        kind=kind,
        classes_from=classes_from,
    )
    return _Labels(scan=scan, new_classes=new, class_map=class_map)


# ---------------------------------------------------------------- a worker's side


@dataclass
class Fetched:
    """One image of a chunk: its bytes, or why they cannot be read (a skip)."""

    data: bytes | None
    error: str | None = None


_open: dict[Any, Any] = {}  # (pid, kind, where) -> the worker's open container
_OPEN_MAX = 8
_open_lock = threading.RLock()  # make() may open a store through cached() too


def cached(key: Any, make: Any) -> Any:
    """The worker's open handle for ``key``, made by ``make()`` at first use."""
    full = (os.getpid(), *key)
    with _open_lock:  # the parent lists a bucket's shards on several threads
        handle = _open.get(full)
        if handle is None:
            for k in [k for k in _open if k[0] != os.getpid()]:
                del _open[k]  # the parent's, inherited by fork: never used here
            while len(_open) >= _OPEN_MAX:
                old = _open.pop(next(iter(_open)))
                with contextlib.suppress(Exception):
                    old.close()
            handle = _open[full] = make()
    return handle


def drop_cached(under: str) -> None:
    """Close this process's handles whose key names a path under folder ``under`` (a
    build's spool, removed: its files' disk is freed when nothing holds them open)."""
    head = os.path.join(under, "")
    with _open_lock:
        for k in [k for k in _open if any(isinstance(x, str) and x.startswith(head) for x in k)]:
            with contextlib.suppress(Exception):
                _open.pop(k).close()


def capped(data_len: int, cap: int) -> str | None:
    """The skip reason of an image of ``data_len`` bytes over the cap, or None."""
    if data_len > cap:
        return f"{data_len:,} bytes, over the per-image limit of {cap:,}; not read"
    return None
