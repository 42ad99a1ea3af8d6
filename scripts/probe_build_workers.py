"""Does ``build --device cuda`` go faster with fewer CPU workers (issue 18 §2)?

The fourth round's tmpfs probe showed the decoder thread running at half its own rate
inside a build, beside 16 worker processes, 4 reader and 4 writer threads. This sweeps
the worker count of a GPU build in one warm process (CUDA, nvjpeg and the crop kernel
started by a first build off the clock), rounds interleaved, against the 16-process
Pillow ceiling measured in the same run, on set b of ``bench_build.py`` (16,000 JPEGs
500x375 -> 256²).

    python scripts/probe_build_workers.py [--workers 16,8,4] [--work /tmp/imgpack-gpu/bw]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_build import SETS, ceiling, clean, make_set


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=16000)
    ap.add_argument("--workers", default="16,8,4")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test of the script")
    ap.add_argument("--work", type=Path, default=Path("/tmp/imgpack-gpu/bw"))
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    a = ap.parse_args()
    spec = SETS["b"]
    side = spec["out"]
    src, dst = a.work / "b", a.work / "pack"
    make_set(src, a.images, spec["size"], os.cpu_count() or 1)
    files = sorted(str(p) for p in src.rglob("*.jpg"))
    ceil = ceiling(files, os.cpu_count() or 1, side)
    print(f"ceiling {ceil:,.0f} img/s", flush=True)

    import packer
    from packer.build import BuildConfig

    def build(workers: int) -> dict:
        clean(dst)
        cfg = BuildConfig(size=(side, side), workers=workers, device=a.device)
        t = time.perf_counter()
        r = packer.build_pack(src, dst, cfg)
        return {"img_s": r.count / (time.perf_counter() - t), "seconds": r.seconds}

    build(16)  # CUDA, nvjpeg, the crop kernel: off the clock
    counts = [int(w) for w in a.workers.split(",")]
    runs: dict[int, list[float]] = {w: [] for w in counts}
    for r in range(a.rounds):
        for w in counts:
            runs[w].append(build(w)["img_s"])
            print(r, w, round(runs[w][-1]), flush=True)
    rows = [
        {
            "workers": w,
            "img_s": statistics.median(v),
            "runs": [round(x) for x in v],
            "x_ceiling": statistics.median(v) / ceil,
        }
        for w, v in runs.items()
    ]
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "build_workers.json").write_text(
        json.dumps(
            {"ceiling": ceil, "date": time.strftime("%F %H:%M UTC", time.gmtime()), "rows": rows}
        )
    )
    print(f"\n| GPU build, warm process | img/s (runs) | x ceiling ({ceil:,.0f}) |\n|---|---|---|")
    for row in rows:
        runs_s = " / ".join(f"{x:,}" for x in row["runs"])
        print(
            f"| {row['workers']} workers | {row['img_s']:,.0f} ({runs_s}) | {row['x_ceiling']:.2f} |"
        )


if __name__ == "__main__":
    main()
