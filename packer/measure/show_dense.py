"""``imgpack show`` of a pack with dense targets (issue 46.6): each image with its
targets drawn on it.

* boxes: an outline in the category's colour, the category's name in a box of that
  colour at the top-left corner (Pillow's ImageDraw, its built-in font); a crowd box
  dashed is not attempted, it is drawn as the others;
* instance masks: a translucent fill of the category's colour, inside the mask only;
* keypoints: a dot per keypoint of visibility 1 or 2 (0: not drawn), and the lines of
  the category's skeleton when its category map has one;
* semantic masks: a translucent palette overlay (VOC's palette by pixel value), the
  ignore value left as it is.

Layout: a row per category of up to ``ShowConfig.per_class`` images holding it (the
first, or a seeded choice), the first ``ShowConfig.max_classes`` categories; a pack of
semantic masks only, a row per pixel class. Which images hold what is read from the
first :data:`SCAN_IMAGES` images of the pack (a bound on the time this takes).

``ShowConfig.augment`` ``hflip``, ``lsj`` or ``ssd`` (:data:`DENSE_AUGMENTS`, the
torchvision detection reference's presets, LSJ to ``ShowConfig.size``): each image
gets a row, as stored then ``ShowConfig.draws`` draws of the dense transform
(:mod:`packer.augment.dense`), its targets moved with it and drawn on the result.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import UsageError

DENSE_AUGMENTS = ("hflip", "lsj", "ssd")  # ShowConfig.augment values for dense packs
SCAN_IMAGES = 2000  # the images read to find which categories each one holds
ALPHA = 0.45  # the overlays' opacity
MIN_SIDE = 192  # a smaller image is enlarged (a whole factor) before its targets are drawn
_F = "ShowConfig."

# distinct colours, one per category index (then cycled)
_COLOURS = [
    (230, 25, 75), (60, 180, 75), (255, 225, 25), (0, 130, 200), (245, 130, 48),
    (145, 30, 180), (70, 240, 240), (240, 50, 230), (210, 245, 60), (250, 190, 212),
    (0, 128, 128), (220, 190, 255), (170, 110, 40), (255, 250, 200), (128, 0, 0),
    (170, 255, 195), (128, 128, 0), (255, 215, 180), (0, 0, 128), (128, 128, 128),
]  # fmt: skip


def colour(index: int) -> tuple[int, int, int]:
    """The colour of category ``index`` on the sheet."""
    return _COLOURS[int(index) % len(_COLOURS)]


def voc_palette() -> np.ndarray:
    """uint8 [256, 3]: VOC's palette (the bits of the value spread over R, G, B)."""
    pal = np.zeros((256, 3), dtype=np.uint8)
    for v in range(256):
        c, r, g, b = v, 0, 0, 0
        for j in range(8):
            r |= ((c >> 0) & 1) << (7 - j)
            g |= ((c >> 1) & 1) << (7 - j)
            b |= ((c >> 2) & 1) << (7 - j)
            c >>= 3
        pal[v] = (r, g, b)
    return pal


def _blend(img: np.ndarray, where: np.ndarray, rgb: np.ndarray | tuple[int, ...]) -> None:
    """``img[where] = (1 - ALPHA) * img + ALPHA * rgb``, in place."""
    src = img[where].astype(np.float32)
    img[where] = np.clip(src * (1 - ALPHA) + np.asarray(rgb, np.float32) * ALPHA + 0.5, 0, 255)


