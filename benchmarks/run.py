#!/usr/bin/env python3
"""The maintained benchmarks, one entry point: list them, run some, print their tables.

    python3 -m benchmarks.run list                     # what there is (from the repo root)
    python3 -m benchmarks.run augment train            # on a GPU machine, in one call
    OUT=/tmp/out python3 -m benchmarks.run tests cuda  # logs and JSON under $OUT (./out)

Each benchmark measures its baseline in the same run and prints a table last; logs
and JSON go under ``$OUT``. The tables are printed again at the end, in order, so
one call's output tail holds all of them. Exit status: 0 when every part ran,
1 when one failed (the others still run), 2 for an unknown part.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORK = os.environ.get("IMGPACK_BENCH_WORK", "/tmp/imgpack-gpu")
PY = sys.executable

# name: (what it answers, the command; {out} and {work} are filled in)
PARTS: dict[str, tuple[str, list[str]]] = {
    "tests": ("the whole test suite, CUDA tests included",
              [PY, "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider", "-x"]),
    "cuda": ("the test files that hold CUDA tests",
             [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "-m", "cuda", "tests"]),
    "augment": ("batched per-image augmentation on the GPU vs a device copy of the same bytes",
                [PY, "-m", "benchmarks.augment", "--device", "cuda", "--json", "{out}/augment.json"]),
    "train": ("ResNet-18/50 fed by PackLoader + augmentation vs resident batches vs ImageFolder",
              [PY, "-m", "benchmarks.train_aug", "--jpeg", "--work", "{work}", "--out", "{out}"]),
    "rn50": ("ResNet-50 fed by a JPEG pack vs resident batches",
             [PY, "-m", "benchmarks.train_aug", "--jpeg", "--archs", "resnet50", "--no-folder",
              "--work", "{work}", "--out", "{out}"]),
    "stream": ("PackLoader on 50,000-image packs vs the machine's copy limits",
               [PY, "-m", "benchmarks.stream", "--work", "{work}"]),
    "build": ("build speed vs the machine's 16-process decode ceiling",
              [PY, "-m", "benchmarks.build", "--images", "16000", "--work", "{work}"]),
    "gpubuild": ("build --device cuda vs the CPU build vs the ceiling",
                 [PY, "-m", "benchmarks.build", "--sets", "b", "--variants", "new,gpu", "--no-disk",
                  "--repeats", "3", "--images", "16000", "--work", "{work}/build"]),
    "lanes": ("JPEG decoders at once, the loader's lanes, what costs ResNet-50 time",
              [PY, "-m", "benchmarks.decode_lanes", "--device", "cuda", "--parts",
               "bare,loader,train,blocking,interfere", "--work", "{work}/lanes"]),
    "share": ("what a JPEG loader takes from ResNet-50: a profile, the crop whole vs in "
              "slices, pixels on sample_data (set CUDA_DEVICE_MAX_CONNECTIONS=8 to see 8 queues)",
              [PY, "-m", "benchmarks.model_share", "--device", "cuda", "--parts",
               "profile,ab,pixels", "--chunks", "0,8", "--work", "{work}/share"]),
    "bound": ("what bounds build --device cuda: the ceiling, bare decoders, the disk, the build",
              [PY, "-m", "benchmarks.build_bound", "--device", "cuda", "--parts",
               "ceiling,bare,write,build,stages", "--work", "{work}/bound"]),
    "kernels": ("what a batched GPU JPEG decode and the loader's crop run on the SMs",
                [PY, "-m", "benchmarks.decode_kernels", "--device", "cuda",
                 "--work", "{work}/kernels"]),
    "jpeg": ("JPEG packs and the GPU build vs the CPU ceiling",
             [PY, "-m", "benchmarks.jpeg", "--images", "8192", "--work", "{work}/jpeg"]),
    "startup": ("imgpack info / verify --no-speed / build of 100 images vs import packer / torch",
                [PY, "-m", "benchmarks.startup", "--work", "{work}/startup"]),
    "compress": ("imgpack compress: size and time per quality",
                 [PY, "-m", "benchmarks.compress", "--work", "{work}/compress"]),
    "recipe": ("the modern recipe (RRC, TrivialAugmentWide, erasing, MixUp/CutMix) vs a device "
               "copy; ResNet-50 fed by it vs resident vs torchvision's reference data path",
               [PY, "-m", "benchmarks.recipe", "--work", "{work}/recipe"]),
    "recipe_host": ("the recipe's random draws on the host, µs per batch of 256 (CPU), this "
                    "tree vs the packer/ under $OLD_TREE when it is set",
                    [PY, "-m", "benchmarks.recipe_host",
                     *(["--against", os.environ["OLD_TREE"]] if os.environ.get("OLD_TREE") else [])]),
    "sets": ("PackLoader over a 16-shard set vs one pack, shard vs global order, ResNet-50 on sets",
             [PY, "-m", "benchmarks.sets", "--work", "{work}/sets"]),
    "ab": ("PackLoader raw and JPEG streaming, this tree vs the packer/ under $OLD_TREE, alternating",
           [PY, "-m", "benchmarks.loader_ab", "--old", os.environ.get("OLD_TREE", ".old"),
            "--work", "{work}/ab"]),
    "remote": ("a pack set streamed from an S3 server on this machine (rclone) vs local disk: "
               "cold, warm cache, bytes fetched per epoch",
               [PY, "-m", "benchmarks.remote", "--images", "65536", "--side", "128",
                "--shard-images", "2048", "--work", "{work}/remote"]),
    "dali": ("the JPEG-pack loader beside DALI's ResNet-50 pipeline on the same files (needs "
             "nvidia-dali: ../shared/gpu/wheels.sh --with-dali), nvImageCodec bare",
             [PY, "-m", "benchmarks.dali", "--work", "{work}/dali"]),
    "crop": ("the JPEG loader's crop kernel on 12 MP and 2 MP photos: single patches vs the "
             "parts kernel, first-call compiles and ms a batch",
             [PY, "-m", "benchmarks.crop_parts"]),
    "maxside": ("what build --max-side does to the JPEG loader's rate and the crops' pixels",
                [PY, "-m", "benchmarks.max_side", "--device", "cuda", "--work", "{work}/maxside"]),
    "stats": ("what PackLoader.stats() costs: the loader with stats on vs off, alternating",
              [PY, "-m", "benchmarks.stats_cost", "--jpeg", "--work", "{work}/stats"]),
    "dense": ("issue 46's figures: Faster R-CNN and DeepLabV3 fed by packs vs resident vs the "
              "reference data path, the loaders alone, mAP / mIoU through both paths",
              [PY, "-m", "benchmarks.dense", "--device", "cuda", "--work", "{work}/dense",
               "--out", "{out}"]),
    "bench": ("the full `imgpack bench` grid (about 7 minutes on 16 cores)",
              [PY, "-m", "packer", "bench", "--device", "cuda", "--out", "{out}/bench", "-q"]),
}  # fmt: skip


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("list", "-h", "--help"):
        print(__doc__)
        for name, (what, _) in PARTS.items():
            print(f"  {name:10s} {what}")
        return 0
    unknown = [a for a in argv if a not in PARTS]
    if unknown:
        print(f"unknown part(s): {' '.join(unknown)}; choose from {' '.join(PARTS)}",
              file=sys.stderr)  # fmt: skip
        return 2
    out = Path(os.environ.get("OUT", ROOT / "out"))
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OUT": str(out), "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    failed = []
    for name in argv:
        cmd = [c.format(out=out, work=WORK) for c in PARTS[name][1]]
        print(f"==== {name}: {' '.join(cmd)}", flush=True)
        with open(out / f"{name}.txt", "w") as log:
            rc = subprocess.call(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        if rc:
            failed.append(name)
    for name in argv:
        lines = (out / f"{name}.txt").read_text(errors="replace").splitlines()
        print(f"==== {name}" + (" (FAILED)" if name in failed else ""))
        print("\n".join(lines[-25:]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
