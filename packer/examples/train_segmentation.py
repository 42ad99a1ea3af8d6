"""Train a torchvision segmenter on semantic packs with the segmentation reference's recipe.

A port of torchvision's references/segmentation/train.py (FCN, DeepLabV3, LR-ASPP) fed
by packs built from an image folder beside a mask folder (VOC's ``JPEGImages`` +
``SegmentationClass``, ADE20K's ``images`` + ``annotations``, or ``images`` + ``masks``)::

    imgpack build voc/train train_pack --targets-from masks --store jpeg
    imgpack build voc/val   val_pack   --targets-from masks --store jpeg --classes train_pack
    python -m packer.examples.train_segmentation --data-path train_pack --val-pack val_pack \\
        --model deeplabv3_resnet50 --aux-loss --epochs 30 -b 8 --lr 0.02 --amp
    python -m packer.examples.train_segmentation --val-pack val_pack --test-only \\
        --resume runs/checkpoint.pth                  # mean IoU of a checkpoint

  train  the reference's SegmentationPresetTrain, per image on the loader's device
         (packer.augment.dense; the mask moves with its image, nearest neighbour):
         a random shorter side in [0.5, 2.0] x ``--base-size`` (520), flip, a
         ``--crop-size`` (480) crop padded with 0 (image) and 255 (mask, ignored);
         normalized on the device. Cross-entropy ignoring 255 (+ 0.5 x the auxiliary
         head's with ``--aux-loss``), SGD with the auxiliary head at 10x the LR as the
         reference, polynomial LR decay (power 0.9) per step, ``--amp`` autocast (bf16).
  val    the reference's SegmentationPresetEval: shorter side resized to ``--base-size``,
         batch 1 (``--val-batch-size``); mean IoU from the reference's confusion matrix
         (pixels labelled 255 ignored), and the global pixel accuracy.
  after every epoch ``--output-dir/checkpoint.pth`` (a temporary name, then renamed);
  ``--resume`` continues from it, ``--test-only`` evaluates it.

The reference data path, for comparison with the same weights (``--data-path-reference
ROOT``: ROOT/<split>/ or ROOT itself holding an image folder beside a mask folder, paired
by file stem): a Dataset reading each pair with Pillow, the presets as
``torchvision.transforms.v2`` ops on ``tv_tensors`` (Image, Mask), DataLoader workers.
The masks' values are the classes in both paths (a pack keeps them as they are); the
number of classes is the category map's largest id + 1.

Where this differs from the reference: its PadIfSmaller + RandomCrop is one
FixedSizeCrop (crop, then pad right and bottom: the same crops where the image is larger
than the crop); the reference's "pil" backend resizes with Pillow, here (both paths)
torch's antialiased bilinear on uint8 tensors (the "tensor" backend); the dataset
choice (--dataset coco/voc/voc_aug) is the pack; one process (no DDP here).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torchvision

import packer
from packer.examples.train_detection import (
    NONNEGATIVE,
    POSITIVE,
    POSITIVE_FLOAT,
    Fail,
    check_paths,
    run_cli,
    save_atomic,
)
from packer.examples.train_detection import (
    load_checkpoint as _load_checkpoint,
)

MODELS = (
    "fcn_resnet50",
    "fcn_resnet101",
    "deeplabv3_resnet50",
    "deeplabv3_resnet101",
    "deeplabv3_mobilenet_v3_large",
    "lraspp_mobilenet_v3_large",
)
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
IGNORE = 255
# an image folder beside its mask folder, as the masks source pairs them
FOLDER_PAIRS = (
    ("images", "masks"),
    ("JPEGImages", "SegmentationClass"),
    ("images", "annotations"),
    ("img", "ann"),
)


# ---------------------------------------------------------------- the presets


def pack_pipeline(args: argparse.Namespace, train: bool) -> Any:
    """SegmentationPresetTrain / Eval as packer.augment.dense ops."""
    from packer.augment import dense as D

    if not train:
        return D.Resize(args.base_size)
    # the reference's RandomResize(lo, hi) draws randint(lo, hi) with hi included
    resize = D.RandomResize(int(0.5 * args.base_size), int(2.0 * args.base_size) + 1)
    crop = D.FixedSizeCrop(args.crop_size, fill=0, semantic_fill=IGNORE)
    return D.Compose([resize, D.RandomHorizontalFlip(0.5), crop])


def reference_pipeline(args: argparse.Namespace, train: bool) -> Any:
    """The same presets as torchvision.transforms.v2 ops (the reference data path)."""
    from torchvision import tv_tensors
    from torchvision.transforms import v2
    from torchvision.transforms.v2 import functional as F

    class RandomResize(v2.Transform):
        def __init__(self, lo: int, hi: int) -> None:
            super().__init__()
            self.lo, self.hi = lo, hi

        def make_params(self, flat_inputs: list) -> dict:
            return {"size": int(torch.randint(self.lo, self.hi + 1, (1,)))}

        def transform(self, inpt: Any, params: dict) -> Any:
            return F.resize(inpt, params["size"], antialias=True)

        _get_params = make_params  # torchvision < 0.21 names them so
        _transform = transform

    ops: list[Any] = [v2.ToImage()]
    if train:
        fill = {tv_tensors.Mask: IGNORE, "others": 0}
        ops += [
            RandomResize(int(0.5 * args.base_size), int(2.0 * args.base_size)),
            v2.RandomHorizontalFlip(0.5),
            v2.RandomCrop(args.crop_size, pad_if_needed=True, fill=fill),
        ]
    else:
        ops.append(v2.Resize(args.base_size, antialias=True))
    dtypes = {tv_tensors.Image: torch.float32, tv_tensors.Mask: torch.int64, "others": None}
    ops += [v2.ToDtype(dtypes, scale=True), v2.Normalize(MEAN, STD), v2.ToPureTensor()]
    return v2.Compose(ops)


# ---------------------------------------------------------------- data


class PackData:
    """A semantic pack and its category map."""

    def __init__(self, path: Path, what: str) -> None:
        from packer.pack.dense import dense_of

        if not path.exists():
            raise Fail(f"{path}: no such pack ({what})")
        self.pack = packer.load(path)
        cols = dense_of(self.pack)
        if cols is None or not cols.semantic:
            raise Fail(
                f"{path}: the {what} pack has no semantic masks; build it from an image "
                "folder beside a mask folder (imgpack build SRC PACK --targets-from masks)"
            )
        self.categories = cols.categories
        self.num_classes = max(int(c) for c in cols.categories.ids) + 1


def normalize(x: torch.Tensor) -> torch.Tensor:
    """uint8 [B, 3, H, W] -> float, as the reference's ToDtype(scale=True) + Normalize."""
    from torchvision.transforms.v2 import functional as F

    return F.normalize(F.to_dtype(x, torch.float32, scale=True), MEAN, STD)


