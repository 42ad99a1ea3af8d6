"""How much GPU work does torchvision's nvjpeg decode do per image, by output mode,
and does a second process add decode throughput?

* ``decode_jpeg(list, device="cuda", mode=RGB)`` (what packer.jpeg uses) against
  ``mode=UNCHANGED`` (planar YCbCr straight from the decoder, no colour conversion):
  img/s, and the CUDA kernels each launches per batch (``torch.profiler``);
* the layout UNCHANGED returns for 4:2:0 files (is channel 0 the luma of the RGB decode?);
* one process decoding alone, against two decoding at once (each with its own decoder,
  so its own lock and host thread): the summed img/s.

    python scripts/probe_nvjpeg_modes.py [--images 512]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def load(root: Path) -> list:
    import torch

    files = sorted(root.rglob("*.jpg"))
    return [torch.frombuffer(bytearray(f.read_bytes()), dtype=torch.uint8) for f in files]


def rate(datas: list, mode, seconds: float = 3.0, batch: int = 256) -> float:
    import torch
    from torchvision.io import decode_jpeg

    for _ in range(3):
        decode_jpeg(datas[:batch], device="cuda", mode=mode)
    torch.cuda.synchronize()
    n, t0 = 0, time.perf_counter()
    i = 0
    while time.perf_counter() - t0 < seconds:
        a = (i * batch) % (len(datas) - batch + 1)
        decode_jpeg(datas[a : a + batch], device="cuda", mode=mode)
        n += batch
        i += 1
    torch.cuda.synchronize()
    return n / (time.perf_counter() - t0)


def kernels(datas: list, mode, batch: int = 256) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile
    from torchvision.io import decode_jpeg

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(2):
            decode_jpeg(datas[:batch], device="cuda", mode=mode)
        torch.cuda.synchronize()
    count: Counter = Counter()
    gpu_us: Counter = Counter()
    for e in prof.events():
        if e.device_type.name == "CUDA":
            count[e.name] += 1
            gpu_us[e.name] += e.device_time if hasattr(e, "device_time") else e.cuda_time
    top = sorted(gpu_us, key=lambda k: -gpu_us[k])[:12]
    return {k: {"per_batch": count[k] / 2, "us_per_batch": gpu_us[k] / 2} for k in top}


def child(root: str, seconds: float, start_at: float) -> None:
    import torch
    from torchvision.io import ImageReadMode

    datas = load(Path(root))
    torch.zeros(1, device="cuda")
    rate(datas, ImageReadMode.RGB, seconds=0.5)
    while time.time() < start_at:
        time.sleep(0.01)
    print("RATE", rate(datas, ImageReadMode.RGB, seconds=seconds), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--child", nargs=3, default=None)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], float(args.child[1]), float(args.child[2]))
        return
    import torch
    from torchvision.io import ImageReadMode, decode_jpeg

    from packer.bench.synth import make_jpeg_tree

    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "set"
        make_jpeg_tree(root, args.images, (500, 375), quality=90)
        datas = load(root)
        torch.zeros(1, device="cuda")
        for name, mode in (("RGB", ImageReadMode.RGB), ("UNCHANGED", ImageReadMode.UNCHANGED)):
            out[f"rate_{name}"] = [rate(datas, mode) for _ in range(2)]
            out[f"kernels_{name}"] = kernels(datas, mode)
        rgb = decode_jpeg(datas[:8], device="cuda", mode=ImageReadMode.RGB)
        raw = decode_jpeg(datas[:8], device="cuda", mode=ImageReadMode.UNCHANGED)
        r, g, b = rgb[0].float()
        y = 0.299 * r + 0.587 * g + 0.114 * b
        out["unchanged_shape"] = list(raw[0].shape)
        out["rgb_shape"] = list(rgb[0].shape)
        out["unchanged_c0_vs_luma_mae"] = float((raw[0][0].float() - y).abs().mean())
        out["unchanged_c1_mean_rows_top_bottom"] = [
            float(raw[0][1][: raw[0].shape[1] // 2].float().mean()),
            float(raw[0][1][raw[0].shape[1] // 2 :].float().mean()),
        ]
        # two processes decoding at once, against one
        for procs in (1, 2, 3):
            start_at = time.time() + 8
            ps = [subprocess.Popen([sys.executable, __file__, "--child", str(root), "4",
                                    str(start_at)], stdout=subprocess.PIPE, text=True)
                  for _ in range(procs)]  # fmt: skip
            rates = []
            for p in ps:
                o, _ = p.communicate()
                rates += [float(x.split()[1]) for x in o.splitlines() if x.startswith("RATE")]
            out[f"procs_{procs}"] = rates
    print(json.dumps(out, indent=1))
    print("\n| what | img/s |")
    print("|---|---|")
    for name in ("RGB", "UNCHANGED"):
        print(f"| decode_jpeg list of 256, mode {name} | "
              f"{' / '.join(f'{x:,.0f}' for x in out[f'rate_{name}'])} |")  # fmt: skip
    for procs in (1, 2, 3):
        r = out[f"procs_{procs}"]
        print(f"| {procs} process(es) at once, RGB: sum (each) | {sum(r):,.0f} "
              f"({' / '.join(f'{x:,.0f}' for x in r)}) |")  # fmt: skip
    for name in ("RGB", "UNCHANGED"):
        print(f"\nkernels per batch of 256, mode {name}:")
        for k, v in out[f"kernels_{name}"].items():
            print(f"  {v['per_batch']:6.0f} x {v['us_per_batch'] / 1000:7.2f} ms  {k[:90]}")


if __name__ == "__main__":
    main()
