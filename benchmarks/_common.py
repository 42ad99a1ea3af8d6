"""What the benchmarks share: where they write their JSON results and the machine they
ran on; the examples they train with; where a model's CUDA stream waited, from a
``torch.profiler`` trace (``model_share --parts profile``, ``build_bound``).

Synthetic data comes from :mod:`packer.measure.bench.synth`, timing from
:mod:`packer.measure.timing`. Imports torch only inside the functions that need it.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import shutil
import sys
from collections import defaultdict
from pathlib import Path
from types import ModuleType
from typing import Any

import packer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# the figures in docs/ were measured with CUDA's 32 hardware queues, which `import packer`
# once set by itself: the benchmarks ask for them, before any CUDA call (issue 45.8)
packer.configure_cuda_queues()


def machine() -> dict[str, Any]:
    """Cores, CPU, Python, torch, date and (when present) the GPU: ``imgpack bench``'s record."""
    from packer.measure.bench import machine_info
    from packer.measure.timing import resolve_device

    return machine_info(resolve_device("auto"))


def dump(obj: object, name: str) -> None:
    """Write ``obj`` as ``$OUT/name`` (default ``./out/name``), whole or not at all."""
    from packer.pack.files import write_json_atomic

    out = Path(os.environ.get("OUT", ROOT / "out"))
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / name, obj, indent=1)


def example(name: str) -> ModuleType:
    """The training example ``examples/NAME.py`` (a program, not a package) as a module,
    loaded once from its file."""
    key = f"_imgpack_example_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, ROOT / "examples" / f"{name}.py")
        assert spec is not None and spec.loader is not None, name
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


# Where a model's CUDA stream waited, from a ``torch.profiler`` chrome trace: its busy
# time and gaps per step, the gaps by cause (the host launched late, another stream's
# kernel held the SMs), the other streams' kernels, copies and syncing runtime calls.

SYNCING = ("cudaFree", "cudaFreeHost", "cudaMalloc", "cudaHostAlloc", "cudaMallocHost",
           "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize",
           "cudaMemcpy", "cudaHostRegister", "cudaHostUnregister", "cuMemFree",
           "cuMemAlloc", "cuMemHostAlloc", "cuMemFreeHost", "cuCtxSynchronize",
           "cuStreamSynchronize", "cuEventSynchronize")  # fmt: skip


