"""A small detection / segmentation set with known answers, written in every layout the
annotation readers take: COCO JSON (instances and person keypoints), YOLO, Pascal VOC,
and image + mask folders.

Each image holds three shapes on a grey background, drawn with Pillow from masks made
here, so every box, mask and keypoint is known exactly:

* a ``square`` (a rectangle; COCO segmentation: a 4-point polygon),
* an ``ell`` (an L-shaped 6-point polygon; its box is the polygon's bounds),
* a ``person`` (a rectangle with 5 keypoints; COCO segmentation: a compressed RLE).

Polygons use pixel-corner coordinates, which pycocotools rasterizes to exactly the
pixels ``[x1, x2) x [y1, y2)`` of each rectangle part. COCO ids are sparse (3, 7, 12)
and listed out of order, so the contiguous indices (0, 1, 2) must come from sorting.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

COCO_IDS = {"square": 3, "ell": 7, "person": 12}
NAMES = ["square", "ell", "person"]  # index order (sorted by COCO id)
KEYPOINTS = ["nose", "left_eye", "right_eye", "left_hand", "right_hand"]
FLIP_PAIRS = [(1, 2), (3, 4)]
SIZES = [(48, 64), (60, 80), (40, 56), (64, 72)]  # (h, w)
COLOURS = {"square": (220, 40, 40), "ell": (40, 200, 60), "person": (40, 60, 220)}


@dataclass
class Shape:
    name: str
    box: tuple[int, int, int, int]  # XYXY pixels
    mask: np.ndarray  # uint8 [h, w] 0/1
    polygon: list[float] | None  # pixel-corner polygon, or None (an RLE in COCO)
    keypoints: list[tuple[float, float, int]] | None = None

    @property
    def label(self) -> int:
        return NAMES.index(self.name)


@dataclass
class Truth:
    file: str  # the image's name, e.g. "img_000.png"
    size: tuple[int, int]  # (h, w)
    shapes: list[Shape] = field(default_factory=list)

    @property
    def stem(self) -> str:
        return self.file.rsplit(".", 1)[0]

    def semantic(self) -> np.ndarray:
        """uint8 [h, w]: 0 background, 1 + the category index inside each shape, 255
        (ignore) on the image's last row."""
        out = np.zeros(self.size, dtype=np.uint8)
        for s in self.shapes:
            out[s.mask.astype(bool)] = s.label + 1
        out[-1, :] = 255
        return out


def _rect(h: int, w: int, x1: int, y1: int, x2: int, y2: int) -> np.ndarray:
    m = np.zeros((h, w), dtype=np.uint8)
    m[y1:y2, x1:x2] = 1
    return m


def make_truth(n: int = 4, ext: str = ".png") -> list[Truth]:
    """``n`` images with their known shapes (deterministic)."""
    out = []
    for i in range(n):
        h, w = SIZES[i % len(SIZES)]
        t = Truth(f"img_{i:03d}{ext}", (h, w))
        # a square on the left
        x1, y1 = 2 + i, 3 + i
        x2, y2 = x1 + 12, y1 + 10
        t.shapes.append(
            Shape(
                "square",
                (x1, y1, x2, y2),
                _rect(h, w, x1, y1, x2, y2),
                [x1, y1, x2, y1, x2, y2, x1, y2],
            )
        )
        # an L in the middle: a 10x14 column and a 6x4 foot
        ex, ey = 20 + i, 6
        ell = _rect(h, w, ex, ey, ex + 4, ey + 14) | _rect(h, w, ex, ey + 10, ex + 10, ey + 14)
        poly = [
            ex,
            ey,
            ex + 4,
            ey,
            ex + 4,
            ey + 10,
            ex + 10,
            ey + 10,
            ex + 10,
            ey + 14,
            ex,
            ey + 14,
        ]
        t.shapes.append(Shape("ell", (ex, ey, ex + 10, ey + 14), ell, [float(v) for v in poly]))
        # a person on the right, with keypoints
        px1, py1, px2, py2 = w - 16, 8, w - 4, 8 + 20 + i
        kps = [
            (px1 + 6.5, py1 + 2.5, 2),
            (px1 + 4.5, py1 + 1.5, 2),
            (px1 + 8.5, py1 + 1.5, 1),
            (px1 + 1.5, py1 + 12.5, 2),
            (0.0, 0.0, 0),
        ]
        t.shapes.append(
            Shape(
                "person",
                (px1, py1, px2, py2),
                _rect(h, w, px1, py1, px2, py2),
                None,
                kps,
            )
        )
        out.append(t)
    return out


def draw(t: Truth) -> Image.Image:
    """The image of ``t``: each shape pasted in its colour through its mask (Pillow)."""
    h, w = t.size
    im = Image.new("RGB", (w, h), (128, 128, 128))
    for s in t.shapes:
        im.paste(COLOURS[s.name], mask=Image.fromarray(s.mask * 255))
    return im


