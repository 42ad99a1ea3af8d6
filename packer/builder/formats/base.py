"""Sources that are not a folder of image files: parquet and Arrow tables, WebDataset
tars, zip archives and object-store prefixes (issue 47).

One small interface for all of them. A source is listed once, in the parent, into a
:class:`SourceScan`: the images in the source's own order, each with

* a *location* (:attr:`Entry.rel`): how a person finds it again, e.g.
  ``train-00003.parquet row 1,204`` or ``train-000017.tar member 000123.jpg`` (a zip's or
  a bucket's images keep their path inside it, as a folder's do); skips and the
  manifest's ``sources`` name images by it;
* its label, as a folder's image has;
* a *ref* ``(Container, position)``: what a decode worker needs to read its bytes
  (:mod:`packer.builder.formats.fetch`), so the bytes are read by the same worker processes that
  decode them, in chunks, never the whole source at once, and a resumed build reads
  only the chunks it lacks.

:func:`source_plan` is the build's hook: the labelled plan of SRC when SRC is such a
source, None for a folder (the build goes on as before). Nothing here imports pyarrow,
Pillow or numpy at module level.
"""

from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import InputError, UsageError
from ...sources.scan import Entry, Scan

# A label member (``cls``, ``json``) of a WebDataset sample, at most
MAX_LABEL_BYTES = 1 << 20

from .options import SourceOptions  # noqa: E402

KINDS = ("parquet", "arrow", "tar", "zip", "object")
SUFFIX_KIND = {".parquet": "parquet", ".arrow": "arrow", ".tar": "tar", ".zip": "zip"}


@dataclass(frozen=True)
class Container:
    """One file or object a source's images are read from (or, kind ``object``, the
    bucket prefix whose objects are images). ``where``: a local path or an
    ``s3://`` (``gs://``, ``az://``) URL; ``name``: what locations call it; ``column``:
    a table's image column; ``stamp``: size and mtime (or ETag) when it was listed."""

    kind: str
    where: str
    name: str
    cap: int
    column: str = ""
    stamp: str = ""


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


def source_spec(src: Any) -> SourceSpec | None:
    """What kind of source ``src`` is (a str, a path, or a list of them: files, globs,
    brace ranges, a ``save_to_disk`` folder, a bucket URL), or None: a folder of images,
    which the build scans as before."""
    texts = [os.fspath(s) for s in src] if isinstance(src, (list, tuple)) else [os.fspath(src)]
    if not texts:
        raise UsageError("SRC: give a folder, files or a bucket URL")
    if any("://" in t for t in texts):
        if len(texts) > 1:
            raise UsageError("SRC: give one bucket URL (brace ranges name several shards)")
        from .remote import bucket_spec

        return bucket_spec(texts[0])
    if len(texts) == 1 and is_saved_dataset(Path(texts[0])):
        return SourceSpec("arrow", (texts[0],))
    if len(texts) == 1 and (Path(texts[0]) / "dataset_dict.json").is_file():
        splits = sorted(p.name for p in Path(texts[0]).iterdir() if is_saved_dataset(p))
        raise UsageError(
            f"{texts[0]}: a datasets DatasetDict (splits: {', '.join(splits) or 'none'}); "
            f"give one split's folder, e.g. {Path(texts[0]) / (splits[0] if splits else 'train')}"
        )
    names: list[str] = []
    for t in texts:
        if os.path.lexists(t):  # a path that exists is taken as it is, brackets and all
            names.append(t)
            continue
        for e in expand_braces(t):
            if glob.has_magic(e):
                found = sorted(glob.glob(e))
                if not found:
                    raise InputError(f"{e}: no file matches this pattern")
                names += found
            else:
                names.append(e)
    kinds = {_kind_of_name(n) for n in names}
    if kinds == {None}:
        if len(names) == 1:
            return None  # a folder of images, or a path the folder scan reports on
        raise UsageError(
            "SRC: several paths are read as parquet, Arrow, tar or zip files; give one "
            "folder of images, or files ending in .parquet, .arrow, .tar or .zip"
        )
    if len(kinds) > 1:
        raise UsageError(
            "SRC: files of one kind at a time (.parquet, .arrow, .tar or .zip), not a mix of "
            + " and ".join(sorted(k or "other paths" for k in kinds))
        )
    kind = kinds.pop()
    assert kind is not None
    if len(names) != len(set(names)):
        raise UsageError("SRC: a file is named twice")
    for n in names:
        p = Path(n)
        if not p.exists():
            raise InputError(f"{n}: no such file; check the path")
        if not p.is_file():
            raise InputError(f"{n}: not a regular file")
    return SourceSpec(kind, tuple(names))


