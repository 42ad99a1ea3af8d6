"""The images under an object-store prefix, as :mod:`packer.sources.scan` finds them in a
folder: the same layouts, the same order, from one listing of keys (no network here).

A bucket has no folders: a key's first path component is its class folder (ImageFolder:
keys at the top are ignored when there are class folders), and a class is a prefix that
holds at least one object. Each entry's size and ETag (:attr:`BucketScan.objects`) are
the stamps its shard's name is made from, as a file's size and mtime are on disk.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InputError
from .scan import IMAGE_EXTENSIONS, Entry, Scan, is_image_name, is_own_name


@dataclass(frozen=True)
class BucketScan(Scan):
    """A :class:`Scan` of a bucket prefix: ``url`` (``s3://bucket/prefix``) and, for each
    listed image, ``objects[rel] = (size in bytes, ETag)``. ``root`` is only a name."""

    url: str = ""
    objects: dict[str, tuple[int, str]] = field(default_factory=dict)


def _order(rels: list[str]) -> list[str]:
    # walk_images' order: by folder path, then file name
    return sorted(rels, key=lambda r: (posixpath.dirname(r), posixpath.basename(r)))


def _usable(rel: str) -> bool:
    parts = rel.split("/")
    return all(p and not is_own_name(p) for p in parts) and is_image_name(parts[-1])


def bucket_scan(url: str, listing: list[tuple[str, int, str]], *, tree: bool = True) -> BucketScan:
    """The images of ``listing`` (``(key, size, ETag)``, keys relative to ``url``).

    ``tree``: as :func:`~packer.sources.scan.scan_tree` (class folders, or a flat prefix
    of images labelled -1); else as :func:`~packer.sources.scan.list_images` (every
    image at any depth, label -1: for a label table). InputError if there is none."""
    objects = {k: (size, etag) for k, size, etag in listing if _usable(k)}
    classes: list[str] = []
    if tree:
        top = {k.split("/", 1)[0] for k, _, _ in listing if "/" in k}
        classes = sorted(c for c in top if c and not is_own_name(c))
    if classes:
        index = {c: i for i, c in enumerate(classes)}
        rels = [r for r in objects if "/" in r]
        entries = [Entry(r, index[r.split("/", 1)[0]]) for r in _order(rels)]
        entries.sort(key=lambda e: e.label)  # stable: class by class, as scan_tree
    else:
        rels = [r for r in objects if "/" not in r] if tree else list(objects)
        entries = [Entry(r, -1) for r in _order(rels)]
    if not entries:
        raise InputError(
            f"{url}: no images found (looked for {', '.join(IMAGE_EXTENSIONS)} in any case)"
        )
    keep = {e.rel: objects[e.rel] for e in entries}
    return BucketScan(root=Path(url), classes=classes, entries=entries, url=url, objects=keep)