def pack_batches(loader: Any) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for x, masks in loader:
        yield normalize(x), masks.to(torch.int64)


class SegmentationFolder(torch.utils.data.Dataset):
    """The reference data path's dataset: an image folder beside a mask folder, paired
    by path less extension, read with Pillow (a palette mask's indices are its classes)."""

    def __init__(self, root: Path, transforms: Any) -> None:
        for images, masks in FOLDER_PAIRS:
            if (root / images).is_dir() and (root / masks).is_dir():
                break
        else:
            raise Fail(
                f"{root}: no image folder beside a mask folder (images/ + masks/, "
                "JPEGImages/ + SegmentationClass/, ...) (--data-path-reference)"
            )
        mask_of = {p.relative_to(root / masks).with_suffix(""): p
                   for p in (root / masks).rglob("*.png")}  # fmt: skip
        self.pairs = []
        for p in sorted((root / images).rglob("*")):
            key = p.relative_to(root / images).with_suffix("")
            if p.is_file() and key in mask_of:
                self.pairs.append((p, mask_of[key]))
        if not self.pairs:
            raise Fail(f"{root}: no image has a mask (--data-path-reference)")
        self.transforms = transforms

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        from PIL import Image
        from torchvision import tv_tensors

        image_path, mask_path = self.pairs[i]
        with Image.open(image_path) as im:
            image = im.convert("RGB")
        with Image.open(mask_path) as m:
            mask = tv_tensors.Mask(torch.from_numpy(np.array(m, dtype=np.uint8)))
        return self.transforms(image, mask)


