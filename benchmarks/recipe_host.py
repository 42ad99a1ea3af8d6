"""The host's random draws of the modern recipe (issue 33), per batch, on the CPU.

The fused CUDA recipe (packer.augment.fused) is bound by the host: per batch it draws
every op's parameters on the CPU from the generator before one copy and four launches.
This times those draws alone, as ``Plan.run`` makes them, for the reference recipe
(RandomResizedCrop 224 + flip, TrivialAugmentWide, RandomErasing 0.1, RandomChoice of
MixUp 0.2 / CutMix 1.0), batch 256, 256² images in; no GPU needed:

  crop     RandomResizedCrop's boxes and the flips, as the int32 [B, 5] table
  policy   TrivialAugmentWide's ops as the fused kernels' table
  erase    RandomErasing's coins and boxes, as int32
  mix      RandomChoice's pick, then MixUp's lam or CutMix's box

Each figure is µs per batch, the median of ``--rounds`` rounds of ``--calls`` calls
(the ops interleaved within a round, so a drift of the machine touches them alike).
``--against DIR`` also runs this script on the ``packer`` of another checkout (say,
main's) in a subprocess, and prints its figures beside these: the baseline, same run.

    python -m benchmarks.recipe_host                        # writes $OUT/recipe_host.json
    python -m benchmarks.recipe_host --against /path/to/main/checkout
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
OPS = ("crop", "policy", "erase", "mix")


def draws(batch: int, size: int, side: int) -> dict:
    """Each op's draw for one batch, as a function of nothing (the generator is shared)."""
    from packer.augment import fused

    from .recipe import recipe_compose

    plan = fused.Plan(list(recipe_compose(size, 100)), 0)
    g = torch.Generator().manual_seed(0)
    b, c = batch, 3

    def crop() -> None:  # Plan.run's crop lines
        table = np.empty((b, 5), dtype=np.int32)
        plan.crop._draw(b, side, side, g, table)
        table[:, 4] = torch.rand(b, generator=g).numpy() < plan.flip.p

    def erase() -> None:
        plan.erase.sample(b, size, size, g).boxes.numpy().astype(np.int32)

    return {
        "crop": crop,
        "policy": lambda: fused._policy_table(plan.policy, b, c, size, size, g),
        "erase": erase,
        "mix": lambda: fused._mix_draw(plan.mixer, b, size, size, g),
    }


def one_round(fns: dict, calls: int) -> dict[str, float]:
    """µs per call of each op over ``calls`` calls."""
    got = {}
    for k, fn in fns.items():
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        got[k] = (time.perf_counter() - t0) / calls * 1e6
    return got


def warm(fns: dict) -> None:
    for fn in fns.values():
        for _ in range(20):
            fn()


def summary(rounds: list[dict[str, float]]) -> dict:
    out = {
        k: {
            "median_us": statistics.median(r[k] for r in rounds),
            "best_us": min(r[k] for r in rounds),
        }
        for k in OPS
    }
    totals = [sum(r[k] for k in OPS) for r in rounds]
    out["total"] = {"median_us": statistics.median(totals), "best_us": min(totals)}
    return out


def serve(a: argparse.Namespace) -> None:
    """The baseline's side: one round per line read, its figures as one JSON line."""
    fns = draws(a.batch, a.size, a.side)
    warm(fns)
    print("ready", flush=True)
    for _ in sys.stdin:
        print(json.dumps(one_round(fns, a.calls)), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--size", type=int, default=224, help="the crop's output side")
    ap.add_argument("--side", type=int, default=256, help="the input images' side")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--against", type=Path, help="another checkout: its figures beside these")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    torch.set_num_threads(1)  # the loader's host thread; a draw is far too small to split
    if a.serve:
        serve(a)
        return
    fns = draws(a.batch, a.size, a.side)
    warm(fns)
    base = None
    if a.against is not None:
        # The baseline in its own process (its own packer), one round after each of
        # ours: a drift of the machine touches both alike.
        # its packer first, this tree's benchmarks after it; cwd "/": `-m` puts the cwd
        # first on sys.path, which would hide the other packer
        path = os.pathsep.join((str(a.against.resolve()), str(HERE.parent)))
        env = dict(os.environ, PYTHONPATH=path)
        args = [f"--{k}={getattr(a, k)}" for k in ("batch", "size", "side", "calls")]
        base = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.recipe_host", *args, "--serve"],
            cwd="/",
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        if base.stdout.readline().strip() != "ready":
            raise SystemExit(f"the baseline at {a.against} did not start")
    ours_rounds, base_rounds = [], []
    for _ in range(a.rounds):
        ours_rounds.append(one_round(fns, a.calls))
        if base is not None:
            base.stdin.write("go\n")
            base.stdin.flush()
            base_rounds.append(json.loads(base.stdout.readline()))
    if base is not None:
        base.stdin.close()
        base.wait()
    ours = summary(ours_rounds)
    base = summary(base_rounds) if base_rounds else None
    import packer

    from ._common import dump, machine

    print(f"host draws per batch of {a.batch} ({a.side}² in, {a.size}² out), µs")
    print(f"  packer: {Path(packer.__file__).parent}")
    if base is not None:
        print(f"  baseline: {a.against}")
    head = f"{'op':8s} {'median':>8s} {'best':>8s}"
    if base is not None:
        head += f" {'baseline median':>16s} {'best':>8s} {'ratio':>6s}"
    print(head)
    for k in (*OPS, "total"):
        line = f"{k:8s} {ours[k]['median_us']:8.1f} {ours[k]['best_us']:8.1f}"
        if base is not None:
            b = base[k]
            ratio = b["median_us"] / ours[k]["median_us"]
            line += f" {b['median_us']:16.1f} {b['best_us']:8.1f} {ratio:5.2f}x"
        print(line)
    record = {
        "machine": machine(),
        "packer": str(Path(packer.__file__).parent),
        "batch": a.batch,
        "size": a.size,
        "side": a.side,
        "calls": a.calls,
        "rounds": a.rounds,
        "us_per_batch": ours,
    }
    if base is not None:
        record["baseline"] = {"packer": str(a.against), "us_per_batch": base}
    dump(record, "recipe_host.json")


if __name__ == "__main__":
    main()
