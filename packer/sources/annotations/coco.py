"""COCO JSON: ``instances_*.json`` and ``person_keypoints_*.json``.

Boxes ``[x, y, w, h]`` become XYXY pixels; categories (sparse ids, sorted by id) become
contiguous indices with the ids kept; segmentations (polygons, uncompressed and
compressed RLE) become one compressed RLE per instance through pycocotools (the
``dense`` extra), ``None`` for a set without any; ``iscrowd`` and ``area`` are kept
(``area`` computed from the box where absent); keypoints ``[x1, y1, v1, ...]`` become
[M, K, 3], the flip map derived from the keypoint names' left/right pairs.

The JSON is read whole (``json.loads``), so a file larger than
``AnnotationConfig.max_json_bytes`` (2 GiB by default; checked from the file's size
before a byte is read) is refused with an error saying the cap and how to raise it.
Python's JSON objects take about 5-10 times the file's size in memory: set the cap to
what the machine can hold.

Bad annotations are skips (:class:`~packer.sources.annotations.model.Report`): an
annotation naming an image the JSON does not list, an unknown ``category_id``, a box
that is not four finite numbers with positive width and height, or lies wholly outside
the image, a polygon with fewer than 3 points, an RLE of another size than its image,
keypoints of another count than the category names; an image whose file is missing or
whose size is not positive; an image with more than ``AnnotationConfig.max_boxes``
annotations (skipped whole).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..._fs import NotRegularFile, file_kind, loads_json, open_fd_if_regular
from ...errors import InputError
from .model import (
    AnnotationConfig,
    Annotations,
    CategoryMap,
    Report,
    check_rel,
    coco_mask,
    derive_flip_map,
    resolve_categories,
    targets_from,
)


def read_json_capped(path: Path, cap: int) -> Any:
    """The JSON at ``path`` (a regular file), refused before reading when its size is
    over ``cap`` (``AnnotationConfig.max_json_bytes``)."""
    try:
        fd, st = open_fd_if_regular(path)
    except FileNotFoundError:
        raise InputError(f"{path}: no such COCO JSON file; check the path") from None
    except NotRegularFile as e:
        raise InputError(f"{path}: {file_kind(e.mode)}, not a COCO JSON file") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read it ({e.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        if st.st_size > cap:
            raise InputError(
                f"{path}: {st.st_size:,} bytes, more than AnnotationConfig.max_json_bytes "
                f"({cap:,}); the JSON is read whole (several times its size in memory): raise "
                "AnnotationConfig.max_json_bytes if this machine can hold it, or split the file",
                field="AnnotationConfig.max_json_bytes",
            )
        os.set_blocking(f.fileno(), True)
        data = f.read(cap + 1)
    if len(data) > cap:  # grew while being read
        raise InputError(
            f"{path}: more than AnnotationConfig.max_json_bytes ({cap:,}) bytes",
            field="AnnotationConfig.max_json_bytes",
        )
    try:
        return loads_json(data)
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 JSON ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise InputError(
            f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})"
        ) from None
    except RecursionError:
        raise InputError(f"{path}: JSON nested too deeply") from None


def _key(v: object) -> int | str | None:
    """An image id as a dict key: an int (a float equal to one counts), a string, or None."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, (int, str)) and not isinstance(v, bool):
        return v
    return None


def default_images_dir(json_path: Path) -> Path:
    """Where COCO keeps the images of ``annotations/instances_<split>.json``:
    ``<root>/<split>`` (``train2017``), else ``<root>/images/<split>``, else
    ``<root>/images``, else the JSON's folder."""
    stem = json_path.stem
    pre = next((p for p in ("instances_", "person_keypoints_") if stem.startswith(p)), None)
    split = stem[len(pre) :] if pre else stem.rsplit("_", 1)[1] if "_" in stem else None
    root = json_path.parent.parent if json_path.parent.name == "annotations" else json_path.parent
    for cand in ([root / split, root / "images" / split] if split else []) + [root / "images"]:
        if cand.is_dir():
            return cand
    return json_path.parent if root == json_path.parent else root


