"""Per-sample RandomResizedCrop + horizontal flip, uint8 -> uint8, and its baselines.

Measures, in one run on one device, for batches of B images S_in² -> S_out²:
  packer.transforms   Compose([RandomResizedCrop, RandomHorizontalFlip]): boxes drawn
                      on the CPU, one async copy, one kernel (Triton on CUDA)
  kernel only         the same resample with the boxes already on the device
                      (what the GPU itself sustains, without the host's share)
  matmul route        packer.transforms.resized_crop(backend="matmul")
  roi_align           torchvision.ops.roi_align(aligned=True) on float16 + flip + round
  device copy         a plain copy of the input batch's bytes (the memory-bound limit)
Each: warm-up, synchronize before reading a clock, median of --repeats timings of
--iters batches, inputs rotated over buffers larger than the L2 cache. Prints a
table and writes JSON (--json). Also prints how far each route is from torchvision's
resized_crop(antialias=True) on a few images.

    python -m benchmarks.augment --json augment.json          # CUDA, batch 256, 256² -> 224²
    python -m benchmarks.augment --quick --device cpu          # seconds, on the CPU
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

import packer.transforms as T
from packer.imaging.resize import triton_kernels


def photo_batch(b: int, s: int, seed: int, device: torch.device) -> torch.Tensor:
    """uint8 [b, 3, s, s]: smooth random shapes with some speckle, like photos."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(b, 3, max(s // 8, 2), max(s // 8, 2), generator=g) * 255
    x = torch.nn.functional.interpolate(x, size=(s, s), mode="bicubic", align_corners=False)
    x = x + torch.randn(b, 3, s, s, generator=g) * 8
    return x.round().clamp(0, 255).to(torch.uint8).to(device)


