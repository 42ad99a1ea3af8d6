"""Detection and segmentation packs through :class:`packer.loading.loader.PackLoader`:
``(images, targets)`` on the device (issue 46, items 3 and 4, the loader's side).

A pack is dense when :func:`dense_columns` finds its targets (through
``packer.pack.dense.dense_of``, the reading contract; a build without that module, or
a pack without targets, is a plain pack). Per batch, the
:class:`packer.loading.dense_producer.DensePass` strategy reads the images (a raw
pack's rows gathered by the threads, or a JPEG pack's images decoded at their stored
size, in one batched call) and the targets of the same rows
(``DenseColumns.read``), moves them to the device, and runs the dense transform
(:mod:`packer.augment.dense` ops: a :class:`packer.augment.dense.Compose` of them) on
each image with all its fields at once, drawing from a generator seeded per batch by
:func:`packer.loading.order.batch_seed` (so a resumed run redraws the same). Boxes,
labels, keypoints and extras stay on the CPU through the ops (a few floats: which boxes
are dropped is then known to the host without waiting for the device) and move to the
device once a batch; instance masks are decoded on the device from their run lengths.
The host waits for the device nowhere per image. A transform with a batched path
(flips, LSJ, resizes, pads: :mod:`packer.loading.dense_batched`) runs over the whole
batch at once instead, with the same draws and outputs, and several batches through
one pass where ``DenseConfig.group`` says (each the batch it would be alone). Then:

* ``targets="dicts"`` (detection, the default): a list of one dict per image as
  torchvision's detection models and references take them
  (:func:`packer.augment.dense_batch.detection_target`, plus ``masks`` / ``keypoints``
  where the pack has them);
* ``targets="padded"``: one dict of padded tensors with counts
  (:func:`packer.augment.dense_batch.collate_padded`), with ``image_ids`` int64 [B];
  ``image_sizes``, ``counts`` and ``image_ids`` stay on the host (cutting the batch
  into images by them makes the consumer wait for nothing), the rest on the device;
* a semantic pack: the masks, uint8 [B, H, W] (255, the ignore value, in padding).

Images are uint8 [B, 3, H, W]: stacked when every transformed image has one size,
else padded right and bottom to the largest, rounded up to ``size_divisible`` (32), and
each image's masks with it (boxes and keypoints do not move).
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as nnf

from ..errors import PackFormatError, UsageError
from .dense_batched import decode_flat, plan_of, run_batched, upload_flat

TARGET_MODES = ("dicts", "padded")


@dataclass(frozen=True)
class DenseConfig:
    """How a dense pack's batches are made (``PackLoader(dense=DenseConfig(...))``).

    ``transform``: a :mod:`packer.augment.dense` op (a ``Compose`` of them) run per
    image on the image and all its targets, or None; ``targets``: "dicts" (default) or
    "padded" for detection packs (a semantic pack yields its masks [B, H, W]);
    ``size_divisible``: images of different sizes in a batch are padded to a multiple of
    it; ``fill``: the images' padding value; ``semantic_fill``: the semantic masks'
    (the ignore value); ``masks``: False leaves a detection pack's instance masks unread
    (not decoded, copied or transformed, absent from the targets), as torchvision's
    reference leaves them out of a box model's targets; ``group``: batches made together
    (decoded in one call, transformed in one pass, then handed out one by one: the same
    batches, draws, targets and masks as one at a time; the images the same on the CPU,
    and on CUDA within the rounding of one product, its half-precision products taking
    the group's padded shape), None for as many as make :data:`GROUP_IMAGES` images (at
    most the loader's ``prefetch``) where the transform has a batched path and the pack
    has boxes (a semantic pack: one a pass). A pass's host work is mostly a fixed count
    of torch calls, and
    the producer thread holds the GIL for them beside a training step that wants it:
    grouping shares that work (docs/PERFORMANCE.md, "Detection and segmentation fed by
    packs"); ``host``: "process" makes each group's host half (records, draws, geometry,
    host targets) in a worker process (:mod:`packer.loading.dense_host`), so the
    training process's GIL holds only the decode call and the group's kernels, where
    the transform has a batched path, the pack is one local pack and the platform forks
    (else the thread makes it); "thread" on the producer thread; None (default):
    "process" for a pack with boxes (a detector's step is mostly Python, and gives the
    producer's host work back one for one), "thread" for a semantic pack (its model's
    step is device-bound)."""

    transform: Any = None
    targets: str = "dicts"
    size_divisible: int = 32
    fill: int = 0
    semantic_fill: int = 255
    masks: bool = True
    group: int | None = None
    host: str | None = None
    # how long the producer waits for a worker's answer before it stops the worker and
    # makes the rest of the pass itself (private: a test's hung worker)
    _host_wait: float = field(default=60.0, repr=False)


HOSTS = ("thread", "process")
# the images a pass makes when DenseConfig.group is None
GROUP_IMAGES = 32


def _dense_module() -> Any:
    """``packer.pack.dense`` (the reading contract), or None where this build lacks it."""
    mod = sys.modules.get("packer.pack.dense")
    if mod is not None:
        return mod
    try:
        from ..pack import dense as mod  # type: ignore[attr-defined,no-redef]
    except ImportError:
        return None
    return mod


def dense_columns(pack: Any) -> Any:
    """The pack's :class:`DenseColumns` (``packer.pack.dense.dense_of``), or None for a
    pack without targets, a list of packs, or a build without dense packs."""
    if pack is None or isinstance(pack, (list, tuple)):
        return None
    mod = _dense_module()
    if mod is None:
        return None
    return mod.dense_of(pack)


def decode_masks(masks_rle: Any, size: Any) -> np.ndarray:
    """``packer.pack.dense.decode_masks``: uint8 [M, h, w]."""
    return _dense_module().decode_masks(masks_rle, size)


def _as_op(transform: Any, where: str) -> Any:
    """A dense op, or UsageError naming what it is (for a torchvision Compose or an
    ``nn.Sequential``: its first op that is no dense op)."""
    from ..augment.dense_compose import DenseOp, as_dense_op

    if isinstance(transform, DenseOp):
        return transform
    inner = getattr(transform, "transforms", None)
    if inner is None and isinstance(transform, torch.nn.Sequential):
        inner = list(transform)
    if isinstance(inner, (list, tuple)):
        for i, t in enumerate(inner):
            if not isinstance(t, DenseOp):
                as_dense_op(t, f"{where} (item {i} of {type(transform).__name__})")
    return as_dense_op(transform, where)


def _with_flip_maps(op: Any, categories: Any) -> Any:
    """``op`` with each RandomHorizontalFlip that has no ``flip_map`` given the pack's
    category flip maps ({label: (left, right) pairs}), so keypoints swap sides."""
    from ..augment.dense import Compose, RandomHorizontalFlip

    maps = {i: tuple(m) for i, m in enumerate(getattr(categories, "flip_map", ())) if m}
    if not maps:
        return op
    if isinstance(op, RandomHorizontalFlip) and op.flip_map is None:
        op = copy.copy(op)
        op.flip_map = maps
        return op
    if isinstance(op, Compose):
        out = copy.copy(op)
        out.ops = [_with_flip_maps(o, categories) for o in op.ops]
        return out
    return op


@dataclass(frozen=True)
class DenseSetup:
    """A dense loader's fixed parts: the pack's columns, the op, the targets' form."""

    columns: Any
    op: Any
    targets: str
    size_divisible: int
    fill: int
    semantic_fill: int
    masks: bool = True
    group: int | None = None
    host: str | None = None
    host_wait: float = 60.0

    @property
    def semantic(self) -> bool:
        return bool(self.columns.semantic)


def dense_setup(
    pack: Any,
    transform: Any,
    dense_transform: Any,
    targets: Any,
    dense: Any,
) -> tuple[DenseSetup | None, Any]:
    """``(setup, transform)``: the dense setup of ``pack`` (None for a plain pack) and
    the batch ``transform`` left to the loader (None when the dense pass took it).
    UsageError for dense arguments on a plain pack, a torchvision transform or a
    batch-only ``packer.transforms`` op where a dense op goes (naming it), and a
    ``targets`` that names no mode."""
    given = dense_transform is not None or targets is not None
    if dense is not None and not isinstance(dense, DenseConfig):
        raise UsageError(f"dense must be a DenseConfig, not {type(dense).__name__}")
    if dense is not None and given:
        raise UsageError(
            "pass the dense transform and targets either in dense=DenseConfig(...) or as "
            "dense_transform= / targets=, not both"
        )
    cfg = dense or DenseConfig(
        transform=dense_transform, targets="dicts" if targets is None else targets
    )
    if isinstance(pack, (list, tuple)):
        if any(dense_columns(p) is not None for p in pack):
            raise UsageError(
                "a pack with targets streams alone: not in a list of packs or with weights="
            )
        columns = None
    else:
        columns = dense_columns(pack)
    if columns is None:
        if dense is not None or given:
            raise UsageError(
                "dense=, dense_transform= and targets= are for packs with boxes, masks or "
                "keypoints (built from annotations); this pack has none"
            )
        return None, transform
    if not isinstance(cfg.targets, str) or cfg.targets not in TARGET_MODES:
        raise UsageError(f"targets must be 'dicts' or 'padded', not {cfg.targets!r}")
    d = cfg.size_divisible
    if isinstance(d, bool) or not isinstance(d, int) or d < 1:
        raise UsageError(f"DenseConfig.size_divisible must be a positive int, not {d!r}")
    op = cfg.transform
    if op is not None and transform is not None:
        raise UsageError(
            "a dense pack takes one transform: pass it as dense_transform= (or transform=)"
        )
    if op is None:
        op = transform
    if op is not None:
        where = "dense_transform" if cfg.transform is not None else "transform"
        op = _with_flip_maps(_as_op(op, where), columns.categories)
    if not isinstance(cfg.masks, bool):
        raise UsageError(f"DenseConfig.masks must be True or False, not {cfg.masks!r}")
    g = cfg.group
    if g is not None and (isinstance(g, bool) or not isinstance(g, int) or g < 1):
        raise UsageError(f"DenseConfig.group must be a positive int or None, not {g!r}")
    if cfg.host is not None and (not isinstance(cfg.host, str) or cfg.host not in HOSTS):
        raise UsageError(f"DenseConfig.host must be 'thread', 'process' or None, not {cfg.host!r}")
    w = cfg._host_wait
    if isinstance(w, bool) or not isinstance(w, (int, float)) or not w > 0:
        raise UsageError(f"DenseConfig._host_wait must be a positive number of seconds, not {w!r}")
    setup = DenseSetup(
        columns, op, cfg.targets, d, int(cfg.fill), int(cfg.semantic_fill), cfg.masks, g,
        cfg.host, float(w),
    )  # fmt: skip
    return setup, None


def refuse_dense(
    setup: DenseSetup | None,
    pack: Any,
    kind: Any,
    resident: bool,
    gather: str,
    image_size: Any,
    decode: Any = "auto",
) -> None:
    """Refuse what a dense loader does not combine with."""
    if setup is None:
        return
    if not (isinstance(decode, str) and decode == "auto"):
        raise UsageError(
            "decode= is for plain packs; a dense JPEG pack's images are decoded in "
            "batches on the loader's device"
        )
    if kind.decoded and not callable(getattr(pack, "decode", None)):
        raise UsageError(
            "a JPEG pack set with targets does not stream yet; stream its shards' packs "
            "one by one, or build it with BuildConfig.store='raw'"
        )
    if resident:
        raise UsageError("resident=True is for plain raw packs; a dense pack streams its targets")
    if gather != "cpu":
        raise UsageError("gather='device' is for plain raw packs; use gather='cpu' (the default)")
    if image_size is not None:
        raise UsageError(
            "image_size is for plain JPEG packs; a dense pack's images keep their stored "
            "sizes (resize them with packer.augment.dense.Resize in dense_transform=)"
        )


class StoredSize:
    """Stands for a JPEG crop where a dense pack streams images at their stored sizes:
    no fixed size (``size`` (0, 0) in the order's digest), no random crop."""

    size = (0, 0)
    random = False


# ---------------------------------------------------------------- one batch


def _host(a: Any, dtype: torch.dtype) -> torch.Tensor:
    return torch.as_tensor(np.ascontiguousarray(a)).to(dtype)


def mask_runs(masks_rle: Any, size: Any) -> list[np.ndarray]:
    """``packer.pack.dense.mask_runs``: each instance mask's checked run lengths."""
    return _dense_module().mask_runs(masks_rle, size)


def _pixels(rec: dict[str, Any], setup: DenseSetup) -> Any:
    """The record's masks: the semantic mask uint8 [H, W], the instance masks as
    ``(runs, (h, w))`` (:func:`mask_runs`, decoded on the device by
    :func:`upload_pixels`), or None (none, or ``DenseConfig.masks`` False)."""
    if setup.semantic:
        return np.asarray(rec["semantic"], dtype=np.uint8)
    if "masks_rle" in rec and setup.masks:
        size = tuple(int(v) for v in rec["size"])
        try:
            return mask_runs(rec["masks_rle"], size), size
        except PackFormatError as e:  # named by its image (the source's id, else index)
            raise PackFormatError(f"image {rec.get('image_id', '?')}: {e}") from None
    return None


def _decode_runs(items: list[Any], device: torch.device) -> list[Any]:
    """:func:`decode_flat`, each image's masks uint8 [M, h, w] (transposed to rows).
    Equal to ``pycocotools.mask.decode``."""
    flat, bases = decode_flat(items, device)
    out = []
    for it, offset in zip(items, bases):
        if it is None:
            out.append(None)
            continue
        m, (h, w) = len(it[0]), it[1]
        part = flat[offset : offset + m * h * w].view(m, w, h)
        out.append(part.transpose(1, 2).contiguous())
    return out


def upload_pixels(arrays: list[Any], device: torch.device) -> list[Any]:
    """The batch's masks on ``device`` in one copy (:func:`upload_flat`), each a view of
    the result. Instance masks (``(runs, size)`` of :func:`_pixels`) are decoded there."""
    if all(a is None for a in arrays):
        return [None] * len(arrays)
    if any(isinstance(a, tuple) for a in arrays):
        return _decode_runs(arrays, device)
    moved, bases = upload_flat(arrays, device)
    return [
        None if a is None else moved[b : b + a.size].view(a.shape) for a, b in zip(arrays, bases)
    ]


def to_sample(
    image: torch.Tensor, rec: dict[str, Any], setup: DenseSetup, pixels: Any = False
) -> Any:
    """One image (uint8 [3, H, W] on the device) and its record (``DenseColumns.read``)
    as a :class:`packer.augment.dense.Sample`: pixels (image, masks) on the image's
    device, the host targets (boxes, labels, keypoints, iscrowd, area) on the CPU,
    where the ops compute them and decide which boxes to drop without waiting for the
    device; :func:`collate` moves them at the end, in one copy per dtype. ``pixels``:
    the record's masks already on the device (:func:`upload_pixels`), or False to
    upload them here."""
    from ..imaging.resize import ArgumentError

    if pixels is False:
        pixels = upload_pixels([_pixels(rec, setup)], image.device)[0]
    try:
        return _sample(image, rec, pixels, setup.semantic)
    except ArgumentError as e:  # the record disagrees with its image: named by it
        raise ArgumentError(f"image {rec.get('image_id', '?')}: {e}") from None


def _sample(image: torch.Tensor, rec: dict[str, Any], pixels: Any, semantic: bool) -> Any:
    from ..augment.dense_sample import Sample

    if semantic:
        return Sample(image, semantic=pixels)
    keypoints = None
    if "keypoints" in rec:
        keypoints = _host(rec["keypoints"], torch.float32)
    extras = {
        "iscrowd": _host(rec["iscrowd"], torch.int64),
        "area": _host(rec["area"], torch.float32),
    }
    return Sample(
        image,
        boxes=_host(np.reshape(rec["boxes"], (-1, 4)), torch.float32),
        labels=_host(rec["labels"], torch.int64),
        masks=pixels,
        keypoints=keypoints,
        extras=extras,
    )


def _pad(t: torch.Tensor, h: int, w: int, value: float) -> torch.Tensor:
    if t.shape[-2:] == (h, w):
        return t
    return nnf.pad(t, [0, w - t.shape[-1], 0, h - t.shape[-2]], value=float(value))


def with_areas(s: Any, setup: DenseSetup) -> Any:
    """``s`` with ``extras["area"]`` what its target gives: the stored (source's) areas
    when no op ran, else those of the transformed masks (pixel counts) or boxes."""
    from dataclasses import replace

    from ..augment.dense_batch import area

    if setup.semantic or setup.op is None:
        return s
    return replace(s, extras={**s.extras, "area": area(s)})


def collate(samples: list[Any], ids: list[int], setup: DenseSetup) -> tuple[torch.Tensor, Any]:
    """``(images, targets)`` of transformed samples, as the module's docstring says."""
    from ..augment.dense_batch import collate_padded, detection_target, on_device

    samples = [with_areas(s, setup) for s in samples]
    dev = samples[0].image.device
    if not (setup.semantic or setup.targets == "padded"):
        samples = on_device(samples, dev)  # collate_padded pads them on the host first
    sizes = {s.size for s in samples}
    d = 1 if len(sizes) == 1 else setup.size_divisible
    if setup.semantic or setup.targets == "padded":
        out = collate_padded(
            samples, size_divisible=d, fill=setup.fill, semantic_fill=setup.semantic_fill
        )
        images = out.pop("images")
        if setup.semantic:
            return images, out["semantic"]
        out["image_ids"] = torch.tensor(ids, dtype=torch.int64)  # on the host, as the shapes
        return images, out
    h = -(-max(s.size[0] for s in samples) // d) * d
    w = -(-max(s.size[1] for s in samples) // d) * d
    images = torch.stack([_pad(s.image, h, w, setup.fill) for s in samples])
    targets = []
    for s, i in zip(samples, ids):
        t = detection_target(s, i, s.extras["area"])
        if "masks" in t:
            t["masks"] = _pad(t["masks"], h, w, 0)
        targets.append(t)
    return images, targets


def run_batch(
    images: list[torch.Tensor],
    records: list[dict[str, Any]],
    setup: DenseSetup,
    gen: torch.Generator | None,
    batched: bool = True,
) -> tuple[torch.Tensor, Any]:
    """One batch: each image with its record through the op, then :func:`collate`.
    ``gen`` is seeded for the batch by the caller; images draw from it in order. Where
    the op has a batched path (:mod:`packer.loading.dense_batched`) and ``batched``, the
    whole batch goes through it at once, with the same draws and outputs."""
    dev = images[0].device if images else torch.device("cpu")
    items = [_pixels(rec, setup) for rec in records]
    plan = plan_of(setup.op) if images and batched else None
    if plan is not None:  # the whole batch at once (packer.loading.dense_batched)
        out = run_batched(images, records, items, setup, gen, plan)
        if out is not None:
            return out
    pixels = upload_pixels(items, dev)
    samples = [to_sample(img, rec, setup, px) for img, rec, px in zip(images, records, pixels)]
    if setup.op is not None:
        samples = [setup.op(s, gen) for s in samples]
    return collate(samples, [int(r["image_id"]) for r in records], setup)
