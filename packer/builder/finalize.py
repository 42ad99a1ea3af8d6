"""Finalizing a build: assemble the pack from the finished work folder, move it into place.

A sequence of idempotent steps, each recoverable from what is on disk (see
:func:`_finalize`): compaction when images were skipped, labels, targets, manifest,
tensordict meta, the JPEG pack's assembly, then the rename into place. :func:`_reached`
marks each step (crash tests patch it here to stop the build there).
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from .._fs import fsync_dir, write_atomic
from .._version import __version__
from ..errors import NoUsableImagesError
from ..imaging.decode import ResizeSpec
from ..pack.files import read_manifest
from ..pack.kinds import Parts, kind_of
from ..pack.schema import DATA_DIR, LABELS_FILE, TARGETS_FILE, BuildInfo, Checksums, Manifest, Skip
from ..pack.writer import digest, image_bytes, write_pack_metadata
from ..sources.scan import Scan
from .config import GPU_TOLERANCE, BuildConfig, BuildResult, _Labels
from .workdir import (
    JOURNAL,
    PLAN,
    ROWS_FILE,
    WorkState,
    clear_work_dir,
    mark_assembled,
    trash_dir_for,
)
from .workers import CHUNKS_DIR, _chunk_file


def _reached(step: str) -> None:
    """Called between finalize's steps; crash tests make it raise to stop the build there."""


def _finalize(
    plan: _Labels,
    dst: Path,
    work: Path,
    config: BuildConfig,
    state: WorkState,
    block: int,
    resumed: int,
    t0: float,
    fingerprint: str,
    device: Any = None,
    times: dict[str, Any] | None = None,
    timeline: Any = None,
) -> BuildResult:
    """Assemble the pack in ``work`` and move it to ``dst``, in idempotent steps.

    Each step's result is on disk before the next starts, and a rerun finds
    where a crash stopped: rows file present (data not yet moved), journal and
    plan (assembly not finished), ``"assembled"`` in the plan (only the move is
    left), no plan (the work is discarded and rebuilt), an old pack aside
    (:func:`recover_trash`). ``timeline``: a :class:`packer.builder.timeline.Timeline`
    whose phases this marks (the rows' fsync, the data, the manifest, the rename).
    """
    mark = timeline.mark if timeline is not None else (lambda phase, at=None: None)
    spec = config.spec
    scan = plan.scan
    clock = {} if times is None else times.setdefault("finalize", {})
    t = time.perf_counter()
    if state.assembled:  # a crash came after the pack was complete: only the move is left
        m = read_manifest(work)
        count, skipped = m.count, [{"path": k.path, "reason": k.reason} for k in m.skipped]
        result = _move_into_place(work, dst, count, skipped, plan, spec, resumed, t0)
        result.image_shape, result.storage = list(m.image_shape), m.storage
        if m.dense is not None:
            from .dense import summary_of

            result.dense = summary_of(m.dense)
        return result
    done = state.done
    spec = config.spec
    row = image_bytes(spec.shape)
    skip_reason: dict[int, str] = {}
    sizes: list[list[int]] = []
    shas: list[str] = []
    for k in sorted(done):
        rec = done[k]
        skip_reason.update({int(i): r for i, r in rec["skips"]})
        sizes.extend(rec["sizes"])
        shas.append(rec["sha"])
    keep = [i for i in range(len(scan.entries)) if i not in skip_reason]
    n = len(keep)
    if not keep:
        clear_work_dir(work)  # nothing usable: no pack, and nothing left beside DST
        first = scan.entries[0].rel
        raise NoUsableImagesError(
            f"{scan.root}: none of its {len(scan.entries)} images could be used (first: "
            f"{first}: {skip_reason[0]}); no pack was written"
        )
    (work / DATA_DIR).mkdir(exist_ok=True)
    kind = kind_of(config.store)
    parts = Parts(
        rows=work / ROWS_FILE,
        chunk_file=lambda k: _chunk_file(work, k),
        chunk_dir=work / CHUNKS_DIR,
        done=done,
        keep=keep,
        skipped=bool(skip_reason),
        block=block,
        row_bytes=row,
        shas=shas,
        clock=clock,
    )
    t_assemble = time.perf_counter()
    written = kind.assemble(work / DATA_DIR, parts)
    shas = written["shas"]
    clock["compact_or_rename"] = time.perf_counter() - t
    if "fsync_rows" in clock:  # the assembly starts with it
        mark("rows_fsynced", t_assemble + clock["fsync_rows"])
    mark("data_assembled")
    t = time.perf_counter()
    _reached("data")
    labels = np.array([scan.entries[i].label for i in keep], dtype="<i8")
    write_atomic(work / DATA_DIR / LABELS_FILE, labels.tobytes())
    targets_sha = ""
    if plan.targets is not None:
        # the same kept rows as the labels; float32 as read, never cast (little-endian
        # C-order, what tensordict's memmap and packer.load map)
        targets = np.ascontiguousarray(plan.targets[keep], dtype="<f4")
        write_atomic(work / DATA_DIR / TARGETS_FILE, targets.tobytes())
        targets_sha = digest(targets.tobytes())
    dense_record = dense_summary = None
    if plan.dense is not None:  # boxes, masks, keypoints moved as the images were
        from .dense import write_dense_targets

        dense_record, dense_summary = write_dense_targets(
            plan, config, keep, sizes, work / DATA_DIR
        )
    _reached("labels")
    skipped = _skip_list(scan, skip_reason)
    manifest = _manifest(plan, config, keep, sizes, shas, labels, targets_sha, skipped, block)
    if device is not None:
        extra = {**manifest.build.extra, "device": device.type, "tolerance": GPU_TOLERANCE}
        manifest = replace(manifest, build=replace(manifest.build, extra=extra))
    manifest = kind.stamp(manifest, written)
    if dense_record is not None:
        manifest = replace(manifest, dense=dense_record)
    write_pack_metadata(work, manifest)
    fsync_dir(work / DATA_DIR)
    fsync_dir(work)
    _reached("manifest")
    mark_assembled(work, fingerprint)
    _reached("assembled")
    clock["metadata"] = time.perf_counter() - t
    mark("manifest_written")
    t = time.perf_counter()
    result = _move_into_place(work, dst, n, skipped, plan, spec, resumed, t0)
    clock["move"] = time.perf_counter() - t
    mark("moved")
    result.image_shape = list(manifest.image_shape)  # jpeg: the largest stored image
    result.storage = manifest.storage
    result.dense = dense_summary
    return result


