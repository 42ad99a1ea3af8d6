"""Can the GPU gather a batch's rows straight out of the page-cached pack?

The streaming loader copies rows on the CPU (8 threads, np.take into pinned memory)
and then to the device. Here the pack's mapping itself is registered with CUDA
(``cudaHostRegister``, mapped, read-only: its page-cache pages are locked in RAM and
visible to the GPU) and a GPU kernel reads each batch's rows over the bus into device
memory: no CPU copy, no pinned staging buffer, no GIL per row. Measured in one
process, min of 3 runs each:

* the CPU gather limit (8 threads np.take into pinned memory) and PackLoader
  (the default threads) at batch 128 / 256 / 1024, as in probe_stream.py;
* the zero-copy gather: ``torch.index_select`` on a CUDA view of the registered
  mapping (int64 / complex128 elements), a Triton copy kernel with a program per
  (row, block), and packer's own kernel (``packer._rows_triton``, persistent programs);
* the same zero-copy gather beside a busy GPU (a bf16 matmul loop on another stream).

    python scripts/probe_zero_copy.py --pack PACK
"""

from __future__ import annotations

import argparse
import json
import mmap
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import torch
import triton
import triton.language as tl

from packer._device_gather import _Ptr
from packer._rows_triton import _copy_rows_kernel

DEV = torch.device("cuda")


class _CAI:
    def __init__(self, ptr: int, shape: tuple[int, ...], typestr: str) -> None:
        self.__cuda_array_interface__ = {
            "shape": shape, "typestr": typestr, "data": (ptr, True), "version": 2,
            "strides": None,
        }  # fmt: skip