def annotate(
    image: np.ndarray,
    target: Mapping[str, Any],
    categories: Any,
    ignore_index: int = 255,
) -> np.ndarray:
    """A copy of ``image`` (uint8 [H, W, 3], or [H, W]) with the targets that
    ``target`` holds drawn on it: ``semantic`` (uint8 [H, W]), ``masks`` (0/1 [M, H, W]),
    ``boxes`` (XYXY pixels [M, 4]) with ``labels`` (category indices), ``keypoints``
    ([M, K, 3]). A field absent (or None) is not drawn."""
    from PIL import Image, ImageDraw, ImageFont

    img = np.array(image, dtype=np.uint8, copy=True)
    if img.ndim == 3 and img.shape[-1] == 1:
        img = img[..., 0]
    if img.ndim == 2:
        img = np.repeat(img[..., None], 3, axis=2)
    h, w = img.shape[:2]
    names = list(getattr(categories, "names", ()))
    labels = target.get("labels")
    labels = np.zeros(0, np.int64) if labels is None else np.asarray(labels).reshape(-1)
    sem = target.get("semantic")
    if sem is not None:
        sem = np.asarray(sem)[:h, :w]
        pal = voc_palette()
        keep = sem != ignore_index
        _blend(img[: sem.shape[0], : sem.shape[1]], keep, pal[sem[keep]])
    masks = target.get("masks")
    if masks is not None:
        for j, m in enumerate(np.asarray(masks)):
            on = m[:h, :w].astype(bool)
            lab = int(labels[j]) if j < labels.size else j
            _blend(img[: on.shape[0], : on.shape[1]], on, colour(lab))
    pil = Image.fromarray(img)
    draw = ImageDraw.Draw(pil)
    font = ImageFont.load_default()
    skeletons = getattr(categories, "skeleton", None) or ()
    kps = target.get("keypoints")
    if kps is not None:
        for j, pts in enumerate(np.asarray(kps, dtype=np.float64)):
            lab = int(labels[j]) if j < labels.size else 0
            col = colour(lab)
            bones = skeletons[lab] if lab < len(skeletons) else ()
            for a, b in bones:  # a category's skeleton: pairs of keypoint indices
                if 0 <= a < len(pts) and 0 <= b < len(pts) and pts[a, 2] > 0 and pts[b, 2] > 0:
                    draw.line([(pts[a, 0], pts[a, 1]), (pts[b, 0], pts[b, 1])], fill=col)
            for x, y, v in pts:
                if v > 0:
                    draw.ellipse([x - 1.5, y - 1.5, x + 1.5, y + 1.5], fill=col, outline=(0, 0, 0))
    boxes = target.get("boxes")
    if boxes is not None:
        for j, (x1, y1, x2, y2) in enumerate(np.asarray(boxes, dtype=np.float64)):
            lab = int(labels[j]) if j < labels.size else -1
            col = colour(max(lab, 0))
            x1, y1 = int(np.floor(x1)), int(np.floor(y1))
            x2, y2 = int(np.ceil(x2)) - 1, int(np.ceil(y2)) - 1  # the last pixel inside
            if x2 < x1 or y2 < y1:
                continue
            draw.rectangle([x1, y1, x2, y2], outline=col, width=1)
            text = names[lab] if 0 <= lab < len(names) else str(lab)
            left, top, right, bottom = draw.textbbox((x1, y1), text, font=font)
            draw.rectangle([left, top, right, bottom], fill=col)
            draw.text((x1, y1), text, fill=(0, 0, 0), font=font)
    return np.asarray(pil)


