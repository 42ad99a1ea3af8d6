"""imgpack's JPEG-pack loader beside NVIDIA DALI on the same files and GPU (issue 44).

One run, one machine, the same JPEGs (``--images`` photo-like files of ``--size``,
quality 90, made by ``benchmarks/build.py``'s ``make_set``):

* ``dali``: DALI's ResNet-50 file pipeline (``fn.readers.file`` over the folder, shuffled;
  ``fn.decoders.image_random_crop(device="mixed")`` with the example's paddings and
  preallocation hints, scale 0.08-1, ratio 3/4-4/3; ``fn.resize`` 224 triangular;
  ``fn.crop_mirror_normalize`` uint8 CHW with a random mirror), read through
  ``DALIGenericIterator``; batch ``--batch``, every core a DALI thread.
* ``imgpack``: ``PackLoader(jpeg_pack, batch, device="cuda", image_size=224)`` over a
  ``--store jpeg`` pack of the same files (RandomResizedCrop 224 + flip), with each
  ``decode=`` given by ``--decodes`` (``auto`` = the default; ``cpu-lane:K`` = the default
  lanes plus one CPU lane of K threads, ``decoders_split.cpu_lane``; ``cpu`` = the CPU
  threads alone, box-only and reduced-scale decode).
* ``bare``: nvImageCodec's batched decode alone on the pack's bytes, by backend (the
  NVJPG hardware engines, the hybrid CUDA decoder, both with a load split), full images
  and RandomResizedCrop boxes (ROI), one decoder or several at once on their own streams:
  what the engines can give, before any loader.

Rounds alternate (every variant once per round); medians and minima of img/s, and each
variant as a ratio to DALI's median in the same run. Tables printed last; JSON under
``$OUT/bench_dali.json``.

    python3 -m benchmarks.dali --work /tmp/dali-bench [--images 20000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import packer
from packer.builder.api import BuildConfig, build

from ._common import dump, machine
from .build import make_set


def dali_loader(root: Path, batch: int, threads: int, seed: int, hw_load: float | None) -> Any:
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    kw = {} if hw_load is None else {"hw_decoder_load": hw_load}

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=0, seed=seed)
    def pipe():
        jpegs, labels = fn.readers.file(
            file_root=str(root), random_shuffle=True, name="Reader", initial_fill=4096
        )
        images = fn.decoders.image_random_crop(
            jpegs,
            device="mixed",
            output_type=types.RGB,
            device_memory_padding=211025920,
            host_memory_padding=140544512,
            preallocate_width_hint=5980,
            preallocate_height_hint=6430,
            random_aspect_ratio=[3 / 4, 4 / 3],
            random_area=[0.08, 1.0],
            num_attempts=100,
            **kw,
        )
        images = fn.resize(
            images, device="gpu", resize_x=224, resize_y=224, interp_type=types.INTERP_TRIANGULAR
        )
        mirror = fn.random.coin_flip(probability=0.5)
        images = fn.crop_mirror_normalize(
            images, dtype=types.UINT8, output_layout="CHW", crop=(224, 224), mirror=mirror
        )
        return images, labels.gpu()

    p = pipe()
    p.build()
    return DALIGenericIterator(p, ["images", "labels"], reader_name="Reader", auto_reset=True)


def rate(batches: Any, steps: int, warmup: int, batch: int) -> float:
    """img/s over ``steps`` batches after ``warmup``, the device synchronized at both ends."""
    it = iter(batches)
    for _ in range(warmup):
        next(it)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        next(it)
    torch.cuda.synchronize()
    return steps * batch / (time.perf_counter() - t)


def _endless(make: Any) -> Any:
    while True:
        yield from make()


def dali_batches(it: Any) -> Any:
    while True:
        for out in it:
            yield out[0]["images"]


def bare(pack: Any, batch: int, rounds: int, out: dict) -> None:
    """nvImageCodec alone on the pack's bytes, by backend, full and ROI, 1-4 decoders."""
    os.environ.setdefault("PYNVIMGCODEC_VERBOSITY", "0")
    from nvidia import nvimgcodec as nv

    n = min(len(pack), batch * 8)
    datas = [t.numpy().copy() for t in pack.read(np.arange(n))]
    rng = np.random.default_rng(0)
    groups = [list(range(k, min(k + batch, n))) for k in range(0, n, batch)]
    t = time.perf_counter()
    streams = [nv.CodeStream(d) for d in datas]
    out["codestream_us_per_image"] = (time.perf_counter() - t) / n * 1e6
    datas_cs = list(datas)  # the same arrays, a distinct list: made into CodeStreams per batch

    def boxes_for(k: int) -> tuple[int, int, int, int]:
        s = streams[k]
        h, w = s.height, s.width
        area = h * w * rng.uniform(0.08, 1.0)
        r = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
        bw = int(min(w, max(1, round((area * r) ** 0.5))))
        bh = int(min(h, max(1, round((area / r) ** 0.5))))
        y, x = int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1))
        return y, x, y + bh, x + bw

    rois = [s.get_sub_code_stream(region=nv.Region(*boxes_for(k))) for k, s in enumerate(streams)]
    params = nv.DecodeParams(
        apply_exif_orientation=False, color_spec=nv.SRGB, sample_format=nv.P_RGB
    )

    def make(kind: str, threads: int = 0, options: str = "") -> Any:
        hw = nv.Backend(
            nv.HW_GPU_ONLY, load_hint=1.0, load_hint_policy=nv.ADAPTIVE_MINIMIZE_IDLE_TIME
        )
        backends = {
            "hw": [hw],
            "hybrid": [nv.Backend(nv.HYBRID_CPU_GPU)],
            "hw+hybrid": [hw, nv.Backend(nv.HYBRID_CPU_GPU)],
            "hw0.65+hybrid": [
                nv.Backend(nv.HW_GPU_ONLY, load_hint=0.65, load_hint_policy=nv.FIXED),
                nv.Backend(nv.HYBRID_CPU_GPU),
            ],
            "hw0.9+hybrid": [
                nv.Backend(nv.HW_GPU_ONLY, load_hint=0.9, load_hint_policy=nv.FIXED),
                nv.Backend(nv.HYBRID_CPU_GPU),
            ],
            "hw0.8+hybrid": [
                nv.Backend(nv.HW_GPU_ONLY, load_hint=0.8, load_hint_policy=nv.FIXED),
                nv.Backend(nv.HYBRID_CPU_GPU),
            ],
        }[kind]
        return nv.Decoder(
            device_id=0, max_num_cpu_threads=threads, backends=backends, options=options
        )

    def run(dec: Any, src: list, stream: torch.cuda.Stream, reuse: bool) -> int:
        images = None
        done = 0
        with torch.cuda.stream(stream):
            for g in groups:
                batch_in = [src[k] for k in g]
                if src is datas_cs:  # CodeStreams made in the timed loop, as a loader must
                    batch_in = [nv.CodeStream(x) for x in batch_in]
                if reuse and images is not None and len(images) == len(batch_in):
                    imgs = dec.decode(
                        batch_in, params=params, images=images, cuda_stream=stream.cuda_stream
                    )
                else:
                    imgs = dec.decode(batch_in, params=params, cuda_stream=stream.cuda_stream)
                done += sum(x is not None for x in imgs)
                images = imgs if reuse else None
        return done

    variants: list[tuple[str, str, str, int, bool, int]] = [
        # label, backends, source, decoders at once, reuse buffers, cpu threads
        ("hw full", "hw", "full", 1, False, 0),
        ("hw full reuse", "hw", "full", 1, True, 0),
        ("hw roi reuse", "hw", "roi", 1, True, 0),
        ("hybrid full reuse", "hybrid", "full", 1, True, 0),
        ("hybrid roi reuse", "hybrid", "roi", 1, True, 0),
        ("hw+hybrid full reuse", "hw+hybrid", "full", 1, True, 0),
        ("hw0.8+hybrid full reuse", "hw0.8+hybrid", "full", 1, True, 0),
        ("hw0.9+hybrid full reuse", "hw0.9+hybrid", "full", 1, True, 0),
        ("hw full reuse x2", "hw", "full", 2, True, 0),
        ("hw full reuse x4", "hw", "full", 4, True, 0),
        ("hw roi reuse x2", "hw", "roi", 2, True, 0),
        ("hw0.9+hybrid full reuse x2", "hw0.9+hybrid", "full", 2, True, 0),
        # the bytes as arrays (nvImageCodec parses them in the call) vs CodeStreams made
        # per batch in the timed loop: what a loader pays
        ("hw np reuse x4", "hw", "np", 4, True, 0),
        ("hw cs-in-loop reuse x4", "hw", "cs", 4, True, 0),
        ("hw np reuse", "hw", "np", 1, True, 0),
    ]
    decs: dict[str, list] = {}
    results: dict[str, list[float]] = {v[0]: [] for v in variants}
    fails: dict[str, str] = {}
    for label, kind, _src, k, _reuse, threads in variants:
        try:
            decs[label] = [make(kind, threads) for _ in range(k)]
        except Exception as e:  # a backend this machine lacks
            fails[label] = str(e)[:200]
    for r in range(rounds + 1):  # round 0 warms up
        for label, _kind, src, k, reuse, _t in variants:
            if label not in decs:
                continue
            source = {"full": streams, "roi": rois, "np": datas, "cs": datas_cs}[src]
            ss = [torch.cuda.Stream() for _ in range(k)]
            counts = [0] * k
            torch.cuda.synchronize()
            t = time.perf_counter()
            decs_k = decs[label]

            def work(j: int, decs_k=decs_k, source=source, ss=ss, reuse=reuse, counts=counts):
                counts[j] = run(decs_k[j], source, ss[j], reuse)

            th = [threading.Thread(target=work, args=(j,)) for j in range(k)]
            for x in th:
                x.start()
            for x in th:
                x.join()
            torch.cuda.synchronize()
            dt = time.perf_counter() - t
            if r:
                results[label].append(sum(counts) / dt)
            elif sum(counts) < k * n:
                fails[label + " (images not decoded)"] = f"{k * n - sum(counts)} of {k * n}"
    # the same decodes through imgpack's decoder interface (checks, DLPack tensors, kept
    # buffers), and the raw decode + DLPack alone: where the loader's decode time goes
    from packer.imaging.decoders_nvimgcodec import NvImageCodecDecoder

    tens = [torch.from_numpy(d) for d in datas]
    sizes = torch.tensor([[s.height, s.width] for s in streams])

    def iface(dec: Any, stream: torch.cuda.Stream) -> int:
        done = 0
        with torch.cuda.stream(stream):
            for g in groups:
                got = dec.decode([tens[k] for k in g], sizes=sizes[g], indices=g)
                done += len(got)
                del got
        return done

    def dlpack(dec: Any, stream: torch.cuda.Stream) -> int:
        done = 0
        images = None
        with torch.cuda.stream(stream):
            for g in groups:
                kw = {} if images is None else {"images": images}
                imgs = dec.decode([streams[k] for k in g], params=params,
                                  cuda_stream=stream.cuda_stream, **kw)  # fmt: skip
                ts = [torch.from_dlpack(x) for x in imgs]
                done += len(ts)
                del ts
                images = imgs
        return done

    def kept(dec: Any, stream: torch.cuda.Stream) -> int:
        done = 0
        hw = sizes.numpy()
        with torch.cuda.stream(stream):
            for g in groups:
                got = dec.decode_kept([tens[k] for k in g], hw[g], g)
                done += len(got)
                del got
        return done

    more = {
        "kept hw": ("kept", 1),
        "kept hw x4": ("kept", 4),
        "iface hw reuse": ("iface", 1),
        "iface hw reuse x4": ("iface", 4),
        "raw+dlpack hw reuse": ("dlpack", 1),
        "raw+dlpack hw reuse x4": ("dlpack", 4),
        "nvbatch hw": ("nvbatch", 1),
        "nvbatch hw x2": ("nvbatch", 2),
        "nvbatch hw x4": ("nvbatch", 4),
        "nvbatch hw+hybrid x2": ("nvbatch-hh", 2),
    }
    ds_of: dict[str, list] = {}
    for label, (how, k) in more.items():
        if how.startswith("nvbatch"):
            from packer.imaging.nvbatch import NvBatchDecoder

            be = "hw+hybrid" if how == "nvbatch-hh" else "hw"
            ds_of[label] = [NvBatchDecoder("cuda", backends=be) for _ in range(k)]
        elif how in ("iface", "kept"):
            ds_of[label] = [
                NvImageCodecDecoder("cuda", backends="hw", pitched=True, reuse=True, roi=False)
                for _ in range(k)
            ]
        else:
            ds_of[label] = [make("hw") for _ in range(k)]
    for r in range(rounds + 1):
        for label, (how, k) in more.items():
            ds = ds_of[label]
            ss = [torch.cuda.Stream() for _ in range(k)]
            fn = {"iface": iface, "kept": kept, "dlpack": dlpack}.get(how, kept)
            torch.cuda.synchronize()
            t = time.perf_counter()
            th = [threading.Thread(target=fn, args=(ds[j], ss[j])) for j in range(k)]
            for x in th:
                x.start()
            for x in th:
                x.join()
            torch.cuda.synchronize()
            if r:
                results.setdefault(label, []).append(k * n / (time.perf_counter() - t))
    out["bare"] = {
        k: {"median": statistics.median(v), "min": min(v)} for k, v in results.items() if v
    }
    out["bare_failures"] = fails


