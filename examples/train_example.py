"""Train a torchvision ResNet on a pack, and show what data loading costs the step.

Training as it should be written: packer.Normalize at the front of the model,
bf16 autocast, channels_last, a fused optimizer, no host synchronization in
the step (the loss is read only at the end), torch.inference_mode() to evaluate.

    python examples/train_example.py PACK [--arch resnet18] [--epochs 1] [--batch-size 256]
    python examples/train_example.py --bench [--folder JPEG_DIR] [--pack PACK]

--bench times the same model fed three ways in one run:
  (a) PackLoader streaming the pack to the GPU,
  (b) the same images already resident on the GPU (the upper bound),
  (c) ImageFolder + Pillow + DataLoader(15 workers, pin_memory) over JPEGs.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torchvision
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

import packer
from packer.measure.timing import time_loader


def make_model(arch: str, num_classes: int) -> nn.Module:
    net = getattr(torchvision.models, arch)(weights=None, num_classes=num_classes)
    return nn.Sequential(packer.Normalize(), net).cuda().to(memory_format=torch.channels_last)


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    try:
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True)
    except (TypeError, RuntimeError):
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=True)


def train_step(
    model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    x = x.contiguous(memory_format=torch.channels_last)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


@torch.inference_mode()
def evaluate(model: nn.Module, loader: packer.PackLoader) -> float:
    model.eval()
    correct = total = torch.zeros((), device="cuda", dtype=torch.int64)
    for x, y, *_ in loader:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            pred = model(x.contiguous(memory_format=torch.channels_last)).argmax(1)
        correct = correct + (pred == y).sum()
        total = total + len(y)
    model.train()
    return (correct / total.clamp(min=1)).item()


def timed(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    batches: Iterator,
    warmup: int,
    steps: int,
    repeats: int = 3,
) -> float:
    """Median images/s over ``repeats`` runs of ``steps`` training steps (``packer.measure.timing``)."""

    def step(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        train_step(model, opt, *batch)
        return batch[0]

    return time_loader(lambda: batches, step, torch.device("cuda"), steps, repeats, warmup=warmup)


def forever(loader: packer.PackLoader) -> Iterator:
    epoch = 0
    while True:
        loader.set_epoch(epoch)
        yield from loader
        epoch += 1


def resident_batches(pack: packer.ImagePack, bs: int) -> Iterator:
    images = pack.images.contiguous().cuda()
    labels = pack.labels.contiguous().cuda()
    g = torch.Generator(device="cuda")
    g.manual_seed(0)
    while True:
        idx = torch.randint(0, len(images), (bs,), device="cuda", generator=g)
        yield images.index_select(0, idx), labels.index_select(0, idx)


def folder_batches(folder: Path, bs: int, workers: int) -> Iterator:
    from torchvision import datasets, transforms

    tf = transforms.Compose(
        [transforms.Resize(224), transforms.CenterCrop(224), transforms.PILToTensor()]
    )
    ds = datasets.ImageFolder(str(folder), transform=tf)
    dl = torch.utils.data.DataLoader(
        ds,
        batch_size=bs,
        shuffle=True,
        num_workers=workers,
        pin_memory=True,
        drop_last=True,
        persistent_workers=True,
        prefetch_factor=4,
    )
    for x, y in forever(dl):
        yield x.cuda(non_blocking=True), y.cuda(non_blocking=True)


def bench(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the benchmarks package
    from benchmarks._common import dump, machine
    from packer.measure.bench.synth import make_jpeg_tree, make_random_pack

    work = args.work
    pack_path = args.pack or make_random_pack(work / "rand224", 50_000, 224)
    folder = args.folder
    if folder is None:
        folder = work / "jpeg640"
        make_jpeg_tree(folder, 8000, (640, 480), classes=10, quality=90)
    pack = packer.load(pack_path)
    classes = max(1, len(pack.classes))
    rows = []
    for arch in args.archs.split(","):
        r = {"arch": arch}
        feeds = {
            "pack": lambda: forever(
                packer.PackLoader(
                    pack, args.batch_size, device="cuda", drop_last=True, num_threads=8
                )
            ),
            "resident": lambda: resident_batches(pack, args.batch_size),
            "folder": lambda: folder_batches(folder, args.batch_size, args.folder_workers),
        }
        for name, make in feeds.items():
            torch.manual_seed(0)
            model = make_model(arch, classes)
            opt = make_optimizer(model)
            r[name] = timed(model, opt, make(), warmup=15, steps=args.steps)
            print(f"  {arch} fed by {name}: {r[name]:,.0f} img/s", flush=True)
            del model, opt
            torch.cuda.empty_cache()
        rows.append(r)
    print(f"\ntraining throughput, batch {args.batch_size}, bf16, channels_last ({machine()})")
    print(
        "| model | (a) PackLoader | (b) on GPU | (c) ImageFolder+PIL, "
        f"{args.folder_workers} workers | (a)/(b) | (a)/(c) |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['arch']} | {r['pack']:,.0f} | {r['resident']:,.0f} | {r['folder']:,.0f} | "
            f"{r['pack'] / r['resident']:.1%} | {r['pack'] / r['folder']:.1f}x |"
        )
    dump({"machine": machine(), "batch": args.batch_size, "rows": rows}, "bench_train.json")


def train(args: argparse.Namespace) -> None:
    pack = packer.load(args.pack_path)
    loader = packer.PackLoader(pack, args.batch_size, device="cuda", drop_last=True)
    model = make_model(args.arch, max(1, len(pack.classes)))
    opt = make_optimizer(model)
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        t0 = time.perf_counter()
        loss = torch.zeros((), device="cuda")
        for x, y, *_ in loader:
            loss = train_step(model, opt, x, y)
        torch.cuda.synchronize()
        n = len(loader) * args.batch_size
        print(f"epoch {epoch}: loss {loss.item():.3f}, {n / (time.perf_counter() - t0):,.0f} img/s")
    eval_loader = packer.PackLoader(pack, args.batch_size, device="cuda", shuffle=False)
    print(f"accuracy on the pack: {evaluate(model, eval_loader):.1%}")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("pack_path", nargs="?", type=Path)
    ap.add_argument("--arch", default="resnet18")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--archs", default="resnet18,resnet50")
    ap.add_argument("--pack", type=Path, default=None)
    ap.add_argument("--folder", type=Path, default=None)
    ap.add_argument("--folder-workers", type=int, default=15)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--work", type=Path, default=Path("/tmp/imgpack-bench"))
    args = ap.parse_args()
    if args.bench:
        bench(args)
    elif args.pack_path:
        train(args)
    else:
        ap.error("give a PACK to train on, or --bench")


if __name__ == "__main__":
    main()
