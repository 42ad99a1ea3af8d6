"""``imgpack build --shard-size SIZE [--append]``: a pack set of immutable shards.

Data flow::

    scan + labels (as a single build: one class map for every shard) -> cut the list
    into shards in source order -> each shard a complete pack, built by the single-pack
    build into SET/<k>-<hash> -> the index (packer.pack.index), written last: the commit

Where shards end and their names (fixed by the inputs and the options only), which are
in place already, and the ``--append`` checks: :mod:`packer.builder.set_plan`.

Crash safety: each shard is built by :func:`packer.builder.run.build` (its own work folder
beside it, inside the set, resumed by a rerun) and renamed into place whole. A rerun of
a killed build keeps every shard already in place (its manifest valid), builds the rest
and writes the index: byte-identical to an uninterrupted build. Shards no index names
(left by a build with other inputs) are removed once the new index is in place.

Who builds the shards is an engine's choice, never the bytes': :func:`plan_set` (the
driver's plan, in :mod:`packer.builder.set_plan`), :func:`commit_shard` (one shard, put in
place whole; idempotent) and :func:`finish_set` (the index) are the same for the local
engine (one shard after another, here) and ``--engine ray``
(:mod:`packer.builder.ray_engine`, a task per shard).

``--append`` reads the index, refuses other options, class map or targets (naming
which), builds the images under SRC that the set has not seen (neither holds nor
skipped) as new shards after the old ones, which are never rewritten, and swaps the
index. An image whose path the set holds is not rebuilt even if its file changed;
removing images from a set is not offered (build a new set).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .._fs import destination_error
from ..errors import InputError, NoUsableImagesError, UsageError
from ..pack.files import loads_json
from ..pack.index import (
    INDEX,
    SetIndex,
    ShardEntry,
    data_bytes,
    is_set,
    manifest_digest,
    write_index,
)
from ..pack.schema import MANIFEST, Manifest, Skip
from ..storage.url import parse_url
from .config import BuildConfig, BuildResult, _Labels
from .finalize import _classes_from
from .plan import check_not_nested, plan_labels
from .run import _build_device, build
from .set_plan import SetPlan, ShardSink, _complete, plan_set
from .sizes import MAX_BYTES as MAX_BYTES  # re-exported: old import path
from .sizes import parse_bytes as parse_bytes
from .workdir import dest_lock, refuse_symlink_destination

log = logging.getLogger(__name__)

DEFAULT_SHARD_SIZE = 256 * 1000**2  # 256 MB: ~1,700 224x224 raw images, ~2,000 ImageNet JPEGs
# what a set build writes into the set folder besides the index (shard folders: set_plan)
_OWN = re.compile(r"\.?(\d{5,})-[0-9a-f]{16}(\.imgpack-partial|\.imgpack-old)?")


def _reached(step: str) -> None:
    """Called between a set build's steps ("shard <k>" once shard k is in place, "index"
    before the index is written, "committed" after); crash tests make it stop there."""


def _check_destination(src: Path, dst: Path, config: BuildConfig) -> None:
    """Refuse a set destination that would lose data or nest the set inside its source."""
    check_not_nested(src, dst, "set")
    _check_set_destination(dst, config)


def _check_set_destination(dst: Path, config: BuildConfig) -> None:
    """Refuse a set destination that would lose data."""
    if not (dst.exists() or dst.is_symlink()):
        if config.append:
            raise UsageError(
                f"BuildConfig.append: {dst} holds no pack set; build one first (without "
                "BuildConfig.append)",
                field="BuildConfig.append",
            )
        return
    if not dst.is_dir():
        raise InputError(f"{dst}: exists and is not a folder; choose another destination")
    if (dst / MANIFEST).exists():
        raise InputError(
            f"{dst}: holds a single pack; BuildConfig.shard_size writes a pack set, choose "
            "another destination (or remove the pack yourself)",
            field="BuildConfig.shard_size",
        )
    if is_set(dst):
        if not (config.append or config.overwrite):
            raise InputError(
                f"{dst}: a pack set already exists; pass BuildConfig.append to add SRC's "
                "new images or BuildConfig.overwrite to rebuild it",
                field="BuildConfig.append",
            )
        return
    if config.append:
        raise UsageError(
            f"BuildConfig.append: {dst} holds no pack set; build one first (without "
            "BuildConfig.append)",
            field="BuildConfig.append",
        )
    other = sorted(n for n in os.listdir(dst) if not _OWN.fullmatch(n) and n != INDEX + ".tmp")
    if other:
        raise InputError(
            f"{dst}: exists and is not a pack set (it holds {other[0]!r}); refusing to "
            "write into it (choose a new path or remove it yourself)"
        )


def _entry(path: Path) -> tuple[ShardEntry, Manifest]:
    """The index's record of the shard just built (or kept) at ``path``."""
    data = (path / MANIFEST).read_bytes()
    m = Manifest.from_json(loads_json(data), where=f"{path}: {MANIFEST}")
    return ShardEntry(path.name, m.count, data_bytes(m), manifest_digest(data)), m


