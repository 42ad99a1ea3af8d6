"""Pascal VOC: ``Annotations/<id>.xml`` (boxes) beside ``JPEGImages/`` (images), an
optional ``ImageSets/Main/<split>.txt`` listing the ids of a split.

Each ``<object>`` gives ``name``, ``difficult`` (kept as a field: uint8 [M]) and
``bndbox`` (``xmin ymin xmax ymax``, VOC's 1-based pixel indices, both ends inside the
box): the box in pixels is ``[xmin - 1, ymin - 1, xmax, ymax]``, as detectron2 reads
VOC. Sizes come from ``<size>``, else from the image's header. Categories are the
sorted names found (or the fixed map; a name outside it is refused unless
``AnnotationConfig.allow_new_categories``).

XML is parsed by expat with a tree builder of our own: a document with a DOCTYPE or
ENTITY declaration is refused before any entity is expanded (the billion-laughs and
external-entity attacks; defusedxml's rule, without the dependency), and a file over
``AnnotationConfig.max_file_bytes`` is not read. Skips: an unreadable or refused XML, a
missing image, a box that is not four finite numbers of positive size or lies wholly
outside the image (one partly outside is clipped), an image with more than
``AnnotationConfig.max_boxes`` objects.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from pathlib import Path
from xml.parsers import expat

from ...errors import InputError
from ..common import read_regular
from .model import (
    AnnotationConfig,
    Annotations,
    CategoryMap,
    Report,
    check_rel,
    header_size,
    resolve_categories,
    targets_from,
)


class UnsafeXML(ValueError):
    """An XML document that declares a DOCTYPE or entities: refused, never expanded."""


def parse_xml(data: bytes) -> ET.Element:
    """The root element of ``data``. Raises :class:`UnsafeXML` at a DOCTYPE, ENTITY or
    external-entity declaration (before any expansion), :class:`ValueError` for XML
    that is not well formed."""
    builder = ET.TreeBuilder()
    p = expat.ParserCreate()

    def refuse(what: str):
        def handler(*_args: object) -> None:
            raise UnsafeXML(
                f"declares {what}; VOC annotations have none, and they are not expanded"
            )

        return handler

    p.StartDoctypeDeclHandler = refuse("a DOCTYPE")
    p.EntityDeclHandler = refuse("an ENTITY")
    p.UnparsedEntityDeclHandler = refuse("an unparsed ENTITY")
    p.ExternalEntityRefHandler = refuse("an external entity")
    p.StartElementHandler = lambda tag, attrs: builder.start(tag, attrs)
    p.EndElementHandler = lambda tag: builder.end(tag)
    p.CharacterDataHandler = builder.data
    p.buffer_text = True
    try:
        p.Parse(data, True)
    except expat.ExpatError as e:
        raise ValueError(
            f"not well-formed XML ({expat.ErrorString(e.code)} at line {e.lineno})"
        ) from None
    return builder.close()


def _text(el: ET.Element | None, path: str) -> str | None:
    node = el.find(path) if el is not None else None
    return node.text.strip() if node is not None and node.text is not None else None


def _read_xml(path: Path, config: AnnotationConfig) -> ET.Element:
    data = read_regular(
        path, config.max_file_bytes, "a VOC annotation (AnnotationConfig.max_file_bytes)"
    )
    try:
        return parse_xml(data)
    except UnsafeXML as e:
        raise InputError(f"{path.name}: {e}") from None
    except ValueError as e:
        raise InputError(f"{path.name}: {e}") from None


def voc_ids(root: Path, split: str | None, max_bytes: int) -> list[str]:
    """The annotation ids of ``split`` (``ImageSets/Main/<split>.txt``) or every XML."""
    ann = root / "Annotations"
    if split is None:
        return sorted(p.relative_to(ann).as_posix()[:-4] for p in ann.rglob("*.xml"))
    listing = root / "ImageSets" / "Main" / f"{split}.txt"
    if not listing.is_file():
        raise InputError(
            f"{listing}: no such split listing; VOC splits are ImageSets/Main/<split>.txt "
            "(AnnotationConfig.split)",
            field="AnnotationConfig.split",
        )
    text = read_regular(listing, max_bytes, "a VOC split listing").decode("utf-8", "replace")
    return [ln.split()[0] for ln in text.splitlines() if ln.strip()]


def read_voc(
    root: str | os.PathLike[str],
    config: AnnotationConfig = AnnotationConfig(),  # noqa: B008 (frozen)
) -> Annotations:
    """Read a Pascal VOC folder. Returns :class:`Annotations` (format ``"voc"``),
    ``root`` the ``JPEGImages`` folder, images sorted by file, ``difficult`` set."""
    root = Path(root)
    ann_dir = root / "Annotations"
    images = Path(config.images) if config.images is not None else root / "JPEGImages"
    for d in (ann_dir, images):
        if not d.is_dir():
            raise InputError(f"{d}: no such folder; a VOC set has Annotations/ and JPEGImages/")
    report = Report(config)
    parsed = []
    for aid in voc_ids(root, config.split, config.max_file_bytes):
        xml_path = ann_dir / f"{aid}.xml"
        src = str(xml_path)
        report.source = src
        if check_rel(aid) is not None:
            report.skip(aid, check_rel(aid) or "", source=src)
            continue
        try:
            doc = _read_xml(xml_path, config)
        except InputError as e:
            report.skip(f"{aid}.xml", str(e), source=src)
            continue
        rel = _text(doc, "filename") or f"{aid}.jpg"
        why = check_rel(rel)
        if why is not None:
            report.skip(f"{aid}.xml", why, source=src)
            continue
        if not (images / rel).is_file():
            report.skip(rel, f"named by {xml_path.name}, but not found under {images}", source=src)
            continue
        objects = doc.findall("object")
        if len(objects) > config.max_boxes:
            report.too_many(rel, len(objects))
            continue
        parsed.append((aid, rel, src, doc, objects))

    found = sorted({n for *_, objects in parsed for o in objects if (n := _text(o, "name"))})
    fixed = config.category_map()
    try:
        found_map = CategoryMap.build(found)
    except InputError as e:
        raise InputError(f"{ann_dir}: {e}") from None
    cats = resolve_categories(found_map, fixed, config.allow_new_categories, source=str(ann_dir))
    index = cats.index_of_name
    out = []
    for aid, rel, src, doc, objects in parsed:
        report.source = src
        size = _size(doc)
        if size is None:
            try:
                size = header_size(images / rel)
            except Exception as err:
                report.skip(
                    rel,
                    f"no <size> in {aid}.xml and the image's header cannot be read ({err})",
                    source=src,
                )
                continue
        boxes, labels, difficult = [], [], []
        for k, o in enumerate(objects):
            name = _text(o, "name")
            if not name:
                report.skip(rel, f"object {k} has no <name>", k, source=src)
                continue
            vals = [_text(o, f"bndbox/{t}") for t in ("xmin", "ymin", "xmax", "ymax")]
            try:
                x1, y1, x2, y2 = (float(v) for v in vals)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                report.skip(
                    rel, f"object {k} ({name}): bndbox {vals} is not four numbers", k, source=src
                )
                continue
            box = report.box((x1 - 1, y1 - 1, x2, y2), size, rel, k)
            if box is None:
                continue
            d = _text(o, "difficult") or "0"
            boxes.append(box)
            labels.append(index[name])
            difficult.append(1 if d not in ("0", "") else 0)
        out.append(targets_from(rel, size, boxes, labels, image_id=aid, difficult=difficult))
    return report.finish("voc", images, cats, out, sources=[str(ann_dir)])


def _size(doc: ET.Element) -> tuple[int, int] | None:
    try:
        w = int(float(_text(doc, "size/width") or ""))
        h = int(float(_text(doc, "size/height") or ""))
    except ValueError:
        return None
    return (h, w) if h > 0 and w > 0 else None
