"""``imgpack verify``: prove a pack is intact, and measure it against its source folder.

Integrity checks (each a ``{name, ok, detail}``):
  manifest    the manifest parses and is consistent
  files       data files present, regular, inside the pack, sizes match shapes
  images      per-block SHA-256 of the image data matches the build's; a
              mismatch names the block, its image indices and source files
  labels      checksum matches, labels within the class range (or -1), counts agree;
              the targets' checksum, for a pack with targets
  sources     (with a source folder) a sample of source images re-decoded
              exactly as the build did equals the packed pixels; missing or
              changed sources are named

Throughput: the pack streamed through :class:`PackLoader` to the device, and
(with a source folder) the same images read from the folder the way people
write it (:mod:`packer.measure.baseline`: Pillow, the same resize, ToTensor, a
DataLoader with workers and pinned memory), both normalized on arrival, same
batch size, same run. The baseline reads exactly the pack's ``sources``, so
inputs the build skipped are left out and counted. Warm-up excluded; the device
is synchronized before every clock read; the median of repeats is reported.
"""

from __future__ import annotations

import inspect
import logging
import os
import random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import PackerError, UsageError
from ..pack.files import check_files, folder_kind, read_manifest
from ..pack.kinds import kind_of
from ..pack.schema import MANIFEST, Layout, Manifest
from ..pack.writer import digest
from ..sources.scan import OUTSIDE, source_image
from .timing import check_device_name, each_pass, resolve_device, sync, time_loader

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)
Progress = Callable[[int], None]


MAX_BATCH = 65536  # verify --batch-size: the largest timed batch


@dataclass(frozen=True)
class VerifyConfig:
    source: Path | None = None  # None: the build's source folder, if it still exists
    use_recorded_source: bool = True
    sample: int | None = 64  # None: every image
    device: str | torch.device = "auto"  # resolved once, by verify(), when it times
    batch_size: int = 64
    batches: int = 20  # timed batches per repeat
    repeats: int = 3
    workers: int | None = None  # DataLoader workers for the folder baseline
    throughput: bool = True

    def validate(self) -> None:
        f = "VerifyConfig."  # how messages name a field (the CLI: its flag, packer.cli.flags)
        if self.batch_size < 1:
            raise UsageError(f"{f}batch_size must be at least 1", field=f"{f}batch_size")
        if self.batch_size > MAX_BATCH:  # the timed batches are allocated whole
            raise UsageError(
                f"{f}batch_size must be at most {MAX_BATCH:,}, not {self.batch_size:,}",
                field=f"{f}batch_size",
            )
        if self.sample is not None and self.sample < 0:
            raise UsageError(
                f"{f}sample must be a positive number, or all the images, not {self.sample}",
                field=f"{f}sample",
            )
        if isinstance(self.device, str):
            check_device_name(self.device, f"{f}device")
        if self.throughput:
            # before any work: a device this process cannot use is bad usage (exit 2) at
            # once, not after the whole integrity pass (issue 43)
            resolve_device(self.device, f"{f}device")
        # a folder the user names that is not there is bad usage (exit 2), as bench
        # --source; only the folder recorded at build time may have moved (a FAIL)
        if self.source is not None and not Path(self.source).is_dir():
            what = "this is a file" if Path(self.source).exists() else "no such folder"
            raise UsageError(
                f"{self.source}: {f}source must be a folder of the pack's images ({what})",
                field=f"{f}source",
            )


@dataclass
class VerifyReport:
    path: Path
    checks: list[dict[str, Any]] = field(default_factory=list)
    device: str = "cpu"
    pack_images_per_s: float | None = None
    folder_images_per_s: float | None = None
    folder_left_out: int | None = None  # the pack's images the folder baseline could not time
    folder_skipped: int = 0  # inputs the build skipped, which the baseline leaves out too
    image_bytes: int = 0
    loader_stats: dict[str, Any] | None = None  # PackLoader.stats() of the timed batches

    @property
    def ok(self) -> bool:
        return all(c["ok"] for c in self.checks)

    @property
    def speedup(self) -> float | None:
        if self.pack_images_per_s and self.folder_images_per_s:
            return self.pack_images_per_s / self.folder_images_per_s
        return None

    def add(self, name: str, ok: bool, detail: str) -> None:
        self.checks.append({"name": name, "ok": ok, "detail": detail})

    def to_json(self) -> dict[str, Any]:
        mb = self.image_bytes / 1e6
        return {
            "ok": self.ok,
            "path": str(self.path),
            "checks": self.checks,
            "device": self.device,
            "pack_images_per_s": _r(self.pack_images_per_s),
            "folder_images_per_s": _r(self.folder_images_per_s),
            "pack_mb_per_s": _r(self.pack_images_per_s and self.pack_images_per_s * mb),
            "folder_mb_per_s": _r(self.folder_images_per_s and self.folder_images_per_s * mb),
            "speedup": _r(self.speedup),
            "folder_left_out": self.folder_left_out,
            "stats": self.loader_stats,
        }


