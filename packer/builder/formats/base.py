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

:func:`source_plan` is the build's hook, on top of the readers (:mod:`.parquet`,
:mod:`.webdataset`, :mod:`.archive`, :mod:`.remote`), which never import it; what they
share is one floor down in :mod:`.common` (importable from here too): the labelled plan of SRC when SRC is such a
source, None for a folder (the build goes on as before). Nothing here imports pyarrow,
Pillow or numpy at module level.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any

from ...errors import InputError, UsageError
from ...sources.scan import is_image_name
from .common import (
    KINDS,
    MAX_LABEL_BYTES,
    SUFFIX_KIND,
    Container,
    Ref,
    SourceScan,
    SourceSpec,
    _kind_of_name,
    capped,
    expand_braces,
    file_stamp,
    finish_labels,
    is_saved_dataset,
    member_location,
    one_line,
    row_location,
)
from .options import SourceOptions

__all__ = [
    "KINDS",
    "MAX_LABEL_BYTES",
    "SUFFIX_KIND",
    "Container",
    "Ref",
    "SourceOptions",
    "SourceScan",
    "SourceSpec",
    "expand_braces",
    "file_stamp",
    "finish_labels",
    "is_saved_dataset",
    "member_location",
    "one_line",
    "row_location",
    "source_plan",
    "source_spec",
]


_NAME_MAX = 255  # bytes of one name in a path (Linux, macOS); longer: no such file


def _check_name_lengths(text: str, patterns: bool) -> None:
    """InputError for a local path with a name longer than a file system allows (every
    stat of it raises ENAMETOOLONG, which Path.exists/is_dir do not turn into False);
    with ``patterns``, names with brace or glob characters are left to their expansion."""
    for part in Path(text).parts:
        if patterns and ("{" in part or glob.has_magic(part)):
            continue
        if len(os.fsencode(part)) > _NAME_MAX:
            raise InputError(
                f"{text}: the name {part[:40]}... is {len(os.fsencode(part)):,} bytes, over "
                f"the {_NAME_MAX} a file name can have; check the path"
            )


def _quietly(check: Any) -> bool:
    """``check()``, False where it raises OSError (a pattern's text too long to stat)."""
    try:
        return bool(check())
    except OSError:
        return False


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
    for t in texts:  # a pattern's parts are checked once expanded
        _check_name_lengths(t, patterns=True)
    if len(texts) == 1 and _quietly(lambda: is_saved_dataset(Path(texts[0]))):
        return SourceSpec("arrow", (texts[0],))
    if len(texts) == 1 and _quietly(lambda: (Path(texts[0]) / "dataset_dict.json").is_file()):
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
    for n in names:
        _check_name_lengths(n, patterns=False)
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
    # the readers are imported by the source that needs one: a folder build loads none
    from .archive import index_zips
    from .parquet import index_arrow, index_parquet
    from .webdataset import index_tars

    if spec.bucket:
        return _index_bucket(spec, opts, config)
    if spec.kind == "parquet":
        return index_parquet([Path(p) for p in spec.items], opts, config)
    if spec.kind == "arrow":
        return index_arrow(spec.items, opts, config)
    if spec.kind == "tar":
        return index_tars(spec.items, opts, config)
    return index_zips(spec.items, opts, config)


def _check_not_inside(spec: SourceSpec, dst: Any) -> None:
    if spec.bucket or dst is None:
        return
    rd = Path(os.path.abspath(dst)).resolve()
    for item in spec.items:
        rs = Path(item).resolve()
        if rs == rd or rs.is_relative_to(rd):
            raise InputError(f"{dst}: contains the source {item}; choose another destination")


def _index_bucket(spec: SourceSpec, opts: SourceOptions, config: Any) -> Any:
    from .archive import index_zips, plan_named
    from .parquet import index_parquet
    from .webdataset import index_tars

    assert spec.kind in KINDS
    from .remote import _LISTINGS, _listing, _store

    _LISTINGS.clear()
    if spec.kind == "object":
        url = spec.items[0]
        listing = _listing(url)
        tag = ",".join(f"{k}:{s}:{e}" for k, s, e in sorted(listing))
        import hashlib

        c = Container(
            "object", url, url, opts.max_image_bytes, "", hashlib.sha256(tag.encode()).hexdigest()
        )
        sizes = {k: s for k, s, _ in listing}

        def read_member(key: str, limit: int) -> bytes:
            return _store(url).get(key, max_bytes=limit)

        skipped = []
        keep = []
        for k, s, e in listing:
            why = capped(s, opts.max_image_bytes)
            if why and is_image_name(k.rsplit("/", 1)[-1]):
                skipped.append({"path": k, "reason": why})
            else:
                keep.append((k, s, e))
        del sizes
        return plan_named(
            keep, url, Path(url), "object", lambda rel: (c, rel), [c], skipped, config, read_member
        )
    if spec.kind == "parquet":
        return index_parquet(list(spec.items), opts, config)
    if spec.kind == "tar":
        return index_tars(spec.items, opts, config)
    if spec.kind == "zip":
        return index_zips(spec.items, opts, config)
    raise UsageError(f"{spec.items[0]}: {spec.kind} sources are read from local disk")