def _tuning(d: str, batch: int, hw: tuple[int, int]) -> tuple[str, dict[str, Any]]:
    """A ``--decodes`` value without its ``+`` suffixes, and the NvBatchDecoder keywords
    they name: ``+pool`` (pooled allocations, the default), ``+nopool`` (nvImageCodec's
    own, no pre_init), ``+init`` (pre_init), ``+pre`` (the
    engines' pool sized for ``batch`` images of ``hw``), ``+hufN`` (the CUDA decoder's
    Huffman on the GPU above N pixels: nvImageCodec's hybrid_huffman_threshold)."""
    way, *more = d.split("+")
    tail = ""
    if more and ":" in more[-1]:
        more[-1], tail = more[-1].split(":", 1)
        tail = ":" + tail
    kw: dict[str, Any] = {}
    for m in more:
        if m == "pool":
            kw["pools"] = True
        elif m == "nopool":  # nvImageCodec's own allocations, as before the pools
            kw["pools"] = False
            kw["pre_init"] = False
        elif m == "init":
            kw["pre_init"] = True
        elif m == "pre":
            kw["preallocate"] = (batch, *hw)
        elif m.startswith("huf"):
            kw["options"] = f"nvjpeg_cuda_decoder:hybrid_huffman_threshold={int(m[3:])}"
        else:
            raise SystemExit(f"--decodes {d}: unknown suffix +{m}")
    return way + tail, kw


