"""ResNet-18 with DistributedDataParallel fed by PackLoader: images/s on 1..N GPUs.

    torchrun --standalone --nproc-per-node 2 examples/train_ddp.py --pack PACK
    torchrun --standalone --nproc-per-node 1 examples/train_ddp.py --pack PACK

Each rank opens the pack itself (one memory map per process; the page cache is
shared) and PackLoader gives it a disjoint part of each epoch (rank and world
size come from the process group). Measured per world size, each the median of
3 repeats after warm-up, with every rank's GPU synchronized and a barrier
before each clock read:

  stream     PackLoader alone on each rank (Normalize on the GPU, no model)
  train      DDP ResNet-18, bf16 autocast, channels_last, batch B per GPU
  ceiling    the same DDP step on batches already on the GPU (what the GPUs
             and the all-reduce allow without any loading)

Also checks, before timing, that the ranks' epoch-0 indices are disjoint and
cover the pack. Rank 0 prints one JSON line and writes $OUT/ddp_wN.json.
With --make-pack N, rank 0 first writes a random 224² pack of N images.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off on these machines

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the benchmarks package
import packer
from benchmarks._common import dump, machine
from packer.measure.bench.synth import make_random_pack
from packer.measure.timing import median_rate
from train_example import make_model, make_optimizer, train_step


def timed(step: Callable[[], int], warmup: int, steps: int, repeats: int = 3) -> float:
    """Median images/s (this rank) over ``repeats`` runs of ``steps`` calls, every rank
    synchronized and at a barrier before each clock read (``packer.measure.timing``)."""
    for _ in range(warmup):
        step()
    return median_rate(
        lambda: sum(step() for _ in range(steps)),
        torch.device("cuda", torch.cuda.current_device()),
        repeats,
        barrier=dist.barrier,
    )


def forever(loader: packer.PackLoader) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    epoch = 0
    while True:
        loader.set_epoch(epoch)  # every rank must agree on the epoch's permutation
        yield from loader
        epoch += 1


def check_split(pack: packer.ImagePack, n: int, world: int) -> bool:
    """Every rank's epoch-0 part (no drop_last: the whole epoch) is the same length, and
    together they cover the pack with fewer than ``world`` padded repeats."""
    mine = packer.PackLoader(pack, 1, device="cuda").indices(0).cuda()
    parts = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(parts, mine)
    seen = torch.cat(parts)
    per_rank_equal = all(len(p) == len(mine) for p in parts)
    covers = torch.unique(seen).numel() == n
    doubled = seen.numel() - n  # DistributedSampler-style padding, at most world - 1
    return per_rank_equal and covers and 0 <= doubled < world


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pack", type=Path, default=Path("/tmp/imgpack-bench/ddp224"))
    ap.add_argument("--make-pack", type=int, default=0, metavar="N")
    ap.add_argument("--batch-size", type=int, default=256, help="per GPU")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--threads", type=int, default=None, help="PackLoader threads per rank")
    args = ap.parse_args()

    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    torch.backends.cudnn.benchmark = True
    if args.make_pack and rank == 0 and not (args.pack / "imgpack.json").exists():
        make_random_pack(args.pack, args.make_pack, 224, classes=100)
    dist.barrier()

    pack = packer.load(args.pack)  # this rank's own memory map
    threads = args.threads or max(1, min(8, (os.cpu_count() or 1) // world))
    b = args.batch_size
    loader = packer.PackLoader(
        pack, b, device=f"cuda:{local}", drop_last=True, num_threads=threads, seed=0
    )
    assert loader.rank == rank and loader.world_size == world, "defaults from the process group"
    split_ok = check_split(pack, len(pack), world)

    norm = packer.Normalize().cuda()
    batches = forever(loader)

    def stream_step() -> int:
        x, _ = next(batches)
        norm(x)
        return len(x)

    stream = timed(stream_step, args.warmup, args.steps * 2)

    torch.manual_seed(0)
    model = DDP(make_model("resnet18", len(pack.classes)), device_ids=[local])
    opt = make_optimizer(model)

    def train_from_pack() -> int:
        x, y, *_ = next(batches)
        train_step(model, opt, x, y)
        return len(x)

    x0 = torch.randint(0, 256, (b, 3, 224, 224), dtype=torch.uint8, device="cuda")
    y0 = torch.randint(0, len(pack.classes), (b,), device="cuda")

    def train_on_gpu() -> int:
        train_step(model, opt, x0, y0)
        return b

    ceiling = timed(train_on_gpu, args.warmup, args.steps)
    train = timed(train_from_pack, args.warmup, args.steps)
    loader.close()

    rates = torch.tensor([stream, train, ceiling], device="cuda", dtype=torch.float64)
    every = [torch.empty_like(rates) for _ in range(world)]
    dist.all_gather(every, rates)
    if rank == 0:
        per_rank = [r.tolist() for r in every]
        out = {
            "world_size": world,
            "batch_per_gpu": b,
            "threads_per_rank": threads,
            "images": len(pack),
            "split_ok": split_ok,
            "stream_per_rank": [round(r[0]) for r in per_rank],
            "train_total": round(sum(r[1] for r in per_rank)),
            "ceiling_total": round(sum(r[2] for r in per_rank)),
            "machine": {**machine(), "gpus": torch.cuda.device_count()},
        }
        out["train_of_ceiling"] = round(out["train_total"] / out["ceiling_total"], 4)
        print(json.dumps(out), flush=True)
        dump(out, f"ddp_w{world}.json")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
