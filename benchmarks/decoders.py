"""Each JPEG decoder of ``packer.imaging.decoders`` on the same bytes, and the CPU ceiling.

All in one run, on the same ImageNet-like JPEGs (about 500x375, quality 90, from
``packer.measure.bench.synth.make_jpeg_tree``), batch 256, per decoder (nvImageCodec as
engines + CUDA decoder, engines alone, CUDA decoder alone; torchcodec; torchvision; the
CPU decoder), each where it imports:

* ``full``: bare batched decode (``decode``), img/s;
* ``roi``: decode of RandomResizedCrop boxes only (``decode_rois``; the same boxes for
  every decoder), img/s, and the way it ran (``roi_path``);
* ``rrc``: decode + RRC 224 + flip (``RoiResizedCrop``: the ROI-fused crop), img/s;
* pixels: mean |diff| vs Pillow over the first 64 images, in 1/255 levels.

Repeats are interleaved (every decoder and mode once per round), medians and minima
reported. The baselines, measured in the same run on the same files with N processes
(N = every core): Pillow decode + resize to 224 (``build.py``'s ceiling, the build's
decode) and Pillow decode + RRC-like crop + flip (``jpeg.py``'s). Prints a table; writes
``$OUT/bench_decoders.json``.

    python benchmarks/decoders.py [--images 4096] [--batch 256] [--repeats 4] [--device cuda]
    python benchmarks/decoders.py --quick --device cpu     # a smoke test on the CPU
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _out import dump, machine
from build import ceiling as resize_ceiling
from jpeg import cpu_ceiling as rrc_ceiling
from packer.errors import UsageError
from packer.imaging.decoders import GPU_CHAIN, DecoderBase, get_decoder
from packer.imaging.roi_crop import RoiResizedCrop
from packer.measure.bench.synth import make_jpeg_tree
from packer.measure.timing import resolve_device, sync


def decoders(device: torch.device) -> dict[str, DecoderBase]:
    """Every decoder that runs on ``device``, by label."""
    out: dict[str, DecoderBase] = {}
    variants: list[tuple[str, str, dict[str, Any]]] = []
    if device.type == "cuda":
        variants += [
            (f"nvimgcodec {b}", "nvimgcodec", {"backends": b})
            for b in ("hw+hybrid", "hw", "hybrid")
        ]
        variants += [(n, n, {}) for n in GPU_CHAIN[1:]]
    else:
        variants += [
            ("cpu", "cpu", {}),
            ("nvimgcodec cpu", "nvimgcodec", {}),
            ("torchcodec", "torchcodec", {}),
        ]
    for label, name, kw in variants:
        try:
            out[label] = get_decoder(device, prefer=name, **kw)
        except UsageError as e:
            print(f"  {label}: not run ({e})", file=sys.stderr)
    return out


def pillow(data: torch.Tensor) -> np.ndarray:
    with Image.open(__import__("io").BytesIO(bytes(data.numpy()))) as im:
        return np.asarray(im.convert("RGB")).transpose(2, 0, 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--procs", type=int, default=0, help="ceiling processes (0: every core)")
    ap.add_argument("--quick", action="store_true", help="a small run (smoke test)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/imgpack-decoders"))
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()
    if args.quick:
        args.images, args.batch, args.repeats = 96, 32, 2
    device = resolve_device(args.device)
    procs = args.procs or len(os.sched_getaffinity(0))
    shutil.rmtree(args.work, ignore_errors=True)
    src = args.work / "src"
    make_jpeg_tree(src, args.images, (500, 375), quality=90)
    files = sorted(str(p) for p in src.rglob("*.jpg"))
    datas = [torch.frombuffer(bytearray(Path(f).read_bytes()), dtype=torch.uint8) for f in files]
    n = len(datas) - len(datas) % args.batch
    batches = [datas[i : i + args.batch] for i in range(0, n, args.batch)]
    hw = torch.tensor([[375, 500]] * args.batch)
    draw = RoiResizedCrop(get_decoder("cpu", threads=0), 224)
    gen = torch.Generator().manual_seed(0)
    draws = [draw.boxes(hw, gen) for _ in batches]  # the same boxes and flips for every decoder
    res: dict[str, Any] = {
        "machine": machine(), "images": n, "batch": args.batch, "repeats": args.repeats,
        "device": str(device), "ceiling_procs": procs,
    }  # fmt: skip

    decs = decoders(device)
    crops = {k: RoiResizedCrop(d, 224) for k, d in decs.items()}

    def full(dec: DecoderBase) -> int:
        return sum(len(dec.decode(b, sizes=hw)) for b in batches)

    def roi(dec: DecoderBase) -> int:
        return sum(len(dec.decode_rois(b, bx, sizes=hw)) for b, (bx, _) in zip(batches, draws))

    def rrc(crop: RoiResizedCrop) -> int:
        return sum(len(crop.apply(b, hw, bx, f)) for b, (bx, f) in zip(batches, draws))

    work: dict[tuple[str, str], Callable[[], int]] = {}
    for k, d in decs.items():
        work[k, "full"] = lambda d=d: full(d)
        work[k, "roi"] = lambda d=d: roi(d)
        work[k, "rrc"] = lambda c=crops[k]: rrc(c)
    for k, d in decs.items():  # warm-up off the clock: handles, pools, ROI probe, Triton
        d.decode(batches[0], sizes=hw)
        d.decode_rois(batches[0], draws[0][0], sizes=hw)
        crops[k].apply(batches[0], hw, *draws[0])
    sync(device)
    rates: dict[tuple[str, str], list[float]] = {key: [] for key in work}
    for r in range(args.repeats):
        for key, fn in work.items():
            sync(device)
            t0 = time.perf_counter()
            count = fn()
            sync(device)
            rates[key].append(count / (time.perf_counter() - t0))
        print(f"  round {r + 1}/{args.repeats} done", file=sys.stderr, flush=True)

    ref = [pillow(d) for d in datas[:64]]
    rows = {}
    for k, d in decs.items():
        got = d.decode(datas[:64], sizes=torch.tensor([[375, 500]] * 64))
        diff = float(
            np.mean([np.abs(g.cpu().numpy().astype(np.int16) - p).mean() for g, p in zip(got, ref)])
        )
        rows[k] = {
            "name": d.name, "roi_path": d.roi_path, "vs_pillow_mean_abs": round(diff, 4),
            **{f"{m}_img_s": round(statistics.median(rates[k, m]), 1) for m in ("full", "roi", "rrc")},
            **{f"{m}_min_img_s": round(min(rates[k, m]), 1) for m in ("full", "roi", "rrc")},
            **({"roi_fallbacks": d.roi_fallbacks} if hasattr(d, "roi_fallbacks") else {}),
        }  # fmt: skip
    res["decoders"] = rows

    per_proc = max(8, len(files) // procs)
    res["ceiling_resize_224_img_s"] = round(resize_ceiling(files, procs, 224, args.repeats), 1)
    res["ceiling_rrc_flip_img_s"] = round(rrc_ceiling(files, procs, per_proc, args.repeats), 1)

    ceil = res["ceiling_resize_224_img_s"]
    best = max((r["full_img_s"], k) for k, r in rows.items()) if rows else (0.0, "-")
    res["best_full"] = {"decoder": best[1], "img_s": best[0]}
    print(f"\nJPEG decoders on {device} ({res['machine'].get('gpu', res['machine'].get('cpu', ''))}),"
          f" {n} images ~500x375 q90, batch {args.batch}, median of {args.repeats} interleaved")  # fmt: skip
    print(
        "| decoder | full img/s | roi img/s (path) | roi+rrc 224+flip img/s | rrc / best full | rrc / ceiling | vs Pillow |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for k, r in rows.items():
        print(f"| {k} | {r['full_img_s']:,.0f} | {r['roi_img_s']:,.0f} ({r['roi_path']}) | "
              f"{r['rrc_img_s']:,.0f} | {r['rrc_img_s'] / best[0]:.2f} | {r['rrc_img_s'] / ceil:.2f}x | "
              f"{r['vs_pillow_mean_abs']:.3f}/255 |")  # fmt: skip
    print(f"| CPU ceiling, {procs} procs: Pillow decode+resize 224 | {ceil:,.0f} | | | | 1.00x | |")
    print(f"| CPU ceiling, {procs} procs: Pillow decode+RRC+flip | | | "
          f"{res['ceiling_rrc_flip_img_s']:,.0f} | | | |")  # fmt: skip
    dump(res, "bench_decoders.json")


if __name__ == "__main__":
    main()
