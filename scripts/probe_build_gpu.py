"""Where ``imgpack build --device cuda`` spends its time (issue 18 §2), stage by stage.

On the set ``b`` of ``scripts/bench_build.py`` (16,000 JPEGs 500x375 -> 256²), in one
process, CUDA and the kernels warmed off the clock:

* each stage alone, as fast as it goes: the readers' read + classify (``_read_group``,
  4 threads; until round 8 this was the CPU workers' ``_read_for_gpu``, 16 processes,
  with Pillow and SHA-256), the batched nvjpeg decode, decode + crop + pinned
  copy (``decode_ahead`` + ``resize_images``), the writers (pwrite + SHA-256 +
  writeback of 256-image groups, 4 threads, final fsync), the disk alone;
* the whole build (library call, warm process), with timers wrapped around its stages:
  the main thread's waits (decode), its own work, the decoder thread's and the
  writers' busy time, and the rate after the first 10% of the groups (steady state);
* the 16-process Pillow ceiling of ``bench_build.py`` and the CPU build, same run.

    python scripts/probe_build_gpu.py [--images 16000] [--work /tmp/imgpack-gpu/build]
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import functools
import hashlib
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_build import ceiling, clean, disk_probe, lib_build, set_b

from _out import dump

GROUP = 256


class Clock:
    """Seconds per stage name, summed over threads, with a lock."""

    def __init__(self) -> None:
        self.s: dict[str, float] = collections.defaultdict(float)
        self.n: dict[str, int] = collections.defaultdict(int)
        self.marks: list[float] = []
        self.lock = threading.Lock()

    def add(self, name: str, dt: float) -> None:
        with self.lock:
            self.s[name] += dt
            self.n[name] += 1

    def wrap(self, name: str, fn):
        @functools.wraps(fn)
        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.add(name, time.perf_counter() - t)

        return timed


def stage_read(files: list[str], spec, threads: int = 4) -> float:
    """The decoder's readers alone: each file read once and classified from its bytes
    (``packer.build_gpu._read_group``), groups of 256 on ``threads`` threads."""
    from packer.build_gpu import _read_group

    groups = [files[i : i + GROUP] for i in range(0, len(files), GROUP)]
    with ThreadPoolExecutor(threads) as pool:
        t = time.perf_counter()
        reads = list(pool.map(lambda g: _read_group(g, spec.max_pixels, None), groups))
        dt = time.perf_counter() - t
    assert not any(r.cpu for r in reads), "a file of the set was not for the GPU"
    return len(files) / dt


def stage_decode(datas: list, device) -> float:
    import torch

    from packer.jpeg import decode_batch

    groups = [datas[i : i + GROUP] for i in range(0, len(datas), GROUP)]
    decode_batch(groups[0], device, ends_checked=True)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for g in groups:
        decode_batch(g, device, ends_checked=True)
    torch.cuda.synchronize()
    return len(datas) / (time.perf_counter() - t)


def stage_gpu(datas: list, device, side: int, pinned: bool = True) -> float:
    """decode_ahead + resize_images + copy into two pinned host buffers in turn, each
    group's copy waited for before the next group's."""
    import torch

    from packer.jpeg import decode_ahead, decode_batch, resize_images

    stream = torch.cuda.Stream(device)
    groups = [datas[i : i + GROUP] for i in range(0, len(datas), GROUP)]
    resize_images(decode_batch(groups[0], device), (side, side), mode="crop")  # compiled
    torch.cuda.synchronize()
    jobs = ((None, functools.partial(decode_batch, g, device, ends_checked=True)) for g in groups)
    bufs = [torch.empty((GROUP, 3, side, side), dtype=torch.uint8, pin_memory=pinned)] * 2
    bufs[1] = torch.empty_like(bufs[0], pin_memory=pinned)
    t = time.perf_counter()
    prev = None
    for g, (_, imgs) in enumerate(decode_ahead(jobs, device, stream)):
        with torch.cuda.stream(stream):
            rows = resize_images(imgs, (side, side), mode="crop")
            host = bufs[g % 2][: len(rows)]
            host.copy_(rows, non_blocking=pinned)
            ev = torch.cuda.Event()
            ev.record(stream)
        if prev is not None:
            prev.synchronize()
        prev = ev
    prev.synchronize()
    return len(datas) / (time.perf_counter() - t)


def stage_write(folder: Path, n: int, side: int, writers: int = 4) -> dict:
    """``n`` rows of 3·side² bytes in groups of 256, from one pinned buffer: pwrite +
    SHA-256 + sync_file_range per group on ``writers`` threads, then one fsync."""
    import torch

    row = 3 * side * side
    host = torch.randint(0, 255, (GROUP, row), dtype=torch.uint8).pin_memory()
    mv = memoryview(host.numpy()).cast("B")
    sfr = ctypes.CDLL(None, use_errno=True).sync_file_range
    path = folder / ".imgpack-probe-rows"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.posix_fallocate(fd, 0, n * row)
    busy = {"pwrite": 0.0, "sha": 0.0, "sfr": 0.0}
    lock = threading.Lock()

    def one(g: int) -> None:
        k = min(GROUP, n - g * GROUP)
        t0 = time.perf_counter()
        off, done = g * GROUP * row, 0
        while done < k * row:
            done += os.pwrite(fd, mv[done : k * row], off + done)
        t1 = time.perf_counter()
        hashlib.sha256(mv[: k * row]).digest()
        t2 = time.perf_counter()
        sfr(fd, ctypes.c_int64(off), ctypes.c_int64(k * row), 2)
        t3 = time.perf_counter()
        with lock:
            busy["pwrite"] += t1 - t0
            busy["sha"] += t2 - t1
            busy["sfr"] += t3 - t2

    try:
        t = time.perf_counter()
        with ThreadPoolExecutor(writers) as ex:
            list(ex.map(one, range(-(-n // GROUP))))
        t_w = time.perf_counter()
        os.fsync(fd)
        t_end = time.perf_counter()
    finally:
        os.close(fd)
        os.unlink(path)
        os.sync()
    return {
        "img_per_s": n / (t_end - t),
        "write_s": t_w - t,
        "fsync_s": t_end - t_w,
        "busy_s": {k: round(v, 3) for k, v in busy.items()},
    }


STARTUP = """
import json, sys, time
t = [time.perf_counter()]
def mark(): t.append(time.perf_counter())
import torch; mark()
torch.cuda.is_available(); mark()
torch.zeros(1, device="cuda"); torch.cuda.synchronize(); mark()
from torchvision.io import decode_jpeg, encode_jpeg; mark()
data = encode_jpeg(torch.zeros((3, 384, 384), dtype=torch.uint8))
imgs = decode_jpeg([data, data], device="cuda"); torch.cuda.synchronize(); mark()
from packer.transforms import _triton; _triton(); mark()
from packer.jpeg import resize_images
resize_images(imgs, (256, 256), mode="crop"); torch.cuda.synchronize(); mark()
names = ["import torch", "cuda.is_available", "CUDA context", "import torchvision.io",
         "first nvjpeg decode", "import triton + kernels", "first crop kernel"]
