"""What comes in: scanning a tree of images, the class map, label tables, and annotations
(COCO, YOLO, VOC, mask folders: :mod:`packer.sources.annotations`).

Nothing here decodes an image or writes a pack (a semantic mask's class ids are read by
:func:`packer.sources.annotations.masks.read_semantic_mask`, for the build).
"""
