"""What does the GPU reading rows in place (``gather="device"``) cost a model beside it?

ResNet-18 (bf16 autocast, channels_last, SGD, batch 256) on a 256² pack with
RandomResizedCrop(224) + flip, fed by: batches already on the GPU (the ceiling),
PackLoader ``gather="cpu"``, and ``gather="device"`` with 16 / 8 / 4 persistent copy
programs; ways interleaved round by round (``--rounds``), median per way. Then the
loaders alone (no model) per way. Prints a table.

    python scripts/probe_gather_train.py [--images 4096] [--work /tmp/imgpack-aug]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_train_aug import photo_set

import packer
import packer._device_gather as dg
from packer.bench.loading import resident_batches, train_step
from packer.timing import time_loader
from packer.transforms import Compose, RandomHorizontalFlip, RandomResizedCrop


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=4096)
    ap.add_argument("--work", type=Path, default=Path("/tmp/imgpack-aug"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    a = ap.parse_args()
    dev = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    _, pack_dir = photo_set(a.work, a.images)
    pack = packer.load(pack_dir)
    aug = Compose([RandomResizedCrop(224), RandomHorizontalFlip()])
    norm = packer.Normalize().to(dev)
    b = 256
    model_step = train_step("resnet18", 10, dev)

    def step(batch: Any) -> torch.Tensor:
        return model_step(norm(batch[0]), batch[1])

    on_gpu = resident_batches(pack, b, dev, aug)

    ways: dict[str, tuple[str, int]] = {
        "cpu": ("cpu", 16),
        "device16": ("device", 16),
        "device8": ("device", 8),
        "device4": ("device", 4),
    }
    loaders = {
        k: packer.PackLoader(pack, b, device=dev, drop_last=True, transform=aug, gather=gw)
        for k, (gw, _) in ways.items()
    }
    train: dict[str, list[float]] = {k: [] for k in ["resident", *ways]}
    alone: dict[str, list[float]] = {k: [] for k in ways}
    for r in range(a.rounds):
        train["resident"].append(time_loader(on_gpu, step, dev, a.steps, 1, warmup=3))
        for k, (_, programs) in ways.items():
            dg._PROGRAMS = programs
            ld = loaders[k]
            train[k].append(time_loader(lambda ld=ld: iter(ld), step, dev, a.steps, 1, warmup=3))
            alone[k].append(
                time_loader(lambda ld=ld: iter(ld), lambda t: t[0], dev, 40, 1, warmup=3)
            )
        print(f"round {r}: " + ", ".join(f"{k} {v[-1]:,.0f}" for k, v in train.items()), flush=True)
    dg._PROGRAMS = 16
    for ld in loaders.values():
        ld.close()
    med = {k: statistics.median(v) for k, v in train.items()}
    out = {"train": train, "alone": alone, "gpu": torch.cuda.get_device_name(dev),
           "date": time.strftime("%Y-%m-%d %H:%M")}  # fmt: skip
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "gather_train.json").write_text(json.dumps(out, indent=1))
    print("\n| way | ResNet-18 img/s, median of rounds (runs) | of resident | loader alone |")
    print("|---|---|---|---|")
    for k, v in train.items():
        al = f"{statistics.median(alone[k]):,.0f}" if k in alone else ""
        print(f"| {k} | {med[k]:,.0f} ({' / '.join(f'{x:,.0f}' for x in v)}) | "
              f"{med[k] / med['resident']:.1%} | {al} |")  # fmt: skip


if __name__ == "__main__":
    main()
