"""Build time from parquet shards and WebDataset tars against the same images as a
folder, in one run (issue 47's figures: each ratio >= 0.95), and the peak RSS of the
parquet build.

The set is ``benchmarks/build.py``'s set b (500x375 JPEGs, quality 90, 10 classes, made
once under ``--work``). From it, in the folder build's order: parquet shards of
``--rows-per-file`` rows (the ``datasets`` Image struct of bytes and path, a ClassLabel,
row groups of ``--row-group`` rows, as the Hub's files) and WebDataset shards of
``--per-shard`` samples (``key.jpg`` + ``key.cls``). Each build (folder, parquet, tar)
runs ``--repeats`` times, interleaved, all cores' workers, 256x256 crop; the median of
``BuildResult.seconds`` is reported, with the ratio folder/source (higher is better:
1.0 is as fast as the folder). Each build runs in a fresh interpreter, so its peak RSS
(the parent's, and the largest worker's) is its own.

``--s3``: also the tars from a prefix of the repository's S3 test server (``rclone serve
s3`` on 127.0.0.1) against the same tars on disk. That server answers ranged reads with
status 200, which the client refuses, so each process fetches a shard whole once
(docs/RELIABILITY.md); the figure is then a lower bound of a real bucket's.

    python -m benchmarks.sources [--images 16000] [--work /tmp/imgpack-bench] [--s3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

SIZE = 256

_CHILD = r"""
import json, resource, sys
from packer.builder.api import BuildConfig, build
if __name__ == "__main__":
    src = json.loads(sys.argv[1])
    side = int(sys.argv[4]) if len(sys.argv) > 4 else SIZE
    r = build(src, sys.argv[2], BuildConfig(size=(side, side), workers=int(sys.argv[3])))
    print(json.dumps({
        "seconds": r.seconds, "count": r.count, "skipped": len(r.skipped),
        "parent_max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "worker_max_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    }))
""".replace("SIZE", str(SIZE))


def write_parquet(folder: Path, out: Path, rows_per_file: int, row_group: int) -> list[str]:
    """The folder's images, in its build order, as parquet shards; their paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from packer.sources.scan import scan_tree

    done = out / ".imgpack-bench-done"
    if done.exists():
        return sorted(str(p) for p in out.glob("train-*.parquet"))
    out.mkdir(parents=True, exist_ok=True)
    scan = scan_tree(folder)
    features = {
        "image": {"_type": "Image"},
        "label": {"_type": "ClassLabel", "names": scan.classes},
    }
    meta = {b"huggingface": json.dumps({"info": {"features": features}}).encode()}
    kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    schema = pa.schema([("image", kind), ("label", pa.int64())], metadata=meta)
    entries = scan.entries
    for k in range(0, len(entries), rows_per_file):
        part = entries[k : k + rows_per_file]
        images = [{"bytes": (folder / e.rel).read_bytes(), "path": e.rel} for e in part]
        table = pa.table({"image": images, "label": [e.label for e in part]}, schema=schema)
        pq.write_table(
            table, out / f"train-{k // rows_per_file:05d}.parquet", row_group_size=row_group
        )
    done.write_text("ok")
    return sorted(str(p) for p in out.glob("train-*.parquet"))


def write_tars(folder: Path, out: Path, per_shard: int) -> str:
    """The folder's images, in its build order, as WebDataset shards; their brace URL."""
    import io

    from packer.sources.scan import scan_tree

    scan = scan_tree(folder)
    n = (len(scan.entries) + per_shard - 1) // per_shard
    pattern = str(out / f"train-{{{0:06d}..{n - 1:06d}}}.tar")
    done = out / ".imgpack-bench-done"
    if done.exists():
        return pattern
    out.mkdir(parents=True, exist_ok=True)
    for s in range(n):
        with tarfile.open(out / f"train-{s:06d}.tar", "w") as tf:
            for i, e in enumerate(scan.entries[s * per_shard : (s + 1) * per_shard]):
                key = f"{s * per_shard + i:09d}"
                for ext, data in (
                    ("jpg", (folder / e.rel).read_bytes()),
                    ("cls", str(e.label).encode()),
                ):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
    done.write_text("ok")
    return pattern


