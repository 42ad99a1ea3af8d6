"""The JPEG loader's crop kernel on large photos: single-patch kernels (one compile per
patch size, 128 and 256 included) vs the parts kernel (the patch in 64 x 64 parts, one
compile for any downscale), on the GPU, in one run.

For each photo size, a batch of random uint8 images of that size (each its own
allocation, as a decoder leaves them) with RandomResizedCrop(224) boxes and flips, as the
loader draws them. Per way (``--ways``: the square patch from which bilinear launches
take the parts kernel; ``off`` = never, so 128 and 256 use single patches):

* the first call's time, from a fresh Triton cache made for this run: what a new
  machine's first batch waits for the compiles;
* then ``--iters`` calls timed with CUDA events, ``--rounds`` rounds alternating the
  ways: milliseconds a batch (median of rounds) and the ratio to ``off``;
* the largest pixel difference from ``off`` (the same filter: at most 1).

    python3 -m benchmarks.crop_parts [--sizes 4000x3000:64,1600x1200:256] [--ways off,128]

Prints a table; writes ``bench_crop_parts.json`` under ``$OUT`` (default ``./out``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any

# a fresh Triton cache before Triton loads: the first calls time the compiles
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="imgpack-triton-")

import numpy as np
import torch

from ._common import dump, machine


def batch(w: int, h: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray, list]:
    """(table int64 [n, 9], each box's scales [n, 2], the images) for ``n`` random
    [3, h, w] images on CUDA with RandomResizedCrop(224) boxes and flips."""
    from packer.transforms import RandomResizedCrop

    g = torch.Generator().manual_seed(seed)
    imgs = [torch.randint(0, 256, (3, h, w), dtype=torch.uint8, device="cuda") for _ in range(n)]
    boxes = (
        RandomResizedCrop(224).sample_boxes(n, torch.full((n,), h), torch.full((n,), w), g).numpy()
    )
    table = np.empty((n, 9), dtype=np.int64)
    table[:, 0] = [x.data_ptr() for x in imgs]
    table[:, 1:5] = boxes
    table[:, 5] = torch.randint(0, 2, (n,), generator=g).numpy()
    table[:, 6], table[:, 7] = h, w
    table[:, 8] = np.arange(n)
    scales = np.stack([boxes[:, 2] / 224, boxes[:, 3] / 224], 1)
    return table, scales, imgs


def run_way(table: np.ndarray, scales: np.ndarray, parts_from: int) -> torch.Tensor:
    import packer.imaging.resample_triton as R

    order, launches = R.ragged_order(scales, parts_from=parts_from)
    t = torch.from_numpy(table[order]).cuda()
    return R.resample_ragged(
        t, 3, 224, 224, tuple(scales.max(0)), torch.device("cuda"), launches,
        parts_from=parts_from,
    )  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sizes", default="4000x3000:64,1600x1200:256", help="WxH:batch,...")
    ap.add_argument(
        "--ways",
        default="256,128,off",
        help="parts_from values; off = never (the first way's first call compiles the "
        "small patches too)",
    )
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("crop_parts.py measures a CUDA kernel: run it on a GPU machine")
    ways = {w: (1 << 30) if w == "off" else int(w) for w in a.ways.split(",")}
    res: dict[str, Any] = {"machine": machine(), "args": vars(a), "sizes": {}}
    for spec in a.sizes.split(","):
        wh, n = spec.split(":")
        w, h = (int(v) for v in wh.split("x"))
        table, scales, imgs = batch(w, h, int(n), 0)
        first: dict[str, float] = {}
        outs: dict[str, torch.Tensor] = {}
        for k, pf in ways.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            outs[k] = run_way(table, scales, pf)
            torch.cuda.synchronize()
            first[k] = time.perf_counter() - t0
        ms: dict[str, list[float]] = {k: [] for k in ways}
        for _ in range(a.rounds):
            for k, pf in ways.items():
                run_way(table, scales, pf)
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record()
                for _ in range(a.iters):
                    run_way(table, scales, pf)
                end.record()
                end.synchronize()
                ms[k].append(start.elapsed_time(end) / a.iters)
        base = "off" if "off" in ways else next(iter(ways))
        diff = {k: int((o.int() - outs[base].int()).abs().max()) for k, o in outs.items()}
        res["sizes"][spec] = {
            "first_call_s": first,
            "ms": {k: statistics.median(v) for k, v in ms.items()},
            "ms_rounds": ms,
            "max_diff": diff,
        }
        del imgs
    dump(res, "bench_crop_parts.json")
    print(f"\n== {res['machine'].get('gpu')}: crop to 224 of RandomResizedCrop boxes")
    base_way = "off" if "off" in ways else next(iter(ways))
    print(
        f"| photos, batch | way | first call s (compiles) | ms a batch | / {base_way} | max diff |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for spec, r in res["sizes"].items():
        base = r["ms"][base_way]
        for k in ways:
            print(
                f"| {spec} | {k} | {r['first_call_s'][k]:.2f} | {r['ms'][k]:.3f} "
                f"| {r['ms'][k] / base:.3f} | {r['max_diff'][k]} |"
            )


if __name__ == "__main__":
    main()
