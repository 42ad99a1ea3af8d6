"""Where does a short epoch's time go? PackLoader to CUDA on a small and a large pack.

    python scripts/diag_epoch.py

Prints, per pack size and batch size: img/s over many epochs, and for one epoch
the time of iter(), of the first batch, and of the rest.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import packer
from _synth import make_random_pack


def rate(ld: packer.PackLoader, norm: torch.nn.Module, epochs: int = 8) -> float:
    for x, _ in ld:
        norm(x)
    torch.cuda.synchronize()
    t0, k = time.perf_counter(), 0
    for _ in range(epochs):
        for x, _ in ld:
            norm(x)
            k += len(x)
    torch.cuda.synchronize()
    return k / (time.perf_counter() - t0)


def after_big_buffers() -> None:
    """PackLoader before and after multi-GB pinned/device buffers were made and freed."""
    norm = packer.Normalize().cuda()
    path = Path("/tmp/imgpack-bench/diag2048")
    if not path.exists():
        make_random_pack(path, 2048, 224)
    pack = packer.load(path)
    print(f"fresh: {rate(packer.PackLoader(pack, 256, device='cuda', drop_last=True), norm):,.0f}")
    for what in ("pinned", "device", "pageable"):
        for gb in (0.5, 1, 2, 4):
            n = int(gb * (1 << 30))
            if what == "pinned":
                t = torch.empty(n, dtype=torch.uint8, pin_memory=True)
            elif what == "device":
                t = torch.empty(n, dtype=torch.uint8, device="cuda")
            else:
                t = torch.empty(n, dtype=torch.uint8).fill_(1)
            del t
        r = rate(packer.PackLoader(pack, 256, device="cuda", drop_last=True), norm)
        print(f"after {what} buffers of 0.5-4 GB were freed: {r:,.0f}", flush=True)
    torch.cuda.empty_cache()
    if hasattr(torch._C, "_host_emptyCache"):
        torch._C._host_emptyCache()
    r = rate(packer.PackLoader(pack, 256, device="cuda", drop_last=True), norm)
    print(f"after emptying both caches: {r:,.0f}", flush=True)


def main() -> None:
    if "--after-big" in sys.argv:
        after_big_buffers()
        return
    norm = packer.Normalize().cuda()
    for n in (2048, 51200):
        path = Path(f"/tmp/imgpack-bench/diag{n}")
        if not path.exists():
            make_random_pack(path, n, 224)
        pack = packer.load(path)
        for bs in (64, 256):
            ld = packer.PackLoader(pack, bs, device="cuda", drop_last=True)
            for x, _ in ld:
                norm(x)
            epochs = max(2, 16384 // n)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            k = 0
            for _ in range(epochs):
                for x, _ in ld:
                    norm(x)
                    k += len(x)
            torch.cuda.synchronize()
            rate = k / (time.perf_counter() - t0)
            parts = []
            for _ in range(5):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                it = iter(ld)
                t1 = time.perf_counter()
                x, _ = next(it)
                norm(x)
                torch.cuda.synchronize()
                t2 = time.perf_counter()
                for x, _ in it:
                    norm(x)
                torch.cuda.synchronize()
                t3 = time.perf_counter()
                parts.append((t1 - t0, t2 - t1, t3 - t2, len(ld) - 1))
            med = [statistics.median(p[i] for p in parts) for i in range(3)]
            print(
                f"pack {n:>6} batch {bs:>4}: {rate:>9,.0f} img/s; one epoch: iter() "
                f"{med[0] * 1e3:.2f} ms, first batch {med[1] * 1e3:.2f} ms, other "
                f"{parts[0][3]} batches {med[2] * 1e3:.2f} ms "
                f"({parts[0][3] * bs / med[2]:,.0f} img/s)",
                flush=True,
            )
            ld.close()


if __name__ == "__main__":
    main()
