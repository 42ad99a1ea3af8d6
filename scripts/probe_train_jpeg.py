"""Where a ResNet-50 step fed by a JPEG pack loses its time (issue 13 §3), on CUDA.

One process, one model; the ways below are interleaved round by round (``--rounds``),
each a run of ``--steps`` training steps after a warm-up, timed with the device
synchronized before each clock read:

  resident    uint8 256² batches already on the GPU + RandomResizedCrop/flip (the
              ceiling of ``bench_train_aug.py``'s row (b))
  jpeg        PackLoader over the JPEG pack (decode + RRC/flip on the GPU); its pass
              is ``--tile`` times the pack, so no run crosses an epoch start
  jpeg_cpu    the same with decode="cpu": image by image on the loader's
              8 CPU threads, the GPU only trains
  shadow      the resident step, and each step also takes a JPEG batch and drops it:
              the loader's work shares the GPU and the host, but the step never waits
              for it. jpeg - shadow = waiting for batches; shadow - resident = sharing
  small       the JPEG loader over the pack once per pass (epochs of N/B steps):
              jpeg - small = the epoch starts
  resident_hp, jpeg_hp
              the same two with the training step on a high-priority CUDA stream
              (the loader's decode and crop streams keep the default, lowest, priority)
  loader, loader_cpu
              the two JPEG loaders alone, no model (how far ahead they can run)

Measured and dropped (2026-11-23, docs/BENCHMARKS.md): copying each batch's bytes into
pinned memory before nvjpeg (its per-image host-to-device copies are from pageable
memory) made the loader slower, not faster; splitting each batch between nvjpeg and
Pillow on the CPU threads (a share adapted per batch) starved the training loop of the
GIL (the probe's ways "jpeg_device" and "jpeg" of that run are now "jpeg" and gone).

    python3 scripts/probe_train_jpeg.py [--images 4096] [--work /tmp/imgpack-rn50probe]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torchvision

import packer
from packer.bench.loading import train_step
from packer.bench.synth import make_jpeg_tree
from packer.transforms import Compose, RandomHorizontalFlip, RandomResizedCrop


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=4096)
    ap.add_argument("--tile", type=int, default=8, help="the jpeg way's pass: the pack N times")
    ap.add_argument("--work", type=Path, default=Path("/tmp/imgpack-rn50probe"))
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--ways",
        default="resident,jpeg,jpeg_cpu,shadow,small,resident_hp,jpeg_hp,loader,loader_cpu",
    )
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    a = ap.parse_args()
    dev = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    b = a.batch
    jpegs, jdir = a.work / "jpeg500", a.work / "jpegpack"
    if not jpegs.exists():
        make_jpeg_tree(jpegs, a.images, (500, 375), classes=10, quality=90)
    if not jdir.exists():
        packer.build_pack(jpegs, jdir, packer.BuildConfig(store="jpeg"))
    jpack = packer.load(jdir)
    n = len(jpack)
    tiled = torch.arange(n).repeat(a.tile)
    jls = {
        mode: packer.PackLoader(
            jpack, b, device=dev, drop_last=True, image_size=224, indices=tiled, decode=mode
        )
        for mode in ("device", "cpu")
    }
    js = packer.PackLoader(jpack, b, device=dev, drop_last=True, image_size=224, train=True)

    model_step = train_step("resnet50", 10, dev, weight_decay=5e-5)
    aug = Compose([RandomResizedCrop(224), RandomHorizontalFlip()])
    norm = packer.Normalize().to(dev)
    g = torch.Generator().manual_seed(0)
    resident = [
        (
            torch.randint(0, 256, (b, 3, 256, 256), dtype=torch.uint8, device=dev),
            torch.randint(0, 10, (b,), device=dev),
        )
        for _ in range(8)
    ]
    hp = torch.cuda.Stream(dev, priority=-1)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        model_step(norm(x), y)

    def cycling(make: Callable[[], Iterator[Any]]) -> Callable[[], Any]:
        state = {"it": make(), "restarts": 0}

        def nxt() -> Any:
            try:
                return next(state["it"])
            except StopIteration:
                state["restarts"] += 1
                state["it"] = make()
                return next(state["it"])

        nxt.state = state  # type: ignore[attr-defined]
        return nxt

    res_i = [0]

    def res_batch() -> tuple[torch.Tensor, torch.Tensor]:
        x, y = resident[res_i[0] % len(resident)]
        res_i[0] += 1
        return aug(x, generator=g), y

    nexts = {"small": cycling(lambda: iter(js))}
    for mode, ld in jls.items():
        nexts["jpeg" if mode == "device" else f"jpeg_{mode}"] = cycling(lambda ld=ld: iter(ld))

    def way_fn(way: str) -> tuple[Callable[[], tuple[Any, Any]], torch.cuda.Stream | None]:
        on = hp if way.endswith("_hp") else None
        if way.startswith("resident"):
            return res_batch, on
        if way.startswith("jpeg"):
            key = way.removesuffix("_hp")
            return (lambda: nexts[key]()[:2]), on
        if way == "small":
            return (lambda: nexts["small"]()[:2]), None
        if way == "shadow":

            def shadow() -> tuple[torch.Tensor, torch.Tensor]:
                nexts["jpeg"]()  # the loader works; its batch is dropped
                return res_batch()

            return shadow, None
        raise SystemExit(f"unknown way {way}")

    def run(way: str, steps: int) -> dict[str, Any]:
        if way.startswith("loader"):
            jnext = nexts[way.replace("loader", "jpeg")]
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(steps):
                jnext()
            torch.cuda.synchronize()
            return {"img_s": steps * b / (time.perf_counter() - t0)}
        fetch, stream = way_fn(way)
        ctx = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
        events, waits = [], []
        with ctx:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(steps):
                ev = torch.cuda.Event(enable_timing=True)
                ev.record()
                events.append(ev)
                t1 = time.perf_counter()
                x, y = fetch()
                waits.append(time.perf_counter() - t1)
                step(x, y)
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            events.append(end)
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
        gaps = [events[i].elapsed_time(events[i + 1]) for i in range(steps)]
        q = statistics.quantiles(gaps, n=10)
        return {
            "img_s": steps * b / wall,
            "step_ms_p50": statistics.median(gaps),
            "step_ms_p90": q[-1],
            "step_ms_max": max(gaps),
            "next_ms_p50": statistics.median(waits) * 1e3,
            "next_ms_max": max(waits) * 1e3,
        }

    ways = a.ways.split(",")
    for way in ways:  # warm-up: cudnn autotune, Triton, nvjpeg, pinned pools
        run(way, 8)
    results: dict[str, list[dict[str, Any]]] = {w: [] for w in ways}
    for r in range(a.rounds):
        for way in ways:
            results[way].append(run(way, a.steps))
            print(r, way, {k: round(v, 2) for k, v in results[way][-1].items()}, flush=True)

    a.out.mkdir(parents=True, exist_ok=True)
    from torch.profiler import ProfilerActivity, profile

    for way in ("resident", "jpeg"):
        if way not in ways:
            continue
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            run(way, 10)
        table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=40)
        (a.out / f"rn50probe_profile_{way}.txt").write_text(table)
    for ld in (*jls.values(), js):
        ld.close()

    base = statistics.median(x["img_s"] for x in results.get("resident", [{"img_s": 1}]))
    rows = []
    for way in ways:
        rs = results[way]
        row = {"way": way, "img_s_median": statistics.median(x["img_s"] for x in rs)}
        row["img_s_runs"] = [round(x["img_s"]) for x in rs]
        for k in ("step_ms_p50", "step_ms_p90", "step_ms_max", "next_ms_p50", "next_ms_max"):
            if k in rs[0]:
                row[k] = statistics.median(x[k] for x in rs)
        row["of_resident"] = row["img_s_median"] / base
        rows.append(row)
    info = {
        "gpu": torch.cuda.get_device_name(dev),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "images": n,
        "tile": a.tile,
        "restarts": {k: f.state["restarts"] for k, f in nexts.items()},  # type: ignore[attr-defined]
    }
    (a.out / "rn50probe.json").write_text(json.dumps({"machine": info, "rows": rows}, indent=1))
    print(f"\n{info}")
    hdr = "way           img/s (runs)                 of res  step p50/p90/max ms   next p50/max ms"
    print(hdr)
    for r in rows:
        runs = "/".join(f"{v:,}" for v in r["img_s_runs"])
        st = (
            f"{r['step_ms_p50']:.1f}/{r['step_ms_p90']:.1f}/{r['step_ms_max']:.1f}"
            if "step_ms_p50" in r
            else ""
        )
        nx = f"{r['next_ms_p50']:.2f}/{r['next_ms_max']:.1f}" if "next_ms_p50" in r else ""
        print(
            f"{r['way']:<13} {r['img_s_median']:>7,.0f} ({runs:<18}) "
            f"{r['of_resident']:>6.1%}  {st:<20} {nx}"
        )


if __name__ == "__main__":
    main()