# ---------------------------------------------------------------- the plan


def source_plan(src: Any, dst: Any, config: Any) -> Any:
    """The build's hook: the labelled images (a ``_Labels`` of a :class:`SourceScan`)
    when ``src`` is a parquet/Arrow/tar/zip source or a bucket prefix read by this
    machine, else None. Refuses, with a usage error, what such a source does not take."""
    if isinstance(src, os.PathLike) and Path(src).is_dir() and not is_saved_dataset(Path(src)):
        return None  # a folder of images: the scan's
    a_set = config.engine == "ray" or config.shard_size is not None or config.append
    if a_set and isinstance(src, str) and "://" in src:
        return None  # a bucket of images for a pack set: the set's own path
    spec = source_spec(src)
    if spec is None:
        if isinstance(src, (list, tuple)):
            raise UsageError("SRC: a folder of images is given alone, not in a list")
        return None
    opts: SourceOptions = config.sources
    opts.validate()
    if a_set:
        raise UsageError(
            f"SRC is a {spec.kind} source: it builds one pack on this machine; "
            "BuildConfig.shard_size, BuildConfig.append and BuildConfig.engine ray take a "
            "folder of images",
            field="BuildConfig.shard_size",
        )
    if config.device not in ("cpu", "auto"):
        raise UsageError(
            f"BuildConfig.device {config.device}: images from a {spec.kind} source are "
            "decoded by the CPU workers; use BuildConfig.device cpu",
            field="BuildConfig.device",
        )
    if isinstance(dst, str) and "://" in dst:
        raise UsageError(
            f"DST {dst}: a pack from a {spec.kind} source is built on this machine; build "
            "it to a local folder (a pack set in a bucket is built from a folder of images)"
        )
    if config.labels is not None and spec.kind not in ("zip", "object"):
        raise UsageError(
            f"BuildConfig.labels: a {spec.kind} source carries its labels ("
            + (
                "SourceOptions.label_column"
                if spec.kind in ("parquet", "arrow")
                else "cls or SourceOptions.label_field"
            )
            + "); a label table goes with a zip or a bucket of images",
            field="BuildConfig.labels",
        )
    if config.targets:
        raise UsageError(
            "BuildConfig.targets reads columns of a BuildConfig.labels table; not with this source",
            field="BuildConfig.targets",
        )
    listing = _index(spec, opts, config)
    _check_not_inside(spec, dst)
    return listing


def _index(spec: SourceSpec, opts: SourceOptions, config: Any) -> Any:
    if spec.bucket:
        from .remote import index_bucket

        return index_bucket(spec, opts, config)
    if spec.kind == "parquet":
        from .parquet import index_parquet

        return index_parquet([Path(p) for p in spec.items], opts, config)
    if spec.kind == "arrow":
        from .parquet import index_arrow

        return index_arrow(spec.items, opts, config)
    if spec.kind == "tar":
        from .webdataset import index_tars

        return index_tars(spec.items, opts, config)
    from .archive import index_zips

    return index_zips(spec.items, opts, config)


def _check_not_inside(spec: SourceSpec, dst: Any) -> None:
    if spec.bucket or dst is None:
        return
    rd = Path(os.path.abspath(dst)).resolve()
    for item in spec.items:
        rs = Path(item).resolve()
        if rs == rd or rs.is_relative_to(rd):
            raise InputError(f"{dst}: contains the source {item}; choose another destination")


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
