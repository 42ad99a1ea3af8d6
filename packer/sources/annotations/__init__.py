"""Annotation sources: COCO JSON, YOLO, Pascal VOC and image + mask folders, read into
one model (:class:`ImageTargets` per image, one :class:`CategoryMap`), bad annotations
skipped with a per-image reason or refused (``AnnotationConfig.strict``).

Nothing here decodes an image (sizes come from the annotations or image headers) or
writes a pack. :func:`read_annotations` detects a folder's layout or takes a named one.
"""

from .detect import FORMATS, Layout, detect_layout, read_annotations
from .model import (
    AnnotationConfig,
    Annotations,
    CategoryMap,
    ImageTargets,
    Skip,
    load_category_map,
    resolve_categories,
)

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
