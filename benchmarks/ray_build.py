"""``imgpack build --engine ray`` against the local set build, same images, same cores.

* data: ``--images`` 500x375 JPEGs (quality 90, benchmarks/build.py's set ``b``, made
  once under ``--work``) -> 224x224 raw, shards of ``--shard-images`` images;
* **local**: ``imgpack build --shard-size`` as a library call in a child interpreter
  (``BuildResult.seconds``), all cores' workers per shard;
* **ray**: the same build with ``engine="ray"`` from this process, connected to a
  one-machine Ray cluster of all cores (``ray.init(num_cpus=cores)``), its workers
  warmed off the clock: one task of one CPU per shard. Rounds alternate local / ray;
  the medians are compared (the target: ray >= 85% of local);
* **start-up**: ``ray.init`` alone, the first tasks (worker processes start and import
  imgpack), and the whole CLI command (``--engine ray`` vs local, fresh interpreter,
  wall clock: Ray's fixed cost as a user sees it);
* **per shard**: ``--tiny`` shards of one 64x48 PNG each, built by both engines: the
  cost of a shard beyond its images (task, lock, work folder, fsyncs, manifest,
  rename), in core-seconds.

    python -m benchmarks.ray_build [--images 3000] [--shard-images 150] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from ._common import dump, machine
from .build import SETS, clean, make_set

ROOT = Path(__file__).resolve().parent.parent
ROW = 3 * 224 * 224


def env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}


def local_build(src: Path, dst: Path, side: int, shard_size: int | None, workers: int) -> float:
    """Seconds of one local set build (library call in a child interpreter); ``shard_size``
    None: one pack (no shards), the machine's best."""
    clean(dst)
    code = (
        "import json;from packer import BuildConfig,build_pack as build;"
        f"r=build({str(src)!r},{str(dst)!r},BuildConfig(size=({side},{side}),"
        f"workers={workers},shard_size={shard_size}));"
        "print('RESULT '+json.dumps({'count':r.count,'seconds':r.seconds,'shards':r.shards}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env(), capture_output=True, text=True, check=True
    )
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[7:])["seconds"]


def ray_build(src: Path, dst: Path, side: int, shard_size: int) -> tuple[float, list[dict]]:
    from packer.builder.api import BuildConfig, build

    clean(dst)
    r = build(src, dst, BuildConfig(size=(side, side), shard_size=shard_size, engine="ray"))
    return r.seconds, r.per_shard


def cli_wall(src: Path, dst: Path, side: int, shard_size: int, engine: str) -> float:
    clean(dst)
    cmd = [sys.executable, "-m", "packer", "build", str(src), str(dst), "--size", str(side)]
    cmd += ["--shard-size", str(shard_size), "--engine", engine, "-q"]
    t = time.perf_counter()
    subprocess.run(cmd, env=env(), check=True, capture_output=True)
    return time.perf_counter() - t