def _categories(doc: dict[str, Any], where: str) -> CategoryMap:
    cats = doc.get("categories")
    if not isinstance(cats, list):
        raise InputError(
            f'{where}: no "categories" list; is this a COCO instances or keypoints file?'
        )
    rows = []
    for i, c in enumerate(cats):
        if (
            not isinstance(c, dict)
            or isinstance(c.get("id"), bool)
            or not isinstance(c.get("id"), int)
            or not isinstance(c.get("name"), str)
        ):
            raise InputError(f'{where}: categories[{i}] needs an integer "id" and a "name"')
        kps = c.get("keypoints") or []
        if not isinstance(kps, list) or not all(isinstance(k, str) for k in kps):
            raise InputError(
                f'{where}: category {c["name"]!r}: "keypoints" must be a list of names'
            )
        rows.append((c["id"], c["name"].strip(), tuple(kps)))
    rows.sort(key=lambda r: r[0])
    try:
        return CategoryMap(
            names=tuple(r[1] for r in rows),
            ids=tuple(r[0] for r in rows),
            keypoints=tuple(r[2] for r in rows),
            flip_map=tuple(derive_flip_map(r[2]) for r in rows),
        )
    except InputError as e:
        raise InputError(f"{where}: {e}") from None


def _number_list(v: object, n: int | None = None) -> list[float] | None:
    if not isinstance(v, list) or (n is not None and len(v) != n):
        return None
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        return None
    return [float(x) for x in v]


def _compressed_counts(s: str) -> list[int] | None:
    """The runs of a COCO compressed RLE string (pycocotools' ``rleFrString``), or None
    where it is damaged: checked here because pycocotools decodes counts that overrun
    the mask's size without a check."""
    counts: list[int] = []
    p, n = 0, len(s)
    while p < n:
        x = k = 0
        more = True
        while more:
            if p >= n:
                return None
            c = ord(s[p]) - 48
            if not 0 <= c < 64:
                return None
            x |= (c & 0x1F) << (5 * k)
            more = bool(c & 0x20)
            p += 1
            k += 1
            if not more and c & 0x10:
                x |= -1 << (5 * k)
        if len(counts) > 2:
            x += counts[-2]
        if x < 0:
            return None
        counts.append(x)
    return counts


def _rle_string(counts: list[int]) -> bytes:
    """``counts`` as pycocotools' ``rleToString`` writes them: each number in as few
    characters as it needs (a string padded with empty continuation characters, which
    pycocotools reads, is stored so; the pack's reader takes no number of more than 12
    characters)."""
    out = bytearray()
    for i, x in enumerate(counts):
        if i > 2:
            x -= counts[i - 2]
        more = True
        while more:
            c = x & 0x1F
            x >>= 5
            more = x != -1 if c & 0x10 else x != 0
            out.append((c | 0x20 if more else c) + 48)
    return bytes(out)


def _segmentation(seg: object, size: tuple[int, int]) -> tuple[bytes | None, str | None]:
    """One compressed RLE (``counts`` bytes) of ``seg``, or ``(None, reason)``."""
    h, w = size
    mask = coco_mask()
    if isinstance(seg, list):
        if not seg:
            return None, "an empty polygon list"
        polys = []
        for j, p in enumerate(seg):
            coords = _number_list(p)
            if coords is None:
                return None, f"polygon {j} is not a list of numbers"
            if len(coords) < 6 or len(coords) % 2:
                return None, (
                    f"polygon {j} has {len(coords)} coordinates; a polygon needs at least 3 "
                    "points (6 numbers, x and y)"
                )
            if not all(math.isfinite(x) for x in coords):
                return None, f"polygon {j} has a non-finite coordinate"
            polys.append(coords)
        rle = mask.merge(mask.frPyObjects(polys, h, w))
        return bytes(rle["counts"]), None
    if isinstance(seg, dict):
        sz = seg.get("size")
        counts = seg.get("counts")
        if _number_list(sz, 2) is None:
            return None, "an RLE without a [height, width] size"
        if [int(sz[0]), int(sz[1])] != [h, w]:
            return None, f"an RLE mask of {int(sz[1])}x{int(sz[0])}, not the image's {w}x{h}"
        if isinstance(counts, list):
            if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts):
                return None, "an uncompressed RLE whose counts are not non-negative integers"
            if sum(counts) != h * w:
                return None, f"an uncompressed RLE of {sum(counts)} pixels, not the image's {h * w}"
            rle = mask.frPyObjects({"size": [h, w], "counts": counts}, h, w)
            return bytes(rle["counts"]), None
        if isinstance(counts, str):
            runs = _compressed_counts(counts)
            if runs is None:
                return None, "a compressed RLE whose counts string is damaged"
            if sum(runs) != h * w:
                return None, f"a compressed RLE of {sum(runs)} pixels, not the image's {h * w}"
            return _rle_string(runs), None
        return None, "an RLE whose counts are neither a list nor a string"
    return None, f"a segmentation of type {type(seg).__name__}, neither polygons nor an RLE"


