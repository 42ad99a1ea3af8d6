"""Each JPEG decoder of ``packer.imaging.decoders`` on the same bytes, and the CPU ceiling.

All in one run, on the same ImageNet-like JPEGs (about 500x375, quality 90, from
``packer.measure.bench.synth.make_jpeg_tree``), batch 256, per decoder (nvImageCodec as
engines + CUDA decoder, engines alone, CUDA decoder alone; torchcodec; torchvision; the
CPU decoder), each where it imports:

* ``full``: bare batched decode (``decode``), img/s;
* ``roi``: decode of RandomResizedCrop boxes only (``decode_rois``; the same boxes for
  every decoder), img/s, and the way it ran (``roi_path``);
* ``rrc``: decode + RRC 224 + flip (``RoiResizedCrop``: the ROI-fused crop), img/s;
* pixels: mean |diff| vs Pillow over the first 64 images, in 1/255 levels.

Repeats are interleaved (every decoder and mode once per round), medians and minima
reported. The baselines, measured in the same run on the same files with N processes
(N = every core): Pillow decode + resize to 224 (``build.py``'s ceiling, the build's
decode) and Pillow decode + RRC-like crop + flip (``jpeg.py``'s).

Then issue 32's figures, each against a baseline of the same run (``--parts``):

* ``loader``: ``PackLoader(jpeg_pack, 256, image_size=224)`` (RandomResizedCrop + flip)
  with each ``decode=`` that runs here, img/s and the path it took
  (``PackLoader.decode_path``), vs the best decoder's bare batched decode above and vs
  the CPU ceilings;
* ``train``: ResNet-50 bf16 channels_last, batch 256, fed by that loader vs the same
  step on resident batches (interleaved rounds);
* ``pixels``: each decoder's ROI crops vs Pillow's decode of the same boxes;
* ``build``: 640x480 JPEGs -> 224²: the 16-process ceiling; a warm ``build --device
  cuda`` (this process, after a warm-up build) of ``--build-images``; fresh-process builds
  of ``--fresh-images`` with ``--device cpu``, ``auto`` and ``cuda``. The 640x480 set has
  ``--unique`` distinct files, the rest hard links to them (the same decode work; made
  in seconds rather than minutes).

Prints the tables, the summary last; writes ``$OUT/bench_decoders.json`` after each part.

    python -m benchmarks.decoders [--images 4096] [--batch 256] [--repeats 4] [--device cuda]
    python -m benchmarks.decoders --quick --device cpu     # a smoke test on the CPU
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

import packer
from packer.builder.api import BuildConfig, build
from packer.errors import UsageError
from packer.imaging.decoders import GPU_CHAIN, DecoderBase, get_decoder
from packer.loading.roi_crop import RoiResizedCrop
from packer.measure.timing import resolve_device, sync

from ._common import dump, machine
from .build import ceiling as resize_ceiling
from .build import lib_build, make_set
from .jpeg import cpu_ceiling as rrc_ceiling


def decoders(device: torch.device) -> dict[str, DecoderBase]:
    """Every decoder that runs on ``device``, by label."""
    out: dict[str, DecoderBase] = {}
    variants: list[tuple[str, str, dict[str, Any]]] = []
    if device.type == "cuda":
        variants += [
            (f"nvimgcodec {b}", "nvimgcodec", {"backends": b}) for b in ("hw+hybrid", "hw")
        ]
        variants += [(n, n, {}) for n in GPU_CHAIN[1:]]
    else:
        variants += [
            ("cpu", "cpu", {}),
            ("nvimgcodec cpu", "nvimgcodec", {}),
            ("torchcodec", "torchcodec", {}),
        ]
    for label, name, kw in variants:
        try:
            out[label] = get_decoder(device, prefer=name, **kw)
        except UsageError as e:
            print(f"  {label}: not run ({e})", file=sys.stderr)
    return out


def pillow(data: torch.Tensor) -> np.ndarray:
    with Image.open(__import__("io").BytesIO(bytes(data.numpy()))) as im:
        return np.asarray(im.convert("RGB")).transpose(2, 0, 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--procs", type=int, default=0, help="ceiling processes (0: every core)")
    ap.add_argument("--quick", action="store_true", help="a small run (smoke test)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/imgpack-decoders"))
    ap.add_argument("--device", default="auto")
    ap.add_argument("--parts", default="loader,train,pixels,build")
    ap.add_argument("--train-iters", type=int, default=40)
    ap.add_argument("--train-ways", default="auto,torchvision,nvimgcodec")
    ap.add_argument("--no-cpu-loader", action="store_true", help="skip decode='cpu' (slow)")
    ap.add_argument("--fresh-rounds", type=int, default=2)
    ap.add_argument("--build-images", type=int, default=65536)
    ap.add_argument("--fresh-images", type=int, default=16384)
    ap.add_argument("--unique", type=int, default=4096, help="distinct 640x480 files")
    args = ap.parse_args()
    if args.quick:
        args.images, args.batch, args.repeats = 96, 32, 2
        args.train_iters, args.build_images, args.fresh_images, args.unique = 2, 256, 128, 64
    device = resolve_device(args.device)
    procs = args.procs or len(os.sched_getaffinity(0))
    shutil.rmtree(args.work, ignore_errors=True)
    src = args.work / "src"
    make_set(src, args.images, (500, 375), procs)  # make_jpeg_tree's files, by processes
    files = sorted(str(p) for p in src.rglob("*.jpg"))
    datas = [torch.frombuffer(bytearray(Path(f).read_bytes()), dtype=torch.uint8) for f in files]
    n = len(datas) - len(datas) % args.batch
    batches = [datas[i : i + args.batch] for i in range(0, n, args.batch)]
    hw = torch.tensor([[375, 500]] * args.batch)
    draw = RoiResizedCrop(get_decoder("cpu", threads=0), 224)
    gen = torch.Generator().manual_seed(0)
    draws = [draw.boxes(hw, gen) for _ in batches]  # the same boxes and flips for every decoder
    res: dict[str, Any] = {
        "machine": machine(), "images": n, "batch": args.batch, "repeats": args.repeats,
        "device": str(device), "ceiling_procs": procs,
    }  # fmt: skip

    decs = decoders(device)
    crops = {k: RoiResizedCrop(d, 224) for k, d in decs.items()}

    def full(dec: DecoderBase) -> int:
        return sum(len(dec.decode(b, sizes=hw)) for b in batches)

    def roi(dec: DecoderBase) -> int:
        return sum(len(dec.decode_rois(b, bx, sizes=hw)) for b, (bx, _) in zip(batches, draws))

    def rrc(crop: RoiResizedCrop) -> int:
        return sum(len(crop.apply(b, hw, bx, f)) for b, (bx, f) in zip(batches, draws))

    work: dict[tuple[str, str], Callable[[], int]] = {}
    for k, d in decs.items():
        work[k, "full"] = lambda d=d: full(d)
        work[k, "roi"] = lambda d=d: roi(d)
        work[k, "rrc"] = lambda c=crops[k]: rrc(c)
    for k, d in decs.items():  # warm-up off the clock: handles, pools, ROI probe, Triton
        d.decode(batches[0], sizes=hw)
        d.decode_rois(batches[0], draws[0][0], sizes=hw)
        crops[k].apply(batches[0], hw, *draws[0])
    sync(device)
    rates: dict[tuple[str, str], list[float]] = {key: [] for key in work}
    for r in range(args.repeats):
        for key, fn in work.items():
            sync(device)
            t0 = time.perf_counter()
            count = fn()
            sync(device)
            rates[key].append(count / (time.perf_counter() - t0))
        print(f"  round {r + 1}/{args.repeats} done", file=sys.stderr, flush=True)

    ref = [pillow(d) for d in datas[:64]]
    rows = {}
    for k, d in decs.items():
        got = d.decode(datas[:64], sizes=torch.tensor([[375, 500]] * 64))
        diff = float(
            np.mean([np.abs(g.cpu().numpy().astype(np.int16) - p).mean() for g, p in zip(got, ref)])
        )
        rows[k] = {
            "name": d.name, "roi_path": d.roi_path, "vs_pillow_mean_abs": round(diff, 4),
            **{f"{m}_img_s": round(statistics.median(rates[k, m]), 1) for m in ("full", "roi", "rrc")},
            **{f"{m}_min_img_s": round(min(rates[k, m]), 1) for m in ("full", "roi", "rrc")},
            **({"roi_fallbacks": d.roi_fallbacks} if hasattr(d, "roi_fallbacks") else {}),
        }  # fmt: skip
    res["decoders"] = rows

    per_proc = max(8, len(files) // procs)
    res["ceiling_resize_224_img_s"] = round(resize_ceiling(files, procs, 224, args.repeats), 1)
    res["ceiling_rrc_flip_img_s"] = round(rrc_ceiling(files, procs, per_proc, args.repeats), 1)

    ceil = res["ceiling_resize_224_img_s"]
    best = max((r["full_img_s"], k) for k, r in rows.items()) if rows else (0.0, "-")
    res["best_full"] = {"decoder": best[1], "img_s": best[0]}
    print(f"\nJPEG decoders on {device} ({res['machine'].get('gpu', res['machine'].get('cpu', ''))}),"
          f" {n} images ~500x375 q90, batch {args.batch}, median of {args.repeats} interleaved")  # fmt: skip
    print(
        "| decoder | full img/s | roi img/s (path) | roi+rrc 224+flip img/s | rrc / best full | rrc / ceiling | vs Pillow |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for k, r in rows.items():
        print(f"| {k} | {r['full_img_s']:,.0f} | {r['roi_img_s']:,.0f} ({r['roi_path']}) | "
              f"{r['rrc_img_s']:,.0f} | {r['rrc_img_s'] / best[0]:.2f} | {r['rrc_img_s'] / ceil:.2f}x | "
              f"{r['vs_pillow_mean_abs']:.3f}/255 |")  # fmt: skip
    print(f"| CPU ceiling, {procs} procs: Pillow decode+resize 224 | {ceil:,.0f} | | | | 1.00x | |")
    print(f"| CPU ceiling, {procs} procs: Pillow decode+RRC+flip | | | "
          f"{res['ceiling_rrc_flip_img_s']:,.0f} | | | |")  # fmt: skip
    dump(res, "bench_decoders.json")
    for d in decs.values():
        close = getattr(d, "close", None)
        if close is not None:
            close()

    parts = set(args.parts.split(",")) if args.parts else set()
    summary: list[tuple[str, str, str, str]] = []
    best_full = best[0]
    if "pixels" in parts:
        res["roi_vs_pillow"] = roi_vs_pillow(
            decs, datas[:64], torch.cat([bx for bx, _ in draws])[:64]
        )
        dump(res, "bench_decoders.json")
        for k, v in res["roi_vs_pillow"].items():
            if k not in rows:
                continue
            full = rows[k]["vs_pillow_mean_abs"]
            summary.append(
                (
                    f"pixels vs Pillow: {k}, full decode / its crops",
                    f"{full:.3f} / {v:.3f}/255",
                    "<= 0.5/255",
                    "met" if full <= 0.5 else "not met",
                )
            )
    pack = None
    if parts & {"loader", "train"}:
        pack = args.work / "jpeg_pack"
        build(src, pack, BuildConfig(store="jpeg"))
    if "loader" in parts:
        res["loader"] = loader_rates(pack, device, args.batch, args.repeats, args.no_cpu_loader)
        dump(res, "bench_decoders.json")
        print(f"\nPackLoader, JPEG pack, RandomResizedCrop 224 + flip, batch {args.batch}")
        print(
            "| decode= | img/s | path | / best bare decode | / ceiling decode+resize | / ceiling decode+RRC |"
        )
        print("| --- | --- | --- | --- | --- | --- |")
        for k, r in res["loader"].items():
            print(f"| {k} | {r['img_s']:,.0f} | {r['path']} | {r['img_s'] / best_full:.2f} | "
                  f"{r['img_s'] / ceil:.2f}x | {r['img_s'] / res['ceiling_rrc_flip_img_s']:.2f}x |")  # fmt: skip
        a = res["loader"].get("auto")
        if a:
            summary.append(
                (
                    f"PackLoader RRC 224 + flip (auto: {a['path']}) / best bare decode ({best[1]})",
                    f"{a['img_s']:,.0f} / {best_full:,.0f}",
                    ">= 1.00",
                    f"{a['img_s'] / best_full:.2f}",
                )
            )
            summary.append(
                (
                    f"the same / {procs}-proc CPU decode+resize ceiling",
                    f"{a['img_s']:,.0f} / {ceil:,.0f}",
                    ">= 4x",
                    f"{a['img_s'] / ceil:.2f}x",
                )
            )
    if "train" in parts and device.type == "cuda":
        ways = args.train_ways.split(",")
        res["train"] = train_rates(pack, device, args.batch, args.train_iters, args.repeats, ways)
        dump(res, "bench_decoders.json")
        t = res["train"]
        print(f"\nResNet-50 bf16 channels_last, batch {args.batch}, {args.train_iters} steps, "
              f"median of {args.repeats} interleaved")  # fmt: skip
        print("| fed by | img/s | / resident | path |\n| --- | --- | --- | --- |")
        print(f"| resident batches | {t['resident']:,.0f} | 1.000 | |")
        for w, r in t["ways"].items():
            print(f"| PackLoader decode={w} | {r['img_s']:,.0f} | "
                  f"{r['img_s'] / t['resident']:.3f} | {r['path']} |")  # fmt: skip
        w, r = next(iter(t["ways"].items()))
        summary.append((
            f"ResNet-50 bf16 CL fed by the JPEG pack (decode={w}: {r['path']}) / resident",
            f"{r['img_s']:,.0f} / {t['resident']:,.0f}", ">= 0.98",
            f"{r['img_s'] / t['resident']:.3f}",
        ))  # fmt: skip
    if "build" in parts:
        res["build"] = build_rates(args, device, procs, res)
        dump(res, "bench_decoders.json")
        b = res["build"]
        if "warm_cuda_img_s" in b:
            summary.append(
                (
                    f"warm build --device cuda, {b['warm_images']} 640x480 -> 224² / {procs}-proc ceiling",
                    f"{b['warm_cuda_img_s']:,.0f} / {b['ceiling_img_s']:,.0f}",
                    ">= 4x",
                    f"{b['warm_cuda_img_s'] / b['ceiling_img_s']:.2f}x",
                )
            )
        f = b["fresh"]
        summary.append(
            (
                f"fresh-process build --device auto ({f['auto']['device']}) / --device cpu, {b['fresh_images']} images",
                f"{f['auto']['img_s']:,.0f} / {f['cpu']['img_s']:,.0f}",
                ">= 1.00",
                f"{f['auto']['img_s'] / f['cpu']['img_s']:.2f}",
            )
        )
        if "cuda" in f:
            summary.append(
                (
                    "  fresh-process build --device cuda / --device cpu",
                    f"{f['cuda']['img_s']:,.0f} / {f['cpu']['img_s']:,.0f}",
                    "",
                    f"{f['cuda']['img_s'] / f['cpu']['img_s']:.2f}",
                )
            )
    if summary:
        print(
            f"\nIssue 32 on {res['machine'].get('gpu', device)}, {procs} cores, every ratio against a baseline of this run"
        )
        print("| what | measured | target | ratio |")
        print("| --- | --- | --- | --- |")
        for row in summary:
            print("| " + " | ".join(row) + " |")
    res["summary"] = summary
    dump(res, "bench_decoders.json")


# ---------------------------------------------------------------- issue 32's parts


def roi_vs_pillow(
    decs: dict[str, DecoderBase], datas: list[torch.Tensor], boxes: torch.Tensor
) -> dict[str, float]:
    """Mean |diff| (levels) of each decoder's ROI crops against Pillow's decode, cropped."""
    hw = torch.tensor([[375, 500]] * len(datas))
    out: dict[str, float] = {}
    crops = {k: [c.cpu().numpy().astype(np.int16) for c in d.decode_rois(datas, boxes, sizes=hw)]
             for k, d in decs.items()}  # fmt: skip
    refs = [
        pillow(data)[:, t : t + h, l : l + w].astype(np.int16)
        for data, (t, l, h, w) in zip(datas, boxes.tolist())  # noqa: E741
    ]
    for k, cs in crops.items():
        out[k] = round(float(np.mean([np.abs(c - r).mean() for c, r in zip(cs, refs)])), 4)
        if "torchvision" in crops:  # what a split between k and torchvision mixes
            tv = crops["torchvision"]
            out[f"{k} vs torchvision"] = round(
                float(np.mean([np.abs(c - r).mean() for c, r in zip(cs, tv)])), 4
            )
    return out


def loader_ways(device: torch.device, cuda_only: bool = False) -> dict[str, Any]:
    """The ``decode=`` arguments compared, by label: "auto" (the default), each decoder
    by name, and on CUDA the lanes."""
    ways: dict[str, Any] = {"auto": "auto"}
    if device.type != "cuda":
        return {**ways, "device": "device", "cpu": "cpu"}
    for name in GPU_CHAIN:
        try:
            get_decoder(device, prefer=name)
        except UsageError:
            continue
        ways[name] = name
    ways.update(lane_ways(device, ways))
    if not cuda_only:
        ways["cpu"] = "cpu"
    return ways


def lane_ways(device: torch.device, names: dict[str, Any]) -> dict[str, Any]:
    """``decode=`` lists of several decoders (a batch each at once), by label: nvjpeg's
    batched decode (torchcodec, else torchvision) beside nvImageCodec's CUDA decoder,
    its engines, or both, and beside the other nvjpeg."""
    nvjpeg = next((k for k in ("torchcodec", "torchvision") if k in names), None)
    if nvjpeg is None:
        return {}
    ways: dict[str, Any] = {}
    if "nvimgcodec" in names:
        for b in ("hybrid", "hw", "hw+hybrid"):

            def lanes(b: str = b) -> list[Any]:
                nv = get_decoder(device, prefer="nvimgcodec", backends=b, pitched=True)
                return [nvjpeg, nv]

            ways[f"lanes {nvjpeg}+nvimgcodec({b})"] = lanes
    if "torchcodec" in names and "torchvision" in names:
        ways["lanes torchcodec+torchvision"] = ["torchcodec", "torchvision"]
    return ways


def _loader(pack: Path, device: torch.device, batch: int, way: Any, rows: torch.Tensor) -> Any:
    decode = way() if callable(way) else way
    return packer.PackLoader(
        pack, batch, device=device, image_size=224, decode=decode, indices=rows, drop_last=True
    )


def loader_rates(
    pack: Path,
    device: torch.device,
    batch: int,
    repeats: int,
    skip_cpu: bool = False,
    only: list[str] | None = None,
) -> dict[str, dict[str, Any]]:
    """PackLoader img/s over the JPEG pack for each way of :func:`loader_ways` (those
    in ``only``, if given), interleaved rounds, one pass each (the pack's rows 4 times:
    an epoch long enough to time)."""
    n = len(packer.load(pack))
    rows = torch.arange(n).repeat(4)
    loaders = {}
    for name, way in loader_ways(device, cuda_only=skip_cpu).items():
        if only is not None and name not in only:
            continue
        try:
            loaders[name] = _loader(pack, device, batch, way, rows)
        except UsageError as e:
            print(f"  loader decode={name}: not run ({e})", file=sys.stderr)
    for ld in loaders.values():  # warm-up: threads, decoder handles, ROI probe, kernels
        for i, _ in enumerate(ld):
            if i == 4:
                break
    rates: dict[str, list[float]] = {k: [] for k in loaders}
    for r in range(repeats):
        for k, ld in loaders.items():
            ld.set_epoch(r + 1)
            sync(device)
            t0 = time.perf_counter()
            got = sum(len(x) for x, _ in ld)
            sync(device)
            rates[k].append(got / (time.perf_counter() - t0))
    out = {}
    for k, ld in loaders.items():
        out[k] = {"img_s": round(statistics.median(rates[k]), 1), "min_img_s": round(min(rates[k]), 1),
                  "path": ld.decode_path, "repr": repr(ld)}  # fmt: skip
        ld.close()
    return out


def timed_steps(step: Any, norm: Any, feed: Any, iters: int, batch: int, device: Any) -> float:
    """img/s of ``iters`` training steps ``step(norm(x), y)`` on ``feed(i)``'s batches,
    the device synchronized before each clock read."""
    sync(device)
    t0 = time.perf_counter()
    for i in range(iters):
        x, y = feed(i)
        step(norm(x), y)
    sync(device)
    return batch * iters / (time.perf_counter() - t0)


def train_rates(
    pack: Path, device: torch.device, batch: int, iters: int, repeats: int, ways: list[str]
) -> dict[str, Any]:
    """ResNet-50 (bf16 autocast, channels_last, SGD) img/s on resident batches vs fed by
    PackLoader over the JPEG pack with each of ``ways`` (labels of :func:`loader_ways`;
    the first is the default), rounds interleaved; Normalize on the GPU every way."""
    from packer.measure.bench.loading import train_step

    step = train_step("resnet50", 1000, device)
    norm = packer.Normalize().to(device)
    n = len(packer.load(pack))
    known = loader_ways(device)
    rows = torch.arange(n).repeat(64)
    loaders = {w: _loader(pack, device, batch, known[w], rows) for w in ways if w in known}
    its = {w: iter(ld) for w, ld in loaders.items()}
    first = its[next(iter(its))]
    resident = [tuple(t.clone() for t in next(first)) for _ in range(8)]  # its crops, kept

    def run(feed) -> float:
        return timed_steps(step, norm, feed, iters, batch, device)

    for i in range(10):  # warm-up: cudnn's choices, the allocator, every loader started
        step(norm(resident[i % 8][0]), resident[i % 8][1])
        for it in its.values():
            x, y = next(it)
            if i < 2:
                step(norm(x), y)
    rates: dict[str, list[float]] = {"resident": [], **{w: [] for w in its}}
    for _ in range(repeats):
        rates["resident"].append(run(lambda i: resident[i % 8]))
        for w, it in its.items():
            rates[w].append(run(lambda i, it=it: next(it)))
    out: dict[str, Any] = {"iters": iters, "all": rates}
    out["resident"] = round(statistics.median(rates["resident"]), 1)
    out["ways"] = {
        w: {"img_s": round(statistics.median(rates[w]), 1), "path": loaders[w].decode_path}
        for w in its
    }
    for it in its.values():
        it.close()
    for ld in loaders.values():
        ld.close()
    return out


def _linked_set(root: Path, unique: Path, n: int) -> Path:
    """``n`` files under ``root``: the ``unique`` set's, then hard links to them."""
    files = sorted(unique.rglob("*.jpg"))
    for i in range(n):
        f = files[i % len(files)]
        d = root / f.parent.name
        d.mkdir(parents=True, exist_ok=True)
        os.link(f, d / f"{i:06d}.jpg")
    return root


