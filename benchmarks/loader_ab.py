"""PackLoader before and after a change, same machine, same packs, same run.

Streams a raw pack (uint8 224², batch 256, shuffled, consumed with Normalize on the
device) and a JPEG pack (RandomResizedCrop 224 + flip in the loader) through two
copies of ``packer``: the one at ``--old`` (e.g. ``git archive REV packer | tar -x -C
.old``) and this tree's. Each measurement runs in its own process, alternating old
and new ``--rounds`` times, so a slow lease shows in both; the table gives medians
and new/old.

    python -m benchmarks.loader_ab --old .old --work /tmp/ab
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

CHILD = r"""
import json, sys, time, torch
sys.path.insert(0, sys.argv[1])
import packer
from packer.transforms import Compose, RandomHorizontalFlip, RandomResizedCrop
kind, path, batches = sys.argv[2], sys.argv[3], int(sys.argv[4])
dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
pack = packer.load(path)
norm = packer.Normalize().to(dev)
kw = {}
if kind == "jpeg":
    kw = dict(image_size=224, transform=Compose([RandomResizedCrop(224), RandomHorizontalFlip()]))
ld = packer.PackLoader(pack, 256, device=dev, drop_last=True, **kw)
assert len(ld) > 0, f'{path}: fewer than 256 images'
def run(n):
    k = 0
    while True:
        for x, y in ld:
            norm(x)
            k += 1
            if k == n:
                return
run(5)
stats = getattr(ld, "stats", None)  # an older tree may have none
if stats is not None:
    stats()
if dev.type == "cuda":
    torch.cuda.synchronize()
t0 = time.perf_counter()
run(batches)
if dev.type == "cuda":
    torch.cuda.synchronize()
rate = 256 * batches / (time.perf_counter() - t0)
st = stats().as_dict() if stats is not None else None
print(json.dumps({"rate": rate, "file": packer.__file__, "stats": st}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--old",
        type=Path,
        required=True,
        action="append",
        help="a folder holding an older packer/ (repeat it to bisect several)",
    )
    ap.add_argument("--kinds", default="raw,jpeg", help="raw, jpeg or both")
    ap.add_argument("--work", type=Path, default=Path("/tmp/imgpack-ab"))
    ap.add_argument("--images", type=int, default=16384)
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    from packer.measure.bench.synth import make_jpeg_tree, make_random_pack

    a.work.mkdir(parents=True, exist_ok=True)
    raw = a.work / "raw224"
    if not raw.exists():
        make_random_pack(raw, a.images, 224)
    jpeg = a.work / "jpeg"
    if not jpeg.exists() and "jpeg" in a.kinds:
        tree = a.work / "tree"
        make_jpeg_tree(tree, a.images // 4, (500, 375), classes=10)
        cmd = [
            sys.executable,
            "-m",
            "packer",
            "build",
            str(tree),
            str(jpeg),
            "--store",
            "jpeg",
            "-q",
        ]
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": path})
    res: dict[str, dict[str, list[float]]] = {}
    stats: dict[str, dict[str, dict]] = {}
    for _ in range(a.rounds):
        runs = (("raw", raw, a.batches), ("jpeg", jpeg, a.batches // 5))
        trees = [(o.name if len(a.old) > 1 else "old", o.resolve()) for o in a.old] + [
            ("new", ROOT)
        ]
        for kind, path, n in (r for r in runs if r[0] in a.kinds.split(",")):
            for name, tree in trees:
                out = subprocess.run(
                    [sys.executable, "-c", CHILD, str(tree), kind, str(path), str(n)],
                    capture_output=True, text=True, cwd=a.work,  # '' on sys.path: not this repo
                )  # fmt: skip
                if out.returncode:
                    print(out.stderr[-3000:], file=sys.stderr)
                    raise SystemExit(f"{name} {kind} failed")
                r = json.loads(out.stdout.strip().splitlines()[-1])
                assert Path(r["file"]).resolve().is_relative_to(tree), (r["file"], tree)
                res.setdefault(kind, {}).setdefault(name, []).append(r["rate"])
                if r.get("stats") is not None:  # the latest round's, per tree
                    stats.setdefault(kind, {})[name] = r["stats"]
    out_dir = Path(os.environ.get("OUT", "out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "loader_ab.json").write_text(json.dumps(res, indent=1))
    (out_dir / "loader_ab_stats.json").write_text(json.dumps(stats, indent=1))
    print(f"{'stream':26s} {'tree':>12s} {'img/s':>12s} {'new/this':>9s}")
    for kind, d in res.items():
        label = "raw 224², batch 256" if kind == "raw" else "JPEG pack, RRC 224 + flip"
        n = statistics.median(d["new"])
        for name, rates in d.items():
            r = statistics.median(rates)
            print(f"{label:26s} {name:>12s} {r:12,.0f} {n / r:9.3f}")
    for kind, d in stats.items():
        for name, st in d.items():
            slow = st["slowest_stage"]
            ms = {s: round(t * 1e3, 2) for s, t in st["stage_batch_s"].items() if t}
            print(
                f"stats {kind} {name}: wait {st['wait_share']:.1%} of the time "
                f"(p99 {st['wait_p99_s'] * 1e3:.2f} ms); ms a batch {ms}; slowest {slow}; "
                f"decode {st['decode_path']}"
            )


if __name__ == "__main__":
    main()