def enlarge(image: np.ndarray, target: Mapping[str, Any]) -> tuple[np.ndarray, dict[str, Any]]:
    """A small image (and its targets) blown up by a whole factor (nearest neighbour,
    at most 8) so its shorter side reaches :data:`MIN_SIDE` pixels: the names and dots
    drawn on it stay readable next to the picture."""
    h, w = image.shape[:2]
    f = max(1, min(8, -(-MIN_SIDE // max(1, min(h, w)))))
    if f == 1:
        return image, dict(target)
    out = dict(target)
    for k in ("masks", "semantic"):
        if out.get(k) is not None:
            out[k] = np.asarray(out[k]).repeat(f, axis=-2).repeat(f, axis=-1)
    if out.get("boxes") is not None:
        out["boxes"] = np.asarray(out["boxes"], np.float32) * f
    if out.get("keypoints") is not None:
        kp = np.array(out["keypoints"], np.float32, copy=True)
        kp[..., :2] = (kp[..., :2] + 0.5) * f - 0.5  # pixel centres stay centres
        out["keypoints"] = kp
    return image.repeat(f, axis=0).repeat(f, axis=1), out


def _drawable(rec: Mapping[str, Any], has_masks: bool) -> dict[str, Any]:
    """A stored record (``DenseColumns.read``'s) as :func:`annotate` takes it: masks
    decoded from their RLE."""
    out = {k: rec[k] for k in ("boxes", "labels", "keypoints", "semantic") if k in rec}
    if has_masks and "masks_rle" in rec:
        from ..pack.dense import decode_masks

        out["masks"] = decode_masks(rec["masks_rle"], rec["size"])
    return out


def groups_of(cols: Any, n: int, cfg: Any) -> list[tuple[str, list[int]]]:
    """(row name, pack rows) for the sheet: per category the images (of the first
    :data:`SCAN_IMAGES`) that hold it; per pixel class for semantic masks only."""
    names = list(cols.categories.names)
    scan = min(n, SCAN_IMAGES)
    holds: dict[Any, list[int]] = {}
    recs = cols.read(range(scan)) if scan else []
    instances = any(len(r["labels"]) for r in recs)
    by_id = dict(zip(cols.categories.ids, names))
    for i, r in enumerate(recs):
        if instances:
            keys = sorted(set(np.asarray(r["labels"]).tolist()))
        elif "semantic" in r:
            keys = [v for v in np.unique(r["semantic"]).tolist() if v != cols.ignore_index]
        else:
            keys = []
        for k in keys:
            holds.setdefault(k, []).append(i)
    rng = None if cfg.seed is None else np.random.default_rng(cfg.seed)
    out = []
    for k in sorted(holds):
        rows = np.asarray(holds[k])
        if rng is None:
            rows = rows[: cfg.per_class]
        else:
            rows = np.sort(rng.choice(rows, min(cfg.per_class, len(rows)), replace=False))
        name = names[k] if instances else str(by_id.get(k, k))
        out.append((name, rows.tolist()))
        if len(out) == cfg.max_classes:
            break
    if not out and n:
        out.append(("(no targets)", list(range(min(n, cfg.per_class)))))
    return out


def dense_op(name: str, categories: Any, size: int) -> Any:
    """The dense transform of ``ShowConfig.augment`` ``name`` (torchvision's detection
    reference presets; LSJ to ``size``), flips given the categories' flip maps."""
    from ..augment import dense as D

    maps = {i: tuple(m) for i, m in enumerate(categories.flip_map) if m} or None
    flip = D.RandomHorizontalFlip(0.5, flip_map=maps)
    if name == "hflip":
        ops = [flip]
    elif name == "lsj":
        ops = [D.ScaleJitter((size, size)), D.FixedSizeCrop((size, size), fill=0), flip]
    elif name == "ssd":
        ops = [D.RandomZoomOut(fill=(123, 117, 104)), D.RandomIoUCrop(), flip]
    else:  # ShowConfig.validate admits only DENSE_AUGMENTS here
        raise UsageError(f"{_F}augment {name!r} is not a dense transform", field=f"{_F}augment")
    return D.Compose([*ops, D.SanitizeBoundingBoxes()])


def check_dense_config(cfg: Any, dense: bool) -> None:
    """Refuse the augmentations that would move a dense pack's images without their
    targets, and the dense ones on a pack without targets."""
    if dense:
        bad = [
            f"{_F}{k}" for k in ("random_erase", "mixup_alpha", "cutmix_alpha") if getattr(cfg, k)
        ]
        if cfg.augment is not None and cfg.augment not in DENSE_AUGMENTS:
            bad.insert(0, f"{_F}augment {cfg.augment!r}")
        if bad:
            raise UsageError(
                f"{cfg.pack}: the pack holds boxes and masks, which {', '.join(bad)} would "
                f"not move with the images; use {_F}augment {', '.join(DENSE_AUGMENTS)}",
                field=bad[0].split(" ")[0],
            )
    elif cfg.augment in DENSE_AUGMENTS:
        raise UsageError(
            f"{cfg.pack}: {_F}augment {cfg.augment!r} moves boxes and masks with the images, "
            "and the pack holds none (built without BuildConfig.dense)",
            field=f"{_F}augment",
        )


def show_dense(cfg: Any, pack: Any, cols: Any, load: Any, figure: Any, plt: Any) -> dict[str, Any]:
    """Draw the dense sheet; returns the fields of :class:`~packer.measure.show.ShowResult`.
    ``load(pack, rows)``: the stored images (uint8 [3, h, w] tensors); ``figure``:
    :func:`packer.measure.show._figure`."""
    import torch

    from ..loading.order import batch_seed

    n = len(pack)
    groups = groups_of(cols, n, cfg)
    if not groups:
        raise UsageError(f"{cfg.pack}: the pack holds no images; nothing to show")
    rows = [r for _, rs in groups for r in rs]
    cells_n = len(rows) * (1 + cfg.draws) if cfg.augment else len(rows)
    if cells_n > cfg._max_cells:
        raise UsageError(
            f"the sheet would hold {cells_n:,} images, more than {cfg._max_cells:,}: lower "
            f"{_F}draws, {_F}per_class or {_F}max_classes"
        )
    stored = load(pack, rows)
    recs = cols.read(rows)
    cats, ign = cols.categories, cols.ignore_index

    def hwc(t: torch.Tensor) -> np.ndarray:
        return t.detach().cpu().permute(1, 2, 0).numpy()

    def picture(img: np.ndarray, target: Mapping[str, Any]) -> np.ndarray:
        return annotate(*enlarge(img, target), cats, ign)

    pictures = [picture(hwc(img), _drawable(r, cols.has_masks)) for img, r in zip(stored, recs)]
    ops: tuple[str, ...] = ()
    if cfg.augment:
        from ..augment.dense import Sample

        op = dense_op(cfg.augment, cats, cfg.size)
        ops = tuple(type(o).__name__ for o in op.ops)
        cells = []
        for i, (img, rec) in enumerate(zip(stored, recs)):
            d = _drawable(rec, cols.has_masks)
            sample = Sample(
                img.contiguous(),
                boxes=torch.as_tensor(d["boxes"]) if "boxes" in d else None,
                labels=torch.as_tensor(d["labels"]) if "labels" in d else None,
                masks=torch.as_tensor(d["masks"]) if "masks" in d else None,
                semantic=torch.as_tensor(d["semantic"]) if "semantic" in d else None,
                keypoints=torch.as_tensor(d["keypoints"]) if "keypoints" in d else None,
            )
            row = [(pictures[i], "")]
            for k in range(cfg.draws):
                g = torch.Generator().manual_seed(batch_seed(cfg.seed or 0, 0, i, k))
                out = op(sample, generator=g)
                got = {
                    f: getattr(out, f).numpy()
                    for f in ("boxes", "labels", "masks", "semantic", "keypoints")
                    if getattr(out, f) is not None
                }
                caption = f"{out.count} boxes" if out.boxes is not None else ""
                row.append((picture(hwc(out.image), got), caption))
            cells.append(row)
        row_names = [name for name, rs in groups for _ in rs]
        heads = ["as stored", *(f"draw {d + 1}" for d in range(cfg.draws))]
    else:
        ncols = max(len(rs) for _, rs in groups)
        it = iter(pictures)
        cells = [[(next(it), "") for _ in rs] + [None] * (ncols - len(rs)) for _, rs in groups]
        row_names = [name for name, _ in groups]
        heads = []
    nrows, ncols, width, height = figure(plt, cfg, cells, row_names, heads)
    return {
        "images": len(rows),
        "indices": tuple(rows),
        "classes": tuple(row_names),
        "rows": nrows,
        "columns": ncols,
        "draws": cfg.draws if cfg.augment else 0,
        "augment": ops,
        "width": width,
        "height": height,
    }
