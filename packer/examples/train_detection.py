"""Train a torchvision detector on detection packs with the detection reference's recipe.

A port of torchvision's references/detection/train.py (Faster R-CNN, RetinaNet, Mask
R-CNN) fed by packs built from COCO-format folders instead of a ``CocoDetection``
dataset behind DataLoader workers:

    imgpack build coco/ train_pack --targets-from coco --split train2017 --store jpeg
    imgpack build coco/ val_pack   --targets-from coco --split val2017 --store jpeg \\
        --classes train_pack
    python -m packer.examples.train_detection --data-path train_pack --val-pack val_pack \\
        --model fasterrcnn_resnet50_fpn --data-augmentation lsj --epochs 26 -b 4 --amp
    python -m packer.examples.train_detection --val-pack val_pack --test-only \\
        --resume runs/checkpoint.pth                  # COCO mAP of a checkpoint

  train  the reference's presets (``--data-augmentation``), run per image on the loader's
         device by :mod:`packer.augment.dense` (every box and mask moved with its image):
           hflip  RandomHorizontalFlip(0.5)
           lsj    ScaleJitter((S, S)), FixedSizeCrop((S, S), fill=mean), flip (S:
                  --lsj-size, 1024 as the reference)
           ssd    photometric distortion (ColorJitter: see below), RandomZoomOut(fill=
                  mean), RandomIoUCrop, flip
           ssdlite  RandomIoUCrop, flip
         then SanitizeBoundingBoxes. SGD (or AdamW), the reference's linear warm-up in
         epoch 0, multistep or cosine LR per epoch, ``--amp`` autocast (bf16).
  val    the reference's evaluation: each image as stored (no augmentation), batch 1 by
         default as the reference's (``--val-batch-size``), COCO mAP with pycocotools'
         COCOeval (``bbox``; ``segm`` too for Mask R-CNN) against a COCO object built
         from the val pack's own targets (``packer.pack.dense.dense_of``), each label
         mapped back to its original category id. The val JPEGs decode on the CPU
         (libjpeg-turbo, the reference's pixels: the same weights give the reference
         path's mAP); ``--val-decode device`` decodes them on the GPU.
  after every epoch ``--output-dir/checkpoint.pth`` (written to a temporary name, then
  renamed); ``--resume`` continues from it, ``--test-only`` evaluates it.

The reference data path, for comparison with the same weights (``--data-path-reference
FOLDER``, COCO's layout: FOLDER/train2017, FOLDER/val2017, FOLDER/annotations/
instances_{split}.json): torchvision's ``CocoDetection`` wrapped with
``wrap_dataset_for_transforms_v2``, the same presets as ``torchvision.transforms.v2``
ops, and DataLoader workers (``--workers``); its mAP is computed against the JSON
itself (the reference's ``dataset.coco``). A JPEG pack keeps the files as they are, so
the two paths feed the model the same pixels and the same boxes: the same weights give
the same mAP.

Where this differs from the reference: the ssd preset's RandomPhotometricDistort is a
ColorJitter of the same ranges (brightness 0.125, contrast and saturation 0.5, hue
0.05) without its channel shuffle; the ``multiscale`` preset (RandomShortestSize) and
``--aspect-ratio-group-factor`` are not ported; one process (no DDP here).

Bad input (a missing pack, a pack without boxes, a checkpoint of another model or
category map, an out-of-range option) stops before any training with one ``Error:``
line and exit code 2.
"""

from __future__ import annotations

import argparse
import math
import os
import pickle
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torchvision

import packer
from packer.errors import PackerError

MODELS = (
    "fasterrcnn_resnet50_fpn",
    "fasterrcnn_resnet50_fpn_v2",
    "fasterrcnn_mobilenet_v3_large_fpn",
    "fasterrcnn_mobilenet_v3_large_320_fpn",
    "retinanet_resnet50_fpn",
    "retinanet_resnet50_fpn_v2",
    "maskrcnn_resnet50_fpn",
    "maskrcnn_resnet50_fpn_v2",
)
PRESETS = ("hflip", "lsj", "ssd", "ssdlite")
MEAN_FILL = (123, 117, 104)  # the reference's fill: the mean colour in bytes