def images_phrase(count: int, image_shape: Any, storage: str, max_side: int | None = None) -> str:
    """What a pack's images are, for a report's first line: ``36 images of [3, 224, 224]``
    (raw rows), or ``36 stored JPEGs (up to 512 wide x 384 high, max side 512), decoded
    when read`` (a JPEG pack has no one shape: each image keeps its own size)."""
    return kind_of(storage).summary(count, image_shape, max_side)


def _r(x: float | None) -> float | None:
    return None if x is None else round(float(x), 2)


# ---------------------------------------------------------------- integrity


def _threads() -> int:
    return min(32, os.cpu_count() or 1)


def check_images(root: Path, m: Manifest, report: VerifyReport, progress: Progress | None) -> None:
    """The image data against the build's checksums, as the pack's storage kind checks it."""
    report.add("images", *kind_of(m).verify(root, m, progress, _threads()))


def check_labels(root: Path, m: Manifest, report: VerifyReport) -> None:
    raw = Layout(root).labels.read_bytes()
    labels = np.frombuffer(raw, dtype="<i8")
    problems = []
    if digest(raw) != m.checksums.labels:
        problems.append("checksum mismatch")
    k = len(m.classes)
    # -1 is "no label" (a flat folder, a table row); without classes the labels are a
    # table's integers, with no upper bound to check
    lo, hi = -1, (k - 1 if k else np.iinfo(np.int64).max)
    out = np.nonzero((labels < lo) | (labels > hi))[0]
    shown = f"[{lo}, {hi}]" if k else f">= {lo}"
    if len(out):
        problems.append(
            f"{len(out)} labels outside {shown} (first at image {out[0]}: {labels[out[0]]})"
        )
    if k and not len(out):
        counts = np.bincount(labels[labels >= 0], minlength=k).tolist()
        if m.class_counts and counts != list(m.class_counts):
            problems.append(
                f"class counts {counts} differ from the manifest's {list(m.class_counts)}"
            )
    if m.targets:
        raw_t = Layout(root).targets.read_bytes()
        if digest(raw_t) != m.checksums.targets:
            problems.append("targets checksum mismatch")
    if problems:
        report.add("labels", False, "; ".join(problems))
    else:
        with_t = f", targets {list(m.targets)} match" if m.targets else ""
        report.add("labels", True, f"{len(labels)} labels in {shown}{with_t}")


def sample_indices(n: int, sample: int | None) -> list[int]:
    """The images whose sources are re-decoded: all, or a fixed random sample."""
    if sample is None or sample >= n:
        return list(range(n))
    return sorted(random.Random(0).sample(range(n), sample))


def check_sources(
    pack: Any,
    m: Manifest,
    source: Path,
    idx: list[int],
    report: VerifyReport,
    progress: Progress | None,
) -> None:
    """The sample ``idx``: each source made again as the build made it (re-decoded rows,
    or the stored JPEG bytes) equals what the pack holds; kinds that decode also have
    every stored image decoded to its recorded size (a "decode" check)."""
    kind = kind_of(m)
    root = os.path.realpath(source)
    if kind.decoded:
        report.add("decode", *kind.check_decodes(pack, m, progress, _threads()))

    def one(i: int) -> str | None:
        # Pillow releases the GIL while it decodes and resizes: threads use every core
        path, why = source_image(root, m.sources[i])
        if path is None:
            return why
        return None if kind.same_as_source(pack, m, path, i) else CHANGED

    found = _SourceFindings(m, idx, source)
    with ThreadPoolExecutor(_threads()) as pool:
        for i, what in zip(idx, pool.map(one, idx)):
            found.note(i, what)
            if progress and not kind.decoded:
                progress(1)
    found.report(report, _SAME[kind.decoded].format(n=m.count, source=source))


# what the sources check says when every source in the sample gives the pack's data
_SAME = {
    False: "of {n} source images re-decoded from {source}: pixels identical",
    True: "sources in {source} give the same JPEG bytes",
}


CHANGED = "changed"


