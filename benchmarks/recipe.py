"""The modern training recipe on the GPU (issue 33), against its baselines, in one run.

Pipeline ("reference"): RandomResizedCrop 224 + flip, TrivialAugmentWide, Normalize,
RandomErasing 0.1 (on the normalized batch, as torchvision's reference), MixUp 0.2 /
CutMix 1.0 (one of them per batch), batch 256, uint8 256² in, written as one Compose.
Figures, each with its baseline measured in this run:

  pipeline alone        img/s of the whole pipeline on resident uint8 batches, fused
                        (Compose's CUDA path, packer.augment.fused) and op by op (that
                        path off: the old code), interleaved, and of each stage alone;
                        baseline: a device copy of the same bytes (the memory-bound
                        limit); per batch, host and device µs
  ResNet-50 training    bf16 channels_last, SGD, fed by PackLoader(transform=pipeline)
                        vs the same step on resident batches with the pipeline
                        already applied (the ceiling)
  reference data path   ImageFolder + torchvision v2 transforms + DataLoader workers
                        (MixUp/CutMix in the collate), same images, same step

    python -m benchmarks.recipe                 # CUDA, writes $OUT/recipe.json
    python -m benchmarks.recipe --quick         # a smoke run, CPU or GPU
    python -m benchmarks.recipe --parts pipeline --profile   # + $OUT/profile.txt
    python -m benchmarks.recipe --parts pipeline --check     # fused vs op by op, pixels

``--profile`` adds, per pipeline stage, torch.profiler's tables (by device time
and by host time, 10 calls) and whether the stage makes the host wait (CUDA's
sync debug mode), to ``$OUT/profile.txt``, and cProfile of the whole pipeline both
ways to ``$OUT/host_profile.txt``. ``--check`` compares the fused pipeline's
output with the op-by-op one's (same seeds), for both roundings of Normalize.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

import packer
import packer.transforms as T
from packer.augment import fused
from packer.imaging.normalize import IMAGENET_MEAN, IMAGENET_STD
from packer.measure.bench.loading import train_step
from packer.measure.timing import resolve_device, sync

from .augment import photo_batch  # the same photo-like batches as the crop benchmark

CLASSES = 100


def pipeline(size: int, classes: int) -> tuple[Any, Any, Any]:
    """(uint8 augmentation, float erasing after Normalize, batch mixer), the reference's."""
    aug = T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.TrivialAugmentWide()])
    erase = T.RandomErasing(p=0.1)
    mix = T.RandomChoice(
        [T.MixUp(alpha=0.2, num_classes=classes), T.CutMix(alpha=1.0, num_classes=classes)]
    )
    return aug, erase, mix


def recipe_compose(size: int, classes: int) -> T.Compose:
    """The whole pipeline as one loader transform, as a user writes it: uint8 in,
    normalized float and soft labels out (erasing after Normalize, as the reference).
    On CUDA it runs fused (packer.augment.fused) unless ``fused.ENABLED`` is off."""
    aug, erase, mix = pipeline(size, classes)
    return T.Compose([*aug, packer.Normalize(), erase, mix])


class OpByOp:
    """The old code path: every op on its own (the fused Compose path off)."""

    def __enter__(self) -> None:
        fused.ENABLED = False

    def __exit__(self, *exc: object) -> None:
        fused.ENABLED = True


def rate(fn: Callable[[int], Any], n_img: int, dev: torch.device, iters: int, repeats: int) -> dict:
    """img/s of ``fn(i)`` over ``iters`` calls, median (and best) of ``repeats``."""
    return rates({"x": fn}, n_img, dev, iters, repeats)["x"]


def rates(
    ways: dict[str, Callable[[int], Any]], n_img: int, dev: torch.device, iters: int, repeats: int
) -> dict:
    """img/s of each way's ``fn(i)`` over ``iters`` calls, median (and best) of
    ``repeats`` rounds; the rounds interleave the ways, so a drift of the machine
    touches them all alike."""
    for fn in ways.values():
        for i in range(3):
            fn(i)
    sync(dev)
    got: dict[str, list[float]] = {k: [] for k in ways}
    for _ in range(repeats):
        for k, fn in ways.items():
            t0 = time.perf_counter()
            for i in range(iters):
                fn(i)
            sync(dev)
            got[k].append(n_img * iters / (time.perf_counter() - t0))
    return {k: {"median": statistics.median(v), "best": max(v), "all": v} for k, v in got.items()}


