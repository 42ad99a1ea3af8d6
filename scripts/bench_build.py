"""Build speed: decode+resize 640x480 JPEGs -> 224x224, for 1, 2 and all workers.

Baseline, in the same run: a single-process Pillow loop (open, convert("RGB"),
resize shorter side to 224 and centre-crop, to numpy) over the same files. And the
machine's own parallel limit: 1..all independent processes each running imgpack's
decode on its own files with no pack, no writes and no coordination: how far
``imgpack build`` could scale on this hardware at best.

    python scripts/bench_build.py [--images 4000] [--work /tmp/imgpack-bench]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
import packer
from _out import dump, machine
from packer.bench.synth import make_jpeg_tree
from packer.build import BuildConfig
from packer.format import block_rows_for
from packer.timing import median_rate

CPU = torch.device("cpu")


def pillow_loop(files: list[Path]) -> int:
    """Decode, resize and crop ``files`` one by one in this process; returns the count."""
    for f in files:
        with Image.open(f) as im:
            im = im.convert("RGB")
            w, h = im.size
            s = 224 / min(w, h)
            im = im.resize((round(w * s), round(h * s)), Image.Resampling.BILINEAR)
            w, h = im.size
            left, top = (w - 224) // 2, (h - 224) // 2
            np.asarray(im.crop((left, top, left + 224, top + 224)))
    return len(files)


def _decode_slice(files: list[str]) -> int:
    from packer.decode import ResizeSpec, decode

    spec = ResizeSpec(224, 224, "crop", 100_000_000)
    for f in files:
        decode(f, spec)
    return len(files)


def _ready(_: int) -> int:
    import packer.decode  # noqa: F401  (import before the clock starts)

    return os.getpid()


def ceiling(files: list[Path], procs: int, per_proc: int, repeats: int = 3) -> float:
    """The machine's own limit: ``procs`` independent processes decoding disjoint
    files with imgpack's decode (no pack, no writes, no coordination); median img/s."""
    import multiprocessing as mp

    names = [str(f) for f in files]
    slices = [names[(i * per_proc) % len(names) :][:per_proc] for i in range(procs)]
    with mp.get_context("forkserver").Pool(procs) as pool:
        pool.map(_ready, range(procs * 4), chunksize=1)  # started, imports done: off the clock
        return median_rate(lambda: sum(pool.map(_decode_slice, slices, chunksize=1)), CPU, repeats)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=4000)
    ap.add_argument("--work", type=Path, default=Path("/tmp/imgpack-bench"))
    args = ap.parse_args()
    src = args.work / "jpeg640"
    make_jpeg_tree(src, args.images, (640, 480), classes=10, quality=90)
    files = sorted(src.rglob("*.jpg"))
    cores = os.cpu_count() or 1
    # 1 and 2 workers get a subset sized to run a few seconds; rates are per image anyway.
    plan = [
        (1, max(200, args.images // 16)),
        (2, max(400, args.images // 8)),
        (cores - 1, args.images),
        (cores, args.images),
    ]
    plan = [p for i, p in enumerate(plan) if p[0] >= 1 and p[0] not in [q[0] for q in plan[:i]]]
    rows = []
    base = median_rate(lambda: pillow_loop(files[:300]), CPU, 3)
    for workers, n in plan:
        sub = args.work / f"sub{n}"
        if not sub.exists():
            for f in files[:n]:
                d = sub / f.parent.name
                d.mkdir(parents=True, exist_ok=True)
                os.link(f, d / f.name)
        rates = []
        for _ in range(2):
            dst = args.work / f"pack_w{workers}"
            shutil.rmtree(dst, ignore_errors=True)
            r = packer.build_pack(
                sub, dst, BuildConfig(size=(224, 224), workers=workers, overwrite=True)
            )
            rates.append((r.count / r.seconds, r.extra))
        best = max(rates, key=lambda x: x[0])
        rows.append({"workers": workers, "images": n, "img_per_s": best[0], **best[1]})
    one = rows[0]["img_per_s"]
    per_proc = 300
    ceil = {}
    for p in sorted(p for p in {1, 2, 4, 8, cores // 2, cores - 1, cores} if 1 <= p <= cores):
        ceil[p] = ceiling(files, p, per_proc)
    print(f"\ndecode ceiling: {per_proc} images per independent process, no pack (median of 3)")
    print("| processes | img/s | vs 1 process | scaling |")
    print("|---|---|---|---|")
    for p, v in ceil.items():
        print(f"| {p} | {v:,.0f} | {v / ceil[1]:.2f}x | {v / ceil[1] / p:.0%} |")
    print(f"\nbuild speed, 640x480 JPEG -> 224x224 crop, {cores} cores ({machine()})")
    print(
        "| workers | images | img/s | vs 1 worker | scaling efficiency | vs Pillow loop "
        "| setup s | first chunk s | decode s (from start) | finalize s | img/s after first chunk |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    print(f"| Pillow loop (1 process, no draft) | 300 | {base:,.0f} | | | 1.00x |")
    for r in rows:
        sp = r["img_per_s"] / one
        print(
            f"| {r['workers']} | {r['images']} | {r['img_per_s']:,.0f} | {sp:.2f}x | "
            f"{sp / r['workers']:.0%} | {r['img_per_s'] / base:.2f}x | {r['setup_s']} | "
            f"{r['first_chunk_s']} | {r['decode_s']} | {r['finalize_s']} | "
            f"{(r['images'] - block_rows_for(r['images'])) / max(1e-9, r['decode_s'] - r['setup_s'] - r['first_chunk_s']):,.0f} |"
        )
    dump(
        {"machine": machine(), "pillow_loop": base, "rows": rows, "ceiling": ceil},
        "bench_build.json",
    )


if __name__ == "__main__":
    main()
