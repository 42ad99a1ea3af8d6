"""Several JPEG decoders at once on one GPU: which run side by side, and the JPEG-pack
loader with a batch per decoder (``PackLoader(decode=[...])``), in one run.

Same bytes as ``benchmarks/decoders.py`` (``make_jpeg_tree``'s ~500x375 q90 files),
batch 256. Parts (``--parts``):

* ``bare``: each decoder alone, then sets of them at once: one thread per decoder, each
  with its own CUDA stream, taking the next whole batch as it comes free. img/s over the set, median of interleaved
  rounds; each set's rate over its best member alone.
* ``loader``: ``PackLoader(jpeg_pack, 256, image_size=224)`` (RRC + flip) with the
  default decoder and with lanes (``decoders.loader_ways``), vs the best bare decoder
  above; where each lane's time went (decode busy per lane, the batched crop).
* ``train``: ResNet-50 bf16 channels_last fed by those loaders vs resident batches.
* ``blocking``: whether a decoder waits for the default stream's queued work.
* ``interfere``: what costs ResNet-50 time beside the loader (:func:`interference`).

    python -m benchmarks.decode_lanes --device cuda [--images 4096] [--repeats 3]

Prints tables, a summary last; writes ``$OUT/bench_decode_lanes.json``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

import packer
from packer.builder.api import BuildConfig, build
from packer.errors import UsageError
from packer.imaging.decoders import DecoderBase, get_decoder
from packer.measure.timing import resolve_device, sync

from ._common import dump, machine
from .build import make_set
from .decoders import lane_ways, loader_rates, loader_ways, train_rates

SINGLE = {
    "torchcodec": ("torchcodec", {}),
    "torchvision": ("torchvision", {}),
    "nvimgcodec(hw+hybrid)": ("nvimgcodec", {"backends": "hw+hybrid"}),
    "nvimgcodec(hw)": ("nvimgcodec", {"backends": "hw"}),
    "nvimgcodec(hybrid)": ("nvimgcodec", {"backends": "hybrid"}),
}
SETS = [
    ("torchcodec", "torchcodec"),
    ("torchcodec", "torchvision"),
    ("torchcodec", "nvimgcodec(hybrid)"),
    ("torchcodec", "nvimgcodec(hw)"),
    ("torchcodec", "nvimgcodec(hw+hybrid)"),
    ("nvimgcodec(hw)", "nvimgcodec(hybrid)"),
    ("nvimgcodec(hw+hybrid)", "nvimgcodec(hw+hybrid)"),
    ("torchcodec", "nvimgcodec(hw)", "nvimgcodec(hybrid)"),
]


def together(decs: list[DecoderBase], batches: list[list[torch.Tensor]], hw: torch.Tensor) -> int:
    """Every batch decoded once by whichever of ``decs`` is free (a thread and a CUDA
    stream each); returns the images decoded."""
    nxt = iter(range(len(batches)))
    lock = threading.Lock()
    dev = decs[0].device

    def lane(dec: DecoderBase) -> int:
        done = 0
        stream = torch.cuda.Stream(dev)
        with torch.cuda.device(dev), torch.cuda.stream(stream):
            while True:
                with lock:
                    k = next(nxt, None)
                if k is None:
                    break
                done += len(dec.decode(batches[k], sizes=hw))
            stream.synchronize()
        return done

    with ThreadPoolExecutor(len(decs)) as pool:
        return sum(pool.map(lane, decs))


def bare(
    device: torch.device,
    batches: list,
    hw: torch.Tensor,
    repeats: int,
    only: set[str] | None = None,
) -> dict[str, Any]:
    """Each decoder's and set's batched rate on ``batches`` (median of ``repeats``);
    ``only``: just these labels (e.g. ``torchcodec``, ``torchcodec + torchvision``)."""
    made: dict[str, list[DecoderBase]] = {}

    def get(label: str, k: int) -> DecoderBase:
        have = made.setdefault(label, [])
        while len(have) <= k:
            name, kw = SINGLE[label]
            have.append(get_decoder(device, prefer=name, **kw))
        return have[k]

    work: dict[str, list[DecoderBase]] = {}
    for label in SINGLE:
        try:
            work[label] = [get(label, 0)]
        except UsageError as e:
            print(f"  {label}: not run ({e})", file=sys.stderr)
    for s in SETS:
        if all(x in work for x in s):
            work[" + ".join(s)] = [get(x, s[:i].count(x)) for i, x in enumerate(s)]
    if only is not None:
        work = {k: v for k, v in work.items() if k in only}
    for decs in work.values():  # warm-up off the clock: handles, pools
        together(decs, batches[:2], hw)
    rates: dict[str, list[float]] = {k: [] for k in work}
    for r in range(repeats):
        for k, decs in work.items():
            sync(device)
            t0 = time.perf_counter()
            n = together(decs, batches, hw)
            sync(device)
            rates[k].append(n / (time.perf_counter() - t0))
        print(f"  bare round {r + 1}/{repeats} done", file=sys.stderr, flush=True)
    out = {k: {"img_s": round(statistics.median(v), 1), "all": [round(x) for x in v]}
           for k, v in rates.items()}  # fmt: skip
    for k in work:
        parts = k.split(" + ")
        best = max(out[p]["img_s"] for p in parts)
        out[k]["over_best_member"] = round(out[k]["img_s"] / best, 3)
    return out


def stages(pack: Path, device: torch.device, batch: int, way: Any) -> dict[str, Any]:
    """One epoch of the loader (the pack 4 times) with each lane's decode time and the
    batched crop's time summed (host wall time of the calls)."""
    from packer.imaging import jpeg
    from packer.loading import jpeg_pass

    busy: dict[str, float] = {}
    crop = [0.0]
    run0, resize0 = jpeg_pass.Decoding.run, jpeg.resize_images

    def run(self: Any, dec: Any, *a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return run0(self, dec, *a, **k)
        finally:
            name = threading.current_thread().name
            busy[name] = busy.get(name, 0.0) + time.perf_counter() - t0

    def resize(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return resize0(*a, **k)
        finally:
            crop[0] += time.perf_counter() - t0

    n = len(packer.load(pack))
    decode = way() if callable(way) else way
    ld = packer.PackLoader(pack, batch, device=device, image_size=224, decode=decode,
                           indices=torch.arange(n).repeat(4), drop_last=True)  # fmt: skip
    for i, _ in enumerate(ld):  # warm-up
        if i == 4:
            break
    jpeg_pass.Decoding.run, jpeg.resize_images = run, resize  # type: ignore[method-assign]
    try:
        ld.set_epoch(1)
        sync(device)
        t0 = time.perf_counter()
        got = sum(len(x) for x, _ in ld)
        sync(device)
        wall = time.perf_counter() - t0
    finally:
        jpeg_pass.Decoding.run, jpeg.resize_images = run0, resize0  # type: ignore[method-assign]
        ld.close()
    return {"img_s": round(got / wall, 1), "wall_s": round(wall, 3),
            "decode_busy": {k: round(v / wall, 3) for k, v in busy.items()},
            "crop_busy": round(crop[0] / wall, 3)}  # fmt: skip


def interference(
    pack: Path, device: torch.device, batch: int, iters: int, repeats: int, batches: list,
    hw: torch.Tensor,
) -> dict[str, Any]:  # fmt: skip
    """Where ResNet-50 loses time beside a JPEG-pack loader: its step on resident batches
    alone, beside background work paced at one batch per step (the loader's host Python
    alone: reads and header checks; torchcodec's batched decode alone; a whole loader
    whose batches are dropped), and fed by the loader (default, lanes, and default with
    a 0.5 ms GIL switch interval instead of 5 ms). Rounds interleaved."""
    from packer.measure.bench.loading import train_step

    step = train_step("resnet50", 1000, device)
    norm = packer.Normalize().to(device)
    jp = packer.load(pack)
    rows = torch.arange(len(jp)).repeat(64)

    def loader(way: Any) -> Any:
        return packer.PackLoader(pack, batch, device=device, image_size=224, decode=way,
                                 indices=rows, drop_last=True)  # fmt: skip

    its = {"auto": iter(loader("auto")), "lanes": iter(loader(["torchcodec", "torchvision"]))}
    resident = [tuple(t.clone() for t in next(its["auto"])) for _ in range(8)]
    tc = get_decoder(device, prefer="torchcodec")
    bg_it = iter(loader("auto"))
    order = torch.randperm(len(jp), generator=torch.Generator().manual_seed(0)).numpy()
    sizes = jp.sizes

    def host_python(k: int) -> None:
        idx = order[(k * batch) % (len(order) - batch) :][:batch]
        datas = jp.read(idx, check_ends=True)
        tc._checked(datas, sizes[idx], idx.tolist())

    def decode_only(k: int) -> None:
        tc.decode(batches[k % len(batches)], sizes=hw)

    def whole_loader(k: int) -> None:
        next(bg_it)

    def run(feed: Any, bg: Any = None, switch: float | None = None) -> float:
        sem, stop = threading.Semaphore(2), threading.Event()

        def work() -> None:
            s = torch.cuda.Stream(device)
            k = 0
            with torch.cuda.device(device), torch.cuda.stream(s):
                while not stop.is_set():
                    if sem.acquire(timeout=0.05):
                        bg(k)
                        k += 1

        th = threading.Thread(target=work, daemon=True) if bg is not None else None
        old = sys.getswitchinterval()
        if switch is not None:
            sys.setswitchinterval(switch)
        try:
            if th is not None:
                th.start()
            sync(device)
            t0 = time.perf_counter()
            for i in range(iters):
                x, y = feed(i)
                step(norm(x), y)
                sem.release()
            sync(device)
            return batch * iters / (time.perf_counter() - t0)
        finally:
            sys.setswitchinterval(old)
            stop.set()
            if th is not None:
                th.join()

    def res_feed(i: int) -> Any:
        return resident[i % 8]

    ways = {
        "resident": lambda: run(res_feed),
        "resident + host Python of the loader": lambda: run(res_feed, host_python),
        "resident + torchcodec decode": lambda: run(res_feed, decode_only),
        "resident + a loader, batches dropped": lambda: run(res_feed, whole_loader),
        "fed by the loader (auto)": lambda: run(lambda i: next(its["auto"])),
        "fed by the loader (auto), switch interval 0.5 ms": lambda: run(
            lambda i: next(its["auto"]), switch=0.0005
        ),
        "fed by the loader (lanes torchcodec+torchvision)": lambda: run(
            lambda i: next(its["lanes"])
        ),
    }
    for i in range(10):  # warm-up
        step(norm(resident[i % 8][0]), resident[i % 8][1])
        for it in its.values():
            next(it)
    for f in (host_python, decode_only, whole_loader):
        f(0)
    rates: dict[str, list[float]] = {k: [] for k in ways}
    for r in range(repeats):
        for k, fn in ways.items():
            rates[k].append(fn())
        print(f"  interference round {r + 1}/{repeats} done", file=sys.stderr, flush=True)
    base = statistics.median(rates["resident"])
    return {k: {"img_s": round(statistics.median(v), 1), "ratio": round(statistics.median(v) / base, 3),
                "all": [round(x) for x in v]} for k, v in rates.items()}  # fmt: skip


def blocking(device: torch.device, batches: list, hw: torch.Tensor) -> dict[str, Any]:
    """Does a decoder wait for work queued on the default stream (the model's)? Each
    decodes one batch on a side stream with the GPU idle, then with about 200 ms of
    ``torch.cuda._sleep`` queued on the default stream first: a decode that waits takes
    about 200 ms longer (its host call, and until its output is ready)."""
    probe = torch.cuda.Stream(device)
    start = time.perf_counter()
    torch.cuda._sleep(10**8)
    torch.cuda.synchronize(device)
    per_cycle = (time.perf_counter() - start) / 10**8
    cycles = int(0.2 / per_cycle)
    out: dict[str, Any] = {"sleep_s": round(cycles * per_cycle, 3)}
    for label, (name, kw) in SINGLE.items():
        try:
            dec = get_decoder(device, prefer=name, **kw)
        except UsageError:
            continue
        got: dict[str, float] = {}
        for busy in (False, True, False, True):
            torch.cuda.synchronize(device)
            if busy:
                torch.cuda._sleep(cycles)  # on the default stream
            t0 = time.perf_counter()
            with torch.cuda.stream(probe):
                dec.decode(batches[0], sizes=hw)
                t1 = time.perf_counter()
                probe.synchronize()
            t2 = time.perf_counter()
            key = "busy" if busy else "idle"
            got[f"{key}_call_s"] = round(t1 - t0, 4)
            got[f"{key}_ready_s"] = round(t2 - t0, 4)
        torch.cuda.synchronize(device)
        out[label] = got
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--parts", default="bare,loader,train")
    ap.add_argument("--train-iters", type=int, default=40)
    ap.add_argument("--work", type=Path, default=Path("/tmp/imgpack-lanes"))
    args = ap.parse_args()
    device = resolve_device(args.device)
    if device.type != "cuda":
        sys.exit("decode_lanes.py measures GPU decoders: run it with --device cuda on a GPU")
    parts = set(args.parts.split(","))
    procs = len(os.sched_getaffinity(0))
    shutil.rmtree(args.work, ignore_errors=True)
    src = args.work / "src"
    make_set(src, args.images, (500, 375), procs)
    files = sorted(str(p) for p in src.rglob("*.jpg"))
    datas = [torch.frombuffer(bytearray(Path(f).read_bytes()), dtype=torch.uint8) for f in files]
    n = len(datas) - len(datas) % args.batch
    batches = [datas[i : i + args.batch] for i in range(0, n, args.batch)]
    hw = torch.tensor([[375, 500]] * args.batch)
    res: dict[str, Any] = {"machine": machine(), "images": n, "batch": args.batch,
                           "repeats": args.repeats, "procs": procs}  # fmt: skip
    summary: list[tuple[str, str, str]] = []
    best = (0.0, "-")
    if "bare" in parts:
        res["bare"] = b = bare(device, batches, hw, args.repeats)
        dump(res, "bench_decode_lanes.json")
        best = max((r["img_s"], k) for k, r in b.items() if " + " not in k)
        print(f"\nBare batched decode, {n} images ~500x375 q90, batch {args.batch}, "
              f"median of {args.repeats} interleaved rounds")  # fmt: skip
        print("| decoders (a batch each, at once) | img/s | / best member alone |")
        print("| --- | --- | --- |")
        for k, r in b.items():
            print(f"| {k} | {r['img_s']:,.0f} | {r['over_best_member']:.2f} |")
        top = max((r["img_s"], k) for k, r in b.items())
        summary.append((f"bare: best set ({top[1]}) / best single ({best[1]})",
                        f"{top[0]:,.0f} / {best[0]:,.0f}", f"{top[0] / best[0]:.2f}"))  # fmt: skip
    pack = args.work / "jpeg_pack"
    if parts & {"loader", "train", "interfere"}:
        build(src, pack, BuildConfig(store="jpeg"))
    names = {k: k for k in ("torchcodec", "torchvision", "nvimgcodec")}
    lanes = list(lane_ways(device, names))
    if "loader" in parts:
        only = ["auto", *lanes]
        res["loader"] = lr = loader_rates(pack, device, args.batch, args.repeats, True, only)
        dump(res, "bench_decode_lanes.json")
        known = loader_ways(device, cuda_only=True)
        res["stages"] = {w: stages(pack, device, args.batch, known[w]) for w in lr}
        dump(res, "bench_decode_lanes.json")
        print(f"\nPackLoader, JPEG pack, RRC 224 + flip, batch {args.batch}")
        print("| decode= | img/s | / best bare single | path | decode busy per lane | crop busy |")
        print("| --- | --- | --- | --- | --- | --- |")
        for k, r in lr.items():
            st = res["stages"][k]
            lanes_busy = ", ".join(f"{v:.2f}" for v in st["decode_busy"].values())
            ratio = f"{r['img_s'] / best[0]:.2f}" if best[0] else "-"
            print(f"| {k} | {r['img_s']:,.0f} | {ratio} | {r['path']} | {lanes_busy} | "
                  f"{st['crop_busy']:.2f} |")  # fmt: skip
        top = max((r["img_s"], k) for k, r in lr.items())
        if best[0]:
            summary.append((f"loader: default / best bare single ({best[1]})",
                            f"{lr['auto']['img_s']:,.0f} / {best[0]:,.0f}",
                            f"{lr['auto']['img_s'] / best[0]:.2f}"))  # fmt: skip
            summary.append((f"loader: best ({top[1]}) / best bare single",
                            f"{top[0]:,.0f} / {best[0]:,.0f}", f"{top[0] / best[0]:.2f}"))  # fmt: skip
    if "train" in parts:
        ways = ["auto", *lanes]
        res["train"] = t = train_rates(
            pack, device, args.batch, args.train_iters, args.repeats, ways
        )
        dump(res, "bench_decode_lanes.json")
        print(f"\nResNet-50 bf16 channels_last, batch {args.batch}, {args.train_iters} steps")
        print("| fed by | img/s | / resident |\n| --- | --- | --- |")
        print(f"| resident | {t['resident']:,.0f} | 1.000 |")
        for w, r in t["ways"].items():
            print(f"| {w} ({r['path']}) | {r['img_s']:,.0f} | {r['img_s'] / t['resident']:.3f} |")
            summary.append((f"ResNet-50 fed by {w} / resident", f"{r['img_s']:,.0f} / "
                            f"{t['resident']:,.0f}", f"{r['img_s'] / t['resident']:.3f}"))  # fmt: skip
    if "blocking" in parts:
        res["blocking"] = bl = blocking(device, batches, hw)
        dump(res, "bench_decode_lanes.json")
        print(f"\nOne batch's decode on a side stream, GPU idle vs {bl['sleep_s']} s queued "
              "on the default stream (s)")  # fmt: skip
        print("| decoder | call, idle | call, busy | ready, idle | ready, busy |")
        print("| --- | --- | --- | --- | --- |")
        for k, r in bl.items():
            if isinstance(r, dict):
                print(f"| {k} | {r['idle_call_s']} | {r['busy_call_s']} | {r['idle_ready_s']} | "
                      f"{r['busy_ready_s']} |")  # fmt: skip
    if "interfere" in parts:
        res["interfere"] = it = interference(
            pack, device, args.batch, args.train_iters, args.repeats, batches, hw
        )
        dump(res, "bench_decode_lanes.json")
        print(f"\nResNet-50 bf16 channels_last, batch {args.batch}: what costs it time")
        print("| beside / fed by | img/s | / resident |\n| --- | --- | --- |")
        for k, r in it.items():
            print(f"| {k} | {r['img_s']:,.0f} | {r['ratio']:.3f} |")
    print(f"\nSummary ({res['machine'].get('gpu', device)}, {procs} cores; every ratio "
          "against a baseline of this run)")  # fmt: skip
    print("| what | measured | ratio |\n| --- | --- | --- |")
    for row in summary:
        print("| " + " | ".join(row) + " |")
    res["summary"] = summary
    dump(res, "bench_decode_lanes.json")


if __name__ == "__main__":
    main()