class _SourceFindings:
    """What re-reading a sample of a pack's sources found, by kind: missing, changed since
    the build, not read (:func:`packer.sources.scan.source_image` refused the path: not a
    regular image file under the source folder, so the manifest cannot make verify read
    a device or ``/proc``), and left out (links leading outside the source folder, which
    are not followed: reported, not a failure)."""

    def __init__(self, m: Manifest, idx: list[int], source: Path) -> None:
        self.m, self.idx, self.source = m, idx, source
        self.missing: list[str] = []
        self.changed: list[str] = []
        self.refused: list[str] = []
        self.outside: list[str] = []

    def note(self, i: int, what: str | None) -> None:
        name = self.m.sources[i]
        if what == "missing":
            self.missing.append(name)
        elif what == CHANGED:
            self.changed.append(name)
        elif what == OUTSIDE:
            self.outside.append(name)
        elif what:
            self.refused.append(f"{name} ({what})")

    def report(self, report: VerifyReport, ok_detail: str) -> None:
        def part(items: list[str], what: str) -> list[str]:
            more = ", ..." if len(items) > 5 else ""
            return [f"{len(items)} {what}: " + ", ".join(items[:5]) + more] if items else []

        bad = (
            part(self.missing, "missing")
            + part(self.changed, "changed since the build")
            + part(self.refused, "not read, not regular image files")
        )
        left = part(self.outside, f"not checked, {OUTSIDE}")
        checked = len(self.idx) - len(self.outside)
        if bad:
            report.add(
                "sources",
                False,
                "; ".join(bad + left) + f" (of {len(self.idx)} checked in {self.source})",
            )
        else:
            report.add("sources", True, "; ".join([f"{checked} {ok_detail}", *left]))


# ---------------------------------------------------------------- throughput


def _export_trace(prof: Any, trace: Path) -> None:
    """Write the Chrome trace whole or not at all: a temporary name beside it, then a
    rename. The name ends like ``trace`` (the profiler gzips a ``.gz`` name) and is
    one of imgpack's own (``.imgpack-tmp-``), removed if the export is interrupted."""
    from .plots import check_output_file

    trace = Path(trace)
    tmp = trace.with_name(f".imgpack-tmp-{os.getpid()}-{trace.name}")
    try:
        prof.export_chrome_trace(str(tmp))
        check_output_file(trace, "the trace")
        os.replace(tmp, trace)
    finally:
        tmp.unlink(missing_ok=True)


def measure(
    pack: Any,
    m: Manifest,
    source: Path | None,
    config: VerifyConfig,
    report: VerifyReport,
    device: torch.device,
    trace: Path | None = None,
) -> None:
    from PIL.Image import DecompressionBombError

    from ..imaging.normalize import Normalize
    from ..loading.loader import PackLoader
    from ..loading.stats import StatsConfig
    from . import baseline

    log.info("timing the pack through PackLoader on %s", device)
    norm = Normalize().to(device)
    decoded = kind_of(m).decoded
    # a decoded (JPEG) pack is timed decoding to 224² centre crops; the folder baseline's
    # resize follows the pack's fixed size, so it is timed for raw packs only
    size = {"image_size": 224, "train": False} if decoded else {}
    # a bare loop always waits for its loader: its stats are printed, never warned about
    quiet = StatsConfig(warn_share=None)
    loader = PackLoader(pack, config.batch_size, device=device, seed=0, stats=quiet, **size)
    report.pack_images_per_s = time_loader(
        each_pass(loader),
        lambda b: norm(b[0]),
        device,
        config.batches,
        config.repeats,
        on_warm=loader.stats,  # the stats of the timed batches only
    )
    report.loader_stats = loader.stats().as_dict()
    if trace is not None:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        if device.type != "cuda":
            # the profiler's C++ side (kineto) probes for GPUs on its first use and logs
            # "gpuGetDeviceCount failed" and trace markers on stderr even for CPU-only
            # activities; a level above all of its own keeps a CPU trace quiet. Read once,
            # at that first use; a value the user set wins.
            os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        kw = {}
        if "acc_events" in inspect.signature(profile).parameters:  # torch >= 2.5
            # one cycle, all its events kept; without it, torch 2.11 warns on stderr when
            # its profiler object is reused ("Profiler clears events at the end of ...")
            kw["acc_events"] = True
        with profile(activities=acts, **kw) as prof:
            for i, batch in enumerate(each_pass(loader)()):  # 2- or 3-tuples (with targets)
                norm(batch[0])
                if i == 5:
                    break
            sync(device)
        _export_trace(prof, trace)
    loader.close()
    if source is None or decoded:
        return
    ds, missing = baseline.pack_files(source, m, pack.labels.tolist())
    report.folder_left_out = missing + len(m.skipped)
    report.folder_skipped = len(m.skipped)
    if not len(ds):
        log.warning("folder baseline not timed: none of the pack's sources is in %s", source)
        return
    log.info(
        "timing the folder baseline: %d images of %s (left out: %d the build skipped, %d missing)",
        len(ds),
        source,
        len(m.skipped),
        missing,
    )
    try:
        report.folder_images_per_s = baseline.time_folder(
            ds, device, config.batch_size, config.workers, config.batches, config.repeats
        )
    except (OSError, ValueError, RuntimeError, DecompressionBombError) as e:
        # a source changed since the build (outside the re-decoded sample): Pillow fails on it
        log.warning("folder baseline not timed: %s", str(e).strip().splitlines()[-1])


