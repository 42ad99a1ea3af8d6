"""What a build will do, fixed before any decode: the images and their labels, the
destination checks, and the fingerprint a rerun compares before it resumes.

Labels (:mod:`packer.sources.labels`): the class folders (ImageFolder's indices), or the
``--classes`` map (a text file or a pack; a folder not in it is an error unless
``--allow-new-classes``), or a ``--labels`` table whose rows name images under SRC,
with optional ``--targets`` columns stored as float32 ``targets [N, K]``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..pack.describe import is_pack
from ..pack.schema import FORMAT_VERSION
from ..sources.classes import apply_class_map, resolve_classes
from ..sources.labels import apply_table
from ..sources.scan import Scan, list_images, scan_tree
from ..sources.tables import read_table
from .config import BuildConfig, _Labels

log = logging.getLogger(__name__)


def plan_labels(src: Path, config: BuildConfig) -> _Labels:
    """Find the images and fix their labels: class folders through the ``--classes`` map,
    or the rows of a ``--labels`` table. Raises InputError for a class not in the map,
    a bad table (with its row number) or a table that names no image under ``src``.
    A dense build (``config.dense``, or a folder :func:`~packer.builder.dense.detect_dense`
    recognises) lists the annotated images instead (:func:`~packer.builder.dense.plan_dense`)."""
    if config.labels is None:
        from .dense import DenseOptions, detect_dense, plan_dense

        found = None if config.dense is not None else detect_dense(src)
        if config.dense is not None or found is not None:
            return plan_dense(src, config, config.dense or DenseOptions(format=found or "auto"))
    fixed = None
    if config.classes is not None:
        # the reader's module maps packs with torch: imported for --classes only, so a
        # build's parent and its workers start without torch
        from ..storage.open import read_class_map

        fixed = read_class_map(config.classes)
    class_map = (
        None
        if config.classes is None
        else config.classes
        if isinstance(config.classes, str)  # a URL
        else str(config.classes.resolve())
    )
    if config.labels is None:
        scan = scan_tree(src)
        classes, new = resolve_classes(
            scan.classes, fixed, config.allow_new_classes, map_source=config.classes
        )
        if new:
            log.warning("classes not in %s, appended at the end: %s", config.classes, new)
        return _Labels(scan=apply_class_map(scan, classes), new_classes=new, class_map=class_map)
    table_path = config.labels
    table = read_table(
        table_path,
        targets=config.targets,
        classes=fixed,
        allow_new_classes=config.allow_new_classes,
    )
    found = list_images(src)
    match = apply_table(table, [e.rel for e in found.entries], src=src)
    return labels_from_table(found, match, table, table_path, class_map, str(src))


def labels_from_table(
    found: Scan, match: Any, table: Any, table_path: Path, class_map: str | None, where: str
) -> _Labels:
    """The labelled images of a ``--labels`` table matched against the images ``found``
    under SRC (``where`` names it: a folder or a bucket URL): InputError when no row names
    one; rows naming no image are recorded as skipped (the first ones, then a count)."""
    if not match.entries:
        first = match.missing[0][0]
        raise InputError(
            f"{table_path}: none of its {len(table)} rows names an image under {where} "
            f"(first: {first!r}); paths are relative to SRC, check SRC and the table"
        )
    if match.ignored:
        log.info(
            "%d image(s) under %s have no row in %s; ignored", match.ignored, where, table_path
        )
    missing = [{"path": rel, "reason": reason} for rel, reason in match.missing]
    if match.missing_count > len(match.missing):
        # A table of a million rows naming no file would store a million skips; list
        # the first ones and count the rest under the table's own path.
        missing.append(
            {
                "path": str(table_path),
                "reason": f"and {match.missing_count - len(match.missing)} more rows that "
                f"name no image under SRC ({match.missing_count} in all; the first "
                f"{len(match.missing)} are listed)",
            }
        )
    scan = replace(
        found,
        classes=list(match.classes),
        entries=match.entries,
        skipped=found.skipped + missing,
    )
    return _Labels(
        scan=scan,
        targets=match.targets,
        target_names=tuple(table.target_names),
        new_classes=list(match.new_classes),
        ignored=match.ignored,
        missing_rows=match.missing_count,
        class_map=class_map,
        table=str(Path(table_path).resolve()),
        table_sha256=table.sha256,
    )


def check_not_nested(src: Path, dst: Path, what: str = "pack") -> None:
    """Refuse a destination inside its source, or one that contains it."""
    rs, rd = src.resolve(), dst.resolve()
    if rd == rs or rd.is_relative_to(rs):
        raise InputError(
            f"{dst}: the {what} would be inside its source {src}; "
            "choose a destination outside the source folder"
        )
    if rs.is_relative_to(rd):
        raise InputError(f"{dst}: contains the source {src}; choose another destination")


def check_destination(src: Path, dst: Path, overwrite: bool) -> None:
    """Refuse destinations that would lose data or nest the pack inside its source."""
    check_not_nested(src, dst)
    if dst.exists() or dst.is_symlink():
        if dst.is_dir() and is_pack(dst):
            if not overwrite:
                raise InputError(
                    f"{dst}: a pack already exists; pass BuildConfig.overwrite to replace it",
                    field="BuildConfig.overwrite",
                )
        elif dst.is_dir() and not any(dst.iterdir()):
            pass  # an empty folder is fine
        else:
            raise InputError(
                f"{dst}: exists and is not an imgpack pack; refusing to replace it "
                "(choose a new path or remove it yourself)"
            )


def plan_fingerprint(plan: _Labels, config: BuildConfig, device: Any = None) -> str:
    """What the rows and labels of the work folder depend on: a rerun resumes only when
    this is unchanged (options, class map, table and targets, every source's stat)."""
    scan = plan.scan
    h = hashlib.sha256()
    h.update(
        json.dumps(
            [FORMAT_VERSION, list(config.size), config.resize, config.max_pixels, scan.classes]
        ).encode()
    )
    if device is not None:  # other pixels than the CPU path: never mixed with its chunks
        h.update(json.dumps(["device", device.type]).encode())
    own = config.kind.fingerprint(config)  # None for raw, so raw builds keep theirs
    if own is not None:
        h.update(json.dumps(own).encode())
    if plan.table_sha256 is not None or plan.class_map is not None:
        # only with --classes/--labels, so plain builds keep their fingerprint
        targets = b"" if plan.targets is None else plan.targets.astype("<f4").tobytes()
        h.update(
            json.dumps(
                [plan.class_map, plan.table, plan.table_sha256, list(plan.target_names)]
            ).encode()
        )
        h.update(hashlib.sha256(targets).digest())
    root = str(scan.root)
    if (stamps := getattr(scan, "stamps", None)) is not None:  # a source (packer.sources)
        h.update(stamps())
        h.update("\n".join(f"{e.rel}\0{e.label}" for e in scan.entries).encode())
        return h.hexdigest()
    for e in scan.entries:
        try:
            st = os.stat(os.path.join(root, e.rel))
            stamp = f"{st.st_size}:{st.st_mtime_ns}"
        except OSError:
            stamp = "missing"
        h.update(f"{e.rel}\0{e.label}\0{stamp}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()
