"""Zip archives as build sources, read in place: an ImageFolder tree, a flat folder,
or images labelled by a table (``--labels``: a table file, or a member of the zip).

The layout rules and the order are a folder's (:mod:`packer.sources.bucket` applies
them to a listing of names): the pack built from a zip equals the pack built from the
same files unpacked, byte for byte, but for the manifest's source root.

A member is read by a decode worker through :mod:`zipfile`, its decompression bounded
twice: by its declared size (over the per-image cap: skipped unread) and by what it
actually yields (read at most cap + 1 bytes; a member that inflates past what it
declared fails its CRC). Never read, each skipped with its name and reason: a name
leading outside the archive (``../x.jpg``, an absolute path), a symbolic link, an
encrypted member.
"""

from __future__ import annotations

import os
import stat
import tempfile
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...errors import InputError, UsageError
from ...sources.bucket import bucket_scan
from ...sources.scan import is_image_name
from .common import Container, Fetched, Ref, cached, capped, file_stamp, finish_labels, one_line
from .options import SourceOptions
from .webdataset import unsafe_name

_ZIP_ERRORS = (
    zipfile.BadZipFile,
    zlib.error,
    NotImplementedError,
    OSError,
    EOFError,
    ValueError,
    RuntimeError,
    KeyError,
)


def plan_named(
    listing: list[tuple[str, int, str]],
    where: str,
    root: Path,
    kind: str,
    make_ref: Callable[[str], Ref],
    containers: list[Container],
    skipped: list[dict[str, str]],
    config: Any,
    read_member: Callable[[str, int], bytes] | None = None,
) -> Any:
    """The plan of images named by ``listing`` ((name, size, tag) in a zip or under a
    bucket prefix): class folders or flat, as a folder; or, with ``--labels``, every
    image labelled by the table's rows (the table a file, or with ``read_member`` one of
    the listed names)."""
    if config.labels is None:
        scan = bucket_scan(where, listing, tree=True)
        found = [(e.rel, make_ref(e.rel), None if e.label < 0 else e.label) for e in scan.entries]
        names = scan.classes if scan.classes else None
        return finish_labels(
            found, names, where, config, root=root, kind=kind, containers=containers,
            skipped=skipped, folders="folders",
        )  # fmt: skip
    from ...sources.labels import apply_table
    from ...sources.tables import read_table
    from ...storage.open import read_class_map
    from ..plan import labels_from_table
    from .common import SourceScan

    scan = bucket_scan(where, listing, tree=False)
    fixed = read_class_map(config.classes) if config.classes is not None else None
    table_path = Path(config.labels)
    given = table_path
    kw = {
        "targets": config.targets,
        "classes": fixed,
        "allow_new_classes": config.allow_new_classes,
    }
    if table_path.is_file() or read_member is None:
        table = read_table(table_path, **kw)
    else:
        member = str(config.labels).replace(os.sep, "/")
        sizes = {n: s for n, s, _ in listing}
        from ...sources.tables import _MAX_TABLE_BYTES

        if member not in sizes:
            raise InputError(
                f"BuildConfig.labels {config.labels}: no such file, nor a member of {where}",
                field="BuildConfig.labels",
            )
        if sizes[member] > _MAX_TABLE_BYTES:
            raise InputError(f"{where} member {member}: too large for a label table")
        with tempfile.TemporaryDirectory(prefix=".imgpack-table-") as tmp:
            local = Path(tmp) / os.path.basename(member)
            local.write_bytes(read_member(member, _MAX_TABLE_BYTES))
            table = read_table(local, **kw)
        given = Path(where) / member  # the manifest names the member, not the temporary copy
    rels = [e.rel for e in scan.entries]
    match = apply_table(table, rels)
    refs = {r: make_ref(r) for r in rels}
    found = SourceScan(
        root=root, classes=[], entries=scan.entries, skipped=skipped, refs=refs,
        containers=tuple(containers), kind=kind,
    )  # fmt: skip
    class_map = (
        None
        if config.classes is None
        else config.classes
        if isinstance(config.classes, str)
        else str(config.classes.resolve())
    )
    return labels_from_table(found, match, table, given, class_map, where)


def _open_zip(where: str) -> zipfile.ZipFile:
    if "://" in where:
        from .remote import open_range

        source: Any = open_range(where)
    else:
        source = where
    try:
        return zipfile.ZipFile(source)
    except _ZIP_ERRORS as e:
        raise InputError(f"{where}: not a zip archive zipfile can read ({one_line(e)})") from None


def _member_problem(info: zipfile.ZipInfo) -> str | None:
    why = unsafe_name(info.filename)
    if why is not None:
        return why.replace("shard", "archive")
    mode = info.external_attr >> 16
    if stat.S_ISLNK(mode):
        return "a symbolic link member; not read"
    if stat.S_IFMT(mode) not in (0, stat.S_IFREG):
        return "not a regular file member; not read"
    if info.flag_bits & 0x1:
        return "an encrypted member; not read"
    return None


def index_zips(items: tuple[str, ...], opts: SourceOptions, config: Any) -> Any:
    """The images of one zip archive (a local path or a URL)."""
    if len(items) != 1:
        raise UsageError("SRC: one zip archive at a time")
    where = items[0]
    if "://" in where:
        from .remote import object_stamp

        stamp = object_stamp(where)
    else:
        stamp = file_stamp(where)
    name = os.path.basename(where)
    c = Container("zip", where, name, opts.max_image_bytes, "", stamp)
    zf = _open_zip(where)
    listing: list[tuple[str, int, str]] = []
    skipped: list[dict[str, str]] = []
    seen: set[str] = set()
    try:
        for info in zf.infolist():
            if info.is_dir():
                continue
            n = info.filename
            why = _member_problem(info)
            if why is None and not is_image_name(n.rsplit("/", 1)[-1]):
                if config.labels is not None and n == str(config.labels):
                    listing.append((n, info.file_size, ""))  # the table itself
                continue
            if why is None and n in seen:
                why = "a second member of the same name; only the first is read"
            if why is None:
                why = capped(info.file_size, c.cap)
            if why is not None:
                skipped.append({"path": n, "reason": why})
                continue
            seen.add(n)
            listing.append((n, info.file_size, ""))

        def read_member(member: str, limit: int) -> bytes:
            with zf.open(member) as f:
                return f.read(limit + 1)[:limit]

        root = Path(where) if "://" in where else Path(where).resolve()
        return plan_named(
            listing, where, root, "zip", lambda rel: (c, rel), [c], skipped, config, read_member
        )
    finally:
        zf.close()


def read_zip_members(c: Container, names: list[str]) -> list[Fetched]:
    """The bytes of members ``names`` of zip ``c``, each inflated to at most the cap."""
    zf: zipfile.ZipFile = cached(("zip", c.where, c.stamp), lambda: _open_zip(c.where))
    out = []
    for name in names:
        try:
            info = zf.getinfo(name)
            why = _member_problem(info) or capped(info.file_size, c.cap)
            if why:
                out.append(Fetched(None, why))
                continue
            with zf.open(info) as f:
                data = f.read(c.cap + 1)
            if len(data) > c.cap:
                out.append(Fetched(None, f"inflates past the per-image limit of {c.cap:,} bytes"))
            elif len(data) != info.file_size:
                out.append(
                    Fetched(
                        None,
                        f"inflates to {len(data):,} bytes, not the {info.file_size:,} it declares",
                    )
                )
            else:
                out.append(Fetched(data))
        except _ZIP_ERRORS as e:
            out.append(Fetched(None, f"cannot be read from the archive ({one_line(e)})"))
    return out