def build_rates(
    args: argparse.Namespace, device: torch.device, procs: int, res: dict[str, Any]
) -> dict[str, Any]:
    """640x480 -> 224²: the ceiling, a warm GPU build, fresh-process builds (each figure
    saved in ``res["build"]`` as it comes)."""
    import packer.builder.gpu as gpu_build

    from .build import pixel_diff

    work = args.work / "b640"
    shutil.rmtree(work, ignore_errors=True)
    unique = work / "unique"
    make_set(unique, args.unique, (640, 480), procs)
    big = _linked_set(work / "big", unique, args.build_images)
    fresh = _linked_set(work / "fresh", unique, args.fresh_images)
    files = sorted(str(p) for p in fresh.rglob("*.jpg"))
    out: dict[str, Any] = {
        "unique": args.unique,
        "warm_images": args.build_images,
        "fresh_images": args.fresh_images,
    }
    res["build"] = out

    def save() -> None:
        dump(res, "bench_decoders.json")

    out["ceiling_img_s"] = round(resize_ceiling(files, procs, 224, 3), 1)
    save()
    print(f"  ceiling {out['ceiling_img_s']:,.0f} img/s", file=sys.stderr, flush=True)
    cfg = {"size": (224, 224)}
    if device.type == "cuda":
        small = _linked_set(work / "small", unique, 512)
        build(small, work / "warm_cpu", BuildConfig(**cfg))
        dst = work / "warm_gpu"
        build(small, dst, BuildConfig(**cfg, device="cuda"))  # warm-up, and its pixels
        out["warm_pixels_vs_cpu"] = pixel_diff(work / "warm_cpu", dst)
        dst = work / "out_gpu"
        os.sync()
        t0 = time.perf_counter()
        r = build(big, dst, BuildConfig(**cfg, device="cuda"))
        out["warm_cuda_img_s"] = round(r.count / (time.perf_counter() - t0), 1)
        out["warm_cuda_decoder"] = gpu_build.make_decoder(device).name
        shutil.rmtree(dst)
        print(f"  warm GPU build {out['warm_cuda_img_s']:,.0f} img/s", file=sys.stderr, flush=True)
        save()
    env = {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    ways = ["cpu", "auto"] + (["cuda"] if device.type == "cuda" else [])
    walls: dict[str, list[float]] = {w: [] for w in ways}
    used: dict[str, str] = {}
    for rnd in range(args.fresh_rounds):  # cpu and auto alternate; cuda once
        for way in ways if rnd == 0 else ways[:2]:
            dst = work / f"fresh_{way}"
            os.sync()
            r = lib_build(fresh, dst, 224, procs, env, way)
            m = json.loads((dst / "imgpack.json").read_text())
            walls[way].append(r["process_wall_s"])
            used[way] = m["build"].get("device", "cpu")
            shutil.rmtree(dst)
            print(
                f"  fresh {way}: {r['process_wall_s']:.2f} s on {used[way]}",
                file=sys.stderr,
                flush=True,
            )
            out["fresh_walls"] = walls
            save()
    out["fresh"] = {
        w: {"img_s": round(args.fresh_images / statistics.median(v), 1), "wall_s": [round(x, 2) for x in v], "device": used[w]}
        for w, v in walls.items()
    }  # fmt: skip
    return out


if __name__ == "__main__":
    main()