class Fail(Exception):
    """Bad input: ``main`` prints ``Error: <message>`` and exits 2."""


def _number(kind: Callable[[str], float], lo: float) -> Callable[[str], float]:
    """An argparse type: a finite ``kind`` >= lo."""

    def parse(text: str) -> float:
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not math.isfinite(v) or v < lo:
            raise argparse.ArgumentTypeError(f"{text} is outside [{lo}, inf]")
        return v

    parse.__name__ = kind.__name__
    return parse


POSITIVE = _number(int, 1)
NONNEGATIVE = _number(int, 0)
POSITIVE_FLOAT = _number(float, 0.0)


# ---------------------------------------------------------------- the presets


def pack_pipeline(args: argparse.Namespace) -> Any:
    """The reference's DetectionPresetTrain as packer.augment.dense ops."""
    from packer.augment import dense as D
    from packer.transforms import ColorJitter

    flip = D.RandomHorizontalFlip(0.5)
    if args.data_augmentation == "hflip":
        ops = [flip]
    elif args.data_augmentation == "lsj":
        s = args.lsj_size
        ops = [D.ScaleJitter((s, s)), D.FixedSizeCrop((s, s), fill=MEAN_FILL), flip]
    elif args.data_augmentation == "ssd":
        jitter = ColorJitter(brightness=0.125, contrast=0.5, saturation=0.5, hue=0.05)
        ops = [D.ColorOnly(jitter), D.RandomZoomOut(fill=MEAN_FILL), D.RandomIoUCrop(), flip]
    else:  # ssdlite
        ops = [D.RandomIoUCrop(), flip]
    return D.Compose([*ops, D.SanitizeBoundingBoxes()])


def reference_pipeline(args: argparse.Namespace | None, train: bool) -> Any:
    """The reference's presets as torchvision.transforms.v2 (the reference data path)."""
    from collections import defaultdict

    from torchvision import tv_tensors
    from torchvision.transforms import v2

    tail = [v2.ToDtype(torch.float, scale=True), v2.ConvertBoundingBoxFormat("XYXY")]
    if not train:
        return v2.Compose([v2.ToImage(), v2.ToDtype(torch.float, scale=True), v2.ToPureTensor()])
    assert args is not None
    flip = v2.RandomHorizontalFlip(0.5)
    aug = args.data_augmentation
    if aug == "hflip":
        ops: list[Any] = [flip]
    elif aug == "lsj":
        s = args.lsj_size
        fill = defaultdict(lambda: MEAN_FILL, {tv_tensors.Mask: 0})
        ops = [v2.ScaleJitter((s, s), antialias=True), _fixed_size_crop(s, fill), flip]
    elif aug == "ssd":
        ops = [v2.RandomPhotometricDistort(), v2.RandomZoomOut(fill=defaultdict(
            lambda: MEAN_FILL, {tv_tensors.Mask: 0})), v2.RandomIoUCrop(), flip]  # fmt: skip
    else:
        ops = [v2.RandomIoUCrop(), flip]
    return v2.Compose([v2.ToImage(), *ops, *tail, v2.SanitizeBoundingBoxes(), v2.ToPureTensor()])


def _fixed_size_crop(size: int, fill: Any) -> Any:
    """The reference's FixedSizeCrop (references/detection/transforms.py), from
    torchvision's prototype transforms where this torchvision has them, else a RandomCrop
    padded to the size (the same crop and padding up to where the padding goes)."""
    from torchvision.transforms import v2

    try:
        from torchvision.prototype.transforms import FixedSizeCrop  # type: ignore

        return FixedSizeCrop((size, size), fill=fill)
    except ImportError:
        return v2.RandomCrop((size, size), pad_if_needed=True, fill=fill)


# ---------------------------------------------------------------- data: packs


