"""``imgpack verify``: prove a pack is intact, and measure it against its source folder.

Integrity checks (each a ``{name, ok, detail}``):
  manifest    the manifest parses and is consistent
  files       data files present, regular, inside the pack, sizes match shapes
  images      per-block SHA-256 of the image data matches the build's; a
              mismatch names the block, its image indices and source files
  labels      checksum matches, labels within the class range, counts agree
  sources     (with a source folder) a sample of source images re-decoded
              exactly as the build did equals the packed pixels; missing or
              changed sources are named

Throughput: the pack streamed through :class:`PackLoader` to the device, and
(with a source folder) the folder the way people write it (ImageFolder, Pillow,
the same resize, ToTensor, a DataLoader with workers and pinned memory), both
normalized on arrival, same batch size, same run. Warm-up excluded; the device
is synchronized before every clock read; the median of repeats is reported.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .decode import ResizeSpec, decode
from .errors import DecodeError, PackerError, UsageError
from .format import Layout, check_files, digest, image_bytes, read_manifest
from .timing import check_device_name, resolve_device, sync, time_loader


@dataclass(frozen=True)
class VerifyConfig:
    source: Path | None = None  # None: the build's source folder, if it still exists
    use_recorded_source: bool = True
    sample: int | None = 64  # None: every image
    device: str = "auto"
    batch_size: int = 64
    batches: int = 20  # timed batches per repeat
    repeats: int = 3
    workers: int | None = None  # DataLoader workers for the folder baseline
    throughput: bool = True

    def validate(self) -> None:
        if self.batch_size < 1:
            raise UsageError("--batch-size must be at least 1")
        if self.sample is not None and self.sample < 0:
            raise UsageError("--sample must be a positive number or 'all'")
        check_device_name(self.device)


@dataclass
class VerifyReport:
    path: Path
    checks: list[dict[str, Any]] = field(default_factory=list)
    device: str = "cpu"
    pack_images_per_s: float | None = None
    folder_images_per_s: float | None = None
    image_bytes: int = 0

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
        }


def _r(x: float | None) -> float | None:
    return None if x is None else round(float(x), 2)


# ---------------------------------------------------------------- integrity


def check_images(root: Path, m: dict[str, Any], report: VerifyReport) -> None:
    lay = Layout(root)
    ck = m["checksums"]
    row = image_bytes(m["image_shape"])
    block = int(ck.get("block_rows", 0))
    want = ck.get("images", [])
    n = m["count"]
    if block < 1 or len(want) != (n + block - 1) // block:
        report.add(
            "images",
            False,
            f"manifest lists {len(want)} checksums for {n} images in "
            f"blocks of {block}; the manifest is damaged",
        )
        return
    bad: list[str] = []
    with open(lay.images, "rb") as f:
        for k, expect in enumerate(want):
            if digest(f.read(row * block)) != expect:
                lo, hi = k * block, min(n, (k + 1) * block)
                names = ", ".join(m["sources"][lo : min(hi, lo + 3)])
                more = f" and {hi - lo - 3} more" if hi - lo > 3 else ""
                bad.append(f"block {k} (images {lo}-{hi - 1}: {names}{more})")
    if bad:
        report.add(
            "images",
            False,
            f"checksum mismatch in {len(bad)} of {len(want)} blocks: "
            + "; ".join(bad[:5])
            + ("; ..." if len(bad) > 5 else "")
            + ". The image data changed since the build; rebuild the pack",
        )
    else:
        report.add("images", True, f"{n} images, {len(want)} blocks, SHA-256 match")


def check_labels(root: Path, m: dict[str, Any], report: VerifyReport) -> None:
    raw = Layout(root).labels.read_bytes()
    labels = np.frombuffer(raw, dtype="<i8")
    problems = []
    if digest(raw) != m["checksums"].get("labels"):
        problems.append("checksum mismatch")
    k = len(m["classes"])
    lo, hi = (0, k - 1) if k else (-1, -1)
    out = np.nonzero((labels < lo) | (labels > hi))[0]
    if len(out):
        problems.append(
            f"{len(out)} labels outside [{lo}, {hi}] (first at image {out[0]}: {labels[out[0]]})"
        )
    if k and not len(out):
        counts = np.bincount(labels, minlength=k).tolist()
        if m.get("class_counts") and counts != m["class_counts"]:
            problems.append(f"class counts {counts} differ from the manifest's {m['class_counts']}")
    if problems:
        report.add("labels", False, "; ".join(problems))
    else:
        report.add("labels", True, f"{len(labels)} labels in [{lo}, {hi}]")


def check_sources(
    root: Path, m: dict[str, Any], source: Path, sample: int | None, report: VerifyReport
) -> None:
    from .pack import open_pack

    pack = open_pack(root)
    n = m["count"]
    idx = (
        list(range(n))
        if sample is None or sample >= n
        else sorted(random.Random(0).sample(range(n), sample))
    )
    _, h, w = m["image_shape"]
    spec = ResizeSpec(w, h, m["resize"], int(m["build"].get("max_pixels", 100_000_000)))
    missing, changed = [], []
    images = pack.images
    for i in idx:
        rel = m["sources"][i]
        path = source / rel
        if not path.is_file():
            missing.append(rel)
            continue
        try:
            same = np.array_equal(decode(str(path), spec), images[i].numpy())
        except DecodeError:
            same = False
        if not same:
            changed.append(rel)
    if missing or changed:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing: " + ", ".join(missing[:5]))
        if changed:
            parts.append(f"{len(changed)} changed since the build: " + ", ".join(changed[:5]))
        report.add("sources", False, "; ".join(parts) + f" (of {len(idx)} checked in {source})")
    else:
        report.add(
            "sources",
            True,
            f"{len(idx)} of {n} source images re-decoded from {source}: pixels identical",
        )


# ---------------------------------------------------------------- throughput


class _Files:
    """A dataset over explicit files (used when the pack has no classes)."""

    def __init__(self, paths: list[str], transform: Any) -> None:
        self.paths, self.transform = paths, transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> Any:
        from PIL import Image

        with Image.open(self.paths[i]) as im:
            return self.transform(im.convert("RGB")), -1


def folder_dataset(source: Path, m: dict[str, Any]) -> Any:
    """The source folder as a user would load it: ImageFolder + torchvision transforms.

    ``m`` is a manifest, or any dict with its ``image_shape``, ``resize``,
    ``classes`` and (without classes) ``sources``. Items: (Tensor[3, H, W]
    float32, normalized with ImageNet's mean and std, label).
    """
    from torchvision import datasets, transforms

    _, h, w = m["image_shape"]
    mode = m["resize"]
    if mode == "crop":
        resize = [
            transforms.Resize(min(h, w)) if h == w else transforms.Resize((h, w)),
            transforms.CenterCrop((h, w)),
        ]
    else:  # stretch; pad is approximated by a stretch (same cost)
        resize = [transforms.Resize((h, w))]
    tf = transforms.Compose(
        [
            *resize,
            transforms.ToTensor(),
            transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
        ]
    )
    if m["classes"]:
        return datasets.ImageFolder(str(source), transform=tf)
    return _Files([str(source / s) for s in m["sources"]], tf)


def measure(
    root: Path,
    m: dict[str, Any],
    source: Path | None,
    config: VerifyConfig,
    report: VerifyReport,
    trace: Path | None = None,
) -> None:
    import torch

    from .loader import Normalize, PackLoader
    from .pack import open_pack

    device = report.device
    pack = open_pack(root)
    norm = Normalize().to(device)
    loader = PackLoader(pack, config.batch_size, device=device, seed=0)
    report.pack_images_per_s = time_loader(
        lambda: iter(loader), lambda b: norm(b[0]), device, config.batches, config.repeats
    )
    if trace is not None:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device != "cpu" else [])
        with profile(activities=acts) as prof:
            for i, (x, _y) in enumerate(loader):
                norm(x)
                if i == 5:
                    break
            sync(device)
        prof.export_chrome_trace(str(trace))
    loader.close()
    if source is None:
        return
    ds = folder_dataset(source, m)
    workers = config.workers if config.workers is not None else min(8, os.cpu_count() or 1)
    dl = torch.utils.data.DataLoader(
        ds,
        batch_size=config.batch_size,
        shuffle=True,
        num_workers=workers,
        pin_memory=device != "cpu",
        persistent_workers=workers > 0,
    )
    # A DataLoader delivers in bursts (every worker builds a whole batch, all start
    # together; prefetch_factor 2): warm up past two bursts and time at least one
    # batch per worker, as ``imgpack bench`` does, or the burst reads as speed.
    rnd = max(1, workers)
    report.folder_images_per_s = time_loader(
        lambda: iter(dl),
        lambda b: b[0].to(device, non_blocking=True),
        device,
        max(config.batches, rnd),
        config.repeats,
        warmup=max(3, 2 * rnd),
    )


# ---------------------------------------------------------------- entry point


def verify(
    path: str | os.PathLike[str], config: VerifyConfig = VerifyConfig(), trace: Path | None = None
) -> VerifyReport:
    """Check a pack's integrity and (optionally) its streaming throughput.

    Raises PackerError only when there is nothing to verify (no such path,
    bad options); every problem found in the pack is a failed check.
    """
    config.validate()
    root = Path(path)
    report = VerifyReport(path=root)
    if not root.exists():
        raise UsageError(f"{root}: no such pack; check the path")
    try:
        m = read_manifest(root)
        report.add(
            "manifest", True, f"format {m['version']}, {m['count']} images of {m['image_shape']}"
        )
    except PackerError as e:
        report.add("manifest", False, str(e))
        return report
    try:
        check_files(root, m)
        report.add("files", True, "data files present with the sizes the manifest gives")
    except PackerError as e:
        report.add("files", False, str(e))
        return report
    report.image_bytes = image_bytes(m["image_shape"])
    check_images(root, m, report)
    check_labels(root, m, report)
    source = config.source
    if source is None and config.use_recorded_source:
        recorded = m["build"].get("source_root")
        if recorded and Path(recorded).is_dir():
            source = Path(recorded)
    if source is not None:
        if not source.is_dir():
            report.add("sources", False, f"{source}: source folder not found")
            source = None
        elif m["count"]:
            check_sources(root, m, source, config.sample, report)
    if config.throughput and m["count"] and report.ok:
        report.device = resolve_device(config.device)
        measure(root, m, source, config, report, trace)
    return report
