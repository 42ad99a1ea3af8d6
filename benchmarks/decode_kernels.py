"""What a batched GPU JPEG decode (and the loader's crop after it) runs on the SMs (issue 32: the ResNet-50 fed by a JPEG
pack loses ~2% to the loader's GPU work, half of it nvjpeg's colour-conversion kernel).

Per way, one batch of ``--batch`` JPEGs (~500x375 q90, as the loader's benchmarks) decoded
``--batches`` times under ``torch.profiler``: the CUDA kernels' summed time per batch by
name, the copies, and the batch's wall time. Ways: torchcodec and torchvision (planar RGB
out of nvjpeg), nvImageCodec's engines with planar (``P_RGB``, imgpack's) or interleaved
(``I_RGB``) output, and its CUDA decoder likewise.

    python -m benchmarks.decode_kernels --device cuda [--images 512] [--batch 256]

Prints a table; writes ``$OUT/bench_decode_kernels.json``.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path
from typing import Any

import torch

from packer.measure.timing import resolve_device

from ._common import dump, machine
from .build import make_set


def _ways(device: torch.device) -> dict[str, Any]:
    """label -> decode(list of uint8 tensors) -> list of CUDA tensors."""
    from packer.imaging.decoders import get_decoder
    from packer.imaging.decoders_nvimgcodec import import_nvimgcodec

    ways: dict[str, Any] = {}
    for name in ("torchcodec", "torchvision"):
        try:
            dec = get_decoder(device, prefer=name)
        except Exception as e:
            print(f"  {name}: not run ({str(e)[:80]})", file=sys.stderr)
            continue
        ways[f"{name} (planar)"] = lambda datas, dec=dec: dec._decode(
            datas, list(range(len(datas)))
        )
    try:
        nv = import_nvimgcodec()
    except Exception as e:
        print(f"  nvimgcodec: not run ({str(e)[:80]})", file=sys.stderr)
        return ways
    dev = device.index if device.index is not None else torch.cuda.current_device()
    backends = {
        "engines": [nv.Backend(nv.HW_GPU_ONLY)],
        "cuda decoder": [nv.Backend(nv.HYBRID_CPU_GPU)],
    }
    for bname, b in backends.items():
        decoder = nv.Decoder(device_id=dev, backends=b)
        for fmt_name, fmt in (("planar", nv.P_RGB), ("interleaved", nv.I_RGB)):
            params = nv.DecodeParams(
                apply_exif_orientation=False, color_spec=nv.SRGB, sample_format=fmt
            )

            def run(datas: list, decoder: Any = decoder, params: Any = params) -> list:
                streams = [nv.CodeStream(d.numpy()) for d in datas]
                s = torch.cuda.current_stream(device).cuda_stream
                out = decoder.decode(streams, params=params, cuda_stream=s)
                return [torch.from_dlpack(x) for x in out]

            ways[f"nvimgcodec {bname} ({fmt_name})"] = run
    return ways


def kernels(fn: Any, batches: int) -> dict[str, Any]:
    """``fn()`` ``batches`` times under the profiler: per batch the kernels' ms by name
    (top 6), all kernels' ms, the copies' ms, and the wall ms."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(batches):
            fn()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    by: dict[str, float] = collections.defaultdict(float)
    copies = 0.0
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        if "memcpy" in e.name.lower() or "memset" in e.name.lower():
            copies += us
        else:
            by[e.name[:60]] += us
    top = sorted(by.items(), key=lambda kv: -kv[1])[:6]
    return {
        "kernels_ms": round(sum(by.values()) / batches / 1e3, 3),
        "copies_ms": round(copies / batches / 1e3, 3),
        "wall_ms": round(wall / batches * 1e3, 2),
        "top": [(k, round(v / batches / 1e3, 3)) for k, v in top],
    }


def crop_time(device: torch.device, datas: list) -> dict[str, Any]:
    """The JPEG loader's crop (RandomResizedCrop 224 + flip, the ragged kernel in slices)
    of one decoded batch: its kernels' GPU time per batch."""
    import packer.transforms as T
    from packer.imaging.decoders_split import best_decoder
    from packer.imaging.jpeg import resize_images, sizes_of

    imgs = best_decoder(device).decode(datas)
    sizes = sizes_of(imgs)
    g = torch.Generator().manual_seed(0)
    boxes = T.RandomResizedCrop(224).sample_boxes(len(imgs), sizes[:, 0], sizes[:, 1], g)
    flip = torch.rand(len(imgs), generator=g) < 0.5
    for _ in range(3):
        resize_images(imgs, (224, 224), boxes=boxes, flip=flip)
    return kernels(lambda: resize_images(imgs, (224, 224), boxes=boxes, flip=flip), 8)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--work", type=Path, default=Path("/tmp/imgpack-kernels"))
    args = ap.parse_args()
    device = resolve_device(args.device)
    if device.type != "cuda":
        sys.exit("decode_kernels.py profiles GPU decoders: run it with --device cuda on a GPU")
    make_set(args.work, args.images, (500, 375), 8)
    files = sorted(args.work.rglob("*.jpg"))[: args.batch]
    datas = [torch.frombuffer(bytearray(f.read_bytes()), dtype=torch.uint8) for f in files]
    res: dict[str, Any] = {"machine": machine(), "batch": len(datas), "ways": {}}
    for label, fn in _ways(device).items():
        try:
            for _ in range(3):  # warm-up: handles, pools
                fn(datas)
            res["ways"][label] = kernels(lambda fn=fn: fn(datas), args.batches)
        except Exception as e:
            res["ways"][label] = {"error": str(e)[:200]}
        dump(res, "bench_decode_kernels.json")
    res["crop"] = crop = crop_time(device, datas)
    dump(res, "bench_decode_kernels.json")
    print(f"\nGPU time of one batched decode of {len(datas)} JPEGs ~500x375, {res['machine']}")
    print(
        "| way | kernels ms | copies ms | wall ms | top kernels (ms) |\n| --- | --- | --- | --- | --- |"
    )
    for label, r in res["ways"].items():
        if "error" in r:
            print(f"| {label} | failed: {r['error'][:80]} | | | |")
            continue
        top = "; ".join(f"{k} {v}" for k, v in r["top"])
        print(f"| {label} | {r['kernels_ms']} | {r['copies_ms']} | {r['wall_ms']} | {top} |")
    print(
        f"\nThe loader's crop of that batch (RRC 224 + flip): kernels {crop['kernels_ms']} ms, "
        f"wall {crop['wall_ms']} ms"
    )


if __name__ == "__main__":
    main()