def reference_folder(root: Path, split: str) -> Path:
    return root / split if (root / split).is_dir() else root


def reference_batches(dl: Any, device: torch.device) -> Iterator:
    for x, y in dl:
        yield x.to(device), y.to(device)


# ---------------------------------------------------------------- evaluation


class ConfusionMatrix:
    """The reference's (references/segmentation/utils.py): rows the truth, columns the
    prediction; targets outside 0..n-1 (255, ignored) are not counted."""

    def __init__(self, num_classes: int, device: torch.device) -> None:
        self.n = num_classes
        self.mat = torch.zeros((num_classes, num_classes), dtype=torch.int64, device=device)

    def update(self, a: torch.Tensor, b: torch.Tensor) -> None:
        n = self.n
        k = (a >= 0) & (a < n)
        inds = n * a[k].to(torch.int64) + b[k]
        self.mat += torch.bincount(inds, minlength=n**2).reshape(n, n)

    def compute(self) -> tuple[float, torch.Tensor, torch.Tensor]:
        h = self.mat.float()
        diag = torch.diag(h)
        acc_global = (diag.sum() / h.sum()).item()
        acc = diag / h.sum(1)
        iu = diag / (h.sum(1) + h.sum(0) - diag)
        return acc_global, acc, iu


@torch.inference_mode()
def evaluate(
    model: torch.nn.Module,
    batches: Iterator,
    num_classes: int,
    amp: bool,
    device: torch.device,
) -> ConfusionMatrix:
    model.eval()
    cm = ConfusionMatrix(num_classes, device)
    for x, y in batches:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            out = model(x)["out"]
        cm.update(y.flatten(), out.argmax(1).flatten())
    model.train()
    return cm


def summary(cm: ConfusionMatrix) -> str:
    acc_global, _, iu = cm.compute()
    return f"mean IoU {iu.nanmean().item() * 100:.4f} (global acc {acc_global * 100:.2f})"


# ---------------------------------------------------------------- model, checkpoint


def make_model(args: argparse.Namespace, num_classes: int, device: torch.device) -> Any:
    kw: dict[str, Any] = {}
    if args.aux_loss:
        kw["aux_loss"] = True
    try:
        model = torchvision.models.get_model(
            args.model,
            weights=args.weights,
            weights_backbone=args.weights_backbone,
            num_classes=num_classes,
            **kw,
        )
    except (ValueError, TypeError, NotImplementedError) as e:
        raise Fail(f"--model {args.model}: {str(e).splitlines()[0][:200]}") from None
    return model.to(device)


def load_checkpoint(path: Path, device: torch.device, model_name: str) -> dict:
    keys = frozenset({"model", "epoch", "model_name", "num_classes"})
    return _load_checkpoint(path, device, model_name, keys)


