"""Does PackLoader hold its speed in a process that allocated and freed memory before?

Each condition runs in its own fresh interpreter (``--child MODE``):

* ``fresh``: open the pack, measure, nothing else;
* ``churn-pinned`` / ``churn-pageable``: only one of the two kinds below;
* ``churn``: first allocate and free several GB: pinned tensors
  (``torch.empty(..., pin_memory=True)``, filled, copied to the GPU, ``del``) and
  pageable ones (``torch.empty``, touched, ``del``), as a training process does.

In each: the **host-copy limit** (threads copying random rows of the mapped pack into
a pinned buffer with ``np.take``, no loader; 8 and 16 threads; into ``torch`` pinned
memory, into THP-backed memory registered with ``cudaHostRegister``, and into plain
pageable memory), then ``PackLoader`` at batch 128/256/1024 with the default
threads (and 16 threads at 256), min and median of 3 runs, each beside counters:
minor/major page faults, RSS, AnonHugePages, the CUDA host allocator's stats, the
gather threads' busy time (inside np.take, GIL re-acquisition included). Variants of
the loader (``--variants``): ``default`` (this tree), ``old`` (each batch split into
``num_threads`` gather tasks whatever its size, as before issue 18), ``switch0.5``
(the GIL switch interval at 0.5 ms instead of 5 during the runs), ``pyqueue``
(``queue.Queue`` between producer and consumer, as before ``_producer._Handoff``),
``device`` (``gather="device"``: the GPU reading the pack in place; ``default`` and
``cpu`` are the CPU threads), ``procs``
(a prototype: gather processes, each with its own GIL, into shared registered slots). (Two more were
measured and rejected, docs/BENCHMARKS.md: one ``torch.index_select`` per batch on
torch's intra-op threads, and small batches gathered and copied in groups.) Each run
also gives the share of its wall time the consumer spent inside ``next()`` and the
producer blocked on its full queue.

    python scripts/probe_stream.py --pack PACK [--modes fresh,churn]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

_MADV_HUGEPAGE = 14


def counters() -> dict[str, Any]:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    out: dict[str, Any] = {"minflt": ru.ru_minflt, "majflt": ru.ru_majflt}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("Rss", "AnonHugePages", "Anonymous", "FilePmdMapped", "Shared_Clean"):
            out[k + "_MB"] = int(v.split()[0]) // 1024
    return out


def delta(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return {k: b[k] - a[k] for k in ("minflt", "majflt")} | {
        k: b[k] for k in b if k.endswith("_MB")
    }


def host_stats() -> dict[str, Any]:
    import torch

    fn = getattr(torch.cuda.memory, "host_memory_stats", None)
    if fn is None:
        return {"available": False}
    try:
        s = fn()
    except Exception as e:
        return {"error": str(e)}
    keep = ("allocation.current", "segment.current", "reserved_bytes.current",
            "allocated_bytes.current", "num_host_alloc", "num_host_free",
            "host_alloc_time.total", "host_free_time.total")  # fmt: skip
    return {k: s[k] for k in keep if k in s}


def registered_buffer(nbytes: int) -> Any:
    """THP-advised pageable memory, touched, then pinned with cudaHostRegister."""
    import numpy as np
    import torch

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]  # fmt: skip
    size = (nbytes + (2 << 20) - 1) // (2 << 20) * (2 << 20)
    ptr = libc.mmap(None, size + (2 << 20), 3, 0x22, -1, 0)  # RW, PRIVATE|ANONYMOUS
    ptr = (ptr + (2 << 20) - 1) // (2 << 20) * (2 << 20)
    libc.madvise(ctypes.c_void_p(ptr), ctypes.c_size_t(size), _MADV_HUGEPAGE)
    arr = np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(ptr))
    arr[::4096] = 0  # fault every page in (huge pages where THP allows)
    rc = torch.cuda.cudart().cudaHostRegister(ptr, size, 0)
    assert int(rc) == 0, f"cudaHostRegister failed: {rc}"
    return torch.from_numpy(arr[:nbytes])


def churn(pinned_gb: float, pageable_gb: float) -> None:
    import torch

    dev = torch.device("cuda")
    for size in (512 << 20, 2 << 30, 256 << 20, 1 << 30):
        left = int(pinned_gb * (1 << 30)) // 4
        while left > 0:
            t = torch.empty(min(size, left), dtype=torch.uint8, pin_memory=True)
            t.fill_(1)
            t.to(dev, non_blocking=True)
            torch.cuda.synchronize()
            left -= t.numel()
            del t
    for size in (1 << 30, 512 << 20, 2 << 30):
        left = int(pageable_gb * (1 << 30)) // 3
        while left > 0:
            t = torch.empty(min(size, left), dtype=torch.uint8)
            t.fill_(1)
            left -= t.numel()
            del t


def limit(src: Any, dst: Any, threads: int, rows: int, seconds: float = 0.6) -> float:
    """img/s of ``threads`` threads, each copying random rows of ``src`` into its part
    of ``dst`` with np.take (rows of 1 image), for about ``seconds``; min of 3 runs."""
    import numpy as np

    n, row = src.shape
    rng = np.random.default_rng(0)
    dst2 = dst[: rows * row].reshape(rows, row)
    parts = np.linspace(0, rows, threads + 1).astype(int)
    rates = []
    for _ in range(3):
        stop = time.perf_counter() + seconds
        counts = [0] * threads

        def work(i: int, a: int, b: int, stop: float = stop, counts: list[int] = counts) -> None:
            idx = rng.integers(0, n, (64, b - a))
            j = 0
            while time.perf_counter() < stop:
                np.take(src, idx[j % 64], 0, dst2[a:b], "clip")
                counts[i] += b - a
                j += 1

        th = [threading.Thread(target=work, args=(i, a, b))
              for i, (a, b) in enumerate(zip(parts[:-1], parts[1:]))]  # fmt: skip
        t0 = time.perf_counter()
        for t in th:
            t.start()
        for t in th:
            t.join()
        rates.append(sum(counts) / (time.perf_counter() - t0))
    return min(rates)


def loader_runs(pack: Any, bs: int, threads: int | None, variant: str) -> dict[str, Any]:
    import torch

    import packer
    import packer._producer as L  # _take and _Pass live there (what the producer calls)

    busy = [0.0]
    lock = threading.Lock()
    orig_take = L._take

    def timed_take(src: Any, idx: Any, out: Any) -> None:
        t = time.perf_counter()
        orig_take(src, idx, out)
        with lock:
            busy[0] += time.perf_counter() - t

    L._take = timed_take
    orig_put = L._Pass.put
    put_wait = [0.0]

    def timed_put(self: Any, item: Any) -> bool:  # the producer blocked on a full queue
        t = time.perf_counter()
        try:
            return orig_put(self, item)
        finally:
            put_wait[0] += time.perf_counter() - t

    L._Pass.put = timed_put
    orig_switch = sys.getswitchinterval()
    if variant.startswith("switch"):  # the GIL's switch interval, 5 ms by default
        sys.setswitchinterval(float(variant[6:] or 0.5) / 1000)
    orig_handoff = L._Handoff
    if variant == "pyqueue":  # the producer-consumer queue before _Handoff

        def py_queue(maxsize: int) -> Any:
            import queue

            return queue.Queue(maxsize=maxsize)

        L._Handoff = py_queue
    orig_submit = L._Pass.submit
    if variant == "old":  # the split before this work: every batch in num_threads parts

        def old_submit(self: Any, idx: Any, out: Any, pipelined: bool = False) -> Any:
            return orig_submit(self, idx, out, pipelined=False)

        L._Pass.submit = old_submit
    try:
        gather = "device" if variant == "device" else "cpu"
        loader = packer.PackLoader(
            pack, bs, device="cuda", num_threads=threads, seed=0, gather=gather
        )
        it = iter(loader)
        per_run = max(40, 40_000 // bs)

        def next_batch() -> Any:
            nonlocal it
            try:
                return next(it)
            except StopIteration:
                it = iter(loader)
                return next(it)

        for _ in range(min(per_run, 20)):
            next_batch()
        torch.cuda.synchronize()
        runs = []
        for _ in range(3):
            c0, b0, p0 = counters(), busy[0], put_wait[0]
            t0 = time.perf_counter()
            n = 0
            waited = 0.0
            for _ in range(per_run):
                t = time.perf_counter()
                x, _y = next_batch()
                waited += time.perf_counter() - t
                n += len(x)
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
            runs.append({"img_per_s": n / wall, "gather_busy": (busy[0] - b0) / wall,
                         "consumer_in_next": waited / wall,
                         "producer_in_put": (put_wait[0] - p0) / wall,
                         **delta(c0, counters())})  # fmt: skip
        loader.close()
    finally:
        L._take = orig_take
        L._Pass.submit = orig_submit
        L._Pass.put = orig_put
        L._Handoff = orig_handoff
        sys.setswitchinterval(orig_switch)
    rates = [r["img_per_s"] for r in runs]
    return {"min": min(rates), "median": sorted(rates)[1], "runs": runs,
            "threads": loader.num_threads}  # fmt: skip


# ---- prototype: gather in worker processes (own GIL each) into shared pinned slots


def _read_exact(fd: int, n: int) -> bytes:
    import os

    buf = b""
    while len(buf) < n:
        got = os.read(fd, n - len(buf))
        if not got:
            return buf
        buf += got
    return buf


def gather_child(path: str, nrows: int, row: int, fd: int, size: int) -> None:
    """Worker: read (offset, n, idx[n]) from stdin, copy rows into the shared slots, ack."""
    import mmap
    import os
    import struct

    import numpy as np

    src = np.memmap(path, np.uint8, "r", shape=(nrows, row))
    mm = mmap.mmap(fd, size)
    dst = np.frombuffer(mm, np.uint8)
    while True:
        hdr = _read_exact(0, 16)
        if len(hdr) < 16:
            return
        off, n = struct.unpack("<qq", hdr)
        idx = np.frombuffer(_read_exact(0, 8 * n), np.int64)
        np.take(src, idx, 0, dst[off : off + n * row].reshape(n, row), "clip")
        os.write(1, hdr[:8])


class ProcGather:
    def __init__(self, path: str, nrows: int, row: int, nprocs: int, slot_bytes: int,
                 nslots: int, pin: bool = True) -> None:  # fmt: skip
        import mmap
        import os

        import numpy as np
        import torch

        self.row = row
        self.slot_bytes = slot_bytes
        size = slot_bytes * nslots
        size = (size + (2 << 20) - 1) // (2 << 20) * (2 << 20)
        fd = os.memfd_create("imgpack-slots")
        os.ftruncate(fd, size)
        self.mm = mmap.mmap(fd, size)
        arr = np.frombuffer(self.mm, np.uint8)
        arr[::4096] = 0
        ptr = arr.ctypes.data
        self.pin = pin
        if pin:
            rc = torch.cuda.cudart().cudaHostRegister(ptr, size, 0)
            assert int(rc) == 0, f"cudaHostRegister failed: {rc}"
        self.ptr, self.arr = ptr, arr
        self.slots = [torch.from_numpy(arr[i * slot_bytes : (i + 1) * slot_bytes])
                      for i in range(nslots)]  # fmt: skip
        self.procs = [
            subprocess.Popen([sys.executable, __file__, "--gather-child",
                              f"{path},{nrows},{row},{fd},{size}"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=(fd,))
            for _ in range(nprocs)
        ]  # fmt: skip
        os.close(fd)
        self.next = 0

    def submit(self, slot: int, idx: Any, parts: int) -> list[int]:
        import os
        import struct

        import numpy as np

        bounds = np.linspace(0, len(idx), parts + 1).astype(int)
        used = []
        for a, b in zip(bounds[:-1], bounds[1:]):
            if b <= a:
                continue
            p = self.procs[self.next]
            self.next = (self.next + 1) % len(self.procs)
            off = slot * self.slot_bytes + int(a) * self.row
            os.write(p.stdin.fileno(), struct.pack("<qq", off, b - a)
                     + np.ascontiguousarray(idx[a:b], np.int64).tobytes())  # fmt: skip
            used.append(p)
        return used

    def wait(self, used: list[Any]) -> None:
        for p in used:
            got = _read_exact(p.stdout.fileno(), 8)
            assert len(got) == 8, "gather process died"

    def close(self) -> None:
        import torch

        for p in self.procs:
            p.stdin.close()
        for p in self.procs:
            p.wait()
        if self.pin:
            torch.cuda.cudart().cudaHostUnregister(self.ptr)


def proc_runs(
    pack_path: str, pack: Any, bs: int, nprocs: int, device: str = "cuda"
) -> dict[str, Any]:
    """The CUDA loader's loop (k slots in flight, ship in order) with process gather."""
    import collections

    import numpy as np
    import torch

    n, row = len(pack), math.prod(pack.images.shape[1:])
    path = str(Path(pack_path) / "_tensordict" / "images.memmap")
    k = 8 if bs < 1024 else 6
    dev = torch.device(device)
    g = ProcGather(path, n, row, nprocs, bs * row, k, pin=dev.type == "cuda")
    labels = pack.labels.numpy()
    lab_slots = [torch.empty(bs, dtype=torch.int64, pin_memory=dev.type == "cuda")
                 for _ in range(k)]  # fmt: skip
    stream = torch.cuda.Stream() if dev.type == "cuda" else None
    freed: list[Any] = [None] * k
    rng = np.random.default_rng(0)
    shape = tuple(pack.images.shape[1:])
    task = 8 << 20

    def batches(count: int) -> Any:
        done = 0
        while done < count:
            perm = rng.permutation(n)
            for b in range(n // bs):
                if done == count:
                    return
                done += 1
                yield perm[b * bs : (b + 1) * bs]

    def run(count: int) -> int:
        """A producer thread gathers and ships; this thread takes batches as a consumer."""
        from packer._producer import _Handoff

        q = _Handoff(4)
        cuda = dev.type == "cuda"

        def produce() -> None:
            pending: Any = collections.deque()

            def ship() -> None:
                s, idx, used = pending.popleft()
                g.wait(used)
                lab = lab_slots[s][: len(idx)]
                np.take(labels, idx, out=lab.numpy(), mode="clip")
                x = g.slots[s][: len(idx) * row].view(len(idx), *shape)
                if not cuda:
                    q.put((x.clone(), lab.clone(), None), 60)
                    return
                with torch.cuda.stream(stream):
                    x = x.to(dev, non_blocking=True)
                    y = lab.to(dev, non_blocking=True)
                    ev = torch.cuda.Event()
                    ev.record(stream)
                freed[s] = ev
                q.put((x, y, ev), 60)

            for j, idx in enumerate(batches(count)):
                s = j % k
                if len(pending) == k:
                    ship()
                if freed[s] is not None:
                    freed[s].synchronize()
                parts = min(nprocs, max(1, len(idx) * row // task))
                pending.append((s, idx, g.submit(s, idx, parts)))
            while pending:
                ship()
            q.put(None, 60)

        th = threading.Thread(target=produce)
        th.start()
        got = 0
        while (item := q.get(60)) is not None:
            x, _y, ev = item
            if ev is not None:
                cur = torch.cuda.current_stream()
                cur.wait_event(ev)
                x.record_stream(cur)
            got += len(x)
        th.join()
        if cuda:
            torch.cuda.synchronize()
        return got

    per_run = max(40, 40_000 // bs)
    run(min(per_run, 20) + 200)  # warm-up: also maps the pack in every child
    rates = []
    for _ in range(3):
        t0 = time.perf_counter()
        got = run(per_run)
        rates.append(got / (time.perf_counter() - t0))
    g.close()
    return {"min": min(rates), "median": sorted(rates)[1],
            "runs": [{"img_per_s": r, "gather_busy": 0.0, "minflt": 0} for r in rates],
            "threads": nprocs}  # fmt: skip


def child(mode: str, pack_path: str, variants: list[str]) -> dict[str, Any]:
    import numpy as np
    import torch

    import packer

    out: dict[str, Any] = {"mode": mode, "start": counters()}
    pack = packer.load(pack_path)
    with open(Path(pack_path) / "_tensordict" / "images.memmap", "rb") as f:
        while f.read(64 << 20):  # page-cache the file
            pass
    torch.zeros(1, device="cuda")
    out["host_before"] = host_stats()
    if mode.startswith("churn"):
        t = time.perf_counter()
        kind = mode.split("-")[1] if "-" in mode else "both"
        churn(
            pinned_gb=4 if kind in ("both", "pinned") else 0,
            pageable_gb=4 if kind in ("both", "pageable") else 0,
        )
        out["churn_s"] = time.perf_counter() - t
    out["after_setup"] = counters()
    out["host_after_churn"] = host_stats()
    src = pack.images.numpy().reshape(len(pack), -1)
    row = src.shape[1]
    out["row_bytes"] = row
    lim: dict[str, float] = {}
    rows = 1024
    dsts = {
        "torch_pinned": torch.empty(rows * row, dtype=torch.uint8, pin_memory=True).numpy(),
        "pageable": np.ones(rows * row, np.uint8),
    }
    c0 = counters()
    for name, dst in dsts.items():
        for th in (8, 16):
            lim[f"{name}_{th}t"] = limit(src, dst, th, rows)
    out["limit"] = lim
    out["limit_counters"] = delta(c0, counters())
    out["host_after_limit"] = host_stats()
    res = {}
    for bs, th in ((128, None), (256, None), (1024, None), (256, 16), (1024, 16)):
        for variant in variants:
            key = f"{variant} bs{bs} t{th or 'default'}"
            if variant.startswith("procs"):
                res[key] = proc_runs(pack_path, pack, bs, th or int(variant[5:] or 8))
            else:
                res[key] = loader_runs(pack, bs, th, variant)
            print(f"  [{mode}] {key}: min {res[key]['min']:,.0f} median "
                  f"{res[key]['median']:,.0f} img/s, faults "
                  f"{[r['minflt'] for r in res[key]['runs']]}, gather busy "
                  f"{[round(r.get('gather_busy', 0), 2) for r in res[key]['runs']]}, consumer in "
                  f"next {[round(r.get('consumer_in_next', 0), 2) for r in res[key]['runs']]}, "
                  f"producer in put {[round(r.get('producer_in_put', 0), 2) for r in res[key]['runs']]}",
                  file=sys.stderr, flush=True)  # fmt: skip
    out["loader"] = res
    out["host_end"] = host_stats()
    out["end"] = counters()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pack", required=True)
    ap.add_argument("--modes", default="fresh,churn")
    ap.add_argument("--variants", default="default,old")
    ap.add_argument("--child", default=None)
    ap.add_argument("--gather-child", default=None)
    if "--gather-child" in sys.argv:  # a gather process: numpy only, no torch
        path, *nums = sys.argv[sys.argv.index("--gather-child") + 1].split(",")
        gather_child(path, *map(int, nums))
        return
    args = ap.parse_args()
    variants = args.variants.split(",")
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.pack, variants)))
        return
    from _out import dump

    facts = {}
    for name in ("enabled", "defrag"):
        with open(f"/sys/kernel/mm/transparent_hugepage/{name}") as f:
            facts[f"thp_{name}"] = f.read().strip()
    print("facts:", facts, flush=True)
    results = {"facts": facts}
    labels = []
    for i, mode in enumerate(args.modes.split(",")):
        label = f"{mode}#{i}"
        labels.append(label)
        p = subprocess.run(
            [sys.executable, __file__, "--pack", args.pack, "--child", mode,
             "--variants", args.variants],
            capture_output=True, text=True,
        )  # fmt: skip
        sys.stderr.write(p.stderr[-6000:])
        line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        if not line:
            print(f"{label}: failed (rc {p.returncode})")
            continue
        results[label] = json.loads(line[-1][7:])
        dump(results, "probe_stream.json")
    print("\n| mode | limit img/s: torch pinned 8t/16t, pageable 8t |")
    print("|---|---|")
    for mode in labels:
        if mode not in results:
            continue
        lim = results[mode]["limit"]
        print(f"| {mode} | {lim['torch_pinned_8t']:,.0f} / {lim['torch_pinned_16t']:,.0f}, "
              f"{lim['pageable_8t']:,.0f} |")  # fmt: skip
    print("\n| mode | loader | min img/s | median | % of torch-pinned 8t limit | faults/run "
          "| gather threads busy | GB/s per busy thread |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for mode in labels:
        if mode not in results:
            continue
        lim8 = results[mode]["limit"]["torch_pinned_8t"]
        for key, r in results[mode]["loader"].items():
            busy = sorted(x["gather_busy"] for x in r["runs"])[1]
            row = results[mode]["row_bytes"]
            print(f"| {mode} | {key} | {r['min']:,.0f} | {r['median']:,.0f} | "
                  f"{r['min'] / lim8:.0%} | {r['runs'][0]['minflt']} | {busy:.1f} | "
                  f"{r['median'] * row / 1e9 / max(busy, 1e-9):.1f} |")  # fmt: skip
    for mode in labels:
        if mode in results:
            r = results[mode]
            print(f"{mode}: host alloc {r.get('host_after_churn')} -> {r.get('host_end')}; "
                  f"rss/thp at end {r['end']}")  # fmt: skip


if __name__ == "__main__":
    main()
