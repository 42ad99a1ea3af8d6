"""Does a folder DataLoader measured before PackLoader slow it down? (bench's loading order)

python scripts/diag_order.py
"""

from __future__ import annotations

import multiprocessing as mp
import tempfile
import time
from pathlib import Path

from packer.bench import FULL, BenchConfig, BenchResult, _ways, prepare_data
from packer.timing import time_loader


def cpu_busy(seconds: float = 0.5) -> float:
    def snap() -> tuple[int, int]:
        v = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        return sum(v), v[3] + v[4]

    t0, i0 = snap()
    time.sleep(seconds)
    t1, i1 = snap()
    return 1 - (i1 - i0) / max(1, t1 - t0)


def main() -> None:
    cfg = BenchConfig(device="cuda", sections=("loading",))
    result = BenchResult("cuda", "gpu", False, {}, {})
    with tempfile.TemporaryDirectory() as tmp:
        paths = prepare_data(cfg, Path(tmp), result)
        print("prepared", result.dataset, flush=True)
        for rnd in range(2):
            for way in _ways(paths, FULL.pack_side, 256, "cuda", 16, FULL.load_images, "loading"):
                before = (len(mp.active_children()), round(cpu_busy(), 2))
                rate = time_loader(
                    lambda w=way: iter(w.loader),
                    lambda b, f=way.ship: f(b)[0],
                    "cuda",
                    way.per_repeat,
                    5,
                    warmup=way.warmup,
                )
                way.close()
                print(
                    f"round {rnd} {way.name:<55} {rate:>10,.0f} img/s; before: children, "
                    f"cpu busy = {before}; after: {len(mp.active_children())}, "
                    f"{cpu_busy():.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
