"""What ``PackLoader.stats()`` costs: the same loader with stats on and off, same run.

Two measures:
  record   the recorder alone: the calls a streamed batch makes (a batch's clock, five
           stage laps, ``produced``, the consumer's two clock reads and ``consumed``),
           in a tight loop on one thread: microseconds a batch.
  loader   PackLoader over a page-cached raw pack (and a JPEG pack with ``--jpeg``),
           consumed with Normalize on the device: ``stats=True`` and ``stats=False``
           loaders made once, then ``--rounds`` rounds alternating which goes first,
           each timing ``--batches`` batches after a warm-up (the device synchronized
           before each clock read); the table gives median img/s and the median of the
           rounds' on/off ratios (the target: >= 0.99), and the process's CPU time a
           batch (every thread), on over off.

    python -m benchmarks.stats_cost [--device auto] [--rounds 9] [--jpeg]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import packer
from packer.loading.stats import AUGMENT, COPY, CROP, DECODE, READ, Stats, StatsConfig
from packer.measure.timing import each_pass, resolve_device, time_loader

from ._common import dump, machine


def record_cost(n: int = 200_000) -> tuple[float, float]:
    """Microseconds the recorder adds to one batch on the producer's side and on the
    consumer's (one thread, no contention; the best of 3)."""
    st = Stats(StatsConfig(warn_share=None))
    clock = st.clock

    def producer() -> None:
        for _ in range(n):
            bt = st.batch()
            for stage in (READ, DECODE, CROP, AUGMENT, COPY):
                bt.lap(stage)
            st.produced(bt, 0)

    def consumer() -> None:
        prev = None
        for _ in range(n):
            a = clock()
            b = clock()
            st.consumed(a, b, prev, 256)
            prev = b

    def best(fn) -> float:
        runs = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            runs.append((time.perf_counter() - t0) / n * 1e6)
        return min(runs)

    return best(producer), best(consumer)


def rates(
    loaders: dict[str, packer.PackLoader], dev, batches: int, rounds: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Per mode, each round's img/s and the process's CPU seconds a batch (every thread:
    less swayed than the rate by other work on a shared machine); the order of the modes
    alternates by round."""
    norm = packer.Normalize().to(dev)
    iters = {}
    for name, ld in loaders.items():  # warm: threads, pinned slots, the page cache
        iters[name] = each_pass(ld)
        time_loader(iters[name], lambda b: norm(b[0]), dev, 5, 1, warmup=5)
    got: dict[str, list[float]] = {name: [] for name in loaders}
    cpu: dict[str, list[float]] = {name: [] for name in loaders}
    names = list(loaders)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            c0 = time.process_time()
            rate = time_loader(iters[name], lambda b: norm(b[0]), dev, batches, 1, warmup=3)
            cpu[name].append((time.process_time() - c0) / (batches + 3))
            got[name].append(rate)
    return got, cpu


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", default="auto")
    ap.add_argument("--work", type=Path, default=Path("/tmp/imgpack-stats"))
    ap.add_argument("--images", type=int, default=8192)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--batches", type=int, default=0, help="per round (0: by device)")
    ap.add_argument("--jpeg", action="store_true", help="also a JPEG pack (RRC 224 + flip)")
    a = ap.parse_args()
    from packer.measure.bench.synth import make_jpeg_tree, make_random_pack

    dev = resolve_device(a.device)
    cuda = dev.type == "cuda"
    batches = a.batches or (100 if cuda else 30)
    a.work.mkdir(parents=True, exist_ok=True)
    rec_p, rec_c = record_cost()
    print(f"recorder: producer {rec_p:.2f}, consumer {rec_c:.2f} µs a batch", flush=True)
    # (label, pack path, batch size, loader keywords)
    cases = [
        ("raw 64², batch 64", make_random_pack(a.work / "raw64", a.images, 64), 64, {}),
        ("raw 224², batch 256", make_random_pack(a.work / "raw224", a.images, 224), 256, {}),
    ]
    if a.jpeg:
        jpeg = a.work / "jpeg"
        if not jpeg.exists():
            from packer.builder.api import BuildConfig, build

            make_jpeg_tree(a.work / "tree", a.images // 4, (500, 375), classes=10)
            build(a.work / "tree", jpeg, BuildConfig(store="jpeg"))
        cases.append(("JPEG RRC 224 + flip, batch 256", jpeg, 256, {"image_size": 224}))
    rows = []
    for label, path, bs, kw in cases:
        pack = packer.load(path)
        # on: the default recorder, less the warning (a timing loop waits by design)
        loaders = {
            on: packer.PackLoader(pack, bs, device=dev, stats=st, seed=0, **kw)
            for on, st in ((True, StatsConfig(warn_share=None)), (False, False))
        }
        got, cpu = rates({"on": loaders[True], "off": loaders[False]}, dev, batches, a.rounds)
        ratio = statistics.median(x / y for x, y in zip(got["on"], got["off"], strict=True))
        cpu_ratio = statistics.median(cpu["on"]) / statistics.median(cpu["off"])
        st = loaders[True].stats()
        for ld in loaders.values():
            ld.close()
        rows.append(
            {
                "case": label,
                "on": statistics.median(got["on"]),
                "off": statistics.median(got["off"]),
                "ratio": ratio,
                "cpu_ms_on": statistics.median(cpu["on"]) * 1e3,
                "cpu_ms_off": statistics.median(cpu["off"]) * 1e3,
                "cpu_ratio": cpu_ratio,
                "rounds": got,
                "cpu_rounds": cpu,
                "stats": st.as_dict(),
                "recorder_us": {"producer": rec_p, "consumer": rec_c},
            }
        )
        print(f"  {label}: on/off {ratio:.4f}, CPU a batch on/off {cpu_ratio:.4f}", flush=True)
        for line in st.summary():
            print(f"    {line}")
    dump({"machine": machine(), "device": str(dev), "rows": rows}, "stats_cost.json")
    print(f"\nPackLoader stats on vs off on {dev} ({a.rounds} rounds, alternating)")
    print(f"recorder alone: producer {rec_p:.2f} µs, consumer {rec_c:.2f} µs a batch")
    print(
        f"| {'case':32s} | {'on img/s':>10s} | {'off img/s':>10s} | {'on/off':>7s} "
        f"| {'CPU ms/batch on':>15s} | {'off':>7s} | {'on/off':>7s} |"
    )
    print(f"|{'-' * 34}|{'-' * 12}|{'-' * 12}|{'-' * 9}|{'-' * 17}|{'-' * 9}|{'-' * 9}|")
    for r in rows:
        print(
            f"| {r['case']:32s} | {r['on']:10,.0f} | {r['off']:10,.0f} | {r['ratio']:7.4f} "
            f"| {r['cpu_ms_on']:15.3f} | {r['cpu_ms_off']:7.3f} | {r['cpu_ratio']:7.4f} |"
        )


if __name__ == "__main__":
    main()