def read_coco(
    json_path: str | os.PathLike[str],
    images: str | os.PathLike[str] | None = None,
    config: AnnotationConfig = AnnotationConfig(),  # noqa: B008 (frozen)
) -> Annotations:
    """Read a COCO ``instances_*.json`` or ``person_keypoints_*.json``.

    ``images``: the folder the JSON's ``file_name`` values are relative to (default:
    :func:`default_images_dir`). Image files are only checked to exist: sizes come from
    the JSON. Returns :class:`Annotations` (format ``"coco"``), images sorted by file.
    """
    json_path = Path(json_path)
    src = str(json_path)
    root = Path(images) if images is not None else default_images_dir(json_path)
    if not root.is_dir():
        raise InputError(
            f"{root}: no such image folder for {json_path.name}; set AnnotationConfig.images",
            field="AnnotationConfig.images",
        )
    doc = read_json_capped(json_path, config.max_json_bytes)
    if not isinstance(doc, dict) or not isinstance(doc.get("images"), list):
        raise InputError(f'{src}: no "images" list; is this a COCO instances or keypoints file?')
    anns = doc.get("annotations", [])
    if not isinstance(anns, list):
        raise InputError(f'{src}: "annotations" must be a list')
    found = _categories(doc, src)
    cats = resolve_categories(found, config.category_map(), config.allow_new_categories, source=src)
    name_index = cats.index_of_name
    cat_index = {cid: name_index[n] for cid, n in zip(found.ids, found.names)}
    n_kp = cats.num_keypoints
    report = Report(config, src)

    # images: id -> (file, (h, w)); bad or missing ones skipped
    by_id: dict[int | str, tuple[str, tuple[int, int]]] = {}
    skipped_ids: set[int | str] = set()
    missing = 0
    for i, im in enumerate(doc["images"]):
        iid = _key(im.get("id")) if isinstance(im, dict) else None
        if iid is None:
            report.skip(src, f'images[{i}] has no integer or string "id"')
            continue
        rel = im.get("file_name")
        why = check_rel(rel)
        if why is not None:
            skipped_ids.add(iid)
            report.skip(src, f"image id {iid}: {why}")
            continue
        h, w = im.get("height"), im.get("width")
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (h, w)):
            skipped_ids.add(iid)
            report.skip(
                rel, f"image id {iid}: width {w!r} and height {h!r} must be positive integers"
            )
            continue
        if iid in by_id:
            report.skip(rel, f"image id {iid} is listed twice in the JSON (also {by_id[iid][0]!r})")
            continue
        if not (root / rel).is_file():
            missing += 1
            skipped_ids.add(iid)
            report.skip(rel, f"image id {iid}: the file is not found under {root}")
            continue
        by_id[iid] = (rel, (h, w))

    if not by_id and missing:
        raise InputError(
            f"{src}: none of its {missing} image files is under {root}; give the folder the "
            "file names are relative to as AnnotationConfig.images",
            field="AnnotationConfig.images",
        )
    grouped: dict[Any, list[dict[str, Any]]] = {iid: [] for iid in by_id}
    for i, a in enumerate(anns):
        aid = a.get("id", f"annotations[{i}]") if isinstance(a, dict) else f"annotations[{i}]"
        if not isinstance(a, dict):
            report.skip(src, "an annotation that is not an object", aid)
            continue
        iid = _key(a.get("image_id"))
        group = grouped.get(iid) if iid is not None else None
        if group is None:
            if iid is None or iid not in skipped_ids:
                report.skip(
                    src,
                    f"names image_id {a.get('image_id')!r}, which the JSON's images do not list",
                    aid,
                )
            continue  # the image itself is a skip already
        group.append(a)

    has_masks = any(isinstance(a, dict) and a.get("segmentation") for a in anns)
    out = []
    for iid, group in grouped.items():
        rel, size = by_id[iid]
        if len(group) > config.max_boxes:
            report.too_many(rel, len(group))
            continue
        out.append(_image(rel, size, iid, group, cats, cat_index, n_kp, has_masks, report))
    return report.finish("coco", root, cats, out, sources=[src])