class PackData:
    """A detection pack: its columns, category map and stored image sizes."""

    def __init__(self, path: Path, what: str) -> None:
        from packer.pack.dense import dense_of

        if not path.exists():
            raise Fail(f"{path}: no such pack ({what})")
        self.path = path
        self.pack = packer.load(path)
        cols = dense_of(self.pack)
        if cols is None or cols.semantic:
            raise Fail(
                f"{path}: the {what} pack has no boxes; build it from COCO-format annotations "
                "(imgpack build SRC PACK --targets-from coco)"
            )
        self.columns = cols
        self.categories = cols.categories
        sizes = getattr(self.pack, "sizes", None)  # a JPEG pack: each image its own size
        if sizes is not None:
            self.sizes = np.asarray(sizes, dtype=np.int64).reshape(-1, 2)
        else:
            h, w = self.pack.image_shape[-2:]
            self.sizes = np.tile(np.array([[h, w]], dtype=np.int64), (len(self.pack), 1))

    def coco(self) -> Any:
        """The val pack's targets as a pycocotools COCO ground truth, with the original
        category ids (``categories.ids``)."""
        from pycocotools.coco import COCO

        cats, n = self.categories, len(self.pack)
        images, anns = [], []
        for i, rec in enumerate(self.columns.read(range(n))):
            h, w = (int(v) for v in self.sizes[i])
            images.append({"id": int(rec["image_id"]), "height": h, "width": w})
            rles = rec.get("masks_rle")
            for j, (box, label) in enumerate(zip(rec["boxes"], rec["labels"])):
                x1, y1, x2, y2 = (float(v) for v in box)
                a = {
                    "id": len(anns) + 1,
                    "image_id": int(rec["image_id"]),
                    "category_id": int(cats.ids[int(label)]),
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "area": float(rec["area"][j]),
                    "iscrowd": int(rec["iscrowd"][j]),
                }
                if rles is not None:
                    a["segmentation"] = {"size": [h, w], "counts": bytes(rles[j]).decode()}
                anns.append(a)
        gt = COCO()
        gt.dataset = {
            "images": images,
            "annotations": anns,
            "categories": [{"id": int(c), "name": nm} for c, nm in zip(cats.ids, cats.names)],
        }
        with _quiet():
            gt.createIndex()
        return gt


def pack_batches(loader: Any, masks: bool) -> Iterator[tuple[list, list]]:
    """A padded dense batch as the detection models take it: a list of float images
    [3, h, w] in [0, 1] at each image's own size, and target dicts (labels + 1: the
    models' background is 0). The batch is converted whole and cut into views by its
    shapes, which the loader keeps on the host: a fixed few device ops a batch and no
    wait for the device (the training step's kernels still queued)."""
    for x, t in loader:
        # as torchvision's ToDtype(float32, scale=True), the reference's: the same
        # floats, not only the same pixels (x / 255 rounds differently in the last bit)
        xf = x.float().mul_(1.0 / 255)
        labels = t["labels"] + 1
        counts = t["counts"].tolist()
        sizes = t["image_sizes"].tolist()
        ids = t["image_ids"].tolist()
        images, targets = [], []
        for i, (c, (h, w)) in enumerate(zip(counts, sizes)):
            images.append(xf[i, :, :h, :w])
            d = {"boxes": t["boxes"][i, :c], "labels": labels[i, :c], "image_id": ids[i]}
            if masks and "masks" in t:
                d["masks"] = t["masks"][i, :c, :h, :w]
            targets.append(d)
        yield images, targets


def on_device(batches: Iterator[tuple[list, list]], device: torch.device) -> Iterator:
    """:func:`pack_batches` moved to ``device`` (a val loader decoding on the CPU)."""
    for images, targets in batches:
        images = [im.to(device) for im in images]
        targets = [
            {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in t.items()}
            for t in targets
        ]
        yield images, targets


