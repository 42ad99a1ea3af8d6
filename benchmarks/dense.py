"""Detection and segmentation fed by packs, against their baselines in one run (issue 46's
figures).

The data are made here: a COCO-format set of shapes with known boxes and masks (the
``tests/helpers/dense_data`` classes: squares and L shapes as polygons, "persons" as
RLE masks), on a noisy background so the JPEGs weigh about what COCO's do (~130 KB at
``--max-side`` 640, quality 90); a semantic-mask set of the same images (an image folder
beside a mask folder). Packs are built from them with the library (``--targets-from
coco`` / ``masks``, ``store="jpeg"``: the files as they are, so both data paths read the
same pixels; a raw pack padded to ``--max-side`` square for the loader's second row).
Data and packs are kept under ``--work`` and made again only when their sizes change.

Every timed figure alternates its ways in rounds (resident, pack, reference, resident,
...) and reports medians; each round of a way starts with ``--settle`` untimed steps of
it (a reference round also with its DataLoader's prefetched batches taken untimed), so
a round times what that way makes, not what it queued while the others ran. Parts
(``--parts``):

* ``frcnn``: Faster R-CNN R50-FPN (``weights=None, weights_backbone=None``), bf16
  autocast, channels-last where it is faster (``--channels-last auto``: timed both ways
  on resident batches first), SGD, fed by ``PackLoader`` with the detection recipe's
  train loader settings (``targets="padded"``, its LSJ preset on the device, no instance
  masks for a box model) vs the same step on resident batches (batches of the same
  loader, kept on the device).
* ``ref``: the same model fed by the recipe's reference data path (``CocoDetection``
  wrapped for v2 transforms, the reference's LSJ as ``torchvision.transforms.v2``,
  DataLoader with ``--workers`` (every core), ``reference_batches`` to the device).
* ``deeplab``: DeepLabV3 R50 (aux head, the segmentation recipe's loss and SGD groups),
  ``--crop`` (512) crops of the recipe's train preset, fed by a semantic pack vs resident.
* ``loader``: the loaders alone (no model): ``--loader-batch`` (32) images with LSJ
  ``--lsj`` (1024) from the JPEG pack (and a raw one), each batch as the model takes it
  (``pack_batches``), vs the reference data path on ``--workers`` cores.
* ``host``: the dense pass's host time a batch (the producer thread's work: read, decode
  call, draws, the batched transform's torch calls, collate) for the detection loader's
  settings, made ``--host-groups`` batches a pass (``DenseConfig.group``), in this
  thread, each figure the median of ``--host-passes`` passes, the groups alternated.
* ``map``: COCO mAP (pycocotools, bbox AP@[.5:.95]) of the same weights through the val
  pack and through the reference data path (the recipe's ``predictions`` and
  ``coco_map``, each path against its own ground truth: the pack's targets, the JSON);
  mean IoU of the DeepLabV3 weights likewise (the recipe's ``evaluate``). The weights:
  a fixed-seed init (``--seed``) trained by this run's steps (the rounds above, when
  they ran) plus ``--map-steps`` / ``--miou-steps`` pack-fed ones (at most
  ``--map-seconds`` / ``--miou-seconds``); the table says how many.

A part that fails is reported and the others still run; a way that fails (say the
reference's workers out of shared memory) leaves the other ways' figures, its ratios
"n/a"; either makes the exit status 1.

    python3 -m benchmarks.dense --device cuda            # every part (estimated 5-6 min on one H200)
    python3 -m benchmarks.dense --device cpu --toy --images 12 --val-images 4 \
        --seg-images 8 --max-side 64 --lsj 64 --min-size 48 --crop 48 --steps 1 \
        --rounds 1 --workers 0                          # a smoke run on the CPU

Prints one table per part and a summary last; writes ``bench_dense.json`` under
``--out`` (default ``$OUT``, else ``./out``), after every part.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import math
import os
import shutil
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

import packer
from packer.loading.dense_pass import DenseConfig
from packer.measure.timing import resolve_device, sync

from ._common import ROOT, machine

JSON = "bench_dense.json"
PARTS = ("frcnn", "ref", "deeplab", "loader", "map", "host")
# the images' (w, h) before scaling to --max-side: COCO's common shapes
SHAPES_WH = ((640, 480), (480, 640), (640, 427), (427, 640), (640, 512), (500, 375))


# ---------------------------------------------------------------- the data


def truth(i: int, max_side: int, seed: int) -> Any:
    """Image ``i``'s known shapes (deterministic): 2-6 non-overlapping squares, L shapes
    (polygons) and persons (an RLE in COCO), each 8-40% of the image's side."""
    from tests.helpers.dense_data import NAMES, Shape, Truth

    rng = np.random.default_rng([seed, i])
    w0, h0 = SHAPES_WH[i % len(SHAPES_WH)]
    k = max_side / max(w0, h0)
    h, w = max(16, round(h0 * k)), max(16, round(w0 * k))
    t = Truth(f"{i:07d}.jpg", (h, w))
    boxes: list[tuple[int, int, int, int]] = []
    for _ in range(int(rng.integers(2, 7))):
        name = NAMES[int(rng.integers(len(NAMES)))]
        for _try in range(12):
            bw = max(6, int(rng.uniform(0.08, 0.4) * w))
            bh = max(6, int(rng.uniform(0.08, 0.4) * h))
            x1, y1 = int(rng.integers(0, w - bw + 1)), int(rng.integers(0, h - bh + 1))
            x2, y2 = x1 + bw, y1 + bh
            if all(x2 <= a or x1 >= c or y2 <= b or y1 >= d for a, b, c, d in boxes):
                break
        else:
            continue
        boxes.append((x1, y1, x2, y2))
        mask = np.zeros((h, w), dtype=np.uint8)
        if name == "ell":  # a column a third wide, a foot a third high
            cx, fy = x1 + max(2, bw // 3), y2 - max(2, bh // 3)
            mask[y1:y2, x1:cx] = 1
            mask[fy:y2, x1:x2] = 1
            poly = [x1, y1, cx, y1, cx, fy, x2, fy, x2, y2, x1, y2]
        else:
            mask[y1:y2, x1:x2] = 1
            poly = [x1, y1, x2, y1, x2, y2, x1, y2]
        t.shapes.append(
            Shape(
                name, (x1, y1, x2, y2), mask, None if name == "person" else [float(v) for v in poly]
            )
        )
    return t


class Truths:
    """Images ``lo..hi``'s truths, made again on each pass (never all in memory)."""

    def __init__(self, lo: int, hi: int, max_side: int, seed: int) -> None:
        self.lo, self.hi, self.max_side, self.seed = lo, hi, max_side, seed

    def __iter__(self) -> Iterator[Any]:
        return (truth(i, self.max_side, self.seed) for i in range(self.lo, self.hi))

    def __len__(self) -> int:
        return self.hi - self.lo


def _write_one(
    i: int, a: argparse.Namespace, img_dir: Path, seg_dir: Path | None, noise: np.ndarray
) -> int:
    from PIL import Image

    from tests.helpers.dense_data import draw

    t = truth(i, a.max_side, a.seed)
    h, w = t.size
    rng = np.random.default_rng([a.seed, i, 1])
    oy, ox = (
        int(rng.integers(0, noise.shape[0] - h + 1)),
        int(rng.integers(0, noise.shape[1] - w + 1)),
    )
    px = np.asarray(draw(t), dtype=np.int16) + noise[oy : oy + h, ox : ox + w]
    path = img_dir / t.file
    Image.fromarray(px.clip(0, 255).astype(np.uint8)).save(path, quality=90)
    if seg_dir is not None:
        try:  # the same bytes beside their masks
            os.link(path, seg_dir / "images" / t.file)
        except OSError:  # a file system without hard links
            shutil.copyfile(path, seg_dir / "images" / t.file)
        Image.fromarray(t.semantic(), mode="L").save(seg_dir / "masks" / f"{t.stem}.png")
    return path.stat().st_size


def make_data(a: argparse.Namespace, procs: int) -> dict[str, Any]:
    """The COCO folder (train2017, val2017) and the semantic folders (seg/train, seg/val)
    under ``--work``; made once per size (a marker file names it)."""
    import json

    from tests.helpers.dense_data import coco_doc

    root = a.work / "data"
    key = f"{a.images} {a.val_images} {a.seg_images} {a.max_side} {a.seed}"
    marker = root / "made.txt"
    if marker.is_file() and marker.read_text() == key:
        return json.loads((root / "stats.json").read_text())
    shutil.rmtree(root, ignore_errors=True)
    t0 = time.perf_counter()
    noise = np.random.default_rng(a.seed).normal(0, 16, (a.max_side + 64, a.max_side + 64, 3))
    noise = noise.astype(np.int16)
    splits = {
        "train2017": (0, a.images, "train", a.seg_images),
        "val2017": (a.images, a.images + a.val_images, "val", a.val_images),
    }
    sizes: list[int] = []
    for split, (lo, hi, seg, n_seg) in splits.items():
        img_dir = root / "coco" / split
        img_dir.mkdir(parents=True)
        seg_dir = root / "seg" / seg
        (seg_dir / "images").mkdir(parents=True)
        (seg_dir / "masks").mkdir()
        with ThreadPoolExecutor(procs) as ex:
            segs = [seg_dir if i - lo < n_seg else None for i in range(lo, hi)]
            n = hi - lo
            sizes += ex.map(_write_one, range(lo, hi), [a] * n, [img_dir] * n, segs, [noise] * n)
        (root / "coco" / "annotations").mkdir(exist_ok=True)
        doc = coco_doc(Truths(lo, hi, a.max_side, a.seed))  # type: ignore[arg-type]
        (root / "coco" / "annotations" / f"instances_{split}.json").write_text(json.dumps(doc))
    stats = {
        "images": len(sizes),
        "mean_kb": round(sum(sizes) / len(sizes) / 1024, 1),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    (root / "stats.json").write_text(json.dumps(stats))
    marker.write_text(key)
    return stats


def build_packs(a: argparse.Namespace, procs: int, parts: set[str]) -> dict[str, Path]:
    """The packs the parts read, each built once (kept while its source's marker is)."""
    from packer.builder.config import BuildConfig
    from packer.builder.dense import DenseOptions

    data, packs = a.work / "data", a.work / "packs"
    key = (data / "made.txt").read_text()
    marker = packs / "made.txt"
    if not (marker.is_file() and marker.read_text() == key):
        shutil.rmtree(packs, ignore_errors=True)
    packs.mkdir(parents=True, exist_ok=True)
    out = {n: packs / n for n in ("det_train", "det_val", "det_raw", "seg_train", "seg_val")}
    coco = data / "coco"

    def det(split: str, **kw: Any) -> BuildConfig:
        return BuildConfig(workers=procs, dense=DenseOptions(format="coco", split=split), **kw)

    def seg(**kw: Any) -> BuildConfig:
        return BuildConfig(store="jpeg", workers=procs, dense=DenseOptions(format="masks"), **kw)

    want = {
        "det_train": lambda: (coco, det("train2017", store="jpeg")),
        "det_val": lambda: (coco, det("val2017", store="jpeg", classes=out["det_train"])),
        "det_raw": lambda: (
            coco,
            det("train2017", store="raw", resize="pad", size=(a.max_side, a.max_side)),
        ),
        "seg_train": lambda: (data / "seg" / "train", seg()),
        "seg_val": lambda: (data / "seg" / "val", seg(classes=out["seg_train"])),
    }
    needs = set()
    if parts & {"frcnn", "ref", "loader", "map", "host"}:
        needs |= {"det_train"}
    if "map" in parts:
        needs |= {"det_val", "seg_train", "seg_val"}
    if "deeplab" in parts:
        needs |= {"seg_train"}
    if "loader" in parts and "raw" in a.loader_stores.split(","):
        needs |= {"det_raw"}
    for name in ("det_train", "det_val", "det_raw", "seg_train", "seg_val"):
        if name in needs and not (out[name] / "imgpack.json").exists():
            t0 = time.perf_counter()
            src, cfg = want[name]()
            packer.build_pack(src, out[name], cfg)
            print(f"built {name} in {time.perf_counter() - t0:.1f} s", flush=True)
    marker.write_text(key)
    return out


# ---------------------------------------------------------------- timing


def timed(
    step: Callable[[Any, Any], Any],
    feed: Callable[[], Any],
    steps: int,
    device: torch.device,
    fed: list[float] | None = None,
    each: list[list[float]] | None = None,
) -> float:
    """img/s of ``steps`` of ``step(*feed())``, the device synchronized at both ends;
    ``fed`` gets the host's ms a step inside ``feed()`` (taking the batch, and any wait
    for the device there); ``each`` the host's ms of every step, feed included (a step
    whose host runs ahead of the device is not synchronized: these are the host's)."""
    sync(device)
    t0 = time.perf_counter()
    n, in_feed, ms = 0, 0.0, []
    for _ in range(steps):
        f0 = time.perf_counter()
        x, y = feed()
        f1 = time.perf_counter()
        in_feed += f1 - f0
        step(x, y)
        ms.append((time.perf_counter() - f0) * 1e3)
        n += len(x)
    sync(device)
    if fed is not None:
        fed.append(in_feed / steps * 1e3)
    if each is not None:
        each.append(ms)
    return n / (time.perf_counter() - t0)


def drain(it: Iterator[Any], n: int) -> None:
    """Take ``n`` batches untimed (a DataLoader's prefetched ones)."""
    for _ in range(n):
        next(it)


def rounds(
    ways: dict[str, tuple[Callable, Callable, Callable | None]],
    n_rounds: int,
    steps: int,
    settle: int,
    device: torch.device,
    failed: dict[str, str],
    after: Callable[[str], None] | None = None,
    fed: dict[str, list[float]] | None = None,
    each: dict[str, list[list[float]]] | None = None,
) -> dict[str, list[float]]:
    """Every way once per round, in order: {way: img/s per round}. A way is (step, feed,
    before): ``before()`` then ``settle`` steps run untimed ahead of its round, so the
    batches a loader queued while the other ways ran are not timed (its queue is as a
    steady run leaves it); ``after(name)`` after each timing. A way that raises is left
    out of the later rounds, its error in ``failed`` (the others' figures stand).
    ``fed``: {way: the host's ms a step in its feed, per round}; ``each``: {way: per
    round, the host's ms of each step} (:func:`timed`)."""
    rates: dict[str, list[float]] = {k: [] for k in ways}
    for r in range(n_rounds):
        for name, (step, feed, before) in ways.items():
            if name in failed:
                continue
            try:
                if before is not None:
                    before()
                for _ in range(settle):
                    step(*feed())
                into = None if fed is None else fed.setdefault(name, [])
                per = None if each is None else each.setdefault(name, [])
                rates[name].append(timed(step, feed, steps, device, into, per))
                if after is not None:
                    after(name)
            except Exception as e:  # the reference's workers out of shared memory, ...
                failed[name] = f"{type(e).__name__}: {str(e).strip()[:300]}"
                traceback.print_exc()
        done = ", ".join(f"{k} {v[-1]:,.1f}" for k, v in rates.items() if v)
        print(f"  round {r + 1}: {done}" + "".join(f", {k} FAILED" for k in failed), flush=True)
    return rates


def ratio(num: float, den: float, fmt: str, unit: str = "") -> str:
    """``num / den`` in ``fmt`` + ``unit``, or "n/a" where a way failed (its median is
    NaN)."""
    q = num / den if den else float("nan")
    return "n/a" if q != q else format(q, fmt) + unit


def med(v: list[float]) -> float:
    return statistics.median(v) if v else float("nan")


def endless(make: Callable[[], Iterator[Any]]) -> Iterator[Any]:
    while True:
        yield from make()


class Cycle:
    """Resident batches, one after another without end; ``reset()`` starts over from
    the first (so every timing of a way can run the same batches)."""

    def __init__(self, batches: list[Any]) -> None:
        self.batches = batches
        self.reset()

    def reset(self) -> None:
        self._it = itertools.cycle(self.batches)

    def __call__(self) -> Any:
        return next(self._it)


def _clone(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_clone(v) for v in obj)
    return obj


def pick_channels_last(
    a: argparse.Namespace,
    model: torch.nn.Module,
    make_step: Callable,
    feed: Callable,
    device: torch.device,
) -> tuple[bool, dict]:
    """``--channels-last on|off``, or ``auto``: the faster of both on resident batches
    (a few steps each, a throw-away optimizer)."""
    if a.channels_last != "auto" or device.type != "cuda":
        on = a.channels_last == "on"
        model.to(memory_format=torch.channels_last if on else torch.contiguous_format)
        return on, {}
    rates = {}
    for on in (False, True, False, True):
        model.to(memory_format=torch.channels_last if on else torch.contiguous_format)
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-6)
        step = make_step(model, opt)
        for _ in range(2):
            step(*feed())
        rates.setdefault(on, []).append(timed(step, feed, max(3, a.steps // 4), device))
    best = max(rates, key=lambda k: med(rates[k]))
    model.to(memory_format=torch.channels_last if best else torch.contiguous_format)
    return best, {
        "channels_last_img_s": {str(k): [round(v, 1) for v in r] for k, r in rates.items()}
    }


# ---------------------------------------------------------------- detection


def det_args(a: argparse.Namespace, packs: dict[str, Path]) -> argparse.Namespace:
    """The detection recipe's arguments for these runs."""
    from packer.examples import train_detection as TD

    argv = [
        "--data-path",
        str(packs["det_train"]),
        "--val-pack",
        str(packs["det_val"]),
        "--model",
        a.det_model,
        "--data-augmentation",
        "lsj",
        "--lsj-size",
        str(a.lsj),
        "-b",
        str(a.batch),
        "-j",
        str(a.workers),
        "--val-batch-size",
        str(a.val_batch),
        "--lr",
        str(a.lr),
        "--device",
        a.device,
    ]
    if a.min_size:
        argv += ["--min-size", str(a.min_size), "--max-size", str(max(a.min_size, a.lsj))]
    args = TD.parse(argv)
    args.amp = a.amp
    return args


def det_step(amp: bool, device: torch.device) -> Callable:
    def make(model: torch.nn.Module, opt: Any, sched: Any = None) -> Callable:
        losses_seen: list[torch.Tensor] = []

        def step(images: list, targets: list) -> None:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                losses = model(images, targets)
                loss = sum(losses.values())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if sched is not None:
                sched.step()
            losses_seen[:] = [loss.detach()]
            step.calls += 1  # type: ignore[attr-defined]

        step.last = losses_seen  # type: ignore[attr-defined]
        step.calls = 0  # type: ignore[attr-defined]
        return step

    return make


def reference_loader(ds: Any, batch: int, a: argparse.Namespace) -> Any:
    """The detection reference's train DataLoader (shuffled, whole batches, ``--workers``
    workers, its collate), over a long shuffled stream: permutations of the set one after
    another, so no epoch ends inside a round (as the pack loaders' repeated rows)."""
    from packer.examples import train_detection as TD

    g = torch.Generator().manual_seed(a.seed)
    sampler = torch.utils.data.RandomSampler(ds, num_samples=len(ds) * 1000, generator=g)
    return torch.utils.data.DataLoader(
        ds,
        batch,
        sampler=sampler,
        num_workers=a.workers,
        collate_fn=TD._collate,
        drop_last=True,
        persistent_workers=a.workers > 0,
    )


class Det:
    """The detection side: the model, its optimizer, the pack's and the reference's
    feeds; made once, shared by the parts (the same weights from part to part)."""

    def __init__(self, a: argparse.Namespace, packs: dict[str, Path], device: torch.device):
        from packer.examples import train_detection as TD

        self.a, self.device, self.packs = a, device, packs
        self.args = det_args(a, packs)
        self.data = TD.PackData(packs["det_train"], "train")
        self.cat_ids = list(self.data.categories.ids)
        self.masks = a.det_model.startswith("maskrcnn")  # as the recipe: a box model's none
        torch.manual_seed(a.seed)
        self.model = TD.make_model(self.args, len(self.cat_ids) + 1, device)
        self.loader = self._pack_loader(a.batch)
        self.pack_it = endless(lambda: TD.pack_batches(self.loader, False))
        self.make_step = det_step(a.amp, device)
        self._ref_it: Iterator[Any] | None = None
        self.ref_dl: Any = None
        self.info: dict[str, Any] = {}

    def extra_feed(
        self, threads: int | None = None, group: int | None = None, host: str | None = None
    ) -> Callable[[], Any]:
        """The pack's feed through a second loader of ``threads`` threads, making ``group``
        batches a pass, or its groups' host half on ``host`` (the ``--frcnn-threads``,
        ``--frcnn-groups`` and ``--frcnn-thread`` ways)."""
        from packer.examples import train_detection as TD

        loader = self._pack_loader(self.a.batch, threads=threads, group=group, host=host)
        it = endless(lambda: TD.pack_batches(loader, False))
        return lambda: next(it)

    def _pack_loader(
        self,
        batch: int,
        pack: Path | None = None,
        threads: int | None = None,
        group: int | None = None,
        host: str | None = None,
    ) -> Any:
        from packer.examples import train_detection as TD

        p = packer.load(pack or self.packs["det_train"])
        rows = torch.arange(len(p)).repeat(1000)  # no epoch ends inside a round
        # the recipe's train loader (pack_loaders), streaming the rows over and over
        dense = DenseConfig(
            TD.pack_pipeline(self.args), "padded", masks=self.masks, group=group, host=host
        )
        return packer.PackLoader(
            p,
            batch,
            device=self.device,
            seed=self.a.seed,
            num_threads=threads or self.a.threads,
            indices=rows,
            drop_last=True,
            dense=dense,
        )

    def setup(self) -> None:
        """Channels-last picked, the optimizer made (SGD, the recipe's warm-up)."""
        if getattr(self, "step", None) is not None:
            return
        feed = Cycle([_clone(next(self.pack_it)) for _ in range(self.a.resident)])
        self.resident = feed
        cl, info = pick_channels_last(self.a, self.model, self.make_step, feed, self.device)
        self.info.update(info, channels_last=cl)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = torch.optim.SGD(params, lr=self.a.lr, momentum=0.9, weight_decay=1e-4)
        self.sched = torch.optim.lr_scheduler.LinearLR(self.opt, 1e-3, total_iters=self.a.warmup)
        self.step = self.make_step(self.model, self.opt, self.sched)

    def pack_feed(self) -> Any:
        return next(self.pack_it)

    def snapshot(self) -> dict[str, Any]:
        """The model's, optimizer's and LR schedule's state, copied (on the device)."""
        return _clone(
            {
                "model": self.model.state_dict(),
                "opt": self.opt.state_dict(),
                "sched": self.sched.state_dict(),
            }
        )

    def restore(self, snap: dict[str, Any]) -> None:
        """Back to :meth:`snapshot`'s state (copied in: the snapshot stays as it was)."""
        self.model.load_state_dict(snap["model"])
        self.opt.load_state_dict(_clone(snap["opt"]))
        self.sched.load_state_dict(snap["sched"])

    def ref_iter(self) -> Iterator[Any]:
        """The recipe's reference data path over the train split, endless."""
        if self._ref_it is None:
            from packer.examples import train_detection as TD

            ds, _, _ = TD.reference_dataset(
                self.a.work / "data" / "coco",
                "train2017",
                TD.reference_pipeline(self.args, True),
                False,
                self.cat_ids,
            )
            self.ref_dl = reference_loader(ds, self.a.batch, self.a)
            self._ref_it = endless(lambda: TD.reference_batches(self.ref_dl, self.device))
        return self._ref_it

    def loss(self) -> float:
        last = self.step.last  # type: ignore[attr-defined]
        return float(last[-1]) if last else float("nan")

    def close_reference(self) -> None:
        """Stop the reference's DataLoader workers (and free their prefetched batches)."""
        self._ref_it = self.ref_dl = None


def warm(ways: dict[str, Any], n: int, failed: dict[str, str]) -> None:
    """``n`` untimed steps per way (cudnn's choices, the loaders' queues), each way's
    ``before()`` first; a way that raises goes to ``failed``."""
    for name, (step, feed, before) in ways.items():
        try:
            if before is not None:
                before()
            for _ in range(n):
                step(*feed())
        except Exception as e:
            failed[name] = f"{type(e).__name__}: {str(e).strip()[:300]}"
            traceback.print_exc()


def table(title: str, m: dict[str, float], base: str, failed: dict[str, str]) -> None:
    print(f"\n{title}")
    print(f"| way | img/s | / {base} |\n| --- | --- | --- |")
    for k, v in m.items():
        print(f"| {k} | {v:,.1f} | {ratio(v, m[base], '.3f')} |")
    for k, e in failed.items():
        print(f"| {k} | FAILED: {e[:100]} | - |")


def part_frcnn(a: argparse.Namespace, det: Det, with_ref: bool, res: dict, summary: list) -> None:
    det.setup()
    failed: dict[str, str] = {}
    ways: dict[str, Any] = {
        "resident": (det.step, det.resident, None),
        "pack": (det.step, det.pack_feed, None),
    }
    # the loader's threads share the GIL with a step that is mostly Python: the same
    # pack, and the resident step, at other switch intervals; and the pack through
    # loaders of fewer threads
    default_si = sys.getswitchinterval()
    for si in a.switch:
        ways[f"resident, switch {si * 1000:g} ms"] = (det.step, det.resident, None)
        ways[f"pack, switch {si * 1000:g} ms"] = (det.step, det.pack_feed, None)
    for t in a.frcnn_threads:
        ways[f"pack, {t} threads"] = (det.step, det.extra_feed(threads=t), None)
    for g in a.frcnn_groups:
        ways[f"pack, {g} batch(es) a pass"] = (det.step, det.extra_feed(group=g), None)
    if a.frcnn_thread:
        # the groups' host half on the producer thread, beside the step in its GIL
        # (DenseConfig.host; the default makes it in a worker process)
        ways["pack, host half on the thread"] = (det.step, det.extra_feed(host="thread"), None)
    if a.frcnn_beside:
        # the resident batches, while a batch of the pack is taken (and dropped) each
        # step: the loader's work beside the step without its batches' content
        def beside() -> Any:
            det.pack_feed()
            return det.resident()

        ways["resident, the pack's loader working beside"] = (det.step, beside, None)
    if a.frcnn_sync and det.device.type == "cuda":
        # the host waiting for the device as it takes each batch (what a consumer that
        # reads the batch's shapes off the device does): that wait alone, on both feeds
        def synced(feed: Callable[[], Any]) -> Callable[[], Any]:
            def take() -> Any:
                got = feed()
                torch.cuda.current_stream(det.device).synchronize()
                return got

            return take

        ways["resident, host waits for the device each batch"] = (
            det.step, synced(det.resident), None)  # fmt: skip
        ways["pack, host waits for the device each batch"] = (
            det.step, synced(det.pack_feed), None)  # fmt: skip
    if with_ref:
        it = det.ref_iter()
        prefetched = a.workers * 2 if a.workers else 0
        ways["reference"] = (det.step, lambda: next(it), lambda: drain(it, prefetched))
        # its workers forked first, while the pack loader's threads wait on a full queue
        ways = {"reference": ways.pop("reference"), **ways}
    start: list[Any] = []  # the weights every timing starts from (--same-start)

    for k, (st, fd, bf) in list(ways.items()):
        si = float(k.split("switch ")[1].split(" ms")[0]) / 1000 if "switch " in k else default_si

        def before(si: float = si, bf: Callable | None = bf) -> None:
            sys.setswitchinterval(si)
            if start:
                det.restore(start[0])
                det.resident.reset()  # the same weights and the same resident batches
            if bf is not None:
                bf()

        ways[k] = (st, fd, before)
    warm(ways, a.warm, failed)
    sync(det.device)
    if a.same_start:
        # a detector's step time follows its weights (proposals kept, boxes sampled) and
        # a run that trains on drifts, or diverges, between timings: each timing starts
        # from the weights the warm-up left, so the ways differ in their feed alone
        start.append(det.snapshot())
    order = ("resident", "pack", "reference")
    ways = {
        **{k: ways[k] for k in order if k in ways},
        **{k: v for k, v in ways.items() if k not in order},
    }
    losses: dict[str, list[float]] = {k: [] for k in ways}
    fed: dict[str, list[float]] = {}
    each: dict[str, list[list[float]]] = {}

    def after(name: str) -> None:
        losses[name].append(det.loss())

    try:
        rates = rounds(
            ways, a.rounds, a.steps, a.settle, det.device, failed, after=after, fed=fed, each=each
        )
    finally:
        sys.setswitchinterval(default_si)
    det.close_reference()
    # a timing whose loss went non-finite ran a different model (no proposals): left out
    bad = {k: [r for r, x in enumerate(v) if not math.isfinite(x)] for k, v in losses.items()}
    kept = {k: [x for r, x in enumerate(v) if r not in bad.get(k, [])] for k, v in rates.items()}
    m = {k: med(v) for k, v in kept.items()}
    paired = [
        p / r
        for i, (p, r) in enumerate(zip(rates["pack"], rates["resident"]))
        if i not in bad["pack"] and i not in bad["resident"]
    ]
    res["frcnn"] = {
        "img_s": m,
        "rounds": rates,
        "losses": losses,
        "non_finite": bad,
        "paired_ratios": paired,
        "feed_ms_a_step": fed,
        "step_ms": each,
        "same_start": a.same_start,
        "failed": failed,
        "batch": a.batch,
        "loss": det.loss(),
        "loader_stats": str(det.loader.stats()),
        **det.info,
    }
    table(
        f"{a.det_model}, bf16={a.amp}, batch {a.batch}, LSJ {a.lsj}, {a.steps} steps x "
        f"{a.rounds} rounds (median img/s; each timing from the same weights: "
        f"{a.same_start}; timings with a non-finite loss left out: "
        f"{sum(len(v) for v in bad.values())})",
        m,
        "resident",
        failed,
    )
    # a robust figure beside the timings' img/s: the median of every step's host time
    # (the step is host-bound: a few slow steps, a collection or a clock dip, weigh less)
    step_med = {k: med([x for r, v in enumerate(t) if r not in bad.get(k, []) for x in v])
                for k, t in each.items()}  # fmt: skip
    print("host ms a step: inside the feed (taking the batch), median of the timings; "
          "the whole step, median of every step; its img/s / resident's:")  # fmt: skip
    for k, v in fed.items():
        sm, base = step_med.get(k, float("nan")), step_med.get("resident", float("nan"))
        print(f"  {k}: {med(v):.2f}; {sm:.2f}; {ratio(base, sm, '.3f')}")
    res["frcnn"]["step_ms_median"] = step_med
    pack, resident = m["pack"], m["resident"]
    summary.append(
        (
            "a. Faster R-CNN fed by a pack (LSJ on the device) / resident",
            f"{pack:,.1f} / {resident:,.1f} img/s",
            ratio(pack, resident, ".3f"),
            ">= 0.98",
        )
    )
    summary.append(
        (
            "a. the same, the median of each round's pack / resident",
            f"{len(paired)} rounds",
            ratio(med(paired), 1.0, ".3f"),
            ">= 0.98",
        )
    )
    sm_pack, sm_res = step_med.get("pack", float("nan")), step_med.get("resident", float("nan"))
    summary.append(
        (
            "a. the same, resident's median step / the pack's (host ms of every step)",
            f"{sm_res:.1f} / {sm_pack:.1f} ms",
            ratio(sm_res, sm_pack, ".3f"),
            ">= 0.98",
        )
    )
    if with_ref:
        ref = m["reference"]
        summary.append(
            (
                "b. the same model fed by the reference data path (img/s)",
                f"{ref:,.1f} img/s ({a.workers} workers)",
                f"{ratio(ref, resident, '.3f')} of resident",
                "report",
            )
        )
        summary.append(
            (
                "b. imgpack / reference data path, same model",
                f"{pack:,.1f} / {ref:,.1f} img/s",
                ratio(pack, ref, ".2f", "x"),
                ">= 3x where the data path binds",
            )
        )


# ---------------------------------------------------------------- segmentation


def seg_args(a: argparse.Namespace, packs: dict[str, Path]) -> argparse.Namespace:
    from packer.examples import train_segmentation as TS

    argv = [
        "--data-path",
        str(packs["seg_train"]),
        "--val-pack",
        str(packs["seg_val"]),
        "--model",
        a.seg_model,
        "--aux-loss",
        "--crop-size",
        str(a.crop),
        "--base-size",
        str(a.base_size),
        "-b",
        str(a.seg_batch),
        "-j",
        str(a.workers),
        "--device",
        a.device,
    ]
    args = TS.parse(argv)
    args.amp = a.amp
    return args


class Seg:
    """The segmentation side, as :class:`Det`."""

    def __init__(self, a: argparse.Namespace, packs: dict[str, Path], device: torch.device):
        from packer.examples import train_segmentation as TS

        self.a, self.device, self.packs = a, device, packs
        self.args = seg_args(a, packs)
        self.num_classes = TS.PackData(packs["seg_train"], "train").num_classes
        torch.manual_seed(a.seed)
        self.model = TS.make_model(self.args, self.num_classes, device)
        self.loader = self.pack_loader()
        self.it = iter(self.loader)
        self.info: dict[str, Any] = {}
        self.step: Any = None

    def pack_loader(self, group: int | None = None, host: str | None = None) -> Any:
        """The segmentation recipe's train loader over the pack, streaming its rows over
        and over; ``group``, ``host``: ``DenseConfig``'s (the ``--seg-groups`` and
        ``--seg-process`` ways)."""
        from packer.examples import train_segmentation as TS

        a = self.a
        p = packer.load(self.packs["seg_train"])
        rows = torch.arange(len(p)).repeat(1000)
        return packer.PackLoader(
            p,
            a.seg_batch,
            device=self.device,
            seed=a.seed,
            drop_last=True,
            indices=rows,
            num_threads=a.threads,
            dense=DenseConfig(TS.pack_pipeline(self.args, True), group=group, host=host),
        )

    def make_step(self, model: torch.nn.Module, opt: Any, sched: Any = None) -> Callable:
        from packer.examples import train_segmentation as TS

        amp, dev, last = self.a.amp, self.device, []
        cl = self.info.get("channels_last", False)

        def step(x: torch.Tensor, y: torch.Tensor) -> None:
            x = TS.normalize(x)  # uint8 -> float, as the recipe's pack_batches
            if cl:
                x = x.contiguous(memory_format=torch.channels_last)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
                out = model(x)
            y = y.to(torch.int64)
            losses = {
                k: torch.nn.functional.cross_entropy(v.float(), y, ignore_index=TS.IGNORE)
                for k, v in out.items()
            }
            loss = losses["out"] + 0.5 * losses["aux"] if "aux" in losses else losses["out"]
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if sched is not None:
                sched.step()
            last[:] = [loss.detach()]
            step.calls += 1  # type: ignore[attr-defined]

        step.last = last  # type: ignore[attr-defined]
        step.calls = 0  # type: ignore[attr-defined]
        return step

    def setup(self) -> None:
        if self.step is not None:
            return
        self.resident = Cycle([_clone(next(self.it)) for _ in range(self.a.resident)])

        def probe(model: torch.nn.Module, opt: Any) -> Callable:
            return self.make_step(model, opt)

        cl, info = pick_channels_last(self.a, self.model, probe, self.resident, self.device)
        self.info.update(info, channels_last=cl)
        m = self.model
        groups = [
            {"params": [p for p in m.backbone.parameters() if p.requires_grad]},
            {"params": [p for p in m.classifier.parameters() if p.requires_grad]},
        ]
        if getattr(m, "aux_classifier", None) is not None:
            groups.append({"params": list(m.aux_classifier.parameters()), "lr": self.a.seg_lr * 10})
        self.opt = torch.optim.SGD(groups, lr=self.a.seg_lr, momentum=0.9, weight_decay=1e-4)
        self.step = self.make_step(m, self.opt)

    def pack_feed(self) -> Any:
        return next(self.it)

    def loss(self) -> float:
        last = self.step.last
        return float(last[-1]) if last else float("nan")


def part_deeplab(a: argparse.Namespace, seg: Seg, res: dict, summary: list) -> None:
    seg.setup()
    failed: dict[str, str] = {}
    ways = {"resident": (seg.step, seg.resident, None), "pack": (seg.step, seg.pack_feed, None)}
    for g in a.seg_groups:
        it = iter(seg.pack_loader(g))
        ways[f"pack, {g} batch(es) a pass"] = (seg.step, lambda it=it: next(it), None)
    if a.seg_process:
        it = iter(seg.pack_loader(host="process"))
        ways["pack, host half in a process"] = (seg.step, lambda it=it: next(it), None)
    warm(ways, a.warm, failed)
    rates = rounds(ways, a.rounds, a.steps, a.settle, seg.device, failed)
    m = {k: med(v) for k, v in rates.items()}
    res["deeplab"] = {
        "img_s": m,
        "rounds": rates,
        "failed": failed,
        "batch": a.seg_batch,
        "crop": a.crop,
        "loss": seg.loss(),
        "loader_stats": str(seg.loader.stats()),
        **seg.info,
    }
    table(
        f"{a.seg_model}, {a.crop}² crops, batch {a.seg_batch} (median img/s; last loss "
        f"{seg.loss():.3f})",
        m,
        "resident",
        failed,
    )
    summary.append(
        (
            f"c. DeepLabV3 fed by a pack, {a.crop}² crops / resident",
            f"{m['pack']:,.1f} / {m['resident']:,.1f} img/s",
            ratio(m["pack"], m["resident"], ".3f"),
            ">= 0.98",
        )
    )


# ---------------------------------------------------------------- the pass's host time


def part_host(a: argparse.Namespace, det: Det, res: dict, summary: list) -> None:
    """Host ms a batch of the dense pass's work, by batches a pass (see the docstring)."""
    from packer.examples import train_detection as TD
    from packer.loading.dense_batched import drawn_group, group_on_device, plan_of
    from packer.loading.dense_pass import _pixels, dense_setup
    from packer.loading.order import batch_seed

    p = packer.load(det.packs["det_train"])
    dense = DenseConfig(TD.pack_pipeline(det.args), "padded", masks=det.masks)
    setup = dense_setup(p, None, None, None, dense)[0]
    dev, b = det.device, a.batch
    cuda = dev.type == "cuda"
    stream = torch.cuda.Stream(dev) if cuda else None
    plan = plan_of(setup.op)
    ms: dict[int, list[float]] = {k: [] for k in a.host_groups}
    kept: dict[int, list[float]] = {k: [] for k in a.host_groups}  # host="process"'s thread
    first = 0
    for _ in range(2):  # the groups alternated, twice
        for k in a.host_groups:
            gens = [torch.Generator() for _ in range(k)]
            for rep in range(a.host_passes + 1):
                idx = np.arange(first * b, (first + k) * b) % len(p)
                t0 = time.perf_counter()
                records = setup.columns.read(idx)
                items = [_pixels(r, setup) for r in records]
                with torch.cuda.stream(stream) if cuda else contextlib.nullcontext():
                    t1 = time.perf_counter()
                    images = list(p.decode(idx, dev))
                    t2 = time.perf_counter()
                    for j, g in enumerate(gens):
                        g.manual_seed(batch_seed(a.seed, 0, 0, first + j))
                    sizes = [(int(i.shape[-2]), int(i.shape[-1])) for i in images]
                    made = drawn_group(sizes, records, items, setup, [(b, g) for g in gens], plan)
                    t3 = time.perf_counter()
                    group_on_device(images, made, setup, plan)
                t4 = time.perf_counter()
                if rep:  # the first pass of a group size warms it
                    ms[k].append((t4 - t0) / k * 1e3)
                    # with host="process" the thread reads and decodes, then launches
                    kept[k].append(((t2 - t1) + (t4 - t3)) / k * 1e3)
                first += k
                if cuda and rep % 4 == 3:
                    sync(dev)  # the device keeps up; the host's time is what is measured
            sync(dev)
    m = {k: med(v) for k, v in ms.items()}
    mk = {k: med(v) for k, v in kept.items()}
    res["host"] = {
        "ms_a_batch": m,
        "each": ms,
        "thread_ms_a_batch_with_a_host_process": mk,
        "batch": b,
        "passes": a.host_passes,
    }
    print(f"\nThe dense pass's host ms a batch (batch {b}, {a.host_passes} passes x 2 a size):")
    print(
        "| batches a pass | host ms a batch | / one a pass | the thread's with "
        "host='process' (decode call, kernels) |\n| --- | --- | --- | --- |"
    )
    for k, v in m.items():
        print(f"| {k} | {v:.2f} | {ratio(v, m.get(1, float('nan')), '.2f')} | {mk[k]:.2f} |")
    if 1 in m and 4 in m:
        summary.append(
            (
                "f. the dense pass's host ms a batch, 4 batches a pass / 1",
                f"{m[4]:.2f} / {m[1]:.2f} ms",
                ratio(m[4], m[1], ".2f"),
                "report",
            )
        )
        summary.append(
            (
                "f. the same, the producer thread's share with host='process' / all of it",
                f"{mk[4]:.2f} / {m[4]:.2f} ms",
                ratio(mk[4], m[4], ".2f"),
                "report",
            )
        )


# ---------------------------------------------------------------- the loaders alone


def part_loader(a: argparse.Namespace, det: Det, res: dict, summary: list) -> None:
    """The loaders alone: each batch as the detection model takes it, on the device."""
    from packer.examples import train_detection as TD

    dev = det.device
    nothing = lambda x, y: None  # noqa: E731
    failed: dict[str, str] = {}
    ds, _, _ = TD.reference_dataset(
        a.work / "data" / "coco",
        "train2017",
        TD.reference_pipeline(det.args, True),
        False,
        det.cat_ids,
    )
    dl = reference_loader(ds, a.loader_batch, a)
    rit = endless(lambda: TD.reference_batches(dl, dev))
    ref_way = (nothing, lambda: next(rit), lambda: drain(rit, a.workers * 2 if a.workers else 0))
    # the reference's workers forked first, before the new pack loaders' threads start
    warm({"reference data path": ref_way}, 1, failed)
    ways: dict[str, Any] = {}
    loaders = []
    for store in a.loader_stores.split(","):
        ld = det._pack_loader(
            a.loader_batch, det.packs["det_train" if store == "jpeg" else "det_raw"]
        )
        loaders.append(ld)
        it = endless(lambda ld=ld: TD.pack_batches(ld, False))
        ways[f"imgpack, {store} pack"] = (nothing, lambda it=it: next(it), None)
    ways["reference data path"] = ref_way
    warm({k: v for k, v in ways.items() if k not in failed}, a.warm, failed)
    rates = rounds(ways, a.rounds, a.loader_steps, a.settle, dev, failed)
    m = {k: med(v) for k, v in rates.items()}
    ref = m["reference data path"]
    res["loader"] = {
        "img_s": m,
        "rounds": rates,
        "failed": failed,
        "batch": a.loader_batch,
        "lsj": a.lsj,
        "workers": a.workers,
        "stats": [str(ld.stats()) for ld in loaders],
    }
    print(
        f"\nLoaders alone: LSJ {a.lsj}, batch {a.loader_batch}, {a.max_side} max side, "
        f"{a.loader_steps} batches x {a.rounds} rounds (median img/s)"
    )
    print("| loader | img/s | / reference |\n| --- | --- | --- |")
    for k, v in m.items():
        print(f"| {k} | {v:,.1f} | {ratio(v, ref, '.2f', 'x')} |")
    for k, e in failed.items():
        print(f"| {k} | FAILED: {e[:100]} | - |")
    for k, v in m.items():
        if k != "reference data path":
            summary.append(
                (
                    f"d. loader alone ({k.split(', ')[1]}), LSJ {a.lsj}, batch "
                    f"{a.loader_batch} / reference on {a.workers} workers",
                    f"{v:,.1f} / {ref:,.1f} img/s",
                    ratio(v, ref, ".2f", "x"),
                    ">= 10x",
                )
            )
    for ld in loaders:
        ld.close()


# ---------------------------------------------------------------- the same weights, both paths


class Started:
    """A DataLoader's one pass, its iterator (and workers) started now."""

    def __init__(self, dl: Any) -> None:
        self.it = iter(dl)

    def __iter__(self) -> Iterator[Any]:
        return self.it


def train_more(obj: Any, steps: int, seconds: float) -> None:
    """Up to ``steps`` more pack-fed steps, stopping after ``seconds``."""
    obj.setup()
    t0 = time.perf_counter()
    for i in range(steps):
        obj.step(*obj.pack_feed())
        if i % 10 == 9:
            sync(obj.device)
            if time.perf_counter() - t0 > seconds:
                break
    sync(obj.device)


def part_map(a: argparse.Namespace, det: Det, seg: Seg, res: dict, summary: list) -> None:
    from packer.examples import train_detection as TD
    from packer.examples import train_segmentation as TS

    dev, out = det.device, {}
    t0 = time.perf_counter()
    # the reference's val loaders, their workers forked now (the pack loaders' threads
    # wait on full queues), read after the training below
    ds, gt, ids = TD.reference_dataset(
        a.work / "data" / "coco", "val2017", TD.reference_pipeline(None, False), False, det.cat_ids
    )
    assert ids == det.cat_ids, (ids, det.cat_ids)
    dl = Started(
        torch.utils.data.DataLoader(ds, a.val_batch, num_workers=a.workers, collate_fn=TD._collate)
    )
    sds = TS.SegmentationFolder(
        a.work / "data" / "seg" / "val", TS.reference_pipeline(seg.args, False)
    )
    sdl = Started(torch.utils.data.DataLoader(sds, 1, num_workers=a.workers))
    train_more(det, a.map_steps, a.map_seconds)
    # the same weights through both paths, the recipe's val loaders, in order
    val = TD.PackData(det.packs["det_val"], "val")
    dense = DenseConfig(targets="padded", masks=det.masks)
    vl = packer.PackLoader(
        val.pack, a.val_batch, device=dev, shuffle=False, num_threads=a.threads, dense=dense
    )
    dets_p, seen_p = TD.predictions(
        det.model, TD.pack_batches(vl, False), det.cat_ids, a.amp, dev, False
    )
    map_p = TD.coco_map(val.coco(), dets_p, seen_p, False)["bbox"]
    # the same pack decoded on the CPU (libjpeg-turbo, as the reference's Pillow): what
    # of the difference is the GPU decoder's pixels, and what the data path's
    vc = packer.PackLoader(
        val.pack, a.val_batch, device="cpu", shuffle=False, num_threads=a.threads, dense=dense
    )
    on_dev = (
        ([im.to(dev, non_blocking=True) for im in ims], ts)
        for ims, ts in TD.pack_batches(vc, False)
    )
    dets_c, seen_c = TD.predictions(det.model, on_dev, det.cat_ids, a.amp, dev, False)
    map_c = TD.coco_map(val.coco(), dets_c, seen_c, False)["bbox"]
    vc.close()
    dets_r, seen_r = TD.predictions(
        det.model, TD.reference_batches(dl, dev), det.cat_ids, a.amp, dev, False
    )
    map_r = TD.coco_map(gt, dets_r, seen_r, False)["bbox"]
    out["map"] = {
        "pack": map_p,
        "pack_cpu_decode": map_c,
        "reference": map_r,
        # the model's detections through the CPU-decoded pack equal the reference's, one
        # by one: the same pixels, sizes and order in (what mAP cannot show on its own)
        "cpu_decode_same_detections": dets_c == dets_r,
        "detections": [len(dets_p), len(dets_r)],
        "images": [len(seen_p), len(seen_r)],
        "trained_steps": det.step.calls,
        "loss": det.loss(),
    }
    vl.close()
    # mean IoU of the DeepLabV3 weights
    train_more(seg, a.miou_steps, a.miou_seconds)
    sv = TS.PackData(seg.packs["seg_val"], "val")
    vl = packer.PackLoader(
        sv.pack,
        1,
        device=dev,
        shuffle=False,
        num_threads=a.threads,
        dense_transform=TS.pack_pipeline(seg.args, False),
    )
    cm_p = TS.evaluate(seg.model, TS.pack_batches(vl), seg.num_classes, a.amp, dev)
    cm_r = TS.evaluate(seg.model, TS.reference_batches(sdl, dev), seg.num_classes, a.amp, dev)
    miou = [float(cm.compute()[2].nanmean()) * 100 for cm in (cm_p, cm_r)]
    pixels = [int(cm.mat.sum()) for cm in (cm_p, cm_r)]
    out["miou"] = {
        "pack": miou[0],
        "reference": miou[1],
        "pixels": pixels,
        "trained_steps": seg.step.calls,
        "loss": seg.loss(),
    }
    vl.close()
    out["seconds"] = round(time.perf_counter() - t0, 1)
    res["map"] = out
    weights = (
        f"init of seed {a.seed}, then {det.step.calls} / {seg.step.calls} SGD steps "
        "in this run (the rounds' and the extra pack-fed ones)"
    )
    out["weights"] = weights
    print(f"\nThe same weights through both paths ({weights})")
    print("| metric | pack | reference | difference (points) |\n| --- | --- | --- | --- |")
    print(
        f"| bbox mAP@[.5:.95], the recipe's val path (the pack decoded on the CPU, its "
        f"default) | {map_c:.3f} | {map_r:.3f} | {map_c - map_r:+.3f} |"
    )
    print(
        f"| bbox mAP, the pack decoded on the GPU (--val-decode device) | {map_p:.3f} "
        f"| {map_r:.3f} | {map_p - map_r:+.3f} |"
    )
    print(f"| mean IoU | {miou[0]:.3f} | {miou[1]:.3f} | {miou[0] - miou[1]:+.3f} |")
    summary.append(
        (
            "e. bbox mAP, same weights, the recipe's val path (CPU decode) vs reference",
            f"{map_c:.3f} / {map_r:.3f}",
            f"{map_c - map_r:+.3f} points",
            "within 0.1",
        )
    )
    summary.append(
        (
            "e. bbox mAP, same weights, the pack decoded on the GPU vs reference",
            f"{map_p:.3f} / {map_r:.3f}",
            f"{map_p - map_r:+.3f} points",
            "report (--val-decode device)",
        )
    )
    summary.append(
        (
            "e. mean IoU, same weights, pack vs reference data path",
            f"{miou[0]:.3f} / {miou[1]:.3f}",
            f"{miou[0] - miou[1]:+.3f} points",
            "within 0.1",
        )
    )


# ---------------------------------------------------------------- main


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    procs = len(os.sched_getaffinity(0))
    ap = argparse.ArgumentParser(
        prog="python3 -m benchmarks.dense",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--parts", default=",".join(PARTS), help=f"any of {', '.join(PARTS)}")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--work", type=Path, default=Path("/tmp/imgpack-dense"))
    ap.add_argument("--out", type=Path, default=None, help="JSON folder (default $OUT, ./out)")
    ap.add_argument("--images", type=int, default=3000, help="train images (COCO set)")
    ap.add_argument("--val-images", type=int, default=250, help="val images (mAP, mean IoU)")
    ap.add_argument("--seg-images", type=int, default=1000, help="train images with masks")
    ap.add_argument("--max-side", type=int, default=640)
    ap.add_argument("--lsj", type=int, default=1024, help="LSJ's size (the recipe's --lsj-size)")
    ap.add_argument(
        "--min-size", type=int, default=0, help="the detector's min_size (0: the model's own, 800)"
    )
    ap.add_argument("--det-model", default="fasterrcnn_resnet50_fpn")
    ap.add_argument("--seg-model", default="deeplabv3_resnet50")
    ap.add_argument("--batch", type=int, default=8, help="detection batch")
    ap.add_argument("--seg-batch", type=int, default=16)
    ap.add_argument("--crop", type=int, default=512)
    ap.add_argument("--base-size", type=int, default=0, help="0: the crop + 8 (520 for 512)")
    ap.add_argument("--loader-batch", type=int, default=32)
    ap.add_argument("--loader-steps", type=int, default=30, help="batches per loader round")
    ap.add_argument("--loader-stores", default="jpeg,raw")
    ap.add_argument("--val-batch", type=int, default=1, help="1: the reference's")
    ap.add_argument("--steps", type=int, default=30, help="timed model steps per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warm", type=int, default=5, help="untimed steps per way first")
    ap.add_argument(
        "--settle", type=int, default=6, help="untimed steps per way at each round's start"
    )
    ap.add_argument("--resident", type=int, default=16, help="resident batches cycled")
    ap.add_argument("--map-steps", type=int, default=250, help="more detection steps before mAP")
    ap.add_argument("--miou-steps", type=int, default=150, help="more DeepLabV3 steps before mIoU")
    ap.add_argument("--map-seconds", type=float, default=60, help="at most, for --map-steps")
    ap.add_argument("--miou-seconds", type=float, default=30, help="at most, for --miou-steps")
    ap.add_argument("--warmup", type=int, default=100, help="the detector's LR warm-up steps")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--seg-lr", type=float, default=0.01)
    ap.add_argument("--workers", type=int, default=procs, help="DataLoader workers")
    ap.add_argument("--threads", type=int, default=None, help="PackLoader num_threads")
    ap.add_argument("--channels-last", choices=["auto", "on", "off"], default="auto")
    ap.add_argument("--no-amp", dest="amp", action="store_false", help="no bf16 autocast")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--switch",
        default="",
        help="frcnn: also the pack and the resident step at these sys.setswitchinterval "
        "values (s, comma-separated)",
    )
    ap.add_argument(
        "--frcnn-beside",
        action="store_true",
        help="frcnn: also the resident step with the pack's loader working beside it "
        "(a batch taken and dropped each step)",
    )
    ap.add_argument(
        "--frcnn-sync",
        action="store_true",
        help="frcnn: also the resident step and the pack with the host waiting for the "
        "device as each batch is taken (CUDA)",
    )
    ap.add_argument(
        "--same-start",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="frcnn: every timing starts from the weights the warm-up left (default on)",
    )
    ap.add_argument(
        "--frcnn-threads",
        default="",
        help="frcnn: also the pack through loaders of these num_threads (comma-separated)",
    )
    ap.add_argument(
        "--frcnn-groups",
        default="",
        help="frcnn: also the pack through loaders making these many batches a pass "
        "(DenseConfig.group; comma-separated)",
    )
    ap.add_argument(
        "--frcnn-thread",
        action="store_true",
        help="frcnn: also the pack with each group's host half made on the loader's "
        "producer thread (DenseConfig(host='thread'); by default a worker process)",
    )
    ap.add_argument(
        "--seg-process",
        action="store_true",
        help="deeplab: also the pack with each batch's host half made in a worker process "
        "(DenseConfig(host='process'); a semantic pack's default is the thread)",
    )
    ap.add_argument(
        "--seg-groups",
        default="",
        help="deeplab: also the pack through loaders making these many batches a pass "
        "(DenseConfig.group; comma-separated)",
    )
    ap.add_argument(
        "--host-groups", default="1,2,4,8", help="host: batches a pass (comma-separated)"
    )
    ap.add_argument("--host-passes", type=int, default=12, help="host: passes a size, each time")
    ap.add_argument(
        "--time-limit", type=float, default=0, help="parts not started by then are skipped (s)"
    )
    ap.add_argument(
        "--toy",
        action="store_true",
        help="small models for a smoke run: fasterrcnn_mobilenet_v3_large_320_fpn, "
        "deeplabv3_mobilenet_v3_large",
    )
    a = ap.parse_args(argv)
    parts = set(a.parts.split(","))
    if not parts <= set(PARTS):
        ap.error(f"--parts: {', '.join(sorted(parts - set(PARTS)))} not one of {', '.join(PARTS)}")
    a.parts = parts
    a.switch = [float(x) for x in a.switch.split(",") if x]
    a.frcnn_threads = [int(x) for x in a.frcnn_threads.split(",") if x]
    a.frcnn_groups = [int(x) for x in a.frcnn_groups.split(",") if x]
    a.host_groups = [int(x) for x in a.host_groups.split(",") if x]
    a.seg_groups = [int(x) for x in a.seg_groups.split(",") if x]
    if a.toy:
        a.det_model, a.seg_model = (
            "fasterrcnn_mobilenet_v3_large_320_fpn",
            "deeplabv3_mobilenet_v3_large",
        )
    if a.device == "cpu":
        a.amp = False
    a.base_size = a.base_size or a.crop + 8
    a.work = a.work.resolve()
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    from ._common import dump

    device = resolve_device(a.device)
    if a.out is not None:
        os.environ["OUT"] = str(a.out)
    out = Path(os.environ.get("OUT", ROOT / "out"))
    procs = len(os.sched_getaffinity(0))
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    shm = shutil.disk_usage("/dev/shm") if Path("/dev/shm").exists() else None
    res: dict[str, Any] = {
        "machine": machine(),
        "args": {k: str(v) for k, v in vars(a).items()},
        "procs": procs,
        "shm_free_gb": shm and round(shm.free / 2**30, 1),
    }
    summary: list[tuple[str, str, str, str]] = []
    errors: dict[str, str] = {}
    t_all = time.perf_counter()
    res["data"] = make_data(a, procs)
    print(f"data: {res['data']}", flush=True)
    packs = build_packs(a, procs, a.parts)
    det = Det(a, packs, device) if a.parts & {"frcnn", "ref", "loader", "map", "host"} else None
    seg = Seg(a, packs, device) if a.parts & {"deeplab", "map"} else None

    def part(name: str, fn: Callable[[], None], key: str | None = None) -> None:
        """One part; its failure, or that of one of its ways (``res[key]["failed"]``), is
        recorded (and printed) and the others still run."""
        t0 = time.perf_counter()
        print(f"\n== {name} (at {t0 - t_all:.0f} s)", flush=True)
        if a.time_limit and t0 - t_all > a.time_limit:
            errors[name] = f"not run: {t0 - t_all:.0f} s > --time-limit {a.time_limit:.0f} s"
            summary.append((f"{name}: SKIPPED", errors[name], "-", "-"))
            res["errors"] = errors
            return
        try:
            fn()
        except Exception as e:  # one part's failure must not lose the others
            errors[name] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
            summary.append((f"{name}: FAILED", errors[name][:120], "-", "-"))
        for way, e in res.get(key or name, {}).get("failed", {}).items():
            errors[f"{name}: {way}"] = e
            summary.append((f"{name}: {way} FAILED", e[:120], "-", "-"))
        res.setdefault("seconds", {})[name] = round(time.perf_counter() - t0, 1)
        res["errors"] = errors
        dump(res, JSON)

    if a.parts & {"frcnn", "ref"}:
        part(
            "frcnn" if "frcnn" in a.parts else "ref",
            lambda: part_frcnn(a, det, "ref" in a.parts, res, summary),
            "frcnn",
        )
    if "deeplab" in a.parts:
        part("deeplab", lambda: part_deeplab(a, seg, res, summary))
    if "loader" in a.parts:
        part("loader", lambda: part_loader(a, det, res, summary))
    if "map" in a.parts:
        part("map", lambda: part_map(a, det, seg, res, summary))
    if "host" in a.parts:
        part("host", lambda: part_host(a, det, res, summary))
    for obj in (det, seg):
        if obj is not None:
            obj.loader.close()
    res.setdefault("seconds", {})["all"] = round(time.perf_counter() - t_all, 1)
    gpu = res["machine"].get("gpu", device)
    print(
        f"\nSummary ({gpu}, {procs} cores; every ratio against a baseline of this run; "
        f"{res['seconds']['all']:.0f} s)"
    )
    print("| what | measured | ratio | target |\n| --- | --- | --- | --- |")
    for row in summary:
        print("| " + " | ".join(row) + " |")
    res["summary"] = summary
    dump(res, JSON)
    print(f"wrote {out / JSON}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
