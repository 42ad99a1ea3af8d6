"""A build with dense targets (issue 46.1-2): the images an annotation source names
(COCO, YOLO, VOC, image + mask folders: :mod:`packer.sources.annotations`), packed as
any build packs them, and their boxes, labels, ``iscrowd``, area, keypoints, instance
and semantic masks moved exactly as the build's resize moved each image, then stored
beside it (:mod:`packer.pack.dense`).

* :class:`DenseOptions`: ``BuildConfig.dense`` (``imgpack build --targets-from``).
* :func:`plan_dense`: the images to pack, one per annotated image, label -1 (a dense
  pack's classes are its category map, ``BuildConfig.classes`` fixes it as it fixes a
  class map: a category map JSON, a names file, or a pack or set built with one).
* :func:`frame_map`: the affine ``x' = a x + b`` per axis from an annotation's pixels
  to the stored image's, for ``crop``, ``stretch`` and ``pad`` (the arithmetic of
  :func:`packer.imaging.decode._fit`), through the decoded source's size when the
  annotation gives another.
* :func:`write_dense_targets`: finalize's step; boxes scaled, shifted and clipped to the
  stored image, a box left with no width or height dropped (with its labels, masks and
  keypoints) and counted in ``dropped``; keypoints moved, those outside made invisible;
  area scaled by the same factors (and by the kept share of a clipped box); masks
  resized nearest neighbour (instance masks outside the image 0, semantic ones
  ``ignore_index``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError, PackerError, UsageError
from ..sources.annotations.model import (
    DEFAULT_MAX_BOXES,
    DEFAULT_MAX_JSON_BYTES,
    FORMATS,
    CategoryMap,
    ImageTargets,
)

_F = "DenseOptions."


@dataclass(frozen=True)
class DenseOptions:
    """``BuildConfig.dense``: build dense targets from annotations.

    ``format``: ``auto`` (the layout found: :func:`packer.sources.annotations.detect_layout`)
    or one of ``coco``, ``yolo``, ``voc``, ``masks``. ``annotations``: a COCO JSON file
    (else found under ``annotations/``). ``split``: which split to read. ``images`` /
    ``masks``: other image and mask folders. ``strict``: a bad annotation is an error, not
    a skip. ``max_boxes``: the most instances one image may have. ``max_json_bytes``: the
    largest COCO JSON read. ``ignore_index``: the semantic masks' ignore value.
    """

    format: str = "auto"
    annotations: Path | None = None
    split: str | None = None
    images: Path | None = None
    masks: Path | None = None
    strict: bool = False
    max_boxes: int = DEFAULT_MAX_BOXES
    max_json_bytes: int = DEFAULT_MAX_JSON_BYTES
    ignore_index: int = 255

    def __post_init__(self) -> None:
        for name in ("annotations", "images", "masks"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, Path):
                object.__setattr__(self, name, Path(v))

    def validate(self) -> None:
        if self.format != "auto" and self.format not in FORMATS:
            raise UsageError(
                f"{_F}format {self.format!r} is not one of auto, {', '.join(FORMATS)}",
                field=f"{_F}format",
            )
        for name in ("max_boxes", "max_json_bytes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UsageError(
                    f"{_F}{name} must be a positive integer, not {v!r}", field=f"{_F}{name}"
                )
        v = self.ignore_index
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 255:
            raise UsageError(
                f"{_F}ignore_index must be an integer in 0..255, not {v!r}",
                field=f"{_F}ignore_index",
            )

    def annotation_config(self, categories: CategoryMap | None, allow_new: bool) -> Any:
        from ..sources.annotations import AnnotationConfig

        return AnnotationConfig(
            format=self.format,
            annotations=self.annotations,
            split=self.split,
            images=self.images,
            masks=self.masks,
            categories=categories,
            allow_new_categories=allow_new,
            strict=self.strict,
            max_boxes=self.max_boxes,
            max_json_bytes=self.max_json_bytes,
            ignore_index=self.ignore_index,
        )


@dataclass(frozen=True)
class DensePlan:
    """What finalize needs to write a pack's dense columns: each image's targets by its
    path relative to the scan's root, the category map (None: semantic masks without a
    map, derived from their values), where semantic masks are, and the reader's counts."""

    format: str
    by_file: dict[str, ImageTargets]
    categories: CategoryMap | None
    mask_root: Path | None
    ignore_index: int
    source: dict[str, Any] = field(default_factory=dict)
    clipped: int = 0
    outside: int = 0