def pipeline_rates(dev: torch.device, b: int, s_in: int, s_out: int, a: argparse.Namespace) -> dict:
    bufs = [photo_batch(b, s_in, k, dev) for k in range(4)]  # rotate: more than the L2 cache
    labels = torch.randint(0, CLASSES, (b,), device=dev)
    _, erase, mix = pipeline(s_out, CLASSES)
    norm = packer.Normalize().to(dev)
    recipe = recipe_compose(s_out, CLASSES).to(dev)  # Normalize's buffers onto the device
    tail = T.Compose([packer.Normalize(), erase, mix]).to(dev)
    g = torch.Generator().manual_seed(0)
    crop = T.Compose([T.RandomResizedCrop(s_out), T.RandomHorizontalFlip()])
    ta = T.TrivialAugmentWide()
    small = [crop(x, generator=g) for x in bufs]
    normed = [norm(x) for x in small]

    def old(fn: Callable[[int], Any]) -> Callable[[int], Any]:
        def run(i: int) -> Any:
            with OpByOp():
                return fn(i)

        return run

    whole = lambda i: recipe(bufs[i % 4], labels, generator=g)  # noqa: E731
    tail_fn = lambda i: tail(small[i % 4], labels, generator=g)  # noqa: E731
    ways = {
        "device copy (baseline)": lambda i: bufs[i % 4].clone(),
        "RRC 224 + flip": lambda i: crop(bufs[i % 4], generator=g),
        "TrivialAugmentWide (224²)": lambda i: ta(small[i % 4], generator=g),
        "RandomErasing 0.1 (normalized)": lambda i: erase(normed[i % 4], generator=g),
        "MixUp/CutMix (normalized)": lambda i: mix(normed[i % 4], labels, generator=g),
        "Normalize+Erasing+Mix, op by op": old(tail_fn),
        "Normalize+Erasing+Mix, fused": tail_fn,
        "whole pipeline, op by op (old)": old(whole),
        "whole pipeline, fused (new)": whole,
    }
    res = rates(ways, b, dev, a.iters, a.repeats)
    if dev.type == "cuda":
        res["per call"] = {
            "old": per_call(old(whole), dev),
            "new": per_call(whole, dev),
        }
    if a.profile and dev.type == "cuda":
        profile_stages(ways, dev)
        host_profile({"old": old(whole), "new": whole})
    return res


def per_call(fn: Callable[[int], Any], dev: torch.device, n: int = 30) -> dict:
    """Host µs per call (the device idle at each start, so no call waits for it) and
    device µs per call (the kernels' own time, from torch.profiler), medians."""
    from torch.profiler import ProfilerActivity, profile

    host = []
    for i in range(n):
        sync(dev)
        t0 = time.perf_counter()
        fn(i)
        host.append((time.perf_counter() - t0) * 1e6)
    sync(dev)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(10):
            fn(i)
        sync(dev)
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    dev_us = sum(e.device_time for e in kernels) / 10
    return {
        "host_us": statistics.median(host),
        "device_us": dev_us,
        "device_events": len(kernels) / 10,
    }


def host_profile(ways: dict[str, Callable[[int], Any]]) -> None:
    """cProfile of 50 calls of each way, the top of the host's time to $OUT/host_profile.txt."""
    import cProfile
    import io
    import pstats

    out = Path(os.environ.get("OUT", "out"))
    out.mkdir(parents=True, exist_ok=True)
    text = []
    for name, fn in ways.items():
        pr = cProfile.Profile()
        pr.enable()
        for i in range(50):
            fn(i)
        pr.disable()
        buf = io.StringIO()
        pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(30)
        text += [f"==== {name}", buf.getvalue()]
    (out / "host_profile.txt").write_text("\n".join(text))


