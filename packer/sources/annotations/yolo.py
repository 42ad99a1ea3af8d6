"""YOLO: ``images/`` beside ``labels/`` (each optionally with ``<split>/`` below), one
``labels/…/<stem>.txt`` per image holding one ``class cx cy w h`` line per box
(normalized to the image's width and height), and the class names in ``data.yaml``
(Ultralytics) or ``classes.txt`` (darknet, one name a line).

``data.yaml`` is read without a YAML library, for the subset these files use: a
top-level ``names:`` holding a flow list (``[a, b]``), a flow mapping (``{0: a}``), a
block list (``- a`` lines) or a block mapping (``0: a`` lines); ``#`` comments and
quoted names. Anything else under ``names`` is refused naming the line. A mapping's
numbers are the class ids (kept; sparse ones map to contiguous indices).

Image sizes come from each image's header (Pillow, lazy: no pixel is decoded; EXIF
orientation applied as the build decodes). An image without a label file has no boxes
(YOLO's background images). Skips: a label file with no image, a line that is not five
numbers, a class number the names do not have, a box with a non-finite, zero or
negative size or wholly outside the image (one partly outside is clipped), an image
whose header cannot be read, an image with more than ``AnnotationConfig.max_boxes``
lines. Label files and ``data.yaml`` are read only up to
``AnnotationConfig.max_file_bytes``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ...errors import InputError
from ..common import read_regular
from ..scan import list_images
from .model import (
    AnnotationConfig,
    Annotations,
    CategoryMap,
    Report,
    header_size,
    load_category_map,
    resolve_categories,
    targets_from,
)

_KEY_RE = re.compile(r"^([A-Za-z_][\w-]*)\s*:(.*)$")


def _strip_comment(line: str) -> str:
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i].rstrip()
    return line.rstrip()


def _scalar(text: str, where: str) -> str:
    t = text.strip()
    if len(t) >= 2 and t[0] == t[-1] and t[0] in "'\"":
        inner = t[1:-1]
        return inner.replace("''", "'") if t[0] == "'" else inner.replace('\\"', '"')
    if not t or t[0] in "[]{}&*!|>%@`" or t.startswith("- "):
        raise InputError(f"{where}: {text.strip()!r} is not a plain or quoted name")
    return t


def _split_flow(body: str, where: str) -> list[str]:
    items, cur, quote = [], "", None
    for ch in body:
        if quote:
            cur += ch
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
            cur += ch
        elif ch == ",":
            items.append(cur)
            cur = ""
        elif ch in "[]{}":
            raise InputError(f"{where}: nested lists or mappings are not class names")
        else:
            cur += ch
    if quote:
        raise InputError(f"{where}: an unclosed quote")
    items.append(cur)
    if items and not items[-1].strip():  # a trailing comma
        items.pop()
    return items


def _pair(text: str, where: str) -> tuple[int, str]:
    key, sep, value = text.partition(":")
    if not sep or not re.fullmatch(r"\s*\d+\s*", key):
        raise InputError(f"{where}: {text.strip()!r} is not 'number: name'")
    return int(key), _scalar(value, where)


def parse_names(text: str, where: str) -> tuple[list[int], list[str]]:
    """The class ids and names of a ``data.yaml``'s ``names:`` (see the module's doc)."""
    lines = text.splitlines()
    for n, raw in enumerate(lines):
        line = _strip_comment(raw)
        m = _KEY_RE.match(line)
        if m is None or m.group(1) != "names":
            continue
        here = f"{where} line {n + 1}"
        rest = m.group(2).strip()
        pairs: list[tuple[int, str]] = []
        if rest.startswith("["):
            if not rest.endswith("]"):
                raise InputError(f"{here}: a list of names must close on its line with ']'")
            names = [_scalar(s, here) for s in _split_flow(rest[1:-1], here)]
            pairs = list(enumerate(names))
        elif rest.startswith("{"):
            if not rest.endswith("}"):
                raise InputError(f"{here}: a mapping of names must close on its line with '}}'")
            pairs = [_pair(s, here) for s in _split_flow(rest[1:-1], here)]
        elif rest:
            raise InputError(
                f"{here}: names must be a list or a mapping of class names, not {rest!r}"
            )
        else:
            block = []
            for k in range(n + 1, len(lines)):
                sub = _strip_comment(lines[k])
                if not sub.strip():
                    continue
                if not sub[0].isspace() and not sub.startswith("-"):
                    break
                block.append((k + 1, sub.strip()))
            items = [s for _, s in block]
            if items and all(s.startswith("-") for s in items):
                pairs = [
                    (i, _scalar(s[1:], f"{where} line {ln}")) for i, (ln, s) in enumerate(block)
                ]
            else:
                pairs = [_pair(s, f"{where} line {ln}") for ln, s in block]
        if not pairs:
            raise InputError(f"{here}: names holds no class names")
        ids = [p[0] for p in pairs]
        if len(set(ids)) != len(ids):
            raise InputError(f"{here}: a class number appears twice")
        pairs.sort()
        return [p[0] for p in pairs], [p[1] for p in pairs]
    raise InputError(f"{where}: no top-level 'names:'; list the class names under names:")


def yolo_dirs(root: Path, split: str | None) -> tuple[Path, Path]:
    """``(images, labels)`` folders of a YOLO root, with ``split`` below each if given."""
    images, labels = root / "images", root / "labels"
    if split is not None:
        images, labels = images / split, labels / split
    return images, labels


def yolo_categories(root: Path, config: AnnotationConfig) -> tuple[CategoryMap, str]:
    """The class names of a YOLO root and the file they came from."""
    for name in ("data.yaml", "data.yml", "dataset.yaml"):
        p = root / name
        if p.is_file():
            data = read_regular(p, config.max_file_bytes, "a YOLO data.yaml")
            try:
                text = data.decode("utf-8-sig")
            except UnicodeDecodeError as e:
                raise InputError(f"{p}: not UTF-8 text ({e.reason} at byte {e.start})") from None
            ids, names = parse_names(text, str(p))
            try:
                return CategoryMap.build(names, ids), str(p)
            except InputError as e:
                raise InputError(f"{p}: {e}") from None
    p = root / "classes.txt"
    if p.is_file():
        return load_category_map(p, max_bytes=config.max_file_bytes), str(p)
    fixed = config.category_map()
    if fixed is not None:
        return fixed, "the category map"
    raise InputError(
        f"{root}: no class names: looked for data.yaml (names:), data.yml, dataset.yaml and "
        "classes.txt; write one, or give AnnotationConfig.categories",
        field="AnnotationConfig.categories",
    )


def read_yolo(
    root: str | os.PathLike[str],
    config: AnnotationConfig = AnnotationConfig(),  # noqa: B008 (frozen)
) -> Annotations:
    """Read a YOLO folder (``images/``, ``labels/``, ``data.yaml``; ``config.split``
    selects ``images/<split>``). Returns :class:`Annotations` (format ``"yolo"``),
    ``root`` the images folder, images sorted by file."""
    root = Path(root)
    images, labels = yolo_dirs(root, config.split)
    if config.images is not None:
        images = Path(config.images)
    for d in (images, labels):
        if not d.is_dir():
            raise InputError(
                f"{d}: no such folder; a YOLO set has images/ and labels/ (split: AnnotationConfig.split)",
                field="AnnotationConfig.split",
            )
    found, names_src = yolo_categories(root, config)
    cats = resolve_categories(
        found, config.category_map(), config.allow_new_categories, source=names_src
    )
    name_index = cats.index_of_name
    index_of_class = {cid: name_index[n] for cid, n in zip(found.ids, found.names)}
    report = Report(config)
    scan = list_images(images)
    for s in scan.skipped:
        report.skip(s["path"], s["reason"])
    stems = set()
    out = []
    for e in scan.entries:
        rel = e.rel
        stem = rel.rsplit(".", 1)[0]
        stems.add(stem)
        try:
            size = header_size(images / rel)
        except Exception as err:  # Pillow raises several kinds for a bad header
            report.skip(rel, f"cannot read the image's header ({type(err).__name__}: {err})")
            continue
        label_file = labels / (stem + ".txt")
        if not label_file.is_file():
            out.append(targets_from(rel, size, [], [], image_id=stem))
            continue
        t = _read_labels(label_file, rel, size, index_of_class, report, config)
        if t is not None:
            out.append(t)
    for txt in sorted(labels.rglob("*.txt")):
        stem = txt.relative_to(labels).as_posix()[:-4]
        if stem not in stems and txt.is_file():
            report.skip(
                txt.relative_to(labels).as_posix(),
                f"a label file with no image of that name under {images}",
                source=str(txt),
            )
    return report.finish("yolo", images, cats, out, sources=[names_src])


def _read_labels(
    path: Path,
    rel: str,
    size: tuple[int, int],
    index_of_class: dict[int, int],
    report: Report,
    config: AnnotationConfig,
):
    h, w = size
    try:
        data = read_regular(path, config.max_file_bytes, "a YOLO label file")
        text = data.decode("utf-8-sig")
    except InputError as e:
        report.skip(rel, str(e))
        return None
    except UnicodeDecodeError as e:
        report.skip(rel, f"{path.name}: not UTF-8 text ({e.reason} at byte {e.start})")
        return None
    lines = [(n, ln) for n, ln in enumerate(text.splitlines(), 1) if ln.strip()]
    if len(lines) > config.max_boxes:
        report.too_many(rel, len(lines))
        return None
    boxes, labels = [], []
    for n, line in lines:
        where = f"{path.name} line {n}"
        parts = line.split()
        if len(parts) != 5:
            report.skip(
                rel,
                f"{where}: {len(parts)} values; a box line is 'class cx cy w h' (segment and "
                "pose lines are not read)",
                n,
            )
            continue
        try:
            cls = int(parts[0])
            cx, cy, bw, bh = (float(v) for v in parts[1:])
        except ValueError:
            report.skip(rel, f"{where}: {line.strip()!r} is not a class number and four numbers", n)
            continue
        label = index_of_class.get(cls)
        if label is None:
            report.skip(rel, f"{where}: class {cls} is not among the names", n)
            continue
        box = report.box(
            ((cx - bw / 2) * w, (cy - bh / 2) * h, (cx + bw / 2) * w, (cy + bh / 2) * h),
            size,
            rel,
            n,
        )
        if box is None:
            continue
        boxes.append(box)
        labels.append(label)
    return targets_from(rel, size, boxes, labels, image_id=rel.rsplit(".", 1)[0])


def is_yolo(root: Path) -> bool:
    """A YOLO layout: ``images/`` and ``labels/`` holding ``.txt`` files, or a ``data.yaml``."""
    if (root / "data.yaml").is_file() or (root / "data.yml").is_file():
        return True
    labels = root / "labels"
    return (
        (root / "images").is_dir()
        and labels.is_dir()
        and any(p.suffix == ".txt" for p in labels.rglob("*.txt"))
    )


__all__ = ["is_yolo", "parse_names", "read_yolo", "yolo_categories", "yolo_dirs"]