def decode_kwargs(
    d: str, device: str = "cuda", batch: int = 256, hw: tuple[int, int] = (1, 1)
) -> dict[str, Any]:
    """The PackLoader keywords of one ``--decodes`` value (see ``--help``)."""
    d, tuning = _tuning(d, batch, hw)
    kw: dict[str, Any] = {} if d == "auto" else {"decode": d}
    if d == "nvjpeg2":  # the default before the batched decoders: nvjpeg's two lanes
        kw["decode"] = ["torchcodec", "torchvision"]
    if d.startswith(("nvbatch:", "nvbatch-hh", "nvbatch-roi:")):  # K batched lanes
        from packer.imaging.decoders_split import nvimgcodec_batched

        way, k = d.split(":")
        be = "hw+hybrid" if way.startswith("nvbatch-hh") else "hw"
        roi = way == "nvbatch-roi"
        # nvbatch-hhNN[tT]: the engines' fixed share NN% (DALI's hw_decoder_load), T threads
        load, _, threads = (
            way.removeprefix("nvbatch-hh").partition("t") if be != "hw" else ("", "", "")
        )
        kw["decode"] = nvimgcodec_batched(
            device, int(k), be, roi=roi, hw_load=int(load) / 100 if load else 1.0,
            threads=int(threads or 0), **tuning,
        )  # fmt: skip
    if d.startswith("cpu-lane:"):  # the default lanes plus one CPU lane of K threads
        from packer.imaging.decoders_split import best_lanes, cpu_lane

        kw["decode"] = [*best_lanes(device), cpu_lane(device, int(d.split(":")[1]))]
    if d.startswith("nvimgcodec:"):  # that many lanes
        from packer.imaging.decoders_split import nvimgcodec_lanes

        kw["decode"] = nvimgcodec_lanes(device, int(d.split(":")[1]))
    return kw


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--work", default="/tmp/dali-bench")
    ap.add_argument("--images", type=int, default=20000)
    ap.add_argument("--size", default="500x375")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument(
        "--decodes",
        default="auto,nvimgcodec",
        help="decode= values; nvimgcodec:K = K lanes; nvbatch:K, nvbatch-roi:K (only the "
        "boxes), nvbatch-hh:K (engines + CUDA decoder; "
        "nvbatch-hh65:K the engines' share fixed at 65%% as DALI's hw_decoder_load, "
        "nvbatch-hh65t16:K with 16 CPU threads) = K batched lanes; nvjpeg2 = nvjpeg's "
        "two lanes; cpu-lane:K = the default lanes plus one CPU lane of K threads; cpu = "
        "every image on the loader's CPU threads alone; WAY@S = at sys.setswitchinterval(S); "
        "an nvbatch way may end in +pool (pooled allocations, the default), +nopool, +init (pre_init), +pre (the "
        "engines' pool sized for the batch and image size), +hufN (GPU Huffman above N "
        "pixels), before :K, e.g. nvbatch-hh65t16+pool+pre:2",
    )
    ap.add_argument("--parts", default="bare,loaders")
    ap.add_argument(
        "--max-side", type=int, default=0, help="also a --max-side pack of the same files"
    )
    a = ap.parse_args()
    work = Path(a.work)
    cores = len(os.sched_getaffinity(0))
    w, h = (int(x) for x in a.size.split("x"))
    src = work / f"src_{a.size}_{a.images}"
    t = time.perf_counter()
    make_set(src, a.images, (w, h), cores)
    out: dict[str, Any] = {"machine": machine(), "args": vars(a), "make_s": time.perf_counter() - t}
    pack_dir = work / f"jpeg_{a.size}_{a.images}"
    if not (pack_dir / "imgpack.json").exists():
        build(src, pack_dir, BuildConfig(store="jpeg", workers=cores, overwrite=True))
    pack = packer.load(pack_dir)
    parts = a.parts.split(",")
    if "bare" in parts:
        bare(pack, a.batch, a.rounds, out)
        dump(out, "bench_dali.json")
    if "loaders" in parts:
        makers: dict[str, Any] = {}
        try:
            it = dali_loader(src, a.batch, cores, 1, None)
            makers["dali"] = dali_batches(it)
        except Exception as e:
            out["dali_error"] = repr(e)[:400]
        switch: dict[str, float] = {}  # "WAY@S": the loader measured at sys.setswitchinterval(S)
        for d_full in a.decodes.split(","):
            d, _, si = d_full.partition("@")
            try:
                kw = decode_kwargs(d, batch=a.batch, hw=(h, w))
                loader = packer.PackLoader(pack, a.batch, device="cuda", image_size=224, **kw)
                makers[f"imgpack {d_full}"] = _endless(lambda loader=loader: iter(loader))
                if si:
                    switch[f"imgpack {d_full}"] = float(si)
                out.setdefault("paths", {})[d_full] = loader
            except Exception as e:
                out.setdefault("loader_errors", {})[d_full] = repr(e)[:400]
        res: dict[str, list[float]] = {k: [] for k in makers}
        # torch's allocator retries (a cudaFree of its whole cache, then again) per round:
        # a round that falls far below the others with retries was starved of memory
        retries: dict[str, list[int]] = {k: [] for k in makers}
        default_switch = sys.getswitchinterval()
        # each imgpack round's loader.stats() (since the previous call): a slow round says
        # which stage took the time
        round_stats: dict[str, list[list[str]]] = {k: [] for k in makers if k != "dali"}
        loaders = {f"imgpack {d}": ld for d, ld in out.get("paths", {}).items()}
        for ld in loaders.values():
            ld.stats()
        for _ in range(a.rounds):
            for k, m in makers.items():
                sys.setswitchinterval(switch.get(k, default_switch))
                before = torch.cuda.memory_stats().get("num_alloc_retries", 0)
                try:
                    res[k].append(rate(m, a.steps, a.warmup, a.batch))
                finally:
                    sys.setswitchinterval(default_switch)
                retries[k].append(torch.cuda.memory_stats().get("num_alloc_retries", 0) - before)
                if k in loaders:
                    round_stats[k].append(loaders[k].stats().summary()[:2])
        out["round_stats"] = round_stats
        out["alloc_retries"] = retries
        out["reserved_gb"] = torch.cuda.memory_reserved() / 2**30
        for d, loader in list(out.get("paths", {}).items()):
            out["paths"][d] = getattr(loader, "decode_path", None)
        out["loaders"] = {
            k: {"runs": v, "median": statistics.median(v), "min": min(v)} for k, v in res.items()
        }
        dump(out, "bench_dali.json")
    # tables
    print(
        f"\n== {out['machine'].get('gpu')} {cores} cores, {a.images} JPEGs {a.size} q90, batch {a.batch}"
    )
    if "bare" in out:
        print(f"-- nvImageCodec bare (CodeStream {out['codestream_us_per_image']:.1f} us/img)")
        for k, v in out["bare"].items():
            print(f"{k:28s} {v['median']:10.0f} img/s (min {v['min']:.0f})")
        for k, v in out["bare_failures"].items():
            print(f"FAILED {k}: {v}")
    if "loaders" in out:
        base = out["loaders"].get("dali", {}).get("median")
        print("-- loaders, RRC 224 + flip, uint8 CHW on the GPU")
        for k, v in out["loaders"].items():
            ratio = f"{v['median'] / base:.3f}x DALI" if base else ""
            runs = " ".join(f"{x:.0f}" for x in v["runs"])
            print(f"{k:28s} {v['median']:10.0f} img/s  {ratio}  [{runs}]")
        print("allocator retries per round:", json.dumps(out.get("alloc_retries")))
        for k, per in out.get("round_stats", {}).items():
            for r, lines in enumerate(per):
                print(f"{k} round {r + 1}: " + " | ".join(lines))
        print(
            "paths:",
            json.dumps(out.get("paths")),
            out.get("dali_error", ""),
            out.get("loader_errors", ""),
        )


if __name__ == "__main__":
    main()