print("STARTUP " + json.dumps({n: round(b - a, 3) for n, a, b in zip(names, t, t[1:])}))
"""


def startup() -> dict:
    """Seconds of each start-up step of a GPU build, in a fresh interpreter."""
    import subprocess

    p = subprocess.run(
        [sys.executable, "-c", STARTUP], capture_output=True, text=True, cwd="/", check=True
    )
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("STARTUP ")][-1]
    return json.loads(line[8:])


def instrumented_build(src: Path, dst: Path, side: int, workers: int) -> dict:
    """One warm-process GPU build with timers around its stages."""
    import packer
    import packer.build_gpu as bg
    import packer.jpeg as pj
    from packer.build import BuildConfig

    clock = Clock()
    saved = {
        (bg, "_decode_list"): bg._decode_list,
        (bg, "_read_group"): bg._read_group,
        (bg, "_write_group"): bg._write_group,
        (bg, "digest"): bg.digest,
        (bg, "decode_chunks_batched"): bg.decode_chunks_batched,
        (pj, "decode_ahead"): pj.decode_ahead,
        (pj, "resize_images"): pj.resize_images,
    }

    def decode_ahead(*a, **k):
        it = saved[(pj, "decode_ahead")](*a, **k)
        try:
            while True:
                t = time.perf_counter()
                try:
                    item = next(it)
                finally:
                    clock.add("main: next decoded (reads incl.)", time.perf_counter() - t)
                yield item
        except StopIteration:
            return
        finally:
            it.close()

    def write_group(*a, **k):
        out = clock.wrap("writers: busy", saved[(bg, "_write_group")])(*a, **k)
        clock.marks.append(time.perf_counter())
        return out

    bg._decode_list = clock.wrap("decoder: busy", saved[(bg, "_decode_list")])
    bg._write_group = write_group
    bg._read_group = clock.wrap("readers: busy", saved[(bg, "_read_group")])
    bg.digest = clock.wrap("writers: sha256", saved[(bg, "digest")])
    bg.decode_chunks_batched = clock.wrap("main: total", saved[(bg, "decode_chunks_batched")])
    pj.decode_ahead = decode_ahead
    pj.resize_images = clock.wrap("main: resize launch", saved[(pj, "resize_images")])
    try:
        clean(dst)
        t = time.perf_counter()
        r = packer.build_pack(
            str(src), str(dst),
            BuildConfig(size=(side, side), workers=workers, overwrite=True, device="cuda"),
        )  # fmt: skip
        wall = time.perf_counter() - t
    finally:
        for (mod, name), fn in saved.items():
            setattr(mod, name, fn)
    marks = sorted(clock.marks)
    k = max(1, len(marks) // 10)
    steady = (len(marks) - k) * GROUP / (marks[-1] - marks[k - 1]) if len(marks) > k else 0.0
    s = dict(clock.s)
    s["main: own work"] = (
        s.get("main: total", 0.0)
        - s.get("main: next decoded (reads incl.)", 0.0)
        - s.get("main: resize launch", 0.0)
    )
    s["journal thread: busy"] = r.extra["parent"].get("journal", 0.0)
    return {
        "count": r.count,
        "wall_s": wall,
        "img_per_s": r.count / wall,
        "steady_img_per_s": steady,
        "stages_s": {k: round(v, 3) for k, v in sorted(s.items())},
        "calls": dict(clock.n),
        "extra": r.extra,
    }


def plain_build(
    src: Path, dst: Path, side: int, workers: int, device: str, writers: int = 0
) -> float:
    import packer
    import packer.build_gpu as bg
    from packer.build import BuildConfig

    clean(dst)
    if writers:
        bg._WRITERS = writers
    t = time.perf_counter()
    r = packer.build_pack(
        str(src), str(dst),
        BuildConfig(size=(side, side), workers=workers, overwrite=True, device=device),
    )  # fmt: skip
    return r.count / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=16000)
    ap.add_argument("--work", type=Path, default=Path("/tmp/imgpack-gpu/build"))
    ap.add_argument("--quick", action="store_true", help="no start-up probe, no fresh builds")
    args = ap.parse_args()
    import torch

    from packer.decode import ResizeSpec

    cores, side, src, files = set_b(args.work, args.images)
    spec = ResizeSpec(side, side, "crop", 100_000_000)
    device = torch.device("cuda")
    datas = [torch.frombuffer(bytearray(Path(f).read_bytes()), dtype=torch.uint8) for f in files]
    res: dict = {"files": len(files), "cores": cores, "gpu": torch.cuda.get_device_name()}

    def show(name: str, v) -> None:
        res[name] = v
        print(f"{name}: {v}", flush=True)

    if not args.quick:
        show("startup_fresh_0", startup())
        show("startup_fresh_1", startup())
    show("ceiling_16proc", ceiling(files, cores, side))
    show("read_classify_4threads", stage_read(files, spec))
    show("decode_only", stage_decode(datas, device))
    show("decode_crop_pinned", stage_gpu(datas, device, side))
    show("write_4threads", stage_write(args.work, len(files), side))
    show("disk", disk_probe(args.work, len(files) * 3 * side * side, GROUP * 3 * side * side, True))
    dst = args.work / "pack_probe"
    show("build_cpu", plain_build(src, dst, side, cores, "cpu"))
    show("build_gpu_warm", plain_build(src, dst, side, cores, "cuda"))
    show("build_gpu_instrumented", instrumented_build(src, dst, side, cores))
    show("build_gpu_warm_2", plain_build(src, dst, side, cores, "cuda"))
    show("build_gpu_warm_6writers", plain_build(src, dst, side, cores, "cuda", writers=6))
    plain_build(src, dst, side, cores, "cuda", writers=4)
    fresh = [] if args.quick else [("GPU", 0, "cuda"), ("GPU", 1, "cuda"), ("CPU", 0, "cpu")]
    for what, k, dev in fresh:  # fresh interpreters: CUDA, nvjpeg and kernels on the clock
        clean(dst)
        show(f"build_{what.lower()}_fresh_{k}", lib_build(src, dst, side, cores, {}, dev))
    clean(dst)
    dump(res, "probe_build_gpu.json")
    c = res["ceiling_16proc"]
    ib = res["build_gpu_instrumented"]
    print(f"\n| stage (set b, {len(files)} imgs) | img/s | x ceiling |\n|---|---|---|")
    for name, v in [
        ("16-proc Pillow ceiling", c),
        ("read+classify, 4 reader threads", res["read_classify_4threads"]),
        ("nvjpeg decode only", res["decode_only"]),
        ("decode+crop+pinned copy", res["decode_crop_pinned"]),
        ("write: pwrite+sha+writeback, 4 thr, fsync", res["write_4threads"]["img_per_s"]),
        ("disk alone (pwrite+writeback+fsync)", len(files) / (res["disk"]["write_s"] + res["disk"]["fsync_s"])),
        ("CPU build (warm process)", res["build_cpu"]),
        ("GPU build (warm process)", res["build_gpu_warm"]),
        ("GPU build, 2nd", res["build_gpu_warm_2"]),
        ("GPU build, 6 writers", res["build_gpu_warm_6writers"]),
        ("GPU build instrumented", ib["img_per_s"]),
        ("  its steady state (after 10% of groups)", ib["steady_img_per_s"]),
        *[
            (f"{what} build, fresh interpreter {k}", r["count"] / r["seconds"])
            for what, k, _ in fresh
            for r in [res[f"build_{what.lower()}_fresh_{k}"]]
        ],
    ]:  # fmt: skip
        print(f"| {name} | {v:,.0f} | {v / c:.2f} |")
    for k in range(2 if fresh else 0):
        e = res[f"build_gpu_fresh_{k}"]["extra"]
        print(f"fresh GPU build {k}: setup {e['setup_s']} s, first chunk {e['first_chunk_s']} s, "
              f"decode {e['decode_s']} s, finalize {e['finalize_s']} s")  # fmt: skip
    print("instrumented stages (s):", ib["stages_s"])
    print("parent:", ib["extra"]["parent"])


if __name__ == "__main__":
    main()