def pack_loaders(
    args: argparse.Namespace,
    device: torch.device,
    train_data: PackData | None = None,
    val_data: PackData | None = None,
) -> tuple[Any, Any]:
    """(train loader or None, val loader or None) over the packs the flags name: the
    train one with the preset and a shuffle per epoch, the val one in order, as stored.
    A box model's loaders leave the instance masks unread (the reference's targets for
    it have none)."""
    from packer.loading.dense_pass import DenseConfig

    masks = args.model.startswith("maskrcnn")
    train = val = None
    if args.data_path is not None and not args.test_only:
        train = packer.PackLoader(
            (train_data or PackData(args.data_path, "train")).pack,
            args.batch_size,
            device=device,
            seed=args.seed,
            num_threads=max(args.workers, 1),
            dense=DenseConfig(transform=pack_pipeline(args), targets="padded", masks=masks),
        )
    if args.val_pack is not None:
        # decoded on the CPU by default (libjpeg-turbo, as the reference's Pillow): the
        # reference's pixels, so the same weights give its mAP; ``--val-decode device``
        # decodes on the GPU (faster; pixels within 1/255 mean, mAP a few tenths apart)
        val = packer.PackLoader(
            (val_data or PackData(args.val_pack, "val")).pack,
            args.val_batch_size,
            device=torch.device("cpu") if args.val_decode == "cpu" else device,
            shuffle=False,
            num_threads=max(args.workers, 1),
            dense=DenseConfig(targets="padded", masks=masks),
        )
    return train, val


# ---------------------------------------------------------------- data: the reference's


class _Remap(torch.utils.data.Dataset):
    """The wrapped CocoDetection with COCO category ids turned into the model's labels
    (1 + the index in ``cat_ids``) and empty images given empty boxes."""

    def __init__(self, ds: Any, cat_ids: Sequence[int]) -> None:
        self.ds = ds
        self.lut = {int(c): i + 1 for i, c in enumerate(cat_ids)}

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, dict]:
        img, t = self.ds[i]
        t = dict(t)
        if "boxes" not in t:
            t["boxes"] = torch.zeros((0, 4))
            t["labels"] = torch.zeros((0,), dtype=torch.int64)
        t["labels"] = torch.tensor([self.lut[int(v)] for v in t["labels"]], dtype=torch.int64)
        return img, t


def reference_dataset(
    folder: Path, split: str, transforms: Any, masks: bool, cat_ids: Sequence[int] | None
) -> tuple[Any, Any, list[int]]:
    """The reference data path: ``CocoDetection(FOLDER/split, FOLDER/annotations/
    instances_{split}.json)`` wrapped for v2 transforms. Returns (dataset, its COCO
    object, the category ids in label order)."""
    from torchvision.datasets import CocoDetection, wrap_dataset_for_transforms_v2

    ann = folder / "annotations" / f"instances_{split}.json"
    if not ann.is_file() or not (folder / split).is_dir():
        raise Fail(
            f"{folder}: not COCO's layout for {split} (want {split}/ and annotations/"
            f"instances_{split}.json) (--data-path-reference)"
        )
    with _quiet():
        ds = CocoDetection(str(folder / split), str(ann), transforms=transforms)
    keys = ["boxes", "labels", "image_id"] + (["masks"] if masks else [])
    wrapped = wrap_dataset_for_transforms_v2(ds, target_keys=keys)
    ids = list(cat_ids) if cat_ids is not None else sorted(ds.coco.getCatIds())
    return _Remap(wrapped, ids), ds.coco, ids


def _collate(batch: list) -> tuple:
    return tuple(zip(*batch))


def reference_batches(dl: Any, device: torch.device) -> Iterator[tuple[list, list]]:
    for images, targets in dl:
        images = [im.to(device) for im in images]
        out = []
        for t in targets:
            d = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in t.items()}
            if "masks" in d:
                d["masks"] = d["masks"].to(torch.uint8)
            out.append(d)
        yield images, out


# ---------------------------------------------------------------- evaluation


class _quiet:
    """Silence pycocotools' prints (stdout) inside the block."""

    def __enter__(self) -> None:
        self._old = sys.stdout
        sys.stdout = open(os.devnull, "w")

    def __exit__(self, *exc: object) -> None:
        sys.stdout.close()
        sys.stdout = self._old