def _clean(dst: Path, keep: set[str]) -> None:
    """Remove what earlier set builds left that this index does not name."""
    for name in os.listdir(dst):
        m = _OWN.fullmatch(name)
        stale = (m is not None and name not in keep) or name == INDEX + ".tmp"
        path = dst / name
        if not stale:
            continue
        log.info("removing %s: no shard of the set's index", path)
        if path.is_symlink() or not path.is_dir():
            path.unlink()
        else:
            shutil.rmtree(path)


def build_set(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    config: BuildConfig,
    progress: Callable[[int], None] | None = None,
    on_start: Callable[[int, int], None] | None = None,
    on_shard: Callable[[int, int], None] | None = None,
    sink: ShardSink | None = None,
    *,
    engine: SetEngine,
) -> BuildResult:
    """Build (or with ``config.append``, extend) the pack set at ``dst`` from ``src``: a
    folder (a Path), or a bucket prefix of images (a ``str`` URL: the Ray engine's).

    ``sink``: where each shard goes once it is in place (object storage: see
    :mod:`packer.builder.upload`); a shard the sink already holds is not built again.

    ``config.shard_size``: bytes per shard (None: :data:`DEFAULT_SHARD_SIZE`).
    ``progress(n)``: n more images decoded; ``on_start(total, already_done)`` once,
    ``already_done`` counting the images of shards kept from an interrupted run;
    ``on_shard(done, total)`` after each shard. ``engine``: who builds the shards
    (:class:`LocalEngine`, or :class:`packer.builder.ray_engine.RayEngine`, as
    :mod:`packer.builder.api` chose); the bytes are the same.
    Returns the result of the whole set (``shards`` set). Raises PackerError
    subclasses as a single build does, and for ``--append`` with other options.
    """
    t0 = time.perf_counter()
    config.validate()
    shard_size = config.shard_size or DEFAULT_SHARD_SIZE
    device = engine.prepare(config)  # before DST is made and before the scan
    given = Path(dst)
    dst = Path(os.path.abspath(dst))
    refuse_symlink_destination(dst)
    if isinstance(src, str):  # a bucket of images (so routed by packer.builder.api)
        src = str(parse_url(src))  # stays the URL (SetPlan.src), written one way
        check = functools.partial(_check_set_destination, dst, config)
    else:
        src = Path(src)
        check = functools.partial(_check_destination, src, dst, config)
    plan = engine.plan(src, config)
    check()
    made = not (dst.exists() or dst.is_symlink())
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        with dest_lock(dst):
            check()  # again, now that we hold the lock
            dst.mkdir(exist_ok=True)
            try:
                result = _build_set_locked(
                    src, dst, plan, config, shard_size, device, progress, on_start, on_shard, t0,
                    sink, engine,
                )  # fmt: skip
            except BaseException:
                if made:  # a failed build leaves no empty DST folder it made behind
                    with contextlib.suppress(OSError):
                        dst.rmdir()  # only when empty
                raise
    except OSError as e:
        raise destination_error(e, dst) from None
    result.path = given
    return result


