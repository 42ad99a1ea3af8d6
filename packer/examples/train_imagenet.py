"""Train a torchvision ResNet on ImageNet-style packs with the standard recipe.

The recipe of torchvision's reference script (references/classification/train.py)
and the classic ImageNet example, fed by packs instead of JPEG folders:
  train  per-image RandomResizedCrop(224) + horizontal flip (packer.transforms,
         on the loader's device and stream), Normalize at the model's front,
         SGD with momentum and weight decay, cosine or step LR with linear warm-up,
         optional label smoothing, bf16 autocast and channels_last on CUDA
  modern the reference's flags, each image its own draw, on the device:
         --auto-augment ta_wide|ra|imagenet|augmix, --random-erase P,
         --mixup-alpha A / --cutmix-alpha A (one of them per batch, soft labels),
         --ra-sampler --ra-reps K (repeated augmentation: PackLoader(repeats=K)),
         --model-ema (+ --model-ema-steps, --model-ema-decay), --label-smoothing
  val    CenterCrop(224) of a pack built at 256 (see below), top-1 / top-5
         (and the EMA model's, with --model-ema)
  after every epoch a checkpoint (written to a temporary name, then renamed);
  --resume continues from one. Under torchrun each process is one DDP rank.

Where the reference differs: its RandomErasing runs after Normalize and erases to 0,
the dataset's mean colour; here the images are uint8 until Normalize at the model's
front, so the box is filled with the mean colour in bytes (124, 116, 104), the same
thing to within half a grey level. Like the reference, --ra-sampler repeats images
only under torchrun (with several processes); one process streams each image once.

Packs:
    imgpack build imagenet/train train256/ --size 256 --resize crop
    imgpack build imagenet/val   val256/   --size 256 --resize crop   # Resize(256), classic
    imgpack build imagenet/val   val232/   --size 232 --resize crop   # --val-resize-size 232

The reference's evaluation is ``Resize(R) + CenterCrop(C)`` (``--val-resize-size R
--val-crop-size C``: 256 and 224 by default, 232 and 224 in torchvision's newer
recipes). A val pack built ``--size R --resize crop`` holds the centre RxR of each
image after its shorter side was resized to R, so its CenterCrop(C) is that window
to within half a pixel: the build cuts the exact centre with one sub-pixel Pillow
resample (antialiased bilinear) from the original, where torchvision truncates the
resized long side and rounds the crop offset; on sample_data the pixels differ by
1.0 grey level (median over images; worst 5.4, a fine texture). Given
--val-resize-size, the script checks the val pack's build and says which
``imgpack build --size`` gives the reference's protocol when it differs (a pack built
at 256 evaluated for the reference's 232 agrees on 98.3% of predictions). Train crops
come from the 256-short-side image's centre square rather than from the whole
original image, so boxes near the long side's ends are not seen (for a 4:3 photo,
1/4 of its width).

    python -m packer.examples.train_imagenet --train train256 --val val256 --arch resnet50
    torchrun --standalone --nproc-per-node 8 -m packer.examples.train_imagenet --train ... --val ...
    python -m packer.examples.train_imagenet ... --res-schedule 160:0,192:6,224:12   # progressive
    python -m packer.examples.train_imagenet ... --resume runs/last.pt
    torchrun --standalone --nproc-per-node 8 -m packer.examples.train_imagenet --train ... \
        --val val232 --val-resize-size 232 --val-crop-size 224 --train-crop-size 176 \
        --epochs 600 --batch-size 128 --lr 0.5 --lr-schedule cosine --warmup-epochs 5 \
        --label-smoothing 0.1 --mixup-alpha 0.2 --cutmix-alpha 1.0 --auto-augment ta_wide \
        --random-erase 0.1 --wd 2e-5 --ra-sampler --model-ema

Bad input (a missing or unlabeled pack, a val pack whose class map is not
train's, a checkpoint of something else, an out-of-range option) stops before
any training with one ``Error: ...`` line and exit code 2.
"""

from __future__ import annotations

import argparse
import math
import os
import pickle
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off on shared hosts

import torch
import torch.distributed as dist
import torchvision
from torch import nn