def _union(iv: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    i = j = 0
    tot = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        tot += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return tot


def _gaps(ev: list, m: list, others: list) -> dict[str, float]:
    """The model stream's idle gaps (us, over 5 us each) by cause: its next kernel was
    launched late (the host fell behind), a loader kernel ran meanwhile (the next one
    waited for SMs), or neither."""
    launch = {e["args"].get("correlation"): e for e in ev
              if e.get("cat") in ("cuda_runtime", "cuda_driver") and "args" in e}  # fmt: skip
    ends = sorted((a, b) for a, b, _ in others)
    out: dict[str, float] = defaultdict(float)
    j = 0
    for prev, nxt in zip(m, m[1:]):
        end, start, corr = prev[1], nxt[0], nxt[3]
        g = start - end
        if g <= 5:
            continue
        r = launch.get(corr)
        if r is not None and r["ts"] + r["dur"] > end + 2:
            out["host late"] += g
            continue
        while j < len(ends) and ends[j][1] < end - 5000:
            j += 1
        busy = any(a < start and b > end for a, b in ends[j : j + 2000])
        out["a loader kernel running" if busy else "other"] += g
    return out


def trace_summary(path: Path, steps: int) -> dict[str, Any]:
    """Per-step figures from a chrome trace: the model's stream (most kernel time), the
    others (the loader's), copies, and the runtime calls that may synchronize."""
    ev = json.loads(Path(path).read_text())["traceEvents"]
    kern: dict[int, list[tuple[float, float, str, Any]]] = defaultdict(list)
    copies: dict[str, float] = defaultdict(float)
    calls: dict[str, list[float]] = defaultdict(list)
    for e in ev:
        cat, dur = e.get("cat"), float(e.get("dur", 0) or 0)
        if cat == "kernel":
            kern[int(e["args"].get("stream", -1))].append(
                (e["ts"], e["ts"] + dur, e["name"], e["args"].get("correlation"))
            )
        elif cat in ("gpu_memcpy", "gpu_memset"):
            copies[e["name"]] += dur
        elif cat in ("cuda_runtime", "cuda_driver"):
            calls[e["name"]].append(dur)
    if not kern:
        return {"error": "no kernels in the trace"}
    busy = {s: sum(k[1] - k[0] for k in v) for s, v in kern.items()}
    model = max(busy, key=busy.__getitem__)
    m = sorted(kern[model])
    wall = max(k[1] for k in m) - min(k[0] for k in m)
    mu = _union([(k[0], k[1]) for k in m])
    others = [(k[0], k[1], k[2]) for s, v in kern.items() if s != model for k in v]
    ou = _union([(a, b) for a, b, _ in others])
    names: dict[str, float] = defaultdict(float)
    for a, b, n in others:
        names[n[:90]] += b - a
    top = sorted(names.items(), key=lambda kv: -kv[1])[:10]
    sync_calls = {k: {"n": len(v), "total_us": round(sum(v))} for k, v in calls.items()
                  if k.startswith(SYNCING)}  # fmt: skip
    top_calls = sorted(((k, round(sum(v)), len(v)) for k, v in calls.items()), key=lambda t: -t[1])
    per = max(1, steps)
    gaps = _gaps(ev, m, others)
    long_syncs = [d for d in calls.get("cudaEventSynchronize", []) if d > 1000]
    return {
        "model_gaps_ms_per_step": {k: round(v / per / 1e3, 3) for k, v in gaps.items()},
        "event_syncs_over_1ms": {
            "n": len(long_syncs),
            "total_ms": round(sum(long_syncs) / 1e3, 1),
            "max_ms": round(max(long_syncs, default=0) / 1e3, 1),
        },
        "model_stream": model,
        "wall_per_step_ms": round(wall / per / 1e3, 3),
        "model_busy_per_step_ms": round(busy[model] / per / 1e3, 3),
        "model_gaps_per_step_ms": round((wall - busy[model]) / per / 1e3, 3),
        "model_kernels_per_step": round(len(m) / per, 1),
        "loader_kernel_ms_per_step": round(sum(b - a for a, b, _ in others) / per / 1e3, 3),
        "loader_kernels_per_step": round(len(others) / per, 1),
        "loader_streams": sorted(s for s in kern if s != model),
        "overlap_per_step_ms": round(_overlap(mu, ou) / per / 1e3, 3),
        "loader_top_kernels_ms": [(n, round(t / per / 1e3, 3)) for n, t in top],
        "copies_ms_per_step": {k: round(v / per / 1e3, 3) for k, v in copies.items()},
        "syncing_calls": sync_calls,
        "top_runtime_calls": top_calls[:15],
    }


def profiled(name: str, step: Any, norm: Any, feed: Any, steps: int, out: Path) -> dict[str, Any]:
    """``steps`` training steps (``feed(i)`` -> ``step(norm(x), y)``) under
    ``torch.profiler``: :func:`trace_summary` of them, the trace gzipped into ``out``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from packer.measure.timing import sync

    for i in range(3):  # warm: the loader's queue is full again, the allocator settled
        x, y = feed(i)
        step(norm(x), y)
    sync(torch.device("cuda"))
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(steps):
            x, y = feed(i)
            step(norm(x), y)
        torch.cuda.synchronize()
    raw = out / f"trace_{name}.json"
    prof.export_chrome_trace(str(raw))
    s = trace_summary(raw, steps)
    with open(raw, "rb") as f, gzip.open(f"{raw}.gz", "wb") as g:
        shutil.copyfileobj(f, g)
    raw.unlink()
    return s


def threads_summary(path: Path) -> dict[str, Any]:
    """Per thread of a trace: its CUDA runtime/driver calls by name (count, total ms),
    the top 8; per stream: GPU busy ms (kernels, copies); the trace's span in ms."""
    ev = json.loads(Path(path).read_text())["traceEvents"]
    calls: dict[Any, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    gpu: dict[Any, float] = defaultdict(float)
    kinds: dict[str, float] = defaultdict(float)
    lo, hi = float("inf"), 0.0
    for e in ev:
        cat, dur = e.get("cat"), float(e.get("dur", 0) or 0)
        if cat in ("cuda_runtime", "cuda_driver"):
            calls[e.get("tid")][e["name"]].append(dur)
        elif cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            gpu[e["args"].get("stream")] += dur
            kinds[e["name"][:50]] += dur
            lo, hi = min(lo, e["ts"]), max(hi, e["ts"] + dur)
    out: dict[str, Any] = {"gpu_span_ms": round((hi - lo) / 1e3, 1) if hi else 0.0}
    out["threads"] = {
        str(t): sorted(((k, len(v), round(sum(v) / 1e3, 1)) for k, v in c.items()),
                       key=lambda x: -x[2])[:8]
        for t, c in calls.items()
    }  # fmt: skip
    out["gpu_busy_ms_by_stream"] = {str(k): round(v / 1e3, 1) for k, v in gpu.items()}
    out["gpu_ms_by_name"] = sorted(((k, round(v / 1e3, 1)) for k, v in kinds.items()),
                                   key=lambda x: -x[1])[:12]  # fmt: skip
    return out


def profile_call(name: str, fn: Any, out: Path) -> dict[str, Any]:
    """``fn()`` under ``torch.profiler`` (CPU + CUDA): its :func:`threads_summary`, the
    trace gzipped into ``out``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    raw = out / f"trace_{name}.json"
    prof.export_chrome_trace(str(raw))
    s = threads_summary(raw)
    with open(raw, "rb") as f, gzip.open(f"{raw}.gz", "wb") as g:
        shutil.copyfileobj(f, g)
    raw.unlink()
    return s
