#!/usr/bin/env python3
"""Pack sets on the GPU: PackLoader over a 16-shard set vs the same images as one pack,
the shard-aware order vs the global order (raw and JPEG), and ResNet-50 fed by a set
vs the same step on resident batches. Every ratio is against a baseline of the same run.

    python3 -m benchmarks.sets --images 16384 --work /tmp/imgpack-gpu/sets

The same source tree (synthetic photo-like JPEGs, 256x256) is built four times: one raw
pack (224²), a raw set of 16 shards, one JPEG pack and a JPEG set of 16 shards. Each
streaming rate is the median of ``--repeats`` passes, the ways interleaved (A B C A B C
...), batch 256, ``Normalize`` consuming each batch on the GPU. The table comes last;
JSON goes to ``$OUT/sets.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

import packer
from packer.builder.api import BuildConfig, build
from packer.measure.bench.synth import make_jpeg_tree

from ._common import dump, example, machine


def set_configs(src: Path, images: int, shards: int, workers: int) -> dict[str, BuildConfig]:
    """The four builds of one tree: ``one`` (a raw 224² pack), ``set`` (raw, ``shards``
    shards), ``jone`` (a JPEG pack), ``jset`` (JPEG, cut into ``shards`` by source bytes)."""
    raw = BuildConfig(size=(224, 224), workers=workers)
    per = -(-images // shards)
    total = sum(f.stat().st_size for f in src.rglob("*.jpg"))
    return {
        "one": raw,
        "set": replace(raw, shard_size=per * 3 * 224 * 224),
        "jone": replace(raw, store="jpeg"),
        "jset": replace(raw, store="jpeg", shard_size=-(-total // shards)),
    }


def build_ways(src: Path, work: Path, configs: dict[str, BuildConfig]) -> dict[str, float]:
    """Build each way not built yet under ``work``; seconds each took."""
    took = {}
    for name, cfg in configs.items():
        if not (work / name).exists():
            s = time.perf_counter()
            build(src, work / name, cfg)
            took[name] = time.perf_counter() - s
    return took


def stream_rate(make: callable, batches: int) -> float:
    """Images/s of one pass of up to ``batches`` batches, the GPU synchronized."""
    norm = packer.Normalize().cuda()
    ld = make()
    ld.set_epoch(int(time.time()) % 1000)
    it = iter(ld)
    x, *_ = next(it)  # the first batch pays the start-up: outside the clock
    norm(x)
    torch.cuda.synchronize()
    n, t = 0, time.perf_counter()
    for i, (x, *_) in enumerate(it):
        norm(x)
        n += len(x)
        if i + 2 >= batches:
            break
    torch.cuda.synchronize()
    dt = time.perf_counter() - t
    it.close()
    ld.close()
    return n / dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=16384)
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batches", type=int, default=60)
    ap.add_argument("--train-steps", type=int, default=40)
    ap.add_argument("--work", type=Path, default=Path("/tmp/imgpack-gpu/sets"))
    args = ap.parse_args()
    w = args.work
    src = w / "src"
    if not src.exists():
        make_jpeg_tree(src, args.images, (256, 256), classes=100, quality=90)
    t = build_ways(src, w, set_configs(src, args.images, args.shards, workers=16))
    one, s = packer.load(w / "one"), packer.load(w / "set")
    jone, js = packer.load(w / "jone"), packer.load(w / "jset")
    B = 256
    ways = {
        "raw pack, global": lambda: packer.PackLoader(one, B),
        "raw set, global": lambda: packer.PackLoader(s, B),
        "raw set, shards": lambda: packer.PackLoader(s, B, order="shards"),
        "jpeg pack, global": lambda: packer.PackLoader(jone, B, image_size=224),
        "jpeg set, global": lambda: packer.PackLoader(js, B, image_size=224),
        "jpeg set, shards": lambda: packer.PackLoader(js, B, image_size=224, order="shards"),
    }
    rates: dict[str, list[float]] = {k: [] for k in ways}
    for _ in range(args.repeats):
        for k, make in ways.items():
            rates[k].append(stream_rate(make, args.batches))
    med = {k: statistics.median(v) for k, v in rates.items()}

    ex = example("train_example")
    make_model, make_optimizer, train_step = ex.make_model, ex.make_optimizer, ex.train_step

    torch.backends.cudnn.benchmark = True
    model = make_model("resnet50", 100)
    opt = make_optimizer(model)
    x0 = torch.randint(0, 256, (B, 3, 224, 224), dtype=torch.uint8, device="cuda")
    y0 = torch.randint(0, 100, (B,), device="cuda")

    def timed(batches: object, steps: int) -> float:
        for _ in range(5):
            x, y, *_ = next(batches)
            train_step(model, opt, x, y)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            x, y, *_ = next(batches)
            train_step(model, opt, x, y)
        torch.cuda.synchronize()
        return steps * B / (time.perf_counter() - t0)

    def forever(make: callable):
        e = 0
        while True:
            ld = make()
            ld.set_epoch(e)
            yield from ld
            e += 1

    def resident():
        while True:
            yield x0, y0

    train = {"resident": [], "raw set": [], "jpeg set": []}
    feeds = {
        "resident": resident,
        "raw set": lambda: forever(lambda: packer.PackLoader(s, B, drop_last=True)),
        "jpeg set": lambda: forever(
            lambda: packer.PackLoader(js, B, image_size=224, drop_last=True)
        ),
    }
    for _ in range(3):
        for k, f in feeds.items():
            train[k].append(timed(f(), args.train_steps))
    tmed = {k: statistics.median(v) for k, v in train.items()}
    out = {
        "machine": machine(),
        "images": args.images,
        "shards": [len(s.index.shards), len(js.index.shards)],
        "build_s": t,
        "stream": rates,
        "stream_median": med,
        "train": train,
        "train_median": tmed,
    }
    dump(out, "sets.json")
    print(json.dumps({"machine": out["machine"]}))
    print()
    print(f"| what ({args.images} images, batch {B}, median of {args.repeats}) | img/s | ratio |")
    print("| --- | ---: | ---: |")
    base = med["raw pack, global"]
    jbase = med["jpeg pack, global"]
    for k, v in med.items():
        ref = base if k.startswith("raw") else jbase
        what = "of raw pack" if k.startswith("raw") else "of JPEG pack"
        print(f"| {k} | {v:,.0f} | {v / ref:.3f} {what} |")
    print(
        f"| shard order / global, raw set | | {med['raw set, shards'] / med['raw set, global']:.3f} |"
    )
    print(
        f"| shard order / global, JPEG set | | {med['jpeg set, shards'] / med['jpeg set, global']:.3f} |"
    )
    for k in ("raw set", "jpeg set"):
        print(
            f"| ResNet-50 bf16 fed by the {k} | {tmed[k]:,.0f} | {tmed[k] / tmed['resident']:.3f} of resident |"
        )
    print(f"| ResNet-50 bf16 on resident batches | {tmed['resident']:,.0f} | 1.000 |")


if __name__ == "__main__":
    main()