def _manifest(
    plan: _Labels,
    config: BuildConfig,
    keep: list[int],
    sizes: list[list[int]],
    shas: list[str],
    labels: np.ndarray,
    targets_sha: str,
    skipped: list[dict[str, str]],
    block: int,
) -> Manifest:
    """The manifest of the kept images, before the storage kind stamps its fields."""
    scan = plan.scan
    n = len(keep)
    counts = (
        np.bincount(labels[labels >= 0], minlength=len(scan.classes)).tolist()
        if scan.classes
        else []  # integer labels from a table without a map: no classes to count
    )
    manifest = Manifest(
        count=n,
        image_shape=config.spec.shape,
        resize=config.resize,
        classes=tuple(scan.classes),
        class_counts=tuple(counts),
        sources=tuple(scan.entries[i].rel for i in keep),
        source_sizes=tuple((sizes[i][0], sizes[i][1]) for i in keep),
        skipped=tuple(Skip(s["path"], s["reason"]) for s in skipped),
        build=BuildInfo(
            max_pixels=config.max_pixels,
            source_root=str(scan.root.resolve()),
            imgpack_version=__version__,
            created=None if plan.shard else time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            labels_table=plan.table,
            labels_sha256=plan.table_sha256,
            unlisted=plan.ignored if plan.table is not None else None,
            extra={"missing_rows": plan.missing_rows} if plan.missing_rows else {},
        ),
        checksums=Checksums(
            block_rows=block,
            images=tuple(shas),
            labels=digest(labels.tobytes()),
            targets=targets_sha,
        ),
        targets=plan.target_names,
        class_map=plan.class_map,
    )
    return replace(manifest, max_side=config.max_side, quality=config.quality)


def _skip_list(scan: Scan, skip_reason: dict[int, str]) -> list[dict[str, str]]:
    """Every skip, by path: what the scan could not read and the images that did not decode."""
    skipped = [{"path": scan.entries[i].rel, "reason": r} for i, r in skip_reason.items()]
    return sorted(scan.skipped + skipped, key=lambda s: s["path"])


def _move_into_place(
    work: Path,
    dst: Path,
    count: int,
    skipped: list[dict[str, str]],
    plan: _Labels,
    spec: ResizeSpec,
    resumed: int,
    t0: float,
) -> BuildResult:
    """The last steps: drop the build's bookkeeping, then rename the pack to DST."""
    for name in (JOURNAL, PLAN):  # the plan last: it says what the work folder is
        (work / name).unlink(missing_ok=True)
        fsync_dir(work)
        _reached(name)
    if dst.exists() and any(dst.iterdir()):
        trash = trash_dir_for(dst)
        if trash.exists():
            shutil.rmtree(trash)
        os.replace(dst, trash)
        _reached("aside")
        os.replace(work, dst)
        _reached("moved")
        shutil.rmtree(trash)
    else:
        os.replace(work, dst)  # onto a missing or empty DST: one atomic rename
    fsync_dir(dst.parent)
    return BuildResult(
        path=dst,
        count=count,
        skipped=skipped,
        classes=plan.scan.classes,
        image_shape=list(spec.shape),
        seconds=time.perf_counter() - t0,
        resumed=resumed,
        ignored=plan.ignored,
        new_classes=list(plan.new_classes),
        targets=list(plan.target_names),
        classes_from=_classes_from(plan),
    )


def _classes_from(plan: _Labels) -> str | None:
    """Where the class map came from (BuildResult.classes_from)."""
    if not plan.scan.classes:
        return None
    if plan.class_map is not None:
        return "classes"
    if getattr(plan.scan, "classes_from", None):  # a source's (packer.builder.formats.base)
        return str(plan.scan.classes_from)  # type: ignore[attr-defined]
    return "folders" if plan.table is None else "labels"
