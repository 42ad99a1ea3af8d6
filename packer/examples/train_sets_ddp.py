"""DDP fed by a pack set, with an elastic resume: stop mid-epoch on W ranks, go on on W'.

    # 8 GPUs, NCCL; stop after 20 steps, then finish the epoch on 4 GPUs (same global batch)
    torchrun --standalone --nproc-per-node 8 examples/train_sets_ddp.py --pack SET \\
        --batch-size 256 --stop-after 20 --state /tmp/run
    torchrun --standalone --nproc-per-node 4 examples/train_sets_ddp.py --pack SET \\
        --batch-size 512 --resume --state /tmp/run
    # CPU processes over gloo (the test suite runs this with a tiny model)
    torchrun --standalone --nproc-per-node 4 examples/train_sets_ddp.py --pack SET \\
        --device cpu --model tiny --batch-size 4 --stop-after 2 --state /tmp/run

Each rank opens the set itself (every rank maps the same shard files: the page cache
holds one copy) and streams its part of the epoch (``--order global|shards``). Every
step the ranks gather the ids of the images they trained on (each image's index in the
set, found from its pixels when ``--check-ids``, else from ``loader.indices``); rank 0
appends them to ``STATE/seen.jsonl``. ``--stop-after K`` saves ``loader.state_dict()``
(the same on every rank) to ``STATE/loader.json`` after K steps and stops; ``--resume``
restores it on however many ranks this run has, with ``batch_size * world_size``
unchanged, and finishes the epoch. Rank 0 prints one JSON line: steps, images/s,
the model's and loader's figures, and the node's RSS and page cache.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import time
from pathlib import Path

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off on these machines

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import packer
from packer.pack.files import loads_json


def tiny_model(classes: int) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, max(1, classes)),
    )


def id_table(s: packer.PackSet) -> dict[bytes, int]:
    """Image bytes digest -> index in the set (small sets: the test's check)."""
    out = {}
    for i in range(len(s)):
        x = packer.PackDataset(s)[i][0]
        out[hashlib.blake2b(x.numpy().tobytes(), digest_size=12).digest()] = i
    return out


def node_memory() -> dict[str, float]:
    """MiB of this process's private memory (RssAnon) and mapped file pages (RssFile:
    shared with every process mapping the same shard files), and the node's page cache
    and used memory (Linux)."""
    out = {}
    try:
        with open("/proc/self/status") as f:
            status = dict(line.split(":", 1) for line in f if ":" in line)
        out["rss_anon_mib"] = int(status["RssAnon"].split()[0]) / 1024
        out["rss_file_mib"] = int(status["RssFile"].split()[0]) / 1024
        with open("/proc/meminfo") as f:
            info = {k: int(v.split()[0]) / 1024 for k, v in (line.split(":", 1) for line in f)}
        out["page_cache_mib"] = info["Cached"]
        out["node_used_mib"] = info["MemTotal"] - info["MemAvailable"]
    except (OSError, KeyError, ValueError):
        pass
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pack", required=True, help="a pack set (folder or s3:// URL)")
    ap.add_argument("--cache-dir", type=Path, default=None, help="s3:// sets: the node's cache")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--model", default="resnet50", help="'tiny' or a torchvision model name")
    ap.add_argument("--batch-size", type=int, default=256, help="per rank")
    ap.add_argument("--order", default="global", choices=["global", "shards"])
    ap.add_argument("--canonical-ranks", type=int, default=None)
    ap.add_argument("--image-size", type=int, default=224, help="JPEG sets: the crop side")
    ap.add_argument("--stop-after", type=int, default=0, metavar="K")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--state", type=Path, required=True, help="folder for the state and ids")
    ap.add_argument("--check-ids", action="store_true", help="ids from pixels (small sets)")
    ap.add_argument("--epoch", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=0, help="steps before the clock starts")
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (timing)")
    ap.add_argument(
        "--resident", action="store_true", help="the same step on one batch kept on the device"
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=0,
        help="the loader's threads (0: the cores / ranks, at most 8)",
    )
    ap.add_argument(
        "--no-ddp", action="store_true", help="one rank: the model without DDP's wrapper"
    )
    args = ap.parse_args()

    cuda = args.device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))
    dev = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(local)
    s = (
        packer.load(args.pack, cache_dir=args.cache_dir)
        if args.cache_dir
        else packer.load(args.pack)
    )
    kw = {"image_size": args.image_size} if s.kind.decoded else {}
    loader = packer.PackLoader(
        s,
        args.batch_size,
        device=dev,
        order=args.order,
        canonical_ranks=args.canonical_ranks,
        num_threads=args.threads or max(1, min(8, (os.cpu_count() or 1) // world)),
        **kw,
    )
    args.state.mkdir(parents=True, exist_ok=True)
    saved = args.state / "loader.json"
    if args.resume:
        loader.load_state_dict(loads_json(saved.read_text()))
    else:
        loader.set_epoch(args.epoch)
    epoch = loader.epoch
    table = id_table(s) if args.check_ids else None
    rows = loader.indices(epoch)
    start = loader.state_dict()["batches"]

    classes = max(1, len(s.classes))
    if args.model == "tiny":
        net = tiny_model(classes)
    else:
        import torchvision

        net = getattr(torchvision.models, args.model)(num_classes=classes)
    net = net.to(dev, memory_format=torch.channels_last)
    if args.no_ddp and world != 1:
        raise SystemExit("--no-ddp: one rank only")
    model = net if args.no_ddp else DDP(net, device_ids=[local] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    norm = packer.Normalize().to(dev)
    seen_file = args.state / "seen.jsonl"
    steps = 0
    images = 0
    t0 = time.perf_counter()

    def epochs():  # timing runs go on past the epoch's end
        e, first = epoch, start
        while True:
            yield from enumerate(loader, start=first)
            if not args.steps:
                return
            e, first = e + 1, 0
            loader.set_epoch(e)

    batches = epochs()
    if args.resident:
        b0, (x0, y0, *_) = next(batches)
        batches = ((b0, (x0, y0)) for _ in iter(int, 1))
    for b, (x, y, *_) in batches:
        if steps == args.warmup and args.warmup:
            if cuda:
                torch.cuda.synchronize()
            dist.barrier()
            t0, images = time.perf_counter(), 0
        if args.resident or args.steps:
            ids = []
        elif table is not None:
            flat = x.cpu().reshape(len(x), -1).numpy()
            ids = [table[hashlib.blake2b(r.tobytes(), digest_size=12).digest()] for r in flat]
        else:
            ids = rows[b * args.batch_size : b * args.batch_size + len(x)].tolist()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda):
            out = model(norm(x).contiguous(memory_format=torch.channels_last))
            loss = torch.nn.functional.cross_entropy(out.float(), y.clamp(min=0))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if not args.steps:  # timing runs skip the bookkeeping
            every = [None] * world
            dist.all_gather_object(every, list(ids))
            if rank == 0:
                with open(seen_file, "a") as f:
                    f.write(json.dumps({"epoch": epoch, "batch": b, "world": world, "ids": every}))
                    f.write("\n")
        steps += 1
        images += len(x)
        if args.stop_after and steps == args.stop_after:
            break
        if args.steps and steps == args.steps + args.warmup:
            break
    if cuda:
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    state = loader.state_dict()
    if rank == 0 and args.stop_after and steps == args.stop_after:
        tmp = saved.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, saved)  # whole or absent
    total = torch.tensor([images], dtype=torch.int64, device=dev)  # NCCL reduces device tensors
    dist.all_reduce(total)
    memory = [None] * world
    dist.all_gather_object(memory, node_memory())
    if rank == 0:
        out = {
            "world_size": world,
            "batch_per_rank": args.batch_size,
            "order": args.order,
            "epoch": epoch,
            "first_batch": start,
            "steps": steps,
            "images_per_s": round(int(total) / dt, 1) if dt > 0 else None,
            "resident": args.resident,
            "state": state,
            # the ranks' private memory adds up; their mapped shard pages are one copy
            # in the page cache, so the node's figures are the ones to compare
            "rss_anon_mib_all_ranks": round(sum(m.get("rss_anon_mib", 0) for m in memory), 1),
            "rss_file_mib_max_rank": round(max(m.get("rss_file_mib", 0) for m in memory), 1),
            "page_cache_mib": memory[0].get("page_cache_mib"),
            "node_used_mib": memory[0].get("node_used_mib"),
        }
        print(json.dumps(out), flush=True)
    loader.close()
    # DDP's reducer holds the process group and its gloo work: free them while the
    # interpreter is whole, not in its finalization, where gloo's threads abort
    # ("terminate called without an active exception"; pytorch/pytorch#179291)
    model = opt = net = out = loss = None
    gc.collect()
    dist.barrier()  # every rank done with the group before any tears it down
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