@dataclass
class ShardOutcome:
    """What building (or keeping) one shard gave: ``failed`` lists each input of a shard
    none of whose images could be used (it is left out of the set), else it is empty."""

    name: str
    built: bool
    resumed: int = 0
    failed: list[Skip] = field(default_factory=list)


def commit_shard(
    src: Path,
    dst: Path,
    name: str,
    part: _Labels,
    config: BuildConfig,
    progress: Callable[[int], None] | None = None,
) -> ShardOutcome:
    """Build shard ``name`` of the set at ``dst`` from ``part`` and put it in place whole
    (:func:`packer.builder.run.build`: a work folder beside it, resumed by a rerun, renamed
    into place when complete). Idempotent: a shard already in place is kept. ``config``:
    :attr:`SetPlan.shard_config`. A destination other than a shared folder (an object
    store) replaces this step: build into a local folder, then upload under ``name``."""
    path = dst / name
    if _complete(path):  # a retry of a task that died after the shard went into place
        return ShardOutcome(name, built=True)
    cfg = replace(config, overwrite=path.is_dir() and (path / MANIFEST).exists())
    try:
        r = build(src, path, cfg, progress=progress, plan=part)
    except NoUsableImagesError as e:
        # not one image of the shard decoded: the set goes on without it, and the
        # paths are recorded so --append does not try them again
        reason = f"no image of its shard could be used ({e})"
        failed = [Skip(x.rel, reason) for x in part.scan.entries]
        return ShardOutcome(name, built=False, failed=failed)
    return ShardOutcome(name, built=True, resumed=r.resumed)


def _run_local(
    sp: SetPlan,
    progress: Callable[[int], None] | None,
    on_shard: Callable[[int, int], None] | None,
    sink: ShardSink | None = None,
) -> list[ShardOutcome]:
    """The local engine: one shard after another, each with this machine's workers; each
    sent to ``sink`` as soon as it is in place."""
    out = []
    for k, (name, _a, _b) in enumerate(sp.shards):
        ok = True
        if name not in sp.done:
            o = commit_shard(sp.src, sp.dst, name, sp.part(k), sp.shard_config, progress)
            out.append(o)
            ok = not o.failed
        if sink is not None and ok:
            sink.put(sp.dst / name)
        if on_shard:
            on_shard(k + 1, len(sp.shards))
        _reached(f"shard {k}")
    return out


class SetEngine:
    """Who builds a set's shards (never what they hold: the bytes are the same whoever
    builds them). :mod:`packer.builder.api` picks one; :func:`build_set` calls it."""

    #: each shard's builder uploads it itself (a bucket DST: the driver only checks)
    tasks_upload = False

    def prepare(self, config: BuildConfig) -> Any:
        """Checks before any work; the device every shard is decoded on (None: CPU)."""
        raise NotImplementedError

    def plan(self, src: Path | str, config: BuildConfig) -> _Labels:
        """The labelled images of ``src`` (a folder; an engine may take a bucket URL)."""
        raise NotImplementedError

    def run(
        self,
        sp: SetPlan,
        progress: Callable[[int], None] | None,
        on_shard: Callable[[int, int], None] | None,
        sink: ShardSink | None,
    ) -> tuple[list[ShardOutcome], dict[str, Any]]:
        """Build the shards of ``sp`` not in place: each outcome, and extra result keys."""
        raise NotImplementedError


class LocalEngine(SetEngine):
    """This machine's workers, one shard after another (:func:`_run_local`)."""

    def prepare(self, config: BuildConfig) -> Any:
        return _build_device(config)

    def plan(self, src: Path | str, config: BuildConfig) -> _Labels:
        if isinstance(src, str):  # packer.builder.api refuses it first, with the way out
            raise UsageError(
                f"SRC {src}: a bucket of images is built with BuildConfig.engine ray",
                field="BuildConfig.engine",
            )
        return plan_labels(src, config)

    def run(
        self,
        sp: SetPlan,
        progress: Callable[[int], None] | None,
        on_shard: Callable[[int, int], None] | None,
        sink: ShardSink | None,
    ) -> tuple[list[ShardOutcome], dict[str, Any]]:
        return _run_local(sp, progress, on_shard, sink), {}


