"""Streaming throughput: a page-cached pack -> PackLoader -> CUDA, vs. the hardware limits.

Measured in one run:
  limits   pinned host->device copy (256 MB); host memcpy into pinned memory
           (1 GiB contiguous, 1/4/8 threads)
  loader   PackLoader, shuffled, consumed on the GPU (Normalize), for batch
           sizes 64/256/1024 at 224^2, image sizes 64^2/224^2/512^2 at 256,
           gather threads 4/8/16, pre-populated mapping, GPU-resident mode.
Each figure: a warm-up (up to 20 batches), then the median of 3 timed runs of
up to 40,000 images, the device synchronized before every clock read
(:mod:`packer.measure.timing`, the clocks of ``imgpack bench`` too).

Why this beside ``imgpack bench``: ``imgpack bench`` answers a user's questions on
their machine (is a pack worth it here? which batch, dtype, loader?) on a grid
that finishes in minutes, with plots. This script is the developer's stress test
of PackLoader at ImageNet scale: 50,000-image packs, the machine's own limits
(pinned copy, multi-threaded host memcpy) as the yardstick, and the loader's
knobs (gather threads, prefetch, populate, GPU-resident mode) swept one by one.
Its packs take GBs and minutes to make, which ``imgpack bench`` must not.

    python -m benchmarks.stream [--images 50000] [--work /tmp/imgpack-bench]
"""

from __future__ import annotations

import argparse
import threading
from pathlib import Path

import numpy as np
import torch

import packer
from packer.measure.bench.synth import make_random_pack
from packer.measure.timing import time_call, time_loader

from ._common import dump, machine

CUDA = torch.device("cuda")


def h2d_pinned(nbytes: int = 256 << 20) -> float:
    """GB/s of one pinned host -> device copy of ``nbytes``."""
    src = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dst = torch.empty(nbytes, dtype=torch.uint8, device=CUDA)
    sec = time_call(lambda: dst.copy_(src, non_blocking=True), CUDA, repeats=10)
    return nbytes / sec / 1e9


def host_to_pinned(threads: int, nbytes: int = 1 << 30) -> float:
    src = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8)
    dst = torch.empty(nbytes, dtype=torch.uint8).pin_memory().numpy()
    parts = np.linspace(0, nbytes, threads + 1).astype(int)

    def work(a: int, b: int) -> None:
        np.copyto(dst[a:b], src[a:b])

    def copy() -> None:
        th = [threading.Thread(target=work, args=(a, b)) for a, b in zip(parts[:-1], parts[1:])]
        for t in th:
            t.start()
        for t in th:
            t.join()

    return nbytes / time_call(copy, torch.device("cpu"), repeats=3) / 1e9


def stream(
    pack: packer.ImagePack,
    bs: int,
    threads: int = 8,
    resident: bool = False,
    populate: bool = False,
    prefetch: int = 4,
    consume: bool = True,
    max_images: int = 40_000,
) -> tuple[float, packer.LoaderStats]:
    """Median img/s and the loader's stats of the timed batches; ``consume``: run
    Normalize on each batch (else only receive it)."""
    loader = packer.PackLoader(
        pack,
        bs,
        device="cuda",
        num_threads=threads,
        resident=resident,
        populate=populate,
        prefetch=prefetch,
        seed=0,
    )
    norm = packer.Normalize().cuda() if consume else (lambda x: x)
    limit = max(1, min(len(loader), max_images // bs))

    def use(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        norm(batch[0])
        return batch[0]

    rate = time_loader(
        lambda: iter(loader), use, CUDA, limit, 3, warmup=min(limit, 20), on_warm=loader.stats
    )
    stats = loader.stats()
    loader.close()
    return rate, stats


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=50_000)
    ap.add_argument("--work", type=Path, default=Path("/tmp/imgpack-bench"))
    args = ap.parse_args()
    assert torch.cuda.is_available(), "this benchmark needs a CUDA device"
    res: dict[str, object] = {"machine": machine()}
    lim = {"h2d_pinned_GBps": h2d_pinned()}
    for t in (1, 4, 8):
        lim[f"host_to_pinned_{t}t_GBps"] = host_to_pinned(t)
    res["limits"] = lim
    packs = {
        s: make_random_pack(args.work / f"rand{s}", n, s)
        for s, n in ((224, args.images), (64, args.images), (512, max(2000, args.images // 5)))
    }
    opened = {s: packer.load(p) for s, p in packs.items()}
    for p in opened.values():  # page-cache the files
        with open(p.path / "_tensordict" / "images.memmap", "rb") as f:
            while f.read(64 << 20):
                pass
    rows = []

    def run(label: str, side: int, bs: int, **kw: object) -> None:
        rate, stats = stream(opened[side], bs, **kw)
        gbps = rate * 3 * side * side / 1e9
        rows.append(
            {
                "config": label,
                "side": side,
                "batch": bs,
                "img_per_s": rate,
                "GBps": gbps,
                **{k: v for k, v in kw.items()},
                "stats": stats.as_dict(),
            }
        )
        print(f"  {label:<40} {rate:>12,.0f} img/s {gbps:>7.1f} GB/s", flush=True)
        for line in stats.summary():
            print(f"    {line}", flush=True)

    for bs in (64, 256, 1024):
        run(f"224^2 batch {bs}, 8 threads", 224, bs, threads=8)
    for t in (4, 16):
        run(f"224^2 batch 256, {t} threads", 224, 256, threads=t)
    run("224^2 batch 256, 8 threads, prefetch 8", 224, 256, threads=8, prefetch=8)
    run("224^2 batch 1024, 8 threads, prefetch 8", 224, 1024, threads=8, prefetch=8)
    run("224^2 batch 256, 8 threads, populate", 224, 256, threads=8, populate=True)
    for side in (64, 512):
        run(f"{side}^2 batch 256, 8 threads", side, 256, threads=8)
    run("224^2 batch 256, GPU-resident", 224, 256, resident=True)
    run("224^2 batch 1024, GPU-resident", 224, 1024, resident=True)
    run("224^2 batch 1024, GPU-resident, no Normalize", 224, 1024, resident=True, consume=False)
    run("224^2 batch 256, 8 threads, no Normalize", 224, 256, threads=8, consume=False)
    res["rows"] = rows
    host8 = lim["host_to_pinned_8t_GBps"]
    print(f"\nstreaming to CUDA ({machine()})")
    print(
        f"limits: pinned H2D {lim['h2d_pinned_GBps']:.1f} GB/s; host->pinned memcpy "
        f"1/4/8 threads {lim['host_to_pinned_1t_GBps']:.1f}/{lim['host_to_pinned_4t_GBps']:.1f}/"
        f"{host8:.1f} GB/s"
    )
    print("| config | img/s | GB/s | % of 8-thread host copy |")
    print("|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['config']} | {r['img_per_s']:,.0f} | {r['GBps']:.1f} | {r['GBps'] / host8:.0%} |"
        )
    dump(res, "bench_stream.json")


if __name__ == "__main__":
    main()