import packer
import packer.transforms as T
from packer.errors import PackerError
from packer.imaging.normalize import IMAGENET_MEAN
from packer.transforms import CenterCrop, Compose, RandomHorizontalFlip, RandomResizedCrop

# --auto-augment NAME -> the packer.transforms op (its arguments come from the flags)
AUTO_AUGMENT = {
    "ta_wide": "TrivialAugmentWide",
    "ra": "RandAugment",
    "imagenet": "AutoAugment",
    "augmix": "AugMix",
}


class Fail(Exception):
    """Bad input: ``main`` prints ``Error: <message>`` and exits 2."""


def _number(
    kind: Callable[[str], float], lo: float, hi: float | None = None, *, lo_open: bool = False
) -> Callable[[str], float]:
    """An argparse type: ``kind`` in [lo, hi] (or (lo, hi] with ``lo_open``), finite."""

    def parse(text: str) -> float:
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not math.isfinite(v) or v < lo or (lo_open and v == lo) or (hi is not None and v > hi):
            span = f"{'(' if lo_open else '['}{lo}, {hi if hi is not None else 'inf'}]"
            raise argparse.ArgumentTypeError(f"{text} is outside {span}")
        return v

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


POSITIVE = _number(int, 1)
NONNEGATIVE = _number(int, 0)


def parse_schedule(text: str | None, default: int) -> list[tuple[int, int]]:
    """ "160:0,192:2,224:4" -> [(0, 160), (2, 192), (4, 224)] (start epoch, size)."""
    if not text:
        return [(0, default)]
    try:
        pairs = sorted((int(e), int(s)) for s, e in (item.split(":") for item in text.split(",")))
    except ValueError:
        raise Fail(
            f"--res-schedule wants SIZE:EPOCH,... (e.g. 160:0,224:4), not {text!r}"
        ) from None
    if pairs[0][0] != 0 or any(s < 1 for _, s in pairs):
        raise Fail("--res-schedule must start at epoch 0 with positive sizes")
    return pairs


def size_at(schedule: list[tuple[int, int]], epoch: int) -> int:
    return [s for e, s in schedule if e <= epoch][-1]


