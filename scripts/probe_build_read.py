"""The GPU build reading each file once (issue 18 §2): old pipeline against new, same run.

Until round 8, ``imgpack build --device cuda`` had 16 CPU worker processes read every
file, open it with Pillow and hash it (SHA-256) to classify it; then reader threads of
the build read each JPEG again and hashed it again before the nvjpeg decode. Now the
decoder's reader threads read each file once and classify it from its header bytes
(``packer.decode.plain_jpeg_size``, ~2 us); the CPU workers only decode what the GPU
does not take. On set b of ``bench_build.py`` (16,000 JPEGs 500x375 q90 -> 256²):

* the 16-process Pillow ceiling, the disk and tmpfs alone (pwrite + writeback + fsync);
* the GPU half of the build alone in one process (``probe_build_procs.run_procs``:
  read, nvjpeg, crop, pinned copy, pwrite + SHA-256, fsync; no classification, no
  journal): what a pipeline in one process can reach;
* whole library builds in two warm interpreters, one per tree (``--old-tree``: the code
  before, e.g. ``git archive``'d), interleaved, ``--rounds`` rounds, packs on the disk
  and in /dev/shm: wall (from the call to the renamed pack), first chunk, and the rate
  after the first chunk (images / (wall - first chunk), as in the round-8 tables);
* one build of each tree in a fresh interpreter (imports and CUDA start included).

    python scripts/probe_build_read.py --old-tree .oldtree [--tree mid=.midtree]
        [--images 16000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_build import ceiling, clean, disk_probe, lib_build, set_b

from _out import dump


def _timed(src: str, dst: str, side: int, workers: int, device: str) -> dict:
    """In a server child: one library build, timed through its progress callback."""
    import packer
    from packer.build import BuildConfig

    clean(Path(dst))
    marks: list[tuple[float, int]] = []

    def progress(n: int) -> None:
        marks.append((time.perf_counter(), n))

    t = time.perf_counter()
    r = packer.build_pack(
        src, dst,
        BuildConfig(size=(side, side), workers=workers, overwrite=True, device=device),
        progress=progress,
    )  # fmt: skip
    wall = time.perf_counter() - t
    clean(Path(dst))
    first = marks[0][0] - t if marks else wall
    keep = ("setup_s", "first_chunk_s", "decode_s", "finalize_s")
    return {
        "img_per_s": r.count / wall,
        "wall_s": wall,
        "first_chunk_s": first,
        "after_first_img_per_s": r.count / (wall - first) if wall > first else 0.0,
        "extra": {k: r.extra.get(k) for k in keep},
    }


def serve() -> None:
    """A warm interpreter (its tree first on PYTHONPATH): one build per stdin line."""
    for line in sys.stdin:
        job = json.loads(line)
        if job is None:
            return
        res = _timed(job["src"], job["dst"], job["side"], job["workers"], job["device"])
        print("RESULT " + json.dumps(res), flush=True)


class Child:
    def __init__(self, tree: Path) -> None:
        rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree.resolve()), *rest])}
        self.p = subprocess.Popen(
            [sys.executable, __file__, "--serve"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, env=env, cwd="/",
        )  # fmt: skip

    def build(self, src: Path, dst: Path, side: int, workers: int, device: str) -> dict:
        assert self.p.stdin is not None and self.p.stdout is not None
        job = {"src": str(src), "dst": str(dst), "side": side, "workers": workers}
        job["device"] = device
        self.p.stdin.write(json.dumps(job) + "\n")
        self.p.stdin.flush()
        for line in self.p.stdout:
            if line.startswith("RESULT "):
                return json.loads(line[7:])
        raise RuntimeError(f"build child ended (exit {self.p.wait()})")

    def close(self) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write("null\n")
        self.p.stdin.close()
        self.p.wait(timeout=120)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--images", type=int, default=16000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--old-tree", type=Path, required=False)
    ap.add_argument(
        "--tree", action="append", default=[], metavar="NAME=PATH",
        help="another checkout to build with, beside old and new (repeatable)",
    )  # fmt: skip
    ap.add_argument("--work", type=Path, default=Path("/tmp/imgpack-gpu/read"))
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test of this script")
    args = ap.parse_args()
    if args.serve:
        serve()
        return
    from probe_build_procs import run_procs

    repo = Path(__file__).resolve().parent.parent
    trees = {"new": repo}
    if args.old_tree:
        trees = {"old": args.old_tree, **trees}
    for t in args.tree:
        name, _, path = t.partition("=")
        trees = {**{k: v for k, v in trees.items() if k != "new"}, name: Path(path), "new": repo}
    cores, side, src, files = set_b(args.work, args.images)
    shm = Path("/dev/shm/imgpack-read")
    shm.mkdir(parents=True, exist_ok=True)
    places = {"disk": args.work, "shm": shm}
    res: dict = {"files": len(files), "cores": cores}

    def show(name: str, v) -> None:
        res[name] = v
        print(f"{name}: {json.dumps(v) if isinstance(v, dict) else v}", flush=True)

    nbytes = len(files) * 3 * side * side
    show("ceiling_16proc", ceiling(files, cores, side))
    for where, folder in places.items():
        show(f"{where}_alone", disk_probe(folder, nbytes, 256 * 3 * side * side, True))
        if args.device == "cuda":
            show(f"prototype_{where}", run_procs(files, side, 1, folder / "rows.u8"))
    children = {name: Child(tree) for name, tree in trees.items()}
    for name, c in children.items():  # CUDA, nvjpeg, the crop kernel: off the clock
        show(f"warmup_{name}", c.build(src, shm / "pack", side, cores, args.device))
    for rnd in range(args.rounds):
        order = list(children) if rnd % 2 == 0 else list(children)[::-1]
        for where, folder in places.items():
            for name in order:
                show(
                    f"{name}_{where}_{rnd}",
                    children[name].build(src, folder / "pack", side, cores, args.device),
                )
    for c in children.values():
        c.close()
    for name, tree in trees.items():
        rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        env = {"PYTHONPATH": os.pathsep.join([str(Path(tree).resolve()), *rest])}
        show(f"fresh_{name}", lib_build(src, args.work / "pack", side, cores, env, args.device))
        clean(args.work / "pack")
    dump(res, "probe_build_read.json")

    c = res["ceiling_16proc"]
    rows: list[tuple[str, str]] = []

    def row(name: str, *vals: float) -> None:
        rows.append(
            (name, " / ".join(f"{v:,.0f}" for v in vals), " / ".join(f"{v / c:.2f}" for v in vals))
        )

    row("16-process Pillow ceiling", c)
    for where in places:
        row(f"{where} alone (pwrite + writeback + fsync)",
            len(files) * res[f"{where}_alone"]["GBps"] * 1e9 / nbytes)  # fmt: skip
        if f"prototype_{where}" in res:
            row(
                f"GPU half alone, 1 process, rows on {where}",
                res[f"prototype_{where}"]["img_per_s"],
            )
    for where in places:
        for name in trees:
            runs = [res[f"{name}_{where}_{r}"] for r in range(args.rounds)]
            whole = sorted(r["img_per_s"] for r in runs)
            after = sorted(r["after_first_img_per_s"] for r in runs)
            first = sorted(r["first_chunk_s"] for r in runs)
            row(
                f"{name} build, warm, pack on {where}: whole, runs sorted",
                *whole[:: max(1, len(whole) // 2)][:3],
            )
            row("  after the first chunk (median)", after[len(after) // 2])
            rows.append(("  first chunk after (s, median)", f"{first[len(first) // 2]:.2f}", ""))
    for name in trees:
        f = res[f"fresh_{name}"]
        row(f"{name} build, fresh interpreter, pack on disk", f["count"] / f["seconds"])
    print(f"\n| set b, {len(files)} JPEGs -> {side}², {cores} cores | img/s | x ceiling |")
    print("|---|---|---|")
    for name, v, x in rows:
        print(f"| {name} | {v} | {x} |")


if __name__ == "__main__":
    main()