def check(dev: torch.device, b: int, seeds: int = 6, s_in: int = 256, s_out: int = 224) -> dict:
    """The fused pipeline against the op-by-op one on the same batches and seeds:
    pixels (max |difference| of the normalized floats, share of elements that
    differ) and labels (equal or not), for both roundings of the normalization."""
    from packer.augment import tail_triton

    x = photo_batch(b, s_in, 7, dev)
    labels = torch.randint(0, CLASSES, (b,), device=dev)
    out = {}
    for fma in (True, False):
        tail_triton.NORM_FMA = fma
        worst, share, same_labels = 0.0, 0.0, True
        for seed in range(seeds):
            recipe = recipe_compose(s_out, CLASSES).to(dev)
            new, ln = recipe(x, labels, generator=torch.Generator().manual_seed(seed))
            with OpByOp():
                ref, lr = recipe(x, labels, generator=torch.Generator().manual_seed(seed))
            d = (new - ref).abs()
            worst = max(worst, float(d.max()))
            share = max(share, float((d > 0).float().mean()))
            same_labels &= bool(torch.equal(ln, lr))
        out[f"norm_fma={fma}"] = {"max_abs_diff": worst, "share_differing": share,
                                  "labels_equal": same_labels}  # fmt: skip
    tail_triton.NORM_FMA = True
    return out


def profile_stages(ways: dict[str, Callable[[int], Any]], dev: torch.device) -> None:
    """Per stage: does it make the host wait, and torch.profiler's tables of 10 calls."""
    from torch.profiler import ProfilerActivity, profile

    out = Path(os.environ.get("OUT", "out"))
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    for name, fn in ways.items():
        sync(dev)
        torch.cuda.set_sync_debug_mode("error")
        try:
            fn(0)
            waits = "no"
        except RuntimeError as e:
            waits = f"yes: {str(e).splitlines()[0]}"
        finally:
            torch.cuda.set_sync_debug_mode(0)
        sync(dev)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for i in range(10):
                fn(i)
            sync(dev)
        ka = prof.key_averages()
        kernels = sum(1 for e in prof.events() if e.device_type.name == "CUDA") / 10
        lines += [f"==== {name}: host waits: {waits}; device events per call: {kernels:.0f}"]
        lines += [ka.table(sort_by="device_time_total", row_limit=25, max_name_column_width=60)]
        lines += [ka.table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=60)]
        print(lines[-3], flush=True)
    (out / "profile.txt").write_text("\n".join(lines))


def make_pack(work: Path, n: int, s: int) -> Any:
    from packer.measure.bench.synth import make_random_pack

    path = work / f"pack{s}_{n}"
    if not path.exists():
        make_random_pack(path, n, s, classes=CLASSES)
    return packer.load(path)


def train_rates(dev: torch.device, pack: Any, a: argparse.Namespace) -> dict:
    b = a.batch
    out: dict[str, Any] = {}
    recipe = recipe_compose(224, CLASSES).to(dev)
    step = train_step("resnet50", CLASSES, dev)
    # ceiling: the pipeline already applied, batches resident on the device
    g = torch.Generator().manual_seed(0)
    resident = []
    for i in range(8):
        x = pack.images[i * b : (i + 1) * b].to(dev)
        y = pack.labels[i * b : (i + 1) * b].to(dev)
        resident.append(recipe(x, y, generator=g))
    out["resnet50, resident, pipeline applied"] = rate(
        lambda i: step(*resident[i % 8]), b, dev, a.train_iters, a.repeats
    )
    loader = packer.PackLoader(pack, b, device=dev, transform=recipe, drop_last=True)
    it = _forever(loader)
    out["resnet50, PackLoader + pipeline"] = rate(
        lambda i: step(*next(it)), b, dev, a.train_iters, a.repeats
    )
    loader.close()
    return out


def _forever(loader: Any) -> Iterator[Any]:
    epoch = 0
    while True:
        loader.set_epoch(epoch)
        yield from loader
        epoch += 1


