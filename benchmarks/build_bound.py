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

    python -m benchmarks.build_bound --device cuda [--images 65536] [--unique 2048]
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

from packer.builder.api import BuildConfig, build
from packer.builder.config import GpuTuning
from packer.measure.timing import resolve_device, sync

from ._common import dump, machine
from .build import ceiling, disk_probe, make_set
from .decode_lanes import bare
from .decoders import _linked_set

SIDE = 224


def gpu_build(src: Path, dst: Path, device: torch.device) -> float:
    """img/s of one warm library build, the pack renamed into place at ``dst``."""
    shutil.rmtree(dst, ignore_errors=True)
    os.sync()
    sync(device)
    t0 = time.perf_counter()
    r = build(src, dst, BuildConfig(size=(SIDE, SIDE), device="cuda", _gpu=TUNING[0]))
    rate = r.count / (time.perf_counter() - t0)
    shutil.rmtree(dst, ignore_errors=True)
    return rate


TUNING = [GpuTuning()]  # the knobs of the probe running now (variant sets them)

VARIANTS = {
    "default": {},
    "switch 0.5 ms": {"switch": 0.0005},
    "2 readers 2 writers": {"readers": 2, "writers": 2},  # GpuTuning's fields
    "groups of 1024": {"group_images": 1024},
    "16 in flight 6 ahead": {"in_flight": 16, "decode_ahead": 6},
    "eager pool": {"eager": True},  # the CPU workers started with the build, as before
    # ablations: a stage taken out of the build, to see which one holds its decoder back
    "cached reads": {"ablate": ("reads",)},
    "no checks": {"ablate": ("checks",)},
    "checks twice": {"ablate": ("twice",)},  # the decoder walks the readers' headers again
    "no crop": {"ablate": ("crop",)},
    "no writes": {"ablate": ("writes",)},
    "decode only": {"ablate": ("reads", "checks", "crop", "writes")},
}


def _ablate(g: Any, what: tuple[str, ...], src: Path) -> dict[str, Any]:
    """``packer.builder.gpu``'s stages named in ``what`` replaced by stand-ins that do no
    work of theirs (the pack they leave is not a valid one: a probe's, deleted after):

    * ``reads``: each file's bytes and size from memory (the source tree is hard links
      to a few unique files: keyed by inode), no file read and no header parse;
    * ``checks``: the decoder's own batched decode without the interface's header and
      shape checks;
    * ``crop``: no crop kernel and no copy to the host: zero rows from the reused buffers;
    * ``writes``: no pwrite and no hash (each chunk's result made up).

    Returns the replaced attributes, to put back."""
    from packer.builder.gpu_read import GroupRead
    from packer.imaging.jpeg_header import plain_jpeg_size

    old: dict[str, Any] = {}
    if "reads" in what:
        by_inode: dict[int, tuple[torch.Tensor, tuple[int, int]]] = {}
        where: dict[str, int] = {}
        for f in src.rglob("*.jpg"):
            ino = f.stat().st_ino
            where[str(f)] = ino
            if ino not in by_inode:
                b = f.read_bytes()
                size = plain_jpeg_size(memoryview(b), 1 << 40)
                assert size is not None, f
                by_inode[ino] = (torch.frombuffer(bytearray(b), dtype=torch.uint8), size)

        def read_group(paths: list[str], max_pixels: int, cpu_decode: Any) -> GroupRead:
            got = [by_inode[where[p]] for p in paths]
            return GroupRead(list(range(len(paths))), [d for d, _ in got],
                             [s for _, s in got], [], list)  # fmt: skip

        old["read_group"] = g.read_group
        g.read_group = read_group
    if "checks" in what:
        make0 = g.make_decoder

        def make(dev: torch.device) -> Any:
            dec = make0(dev)
            dec.decode = lambda datas, sizes=None, prechecked=False: dec._decode(
                list(datas), list(range(len(datas)))
            )
            return dec

        old["make_decoder"] = make0
        g.make_decoder = make
    if "twice" in what:
        make1 = g.make_decoder

        def make_twice(dev: torch.device) -> Any:
            dec = make1(dev)
            whole = dec.decode
            dec.decode = lambda datas, sizes=None, prechecked=False: whole(datas, sizes=sizes)
            return dec

        old["make_decoder"] = make1
        g.make_decoder = make_twice
    if "crop" in what:

        def resize_to_host(imgs: list, spec: Any, stream: Any, host_rows: Any) -> tuple:
            n = sum(x is not None for x in imgs)
            buf = host_rows.take(n)
            return buf[:n], None, buf

        old["resize_to_host"] = g.resize_to_host
        g.resize_to_host = resize_to_host
    if "writes" in what:

        def write_group(fd, row, group, at, sizes, host, copied, cpu, writeback, release):
            try:
                if copied is not None:
                    copied.synchronize()
                out, k = [], 0
                for chunk, _start, cpaths in group:
                    wh = [list(sizes[k + j]) for j in range(len(cpaths))]
                    out.append((chunk, [], wh, "0" * 64, None))
                    k += len(cpaths)
                return out
            finally:
                release()

        old["write_group"] = g.write_group
        g.write_group = write_group
    return old


