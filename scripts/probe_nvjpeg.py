"""Where the batched GPU JPEG decode's time goes (issue 13): is it the decoder engines,
torchvision's host work around them, or the GIL between the decode and crop threads?

On ImageNet-like JPEGs (500x375, quality 90, ``make_jpeg_tree``), batch 256, CUDA:

1. ``decode_batch`` alone in one process: img/s, and the calling thread's CPU seconds
   per second of wall clock (torchvision holds one decoder per process, behind a mutex);
2. the same in P = 1, 2, 4 processes at once (each its own decoder): aggregate img/s.
   If P processes decode P times as fast, the engines were idle behind one process's
   serial host path;
3. decode a batch ahead + crop (``decode_ahead`` + ``resize_images``): img/s, time per
   batch in the decode call and in the crop, with Python's default GIL switch interval
   (5 ms) and with 0.5 ms;
4. the same decode-only on 64x48 JPEGs (host cost per image vs pixels).

    python scripts/probe_nvjpeg.py [--images 4096]      # needs CUDA; $OUT/probe_nvjpeg.json
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _datas(root: Path, n: int, size: tuple[int, int]) -> list:
    import torch

    from packer.bench.synth import make_jpeg_tree

    if not root.exists():
        make_jpeg_tree(root, n, size, quality=90)
    files = sorted(root.rglob("*.jpg"))
    return [torch.frombuffer(bytearray(f.read_bytes()), dtype=torch.uint8) for f in files]


def _decode_rate(datas: list, batch: int, seconds: float = 3.0) -> tuple[float, float]:
    import torch

    from packer.jpeg import decode_batch

    dev = torch.device("cuda")
    batches = [datas[i : i + batch] for i in range(0, len(datas) - batch + 1, batch)]
    decode_batch(batches[0], dev, ends_checked=True)
    torch.cuda.synchronize()
    n, t0, c0 = 0, time.perf_counter(), time.thread_time()
    while time.perf_counter() - t0 < seconds:
        for b in batches:
            n += len(decode_batch(b, dev, ends_checked=True))
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    return n / wall, (time.thread_time() - c0) / wall


def _proc(args: tuple) -> float:
    root, n, batch, barrier = args
    datas = _datas(Path(root), n, (500, 375))
    import torch

    from packer.jpeg import decode_batch

    decode_batch(datas[:batch], torch.device("cuda"), ends_checked=True)
    barrier.wait()
    return _decode_rate(datas, batch)[0]


def _procs(root: Path, n: int, batch: int, p: int) -> float:
    ctx = mp.get_context("spawn")
    barrier = ctx.Manager().Barrier(p)
    with ctx.Pool(p) as pool:
        return sum(pool.map(_proc, [(str(root), n, batch, barrier)] * p))


def _pipelined(datas: list, batch: int, interval: float) -> dict:
    import torch

    from packer.jpeg import decode_ahead, decode_batch, resize_images, sizes_of
    from packer.transforms import RandomHorizontalFlip, RandomResizedCrop

    old = sys.getswitchinterval()
    sys.setswitchinterval(interval)
    dev = torch.device("cuda")
    stream = torch.cuda.Stream(dev)
    rrc, flip = RandomResizedCrop(224), RandomHorizontalFlip()
    g = torch.Generator().manual_seed(0)
    batches = [datas[i : i + batch] for i in range(0, len(datas) - batch + 1, batch)]
    t_dec: list[float] = []
    t_crop: list[float] = []

    def dec(b: list) -> list:
        t = time.perf_counter()
        out = decode_batch(b, dev, ends_checked=True)
        t_dec.append(time.perf_counter() - t)
        return out

    def run() -> int:
        n = 0
        jobs = ((i, (lambda b=b: dec(b))) for i, b in enumerate(batches))
        for _, imgs in decode_ahead(jobs, dev, stream):
            t = time.perf_counter()
            with torch.cuda.stream(stream):
                s = sizes_of(imgs)
                boxes = rrc.sample_boxes(len(imgs), s[:, 0], s[:, 1], g)
                n += len(
                    resize_images(imgs, (224, 224), boxes=boxes, flip=flip.sample(len(imgs), g))
                )
            t_crop.append(time.perf_counter() - t)
        return n

    run()
    torch.cuda.synchronize()
    t_dec.clear()
    t_crop.clear()
    t0 = time.perf_counter()
    n = run() + run()
    torch.cuda.synchronize()
    rate = n / (time.perf_counter() - t0)
    sys.setswitchinterval(old)
    med = lambda v: sorted(v)[len(v) // 2] * 1e3  # noqa: E731
    return {"img_s": rate, "decode_ms": med(t_dec), "crop_ms": med(t_crop),
            "switch_ms": interval * 1e3}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--work", type=Path, default=Path("/tmp/imgpack-nvjpeg"))
    a = ap.parse_args()
    from _out import dump

    res: dict = {}
    root = a.work / "big"
    datas = _datas(root, a.images, (500, 375))
    rate, cpu = _decode_rate(datas, a.batch)
    res["decode_1proc"] = {"img_s": rate, "thread_cpu_per_wall": cpu}
    print(
        f"decode only, 1 process: {rate:,.0f} img/s, calling thread CPU {cpu:.2f} s/s", flush=True
    )
    res["pipelined"] = [_pipelined(datas, a.batch, iv) for iv in (0.005, 0.0005)]
    for r in res["pipelined"]:
        print(f"decode ahead + crop, switch {r['switch_ms']} ms: {r['img_s']:,.0f} img/s; "
              f"per batch decode {r['decode_ms']:.1f} ms, crop {r['crop_ms']:.1f} ms", flush=True)  # fmt: skip
    small = _datas(a.work / "small", 2048, (64, 48))
    res["decode_64x48"] = _decode_rate(small, a.batch)[0]
    print(f"decode only, 64x48 JPEGs: {res['decode_64x48']:,.0f} img/s", flush=True)
    del datas
    res["procs"] = {}
    for p in (1, 2, 4):
        res["procs"][p] = _procs(root, a.images, a.batch, p)
        print(f"decode only, {p} processes at once: {res['procs'][p]:,.0f} img/s total", flush=True)
    dump(res, "probe_nvjpeg.json")


if __name__ == "__main__":
    main()
