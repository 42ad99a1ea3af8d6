"""Training with per-sample augmentation, fed three ways, in one run (CUDA).

For each architecture (ResNet-18, ResNet-50; bf16 autocast, channels_last,
SGD, batch 256), images/s of one training step fed by:

  (a) pack      PackLoader(transform=RandomResizedCrop(224) + flip) from a 256² pack
                (CPU threads gather, the default; and gather="device": the GPU
                reads the rows from the registered pack)
  (a') jpeg     with --jpeg: PackLoader over a JPEG pack of the same files, decoded and
                cropped (RandomResizedCrop 224 + flip) on the GPU in batches
  (b) on GPU    the same augmentation on uint8 256² batches already on the GPU
                (the ceiling: no loading at all)
  (c) folder    ImageFolder + torchvision RandomResizedCrop(224) + flip + ToTensor +
                Normalize, DataLoader with --workers processes, pinned memory,
                on the same JPEGs the pack was built from

and, for the DataLoader road of issue 14, uint8 batches delivered to the GPU
(no model) by PackLoader vs PackDataset in a DataLoader with workers.

Data: --images synthetic photo-like JPEGs of 500x375 at quality 90 (ImageNet-
like), built into a 256² pack. Timing: warm-up, device synchronized before
every clock read, the median of --repeats repeats (packer.measure.timing). Prints a
table last and writes JSON to --out.

    python3 -m benchmarks.train_aug [--images 4096] [--work /tmp/imgpack-aug]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

import packer
from packer.measure.bench.loading import resident_batches, train_step
from packer.measure.bench.synth import make_jpeg_tree
from packer.measure.timing import time_loader
from packer.transforms import Compose, RandomHorizontalFlip, RandomResizedCrop

packer.configure_cuda_queues()  # 32 hardware queues, before any CUDA call (as measured)


def photo_set(work: Path, images: int) -> tuple[Path, Path]:
    """The training benches' data under ``work``, made once: ``images`` 500x375 q90 JPEGs
    in 10 classes, and their 256² raw pack. Returns (JPEG folder, pack folder)."""
    jpegs, pack_dir = work / "jpeg500", work / "pack256"
    if not jpegs.exists():
        make_jpeg_tree(jpegs, images, (500, 375), classes=10, quality=90)
    if not pack_dir.exists():
        packer.build_pack(jpegs, pack_dir, packer.BuildConfig(size=(256, 256)))
    return jpegs, pack_dir


def folder_loader(root: Path, batch: int, workers: int) -> Any:
    from torchvision import datasets, transforms

    tf = transforms.Compose(
        [
            transforms.RandomResizedCrop(224),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
        ]
    )
    ds = datasets.ImageFolder(str(root), transform=tf)
    sampler = torch.utils.data.RandomSampler(ds, replacement=True, num_samples=1 << 40)
    return torch.utils.data.DataLoader(
        ds,
        batch_size=batch,
        sampler=sampler,
        num_workers=workers,
        pin_memory=True,
        persistent_workers=True,
    )


def train_rows(
    arch: str, pack: Any, jpegs: Path, aug: Any, norm: Any, a: argparse.Namespace
) -> list[dict[str, Any]]:
    """Rows (b), (a), (c) for one architecture; of_ceiling relative to (b)."""
    dev = torch.device("cuda")
    rows: list[dict[str, Any]] = []
    b = a.batch
    step = train_step(arch, 10, dev, weight_decay=5e-5)

    # (b) the ceiling: uint8 256² batches already on the GPU, same augmentation
    on_gpu = resident_batches(pack, b, dev, aug)

    ways: list[tuple[str, Any, Any, int]] = [("(b) on GPU + RRC/flip", on_gpu, None, 5)]
    loader = packer.PackLoader(pack, b, device=dev, drop_last=True, transform=aug)
    ways.append(("(a) PackLoader + RRC/flip", lambda: iter(loader), loader, 5))
    dl_ = packer.PackLoader(pack, b, device=dev, drop_last=True, transform=aug, gather="device")
    ways.append(("(a) the same, gather='device'", lambda: iter(dl_), dl_, 5))
    if a.jpeg:  # issue 13: a JPEG pack, decoded + RRC + flip on the GPU in batches
        jpack = packer.load(a.work / "jpegpack")
        jl = packer.PackLoader(jpack, b, device=dev, drop_last=True, image_size=224, train=True)
        ways.append(("(a') JPEG pack, decode+RRC/flip on GPU", lambda: iter(jl), jl, 5))
    if not a.no_folder:
        dl = folder_loader(jpegs, b, a.workers)
        ways.append((f"(c) ImageFolder + RRC/flip, {a.workers} workers", lambda: iter(dl), dl, 0))
    for name, make, holder, warm in ways:
        folder = name.startswith("(c)")
        steps = max(a.steps, a.workers) if folder else a.steps
        warmup = 2 * a.workers + 2 if folder else warm

        def consume(batch: Any, folder: bool = folder) -> torch.Tensor:
            x, y = batch[0], batch[1]
            if folder:
                x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            else:
                x = norm(x)
            return step(x, y)

        t0 = time.perf_counter()
        rate = time_loader(make, consume, dev, steps, a.repeats, warmup=warmup)
        rows.append(
            {
                "experiment": "training",
                "model": arch,
                "way": name,
                "batch": b,
                "images_per_s": round(rate, 1),
                "seconds": round(time.perf_counter() - t0, 1),
            }
        )
        print(rows[-1], flush=True)
        if holder is not None and hasattr(holder, "close"):
            holder.close()
    k = len(ways)
    ceiling = rows[-k]["images_per_s"]
    for r in rows[-k:]:
        r["of_ceiling"] = round(r["images_per_s"] / ceiling, 4)

    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=4096)
    ap.add_argument("--work", type=Path, default=Path("/tmp/imgpack-aug"))
    ap.add_argument("--archs", default="resnet18,resnet50")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--steps", type=int, default=30, help="timed steps per repeat")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--jpeg", action="store_true", help="also train from a JPEG pack (issue 13)")
    ap.add_argument("--no-folder", action="store_true", help="skip (c), the ImageFolder road")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    a = ap.parse_args()
    dev = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    jpegs, pack_dir = photo_set(a.work, a.images)
    if a.jpeg and not (a.work / "jpegpack").exists():
        packer.build_pack(jpegs, a.work / "jpegpack", packer.BuildConfig(store="jpeg"))
    pack = packer.load(pack_dir)
    aug = Compose([RandomResizedCrop(224), RandomHorizontalFlip()])
    norm = packer.Normalize().to(dev)
    rows: list[dict[str, Any]] = []
    b = a.batch

    for arch in a.archs.split(","):
        rows += train_rows(arch, pack, jpegs, aug, norm, a)

    # the DataLoader road (issue 14): uint8 batches to the GPU, no model
    for workers in (8, a.workers):
        ds = packer.PackDataset(pack)
        dl = torch.utils.data.DataLoader(
            ds,
            batch_size=b,
            shuffle=True,
            num_workers=workers,
            pin_memory=True,
            persistent_workers=True,
            drop_last=True,
        )
        rate = time_loader(
            lambda dl=dl: iter(dl),
            lambda t: t[0].to(dev, non_blocking=True),
            dev,
            max(40, workers),
            a.repeats,
            warmup=2 * workers + 2,
        )
        rows.append(
            {
                "experiment": "loading",
                "way": f"PackDataset + DataLoader, {workers} workers",
                "batch": b,
                "images_per_s": round(rate, 1),
            }
        )
        print(rows[-1], flush=True)
        del dl
    for gather in ("device", "cpu"):
        loader = packer.PackLoader(pack, b, device=dev, drop_last=True, gather=gather)
        rate = time_loader(lambda ld=loader: iter(ld), lambda t: t[0], dev, 80, a.repeats, warmup=5)
        loader.close()
        rows.append(
            {
                "experiment": "loading",
                "way": f"PackLoader, gather={gather!r}"
                + (" (8 threads)" if gather == "cpu" else ""),
                "batch": b,
                "images_per_s": round(rate, 1),
            }
        )
    info = {
        "gpu": torch.cuda.get_device_name(dev),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "images": len(pack),
    }
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "train_aug.json").write_text(json.dumps({"machine": info, "rows": rows}, indent=1))
    print(f"\n{info}")
    print(f"{'experiment':<10} {'model':<9} {'way':<48} {'img/s':>10} {'of (b)':>7}")
    for r in rows:
        of = f"{r['of_ceiling']:.1%}" if "of_ceiling" in r else ""
        print(
            f"{r['experiment']:<10} {r.get('model', ''):<9} {r['way']:<48} "
            f"{r['images_per_s']:>10,.0f} {of:>7}"
        )


if __name__ == "__main__":
    main()