def _reword(e: PackerError) -> PackerError:
    """An annotation reader's error naming ``AnnotationConfig.x`` fields, reworded to the
    ``DenseOptions.x`` (or ``BuildConfig.x``) a build's caller set."""
    names = {
        "AnnotationConfig.categories": "BuildConfig.classes",
        "AnnotationConfig.allow_new_categories": "BuildConfig.allow_new_classes",
    }
    text = str(e)
    for old, new in names.items():
        text = text.replace(old, new)
    text = text.replace("AnnotationConfig.", _F)
    fld = e.field
    if fld is not None:
        fld = names.get(fld, fld.replace("AnnotationConfig.", _F))
    return type(e)(text, field=fld)


def category_map_of(source: Any) -> CategoryMap:
    """``BuildConfig.classes`` for a dense build: a category map JSON
    (:meth:`CategoryMap.save`'s), a text file of names, or a pack or set built with dense
    targets (its map). InputError otherwise."""
    from ..pack.files import folder_kind, read_manifest
    from ..sources.annotations import load_category_map

    if isinstance(source, str) and "://" in source:
        raise InputError(
            f"BuildConfig.classes {source}: a dense build takes a local category map or pack",
            field="BuildConfig.classes",
        )
    p = Path(source)
    if p.is_dir():
        kind = folder_kind(p)
        if kind == "set":
            from ..pack.index import read_index, read_shard_manifest

            index = read_index(p)
            m = read_shard_manifest(p, index.shards[0], index) if index.shards else None
        elif kind == "pack":
            m = read_manifest(p)
        else:
            m = None
        rec = getattr(m, "dense", None)
        if rec is None:
            raise InputError(
                f"{p}: not a pack or set with dense targets; give BuildConfig.classes a "
                "category map JSON or such a pack",
                field="BuildConfig.classes",
            )
        return rec.categories
    return load_category_map(p)


_STRONG = ("coco", "yolo", "voc")


def detect_dense(src: Any) -> str | None:
    """A folder's annotation format when its layout says so unmistakably (a COCO JSON
    under ``annotations/``, a YOLO ``data.yaml``, VOC's ``Annotations/`` beside
    ``JPEGImages/``), else None: a plain build of such a folder builds its targets."""
    if not isinstance(src, (str, os.PathLike)) or (isinstance(src, str) and "://" in src):
        return None
    root = Path(src)
    if not root.is_dir():
        return None
    ann = root / "annotations"
    if ann.is_dir() and any(
        p.suffix == ".json" and p.name.startswith(("instances_", "person_keypoints_"))
        for p in ann.iterdir()
    ):
        return "coco"
    if (root / "data.yaml").is_file() or (root / "data.yml").is_file():
        return "yolo"
    if (root / "Annotations").is_dir() and (root / "JPEGImages").is_dir():
        return "voc"
    return None


def plan_dense(
    src: Path, config: Any, options: DenseOptions, fixed: CategoryMap | None = None
) -> Any:
    """The labelled images (``_Labels``) of a dense build: one per annotated image, in
    the reader's order (sorted by path), with :class:`DensePlan` attached."""
    from ..sources.annotations import read_annotations
    from ..sources.scan import Entry, Scan
    from .config import _Labels

    options.validate()
    if fixed is None and config.classes is not None:
        fixed = category_map_of(config.classes)
    acfg = options.annotation_config(fixed, config.allow_new_classes)
    try:
        ann = read_annotations(src, acfg)
    except PackerError as e:
        raise _reword(e) from None
    if not ann.images:
        first = ann.skipped[0] if ann.skipped else None
        why = f" (first skipped: {first.file}: {first.reason})" if first else ""
        raise InputError(f"{src}: its {ann.format} annotations name no usable image{why}")
    skips = [{"path": s.file, "reason": s.reason} for s in ann.skipped]
    scan = Scan(
        root=Path(ann.root),
        classes=[],
        entries=[Entry(t.file, -1) for t in ann.images],
        skipped=skips,
    )
    categories = ann.categories
    if categories is None:  # semantic masks without a map: one for every shard of a set
        categories = _mask_categories(ann, options.ignore_index)
    source = {"format": ann.format, "root": str(Path(src).resolve())}
    if options.annotations is not None:
        source["annotations"] = str(Path(options.annotations).resolve())
    dense = DensePlan(
        format=ann.format,
        by_file={t.file: t for t in ann.images},
        categories=categories,
        mask_root=ann.mask_root,
        ignore_index=options.ignore_index,
        source=source,
        clipped=ann.clipped,
        outside=ann.outside,
    )
    class_map = None if config.classes is None else str(Path(config.classes).resolve())
    return _Labels(scan=scan, class_map=class_map, dense=dense)