def roi_align_route(out_size: int) -> Callable[[torch.Tensor, torch.Generator], torch.Tensor]:
    from torchvision.ops import roi_align

    rrc = T.RandomResizedCrop(out_size)

    def run(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        b, _, h, w = x.shape
        boxes = rrc.sample_boxes(b, h, w, g)
        flip = torch.rand(b, generator=g) < 0.5
        top, left, bh, bw = boxes.double().unbind(1)
        rois = torch.stack(
            [torch.arange(b, dtype=torch.float64), left, top, left + bw, top + bh], 1
        )
        rois = rois.to(torch.float16 if x.is_cuda else torch.float32)
        rois = rois.pin_memory().to(x.device, non_blocking=True) if x.is_cuda else rois
        xf = x.to(torch.float16 if x.is_cuda else torch.float32)
        y = roi_align(xf, rois, (out_size, out_size), 1.0, -1, aligned=True)
        f = flip.pin_memory().to(x.device, non_blocking=True) if x.is_cuda else flip
        y = torch.where(f[:, None, None, None], y.flip(-1), y)
        return y.float().add_(0.5).clamp_(0, 255).to(torch.uint8)

    return run


def timed(
    fn: Callable[[torch.Tensor, torch.Generator], object],
    inputs: list[torch.Tensor],
    *,
    iters: int,
    repeats: int,
    warmup: int,
) -> tuple[list[float], list[float]]:
    """Images per second of ``repeats`` timings, each of ``iters`` calls, and the
    host's microseconds per call in each (the loop's time before the final sync:
    the host's own share while the device keeps up)."""
    dev = inputs[0].device
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    g = torch.Generator().manual_seed(0)
    for k in range(warmup):
        fn(inputs[k % len(inputs)], g)
    rates, host = [], []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for k in range(iters):
            fn(inputs[k % len(inputs)], g)
        t1 = time.perf_counter()
        sync()
        rates.append(iters * inputs[0].shape[0] / (time.perf_counter() - t0))
        host.append((t1 - t0) / iters * 1e6)
    return rates, host


def sweep(kernels, inputs, ready, s_out, ky, args) -> list[dict]:
    """Kernel-only rate for a few (rows, columns, warps) tiles of the dot kernel."""
    keep, out = kernels.DOT_TILE, []
    for tile in [(16, 16, 1), (16, 16, 2), (16, 32, 2), (32, 16, 2), (32, 32, 4), (8, 32, 1)]:
        kernels.DOT_TILE = tile
        try:
            rates, host = timed(
                lambda x, g: kernels.resample(x, ready, s_out, s_out, ky, ky),
                inputs,
                iters=args.iters,
                repeats=args.repeats,
                warmup=args.warmup,
            )
        finally:
            kernels.DOT_TILE = keep
        med = statistics.median(rates)
        out.append(
            {
                "route": f"kernel tile {tile}",
                "img_per_s": med,
                "rates": rates,
                "host_us": statistics.median(host),
            }
        )
        print(f"  kernel tile {tile}: {med:,.0f} img/s", flush=True)
    return out


def machine(dev: torch.device) -> str:
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu"
    return f"{name}, {os.cpu_count()} cores, torch {torch.__version__}"


def accuracy(dev: torch.device, b: int, s_in: int, s_out: int) -> dict[str, float]:
    """Mean absolute difference (0-255 units) vs torchvision's resized_crop, per route."""
    from torchvision.ops import roi_align
    from torchvision.transforms.v2 import functional as F

    n = min(b, 16)
    x = photo_batch(n, s_in, 123, torch.device("cpu"))
    boxes = T.RandomResizedCrop(s_out).sample_boxes(n, s_in, s_in, torch.Generator().manual_seed(1))
    ref = torch.stack(
        [
            F.resized_crop(im, *bx.tolist(), size=[s_out, s_out], antialias=True)
            for im, bx in zip(x, boxes)
        ]
    ).float()
    xd = x.to(dev)
    out = {
        "packer.transforms": T.resized_crop(xd, boxes, s_out).cpu(),
        "matmul route": T.resized_crop(xd, boxes, s_out, backend="matmul").cpu(),
    }
    top, left, bh, bw = boxes.double().unbind(1)
    rois = torch.stack([torch.arange(n, dtype=torch.float64), left, top, left + bw, top + bh], 1)
    y = roi_align(x.float(), rois.float(), (s_out, s_out), 1.0, -1, aligned=True)
    out["roi_align(aligned=True)"] = y.add(0.5).clamp(0, 255).to(torch.uint8)
    return {k: (v.float() - ref).abs().mean().item() for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--in-size", type=int, default=256)
    ap.add_argument("--out-size", type=int, default=224)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="batch 16, 64² -> 56², few repeats")
    ap.add_argument("--sweep", action="store_true", help="also time the kernel's tile sizes")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    args = ap.parse_args()
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("Error: --device cuda but torch sees no CUDA device; use --device cpu")
    if args.quick:
        args.batch, args.in_size, args.out_size = 16, 64, 56
        args.iters, args.repeats, args.warmup = 5, 3, 2
    dev = torch.device(args.device)
    b, s_in, s_out = args.batch, args.in_size, args.out_size

    batch_bytes = b * 3 * s_in * s_in
    n_buf = 2 if dev.type == "cpu" else max(2, math.ceil(4 * 64e6 / batch_bytes))
    inputs = [photo_batch(b, s_in, seed, dev) for seed in range(n_buf)]
    copy_dst = torch.empty_like(inputs[0])

    tf = T.Compose([T.RandomResizedCrop(s_out), T.RandomHorizontalFlip()])
    rrc = tf[0]
    g0 = torch.Generator().manual_seed(7)
    boxes = rrc.sample_boxes(b, s_in, s_in, g0)
    flips = torch.rand(b, generator=g0) < 0.5
    ready = torch.cat([boxes, flips[:, None].long()], 1).to(torch.int32).to(dev)
    ky = math.ceil(2 * max(s_in / s_out, 1.0)) + 1
    kernels = triton_kernels() if dev.type == "cuda" else None
    kernel = kernels.resample if kernels is not None else None

    routes: dict[str, Callable[[torch.Tensor, torch.Generator], object]] = {
        "packer.transforms": lambda x, g: tf(x, generator=g),
    }
    if kernel is not None:
        routes["kernel only (boxes on device)"] = lambda x, g: kernel(
            x, ready, s_out, s_out, ky, ky
        )
    routes["matmul route"] = lambda x, g: T.resized_crop(
        x,
        rrc.sample_boxes(b, s_in, s_in, g),
        s_out,
        flip=torch.rand(b, generator=g) < 0.5,
        backend="matmul",
    )
    routes["roi_align(aligned=True)"] = roi_align_route(s_out)
    routes["device copy of the input bytes"] = lambda x, g: copy_dst.copy_(x)

    print(
        f"RRC + flip, uint8 -> uint8, batch {b}, {s_in}² -> {s_out}², on {machine(dev)}",
        flush=True,
    )
    results = []
    for name, fn in routes.items():
        rates, host = timed(fn, inputs, iters=args.iters, repeats=args.repeats, warmup=args.warmup)
        med, host_us = statistics.median(rates), statistics.median(host)
        results.append({"route": name, "img_per_s": med, "rates": rates, "host_us": host_us})
        print(f"  {name}: {med:,.0f} img/s, host {host_us:,.0f} µs/batch", flush=True)
    if args.sweep and kernels is not None:
        results += sweep(kernels, inputs, ready, s_out, ky, args)
    mads = accuracy(dev, b, s_in, s_out)
    copy_rate = next(r for r in results if r["route"].startswith("device copy"))["img_per_s"]
    print("\n| route | img/s | host µs/batch | vs device copy | MAD vs torchvision (0-255) |")
    print("|---|---|---|---|---|")
    for r in results:
        m = mads.get(r["route"])
        mtxt = f"{m:.3f}" if m is not None else "-"
        print(
            f"| {r['route']} | {r['img_per_s']:,.0f} | {r['host_us']:,.0f} "
            f"| {r['img_per_s'] / copy_rate:.1%} | {mtxt} |"
        )
    report = {
        "machine": machine(dev),
        "date": time.strftime("%Y-%m-%d"),
        "device": str(dev),
        "batch": b,
        "in_size": s_in,
        "out_size": s_out,
        "iters": args.iters,
        "repeats": args.repeats,
        "input_buffers": n_buf,
        "results": results,
        "mad_vs_torchvision": mads,
    }
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