@contextlib.contextmanager
def variant(name: str, src: Path) -> Iterator[None]:
    """The GPU build's knobs (``BuildConfig._gpu``'s fields, the GIL switch interval,
    stages taken out: :func:`_ablate`, for a build of ``src``) set as ``VARIANTS[name]``
    says, for a probe; restored after."""
    import packer.builder.gpu as g
    import packer.builder.run as run

    knobs = dict(VARIANTS[name])
    switch = knobs.pop("switch", None)
    ablate = knobs.pop("ablate", ())
    eager = knobs.pop("eager", False)
    old: dict[str, Any] = {}
    old_switch = sys.getswitchinterval()
    lazy = run.LazyPool
    try:
        if eager:
            run.LazyPool = lambda start: start()
        TUNING[0] = GpuTuning(**knobs)  # gpu_build's builds take it
        if switch is not None:
            sys.setswitchinterval(switch)
        if ablate:
            old.update(_ablate(g, ablate, src))
        yield
    finally:
        for k, v in old.items():
            setattr(g, k, v)
        sys.setswitchinterval(old_switch)
        run.LazyPool = lazy
        TUNING[0] = GpuTuning()


def stages(src: Path, dst: Path, device: torch.device) -> dict[str, Any]:
    """One warm GPU build with its stages' calls timed: per stage the summed wall time of
    its calls over the build's wall time (1.0 = one thread busy throughout), the build's
    own phase split (``BuildResult.extra``), and a timeline of the calls (``events``:
    stage, thread, start, end in seconds from the build's start) with the share of the
    decode window (``decode_chunks_batched``) the decoder thread spent in its decoder."""
    import threading

    import packer.builder.gpu as g
    import packer.imaging.jpeg as jpeg

    busy: dict[str, float] = {}
    events: list[tuple[str, str, float, float]] = []
    lock = threading.Lock()
    names = {"read_group": "read", "_decode_list": "read wait + decode", "resize_to_host": "crop+copy",
             "write_group": "write+hash", "decode_chunks_batched": "window"}  # fmt: skip
    orig = {k: getattr(g, k) for k in names}

    def note(name: str, t0: float) -> None:
        t1 = time.perf_counter()
        with lock:
            busy[name] = busy.get(name, 0.0) + t1 - t0
            events.append((name, threading.current_thread().name, t0, t1))

    def wrap(k: str) -> Any:
        f = orig[k]

        def timed(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return f(*a, **kw)
            finally:
                note(names[k], t0)

        return timed

    make0 = g.make_decoder

    def make(dev: torch.device) -> Any:  # the decoder's own calls, without the read waits
        dec = make0(dev)
        names["decoder.decode"] = "decoder call"
        orig["decoder.decode"] = dec.decode
        dec.decode = wrap("decoder.decode")
        return dec

    ahead0, take0 = jpeg.decode_ahead, g.HostRows.take

    def ahead(*a: Any, **kw: Any) -> Any:  # the pipeline's waits for decoded groups
        it = ahead0(*a, **kw)
        try:
            while True:
                t0 = time.perf_counter()
                try:
                    item = next(it)
                except StopIteration:
                    return
                finally:
                    note("wait for decode", t0)
                yield item
        finally:
            it.close()

    def take(self: Any, n: int) -> Any:  # its waits for a free pinned buffer
        t0 = time.perf_counter()
        try:
            return take0(self, n)
        finally:
            note("host buffer", t0)

    lags: list[float] = []
    probing = threading.Event()

    def probe() -> None:  # how late a thread gets the GIL back after a 1 ms sleep
        while not probing.is_set():
            t = time.perf_counter()
            time.sleep(0.001)
            lags.append(time.perf_counter() - t - 0.001)

    for k in list(names):
        setattr(g, k, wrap(k))
    g.make_decoder, jpeg.decode_ahead, g.HostRows.take = make, ahead, take
    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    try:
        shutil.rmtree(dst, ignore_errors=True)
        sync(device)
        t0 = time.perf_counter()
        r = build(src, dst, BuildConfig(size=(SIDE, SIDE), device="cuda", _gpu=TUNING[0]))
        wall = time.perf_counter() - t0
    finally:
        for k, f in orig.items():
            if "." not in k:
                setattr(g, k, f)
        g.make_decoder, jpeg.decode_ahead, g.HostRows.take = make0, ahead0, take0
        probing.set()
        prober.join()
        shutil.rmtree(dst, ignore_errors=True)
    out = {k: round(v / wall, 2) for k, v in busy.items()}
    win = [e for e in events if e[0] == "window"]
    share = None
    if win:
        w0, w1 = win[0][2], win[0][3]
        dec = sum(min(b, w1) - max(a, w0) for n, _, a, b in events if n == "decoder call")
        share = round(dec / (w1 - w0), 3)
    return {
        "img_s": round(r.count / wall, 1),
        "wall_s": round(wall, 2),
        "busy": out,
        "decoder_share_of_window": share,
        "gil_lag_ms": {  # the probe's wake-up lag beyond its 1 ms sleep: GIL (and CPU) waits
            "median": round(1e3 * sorted(lags)[len(lags) // 2], 3) if lags else None,
            "p90": round(1e3 * sorted(lags)[9 * len(lags) // 10], 3) if lags else None,
        },
        "phases": r.extra,
        "events": [(n, th, round(a - t0, 5), round(b - t0, 5)) for n, th, a, b in events],
    }


def same_pixels(files: list[str], device: torch.device, batch: int) -> dict[str, Any]:
    """Each GPU decoder's output on ``files`` against torchcodec's, batch by batch: the
    images that differ at all, and the largest difference."""
    from packer.errors import UsageError
    from packer.imaging.decoders import get_decoder

    datas = [torch.frombuffer(bytearray(Path(f).read_bytes()), dtype=torch.uint8) for f in files]
    ref = get_decoder(device, prefer="torchcodec")
    out: dict[str, Any] = {}
    for name in ("torchvision", "nvimgcodec"):
        try:
            dec = get_decoder(device, prefer=name)
        except UsageError as e:
            out[name] = f"not run ({str(e)[:80]})"
            continue
        differ, worst = 0, 0
        for i in range(0, len(datas), batch):
            a = ref.decode(datas[i : i + batch])
            b = dec.decode(datas[i : i + batch])
            for x, y in zip(a, b):
                d = int((x.int() - y.int()).abs().max())
                differ += d > 0
                worst = max(worst, d)
        out[name] = {"images": len(datas), "differ": differ, "max_abs": worst}
    return out


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
    ap.add_argument("--bare", default=None, help="bare: only these decoders/sets, comma-separated")
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
            with variant(v, big):
                res["stages"][v] = st = stages(big, args.tmpfs / "pack", device)
            dump(res, "bench_build_bound.json")
            busy = {k: v for k, v in st["busy"].items() if k != "window"}
            rows.append((f"warm build, tmpfs, {v}: window {st['busy'].get('window')}, decoder "
                         f"{st['decoder_share_of_window']} of it, GIL lag {st['gil_lag_ms']}, "
                         f"busy {busy}", st["img_s"]))  # fmt: skip
    if "profile" in parts:  # a 4,096-image warm build under torch.profiler
        from ._common import profile_call

        out = Path(os.environ.get("OUT", "out"))
        out.mkdir(parents=True, exist_ok=True)
        gpu_build(small, args.work / "warmup", device)
        few = _linked_set(args.work / "few", unique, 4096)
        res["profile"] = pr = profile_call(
            "build", lambda: gpu_build(few, args.tmpfs / "pack", device), out
        )
        dump(res, "bench_build_bound.json")
        print(json.dumps(pr, indent=1))
    if "same" in parts:  # do the nvjpeg decoders give the same bytes (may lanes mix)?
        res["same"] = same_pixels(files[: args.decode_images], device, args.batch)
        photos = sorted(str(f) for f in Path("sample_data").rglob("*.jpg"))
        if photos:  # photographs too (odd sizes, other subsamplings)
            res["same_photos"] = same_pixels(photos, device, args.batch)
            print(f"  same pixels, sample_data: {res['same_photos']}", file=sys.stderr)
        dump(res, "bench_build_bound.json")
        print(f"  same pixels: {res['same']}", file=sys.stderr, flush=True)
    if "bare" in parts:
        datas = [torch.frombuffer(bytearray(Path(f).read_bytes()), dtype=torch.uint8)
                 for f in files[: args.decode_images]]  # fmt: skip
        n = len(datas) - len(datas) % args.batch
        batches = [datas[i : i + args.batch] for i in range(0, n, args.batch)]
        hw = torch.tensor([[480, 640]] * args.batch)
        only = None if args.bare is None else set(args.bare.split(","))
        res["bare"] = b = bare(device, batches, hw, args.repeats, only)
        dump(res, "bench_build_bound.json")
        rows += [(f"bare decode: {k}", r["img_s"]) for k, r in b.items()]
    if not parts & {"write", "build"}:
        _table(res, rows, ceil, procs, device)
        return

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