def _mask_categories(ann: Any, ignore: int) -> CategoryMap:
    """The map of semantic masks read without one: ids 0 to the largest value any mask
    holds (the ignore value aside), each its own index, named ``class_<id>``. Masks that
    cannot be read are left to the build, which refuses them."""
    from ..sources.annotations.masks import read_semantic_mask

    top = 0
    for t in ann.images:
        if t.semantic is None or ann.mask_root is None:
            continue
        try:
            m = read_semantic_mask(Path(ann.mask_root) / t.semantic, t.size)
        except PackerError:
            continue
        vals = m[m != ignore]
        if vals.size:
            top = max(top, int(vals.max()))
    return CategoryMap.build([f"class_{v}" for v in range(top + 1)], list(range(top + 1)))


# ---------------------------------------------------------------- geometry


def frame_map(
    mode: str, ann_hw: tuple[int, int], src_hw: tuple[int, int], out_hw: tuple[int, int]
) -> tuple[float, float, float, float]:
    """``(ax, bx, ay, by)``: a point ``(x, y)`` in pixels of an annotation of size
    ``ann_hw`` lands at ``(ax x + bx, ay y + by)`` in the stored image of ``out_hw``,
    made from a source decoded at ``src_hw`` by the resize ``mode`` (as
    :func:`packer.imaging.decode._fit` fits it)."""
    ah, aw = ann_hw
    h, w = src_hw
    oh, ow = out_hw
    rx, ry = w / aw, h / ah  # annotation pixels -> the decoded source's
    if mode == "stretch":
        sx, sy, ox, oy = ow / w, oh / h, 0.0, 0.0
    elif mode == "crop":  # Pillow's resize of the centred box (x0, y0, x0 + bw, y0 + bh)
        s = max(ow / w, oh / h)
        bw, bh = min(w, ow / s), min(h, oh / s)
        sx, sy = ow / bw, oh / bh
        ox, oy = -(w - bw) / 2 * sx, -(h - bh) / 2 * sy
    elif mode == "pad":
        s = min(ow / w, oh / h)
        nw, nh = max(1, round(w * s)), max(1, round(h * s))
        sx, sy = nw / w, nh / h
        ox, oy = float((ow - nw) // 2), float((oh - nh) // 2)
    else:
        raise UsageError(f"BuildConfig.resize {mode!r} is not crop, stretch or pad")
    return rx * sx, ox, ry * sy, oy


def _nearest_index(n_out: int, a: float, b: float, n_in: int) -> np.ndarray:
    """Source index of each output pixel under ``x' = a x + b`` (nearest neighbour as
    ``torch.nn.functional.interpolate(mode="nearest")``: ``floor((u - b) / a)``); -1
    where it falls outside the source."""
    u = np.arange(n_out, dtype=np.float64)
    src = np.floor((u - b) / a + 1e-9).astype(np.int64)
    src[(src < 0) | (src >= n_in)] = -1
    return src


def remap_nearest(
    masks: np.ndarray, axes: tuple[float, float, float, float], out_hw: tuple[int, int], fill: int
) -> np.ndarray:
    """``masks`` (uint8 [..., h, w]) moved by ``frame_map``'s ``axes`` into ``out_hw``,
    nearest neighbour; pixels with no source get ``fill``."""
    ax, bx, ay, by = axes
    h, w = masks.shape[-2:]
    xi = _nearest_index(out_hw[1], ax, bx, w)
    yi = _nearest_index(out_hw[0], ay, by, h)
    out = masks[..., np.clip(yi, 0, None)[:, None], np.clip(xi, 0, None)[None, :]]
    out = np.ascontiguousarray(out, dtype=np.uint8)
    out[..., yi < 0, :] = fill
    out[..., :, xi < 0] = fill
    return out


def move_targets(
    t: ImageTargets,
    axes: tuple[float, float, float, float],
    out_hw: tuple[int, int],
    num_keypoints: int,
) -> tuple[dict[str, Any], int]:
    """One image's targets moved into the stored image (see the module's doc); returns
    the arrays and how many boxes were dropped."""
    ax, bx, ay, by = axes
    oh, ow = out_hw
    b = t.boxes.astype(np.float64)
    moved = np.stack(
        [b[:, 0] * ax + bx, b[:, 1] * ay + by, b[:, 2] * ax + bx, b[:, 3] * ay + by], 1
    )
    clipped = moved.copy()
    clipped[:, 0::2] = clipped[:, 0::2].clip(0, ow)
    clipped[:, 1::2] = clipped[:, 1::2].clip(0, oh)
    wh = clipped[:, 2:] - clipped[:, :2]
    keep = (wh[:, 0] > 0) & (wh[:, 1] > 0)
    full = (moved[:, 2] - moved[:, 0]) * (moved[:, 3] - moved[:, 1])
    share = np.where(full > 0, wh[:, 0] * wh[:, 1] / np.where(full > 0, full, 1), 0)
    area = t.area.astype(np.float64) * ax * ay * share
    out: dict[str, Any] = {
        "boxes": clipped[keep].astype(np.float32).reshape(-1, 4),
        "labels": t.labels[keep].astype(np.int64),
        "iscrowd": t.iscrowd[keep].astype(np.uint8),
        "area": area[keep].astype(np.float32),
    }
    if num_keypoints:
        kp = np.zeros((t.count, num_keypoints, 3), dtype=np.float64)
        if t.keypoints is not None:
            kp[:, : t.keypoints.shape[1]] = t.keypoints
        kx, ky = kp[..., 0] * ax + bx, kp[..., 1] * ay + by
        vis = kp[..., 2]
        inside = (kx >= 0) & (kx < ow) & (ky >= 0) & (ky < oh)
        kp = np.stack([kx, ky, np.where(inside, vis, 0.0)], -1)
        kp[vis == 0] = 0.0
        out["keypoints"] = kp[keep].astype(np.float32)
    if t.masks is not None:
        from ..pack.dense import encode_masks

        kept = [c for c, k in zip(t.masks, keep) if k]
        if kept:
            dec = replace(t, masks=tuple(kept), boxes=t.boxes[keep], labels=t.labels[keep],
                          iscrowd=t.iscrowd[keep], area=t.area[keep], keypoints=None,
                          difficult=None).decode_masks()  # fmt: skip
            out["masks"] = encode_masks(remap_nearest(dec, axes, out_hw, 0))
        else:
            out["masks"] = []
    return out, int((~keep).sum())


def write_dense_targets(
    plan: Any, config: Any, keep: list[int], sizes: list[list[int]], data_dir: Path
) -> tuple[Any, dict[str, Any]]:
    """Finalize's step: the dense columns of the kept images, written into ``data_dir``
    (beside the assembled images); returns the manifest's record and the result's
    summary. ``sizes``: each planned image's decoded (w, h)."""
    rels = [plan.scan.entries[i].rel for i in keep]
    wh = [(int(sizes[i][0]), int(sizes[i][1])) for i in keep]
    return derive_columns(
        plan.dense, rels, wh, config.kind, config.spec.shape, config.resize, data_dir, data_dir
    )


def derive_columns(
    dense: DensePlan,
    rels: list[str],
    sizes: list[tuple[int, int]],
    kind: Any,
    image_shape: Any,
    resize: str,
    images_dir: Path,
    out_dir: Path,
) -> tuple[Any, dict[str, Any]]:
    """The dense columns of the images ``rels`` (pack order; ``sizes``: each one's decoded
    (w, h)) stored by ``kind`` in ``images_dir``, written into ``out_dir``: the build's
    step, and ``imgpack verify``'s re-derivation from the source annotations."""
    from ..pack.dense import DenseArrays, write_dense
    from ..sources.annotations.masks import read_semantic_mask

    mode, frames = kind.stored_frames(images_dir, len(rels), image_shape, resize)
    cats = dense.categories
    k = cats.num_keypoints if cats is not None else 0
    offsets = [0]
    boxes, labels, iscrowd, area, kps, masks, semantic, ids = [], [], [], [], [], [], [], []
    any_masks = any(t.masks is not None for t in dense.by_file.values())
    any_sem = any(t.semantic is not None for t in dense.by_file.values())
    lut = None
    if any_sem and cats is not None:
        lut = np.full(256, -1, dtype=np.int64)
        lut[dense.ignore_index] = dense.ignore_index
        for idx, cid in enumerate(cats.ids):
            if 0 <= cid <= 255:
                lut[cid] = idx
    dropped = 0
    top = -1
    for j, rel in enumerate(rels):
        t = dense.by_file[rel]
        out_hw = frames[j]
        src_hw = (int(sizes[j][1]), int(sizes[j][0]))
        axes = frame_map(mode, t.size, src_hw, out_hw)
        moved, gone = move_targets(t, axes, out_hw, k)
        dropped += gone
        boxes.append(moved["boxes"])
        labels.append(moved["labels"])
        iscrowd.append(moved["iscrowd"])
        area.append(moved["area"])
        if k:
            kps.append(moved["keypoints"])
        if any_masks:
            ms = moved.get("masks")
            if ms is None:  # an image of the source without masks: empty ones
                ms = encode_masks_empty(len(moved["labels"]), out_hw)
            masks.extend(ms)
        offsets.append(offsets[-1] + len(moved["labels"]))
        ids.append(
            t.image_id if isinstance(t.image_id, int) and not isinstance(t.image_id, bool) else -1
        )
        if any_sem:
            if t.semantic is None or dense.mask_root is None:
                sem = np.full(out_hw, dense.ignore_index, np.uint8)
            else:
                try:
                    raw = read_semantic_mask(
                        dense.mask_root / t.semantic, t.size, cats, dense.ignore_index
                    )
                except PackerError as e:
                    raise InputError(f"{e}; no pack was written") from None
                if lut is not None:
                    raw = lut[raw].astype(np.uint8)
                else:
                    vals = raw[raw != dense.ignore_index]
                    top = max(top, int(vals.max()) if vals.size else -1)
                sem = remap_nearest(raw, axes, out_hw, dense.ignore_index)
            semantic.append(sem)
    if cats is None:  # semantic masks without a map: ids 0..the largest value, as themselves
        n = max(top + 1, 1)
        cats = CategoryMap.build([f"class_{v}" for v in range(n)], list(range(n)))
    cols = DenseArrays(
        offsets=np.asarray(offsets, np.int64),
        frames=np.asarray(frames, np.int64).reshape(-1, 2),
        image_ids=np.asarray(ids, np.int64),
        boxes=np.concatenate(boxes).reshape(-1, 4) if boxes else np.zeros((0, 4), np.float32),
        labels=np.concatenate(labels) if labels else np.zeros(0, np.int64),
        iscrowd=np.concatenate(iscrowd) if iscrowd else np.zeros(0, np.uint8),
        area=np.concatenate(area) if area else np.zeros(0, np.float32),
        keypoints=np.concatenate(kps).reshape(-1, k, 3) if k else None,
        masks=masks if any_masks else None,
        semantic=semantic if any_sem else None,
    )
    record = write_dense(
        out_dir,
        cols,
        cats,
        semantic=kind.semantic_store,
        ignore_index=dense.ignore_index,
        dropped=dropped,
        source=dense.source,
    )
    summary = {
        "format": dense.format,
        "categories": list(cats.names),
        "instances": record.instances,
        "dropped": dropped,
        "clipped": dense.clipped,
        "outside": dense.outside,
        "masks": record.masks,
        "keypoints": record.keypoints,
        "semantic": record.semantic,
    }
    return record, summary


def encode_masks_empty(m: int, hw: tuple[int, int]) -> list[bytes]:
    from ..pack.dense import encode_masks

    return encode_masks(np.zeros((m, *hw), dtype=np.uint8))


def summary_of(record: Any) -> dict[str, Any] | None:
    """The result's dense summary from a manifest's record (a resumed finalize)."""
    if record is None:
        return None
    return {
        "format": record.source.get("format"),
        "categories": list(record.categories.names),
        "instances": record.instances,
        "dropped": record.dropped,
        "masks": record.masks,
        "keypoints": record.keypoints,
        "semantic": record.semantic,
    }


def rederive(root: Path, m: Any, source: Path) -> tuple[bool, str, Path | None]:
    """``imgpack verify --source``: the pack's dense columns derived again from the
    annotations under ``source`` (the format and file its manifest records, its category
    map fixed) and compared, file by file, with the pack's. Returns ``(ok, detail, the
    folder its images are read from)``."""
    import tempfile

    from ..pack.kinds import kind_of

    rec = m.dense
    fmt = rec.source.get("format") or "auto"
    ann = rec.source.get("annotations")
    options = DenseOptions(format=fmt, annotations=Path(ann) if ann else None)
    cfg = _VerifyPlanConfig(classes=None, allow_new_classes=False)
    try:
        plan = plan_dense(source, cfg, options, fixed=rec.categories)
    except PackerError as e:
        return False, f"cannot read the annotations under {source}: {e}", None
    missing = [r for r in m.sources if r not in plan.dense.by_file]
    if missing:
        return (
            False,
            (
                f"{len(missing)} images of the pack have no annotations under {source} "
                f"(first: {missing[0]})"
            ),
            plan.scan.root,
        )
    with tempfile.TemporaryDirectory(prefix=".imgpack-verify-") as tmp:
        got, _ = derive_columns(
            plan.dense, list(m.sources), [tuple(s) for s in m.source_sizes], kind_of(m),
            m.image_shape, m.resize, Path(root) / "_tensordict", Path(tmp),
        )  # fmt: skip
    differ = sorted(
        n for n in set(got.files) | set(rec.files) if got.files.get(n) != rec.files.get(n)
    )
    if differ:
        return (
            False,
            (
                f"the annotations under {source} give other dense columns: {', '.join(differ)} "
                "differ; rebuild the pack"
            ),
            plan.scan.root,
        )
    return True, f"{rec.instances} instances derived again from {source}: identical", plan.scan.root


@dataclass(frozen=True)
class _VerifyPlanConfig:
    classes: Any
    allow_new_classes: bool


def set_summary(records: list[Any], plan: Any) -> dict[str, Any] | None:
    """A set's dense summary: its new and kept shards' records added up."""
    recs = [r for r in records if r is not None]
    if not recs or getattr(plan, "dense", None) is None:
        return None
    out = summary_of(recs[0])
    assert out is not None
    out["instances"] = sum(r.instances for r in recs)
    out["dropped"] = sum(r.dropped for r in recs)
    out["clipped"], out["outside"] = plan.dense.clipped, plan.dense.outside
    return out


def check_append_categories(dst: Path, old: Any, plan: Any) -> None:
    """``BuildConfig.append`` to a set with dense targets: SRC's category map must be the
    set's (one map for the whole set: give the set as ``BuildConfig.classes`` to fix it),
    InputError naming the difference otherwise."""
    from ..pack.index import read_shard_manifest

    if not old.shards:
        return
    m = read_shard_manifest(dst, old.shards[0], old)
    have = m.dense.categories if m.dense is not None else None
    want = plan.dense.categories
    if have is None:
        raise InputError(
            f"BuildConfig.append: the set at {dst} has no dense targets and SRC has; build a "
            "new set",
            field="BuildConfig.append",
        )
    if want is not None and want != have:
        raise InputError(
            f"BuildConfig.append: SRC's categories {list(want.names)} are not the set's "
            f"{list(have.names)}; add BuildConfig.classes {dst} to read SRC with the set's "
            "category map",
            field="BuildConfig.classes",
        )


def dense_digest(dense: DensePlan, rels: list[str]) -> bytes:
    """SHA-256 of what the dense columns of images ``rels`` depend on (their targets, the
    category map, the ignore value): part of a shard's name, so a set rebuilt from other
    annotations builds its shards again."""
    import hashlib
    import json

    h = hashlib.sha256()
    cats = dense.categories.to_json() if dense.categories is not None else None
    h.update(json.dumps([cats, dense.ignore_index, dense.format]).encode())
    for rel in rels:
        t = dense.by_file.get(rel)
        if t is None:
            continue
        h.update(json.dumps([rel, list(t.size), t.semantic, str(t.image_id)]).encode())
        for a in (t.boxes, t.labels, t.iscrowd, t.area, t.keypoints):
            if a is not None:
                h.update(np.ascontiguousarray(a).tobytes())
        for c in t.masks or ():
            h.update(len(c).to_bytes(8, "little") + c)
    return h.digest()
