"""What a JPEG-pack loader's GPU work takes from the model it feeds, and what gives it
back (issue 32's "ResNet-50 fed by a JPEG pack >= 98% of resident").

Same bytes as ``benchmarks/decode_lanes.py`` (~500x375 q90, batch 256), ResNet-50 bf16
channels_last (``train_step``). Parts (``--parts``):

* ``profile``: a few steps under ``torch.profiler`` (CUDA kernels, copies and runtime
  calls of every thread), on resident batches and fed by the loader: the model stream's
  busy time and gaps per step, the loader's kernel time, its overlap with the model's,
  the runtime calls that synchronize. Traces go to ``$OUT/trace_*.json.gz``.
* ``priority``: the step on the default stream vs on a high-priority stream, resident
  and fed (like for like), rounds interleaved.
* ``green``: resident steps beside a paced background decode (one batch per step) on a
  plain side stream vs on a green context of a few SMs (``torch.cuda.green_contexts``).
* ``pixels``: each GPU decoder vs Pillow on ``sample_data/``'s photographs.

    python -m benchmarks.model_share --device cuda [--parts profile,priority,green,pixels]

Prints tables, a summary last; writes ``$OUT/bench_model_share.json``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

import packer
from packer.builder.api import BuildConfig, build
from packer.errors import UsageError
from packer.imaging.decoders import get_decoder
from packer.measure.timing import resolve_device

from ._common import ROOT, dump, machine, profiled
from .build import make_set
from .decoders import pillow, timed_steps

JSON = "bench_model_share.json"
_KEEP: list[Any] = []  # green contexts outlive their streams' work


def _loader(pack: Path, device: torch.device, batch: int, decode: Any) -> Any:
    rows = torch.arange(len(packer.load(pack))).repeat(64)
    if decode == "nvjpeg2":  # the default before the batched decoders: nvjpeg's two lanes
        decode = ["torchcodec", "torchvision"]
    if isinstance(decode, str) and decode.startswith("nvbatch:"):  # K batched C decoders
        from packer.imaging.decoders_split import nvimgcodec_batched

        decode = nvimgcodec_batched(device, int(decode.split(":")[1]))
    if isinstance(decode, str) and decode.startswith("nvimgcodec:"):  # K kept-buffer lanes
        from packer.imaging.decoders_split import nvimgcodec_lanes

        decode = nvimgcodec_lanes(device, int(decode.split(":")[1]))
    return packer.PackLoader(pack, batch, device=device, image_size=224, decode=decode,
                             indices=rows, drop_last=True)  # fmt: skip


def _run(step: Any, norm: Any, feed: Any, iters: int, batch: int, stream: Any) -> float:
    with torch.cuda.stream(stream):
        return timed_steps(step, norm, feed, iters, batch, torch.device("cuda"))


def green_stream(device: torch.device, sms: int) -> tuple[Any, str]:
    """A stream whose kernels run on ``sms`` SMs (a green context), and how it was made."""
    from torch.cuda import green_contexts as gcm

    gc_cls = gcm.GreenContext
    idx = device.index or 0
    try:
        gc = gc_cls(num_sms=sms, device_id=idx)
        how = "GreenContext(num_sms=)"
    except TypeError:
        try:
            gc = gc_cls.create(num_sms=sms, device_id=idx)
            how = "GreenContext.create(num_sms=)"
        except TypeError:
            gc = gc_cls.create(sms, idx)
            how = "GreenContext.create(sms, device)"
    _KEEP.append(gc)
    return gc.Stream(), how


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--parts", default="profile,priority,green,pixels")
    ap.add_argument("--train-iters", type=int, default=40)
    ap.add_argument("--profile-steps", type=int, default=12)
    ap.add_argument("--green-sms", default="8,16,32")
    ap.add_argument("--streams", default="default,high", help="the step's streams (priority)")
    ap.add_argument("--chunks", default="0,32", help="ab: images per crop launch (0: all)")
    ap.add_argument("--ungrouped", action="store_true", help="ab: also the crop's rows ungrouped")
    ap.add_argument("--nochecks", action="store_true", help="ab: also without header checks")
    ap.add_argument("--ways", default="auto,torchcodec", help="the loaders' decode= values")
    ap.add_argument("--tag", default="", help="suffix of the JSON and trace names")
    ap.add_argument("--work", type=Path, default=Path("/tmp/imgpack-share"))
    args = ap.parse_args()
    global JSON
    JSON = f"bench_model_share{args.tag}.json"
    device = resolve_device(args.device)
    if device.type != "cuda":
        sys.exit("model_share.py measures GPU sharing: run it with --device cuda on a GPU")
    parts = set(args.parts.split(","))
    out = Path(os.environ.get("OUT", ROOT / "out"))
    out.mkdir(parents=True, exist_ok=True)
    procs = len(os.sched_getaffinity(0))
    res: dict[str, Any] = {"machine": machine(), "batch": args.batch, "procs": procs,
                           "priority_range": list(torch.cuda.Stream.priority_range())}  # fmt: skip
    summary: list[tuple[str, str, str]] = []
    src = args.work / "src"
    make_set(src, args.images, (500, 375), procs)
    pack = args.work / "jpeg_pack"
    if not (pack / "imgpack.json").exists():
        build(src, pack, BuildConfig(store="jpeg"))
    from packer.measure.bench.loading import train_step

    step = train_step("resnet50", 1000, device)
    norm = packer.Normalize().to(device)
    lds = {w: _loader(pack, device, args.batch, w) for w in args.ways.split(",")}
    its = {k: iter(v) for k, v in lds.items()}
    resident = [tuple(t.clone() for t in next(its[next(iter(its))])) for _ in range(8)]
    res["paths"] = {k: v.decode_path for k, v in lds.items()}
    feeds = {"resident": lambda i: resident[i % 8],
             **{k: (lambda i, it=it: next(it)) for k, it in its.items()}}  # fmt: skip
    for i in range(10):
        for f in feeds.values():
            x, y = f(i)
            step(norm(x), y)
    if "profile" in parts:
        res["profile"] = pr = {}
        for k, f in feeds.items():
            pr[k] = profiled(k + args.tag, step, norm, f, args.profile_steps, out)
            dump(res, JSON)
        print(f"\nProfile, {args.profile_steps} steps each (per step, ms)")
        print("| fed by | wall | model busy | model gaps | loader kernels | overlap | "
              "loader kernels/step |\n| --- | --- | --- | --- | --- | --- | --- |")  # fmt: skip
        for k, s in pr.items():
            print(f"| {k} | {s['wall_per_step_ms']} | {s['model_busy_per_step_ms']} | "
                  f"{s['model_gaps_per_step_ms']} | {s['loader_kernel_ms_per_step']} | "
                  f"{s['overlap_per_step_ms']} | {s['loader_kernels_per_step']} |")  # fmt: skip
        for k, s in pr.items():
            print(f"\n{k}: loader's top kernels (ms/step): {s['loader_top_kernels_ms']}")
            print(f"{k}: copies (ms/step): {s['copies_ms_per_step']}")
            print(f"{k}: syncing calls: {s['syncing_calls']}")
    if "priority" in parts:
        lo, hi_p = torch.cuda.Stream.priority_range()
        hi = torch.cuda.Stream(device, priority=hi_p)
        dflt = torch.cuda.default_stream(device)
        rates: dict[str, list[float]] = defaultdict(list)
        for _ in range(args.repeats):
            for k, f in feeds.items():
                for sname, s in (("default", dflt), ("high", hi)):
                    if sname not in args.streams:
                        continue
                    rates[f"{k}|{sname}"].append(
                        _run(step, norm, f, args.train_iters, args.batch, s)
                    )
        med = {k: statistics.median(v) for k, v in rates.items()}
        res["priority"] = {"range": [lo, hi_p], "img_s": med, "all": rates}
        dump(res, JSON)
        print(f"\nResNet-50, {args.train_iters} steps, the step's stream (priority range "
              f"{lo}..{hi_p})")  # fmt: skip
        print("| fed by | default stream img/s | / resident | high priority img/s | / resident |")
        print("| --- | --- | --- | --- | --- |")
        for k in feeds:
            d, h = med.get(f"{k}|default", 0.0), med.get(f"{k}|high", 0.0)
            rd, rh = med.get("resident|default", 1.0), med.get("resident|high", 1.0)
            print(f"| {k} | {d:,.0f} | {d / rd:.3f} | {h:,.0f} | {h / rh:.3f} |")
            if k != "resident":
                summary.append((f"ResNet-50 fed by {k} / resident, default stream",
                                f"{d:,.0f} / {rd:,.0f}", f"{d / rd:.3f}"))  # fmt: skip
                summary.append((f"ResNet-50 fed by {k} / resident, high-priority stream",
                                f"{h:,.0f} / {rh:,.0f}", f"{h / rh:.3f}"))  # fmt: skip
    if "ab" in parts:
        res["ab"] = ab(args, device, step, norm, feeds, summary)
        dump(res, JSON)
    if "green" in parts:
        res["green"] = green(args, device, pack, step, norm, resident, summary)
        dump(res, JSON)
    for it in its.values():
        it.close()
    for ld in lds.values():
        ld.close()
    if "pixels" in parts:
        res["pixels"] = pixels(device)
        dump(res, JSON)
    print(f"\nSummary ({res['machine'].get('gpu', device)}, {procs} cores; every ratio "
          "against a baseline of this run)")  # fmt: skip
    print("| what | measured | ratio |\n| --- | --- | --- |")
    for row in summary:
        print("| " + " | ".join(row) + " |")
    res["summary"] = summary
    dump(res, JSON)


def ab(args: Any, device: torch.device, step: Any, norm: Any, feeds: dict[str, Any],
       summary: list) -> dict[str, Any]:  # fmt: skip
    """ResNet-50 fed by the loaders with the ragged crop whole or in slices
    (``resample_triton.RAGGED_CHUNK``), on the default stream, rounds interleaved; per
    way the host's wait in ``next()`` per step and each batch's decode latency."""
    from packer.imaging import resample_triton as rt
    from packer.loading import jpeg_pass

    lat: list[float] = []
    run0 = jpeg_pass.Decoding.run

    def timed(self: Any, *a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return run0(self, *a, **k)
        finally:
            lat.append(time.perf_counter() - t0)

    from packer.imaging.decoders import DecoderBase

    checked0, chunk0, group0 = DecoderBase._checked, rt.RAGGED_CHUNK, rt.RAGGED_GROUP

    def unchecked(self: Any, datas: Any, sizes: Any, indices: Any, walk: bool = True) -> Any:
        """The header checks skipped (a probe of their GIL time, never shipped)."""
        names = list(range(len(datas))) if indices is None else [int(i) for i in indices]
        return names, np.asarray(sizes, dtype=np.int64).reshape(-1, 2)

    chunks = [int(c) for c in args.chunks.split(",")]
    ways = [("resident", "resident", 0)]
    for k in feeds:
        if k != "resident":
            ways += [(f"{k}, crop whole" if c == 0 else f"{k}, crop in slices of {c}", k, c)
                     for c in chunks]  # fmt: skip
            if args.ungrouped:
                ways.append((f"{k}, slices of {chunks[-1]}, ungrouped", k, chunks[-1]))
            if args.nochecks:
                ways.append((f"{k}, slices of {chunks[-1]}, no header checks", k, chunks[-1]))
    rates: dict[str, list[float]] = defaultdict(list)
    waits: dict[str, list[float]] = defaultdict(list)
    lats: dict[str, list[float]] = defaultdict(list)
    dflt = torch.cuda.default_stream(device)
    jpeg_pass.Decoding.run = timed  # type: ignore[method-assign]
    try:
        for _ in range(args.repeats):
            for label, k, c in ways:
                rt.RAGGED_CHUNK = c
                rt.RAGGED_GROUP = "ungrouped" not in label
                DecoderBase._checked = unchecked if "no header" in label else checked0  # type: ignore[method-assign]
                for i in range(3):  # the queue refilled under this setting
                    x, y = feeds[k](i)
                    step(norm(x), y)
                lat.clear()

                def feed(i: int, k: str = k, label: str = label) -> Any:
                    t0 = time.perf_counter()
                    got = feeds[k](i)
                    waits[label].append(time.perf_counter() - t0)
                    return got

                rates[label].append(_run(step, norm, feed, args.train_iters, args.batch, dflt))
                lats[label] += lat
    finally:
        jpeg_pass.Decoding.run = run0  # type: ignore[method-assign]
        DecoderBase._checked = checked0  # type: ignore[method-assign]
        rt.RAGGED_CHUNK, rt.RAGGED_GROUP = chunk0, group0
    base = statistics.median(rates["resident"])
    out: dict[str, Any] = {}
    print(
        f"\nResNet-50, {args.train_iters} steps, CUDA_DEVICE_MAX_CONNECTIONS="
        f"{os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS', 'unset')}"
    )
    print(
        "| fed by | img/s | / resident | next() wait ms/step p50 / p90 / max | decode ms p50 / p90 / max |"
    )
    print("| --- | --- | --- | --- | --- |")
    for label, _, _ in ways:
        r = statistics.median(rates[label])
        w = sorted(waits[label]) or [0.0]
        d = sorted(lats[label]) or [0.0]
        q = lambda v, f: v[min(len(v) - 1, int(len(v) * f))] * 1e3  # noqa: E731
        out[label] = {"img_s": round(r, 1), "ratio": round(r / base, 4), "all": rates[label],
                      "wait_ms": [round(q(w, .5), 2), round(q(w, .9), 2), round(w[-1] * 1e3, 2)],
                      "wait_ms_per_step": round(sum(w) / len(w) * 1e3, 3),
                      "decode_ms": [round(q(d, .5), 1), round(q(d, .9), 1), round(d[-1] * 1e3, 1)]}  # fmt: skip
        o = out[label]
        print(
            f"| {label} | {r:,.0f} | {r / base:.3f} | {o['wait_ms'][0]} / {o['wait_ms'][1]} / "
            f"{o['wait_ms'][2]} | {o['decode_ms'][0]} / {o['decode_ms'][1]} / {o['decode_ms'][2]} |"
        )
        if label != "resident":
            summary.append((f"ResNet-50 fed by {label} / resident", f"{r:,.0f} / {base:,.0f}",
                            f"{r / base:.3f}"))  # fmt: skip
    return out


def green(args: Any, device: torch.device, pack: Path, step: Any, norm: Any,
          resident: list, summary: list) -> dict[str, Any]:  # fmt: skip
    """Resident steps beside torchcodec's decode of one batch per step, the decode on a
    plain side stream or on a green context's stream of N SMs; also whether a green
    context's decode gives the same pixels."""
    jp = packer.load(pack)
    dec = get_decoder(device, prefer="torchcodec")
    order = np.arange(len(jp))
    batches = [jp.read(order[i : i + args.batch]) for i in range(0, 8 * args.batch, args.batch)]
    hw = torch.as_tensor(np.asarray(jp.sizes)[: args.batch])
    streams: dict[str, Any] = {"side stream": torch.cuda.Stream(device)}
    info: dict[str, Any] = {}
    for n in (int(s) for s in args.green_sms.split(",") if s):
        try:
            streams[f"green {n} SMs"], info["how"] = green_stream(device, n)
        except Exception as e:  # reported: the part measures what exists
            info[f"green {n}"] = f"{type(e).__name__}: {e}"
    with torch.cuda.stream(streams["side stream"]):
        ref = dec.decode(batches[0], sizes=hw)
        torch.cuda.current_stream().synchronize()
    for k, s in streams.items():
        with torch.cuda.stream(s):
            got = dec.decode(batches[0], sizes=hw)
            s.synchronize()
        info[f"{k} same pixels"] = all(bool(torch.equal(a, b)) for a, b in zip(ref, got))

    def run(stream: Any) -> float:
        sem, stop = threading.Semaphore(2), threading.Event()

        def work() -> None:
            k = 0
            with torch.cuda.stream(stream):
                while not stop.is_set():
                    if sem.acquire(timeout=0.05):
                        dec.decode(batches[k % len(batches)], sizes=hw)
                        k += 1

        th = threading.Thread(target=work, daemon=True) if stream is not None else None
        try:
            if th is not None:
                th.start()
            return _run(step, norm, lambda i: resident[i % 8], args.train_iters, args.batch,
                        torch.cuda.default_stream(device))  # fmt: skip
        finally:
            stop.set()
            if th is not None:
                th.join()

    ways = {"resident alone": None, **streams}
    rates: dict[str, list[float]] = defaultdict(list)
    for _ in range(args.repeats):
        for k, s in ways.items():
            rates[k].append(run(s))
    base = statistics.median(rates["resident alone"])
    print("\nResNet-50 resident, beside torchcodec decoding a batch per step")
    print("| decode on | img/s | / alone |\n| --- | --- | --- |")
    for k, v in rates.items():
        print(f"| {k} | {statistics.median(v):,.0f} | {statistics.median(v) / base:.3f} |")
        if k != "resident alone":
            summary.append((f"ResNet-50 resident beside a decode on {k} / alone",
                            f"{statistics.median(v):,.0f} / {base:,.0f}",
                            f"{statistics.median(v) / base:.3f}"))  # fmt: skip
    print(f"green context: {info}")
    return {"info": info, "img_s": {k: statistics.median(v) for k, v in rates.items()},
            "all": rates}  # fmt: skip


def pixels(device: torch.device) -> dict[str, Any]:
    """Mean |decoder - Pillow| (0-255) over ``sample_data/``'s JPEG photographs."""
    files = sorted((ROOT / "sample_data").rglob("*.jpg"))
    datas = [torch.frombuffer(bytearray(f.read_bytes()), dtype=torch.uint8) for f in files]
    ref = [pillow(d) for d in datas]
    out: dict[str, Any] = {"files": len(files)}
    for name in ("torchcodec", "torchvision", "nvimgcodec"):
        try:
            dec = get_decoder(device, prefer=name)
        except UsageError as e:
            out[name] = f"not run: {e}"
            continue
        diffs = []
        for d, r in zip(datas, ref):
            x = dec.decode([d])[0].cpu().numpy().astype(np.int16)  # [3, h, w], as Pillow here
            diffs.append(float(np.abs(x - r.astype(np.int16)).mean()))
        out[name] = {"mean": round(statistics.mean(diffs), 3), "max_file": round(max(diffs), 3)}
    print(f"\nPixels vs Pillow on sample_data ({len(files)} photographs): {out}")
    return out


if __name__ == "__main__":
    main()
