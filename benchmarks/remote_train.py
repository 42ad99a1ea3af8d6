"""ResNet-50 fed by a JPEG pack set from an S3-compatible server vs from local disk
(issue 30's training figure), called by ``benchmarks/remote.py --train-images N``.

One tree of ``N`` synthetic photo-like JPEGs (256², 100 classes) is built as a JPEG set
of 16 shards (``sets.set_configs``'s ``jset``) and uploaded to the server. ResNet-50,
bf16, channels_last, SGD, batch 256, is then timed fed four ways, interleaved, each
``repeats`` times (median):

  resident      the same step on batches already on the GPU (the ceiling)
  local         PackLoader(local set, image_size=224, order="shards"): RandomResizedCrop
                224 + flip from the decoded JPEGs
  remote cold   the same loader on ``packer.load(URL)`` with an empty cache: shards are
                downloaded (and hashed) while the model trains
  remote warm   the same on a cache that holds the whole set (no download)

Each run is 5 untimed steps, then ``steps`` timed steps, the device synchronized at both
ends.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

import packer
from packer.builder.api import build
from packer.measure.bench.synth import make_jpeg_tree

from ._common import example
from .sets import set_configs

B = 256
WAYS = ("resident", "local", "remote cold", "remote warm")


def _batches(dataset: Any) -> Iterator:
    """Training batches from ``dataset``, epoch after epoch."""
    forever = example("train_example").forever

    return forever(packer.PackLoader(dataset, B, image_size=224, drop_last=True, order="shards"))


def train_part(
    work: Path, server: Any, images: int, steps: int, repeats: int, upload: Callable
) -> dict:
    """The four ways' ResNet-50 rates (img/s, every repeat), and what the cold cache
    downloaded per run vs the set's data bytes."""
    ex = example("train_example")
    make_model, make_optimizer, train_rate = ex.make_model, ex.make_optimizer, ex.timed

    src, local = work / "jsrc", work / "jset"
    make_jpeg_tree(src, images, (256, 256), classes=100, quality=90)
    t0 = time.perf_counter()
    build(src, local, set_configs(src, images, 16, workers=os.cpu_count() or 1)["jset"])
    build_s = time.perf_counter() - t0
    url = f"s3://bench/jset-{images}"
    upload(local, url)
    data_bytes = sum(e.bytes for e in packer.load(local).index.shards)

    torch.backends.cudnn.benchmark = True
    model = make_model("resnet50", 100)
    opt = make_optimizer(model)
    x0 = torch.randint(0, 256, (B, 3, 224, 224), dtype=torch.uint8, device="cuda")
    y0 = torch.randint(0, 100, (B,), device="cuda")

    def timed(batches: Iterator) -> float:
        return train_rate(model, opt, batches, warmup=5, steps=steps, repeats=1)

    def resident() -> Iterator:
        while True:
            yield x0, y0

    rates: dict[str, list[float]] = {k: [] for k in WAYS}
    cold_fetched: list[float] = []
    for r in range(repeats):
        cache = work / f"train-cache-{r}"
        shutil.rmtree(cache, ignore_errors=True)
        rates["resident"].append(timed(resident()))
        rates["local"].append(timed(_batches(packer.load(local))))
        cold = packer.load(url, cache_dir=cache)
        rates["remote cold"].append(timed(_batches(cold)))
        cold_fetched.append(cold.store.downloaded_bytes / data_bytes)
        for k in range(len(cold.index.shards)):  # the rest of the set into the cache
            cold.shard(k)
            cold.release(k)
        cold.store.close()
        warm = packer.load(url, cache_dir=cache)
        rates["remote warm"].append(timed(_batches(warm)))
        assert warm.store.downloads == 0, "the warm cache downloaded a shard"
        warm.store.close()
    return {
        "images": images,
        "shards": len(packer.load(local).index.shards),
        "set_data_bytes": data_bytes,
        "build_s": build_s,
        "steps": steps,
        "rates": rates,
        "median": {k: statistics.median(v) for k, v in rates.items()},
        "cold_fetched_vs_set": cold_fetched,
    }


def print_train(t: dict) -> None:
    med = t["median"]
    print(f"\nResNet-50 bf16 channels_last, batch {B}, {t['steps']} steps, median of "
          f"{len(t['rates']['local'])}; JPEG set of {t['images']} images in {t['shards']} "
          f"shards ({t['set_data_bytes'] / 1e6:.0f} MB of JPEG data)")  # fmt: skip
    print(f"{'fed by':<14}{'img/s':>9}{'/ resident':>12}{'/ local':>9}")
    for k in WAYS:
        print(f"{k:<14}{med[k]:>9,.0f}{med[k] / med['resident']:>12.3f}"
              f"{med[k] / med['local']:>9.3f}")  # fmt: skip
    print("cold cache: bytes fetched during the timed run / the set's data: "
          + ", ".join(f"{x:.2f}" for x in t["cold_fetched_vs_set"]))  # fmt: skip