# ---------------------------------------------------------------- entry point


def _source_folder(m: Manifest, config: VerifyConfig) -> Path | None:
    if config.source is not None:
        return config.source
    recorded = m.build.source_root if config.use_recorded_source else None
    return Path(recorded) if recorded and Path(recorded).is_dir() else None


def verify(
    path: str | os.PathLike[str],
    config: VerifyConfig = VerifyConfig(),
    trace: Path | None = None,
    progress: Progress | None = None,
    on_start: Callable[[int, int], None] | None = None,
) -> VerifyReport:
    """Check a pack's integrity and (optionally) its streaming throughput.

    The manifest is parsed and the pack's files walked once. Block hashes and
    source re-decodes run on every core. ``on_start(total, 0)`` gives the
    images the integrity checks will read (all, plus the re-decoded sample),
    ``progress(k)`` reports k more done.

    Raises PackerError only when there is nothing to verify (no such path, a file
    or a folder without a manifest, bad options); every problem found in a pack is
    a failed check.
    """
    config.validate()
    root = Path(path)
    report = VerifyReport(path=root)
    if not root.exists():
        raise UsageError(f"{root}: no such pack; check the path")
    folder_kind(root)  # a folder that is both a pack and a set is refused (issue 42.17)
    if not root.is_dir() or not (root / MANIFEST).is_file():
        # a file, or a folder with no manifest (images, say): no pack to verify, so bad
        # input (exit 2); a pack whose manifest is damaged is a failed check (exit 1)
        read_manifest(root)  # raises PackFormatError saying which
    try:
        m = read_manifest(root)
        what = images_phrase(m.count, m.image_shape, m.storage, m.max_side)
        report.add("manifest", True, f"format {m.version}, {what}")
    except PackerError as e:
        report.add("manifest", False, str(e))
        return report
    kind = kind_of(m)
    try:
        check_files(root, m)
        # timed: the pack the loader streams (torch); else only what the integrity
        # checks read (a raw pack's rows mapped with numpy: no torch). A JPEG pack's
        # stored sizes are range-checked as it opens, either way.
        if config.throughput:
            from ..pack.reader import open_pack

            pack = open_pack(root, m)
        else:
            pack = kind.checked_view(root, m)
        report.add("files", True, "data files present with the sizes the manifest gives")
    except PackerError as e:
        report.add("files", False, str(e))
        return report
    decoded = kind.decoded
    report.image_bytes = 3 * 224 * 224 if decoded else m.image_bytes  # as delivered
    source = _source_folder(m, config)
    source_ok = source is not None and source.is_dir()
    idx = sample_indices(m.count, config.sample) if source_ok else []
    if on_start:
        decodes = m.count if source_ok and decoded else len(idx)
        on_start(m.count + decodes, 0)
    check_images(root, m, report, progress)
    check_labels(root, m, report)
    if m.dense is not None:  # boxes, masks, keypoints: checksums, and the source's again
        from ..builder.dense import rederive
        from ..pack.dense import verify_dense

        report.add("dense", *verify_dense(root, m))
        dense_src = config.source or (
            Path(m.dense.source["root"])
            if config.use_recorded_source and isinstance(m.dense.source.get("root"), str)
            else None
        )
        if dense_src is not None and dense_src.is_dir():
            ok, detail, images = rederive(root, m, dense_src)
            report.add("dense_source", ok, detail)
            if images is not None and source is not None:
                source, source_ok = images, True
    if source is not None and not source_ok:
        report.add("sources", False, f"{source}: source folder not found")
        source = None
    elif source is not None and m.count:
        check_sources(pack, m, source, idx, report, progress)
    if config.throughput and m.count and report.ok:
        device = resolve_device(
            config.device, "VerifyConfig.device"
        )  # once; everything below takes this torch.device
        report.device = str(device)
        measure(pack, m, source, config, report, device, trace)
    return report
