"""The transfer experiment: a batch from host memory to the device, by dtype, pinned
or pageable memory, batch and image size; and where to convert uint8 to float."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..timing import time_call
from .config import BenchConfig, BenchResult, _free_memory, _transfer_plan

if TYPE_CHECKING:
    import torch


def _batch_bytes(b: int, size: tuple[int, int], dtype: str) -> int:
    return b * 3 * size[0] * size[1] * {"uint8": 1, "float16": 2, "float32": 4}[dtype]


def _rotating(buf: Any, b: int) -> Callable[[], Any]:
    """Alternate between two disjoint slices of ``buf`` when it holds two batches,
    so a small batch is not served from cache on every call."""
    slices = [buf[:b], buf[b : 2 * b]] if len(buf) >= 2 * b else [buf[:b]]
    state = [0]

    def nxt() -> Any:
        state[0] ^= 1
        return slices[state[0] % len(slices)]

    return nxt


def run_transfer(
    cfg: BenchConfig, device: torch.device, result: BenchResult, tick: Callable[[], None]
) -> None:
    import torch

    g = cfg.grid
    cuda = device.type == "cuda"
    free = _free_memory()
    cap = cfg.max_batch_bytes or min(4 << 30, (free // 4) if free else 4 << 30)
    dtypes = {"uint8": torch.uint8, "float16": torch.float16, "float32": torch.float32}
    for size in g.image_sizes:
        w, h = size
        for dtype, label, pinned in _transfer_plan(cuda):
            fits = [b for b in g.transfer_batches if _batch_bytes(b, size, dtype) <= cap]
            for b in g.transfer_batches:
                if b not in fits:
                    result.skip(
                        "transfer",
                        f"{label} {w}x{h} batch {b}",
                        f"{_batch_bytes(b, size, dtype) / 1e9:.1f} GB per batch is over "
                        f"the {cap / 1e9:.1f} GB limit (a quarter of available memory)",
                    )
                    tick()
            if not fits:
                continue
            rows = max(fits) * 2 if _batch_bytes(max(fits), size, dtype) * 2 <= cap else max(fits)
            buf = torch.empty((rows, 3, h, w), dtype=dtypes[dtype], pin_memory=pinned)
            buf.fill_(7)  # fault the pages in before any clock runs
            for b in fits:
                nxt = _rotating(buf, b)
                sec = time_call(
                    lambda nxt=nxt, nb=pinned: nxt().to(device, non_blocking=nb, copy=True),
                    device,
                    repeats=g.repeats,
                    target_s=g.target_s,
                )
                nbytes = _batch_bytes(b, size, dtype)
                result.transfer.append(
                    {
                        "image": f"{w}x{h}",
                        "batch": b,
                        "dtype": dtype,
                        "pinned": pinned,
                        "series": label,
                        "ms": round(sec * 1e3, 4),
                        "images_per_s": round(b / sec, 1),
                        "gb_per_s": round(nbytes / sec / 1e9, 3),
                    }
                )
                tick()
            del buf
        _conversion(cfg, device, size, cap, result, tick)


def _conversion(
    cfg: BenchConfig,
    device: torch.device,
    size: tuple[int, int],
    cap: int,
    result: BenchResult,
    tick: Callable[[], None],
) -> None:
    """uint8 batch in host memory (pinned on CUDA, as a loader holds it) -> float on the device."""
    import torch

    g = cfg.grid
    w, h = size
    cuda = device.type == "cuda"
    dev = "cuda" if cuda else "to('cpu')"
    fits = [b for b in g.transfer_batches if _batch_bytes(b, size, "float32") <= cap]
    buf = torch.empty((max(fits or [1]) * 2, 3, h, w), dtype=torch.uint8, pin_memory=cuda)
    buf.fill_(7)
    for to in ("float16", "float32"):
        short = {"float16": "half", "float32": "float"}[to]
        dt = getattr(torch, to)
        variants = {
            f"x.{dev}().{short}()" if cuda else f"x.{dev}.{short}()": lambda x, dt=dt: x.to(
                device, non_blocking=cuda, copy=True
            ).to(dt),
            f"x.{short}().{dev}()" if cuda else f"x.{short}().{dev}": lambda x, dt=dt: x.to(dt).to(
                device, copy=True
            ),
        }
        for order, (label, fn) in enumerate(variants.items()):
            for b in g.transfer_batches:
                if b not in fits:
                    result.skip("transfer", f"{label} {w}x{h} batch {b}", "over the memory limit")
                    tick()
                    continue
                nxt = _rotating(buf, b)
                sec = time_call(
                    lambda nxt=nxt, fn=fn: fn(nxt()), device, repeats=g.repeats, target_s=g.target_s
                )
                result.conversion.append(
                    {
                        "image": f"{w}x{h}",
                        "batch": b,
                        "to": to,
                        "order": order,
                        "series": label,
                        "convert_on": "device" if order == 0 else "host",
                        "ms": round(sec * 1e3, 4),
                        "images_per_s": round(b / sec, 1),
                    }
                )
                tick()