@torch.inference_mode()
def predictions(
    model: torch.nn.Module,
    batches: Iterator[tuple[list, list]],
    cat_ids: Sequence[int],
    amp: bool,
    device: torch.device,
    masks: bool,
) -> tuple[list[dict], list[int]]:
    """The model's detections over ``batches`` as COCO results (original category ids,
    XYWH boxes; RLE masks with ``masks``), and the image ids seen."""
    from pycocotools import mask as cm

    model.eval()
    dets: list[dict] = []
    seen: list[int] = []
    for images, targets in batches:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            outputs = model(images)
        for out, t in zip(outputs, targets):
            iid = int(t["image_id"])
            seen.append(iid)
            boxes = out["boxes"].float().cpu().numpy()
            scores = out["scores"].float().cpu().tolist()
            labels = out["labels"].cpu().tolist()
            rles = None
            if masks and "masks" in out:
                m = (out["masks"][:, 0] > 0.5).cpu().numpy().astype(np.uint8)
                rles = cm.encode(np.asfortranarray(m.transpose(1, 2, 0)))
            for k, (b, s, lab) in enumerate(zip(boxes, scores, labels)):
                d = {
                    "image_id": iid,
                    "category_id": int(cat_ids[int(lab) - 1]),
                    "bbox": [float(b[0]), float(b[1]), float(b[2] - b[0]), float(b[3] - b[1])],
                    "score": float(s),
                }
                if rles is not None:
                    d["segmentation"] = {"size": rles[k]["size"], "counts": rles[k]["counts"]}
                dets.append(d)
    model.train()
    return dets, seen


def coco_map(gt: Any, dets: list[dict], image_ids: Sequence[int], masks: bool) -> dict[str, float]:
    """pycocotools' COCOeval of ``dets`` against ``gt`` on ``image_ids``: {iou type:
    AP@[.5:.95] in points} (``bbox``, and ``segm`` with masks)."""
    from pycocotools.cocoeval import COCOeval

    out: dict[str, float] = {}
    for iou in ("bbox", "segm") if masks else ("bbox",):
        if not dets:
            out[iou] = 0.0
            continue
        with _quiet():
            dt = gt.loadRes([dict(d) for d in dets])
            ev = COCOeval(gt, dt, iou)
            ev.params.imgIds = sorted(set(image_ids))
            ev.evaluate()
            ev.accumulate()
            ev.summarize()
        out[iou] = max(float(ev.stats[0]), 0.0) * 100
    return out


def evaluate(
    model: torch.nn.Module,
    batches: Iterator[tuple[list, list]],
    gt: Any,
    cat_ids: Sequence[int],
    amp: bool,
    device: torch.device,
    masks: bool,
) -> dict[str, float]:
    """COCO mAP of ``model`` over ``batches`` (:func:`predictions`, :func:`coco_map`)."""
    dets, seen = predictions(model, batches, cat_ids, amp, device, masks)
    return coco_map(gt, dets, seen, masks)


# ---------------------------------------------------------------- model, checkpoint


def make_model(args: argparse.Namespace, num_classes: int, device: torch.device) -> Any:
    kw: dict[str, Any] = {}
    if args.trainable_backbone_layers is not None:
        kw["trainable_backbone_layers"] = args.trainable_backbone_layers
    if args.rpn_score_thresh is not None and "rcnn" in args.model:
        kw["rpn_score_thresh"] = args.rpn_score_thresh
    if args.box_score_thresh is not None:  # what a detection must score to be kept
        kw["score_thresh" if "retinanet" in args.model else "box_score_thresh"] = (
            args.box_score_thresh
        )
    if args.min_size is not None:
        kw["min_size"] = args.min_size
    if args.max_size is not None:
        kw["max_size"] = args.max_size
    try:
        model = torchvision.models.get_model(
            args.model,
            weights=args.weights,
            weights_backbone=args.weights_backbone,
            num_classes=num_classes,
            **kw,
        )
    except ValueError as e:
        raise Fail(f"--model {args.model}: {str(e).splitlines()[0][:200]}") from None
    return model.to(device)


