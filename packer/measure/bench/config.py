"""What ``imgpack bench`` measures: the sections, the two grids, its options and result,
and the forecast of points and seconds printed before a run."""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import UsageError
from ..timing import check_device_name

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

SECTIONS = ("transfer", "loading", "training")


@dataclass(frozen=True)
class Grid:
    """What one run measures; ``FULL`` and ``QUICK`` are the two sizes."""

    image_sizes: tuple[tuple[int, int], ...]  # (w, h) for the transfer experiment
    transfer_batches: tuple[int, ...]
    load_batches: tuple[int, ...]
    images: int  # images in the loading/training dataset
    photo_size: tuple[int, int]  # (w, h) of the synthetic originals
    pack_side: int  # the pack's images are pack_side² (crop)
    train_batch: int
    train_steps: int  # per repeat (at least one round of folder workers)
    train_repeats: int
    load_repeats: int
    repeats: int
    target_s: float  # length of one timed repeat in the transfer experiment
    load_images: int  # images per timed repeat in the loading experiment


FULL = Grid(
    image_sizes=((384, 384), (640, 480), (1280, 960)),
    transfer_batches=(8, 16, 32, 64, 128, 256),
    load_batches=(32, 64, 128, 256),
    images=2048,
    photo_size=(1280, 960),
    pack_side=224,
    train_batch=256,
    train_steps=10,
    train_repeats=3,
    load_repeats=3,
    repeats=5,
    target_s=0.05,
    load_images=512,
)
QUICK = Grid(
    image_sizes=((384, 384), (640, 480)),
    transfer_batches=(8, 32),
    load_batches=(16, 32),
    images=64,
    photo_size=(320, 240),
    pack_side=64,
    train_batch=32,
    train_steps=4,
    train_repeats=3,
    load_repeats=3,
    repeats=3,
    target_s=0.01,
    load_images=32,
)


@dataclass(frozen=True)
class BenchConfig:
    device: str | torch.device = "auto"  # resolved once: by the caller, or by bench()
    quick: bool = False
    source: Path | None = None  # the user's images instead of synthetic ones
    workers: int | None = None  # DataLoader workers and build/compress processes
    sections: tuple[str, ...] = SECTIONS
    max_batch_bytes: int | None = None  # default: a quarter of available memory, at most 4 GiB

    @property
    def grid(self) -> Grid:
        return QUICK if self.quick else FULL

    def resolved_workers(self, cores: int) -> int:
        return self.workers or (min(2, cores) if self.quick else min(16, cores))

    def validate(self) -> None:
        f = "BenchConfig."  # how messages name a field (the CLI: its flag, packer.cli.flags)
        if isinstance(self.device, str):
            check_device_name(self.device, f"{f}device")
        unknown = set(self.sections) - set(SECTIONS)
        if unknown or not self.sections:
            raise UsageError(
                f"{f}sections must be some of {', '.join(SECTIONS)}; "
                f"got {', '.join(sorted(unknown)) or 'none'}",
                field=f"{f}sections",
            )
        if self.workers is not None and self.workers < 1:
            raise UsageError(f"{f}workers must be at least 1", field=f"{f}workers")
        if self.source is not None and not self.source.is_dir():
            raise UsageError(
                f"{self.source}: {f}source must be a folder of images", field=f"{f}source"
            )


@dataclass
class BenchResult:
    device: str
    device_name: str
    quick: bool
    machine: dict[str, Any]
    grid: dict[str, Any]
    transfer: list[dict[str, Any]] = field(default_factory=list)
    conversion: list[dict[str, Any]] = field(default_factory=list)
    loading: list[dict[str, Any]] = field(default_factory=list)
    training: list[dict[str, Any]] = field(default_factory=list)
    dataset: dict[str, Any] = field(default_factory=dict)
    skipped: list[dict[str, str]] = field(default_factory=list)
    seconds: float = 0.0

    def skip(self, section: str, what: str, reason: str) -> None:
        log.debug("bench: skipping %s %s: %s", section, what, reason)
        self.skipped.append({"section": section, "what": what, "reason": reason})

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["seconds"] = round(self.seconds, 2)
        return d


# ---------------------------------------------------------------- the plan


def _free_memory(meminfo: str = "/proc/meminfo") -> int | None:
    """Memory a new allocation can have: Linux's MemAvailable, which counts the page
    cache the kernel gives back on demand. ``SC_AVPHYS_PAGES`` (MemFree) does not, so
    on a machine whose cache has filled after a few builds it reads near zero and the
    bench would skip batches that fit easily."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _transfer_plan(cuda: bool) -> list[tuple[str, str, bool]]:
    """(dtype, label, pinned) series; pinned memory needs CUDA."""
    series = []
    for dtype in ("uint8", "float16", "float32"):
        series.append((dtype, f"{dtype} pageable", False))
        if cuda:
            series.append((dtype, f"{dtype} pinned", True))
    return series


def estimate_seconds(cfg: BenchConfig, cores: int, cuda: bool) -> float:
    """A rough forecast of the run time, printed before a full run starts."""
    g = cfg.grid
    workers = cfg.resolved_workers(cores)
    s = 0.0
    if "transfer" in cfg.sections and cuda:
        points = len(g.image_sizes) * len(g.transfer_batches)
        series = len(_transfer_plan(cuda)) + 4
        s += points * series * (g.repeats + 3) * g.target_s * 1.5 + 10
    if {"loading", "training"} & set(cfg.sections):
        mpx = g.photo_size[0] * g.photo_size[1] / 1e6
        # make (~0.1 s/Mpx), compress (~0.1 s/Mpx + process start), build (~0.02 s/Mpx) per core
        s += g.images * (0.22 * mpx + 0.03) / max(1, cores)
        folder_rate = max(50.0, workers * 50 / max(mpx, 0.05))  # ImageFolder + Pillow, img/s
        folders = 2  # the original and the compressed folder
        for b in g.load_batches if "loading" in cfg.sections else ():
            s += folders * (2 + g.load_repeats) * max(workers * b, g.load_images) / folder_rate + 2
        if cuda and "training" in cfg.sections:
            s += folders * (2 + g.train_repeats) * workers * g.train_batch / folder_rate + 20
    return s


def count_points(cfg: BenchConfig, cuda: bool) -> int:
    g = cfg.grid
    n = 0
    if "transfer" in cfg.sections and cuda:  # CUDA only: run_bench skips it on the CPU
        n += len(g.image_sizes) * len(g.transfer_batches) * (len(_transfer_plan(cuda)) + 4)
    loaders = 4 if cuda else 3
    if "loading" in cfg.sections:
        n += len(g.load_batches) * loaders
    if "training" in cfg.sections and cuda:
        n += loaders
    return n