def lr_factor(step: int, steps_per_epoch: int, args: argparse.Namespace) -> float:
    """Multiplier of --lr at optimizer step ``step``: linear warm-up, then cosine or step."""
    epoch = step / steps_per_epoch
    if epoch < args.warmup_epochs:
        return (step + 1) / (args.warmup_epochs * steps_per_epoch)
    if args.lr_schedule == "cosine":
        span = max(args.epochs - args.warmup_epochs, 1e-9)
        return 0.5 * (1 + math.cos(math.pi * min((epoch - args.warmup_epochs) / span, 1.0)))
    return 0.1 ** int(epoch // args.lr_step)


def setup(args: argparse.Namespace) -> tuple[torch.device, int, int]:
    """Device, rank and world size; starts the process group under torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    want_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if args.device == "cuda" and not torch.cuda.is_available():
        raise Fail("--device cuda but torch sees no CUDA device; use --device cpu")
    if world > 1:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if want_cuda:
            torch.cuda.set_device(local)
        dist.init_process_group("nccl" if want_cuda else "gloo")
        rank = dist.get_rank()
    else:
        local, rank = 0, 0
    device = torch.device("cuda", local) if want_cuda else torch.device("cpu")
    return device, rank, world


def recipe_op(name: str, flag: str, *args: object, **kw: object) -> nn.Module:
    """``packer.transforms.<name>(*args, **kw)``, or Fail naming the flag when this
    imgpack does not have that op."""
    cls = getattr(T, name, None)
    if cls is None:
        raise Fail(f"{flag} needs packer.transforms.{name}, which this imgpack does not have")
    return cls(*args, **kw)


def train_transform(
    args: argparse.Namespace, size: int, num_classes: int
) -> tuple[Compose, RandomResizedCrop]:
    """The reference's ClassificationPresetTrain + its collate's MixUp/CutMix, batched:
    RandomResizedCrop, flip, [auto-augment], [RandomErasing], [RandomChoice(MixUp,
    CutMix)]. Returns the Compose and its crop (whose size progressive resizing sets)."""
    rrc = RandomResizedCrop(size, interpolation=args.interpolation)
    ops: list[nn.Module] = [rrc, RandomHorizontalFlip()]
    flag = f"--auto-augment {args.auto_augment}"
    # The reference's policies take --interpolation too; tensor policies (torchvision's
    # and these) warp nearest or bilinear only, so a bicubic run warps bilinear (said).
    warp = args.interpolation if args.interpolation in ("nearest", "bilinear") else "bilinear"
    ip = {"interpolation": warp}
    if args.auto_augment == "ra":
        ops.append(recipe_op("RandAugment", flag, magnitude=args.ra_magnitude, **ip))
    elif args.auto_augment == "augmix":
        ops.append(recipe_op("AugMix", flag, severity=args.augmix_severity, **ip))
    elif args.auto_augment == "imagenet":
        ops.append(recipe_op("AutoAugment", flag, "imagenet", **ip))
    elif args.auto_augment:
        ops.append(recipe_op(AUTO_AUGMENT[args.auto_augment], flag, **ip))
    if args.random_erase > 0:
        # The reference erases normalized images to 0: the mean colour, in bytes here.
        mean = tuple(round(255 * m) for m in IMAGENET_MEAN)
        ops.append(recipe_op("RandomErasing", "--random-erase", p=args.random_erase, value=mean))
    mixers = []
    if args.mixup_alpha > 0:
        kw = {"alpha": args.mixup_alpha, "num_classes": num_classes}
        mixers.append(recipe_op("MixUp", "--mixup-alpha", **kw))
    if args.cutmix_alpha > 0:
        kw = {"alpha": args.cutmix_alpha, "num_classes": num_classes}
        mixers.append(recipe_op("CutMix", "--cutmix-alpha", **kw))
    if mixers:  # one of them per batch, as the reference's collate_fn
        ops.append(recipe_op("RandomChoice", "--mixup-alpha/--cutmix-alpha", mixers))
    return Compose(ops), rrc


def make_ema(
    model: nn.Module, args: argparse.Namespace, world: int, device: torch.device
) -> torch.optim.swa_utils.AveragedModel:
    """The reference's EMA of the weights and buffers: its decay adjusted to the number
    of updates (world * batch * steps / epochs), updated every --model-ema-steps steps."""
    adjust = world * args.batch_size * args.model_ema_steps / args.epochs
    alpha = min(1.0, (1.0 - args.model_ema_decay) * adjust)
    decay = 1.0 - alpha

    def ema_avg(avg: torch.Tensor, new: torch.Tensor, _n: torch.Tensor) -> torch.Tensor:
        return decay * avg + (1.0 - decay) * new

    return torch.optim.swa_utils.AveragedModel(
        model, device=device, avg_fn=ema_avg, use_buffers=True
    )


def make_model(arch: str, num_classes: int, device: torch.device) -> nn.Module:
    if not arch.startswith("resnet") or not hasattr(torchvision.models, arch):
        raise Fail(f"--arch {arch!r} is not a torchvision ResNet (e.g. resnet50)")
    net = getattr(torchvision.models, arch)(weights=None, num_classes=num_classes)
    # Normalize at the front: bytes stay uint8 up to the model, floats start on the device.
    model = nn.Sequential(packer.Normalize(), net).to(device)
    return model.to(memory_format=torch.channels_last)


def make_optimizer(model: nn.Module, args: argparse.Namespace) -> torch.optim.Optimizer:
    kw = {"lr": args.lr, "momentum": args.momentum, "weight_decay": args.wd}
    if next(model.parameters()).is_cuda:
        try:
            return torch.optim.SGD(model.parameters(), fused=True, **kw)
        except (TypeError, RuntimeError):
            pass
    return torch.optim.SGD(model.parameters(), **kw)


def save_atomic(state: dict, path: Path) -> None:
    """Write to a temporary name in the same folder, then rename: never half a file."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    torch.save(state, tmp)
    os.replace(tmp, path)


def topk_correct(logits: torch.Tensor, y: torch.Tensor, ks: tuple[int, ...]) -> torch.Tensor:
    """int64 [len(ks)]: how many rows have y among their top-k logits, on the device.
    Soft labels (float [B, K], from MixUp/CutMix) count their heaviest class."""
    if y.dim() == 2:
        y = y.argmax(1)
    k = min(max(ks), logits.shape[1])
    hit = logits.topk(k, 1).indices.eq(y[:, None])
    return torch.stack([hit[:, : min(kk, k)].any(1).sum() for kk in ks])


@torch.inference_mode()
def evaluate(
    model: nn.Module, loader: packer.PackLoader, device: torch.device, amp: bool
) -> tuple[float, float, float]:
    """Mean loss, top-1 and top-5 over this loader (summed over ranks under DDP)."""
    model.eval()
    sums = torch.zeros(4, device=device, dtype=torch.float64)  # loss, top1, top5, n
    for x, y, *_ in loader:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(x.contiguous(memory_format=torch.channels_last))
        loss = nn.functional.cross_entropy(logits.float(), y, reduction="sum")
        hits = topk_correct(logits, y, (1, 5)).double()
        sums += torch.cat([loss.double()[None], hits, hits.new_tensor([len(y)])])
    if dist.is_initialized():
        dist.all_reduce(sums)
    model.train()
    loss, top1, top5, n = sums.tolist()
    n = max(n, 1)
    return loss / n, top1 / n, top5 / n


def check_labels(pack: packer.ImagePack, path: Path, what: str) -> None:
    """Refuse a pack whose labels cannot train a classifier: no class map (a flat
    folder, integer labels from a table), unlabeled images (-1), labels past the map."""
    if not pack.classes:
        raise Fail(
            f"{path}: the {what} pack has no classes (built from a flat folder or from "
            "integer labels); build it from class folders, or with --classes"
        )
    labels = pack.labels
    unlabeled = int((labels < 0).sum())
    if unlabeled:
        raise Fail(
            f"{path}: {unlabeled} of its {len(pack)} images have no label (-1); a {what} "
            "pack needs every image labelled"
        )
    if len(labels) and int(labels.max()) >= len(pack.classes):
        raise Fail(f"{path}: a label is past its {len(pack.classes)} classes; rebuild the pack")


def load_checkpoint(path: Path, device: torch.device, arch: str, classes: list[str]) -> dict:
    """A checkpoint this script wrote, checked before any of it is used."""
    if not path.is_file():
        raise Fail(f"{path}: no such checkpoint (--resume); give a last.pt this script wrote")
    try:
        ck = torch.load(path, map_location=device, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise Fail(f"{path}: not a checkpoint this script can read ({first[:200]})") from None
    need = {"model", "optimizer", "scheduler", "epoch"}
    if not isinstance(ck, dict) or not need <= ck.keys():
        raise Fail(
            f"{path}: not a checkpoint of train_imagenet.py (it needs {sorted(need)}); "
            "give a last.pt this script wrote"
        )
    if not isinstance(ck["epoch"], int) or isinstance(ck["epoch"], bool) or ck["epoch"] < 0:
        raise Fail(f"{path}: its epoch {ck['epoch']!r} is not an epoch number")
    if ck.get("arch", arch) != arch:
        raise Fail(f"{path}: a checkpoint of --arch {ck['arch']}, not {arch}")
    if ck.get("classes", classes) != classes:
        raise Fail(f"{path}: a checkpoint trained on another class map than --train's")
    return ck


def _reference_resize(crop: int) -> int:
    """The reference's default Resize for a CenterCrop of ``crop``: 256 for 224."""
    return round(crop / 0.875)


def val_protocol_note(pack: Any, path: Path, resize_size: int | None, crop: int) -> str | None:
    """None when the raw val ``pack`` holds what the reference evaluates, else a note
    naming the build that does: torchvision's ``Resize(R) + CenterCrop(C)`` is a pack
    built ``--size R --resize crop`` (each image's shorter side resized to R, the
    centre R x R kept) then ``CenterCrop(C)``. ``resize_size`` None: not asked."""
    if resize_size is None or pack.kind.decoded:  # a JPEG pack is decoded to any size
        return None
    m = getattr(pack, "manifest", None)
    if m is not None:
        mode, (_, h, w) = m.resize, m.image_shape
    else:  # a pack set: its index records the build's options
        mode, (_, h, w) = pack.index.options["resize"], pack.image_shape
    if mode == "crop" and h == w == resize_size:
        return None
    built = f"{w}" if h == w else f"{w}x{h}"
    return (
        f"--val-resize-size {resize_size}: {path} was built --size {built} --resize {mode}, "
        f"so its CenterCrop({crop}) is not the reference's Resize({resize_size}) + "
        f"CenterCrop({crop}); evaluating the pack as built. For the reference's protocol "
        f"build it with `imgpack build VAL_FOLDER {path} --size {resize_size} --resize crop`"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the script; returns the exit code (2 with ``Error: ...`` for bad input)."""
    packer.configure_cuda_queues()  # before any CUDA call: 32 queues for a JPEG pack's decodes
    try:
        train(argv)
    except (Fail, PackerError) as e:
        print(f"Error: {e}", file=sys.stderr, flush=True)
        return getattr(e, "exit_code", 2)
    return 0


def train(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--train", type=Path, required=True, help="train pack (built --size 256+)")
    ap.add_argument(
        "--val", type=Path, default=None, help="val pack (built --size 256 --resize crop)"
    )
    ap.add_argument("--arch", default="resnet50", help="any torchvision resnet (resnet18...)")
    ap.add_argument("--epochs", type=POSITIVE, default=90)
    ap.add_argument("--batch-size", type=POSITIVE, default=256, help="per process")
    ap.add_argument(
        "--lr",
        type=_number(float, 0, lo_open=True),
        default=0.1,
        help="for batch 256 in all; scale linearly",
    )
    ap.add_argument("--momentum", type=_number(float, 0, 1), default=0.9)
    ap.add_argument("--wd", type=_number(float, 0), default=1e-4, help="weight decay")
    ap.add_argument("--lr-schedule", choices=["cosine", "step"], default="step")
    ap.add_argument(
        "--lr-step", type=POSITIVE, default=30, help="step schedule: x0.1 every N epochs"
    )
    ap.add_argument("--warmup-epochs", type=_number(float, 0), default=0.0)
    ap.add_argument("--label-smoothing", type=_number(float, 0, 1), default=0.0, help="in [0, 1]")
    ap.add_argument(
        "--auto-augment",
        choices=list(AUTO_AUGMENT),
        default=None,
        help="TrivialAugmentWide, RandAugment, AutoAugment('imagenet') or AugMix, per image",
    )
    ap.add_argument("--ra-magnitude", type=NONNEGATIVE, default=9, help="RandAugment magnitude")
    ap.add_argument("--augmix-severity", type=POSITIVE, default=3, help="AugMix severity")
    ap.add_argument(
        "--random-erase", type=_number(float, 0, 1), default=0.0, help="RandomErasing p"
    )
    ap.add_argument("--mixup-alpha", type=_number(float, 0), default=0.0, help="0: no MixUp")
    ap.add_argument("--cutmix-alpha", type=_number(float, 0), default=0.0, help="0: no CutMix")
    ap.add_argument(
        "--ra-sampler", action="store_true", help="repeated augmentation (under torchrun)"
    )
    ap.add_argument("--ra-reps", type=POSITIVE, default=3, help="copies of an image per epoch")
    ap.add_argument("--model-ema", action="store_true", help="keep and evaluate an EMA model")
    ap.add_argument(
        "--model-ema-steps", type=POSITIVE, default=32, help="optimizer steps per EMA update"
    )
    ap.add_argument(
        "--model-ema-decay", type=_number(float, 0, 1), default=0.99998, help="EMA decay"
    )
    ap.add_argument(
        "--crop",
        "--train-crop-size",
        dest="crop",
        type=POSITIVE,
        default=224,
        help="RandomResizedCrop size (the reference's --train-crop-size)",
    )
    ap.add_argument(
        "--interpolation",
        choices=["nearest", "nearest-exact", "bilinear", "bicubic", "lanczos"],
        default="bilinear",
        help="RandomResizedCrop's (the reference's flag; bicubic for ViT/Swin recipes)",
    )
    ap.add_argument("--res-schedule", default=None, help="progressive sizes SIZE:EPOCH,...")
    ap.add_argument(
        "--val-crop",
        "--val-crop-size",
        dest="val_crop",
        type=POSITIVE,
        default=224,
        help="CenterCrop of the val pack (the reference's --val-crop-size)",
    )
    ap.add_argument(
        "--val-resize-size",
        type=POSITIVE,
        default=None,
        help="the reference's Resize(N) before the val CenterCrop: the val pack is built "
        "--size N --resize crop (checked; a pack built otherwise is evaluated as built, "
        "with a note saying which build gives the reference's protocol)",
    )
    ap.add_argument("--workers", type=POSITIVE, default=8, help="PackLoader gather threads")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument(
        "--max-steps", type=NONNEGATIVE, default=0, help="stop each epoch after N steps"
    )
    ap.add_argument("--seed", type=_number(int, 0, 2**63 - 1), default=0)
    ap.add_argument("--out", type=Path, default=Path("runs"), help="checkpoint folder")
    ap.add_argument("--resume", type=Path, default=None, help="checkpoint to continue from")
    ap.add_argument("--log-every", type=NONNEGATIVE, default=100)
    args = ap.parse_args(argv)
    if args.val_resize_size is not None and args.val_resize_size < args.val_crop:
        raise Fail(
            f"--val-crop-size {args.val_crop} is larger than --val-resize-size "
            f"{args.val_resize_size}: the centre crop is cut from the resized image"
        )
    if args.out.exists() and not args.out.is_dir():
        raise Fail(f"--out {args.out} is a file; give a folder for the checkpoints")
    if args.resume is not None and not args.resume.is_file():
        raise Fail(
            f"{args.resume}: no such checkpoint (--resume); give a last.pt this script wrote"
        )

    device, rank, world = setup(args)
    say = print if rank == 0 else (lambda *a, **k: None)
    amp = device.type == "cuda"  # bf16 autocast; on the CPU it would only be slower
    schedule = parse_schedule(args.res_schedule, args.crop)
    torch.manual_seed(args.seed)

    train_pack = packer.load(args.train)
    check_labels(train_pack, args.train, "train")
    classes = len(train_pack.classes)
    if classes < 2:
        raise Fail(f"{args.train} has {classes} class; training a classifier needs two or more")
    transform, rrc = train_transform(args, size_at(schedule, 0), classes)
    if args.auto_augment and args.interpolation not in ("nearest", "bilinear"):
        say(f"--interpolation {args.interpolation}: the crop's; the policy warps bilinear")
    # as the reference: RASampler only in a distributed run (one process: plain shuffle)
    repeats = args.ra_reps if args.ra_sampler and world > 1 else 1
    if args.ra_sampler and world == 1:
        say("--ra-sampler: one process, so each image once per epoch (as the reference)")
    train_loader = packer.PackLoader(
        train_pack,
        args.batch_size,
        device=device,
        seed=args.seed,
        drop_last=True,
        num_threads=args.workers,
        repeats=repeats,
        transform=transform,
    )
    val_loader = None
    if args.val is not None:
        val_pack = packer.load(args.val)
        if list(val_pack.classes) != list(train_pack.classes):
            # Same names in another order would score every image against the wrong class.
            raise Fail(
                f"{args.val}: its class map differs from {args.train}'s; rebuild it with "
                f"--classes {args.train}"
            )
        check_labels(val_pack, args.val, "val")
        vh, vw = val_pack.images.shape[-2:]
        resize_size = args.val_resize_size or _reference_resize(args.val_crop)
        if min(vh, vw) < args.val_crop:
            raise Fail(
                f"{args.val} holds {vh}x{vw} images, smaller than --val-crop-size "
                f"{args.val_crop}; build it with --size {resize_size} --resize crop"
            )
        note = val_protocol_note(val_pack, args.val, args.val_resize_size, args.val_crop)
        if note and rank == 0:
            print(f"note: {note}", file=sys.stderr, flush=True)
        val_loader = packer.PackLoader(
            val_pack,
            args.batch_size,
            device=device,
            shuffle=False,
            num_threads=args.workers,
            transform=CenterCrop(args.val_crop),
        )

    model = make_model(args.arch, classes, device)
    opt = make_optimizer(model, args)
    steps_per_epoch = len(train_loader)
    if args.max_steps:
        steps_per_epoch = min(steps_per_epoch, args.max_steps)
    if steps_per_epoch < 1:
        raise Fail(f"{args.train} has fewer images than one batch per rank")
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda step: lr_factor(step, steps_per_epoch, args)
    )
    ema = make_ema(model, args, world, device) if args.model_ema else None
    start = 0
    if args.resume is not None:
        ck = load_checkpoint(args.resume, device, args.arch, list(train_pack.classes))
        if ema is not None and "model_ema" not in ck:
            raise Fail(f"{args.resume}: has no EMA model; resume it without --model-ema")
        try:
            model.load_state_dict(ck["model"])
            opt.load_state_dict(ck["optimizer"])
            sched.load_state_dict(ck["scheduler"])
            if ema is not None:
                ema.load_state_dict(ck["model_ema"])
        except (RuntimeError, ValueError, KeyError, TypeError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise Fail(
                f"{args.resume}: does not fit this model and optimizer ({first[:200]}); "
                "resume with the --arch and options it was trained with"
            ) from None
        start = ck["epoch"] + 1
        say(f"resumed from {args.resume} (epoch {ck['epoch']} done)", flush=True)
    ddp = model
    if world > 1:
        ddp = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    if rank == 0:
        try:
            args.out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise Fail(f"--out {args.out}: cannot make the folder ({e.strerror})") from None

    for epoch in range(start, args.epochs):
        rrc.size = size_at(schedule, epoch)  # progressive resizing: before the epoch starts
        train_loader.set_epoch(epoch)
        t0 = time.perf_counter()
        sums = torch.zeros(3, device=device, dtype=torch.float64)  # loss, top1, n
        n_img = 0
        for step, (x, y, *_) in enumerate(train_loader):
            if step >= steps_per_epoch:
                break
            x = x.contiguous(memory_format=torch.channels_last)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                logits = ddp(x)
                loss = criterion(logits, y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sched.step()
            if ema is not None and step % args.model_ema_steps == 0:
                ema.update_parameters(model)
                if epoch < args.warmup_epochs:
                    ema.n_averaged.fill_(0)  # as the reference: copy the weights in warm-up
            # Accumulated on the device: no host sync inside the step.
            hit1 = topk_correct(logits.detach(), y, (1,))[0].double()
            sums += torch.stack([loss.detach().double() * len(y), hit1, hit1.new_tensor(len(y))])
            n_img += len(y)
            if args.log_every and (step + 1) % args.log_every == 0:
                s = sums.tolist()
                st = train_loader.stats()  # since the previous log line: did the loader keep up?
                say(
                    f"  epoch {epoch} step {step + 1}/{steps_per_epoch}: loss {s[0] / s[2]:.4f}"
                    f", waited for the loader {st.wait_share:.1%} (slowest: {st.slowest_stage})"
                )
        if dist.is_initialized():
            dist.all_reduce(sums)
        loss_sum, top1_sum, n = sums.tolist()
        rate = n_img * world / (time.perf_counter() - t0)
        line = (
            f"epoch {epoch} size {rrc.size[0]}: train loss {loss_sum / max(n, 1):.4f} "
            f"top1 {top1_sum / max(n, 1):.2%} lr {sched.get_last_lr()[0]:.4g} {rate:,.0f} img/s"
        )
        if val_loader is not None:
            vloss, v1, v5 = evaluate(model, val_loader, device, amp)
            line += f" | val loss {vloss:.4f} top1 {v1:.2%} top5 {v5:.2%}"
            if ema is not None:
                eloss, e1, e5 = evaluate(ema.module, val_loader, device, amp)
                line += f" | ema loss {eloss:.4f} top1 {e1:.2%} top5 {e5:.2%}"
        say(line, flush=True)
        if rank == 0:
            state = {
                "model": model.state_dict(),
                "optimizer": opt.state_dict(),
                "scheduler": sched.state_dict(),
                "epoch": epoch,
                "arch": args.arch,
                "classes": list(train_pack.classes),
            }
            if ema is not None:
                state["model_ema"] = ema.state_dict()
            save_atomic(state, args.out / "last.pt")
            say(f"checkpoint {args.out / 'last.pt'} (epoch {epoch})", flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