def write_images(folder: Path, truths: list[Truth]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for t in truths:
        draw(t).save(folder / t.file)


def coco_doc(truths: list[Truth], keypoints: bool = False, uncompressed: bool = False) -> dict:
    """The COCO JSON of ``truths`` (categories listed out of id order; ``person``'s mask
    a compressed RLE, or an uncompressed one)."""
    from pycocotools import mask as cm

    cats = []
    for name in ["person", "square", "ell"]:
        c = {"id": COCO_IDS[name], "name": name, "supercategory": "shape"}
        if keypoints and name == "person":
            c["keypoints"] = list(KEYPOINTS)
            c["skeleton"] = [[1, 2], [1, 3]]
        cats.append(c)
    images, anns = [], []
    aid = 100
    for i, t in enumerate(truths):
        h, w = t.size
        images.append({"id": 1000 + i, "file_name": t.file, "height": h, "width": w})
        for s in t.shapes:
            x1, y1, x2, y2 = s.box
            a = {
                "id": aid,
                "image_id": 1000 + i,
                "category_id": COCO_IDS[s.name],
                "bbox": [x1, y1, x2 - x1, y2 - y1],
                "area": float(s.mask.sum()),
                "iscrowd": 0,
            }
            if s.polygon is not None:
                a["segmentation"] = [s.polygon]
            elif uncompressed:
                flat = s.mask.flatten(order="F")
                counts, cur, run = [], 0, 0
                for v in flat:
                    if v != cur:
                        counts.append(run)
                        cur, run = v, 0
                    run += 1
                counts.append(run)
                a["segmentation"] = {"size": [h, w], "counts": counts}
            else:
                rle = cm.encode(np.asfortranarray(s.mask))
                a["segmentation"] = {"size": [h, w], "counts": rle["counts"].decode()}
            if keypoints and s.keypoints is not None:
                a["keypoints"] = [v for kp in s.keypoints for v in kp]
                a["num_keypoints"] = sum(1 for kp in s.keypoints if kp[2] > 0)
            anns.append(a)
            aid += 1
    return {"images": images, "annotations": anns, "categories": cats}


def write_coco(
    root: Path,
    truths: list[Truth],
    split: str = "train2017",
    keypoints: bool = False,
    uncompressed: bool = False,
) -> Path:
    """COCO's layout: ``root/<split>/`` images and ``root/annotations/<kind>_<split>.json``
    (``person_keypoints_`` with ``keypoints``). Returns the JSON's path."""
    write_images(root / split, truths)
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    kind = "person_keypoints" if keypoints else "instances"
    path = root / "annotations" / f"{kind}_{split}.json"
    path.write_text(json.dumps(coco_doc(truths, keypoints, uncompressed)))
    return path


def write_yolo(root: Path, truths: list[Truth], split: str | None = None) -> Path:
    """YOLO's layout: ``images/[split/]``, ``labels/[split/]`` and ``data.yaml`` (names
    as a block mapping)."""
    images = root / "images" / split if split else root / "images"
    labels = root / "labels" / split if split else root / "labels"
    write_images(images, truths)
    labels.mkdir(parents=True, exist_ok=True)
    for t in truths:
        h, w = t.size
        lines = []
        for s in t.shapes:
            x1, y1, x2, y2 = s.box
            cx, cy = (x1 + x2) / 2 / w, (y1 + y2) / 2 / h
            lines.append(f"{s.label} {cx:.10f} {cy:.10f} {(x2 - x1) / w:.10f} {(y2 - y1) / h:.10f}")
        (labels / f"{t.stem}.txt").write_text("\n".join(lines) + "\n")
    names = "".join(f"  {i}: {n}\n" for i, n in enumerate(NAMES))
    (root / "data.yaml").write_text(
        f"# a test set\npath: .\ntrain: images/train\nval: images/val\nnames:\n{names}"
    )
    return root


def voc_xml(t: Truth, difficult: dict[int, int] | None = None) -> str:
    h, w = t.size
    objs = []
    for k, s in enumerate(t.shapes):
        x1, y1, x2, y2 = s.box
        d = (difficult or {}).get(k, 0)
        objs.append(
            f"<object><name>{s.name}</name><pose>Unspecified</pose><truncated>0</truncated>"
            f"<difficult>{d}</difficult><bndbox><xmin>{x1 + 1}</xmin><ymin>{y1 + 1}</ymin>"
            f"<xmax>{x2}</xmax><ymax>{y2}</ymax></bndbox></object>"
        )
    return (
        f"<annotation><folder>VOC2012</folder><filename>{t.file}</filename>"
        f"<size><width>{w}</width><height>{h}</height><depth>3</depth></size>"
        f"<segmented>0</segmented>{''.join(objs)}</annotation>"
    )


def write_voc(root: Path, truths: list[Truth], difficult: dict[int, int] | None = None) -> Path:
    """VOC's layout: ``JPEGImages/``, ``Annotations/<stem>.xml`` (1-based boxes) and
    ``ImageSets/Main/train.txt`` listing every stem. ``difficult``: {shape index: 1}."""
    write_images(root / "JPEGImages", truths)
    (root / "Annotations").mkdir(parents=True, exist_ok=True)
    (root / "ImageSets" / "Main").mkdir(parents=True, exist_ok=True)
    for t in truths:
        (root / "Annotations" / f"{t.stem}.xml").write_text(voc_xml(t, difficult))
    (root / "ImageSets" / "Main" / "train.txt").write_text("".join(t.stem + "\n" for t in truths))
    return root


def write_masks(
    root: Path,
    truths: list[Truth],
    palette: bool = True,
    images: str = "images",
    masks: str = "masks",
) -> Path:
    """``root/<images>/`` beside ``root/<masks>/<stem>.png``: palette PNGs (VOC's: the
    indices are the classes, the colours arbitrary) or grey ones."""
    write_images(root / images, truths)
    (root / masks).mkdir(parents=True, exist_ok=True)
    for t in truths:
        sem = Image.fromarray(t.semantic(), mode="L")
        if palette:
            sem = sem.convert("L")
            p = Image.frombytes("P", sem.size, sem.tobytes())
            pal = [0, 0, 0, 128, 0, 0, 0, 128, 0, 128, 128, 0] + [224, 224, 192] * 252
            p.putpalette(pal[: 256 * 3])
            sem = p
        sem.save(root / masks / f"{t.stem}.png")
    return root
