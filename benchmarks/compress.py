"""Compress speed: imgpack compress vs. the shell loop people write, same files, same run.

    for f in *.jpg; do ffmpeg -loglevel error -y -i "$f" -q:v 3 out/"$f"; done

Inputs: synthetic 3000x2000 JPEG photos (quality 95, made from the sample
photos). imgpack runs with 1, 4 and all workers.

    python -m benchmarks.compress [--images 96] [--work /tmp/imgpack-bench]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import time
from pathlib import Path

import packer
from packer.compress import CompressConfig, ffmpeg_exe
from packer.measure.bench.synth import make_jpeg_tree

from ._common import dump, machine


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=96)
    ap.add_argument("--work", type=Path, default=Path("/tmp/imgpack-bench"))
    args = ap.parse_args()
    src = args.work / "photos"
    make_jpeg_tree(src, args.images, (3000, 2000), classes=1, quality=95)
    flat = src / "class_0"
    files = sorted(flat.glob("*.jpg"))
    size_in = sum(f.stat().st_size for f in files)
    out = args.work / "loop_out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    script = 'for f in *.jpg; do "$FF" -loglevel error -y -i "$f" -q:v 3 "$OUTDIR/$f"; done'
    t0 = time.perf_counter()
    subprocess.run(
        ["bash", "-c", script],
        cwd=flat,
        check=True,
        env={**os.environ, "FF": ffmpeg_exe(), "OUTDIR": str(out)},
    )
    loop = len(files) / (time.perf_counter() - t0)
    rows = [
        {
            "how": "shell loop, 1 ffmpeg at a time",
            "img_per_s": loop,
            "bytes_out": sum(f.stat().st_size for f in out.glob("*.jpg")),
        }
    ]
    cores = os.cpu_count() or 1
    for w in sorted({1, 4, cores}):
        dst = args.work / f"imgpack_out_{w}"
        shutil.rmtree(dst, ignore_errors=True)
        r = packer.compress_tree(flat, dst, CompressConfig(quality=3, workers=w))
        assert not r.failed, r.failed
        rows.append(
            {
                "how": f"imgpack compress, {w} workers",
                "img_per_s": r.written / r.seconds,
                "bytes_out": r.bytes_out,
            }
        )
    print(
        f"\ncompress {len(files)} JPEGs 3000x2000 ({size_in / len(files) / 1e6:.2f} MB each) "
        f"at -q:v 3 ({machine()})"
    )
    print("| how | img/s | vs shell loop | output MB per image |")
    print("|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['how']} | {r['img_per_s']:.1f} | {r['img_per_s'] / loop:.2f}x | "
            f"{r['bytes_out'] / len(files) / 1e6:.3f} |"
        )
    dump({"machine": machine(), "bytes_in": size_in, "rows": rows}, "bench_compress.json")


if __name__ == "__main__":
    main()