# ---------------------------------------------------------------- main


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m packer.examples.train_segmentation",
        description="torchvision's segmentation reference on semantic packs",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument("--data-path", type=Path, default=None, help="the train pack")
    ap.add_argument("--val-pack", type=Path, default=None, help="the val pack (mean IoU)")
    ap.add_argument(
        "--data-path-reference",
        type=Path,
        default=None,
        help="image + mask folders read by the reference's data path instead of the packs",
    )
    ap.add_argument("--train-split", default="train", help="the reference path's train folder")
    ap.add_argument("--val-split", default="val", help="the reference path's val folder")
    ap.add_argument(
        "--num-classes",
        type=POSITIVE,
        default=21,
        help="the reference path's classes (VOC's 21) when no checkpoint says",
    )
    ap.add_argument("--model", choices=MODELS, default="fcn_resnet101")
    ap.add_argument("--aux-loss", action="store_true", help="train the auxiliary head too")
    ap.add_argument("--base-size", type=POSITIVE, default=520, help="the presets' base size")
    ap.add_argument("--crop-size", type=POSITIVE, default=480, help="the train crop")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("-b", "--batch-size", type=POSITIVE, default=8)
    ap.add_argument("--val-batch-size", type=POSITIVE, default=1, help="1: the reference's")
    ap.add_argument("--epochs", type=POSITIVE, default=30)
    ap.add_argument(
        "-j", "--workers", type=NONNEGATIVE, default=4, help="loader threads / DataLoader workers"
    )
    ap.add_argument("--lr", type=POSITIVE_FLOAT, default=0.01)
    ap.add_argument("--momentum", type=POSITIVE_FLOAT, default=0.9)
    ap.add_argument("--wd", "--weight-decay", dest="wd", type=POSITIVE_FLOAT, default=1e-4)
    ap.add_argument("--print-freq", type=NONNEGATIVE, default=10)
    ap.add_argument("--output-dir", type=Path, default=Path("runs"))
    ap.add_argument("--resume", type=Path, default=None, help="checkpoint to continue from")
    ap.add_argument("--test-only", action="store_true", help="evaluate only")
    ap.add_argument("--weights", default=None, help="the model's torchvision weights")
    ap.add_argument("--weights-backbone", default=None, help="the backbone's weights")
    ap.add_argument("--amp", action="store_true", help="bf16 autocast")
    ap.add_argument("--max-steps", type=NONNEGATIVE, default=0, help="stop epochs after N")
    ap.add_argument("--seed", type=NONNEGATIVE, default=0)
    args = ap.parse_args(argv)
    return check_paths(args)


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(lambda: run(parse(argv)))