def save_atomic(state: dict, path: Path) -> None:
    """Write to a temporary name in the same folder, then rename: never half a file."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(
    path: Path,
    device: torch.device,
    model_name: str,
    keys: frozenset[str] = frozenset({"model", "epoch", "model_name", "cat_ids"}),
) -> dict:
    """A checkpoint this script (or the segmentation recipe, with its ``keys``) wrote,
    loaded without unpickling code; a Fail naming the file for anything else."""
    if not path.is_file():
        raise Fail(f"{path}: no such checkpoint (--resume); give a checkpoint.pth this wrote")
    try:
        ck = torch.load(path, map_location=device, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError) as e:
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise Fail(f"{path}: not a checkpoint this script wrote ({first})") from None
    if not isinstance(ck, dict) or not keys <= set(ck):
        raise Fail(f"{path}: not a checkpoint this script wrote (--resume)")
    if ck["model_name"] != model_name:
        raise Fail(
            f"{path}: a {ck['model_name']} checkpoint; resume it with --model {ck['model_name']}"
        )
    return ck


# ---------------------------------------------------------------- main


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m packer.examples.train_detection",
        description="torchvision's detection reference on detection packs",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument("--data-path", type=Path, default=None, help="the train pack")
    ap.add_argument("--val-pack", type=Path, default=None, help="the val pack (COCO mAP)")
    ap.add_argument(
        "--data-path-reference",
        type=Path,
        default=None,
        help="a COCO folder read by the reference's data path instead of the packs",
    )
    ap.add_argument("--train-split", default="train2017", help="the reference path's train split")
    ap.add_argument("--val-split", default="val2017", help="the reference path's val split")
    ap.add_argument("--model", choices=MODELS, default="fasterrcnn_resnet50_fpn")
    ap.add_argument("--data-augmentation", choices=PRESETS, default="hflip")
    ap.add_argument("--lsj-size", type=POSITIVE, default=1024, help="the lsj preset's size")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("-b", "--batch-size", type=POSITIVE, default=2, help="images per batch")
    ap.add_argument("--val-batch-size", type=POSITIVE, default=1, help="1: the reference's")
    ap.add_argument(
        "--val-decode",
        choices=["cpu", "device"],
        default="cpu",
        help="where the val pack's JPEGs decode: cpu = libjpeg-turbo, the reference's pixels "
        "(the same weights give its mAP); device = the GPU decoder (faster, mAP a few "
        "tenths apart)",
    )
    ap.add_argument("--epochs", type=POSITIVE, default=26)
    ap.add_argument(
        "-j", "--workers", type=NONNEGATIVE, default=4, help="loader threads / DataLoader workers"
    )
    ap.add_argument("--opt", choices=["sgd", "adamw"], default="sgd")
    ap.add_argument("--lr", type=POSITIVE_FLOAT, default=0.02)
    ap.add_argument("--momentum", type=POSITIVE_FLOAT, default=0.9)
    ap.add_argument("--wd", "--weight-decay", dest="wd", type=POSITIVE_FLOAT, default=1e-4)
    ap.add_argument(
        "--lr-scheduler", choices=["multisteplr", "cosineannealinglr"], default="multisteplr"
    )
    ap.add_argument("--lr-steps", type=POSITIVE, nargs="+", default=[16, 22])
    ap.add_argument("--lr-gamma", type=POSITIVE_FLOAT, default=0.1)
    ap.add_argument("--print-freq", type=NONNEGATIVE, default=20)
    ap.add_argument("--output-dir", type=Path, default=Path("runs"))
    ap.add_argument("--resume", type=Path, default=None, help="checkpoint to continue from")
    ap.add_argument("--test-only", action="store_true", help="evaluate only")
    ap.add_argument("--weights", default=None, help="the model's torchvision weights")
    ap.add_argument("--weights-backbone", default=None, help="the backbone's weights")
    ap.add_argument("--trainable-backbone-layers", type=NONNEGATIVE, default=None)
    ap.add_argument("--rpn-score-thresh", type=POSITIVE_FLOAT, default=None)
    ap.add_argument(
        "--box-score-thresh", type=POSITIVE_FLOAT, default=None, help="the model's (0.05)"
    )
    ap.add_argument("--min-size", type=POSITIVE, default=None, help="the model's (800)")
    ap.add_argument("--max-size", type=POSITIVE, default=None, help="the model's (1333)")
    ap.add_argument("--amp", action="store_true", help="bf16 autocast")
    ap.add_argument("--max-steps", type=NONNEGATIVE, default=0, help="stop epochs after N")
    ap.add_argument("--seed", type=NONNEGATIVE, default=0)
    args = ap.parse_args(argv)
    return check_paths(args)


def check_paths(args: argparse.Namespace) -> argparse.Namespace:
    """The recipes' (this one's and train_segmentation's) data, checkpoint and output
    arguments, checked together: packs or the reference data path, what --test-only
    needs, an output folder that is not a file. ``args``, or Fail naming the flags."""
    if args.data_path_reference is not None and (args.data_path or args.val_pack):
        raise Fail("give the packs (--data-path, --val-pack) or --data-path-reference, not both")
    if args.data_path_reference is None:
        if args.test_only and args.val_pack is None:
            raise Fail("--test-only needs --val-pack (or --data-path-reference)")
        if not args.test_only and args.data_path is None:
            raise Fail("give the train pack: --data-path PACK (or --data-path-reference)")
    if args.test_only and args.resume is None and args.weights is None:
        raise Fail("--test-only evaluates --resume CHECKPOINT (or --weights)")
    if args.output_dir.exists() and not args.output_dir.is_dir():
        raise Fail(f"--output-dir {args.output_dir} is a file; give a folder")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(lambda: run(parse(argv)))


def run_cli(job: Callable[[], None]) -> int:
    """A recipe's exit code: 0, or 2 with one ``Error:`` line for a user's mistake."""
    try:
        job()
    except (Fail, PackerError) as e:
        print(f"Error: {e}", file=sys.stderr, flush=True)
        return 2
    return 0


def run(args: argparse.Namespace) -> None:
    if args.device == "cuda" and not torch.cuda.is_available():
        raise Fail("--device cuda but torch sees no CUDA device; use --device cpu")
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if cuda else "cpu")
    torch.manual_seed(args.seed)
    masks = args.model.startswith("maskrcnn")
    ck = load_checkpoint(args.resume, device, args.model) if args.resume is not None else None

    # the data: packs, or the reference's CocoDetection + DataLoader workers
    if args.data_path_reference is not None:
        folder = args.data_path_reference
        cat_ids = ck["cat_ids"] if ck is not None else None
        val_ds, gt, cat_ids = reference_dataset(
            folder, args.val_split, reference_pipeline(None, False), masks, cat_ids
        )
        dl_kw = {"num_workers": args.workers, "collate_fn": _collate}
        val_dl = torch.utils.data.DataLoader(val_ds, args.val_batch_size, **dl_kw)

        def val_batches() -> Iterator:
            return reference_batches(val_dl, device)

        train_dl = None
        if not args.test_only:
            train_ds, _, _ = reference_dataset(
                folder, args.train_split, reference_pipeline(args, True), masks, cat_ids
            )
            g = torch.Generator().manual_seed(args.seed)
            train_dl = torch.utils.data.DataLoader(
                train_ds, args.batch_size, shuffle=True, generator=g, **dl_kw
            )

        def train_batches(epoch: int) -> Iterator:
            return reference_batches(train_dl, device)

        steps = len(train_dl) if train_dl is not None else 0
        names = None
    else:
        val_data = PackData(args.val_pack, "val") if args.val_pack is not None else None
        train_data = PackData(args.data_path, "train") if not args.test_only else None
        train_loader, val_loader = pack_loaders(args, device, train_data, val_data)
        first = train_data or val_data
        assert first is not None
        cat_ids, names = list(first.categories.ids), list(first.categories.names)
        if val_data is not None and (
            list(val_data.categories.ids) != cat_ids or list(val_data.categories.names) != names
        ):
            raise Fail(
                f"{args.val_pack}: its category map differs from {args.data_path}'s; rebuild "
                f"it with --classes {args.data_path}"
            )
        gt = val_data.coco() if val_data is not None else None

        def val_batches() -> Iterator:
            return on_device(pack_batches(val_loader, masks), device)

        def train_batches(epoch: int) -> Iterator:
            train_loader.set_epoch(epoch)
            return pack_batches(train_loader, masks)

        steps = len(train_loader) if train_loader is not None else 0
    if ck is not None and list(ck["cat_ids"]) != list(cat_ids):
        raise Fail(f"{args.resume}: trained on categories {ck['cat_ids']}, not {cat_ids}")

    model = make_model(args, len(cat_ids) + 1, device)
    if ck is not None:
        try:
            model.load_state_dict(ck["model"])
        except RuntimeError as e:
            first_line = str(e).strip().splitlines()[0][:200]
            raise Fail(f"{args.resume}: does not fit --model {args.model} ({first_line})") from None
    amp = args.amp

    if args.test_only:
        maps = evaluate(model, val_batches(), gt, cat_ids, amp, device, masks)
        print("test: " + ", ".join(f"{k} mAP {v:.4f}" for k, v in maps.items()), flush=True)
        return

    params = [p for p in model.parameters() if p.requires_grad]
    if args.opt == "sgd":
        opt = torch.optim.SGD(params, lr=args.lr, momentum=args.momentum, weight_decay=args.wd)
    else:
        opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=args.wd)
    if args.lr_scheduler == "multisteplr":
        sched = torch.optim.lr_scheduler.MultiStepLR(opt, args.lr_steps, args.lr_gamma)
    else:
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.epochs)
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
    if args.max_steps:
        steps = min(steps, args.max_steps)

    for epoch in range(start, args.epochs):
        model.train()
        warmup = None
        if epoch == 0:  # the reference's linear warm-up over the first epoch's steps
            iters = min(1000, max(steps - 1, 1))
            warmup = torch.optim.lr_scheduler.LinearLR(opt, 1.0 / 1000, total_iters=iters)
        t0, n_img, loss_sum = time.perf_counter(), 0, 0.0
        for step, (images, targets) in enumerate(train_batches(epoch)):
            if step >= steps:
                break
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                losses = model(images, targets)
                loss = sum(losses.values())
            if not torch.isfinite(loss):
                raise Fail(f"epoch {epoch} step {step}: the loss is {loss.item()}; training stops")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if warmup is not None:
                warmup.step()
            loss_sum += loss.item()
            n_img += len(images)
            if args.print_freq and (step + 1) % args.print_freq == 0:
                parts = " ".join(f"{k} {float(v):.4f}" for k, v in losses.items())
                print(f"  epoch {epoch} step {step + 1}/{steps}: loss {float(loss):.4f} ({parts})")
        sched.step()
        rate = n_img / max(time.perf_counter() - t0, 1e-9)
        line = (
            f"epoch {epoch}: train loss {loss_sum / max(steps, 1):.4f} "
            f"lr {opt.param_groups[0]['lr']:.4g} {rate:,.1f} img/s"
        )
        if args.data_path_reference is None:  # did the loader keep up?
            st = train_loader.stats()
            line += f", waited for the loader {st.wait_share:.1%} (slowest: {st.slowest_stage})"
        if gt is not None:
            maps = evaluate(model, val_batches(), gt, cat_ids, amp, device, masks)
            line += " | " + ", ".join(f"{k} mAP {v:.4f}" for k, v in maps.items())
        print(line, flush=True)
        state = {
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "lr_scheduler": sched.state_dict(),
            "epoch": epoch,
            "model_name": args.model,
            "cat_ids": [int(c) for c in cat_ids],
            "names": names,
        }
        path = args.output_dir / "checkpoint.pth"
        save_atomic(state, path)
        print(f"checkpoint {path} (epoch {epoch})", flush=True)


if __name__ == "__main__":
    sys.exit(main())
