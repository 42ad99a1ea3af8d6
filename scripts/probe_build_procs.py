"""Several GPU decoder processes for ``imgpack build --device cuda`` (issue 18 §2).

The fourth round found the one-process GPU build paced by its decoder thread: nvjpeg's
host work, serial behind torchvision's one decoder per process, shares one GIL and 16
cores with everything else, and ran at half its rate alone. On set b of
``bench_build.py`` (16,000 JPEGs 500x375 -> 256²):

* ``--prototype``: the GPU half of the build alone (read the JPEG bytes, nvjpeg batch
  decode 256 at a time, one crop kernel, pinned copy, pwrite + SHA-256 + writeback,
  final fsync) in K independent spawned processes, each on every K-th group, started
  together after each has warmed up; the clock runs from the common start to the last
  process's fsync. Rows on the disk and in /dev/shm.
* default: whole library builds, two interleaved rounds, packs on the disk and in
  /dev/shm: the build's decoder thread alone (``DECODERS`` 0: the fourth round's
  pipeline), the default (that thread first, then 2 decoder processes once they have
  started), and 2 and 3 decoder processes alone. Each build's progress callback times
  its chunks: the whole wall, the first chunk, and the steady rate after the first 10%
  of the images. Then one default build in a fresh interpreter.

Same run: the 16-process Pillow ceiling and the disk (and tmpfs) alone.

    python scripts/probe_build_procs.py [--images 16000] [--work /tmp/imgpack-gpu/procs]
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import multiprocessing as mp
import os
import queue
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_build import ceiling, clean, disk_probe, lib_build, set_b

from _out import dump

GROUP = 256


def _read(paths: list[str]):
    """The JPEGs' bytes as the build's readers read them (``build_gpu._read_whole``)."""
    import torch

    from packer.build_gpu import _read_whole

    return [torch.from_numpy(_read_whole(p)) for p in paths]


def _child(k: int, procs: int, files: list[str], side: int, rows: str, go, results) -> None:
    """One decoder process: every ``procs``-th group from the ``k``-th, end to end."""
    import torch

    from packer.jpeg import decode_ahead, decode_batch, resize_images

    device = torch.device("cuda")
    row = 3 * side * side
    groups = [(g, files[g * GROUP : (g + 1) * GROUP]) for g in range(len(files) // GROUP)]
    groups += [(len(groups), files[len(groups) * GROUP :])] if len(files) % GROUP else []
    mine = groups[k::procs]
    warm = _read(files[:4])
    resize_images(decode_batch(warm, device, ends_checked=True), (side, side), mode="crop")
    torch.cuda.synchronize()
    stream = torch.cuda.Stream(device)
    free: queue.SimpleQueue = queue.SimpleQueue()
    for _ in range(6):
        free.put(torch.empty((GROUP, row), dtype=torch.uint8, pin_memory=True))
    sfr = ctypes.CDLL(None, use_errno=True).sync_file_range
    fd = os.open(rows, os.O_WRONLY)
    readers = ThreadPoolExecutor(2)
    writers = ThreadPoolExecutor(3)
    busy = {"decode": 0.0, "write": 0.0, "sha": 0.0}

    def dec(fut):
        t = time.perf_counter()
        out = decode_batch(fut.result(), device, ends_checked=True)
        busy["decode"] += time.perf_counter() - t
        return out

    def write(g: int, buf, n: int, ev) -> None:
        try:
            ev.synchronize()
            mv = memoryview(buf[:n].numpy()).cast("B")
            t = time.perf_counter()
            done, off = 0, g * GROUP * row
            while done < len(mv):
                done += os.pwrite(fd, mv[done:], off + done)
            t1 = time.perf_counter()
            hashlib.sha256(mv).digest()
            t2 = time.perf_counter()
            sfr(fd, ctypes.c_int64(off), ctypes.c_int64(len(mv)), 2)
            busy["write"] += t1 - t
            busy["sha"] += t2 - t1
        finally:
            free.put(buf)

    go.wait()
    t0 = time.perf_counter()
    jobs = ((g, (lambda f: lambda: dec(f))(readers.submit(_read, paths))) for g, paths in mine)
    pending = []
    t_first = None
    for g, imgs in decode_ahead(jobs, device, stream, ahead=3):
        with torch.cuda.stream(stream):
            out = resize_images(imgs, (side, side), mode="crop")
            buf = free.get()
            buf[: len(imgs)].view(out.shape).copy_(out, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(stream)
        pending.append(writers.submit(write, g, buf, len(imgs), ev))
        if t_first is None:
            t_first = time.perf_counter()
    for f in pending:
        f.result()
    os.fsync(fd)
    t1 = time.perf_counter()
    os.close(fd)
    n = sum(len(p) for _, p in mine)
    results.put({"k": k, "t0": t0, "t1": t1, "t_first": t_first, "n": n, "busy": busy})


def run_procs(files: list[str], side: int, procs: int, rows: Path) -> dict:
    row = 3 * side * side
    fd = os.open(rows, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.posix_fallocate(fd, 0, len(files) * row)
    os.close(fd)
    os.sync()
    ctx = mp.get_context("spawn")
    go = ctx.Barrier(procs + 1)
    results = ctx.Queue()
    ps = [
        ctx.Process(target=_child, args=(k, procs, files, side, str(rows), go, results))
        for k in range(procs)
    ]
    t = time.perf_counter()
    for p in ps:
        p.start()
    go.wait(timeout=300)
    t_ready = time.perf_counter() - t
    out = [results.get(timeout=300) for _ in ps]
    for p in ps:
        p.join()
    os.unlink(rows)
    os.sync()
    t0 = min(r["t0"] for r in out)
    t1 = max(r["t1"] for r in out)
    n = sum(r["n"] for r in out)
    return {
        "procs": procs,
        "img_per_s": n / (t1 - t0),
        "seconds": t1 - t0,
        "start_s": t_ready,
        "per_proc": [
            {
                "img_per_s": r["n"] / (r["t1"] - r["t0"]),
                "busy": {a: round(b, 3) for a, b in r["busy"].items()},
            }
            for r in out
        ],
    }


def timed_build(
    src: Path, dst: Path, side: int, workers: int, decoders: int, local: bool = True
) -> dict:
    """One library build with ``decoders`` GPU decoder processes (0: the build's decoder
    thread alone; ``local`` False: the processes alone, no thread first), timed chunk
    by chunk through its progress callback."""
    import packer
    import packer.build_gpu as bg
    from packer.build import BuildConfig

    clean(dst)
    bg.DECODERS, bg._LOCAL_FIRST, bg.PROCESSES_FROM = decoders, local, 0  # at any size
    marks: list[tuple[float, int]] = []

    def progress(n: int) -> None:
        marks.append((time.perf_counter(), n))

    t = time.perf_counter()
    r = packer.build_pack(
        str(src), str(dst),
        BuildConfig(size=(side, side), workers=workers, overwrite=True, device="cuda"),
        progress=progress,
    )  # fmt: skip
    wall = time.perf_counter() - t
    clean(dst)
    done, k = 0, -1
    while k + 1 < len(marks) and done < r.count // 10:  # the chunks of the first 10%
        k += 1
        done += marks[k][1]
    steady = (r.count - done) / (marks[-1][0] - marks[k][0]) if k < len(marks) - 1 else 0.0
    return {
        "img_per_s": r.count / wall,
        "wall_s": wall,
        "first_chunk_s": marks[0][0] - t if marks else None,
        "steady_img_per_s": steady,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=16000)
    ap.add_argument("--work", type=Path, default=Path("/tmp/imgpack-gpu/procs"))
    ap.add_argument("--procs", default=None, help="default: 2,3 (builds), 1,2,3,4 (prototype)")
    ap.add_argument("--prototype", action="store_true")
    args = ap.parse_args()
    args.procs = args.procs or ("1,2,3,4" if args.prototype else "2,3")
    cores, side, src, files = set_b(args.work, args.images)
    shm = Path("/dev/shm/imgpack-procs")
    shm.mkdir(parents=True, exist_ok=True)
    res: dict = {"files": len(files), "cores": cores}

    def show(name: str, v) -> None:
        res[name] = v
        print(f"{name}: {v}", flush=True)

    nbytes = len(files) * 3 * side * side
    show("ceiling_16proc", ceiling(files, cores, side))
    show("disk", disk_probe(args.work, nbytes, GROUP * 3 * side * side, True))
    show("tmpfs", disk_probe(shm, nbytes, GROUP * 3 * side * side, True))
    c = res["ceiling_16proc"]
    rows = [
        ("16-process Pillow ceiling", c),
        ("disk alone (pwrite+writeback+fsync)", len(files) * res["disk"]["GBps"] * 1e9 / nbytes),
        ("tmpfs alone", len(files) * res["tmpfs"]["GBps"] * 1e9 / nbytes),
    ]
    counts = [int(v) for v in args.procs.split(",")]
    if args.prototype:
        for rnd in range(2):
            for k in counts:
                show(f"procs{k}_disk_{rnd}", run_procs(files, side, k, args.work / "rows.u8"))
                show(f"procs{k}_shm_{rnd}", run_procs(files, side, k, shm / "rows.u8"))
        for k in counts:
            for where in ("disk", "shm"):
                v = [res[f"procs{k}_{where}_{r}"]["img_per_s"] for r in range(2)]
                rows.append((f"prototype, {k} process(es), rows on {where} (best of 2)", max(v)))
        dump(res, "probe_build_procs.json")
    else:
        timed_build(src, args.work / "pack", side, cores, 0)  # CUDA in this process: off the clock
        variants = {"thread": (0, True), "hybrid2": (2, True)}
        variants.update({f"procs{k}": (k, False) for k in counts if k})
        for rnd in range(2):
            for name, (k, local) in variants.items():
                for where, folder in (("disk", args.work), ("shm", shm)):
                    r = timed_build(src, folder / "pack", side, cores, k, local)
                    show(f"{name}_{where}_{rnd}", r)
        show("fresh_default_disk", lib_build(src, args.work / "pack", side, cores, {}, "cuda"))
        clean(args.work / "pack")
        dump(res, "probe_build_procs.json")
        label = {
            "thread": "decoder thread alone (round 4)",
            "hybrid2": "default: thread, then 2 decoder processes",
        }
        for name in variants:
            for where in ("disk", "shm"):
                runs = [res[f"{name}_{where}_{r}"] for r in range(2)]
                what = label.get(name, f"{name[5:]} decoder processes alone")
                rows.append((f"build, {what}, pack on {where}: whole (best of 2)",
                             max(r["img_per_s"] for r in runs)))  # fmt: skip
                rows.append(("  its steady state (after 10% of images; best of 2)",
                             max(r["steady_img_per_s"] for r in runs)))  # fmt: skip
                rows.append(("  first chunk after (s; best of 2)",
                             -min(r["first_chunk_s"] for r in runs)))  # fmt: skip
        f = res["fresh_default_disk"]
        rows.append(("default build, fresh interpreter, disk (whole)", f["count"] / f["seconds"]))
    print(f"\n| set b, {len(files)} JPEGs -> {side}² | img/s | x ceiling |\n|---|---|---|")
    for name, v in rows:
        if v < 0:
            print(f"| {name} | {-v:.2f} s | |")
        else:
            print(f"| {name} | {v:,.0f} | {v / c:.2f} |")


if __name__ == "__main__":
    main()