def _image(
    rel: str,
    size: tuple[int, int],
    iid: Any,
    group: list[dict[str, Any]],
    cats: CategoryMap,
    cat_index: dict[int, int],
    n_kp: int,
    has_masks: bool,
    report: Report,
) -> Any:
    h, w = size
    boxes, labels, crowd, areas, kps, masks = [], [], [], [], [], []
    for a in group:
        aid = a.get("id")
        cid = _key(a.get("category_id"))
        label = cat_index.get(cid) if isinstance(cid, int) else None
        if label is None:
            report.skip(
                rel, f"category_id {a.get('category_id')!r} is not in the JSON's categories", aid
            )
            continue
        xywh = _number_list(a.get("bbox"), 4)
        if xywh is None:
            report.skip(rel, f"bbox {a.get('bbox')!r} is not four numbers [x, y, w, h]", aid)
            continue
        x, y, bw, bh = xywh
        box = report.box((x, y, x + bw, y + bh), size, rel, aid)
        if box is None:
            continue
        crowd_v = a.get("iscrowd", 0)
        if crowd_v not in (0, 1):
            report.skip(rel, f"iscrowd {crowd_v!r} is neither 0 nor 1", aid)
            continue
        kp = None
        if n_kp:
            kp = np.zeros((0, 3), dtype=np.float32)
            raw = a.get("keypoints")
            if raw is not None:
                k = len(cats.keypoints[label])
                vals = _number_list(raw, 3 * k)
                if vals is None or not all(math.isfinite(v) for v in vals):
                    report.skip(
                        rel,
                        f"keypoints must be {3 * k} finite numbers (x, y, v for each of "
                        f"{cats.names[label]!r}'s {k} keypoints)",
                        aid,
                    )
                    continue
                kp = np.asarray(vals, dtype=np.float32).reshape(k, 3)
        rle = None
        if has_masks:
            seg = a.get("segmentation")
            if seg:
                rle, why = _segmentation(seg, size)
                if rle is None:
                    report.skip(rel, f"segmentation: {why}", aid)
                    continue
            else:  # an instance without a mask in a set with masks: an empty one
                z = np.zeros((h, w), dtype=np.uint8, order="F")
                rle = bytes(coco_mask().encode(z)["counts"])
        area = a.get("area")
        if (
            not isinstance(area, (int, float))
            or isinstance(area, bool)
            or not math.isfinite(area)
            or area < 0
        ):
            area = (box[2] - box[0]) * (box[3] - box[1])
        boxes.append(box)
        labels.append(label)
        crowd.append(crowd_v)
        areas.append(float(area))
        if kp is not None:
            kps.append(kp)
        if rle is not None:
            masks.append(rle)
    return targets_from(
        rel,
        size,
        boxes,
        labels,
        iscrowd=crowd,
        area=areas,
        keypoints=kps if n_kp else None,
        num_keypoints=n_kp,
        masks=masks if has_masks else None,
        image_id=iid,
    )
