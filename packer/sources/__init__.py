"""What comes in: scanning a tree of images, the class map, label tables, and annotations
(COCO, YOLO, VOC, mask folders: :mod:`packer.sources.annotations`).

Nothing here decodes a pixel or writes a pack.
"""