def _build_set_locked(
    src: Path,
    dst: Path,
    plan: _Labels,
    config: BuildConfig,
    shard_size: int,
    device: Any,
    progress: Callable[[int], None] | None,
    on_start: Callable[[int, int], None] | None,
    on_shard: Callable[[int, int], None] | None,
    t0: float,
    sink: ShardSink | None,
    engine: SetEngine,
) -> BuildResult:
    sp = plan_set(src, dst, plan, config, shard_size, device, sink)
    if on_start:
        on_start(len(sp.plan.scan.entries), sp.kept)
    outcomes, extra = engine.run(sp, progress, on_shard, sink)
    return finish_set(sp, outcomes, t0, extra)


def finish_set(
    sp: SetPlan, outcomes: list[ShardOutcome], t0: float, extra: dict[str, Any] | None = None
) -> BuildResult:
    """Every shard of ``sp`` in place (or failed, per ``outcomes``): write the index (the
    commit), remove what no index names, and return the set's result."""
    src, dst, plan, config = sp.src, sp.dst, sp.plan, sp.config
    by_name = {o.name: o for o in outcomes}
    old = sp.old
    new: list[ShardEntry] = []
    failed: list[Skip] = []
    skipped = list(plan.scan.skipped)
    shapes = []
    where = (extra or {}).pop("where", {})
    per_shard = []
    records = []  # each built or kept shard's dense record (None without)
    for name, a, b in sp.shards:
        o = by_name.get(name)
        row: dict[str, Any] = {"name": name, "images": b - a}
        per_shard.append(row)
        if o is not None and o.failed:
            failed.extend(o.failed)
            row.update(count=0, skipped=len(o.failed), status="failed", **where.get(name, {}))
            continue
        entry, m = _entry(dst / name)
        new.append(entry)
        shapes.append(m.image_shape)
        records.append(m.dense)
        skipped.extend({"path": s.path, "reason": s.reason} for s in m.skipped)
        status = "built" if o is not None and o.built else "kept"
        row.update(count=m.count, skipped=len(m.skipped), status=status, **where.get(name, {}))
    skipped.extend({"path": s.path, "reason": s.reason} for s in failed)
    all_shards = (old.shards if old is not None else ()) + tuple(new)
    if not all_shards:
        raise NoUsableImagesError(
            f"{src}: none of its {len(plan.scan.entries)} images could be used; no set written"
        )
    if old is not None:
        shapes.append(old.image_shape)
    shape = tuple(max(s[i] for s in shapes) for i in range(3))
    index = SetIndex(
        count=sum(s.count for s in all_shards),
        image_shape=(shape[0], shape[1], shape[2]),
        storage=config.store,
        classes=tuple(plan.scan.classes),
        shards=all_shards,
        options=sp.options,
        shard_size=sp.shard_size,
        targets=tuple(plan.target_names),
        skipped=(old.skipped if old is not None else ()) + tuple(failed),
    )
    from .dense import set_summary

    _reached("index")
    write_index(dst, index)
    _reached("committed")
    _clean(dst, {s.name for s in index.shards})
    return BuildResult(
        path=dst,
        count=index.count,
        skipped=sorted(skipped, key=lambda s: s["path"]),
        classes=list(index.classes),
        image_shape=list(index.image_shape),
        seconds=time.perf_counter() - t0,
        resumed=sp.kept + sum(o.resumed for o in outcomes),
        extra={
            "shards_built": sum(o.built for o in outcomes),
            "shards_kept": len(sp.done),
            "shards_failed": len(sp.shards) - len(new),
            **(extra or {}),
        },
        ignored=plan.ignored,
        new_classes=list(plan.new_classes),
        targets=list(plan.target_names),
        classes_from=_classes_from(plan),
        storage=config.store,
        shards=len(index.shards),
        per_shard=per_shard,
        dense=set_summary(records, plan),
    )
