"""Annotation sources: COCO JSON, YOLO, Pascal VOC and image + mask folders, read into
one model (:class:`ImageTargets` per image, one :class:`CategoryMap`), bad annotations
skipped with a per-image reason or refused (``AnnotationConfig.strict``).

Nothing here decodes an image (sizes come from the annotations or image headers) or
writes a pack. :func:`read_annotations` detects a folder's layout or takes a named one.
"""

from __future__ import annotations

from ..._lazy import lazy_getattr

# names handed out when first asked for: the readers (COCO, VOC, YOLO, masks) load only
# for a build that reads annotations, not with the model a folder build's plan checks
_LAZY = {
    "FORMATS": ".model",
    "AnnotationConfig": ".model",
    "Annotations": ".model",
    "CategoryMap": ".model",
    "ImageTargets": ".model",
    "Skip": ".model",
    "load_category_map": ".model",
    "resolve_categories": ".model",
    "Layout": ".detect",
    "detect_layout": ".detect",
    "read_annotations": ".detect",
}

__all__ = [
    "FORMATS",
    "AnnotationConfig",
    "Annotations",
    "CategoryMap",
    "ImageTargets",
    "Layout",
    "Skip",
    "detect_layout",
    "load_category_map",
    "read_annotations",
    "resolve_categories",
]

__getattr__ = lazy_getattr(__name__, _LAZY)
