"""JPEG packs (issue 13) and the GPU build (issue 18 §2), each next to its baseline.

All in one run, on ImageNet-like JPEGs (about 500x375, quality 90, photo-like, from
``packer.measure.bench.synth.make_jpeg_tree``):

1. decode + RandomResizedCrop + flip to 224², batch 256: ``packer.imaging.jpeg`` on the device
   (nvjpeg, one batched resize) vs the CPU ceiling: N processes of Pillow decode +
   RandomResizedCrop-like crop + resize (N = every core);
2. PackLoader over the JPEG pack (the same, through the loader);
3. bytes on disk: JPEG pack vs raw pack of the same images at 256²;
4. build img/s: ``imgpack build --device cuda`` vs ``--device cpu`` (all workers);
5. cold-cache streaming (``echo 3 > /proc/sys/vm/drop_caches``, root only): raw pack
   at 224² and JPEG pack, img/s and MB/s read, first pass after the drop.

Prints a table; writes ``$OUT/bench_jpeg.json``.

    python -m benchmarks.jpeg [--images 4096] [--quick] [--work /tmp/imgpack-jpeg]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import multiprocessing as mp
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

import packer
from packer.builder.api import BuildConfig, build
from packer.imaging.jpeg import decode_ahead, decode_batch, resize_images, sizes_of
from packer.measure.bench.synth import make_jpeg_tree
from packer.measure.timing import median_rate, resolve_device, sync
from packer.pack.describe import pack_bytes
from packer.transforms import RandomHorizontalFlip, RandomResizedCrop

from ._common import dump, machine

CPU = torch.device("cpu")


# ---------------------------------------------------------------- the CPU ceiling


def _pil_rrc(files: list[str]) -> int:
    """Pillow decode + a random crop resized to 224 + flip, one image at a time."""
    rng = random.Random(0)
    for f in files:
        with Image.open(f) as im:
            im = im.convert("RGB")
            w, h = im.size
            s = rng.uniform(0.35, 1.0)  # sqrt of the area fraction, about RRC's mean
            cw, ch = max(1, int(w * s)), max(1, int(h * s))
            x, y = rng.randint(0, w - cw), rng.randint(0, h - ch)
            out = im.resize((224, 224), Image.Resampling.BILINEAR, box=(x, y, x + cw, y + ch))
            if rng.random() < 0.5:
                out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            np.asarray(out)
    return len(files)


def _ready(_: int) -> int:
    return os.getpid()


def cpu_ceiling(files: list[str], procs: int, per_proc: int, repeats: int) -> float:
    slices = [files[(i * per_proc) % len(files) :][:per_proc] for i in range(procs)]
    slices = [s if len(s) == per_proc else (s + files)[:per_proc] for s in slices]
    with mp.get_context("forkserver").Pool(procs) as pool:
        pool.map(_ready, range(procs * 4), chunksize=1)
        return median_rate(lambda: sum(pool.map(_pil_rrc, slices, chunksize=1)), CPU, repeats)


# ---------------------------------------------------------------- the device path


def device_rrc(
    datas: list[torch.Tensor], device: torch.device, batch: int, repeats: int, pipelined: bool
) -> float:
    """packer.imaging.jpeg: decode a batch on ``device``, RRC boxes per image, flip, one resize
    (``resize_images``: on CUDA one kernel reading each image in place). ``pipelined``:
    the decodes run a batch ahead on their own thread (``decode_ahead``, as PackLoader
    does), else decode and crop alternate on one thread."""
    rrc, flip = RandomResizedCrop(224), RandomHorizontalFlip()
    gen = torch.Generator().manual_seed(0)
    pool = None
    if device.type == "cpu":
        from concurrent.futures import ThreadPoolExecutor

        pool = ThreadPoolExecutor(os.cpu_count() or 1)
    batches = [datas[i : i + batch] for i in range(0, len(datas) - batch + 1, batch)]
    stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def crop(imgs: list[torch.Tensor]) -> int:
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            sizes = sizes_of(imgs)
            boxes = rrc.sample_boxes(len(imgs), sizes[:, 0], sizes[:, 1], gen)
            out = resize_images(imgs, (224, 224), boxes=boxes, flip=flip.sample(len(imgs), gen))
            return len(out)

    # every file ends with its end marker (checked once here; the loader checks a batch
    # at once on its producer thread), so the decoder thread only decodes, as there
    assert all(bytes(d[-2:].numpy()) == b"\xff\xd9" for d in datas)
    kw = {"pool": pool, "ends_checked": True}

    def run() -> int:
        if not pipelined:
            return sum(crop(decode_batch(b, device, **kw)) for b in batches)
        jobs = (
            (i, functools.partial(decode_batch, b, device, **kw)) for i, b in enumerate(batches)
        )
        return sum(crop(imgs) for _, imgs in decode_ahead(jobs, device, stream))

    crop(decode_batch(batches[0], device, **kw))  # warm-up: nvjpeg handles, Triton
    sync(device)
    return median_rate(run, device, repeats)


def decode_only(datas: list[torch.Tensor], device: torch.device, batch: int, repeats: int) -> float:
    """Where the time goes: ``decode_batch`` alone, one call per ``batch`` images."""
    batches = [datas[i : i + batch] for i in range(0, len(datas) - batch + 1, batch)]
    decode_batch(batches[0], device, ends_checked=True)
    sync(device)
    return median_rate(
        lambda: sum(len(decode_batch(b, device, ends_checked=True)) for b in batches),
        device,
        repeats,
    )


def loader_rate(
    path: Path, device: torch.device, batch: int, repeats: int, decode: str = "auto"
) -> float:
    ld = packer.PackLoader(path, batch, device=device, image_size=224, train=True, decode=decode)
    for _ in ld:  # one pass off the clock: threads, pinned buffers, kernels
        pass

    def run() -> int:
        n = 0
        for x, _ in ld:
            n += len(x)
        return n

    rate = median_rate(run, device, repeats)
    ld.close()
    return rate


# ---------------------------------------------------------------- cold cache


def drop_caches() -> bool:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def cold_stream(path: Path, device: torch.device, batch: int, jpeg: bool) -> dict[str, Any]:
    dropped = drop_caches()
    kw = {"image_size": 224, "train": True} if jpeg else {}
    ld = packer.PackLoader(path, batch, device=device, **kw)
    sync(device)
    t0 = time.perf_counter()
    n = sum(len(x) for x, _ in ld)
    sync(device)
    dt = time.perf_counter() - t0
    ld.close()
    size = pack_bytes(path)
    return {
        "dropped": dropped,
        "images_per_s": round(n / dt, 1),
        "mb_per_s_read": round(size / dt / 1e6, 1),
    }


# ---------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--quick", action="store_true", help="a small CPU-sized run")
    ap.add_argument("--work", type=Path, default=Path("/tmp/imgpack-jpeg"))
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()
    if args.quick:
        args.images, args.batch = 128, 32
    repeats = 1 if args.quick else 3
    device = resolve_device(args.device)
    cores = len(os.sched_getaffinity(0))
    shutil.rmtree(args.work, ignore_errors=True)
    src = args.work / "src"
    make_jpeg_tree(src, args.images, (500, 375), quality=90)
    files = sorted(str(p) for p in src.rglob("*.jpg"))
    datas = [torch.frombuffer(bytearray(Path(f).read_bytes()), dtype=torch.uint8) for f in files]
    res: dict[str, Any] = {"machine": machine(), "images": len(files), "batch": args.batch}

    per_proc = max(8, len(files) // cores)
    res["cpu_ceiling_rrc_img_s"] = cpu_ceiling(files, cores, per_proc, repeats)
    res["cpu_procs"] = cores
    res["device_rrc_serial_img_s"] = device_rrc(datas, device, args.batch, repeats, False)
    res["device_rrc_img_s"] = device_rrc(datas, device, args.batch, repeats, True)
    res["device_decode_only_img_s"] = decode_only(datas, device, args.batch, repeats)
    res["device_decode_only_512_img_s"] = decode_only(datas, device, 2 * args.batch, repeats)

    jp = args.work / "jpeg_pack"
    t0 = time.perf_counter()
    build(src, jp, BuildConfig(store="jpeg"))
    res["jpeg_build_s"] = round(time.perf_counter() - t0, 2)
    res["loader_jpeg_img_s"] = loader_rate(jp, device, args.batch, repeats)
    res["loader_jpeg_pil_img_s"] = loader_rate(jp, device, args.batch, repeats, "cpu")
    cpu = torch.device("cpu")  # a CPU user's loader: image by image vs the batched way
    res["cpu_loader_pil_img_s"] = loader_rate(jp, cpu, args.batch, repeats, "cpu")
    res["cpu_loader_batched_img_s"] = loader_rate(jp, cpu, args.batch, repeats, "device")

    raw256 = args.work / "raw256"
    t0 = time.perf_counter()
    build(src, raw256, BuildConfig(size=(256, 256)))
    cpu_s = time.perf_counter() - t0
    res["build_cpu_img_s"] = round(len(files) / cpu_s, 1)
    res["bytes_jpeg_pack"] = pack_bytes(jp)
    res["bytes_raw_pack_256"] = pack_bytes(raw256)
    res["jpeg_over_raw_256"] = round(res["bytes_jpeg_pack"] / res["bytes_raw_pack_256"], 4)
    if device.type == "cuda":
        # one-time costs off the clock (CUDA context, nvjpeg handles, the Triton kernel
        # for this size): a small GPU build first, timed on its own
        warm = args.work / "warm_src"
        make_jpeg_tree(warm, 64, (500, 375), quality=90)
        t0 = time.perf_counter()
        build(warm, args.work / "warm_pack", BuildConfig(size=(256, 256), device="cuda"))
        res["build_gpu_warmup_s"] = round(time.perf_counter() - t0, 2)
        gpu = args.work / "raw256_gpu"
        t0 = time.perf_counter()
        build(src, gpu, BuildConfig(size=(256, 256), device="cuda"))
        res["build_gpu_img_s"] = round(len(files) / (time.perf_counter() - t0), 1)
        a, b = packer.load(raw256).images, packer.load(gpu).images
        d = (a.int() - b.int()).abs().float()
        res["gpu_vs_cpu_mean_abs"] = round(float(d.mean()), 3)
        res["gpu_vs_cpu_p99_abs"] = float(d.flatten()[:16_000_000].quantile(0.99))
        shutil.rmtree(gpu)
    raw224 = args.work / "raw224"
    build(src, raw224, BuildConfig(size=(224, 224)))
    res["cold_raw_224"] = cold_stream(raw224, device, args.batch, jpeg=False)
    res["cold_jpeg"] = cold_stream(jp, device, args.batch, jpeg=True)

    ceil = res["cpu_ceiling_rrc_img_s"]
    rows = [
        ("CPU ceiling: Pillow decode+RRC+flip", f"{ceil:,.0f} img/s", f"{cores} procs"),
        (
            f"packer.imaging.jpeg on {device.type}: decode+RRC+flip, decode a batch ahead",
            f"{res['device_rrc_img_s']:,.0f} img/s",
            f"{res['device_rrc_img_s'] / ceil:.2f}x ceiling",
        ),
        (
            "  the same, decode and crop on one thread",
            f"{res['device_rrc_serial_img_s']:,.0f} img/s",
            f"{res['device_rrc_serial_img_s'] / ceil:.2f}x ceiling",
        ),
        (
            "PackLoader, JPEG pack, train crops (decode='auto')",
            f"{res['loader_jpeg_img_s']:,.0f} img/s",
            f"{res['loader_jpeg_img_s'] / ceil:.2f}x ceiling",
        ),
        (
            f"  the same with decode='cpu' (image by image on the threads), to {device.type}",
            f"{res['loader_jpeg_pil_img_s']:,.0f} img/s",
            f"{res['loader_jpeg_pil_img_s'] / ceil:.2f}x ceiling",
        ),
        (
            "PackLoader to the CPU: image by image / batched decode + padded crop",
            f"{res['cpu_loader_pil_img_s']:,.0f} / {res['cpu_loader_batched_img_s']:,.0f} img/s",
            f"{res['cpu_loader_pil_img_s'] / res['cpu_loader_batched_img_s']:.2f}x",
        ),
        (
            "bytes: JPEG pack / raw pack 256²",
            f"{res['bytes_jpeg_pack'] / 1e6:,.1f} / {res['bytes_raw_pack_256'] / 1e6:,.1f} MB",
            f"{res['jpeg_over_raw_256']:.3f}",
        ),
        (
            "  decode_batch alone, 256 / 512 per call",
            f"{res['device_decode_only_img_s']:,.0f} / "
            f"{res['device_decode_only_512_img_s']:,.0f} img/s",
            "",
        ),
        ("build 256², CPU workers", f"{res['build_cpu_img_s']:,.0f} img/s", ""),
    ]
    if "build_gpu_img_s" in res:
        rows.append(
            (
                "build 256², --device cuda",
                f"{res['build_gpu_img_s']:,.0f} img/s",
                f"{res['build_gpu_img_s'] / res['build_cpu_img_s']:.2f}x CPU build, "
                f"mean |diff| {res['gpu_vs_cpu_mean_abs']}",
            )
        )
    for k in ("cold_raw_224", "cold_jpeg"):
        c = res[k]
        rows.append(
            (
                f"cold cache stream {k[5:]}",
                f"{c['images_per_s']:,.0f} img/s",
                f"{c['mb_per_s_read']:,.0f} MB/s read"
                + ("" if c["dropped"] else " (cache NOT dropped)"),
            )
        )
    w = max(len(r[0]) for r in rows)
    for a, b, c in rows:
        print(f"{a:<{w}}  {b:>22}  {c}")
    dump(res, "bench_jpeg.json")


if __name__ == "__main__":
    main()
