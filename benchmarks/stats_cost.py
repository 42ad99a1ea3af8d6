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
           rounds' on/off ratios (the target: >= 0.99).

    python benchmarks/stats_cost.py [--device auto] [--rounds 9] [--jpeg]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import packer
from _out import dump, machine
from packer.loading.stats import AUGMENT, COPY, CROP, DECODE, READ, Stats
from packer.measure.timing import resolve_device, time_loader


def record_cost(n: int = 200_000) -> float:
    """Microseconds the recorder adds to one batch (one thread, no contention)."""
    st = Stats()
    clock = st.clock
    t0 = time.perf_counter()
    prev = None
    for _ in range(n):
        bt = st.batch()
        for stage in (READ, DECODE, CROP, AUGMENT, COPY):
            bt.lap(stage)
        st.produced(bt, 0)
        a = clock()
        b = clock()
        st.consumed(a, b, prev, 256)
        prev = b
    return (time.perf_counter() - t0) / n * 1e6


def rates(loaders: dict[str, packer.PackLoader], dev, batches: int, rounds: int) -> dict:
    """Per mode, each round's img/s; the order of the modes alternates by round."""
    norm = packer.Normalize().to(dev)
    iters = {}
    for name, ld in loaders.items():  # warm: threads, pinned slots, the page cache
        iters[name] = lambda ld=ld: iter(ld)
        time_loader(iters[name], lambda b: norm(b[0]), dev, 5, 1, warmup=5)
    got: dict[str, list[float]] = {name: [] for name in loaders}
    names = list(loaders)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            rate = time_loader(iters[name], lambda b: norm(b[0]), dev, batches, 1, warmup=3)
            got[name].append(rate)
    return got


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
    rec = record_cost()
    print(f"recorder: {rec:.2f} µs a batch", flush=True)
    # (label, pack path, batch size, loader keywords)
    cases = [
        ("raw 64², batch 64", make_random_pack(a.work / "raw64", a.images, 64), 64, {}),
        ("raw 224², batch 256", make_random_pack(a.work / "raw224", a.images, 224), 256, {}),
    ]
    if a.jpeg:
        jpeg = a.work / "jpeg"
        if not jpeg.exists():
            from packer.build.run import BuildConfig, build

            make_jpeg_tree(a.work / "tree", a.images // 4, (500, 375), classes=10)
            build(a.work / "tree", jpeg, BuildConfig(store="jpeg"))
        cases.append(("JPEG RRC 224 + flip, batch 256", jpeg, 256, {"image_size": 224}))
    rows = []
    for label, path, bs, kw in cases:
        pack = packer.load(path)
        loaders = {
            on: packer.PackLoader(pack, bs, device=dev, stats=on, seed=0, **kw)
            for on in (True, False)
        }
        got = rates({"on": loaders[True], "off": loaders[False]}, dev, batches, a.rounds)
        ratio = statistics.median(x / y for x, y in zip(got["on"], got["off"], strict=True))
        st = loaders[True].stats()
        for ld in loaders.values():
            ld.close()
        rows.append(
            {
                "case": label,
                "on": statistics.median(got["on"]),
                "off": statistics.median(got["off"]),
                "ratio": ratio,
                "rounds": got,
                "stats": st.as_dict(),
                "per_batch_us": rec,
            }
        )
        print(f"  {label}: on/off {ratio:.4f}", flush=True)
        for line in st.summary():
            print(f"    {line}")
    dump({"machine": machine(), "device": str(dev), "rows": rows}, "stats_cost.json")
    print(f"\nPackLoader stats on vs off on {dev} ({a.rounds} rounds, alternating)")
    print(f"recorder alone: {rec:.2f} µs a batch")
    print(f"| {'case':32s} | {'on img/s':>10s} | {'off img/s':>10s} | {'on/off':>7s} |")
    print(f"|{'-' * 34}|{'-' * 12}|{'-' * 12}|{'-' * 9}|")
    for r in rows:
        print(f"| {r['case']:32s} | {r['on']:10,.0f} | {r['off']:10,.0f} | {r['ratio']:7.4f} |")


if __name__ == "__main__":
    main()
