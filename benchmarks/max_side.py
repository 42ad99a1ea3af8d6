"""What `build --store jpeg --max-side` does to the JPEG loader's rate and to the pixels a
RandomResizedCrop 224 sees (issue 44, item 4).

One run: ``--images`` photo-like JPEGs of ``--size`` (default 1600x1200, about 2 MP,
quality 90, made by ``benchmarks/build.py``'s ``make_set``), packed as JPEG packs at each
``--sides`` (0: the files as they are). Per pack:

* the loader's rate: ``PackLoader(pack, batch, device, image_size=224)`` (RRC 224 + flip),
  img/s, rounds alternating between the packs, median of ``--rounds``, and as a ratio to
  the pack of the files as they are (the baseline of the same run);
* bytes on disk, as a ratio to the same;
* the pixels the crop sees: the loader's own boxes (the same seed, 64 batches) drawn
  from the stored sizes: the share of crops whose box is smaller than 224 on a side
  (upsampled: detail the stored image no longer has), and the median source pixels
  per output pixel (box area / 224²).

    python3 -m benchmarks.max_side --device cuda --work /tmp/max-side
    python3 -m benchmarks.max_side --device cpu --images 64 --size 640x480 --sides 0,256 --rounds 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

import packer
from packer.builder.api import BuildConfig, build
from packer.measure.timing import resolve_device, sync

from ._common import dump, machine
from .build import make_set


def crop_pixels(pack: Any, batches: int, batch: int) -> dict[str, float]:
    """The loader's RRC boxes over the pack's stored sizes: upsampled share, pixels per
    output pixel (median)."""
    from packer.augment.transforms import RandomResizedCrop

    rrc = RandomResizedCrop(224)
    gen = torch.Generator().manual_seed(0)
    sizes = pack.sizes
    areas, small = [], 0
    for _ in range(batches):
        idx = torch.randint(0, len(pack), (batch,), generator=gen)
        s = sizes[idx]
        boxes = rrc.sample_boxes(batch, s[:, 0], s[:, 1], gen)
        small += int(((boxes[:, 2] < 224) | (boxes[:, 3] < 224)).sum())
        areas.append((boxes[:, 2] * boxes[:, 3]).double() / (224 * 224))
    a = torch.cat(areas)
    return {
        "upsampled_share": small / (batches * batch),
        "pixels_per_output_pixel_p50": float(a.median()),
    }


def rate(loader: Any, batches: int, device: torch.device) -> float:
    it = iter(loader)
    next(it)
    sync(device)
    t = time.perf_counter()
    n = 0
    for _ in range(batches):
        x, _y = next(it)
        n += len(x)
    sync(device)
    return n / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--work", type=Path, default=Path("/tmp/max-side"))
    ap.add_argument("--device", default="auto")
    ap.add_argument("--images", type=int, default=4096)
    ap.add_argument("--size", default="1600x1200")
    ap.add_argument("--sides", default="0,1024,512,384,256")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--batches", type=int, default=12, help="timed batches per round")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    device = resolve_device(a.device)
    cores = len(os.sched_getaffinity(0))
    w, h = (int(x) for x in a.size.split("x"))
    src = a.work / f"src_{a.size}_{a.images}"
    make_set(src, a.images, (w, h), cores)
    sides = [int(s) for s in a.sides.split(",")]
    packs: dict[int, Any] = {}
    out: dict[str, Any] = {"machine": machine(), "args": {**vars(a), "work": str(a.work)}}
    for side in sides:
        dst = a.work / f"jpeg_{a.size}_{a.images}_{side}"
        if not (dst / "imgpack.json").exists():
            cfg = BuildConfig(store="jpeg", max_side=side or None, workers=cores, overwrite=True)
            build(src, dst, cfg)
        packs[side] = packer.load(dst)
    batch = min(a.batch, a.images)
    loaders = {
        s: packer.PackLoader(p, batch, device=device, image_size=224, drop_last=True)
        for s, p in packs.items()
    }
    runs: dict[int, list[float]] = {s: [] for s in sides}
    for _ in range(a.rounds):
        for s, ld in loaders.items():
            runs[s].append(rate(ld, min(a.batches, len(ld) - 1), device))
    base_side = sides[0]
    base = statistics.median(runs[base_side])
    base_bytes = packs[base_side].jpeg.numel()
    rows = {}
    for s in sides:
        r = statistics.median(runs[s])
        rows[s] = {
            "img_s": r,
            "runs": runs[s],
            "rate_ratio": r / base,
            "bytes": int(packs[s].jpeg.numel()),
            "bytes_ratio": packs[s].jpeg.numel() / base_bytes,
            "decode_path": loaders[s].decode_path,
            **crop_pixels(packs[s], 64, 256),
        }
    out["packs"] = rows
    dump(out, "bench_max_side.json")
    print(f"\n== {out['machine'].get('gpu') or 'CPU'}, {cores} cores, {a.images} JPEGs {a.size}")
    print(
        "| --max-side | img/s | / as stored | bytes / as stored | crops upsampled | px per output px (p50) |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for s, v in rows.items():
        print(
            f"| {s or 'none'} | {v['img_s']:,.0f} | {v['rate_ratio']:.2f} | {v['bytes_ratio']:.3f} "
            f"| {v['upsampled_share']:.1%} | {v['pixels_per_output_pixel_p50']:.2f} |"
        )


if __name__ == "__main__":
    main()
