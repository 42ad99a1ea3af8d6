"""Start-up: what a command costs from process start to exit, against its baseline in
the same run (issue 45.11).

    imgpack info PACK       vs  python -c "import packer"   (target: <= 3x)
    imgpack build (100)     vs  python -c "import torch"    (target: <= 1.5x)

Each command runs ``--rounds`` times, the commands alternating within a round (so load
from other work falls on all of them alike); the median wall time of each is reported,
and the ratios of medians. Inputs: 100 synthetic 640x480 JPEGs in 4 classes, built to
224x224 raw rows with the default workers (every core). ``--old TREE``: the same
commands also run on the ``packer/`` under TREE (a ``git worktree`` of an older commit),
alternating with this tree's.

    python -m benchmarks.startup [--rounds 5] [--work /tmp/imgpack-startup] [--old TREE]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _env(tree: Path) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}


def _wall(cmd: list[str], env: dict[str, str], cwd: Path, before: object = None) -> float:
    """Seconds from start to exit of ``cmd``, run in ``cwd`` (not a tree: ``python -c``
    and ``-m`` put the working folder first on the path)."""
    if callable(before):
        before()
    t = time.perf_counter()
    subprocess.run(
        cmd, env=env, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--images", type=int, default=100)
    ap.add_argument("--work", type=Path, default=Path("/tmp/imgpack-startup"))
    ap.add_argument("--old", type=Path, default=None, help="an older tree, run alternately")
    args = ap.parse_args()
    from packer.measure.bench.synth import make_jpeg_tree

    src, pack, dst = args.work / "src", args.work / "pack", args.work / "dst"
    shutil.rmtree(args.work, ignore_errors=True)
    make_jpeg_tree(src, args.images, (640, 480), classes=4)
    py = sys.executable
    build = [py, "-m", "packer", "build", str(src), str(dst), "--size", "224", "-q"]
    subprocess.run([*build[:5], str(pack), *build[6:]], env=_env(ROOT), cwd=args.work, check=True)

    def clear() -> None:
        shutil.rmtree(dst, ignore_errors=True)

    cmds = {
        "import packer": ([py, "-c", "import packer"], None),
        "import torch": ([py, "-c", "import torch"], None),
        "imgpack --help": ([py, "-m", "packer", "--help"], None),
        "imgpack info PACK": ([py, "-m", "packer", "info", str(pack)], None),
        "imgpack verify --no-speed PACK": (
            [py, "-m", "packer", "verify", "--no-speed", str(pack)],
            None,
        ),
        f"imgpack build ({args.images} images)": (build, clear),
    }
    trees = {"": ROOT, **({"old ": args.old.resolve()} if args.old else {})}
    times: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for name, (cmd, before) in cmds.items():
            for tag, tree in trees.items():
                times.setdefault(tag + name, []).append(_wall(cmd, _env(tree), args.work, before))
    med = {k: statistics.median(v) for k, v in times.items()}
    cores = len(os.sched_getaffinity(0))
    load = os.getloadavg()[0]
    print(f"{cores} cores, load average {load:.1f} at the end, {args.rounds} alternating rounds")
    print(f"{'command':44s} {'median s':>9s}  {'runs':s}")
    for k, v in med.items():
        print(f"{k:44s} {v:9.3f}  " + " ".join(f"{x:.2f}" for x in times[k]))
    for tag in trees:
        b = f"{tag}imgpack build ({args.images} images)"
        print(
            f"{tag or 'this '}tree: info / import packer = "
            f"{med[tag + 'imgpack info PACK'] / med[tag + 'import packer']:.2f}x; "
            f"build / import torch = {med[b] / med[tag + 'import torch']:.2f}x"
        )


if __name__ == "__main__":
    main()