def reference_rate(dev: torch.device, work: Path, a: argparse.Namespace) -> dict:
    """torchvision's reference data path on a JPEG copy of the same kind of images."""
    from torch.utils.data import DataLoader, default_collate
    from torchvision import datasets
    from torchvision.transforms import v2

    from packer.measure.bench.synth import make_jpeg_tree

    folder = work / "jpeg_tree"
    if not folder.exists():
        make_jpeg_tree(folder, a.images, size=(256, 256), classes=CLASSES)
    tf = v2.Compose([
        v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip(),
        v2.TrivialAugmentWide(), v2.PILToTensor(), v2.ToDtype(torch.float, scale=True),
        v2.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        v2.RandomErasing(0.1),
    ])  # fmt: skip
    cutmix_or_mixup = v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=CLASSES),
                                       v2.CutMix(alpha=1.0, num_classes=CLASSES)])  # fmt: skip

    def collate(batch: list) -> Any:
        return cutmix_or_mixup(*default_collate(batch))

    ds = datasets.ImageFolder(str(folder), tf)
    dl = DataLoader(ds, a.batch, shuffle=True, num_workers=a.workers, collate_fn=collate,
                    pin_memory=True, drop_last=True, persistent_workers=True, prefetch_factor=4)  # fmt: skip
    step = train_step("resnet50", CLASSES, dev)

    def batches() -> Iterator[Any]:
        while True:
            for x, y in dl:
                yield x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)

    it = batches()
    return {"resnet50, ImageFolder + v2 + DataLoader": rate(
        lambda i: step(*next(it)), a.batch, dev, a.train_iters, a.repeats)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--train-iters", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--images", type=int, default=8192)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "imgpack-recipe")
    ap.add_argument("--parts", default="pipeline,train,reference")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    ap.add_argument("--profile", action="store_true", help="per-stage profiles to $OUT (CUDA)")
    ap.add_argument("--check", action="store_true", help="fused vs op-by-op outputs (CUDA)")
    a = ap.parse_args()
    dev = resolve_device(a.device)
    if a.quick:
        a.batch, a.iters, a.train_iters, a.repeats, a.images = 8, 2, 2, 1, 64
    parts = set(a.parts.split(","))
    a.work.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"device": str(torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"),
                           "cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d"), "batch": a.batch}  # fmt: skip
    if a.check and dev.type == "cuda":
        res["check"] = check(dev, a.batch)
        print("fused vs op by op:", json.dumps(res["check"]), flush=True)
    if "pipeline" in parts:
        res["pipeline"] = pipeline_rates(dev, a.batch, 256, 224, a)
    if "train" in parts and (dev.type == "cuda" or a.quick):
        pack = make_pack(a.work, max(a.images, 16 * a.batch), 256)
        res["train"] = train_rates(dev, pack, a)
    if "reference" in parts and (dev.type == "cuda" or a.quick):
        res["reference"] = reference_rate(dev, a.work, a)
    out = Path(os.environ.get("OUT", "out"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "recipe.json").write_text(json.dumps(res, indent=1))
    print(f"\n{res['device']}, {res['cores']} cores, {res['date']}, batch {a.batch}")
    if "pipeline" in res:
        base = res["pipeline"]["device copy (baseline)"]["median"]
        print(f"{'pipeline stage':34s} {'img/s':>12s} {'best':>12s} {'vs copy':>8s}")
        for k, v in res["pipeline"].items():
            if k != "per call":
                print(f"{k:34s} {v['median']:12,.0f} {v['best']:12,.0f} {v['median'] / base:8.3f}")
        old = res["pipeline"]["whole pipeline, op by op (old)"]["median"]
        new = res["pipeline"]["whole pipeline, fused (new)"]["median"]
        print(f"whole pipeline, fused vs op by op: {new / old:.2f}x")
        for k, v in res["pipeline"].get("per call", {}).items():
            print(f"per call, {k}: host {v['host_us']:.0f} µs, device {v['device_us']:.0f} µs, "
                  f"{v['device_events']:.0f} device events")  # fmt: skip
    if "train" in res:
        ceil = res["train"]["resnet50, resident, pipeline applied"]["median"]
        rows = {**res["train"], **res.get("reference", {})}
        print(f"{'training':42s} {'img/s':>9s} {'vs resident':>12s}")
        for k, v in rows.items():
            print(f"{k:42s} {v['median']:9,.0f} {v['median'] / ceil:12.3f}")


if __name__ == "__main__":
    main()
