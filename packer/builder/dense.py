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

The targets' geometry and columns live in :mod:`packer.builder.dense_targets`
(``write_dense_targets`` and ``derive_columns`` importable from here too).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
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
from .dense_targets import derive_columns, write_dense_targets

# what other modules import from here (the targets' geometry: .dense_targets)
__all__ = [
    "DenseOptions",
    "check_append_categories",
    "dense_digest",
    "derive_columns",
    "detect_dense",
    "plan_dense",
    "rederive",
    "set_summary",
    "summary_of",
    "write_dense_targets",
]

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
