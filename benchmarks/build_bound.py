"""What bounds ``imgpack build --device cuda`` on a machine (issue 32's "warm GPU build
of 64k 640x480 images >= 4x the CPU ceiling"), every part on the same files, one run:

* the ceiling: N processes (every core) decoding + resizing to 224 with imgpack's CPU
  decode, nothing written (``build.py``'s);
* the GPU decoders' bare batched rate on the same 640x480 files, alone and several at
  once (``decode_lanes.bare``): no build can decode faster than the best of them;
* the disk's (and tmpfs's) rate for the rows the build writes: pwrite + fsync of the
  same bytes (``build.py``'s ``disk_probe``), as images per second;
* the warm GPU build itself, its pack on the disk and on tmpfs (``/dev/shm``);
* ``stages``: a warm GPU build on tmpfs with each stage's calls timed (reads and header
  checks, the decode, the crop + copy to the host, the writes + hashes, the journal),
  as the share of the build's wall time its threads spent there.

    python benchmarks/build_bound.py --device cuda [--images 65536] [--unique 2048]
        [--parts ceiling,bare,write,build,stages]

Prints a table, each rate over the ceiling; writes ``$OUT/bench_build_bound.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_lanes import bare
from decoders import _linked_set

from _out import dump, machine
from build import ceiling, disk_probe, make_set
from packer.build.run import BuildConfig, build
from packer.measure.timing import resolve_device, sync

SIDE = 224


def gpu_build(src: Path, dst: Path, device: torch.device) -> float:
    """img/s of one warm library build, the pack renamed into place at ``dst``."""
    shutil.rmtree(dst, ignore_errors=True)
    os.sync()
    sync(device)
    t0 = time.perf_counter()
    r = build(src, dst, BuildConfig(size=(SIDE, SIDE), device="cuda"))
    rate = r.count / (time.perf_counter() - t0)
    shutil.rmtree(dst, ignore_errors=True)
    return rate


VARIANTS = {
    "default": {},
    "switch 0.5 ms": {"switch": 0.0005},
    "2 readers 2 writers": {"_READERS": 2, "_WRITERS": 2},
    "groups of 1024": {"GROUP_IMAGES": 1024},
}


@contextlib.contextmanager
def variant(name: str) -> Iterator[None]:
    """The GPU build's knobs (``packer.build.gpu``'s constants, the GIL switch interval)
    set as ``VARIANTS[name]`` says, for a probe; restored after."""
    import packer.build.gpu as g

    knobs = dict(VARIANTS[name])
    switch = knobs.pop("switch", None)
    old = {k: getattr(g, k) for k in knobs}
    old_switch = sys.getswitchinterval()
    try:
        for k, v in knobs.items():
            setattr(g, k, v)
        if switch is not None:
            sys.setswitchinterval(switch)
        yield
    finally:
        for k, v in old.items():
            setattr(g, k, v)
        sys.setswitchinterval(old_switch)


def stages(src: Path, dst: Path, device: torch.device) -> dict[str, Any]:
    """One warm GPU build with its stages' calls timed: per stage the summed wall time of
    its calls over the build's wall time (1.0 = one thread busy throughout)."""
    import threading

    import packer.build.gpu as g

    busy: dict[str, float] = {}
    lock = threading.Lock()
    names = {"read_group": "read", "_decode_list": "read wait + decode", "resize_to_host": "crop+copy",
             "write_group": "write+hash"}  # fmt: skip
    orig = {k: getattr(g, k) for k in names}

    def wrap(k: str) -> Any:
        f = orig[k]

        def timed(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return f(*a, **kw)
            finally:
                with lock:
                    busy[names[k]] = busy.get(names[k], 0.0) + time.perf_counter() - t0

        return timed

    make0 = g.make_decoder

    def make(dev: torch.device) -> Any:  # the decoder's own calls, without the read waits
        dec = make0(dev)
        names["decoder.decode"] = "decoder call"
        orig["decoder.decode"] = dec.decode
        dec.decode = wrap("decoder.decode")
        return dec

    for k in list(names):
        setattr(g, k, wrap(k))
    g.make_decoder = make
    try:
        shutil.rmtree(dst, ignore_errors=True)
        sync(device)
        t0 = time.perf_counter()
        r = build(src, dst, BuildConfig(size=(SIDE, SIDE), device="cuda"))
        wall = time.perf_counter() - t0
    finally:
        for k, f in orig.items():
            if "." not in k:
                setattr(g, k, f)
        g.make_decoder = make0
        shutil.rmtree(dst, ignore_errors=True)
    out = {k: round(v / wall, 2) for k, v in busy.items()}
    return {"img_s": round(r.count / wall, 1), "wall_s": round(wall, 2), "busy": out}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=65536)
    ap.add_argument("--unique", type=int, default=2048)
    ap.add_argument("--decode-images", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--work", type=Path, default=Path("/tmp/imgpack-bound"))
    ap.add_argument("--tmpfs", type=Path, default=Path("/dev/shm/imgpack-bound"))
    ap.add_argument("--parts", default="ceiling,bare,write,build")
    ap.add_argument("--variants", default="default", help="stages: " + ",".join(VARIANTS))
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    device = resolve_device(args.device)
    if device.type != "cuda":
        sys.exit("build_bound.py measures the GPU build: run it with --device cuda on a GPU")
    procs = len(os.sched_getaffinity(0))
    res: dict[str, Any] = {"machine": machine(), "procs": procs, "images": args.images}
    unique = args.work / "unique"
    make_set(unique, args.unique, (640, 480), procs)
    big = _linked_set(args.work / "big", unique, args.images)
    files = sorted(str(p) for p in big.rglob("*.jpg"))
    row = 3 * SIDE * SIDE
    ceil = res["ceiling_img_s"] = ceiling(files[:16384], procs, SIDE, args.repeats)
    dump(res, "bench_build_bound.json")
    print(f"  ceiling {ceil:,.0f} img/s", file=sys.stderr, flush=True)
    rows: list[tuple[str, float]] = []
    small = _linked_set(args.work / "small", unique, 1024)
    if "stages" in parts:
        gpu_build(small, args.work / "warmup", device)
        args.tmpfs.mkdir(parents=True, exist_ok=True)
        res["stages"] = {}
        for v in args.variants.split(","):
            with variant(v):
                res["stages"][v] = st = stages(big, args.tmpfs / "pack", device)
            dump(res, "bench_build_bound.json")
            rows.append((f"warm build, tmpfs, {v}, stages timed ({st['busy']})", st["img_s"]))
    if "profile" in parts:  # a 4,096-image warm build under torch.profiler
        from _trace import profile_call

        out = Path(os.environ.get("OUT", "out"))
        out.mkdir(parents=True, exist_ok=True)
        gpu_build(small, args.work / "warmup", device)
        few = _linked_set(args.work / "few", unique, 4096)
        res["profile"] = pr = profile_call(
            "build", lambda: gpu_build(few, args.tmpfs / "pack", device), out
        )
        dump(res, "bench_build_bound.json")
        print(json.dumps(pr, indent=1))
    if parts <= {"ceiling", "stages", "profile"}:
        _table(res, rows, ceil, procs, device)
        return

    datas = [torch.frombuffer(bytearray(Path(f).read_bytes()), dtype=torch.uint8)
             for f in files[: args.decode_images]]  # fmt: skip
    n = len(datas) - len(datas) % args.batch
    batches = [datas[i : i + args.batch] for i in range(0, n, args.batch)]
    hw = torch.tensor([[480, 640]] * args.batch)
    res["bare"] = b = bare(device, batches, hw, args.repeats)
    dump(res, "bench_build_bound.json")
    rows += [(f"bare decode: {k}", r["img_s"]) for k, r in b.items()]

    nbytes = args.images * row
    places = {"disk": args.work}
    free = shutil.disk_usage("/dev/shm").free if Path("/dev/shm").is_dir() else 0
    if free > 2.2 * nbytes:
        args.tmpfs.mkdir(parents=True, exist_ok=True)
        places["tmpfs"] = args.tmpfs
    res["write"] = {}
    for k, folder in places.items():
        p = disk_probe(folder, nbytes, 8 << 20, writeback=True)
        res["write"][k] = p
        rows.append((f"write {nbytes / 1e9:.1f} GB of rows + fsync, {k}", p["GBps"] * 1e9 / row))
        dump(res, "bench_build_bound.json")

    gpu_build(small, args.work / "warmup", device)  # nvjpeg, kernels, threads started
    res["build"] = {}
    for _ in range(2):
        for k, folder in places.items():
            rate = gpu_build(big, folder / "pack", device)
            res["build"].setdefault(k, []).append(round(rate, 1))
            print(f"  warm GPU build, {k}: {rate:,.0f} img/s", file=sys.stderr, flush=True)
            dump(res, "bench_build_bound.json")
    for k, v in res["build"].items():
        rows.append((f"warm build --device cuda, {args.images:,} images, pack on {k} (best of 2)",
                     max(v)))  # fmt: skip
    shutil.rmtree(args.tmpfs, ignore_errors=True)
    _table(res, rows, ceil, procs, device)


def _table(res: dict, rows: list, ceil: float, procs: int, device: torch.device) -> None:
    print(
        f"\nWhat bounds the GPU build: 640x480 JPEGs -> {SIDE}², "
        f"{res['machine'].get('gpu', device)}, {procs} cores, one run"
    )
    print("| what | img/s | / ceiling |\n| --- | --- | --- |")
    print(f"| ceiling: {procs} processes, decode + resize {SIDE} | {ceil:,.0f} | 1.00x |")
    for k, v in rows:
        print(f"| {k} | {v:,.0f} | {v / ceil:.2f}x |")
    res["table"] = [(k, round(v, 1), round(v / ceil, 3)) for k, v in rows]
    dump(res, "bench_build_bound.json")


if __name__ == "__main__":
    main()