def run(args: argparse.Namespace) -> None:
    if args.device == "cuda" and not torch.cuda.is_available():
        raise Fail("--device cuda but torch sees no CUDA device; use --device cpu")
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if cuda else "cpu")
    torch.manual_seed(args.seed)
    ck = load_checkpoint(args.resume, device, args.model) if args.resume is not None else None

    val_batches = train_batches = None
    steps = 0
    if args.data_path_reference is not None:
        root = args.data_path_reference
        num_classes = int(ck["num_classes"]) if ck is not None else args.num_classes
        kw = {"num_workers": args.workers}
        val_ds = SegmentationFolder(
            reference_folder(root, args.val_split), reference_pipeline(args, False)
        )
        val_dl = torch.utils.data.DataLoader(val_ds, args.val_batch_size, **kw)

        def val_batches() -> Iterator:
            return reference_batches(val_dl, device)

        if not args.test_only:
            train_ds = SegmentationFolder(
                reference_folder(root, args.train_split), reference_pipeline(args, True)
            )
            g = torch.Generator().manual_seed(args.seed)
            train_dl = torch.utils.data.DataLoader(
                train_ds, args.batch_size, shuffle=True, generator=g, drop_last=True, **kw
            )
            steps = len(train_dl)

            def train_batches(epoch: int) -> Iterator:
                return reference_batches(train_dl, device)
    else:
        threads = max(args.workers, 1)
        val = PackData(args.val_pack, "val") if args.val_pack is not None else None
        train = PackData(args.data_path, "train") if not args.test_only else None
        first = train or val
        assert first is not None
        num_classes = first.num_classes
        if train is not None and val is not None and val.categories != train.categories:
            raise Fail(
                f"{args.val_pack}: its category map differs from {args.data_path}'s; rebuild "
                f"it with --classes {args.data_path}"
            )
        if val is not None:
            val_loader = packer.PackLoader(
                val.pack,
                args.val_batch_size,
                device=device,
                shuffle=False,
                num_threads=threads,
                dense_transform=pack_pipeline(args, False),
            )

            def val_batches() -> Iterator:
                return pack_batches(val_loader)

        if train is not None:
            train_loader = packer.PackLoader(
                train.pack,
                args.batch_size,
                device=device,
                seed=args.seed,
                drop_last=True,
                num_threads=threads,
                dense_transform=pack_pipeline(args, True),
            )
            steps = len(train_loader)

            def train_batches(epoch: int) -> Iterator:
                train_loader.set_epoch(epoch)
                return pack_batches(train_loader)

    if ck is not None and int(ck["num_classes"]) != num_classes:
        raise Fail(f"{args.resume}: trained for {ck['num_classes']} classes, not {num_classes}")
    model = make_model(args, num_classes, device)
    if ck is not None:
        try:
            model.load_state_dict(ck["model"])
        except RuntimeError as e:
            first_line = str(e).strip().splitlines()[0][:200]
            raise Fail(
                f"{args.resume}: does not fit --model {args.model} ({first_line}); "
                "resume with the --model and --aux-loss it was trained with"
            ) from None
    amp = args.amp

    if args.test_only:
        assert val_batches is not None
        cm = evaluate(model, val_batches(), num_classes, amp, device)
        print(f"test: {summary(cm)}", flush=True)
        return

    assert train_batches is not None
    if args.max_steps:
        steps = min(steps, args.max_steps)
    if steps < 1:
        raise Fail(f"{args.data_path}: fewer images than one batch (-b {args.batch_size})")
    # the reference's groups: the auxiliary head at 10x the learning rate
    groups = [{"params": [p for p in model.backbone.parameters() if p.requires_grad]},
              {"params": [p for p in model.classifier.parameters() if p.requires_grad]}]  # fmt: skip
    if getattr(model, "aux_classifier", None) is not None:
        aux = [p for p in model.aux_classifier.parameters() if p.requires_grad]
        groups.append({"params": aux, "lr": args.lr * 10})
    opt = torch.optim.SGD(groups, lr=args.lr, momentum=args.momentum, weight_decay=args.wd)
    sched = torch.optim.lr_scheduler.PolynomialLR(opt, total_iters=steps * args.epochs, power=0.9)
    start = 0
    if ck is not None:
        if "optimizer" in ck:
            opt.load_state_dict(ck["optimizer"])
            sched.load_state_dict(ck["lr_scheduler"])
        start = int(ck["epoch"]) + 1
        print(f"resumed from {args.resume} (epoch {ck['epoch']} done)", flush=True)
    try:
        args.output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise Fail(
            f"--output-dir {args.output_dir}: cannot make the folder ({e.strerror})"
        ) from None

    for epoch in range(start, args.epochs):
        model.train()
        t0, n_img, loss_sum = time.perf_counter(), 0, 0.0
        for step, (x, y) in enumerate(train_batches(epoch)):
            if step >= steps:
                break
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                out = model(x)
            losses = {k: torch.nn.functional.cross_entropy(v.float(), y, ignore_index=IGNORE)
                      for k, v in out.items()}  # fmt: skip
            loss = losses["out"] + 0.5 * losses["aux"] if "aux" in losses else losses["out"]
            if not torch.isfinite(loss):
                raise Fail(f"epoch {epoch} step {step}: the loss is {loss.item()}; training stops")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            loss_sum += loss.item()
            n_img += len(x)
            if args.print_freq and (step + 1) % args.print_freq == 0:
                print(f"  epoch {epoch} step {step + 1}/{steps}: loss {loss.item():.4f}")
        rate = n_img / max(time.perf_counter() - t0, 1e-9)
        line = (
            f"epoch {epoch}: train loss {loss_sum / max(steps, 1):.4f} "
            f"lr {opt.param_groups[0]['lr']:.4g} {rate:,.1f} img/s"
        )
        if args.data_path_reference is None:  # did the loader keep up?
            st = train_loader.stats()
            line += f", waited for the loader {st.wait_share:.1%} (slowest: {st.slowest_stage})"
        if val_batches is not None:
            line += " | " + summary(evaluate(model, val_batches(), num_classes, amp, device))
        print(line, flush=True)
        state = {
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "lr_scheduler": sched.state_dict(),
            "epoch": epoch,
            "model_name": args.model,
            "num_classes": num_classes,
        }
        path = args.output_dir / "checkpoint.pth"
        save_atomic(state, path)
        print(f"checkpoint {path} (epoch {epoch})", flush=True)


if __name__ == "__main__":
    sys.exit(main())