@triton.jit
def _rows_kernel(src, idx, dst, ROW: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    c = tl.program_id(1)
    r = tl.load(idx + b).to(tl.int64)
    offs = c * BLOCK + tl.arange(0, BLOCK)
    m = offs < ROW
    x = tl.load(src + r * ROW + offs, mask=m)
    tl.store(dst + b.to(tl.int64) * ROW + offs, x, mask=m)


def persistent_gather(
    ptr: int, row_words: int, idx: torch.Tensor, out: torch.Tensor,
    programs: int, block: int = 4096, warps: int = 4,
) -> None:  # fmt: skip
    """packer's own row-copy kernel (``_rows_triton``) with ``programs`` programs."""
    chunks = triton.cdiv(row_words, block)
    _copy_rows_kernel[(programs,)](_Ptr(ptr, torch.int32), idx, out, len(idx), ROW=row_words,
                                   BLOCK=block, CHUNKS=chunks, num_warps=warps)  # fmt: skip


def triton_gather(ptr: int, row_words: int, idx: torch.Tensor, out: torch.Tensor) -> None:
    block = 4096
    grid = (len(idx), triton.cdiv(row_words, block))
    _rows_kernel[grid](_Ptr(ptr, torch.int32), idx, out, ROW=row_words, BLOCK=block)


def zc_rate(fn: Any, n: int, bs: int, outs: list[torch.Tensor], seconds: float = 1.0) -> float:
    """img/s of ``fn(idx, out)`` on a side stream, 4 outputs in rotation, min of 3."""
    gen = torch.Generator(device=DEV).manual_seed(0)
    stream = torch.cuda.Stream()
    rates = []
    with torch.cuda.stream(stream):
        for i in range(10):
            fn(torch.randint(0, n, (bs,), device=DEV, generator=gen), outs[i % len(outs)])
        stream.synchronize()
        for _ in range(3):
            k, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                idx = torch.randint(0, n, (bs,), device=DEV, generator=gen)
                fn(idx, outs[k % len(outs)])
                k += 1
                if k % 16 == 0:
                    stream.synchronize()
            stream.synchronize()
            rates.append(k * bs / (time.perf_counter() - t0))
    return min(rates)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pack", required=True)
    args = ap.parse_args()
    import probe_stream as P

    import packer

    out: dict[str, Any] = {}
    pack = packer.load(args.pack)
    path = Path(args.pack) / "_tensordict" / "images.memmap"
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass
    torch.zeros(1, device=DEV)
    n = len(pack)
    shape = tuple(pack.images.shape[1:])
    row = int(np.prod(shape))
    src = pack.images.numpy().reshape(n, row)
    dst = torch.empty(1024 * row, dtype=torch.uint8, pin_memory=True).numpy()
    out["limit_8t"] = P.limit(src, dst, 8, 1024)
    print(f"limit 8t {out['limit_8t']:,.0f}", flush=True)

    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    arr = np.frombuffer(mm, np.uint8)
    ptr = arr.ctypes.data
    t0 = time.perf_counter()
    rc = torch.cuda.cudart().cudaHostRegister(ptr, len(arr), 2 | 8)  # Mapped | ReadOnly
    out["register_s"] = time.perf_counter() - t0
    out["register_rc"] = int(rc)
    print(f"cudaHostRegister of {len(arr) / 1e9:.2f} GB: rc {int(rc)} in {out['register_s']:.2f} s",
          flush=True)  # fmt: skip
    if int(rc) != 0:
        print(json.dumps(out))
        return
    views: dict[str, Any] = {}
    for name, typestr, dt, size in (("int64", "<i8", torch.int64, 8),
                                    ("complex128", "<c16", torch.complex128, 16)):  # fmt: skip
        try:
            views[name] = (
                torch.as_tensor(_CAI(ptr, (n, row // size), typestr), device=DEV),
                dt,
                size,
            )
        except Exception as e:
            out[f"view_{name}"] = repr(e)
            print(f"view {name}: {e!r}", flush=True)
    results: dict[str, Any] = {}
    check_idx = torch.randint(0, n, (64,), device=DEV)
    want = pack.images[check_idx.cpu()].reshape(64, row)
    for bs in (128, 256, 1024):
        r: dict[str, float] = {}
        r["loader"] = P.loader_runs(pack, bs, None, "default")["min"]
        for name, (view, dt, size) in views.items():
            outs = [torch.empty(bs, row // size, dtype=dt, device=DEV) for _ in range(4)]

            def fn(idx: torch.Tensor, o: torch.Tensor, view: Any = view) -> None:
                torch.index_select(view, 0, idx, out=o)

            r[f"index_select_{name}"] = zc_rate(fn, n, bs, outs)
            got = torch.index_select(view, 0, check_idx).view(torch.uint8).cpu()
            assert torch.equal(got, want), f"{name}: rows differ"
        outs = [torch.empty(bs, row // 4, dtype=torch.int32, device=DEV) for _ in range(4)]
        r["triton16B"] = zc_rate(lambda idx, o: triton_gather(ptr, row // 4, idx, o), n, bs, outs)
        o = torch.empty(64, row // 4, dtype=torch.int32, device=DEV)
        triton_gather(ptr, row // 4, check_idx, o)
        assert torch.equal(o.view(torch.uint8).cpu(), want), "triton: rows differ"
        results[f"bs{bs}"] = r
        print(f"bs {bs}: " + ", ".join(f"{k} {v:,.0f}" for k, v in r.items()), flush=True)
    # kernel shapes: the full grid, or a few persistent programs (fewer SMs held)
    kernels: dict[str, Any] = {
        "grid": lambda idx, o: triton_gather(ptr, row // 4, idx, o),
        "persist16": lambda idx, o: persistent_gather(ptr, row // 4, idx, o, 16),
        "persist32": lambda idx, o: persistent_gather(ptr, row // 4, idx, o, 32),
        "persist64": lambda idx, o: persistent_gather(ptr, row // 4, idx, o, 64),
        "persist32w8": lambda idx, o: persistent_gather(ptr, row // 4, idx, o, 32, 8192, 8),
    }
    outs = [torch.empty(256, row // 4, dtype=torch.int32, device=DEV) for _ in range(4)]
    for name, fn in kernels.items():
        fn(check_idx, outs[0][:64])
        assert torch.equal(outs[0][:64].view(torch.uint8).cpu(), want), f"{name}: rows differ"
        results[f"alone_{name}"] = zc_rate(fn, n, 256, outs)
        print(f"{name}: alone bs256 {results[f'alone_{name}']:,.0f}", flush=True)
    # beside a busy GPU: a bf16 matmul loop on one stream, a batch of 256 gathered on
    # another every `every` matmuls (every 0: as fast as it goes)
    a = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    mstream, gstream = torch.cuda.Stream(), torch.cuda.Stream()

    def mm_rate(gather: Any = None, every: int = 0, seconds: float = 1.5) -> tuple[float, float]:
        t0 = time.perf_counter()
        k = g = 0
        while time.perf_counter() - t0 < seconds:
            with torch.cuda.stream(mstream):
                a @ a
            k += 1
            if gather is not None and (every == 0 or k % every == 0):
                with torch.cuda.stream(gstream):
                    for _ in range(2 if every == 0 else 1):
                        idx = torch.randint(0, n, (256,), device=DEV)
                        gather(idx, outs[g % 4])
                        g += 1
            if k % 8 == 0:
                mstream.synchronize()
                gstream.synchronize()
        mstream.synchronize()
        gstream.synchronize()
        dt = time.perf_counter() - t0
        return k / dt, g * 256 / dt

    mm_rate(seconds=0.5)
    alone = mm_rate()[0]
    results["matmul_alone"] = alone
    print(f"matmul/s alone {alone:.1f}", flush=True)
    for name, fn in kernels.items():
        for every in (0, 6):
            m, gr = mm_rate(fn, every)
            results[f"busy_{name}_every{every}"] = {"matmul_per_s": m, "gather_img_s": gr}
            print(f"{name} every {every}: matmul/s {m:.1f} ({m / alone:.1%} of alone), "
                  f"gather {gr:,.0f} img/s", flush=True)  # fmt: skip
    torch.cuda.cudart().cudaHostUnregister(ptr)
    out["results"] = results
    print(json.dumps(out, indent=1))
    lim = out["limit_8t"]
    print(f"\n| batch | PackLoader | zero-copy: index_select int64 / complex128 | Triton 16 B "
          f"| (% of the 8-thread CPU limit {lim:,.0f}) |")  # fmt: skip
    print("|---|---|---|---|---|")
    for bs in (128, 256, 1024):
        r = results[f"bs{bs}"]
        zs = " / ".join(f"{r[k]:,.0f} ({r[k] / lim:.0%})" for k in r if k.startswith("index"))
        print(f"| {bs} | {r['loader']:,.0f} ({r['loader'] / lim:.0%}) | {zs} | "
              f"{r['triton16B']:,.0f} ({r['triton16B'] / lim:.0%}) | |")  # fmt: skip


if __name__ == "__main__":
    main()