def tiny_set(root: Path, n: int) -> Path:
    from packer.measure.bench.synth import make_jpeg_tree

    if not (root / ".done").exists():
        make_jpeg_tree(root, n, (64, 48), classes=2)
        (root / ".done").write_text("ok")
    return root


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=3000)
    ap.add_argument("--shard-images", type=int, default=150)
    ap.add_argument("--tiny", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path("/tmp/imgpack-bench"))
    args = ap.parse_args()
    cores = len(os.sched_getaffinity(0))
    side = 224
    src = args.work / f"ray_b_{args.images}"
    make_set(src, args.images, SETS["b"]["size"], cores)
    shard = args.shard_images * ROW
    res: dict = {"machine": machine(), "cores": cores, "images": args.images}
    res["shards"] = -(-args.images // args.shard_images)

    # Ray's fixed cost as a user meets it: the whole command, fresh interpreter, cold
    res["cli_local_s"] = cli_wall(src, args.work / "cli_local", side, shard, "local")
    res["cli_ray_s"] = cli_wall(src, args.work / "cli_ray", side, shard, "ray")
    print(f"CLI wall: local {res['cli_local_s']:.1f} s, ray {res['cli_ray_s']:.1f} s", flush=True)

    import ray

    t = time.perf_counter()
    ray.init(num_cpus=cores, include_dashboard=False, logging_level="ERROR")
    res["ray_init_s"] = time.perf_counter() - t

    @ray.remote(num_cpus=1)
    def warm(_: int) -> int:
        import packer.builder.run  # noqa: F401  (what a shard task imports)

        time.sleep(0.2)  # every worker gets one
        return os.getpid()

    t = time.perf_counter()
    ray.get([warm.remote(i) for i in range(cores)])
    res["first_tasks_s"] = time.perf_counter() - t
    print(f"ray.init {res['ray_init_s']:.1f} s, first tasks {res['first_tasks_s']:.1f} s")

    local, rays, single = [], [], []
    for k in range(args.rounds):
        single.append(local_build(src, args.work / "local", side, None, cores))
        local.append(local_build(src, args.work / "local", side, shard, cores))
        s, per_shard = ray_build(src, args.work / "ray", side, shard)
        rays.append(s)
        nodes = {w["pid"] for w in per_shard}
        print(f"round {k}: one pack {single[-1]:.2f} s, local set {local[-1]:.2f} s, "
              f"ray {s:.2f} s ({len(nodes)} workers)", flush=True)  # fmt: skip
    res["single_s"], res["local_s"], res["ray_s"] = single, local, rays
    lm, rm, sm = statistics.median(local), statistics.median(rays), statistics.median(single)
    res["ratio"] = lm / rm

    tiny = tiny_set(args.work / f"ray_tiny_{args.tiny}", args.tiny)
    t_local = local_build(tiny, args.work / "tiny_local", 32, 1, 1)
    t_ray, _ = ray_build(tiny, args.work / "tiny_ray", 32, 1)
    # one image of 64x48 each: what is left is the shard's own cost
    res["per_shard_local_core_s"] = t_local / args.tiny
    res["per_shard_ray_core_s"] = t_ray * cores / args.tiny
    ray.shutdown()
    for name in ("local", "ray", "cli_local", "cli_ray", "tiny_local", "tiny_ray"):
        shutil.rmtree(args.work / name, ignore_errors=True)
    dump(res, "ray_build.json")

    n = args.images
    print(f"\n--engine ray vs local set build, {cores} cores ({res['machine'].get('cpu')}), "
          f"{n} 500x375 JPEGs -> 224x224 raw, {res['shards']} shards of {args.shard_images}")  # fmt: skip
    print(f"| build | seconds (median of {args.rounds}) | img/s | vs local |")
    print("|---|---|---|---|")
    print(
        f"| one pack (no shards), {cores} workers | {sm:.2f} | {n / sm:,.0f} | {100 * lm / sm:.0f}% |"
    )
    print(f"| local set, {cores} workers per shard | {lm:.2f} | {n / lm:,.0f} | 100% |")
    print(f"| ray, {cores} tasks of 1 CPU | {rm:.2f} | {n / rm:,.0f} | {100 * lm / rm:.0f}% "
          f"({100 * sm / rm:.0f}% of one pack) |")  # fmt: skip
    print(
        f"| CLI local (wall, cold) | {res['cli_local_s']:.2f} | {n / res['cli_local_s']:,.0f} | |"
    )
    print(f"| CLI ray (wall, cold: cluster start) | {res['cli_ray_s']:.2f} | "
          f"{n / res['cli_ray_s']:,.0f} | |")  # fmt: skip
    print(f"\nstart-up: ray.init {res['ray_init_s']:.1f} s + first tasks "
          f"{res['first_tasks_s']:.1f} s; CLI ray - local {res['cli_ray_s'] - res['cli_local_s']:.1f} s")  # fmt: skip
    print(f"per shard (1 tiny image each, {args.tiny} shards): local "
          f"{res['per_shard_local_core_s'] * 1000:.0f} ms, ray {res['per_shard_ray_core_s'] * 1000:.0f} "
          "ms of a core")  # fmt: skip


if __name__ == "__main__":
    main()
