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
s3`` on 127.0.0.1) against the same tars on disk. That server answers a ranged read with
status 200 and the range's bytes (a Content-Range); the client reads such ranges through
a signed URL (packer/storage/client.py), so each worker reads its members, not whole
shards. The server runs without ETags (``--etag-hash ""``): with them, rclone reads the
whole object for its MD5 at every request, ranged ones included, which bounded the
figure (a real store keeps an object's ETag). The build spools each shard beside DST by
one streamed GET while it lists them, and the workers read the spool
(packer/builder/formats/spool.py). One more build, untimed, goes through a counting proxy (tests/helpers/
counting_proxy.py): the bytes the server sent while the shards were listed and while
the workers built, each over the shards' bytes (1.0 in all: once).

``--rss-gb G``: one parquet build of about G GB of shards (the set's shards hard-linked
under new names: no disk but the links; a symbolic link where hard links fail), 32² rows
written, for the parent's and the largest worker's peak RSS and its time.

A table of the figures is printed at the end; everything (each run, the time split of
each build) is written to ``$OUT/sources.json``.

    python -m benchmarks.sources [--images 16000] [--work /tmp/imgpack-bench] [--s3]
                                 [--rss-gb 10]
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
        # ru_maxrss keeps the launcher's peak across exec on Linux; VmHWM is this image's own
        "parent_hwm_mb": next((int(l.split()[1]) / 1024 for l in open("/proc/self/status")
                               if l.startswith("VmHWM:")), None),
        "worker_max_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
        "split": {k: r.extra.get(k) for k in ("setup_s", "first_chunk_s", "decode_s",
                                               "finalize_s", "worker")},
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


def count_wire(server: Any, url: str, work: Path, workers: int) -> dict[str, Any]:
    """One build of the bucket's tars through a proxy counting what the server sends:
    bytes while the shards are listed (until the build starts its chunks) and while the
    workers build, each over the shards' bytes."""
    from packer.builder.api import BuildConfig, build
    from packer.storage.client import open_store
    from packer.storage.url import parse_url
    from tests.helpers.counting_proxy import CountingProxy

    from .build import clean

    prefix = url.rsplit("/", 1)[0]
    total = sum(s for k, s, _ in open_store(parse_url(prefix)).list_meta() if k.endswith(".tar"))
    proxy = CountingProxy(server.port)
    old = os.environ.get("AWS_ENDPOINT_URL")
    os.environ["AWS_ENDPOINT_URL"] = proxy.endpoint
    listed: list[int] = []
    dst = work / "pack_s3_counted"
    clean(dst)
    try:
        r = build(url, dst, BuildConfig(size=(SIZE, SIZE), workers=workers),
                  on_start=lambda *_: listed.append(proxy.down))  # fmt: skip
        built = proxy.down - listed[0]
    finally:
        proxy.stop()
        if old is not None:
            os.environ["AWS_ENDPOINT_URL"] = old
    return {
        "shard_bytes": total,
        "listing_bytes": listed[0],
        "building_bytes": built,
        "listing_x": round(listed[0] / total, 3),
        "building_x": round(built / total, 3),
        "count": r.count,
    }


def table(
    med: dict[str, float],
    ratios: dict[str, float],
    rss: dict[str, Any],
    wire: dict[str, Any] | None,
    big: dict[str, Any] | None,
) -> str:
    """The figures as a markdown table (what | figure | baseline | ratio | target)."""
    rows = [
        "| what | figure | baseline, same run | ratio | target |",
        "| --- | --- | --- | --- | --- |",
    ]
    for k, target in (("parquet", 0.95), ("tar", 0.95)):
        if k in med:
            r = ratios[f"{k}_vs_folder"]
            rows.append(f"| {k} vs the folder | {med[k]:.2f} s | {med['folder']:.2f} s | "
                        f"{r:.3f} | >= {target} ({'met' if r >= target else 'not met'}) |")  # fmt: skip
    if "s3_tar" in med:
        r = ratios["s3_tar_vs_tar"]
        rows.append(f"| tars from the S3 server vs the same tars on disk | {med['s3_tar']:.2f} s | "
                    f"{med['tar']:.2f} s | {r:.3f} | >= 0.8 ({'met' if r >= 0.8 else 'not met'}) |")  # fmt: skip
    if wire:
        rows.append(f"| S3 tars: bytes sent while listing / while building, x the shards' "
                    f"{wire['shard_bytes'] / 1e6:.1f} MB | {wire['listing_x']} / "
                    f"{wire['building_x']} | | | listing + building ~1.0 (each shard once) |")  # fmt: skip
    for k, v in rss.items():
        rows.append(f"| peak RSS, {k} build | parent {v['parent']:.0f} MB, largest worker "
                    f"{v['largest_worker']:.0f} MB | | | |")  # fmt: skip
    if big:
        ok = big["parent_max_rss_mb"] <= 2048 + big["worker_max_rss_mb"]
        hwm = big.get("parent_hwm_mb")
        own = f" (its own image {hwm:.0f} MB)" if hwm is not None else ""
        rows.append(f"| peak RSS, parquet build of {big['shard_gb']} GB ({big['rows']:,} rows, "
                    f"{big['wall_s']} s) | parent {big['parent_max_rss_mb']:.0f} MB{own}, largest "
                    f"worker {big['worker_max_rss_mb']:.0f} MB | | | <= 2 GB + a worker's "
                    f"({'met' if ok else 'not met'}) |")  # fmt: skip
    return "\n".join(rows)


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

        # no ETags: rclone would read the whole shard for its MD5 at every request, a
        # ranged one included (a real store keeps the ETag); that, not the client, was
        # the bound: 250 ranged reads of 40 MB shards are 10 GB hashed
        server = S3Server(args.work / "s3data", buckets=("bench",), etag=False).start()
        env.update(server.env())
        os.environ.update(server.env())
        store = open_store(parse_url("s3://bench/tars"))
        for p in sorted((args.work / "sources_tar").glob("train-*.tar")):
            if store.head(p.name) is None:
                store.put(p, p.name)
        ways["s3_tar"] = "s3://bench/tars/" + Path(tars).name
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in ways}
    wire = None
    try:
        for _ in range(args.repeats):  # interleaved: a drift of the machine hits every way
            for name, src in ways.items():
                r = run_build(src, args.work / f"pack_{name}", cores, env)
                assert r["count"] == args.images and not r["skipped"], (name, r)
                runs[name].append(r)
                print(name, json.dumps(r), flush=True)
        if server is not None:
            wire = count_wire(server, ways["s3_tar"], args.work, cores)
            print("s3_tar bytes", json.dumps(wire), flush=True)
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
                if not os.path.lexists(dst):
                    try:
                        os.link(f, dst)
                    except OSError:  # a file system without hard links
                        os.symlink(f, dst)
                srcs.append(str(dst))
        # 32² rows: the shards' reading and decoding are the job's; its output stays small
        t = time.perf_counter()
        r = run_build(srcs, args.work / "pack_parquet_big", cores, env, side=32)
        wall = time.perf_counter() - t
        assert r["count"] == args.images * copies and not r["skipped"], r
        big = {"shard_gb": round(one * copies / 1e9, 2), "copies": copies, "rows": r["count"],
               "wall_s": round(wall, 1), **r}  # fmt: skip
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
    report["wire"] = wire
    dump(report, "sources.json")
    print(table(med, ratios, report["peak_rss_mb"], wire, big))


if __name__ == "__main__":
    main()