def run_build(
    src: Any, dst: Path, workers: int, env: dict[str, str] | None = None, side: int = SIZE
) -> dict[str, Any]:
    """One build in a fresh interpreter, off a quiet disk; its result and peak RSS."""
    from .build import clean

    clean(dst)
    script = dst.parent / "_sources_child.py"
    script.write_text(_CHILD)
    p = subprocess.run(
        [sys.executable, str(script), json.dumps(src), str(dst), str(workers), str(side)],
        capture_output=True, text=True, env=env or os.environ.copy(), check=False,
    )  # fmt: skip
    if p.returncode != 0:
        raise RuntimeError(f"build of {src} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=16000)
    ap.add_argument("--work", type=Path, default=Path("/tmp/imgpack-bench"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rows-per-file", type=int, default=4000)
    ap.add_argument("--row-group", type=int, default=1000)
    ap.add_argument("--per-shard", type=int, default=1000)
    ap.add_argument("--s3", action="store_true", help="also tars from the S3 test server")
    ap.add_argument(
        "--rss-gb",
        type=float,
        default=0.0,
        help="also one parquet build of about this many GB of shards (the set's shards "
        "hard-linked under new names), for its peak RSS",
    )
    args = ap.parse_args()

    from ._common import dump, machine
    from .build import set_b

    cores, _, folder, _ = set_b(args.work, args.images)
    parquet = write_parquet(
        folder, args.work / "sources_parquet", args.rows_per_file, args.row_group
    )
    tars = write_tars(folder, args.work / "sources_tar", args.per_shard)
    ways: dict[str, Any] = {"folder": str(folder), "parquet": parquet, "tar": tars}
    env = os.environ.copy()
    server = None
    if args.s3:
        from packer.storage.client import open_store
        from packer.storage.url import parse_url
        from tests.helpers.local_server import S3Server

        server = S3Server(args.work / "s3data", buckets=("bench",)).start()
        env.update(server.env())
        os.environ.update(server.env())
        store = open_store(parse_url("s3://bench/tars"))
        for p in sorted((args.work / "sources_tar").glob("train-*.tar")):
            if store.head(p.name) is None:
                store.put(p, p.name)
        ways["s3_tar"] = "s3://bench/tars/" + Path(tars).name
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in ways}
    try:
        for _ in range(args.repeats):  # interleaved: a drift of the machine hits every way
            for name, src in ways.items():
                r = run_build(src, args.work / f"pack_{name}", cores, env)
                assert r["count"] == args.images and not r["skipped"], (name, r)
                runs[name].append(r)
                print(name, json.dumps(r), flush=True)
    finally:
        if server is not None:
            server.stop()
    big = None
    if args.rss_gb > 0:  # the peak RSS of a large parquet build: the same shards, linked
        files = sorted((args.work / "sources_parquet").glob("train-*.parquet"))
        one = sum(f.stat().st_size for f in files)
        copies = max(1, round(args.rss_gb * 1e9 / one))
        linked = args.work / "sources_parquet_big"
        linked.mkdir(exist_ok=True)
        srcs = []
        for c in range(copies):
            for f in files:
                dst = linked / f"{f.stem}-c{c:03d}.parquet"
                if not dst.exists():
                    os.link(f, dst)
                srcs.append(str(dst))
        # 32² rows: the shards' reading and decoding are the job's; its output stays small
        r = run_build(srcs, args.work / "pack_parquet_big", cores, env, side=32)
        assert r["count"] == args.images * copies and not r["skipped"], r
        big = {"shard_gb": round(one * copies / 1e9, 2), "copies": copies, **r}
        print("parquet_big", json.dumps(big), flush=True)
    med = {k: statistics.median(r["seconds"] for r in v) for k, v in runs.items()}
    ratios = {f"{k}_vs_folder": round(med["folder"] / med[k], 3) for k in med if k != "folder"}
    if "s3_tar" in med:
        ratios["s3_tar_vs_tar"] = round(med["tar"] / med["s3_tar"], 3)
    report = {
        "machine": machine(),
        "images": args.images,
        "size": SIZE,
        "workers": cores,
        "median_seconds": {k: round(v, 3) for k, v in med.items()},
        "ratios": ratios,
        "peak_rss_mb": {
            k: {
                "parent": round(max(r["parent_max_rss_mb"] for r in v), 1),
                "largest_worker": round(max(r["worker_max_rss_mb"] for r in v), 1),
            }
            for k, v in runs.items()
        },
        "runs": runs,
        "parquet_big": big,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    dump(report, "sources.json")
    print(json.dumps({"median_seconds": report["median_seconds"], "ratios": ratios}, indent=1))


if __name__ == "__main__":
    main()
