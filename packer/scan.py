"""Find the images under a source folder, in a deterministic order.

Two layouts:

* an ImageFolder tree (``root/<class>/**/<image>``): classes are the sorted
  names of root's subfolders, indexed exactly as ``torchvision.datasets.ImageFolder``
  assigns them, and files are ordered as ImageFolder orders them (by folder path,
  then file name). Files directly in root are ignored, as ImageFolder does.
* a flat folder of images: no classes, every label is -1.

Images are found by extension in any case; other files are ignored, not failures.
Symbolic links are followed (as ImageFolder does), also when they point outside
root; a link that leads back into a folder already being walked is skipped, so a
symlink loop ends instead of recursing forever.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from .errors import InputError

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")


@dataclass(frozen=True)
class Entry:
    """One source image: its path relative to the root (POSIX form) and its label."""

    rel: str
    label: int


@dataclass(frozen=True)
class Scan:
    root: Path
    classes: list[str]
    entries: list[Entry]


def is_image_name(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS)


def walk_images(top: Path) -> list[str]:
    """Image paths under ``top`` as absolute strings, ImageFolder's order, loop-safe."""
    found: list[tuple[str, str]] = []
    seen: set[tuple[int, int]] = set()
    for dirpath, dirnames, filenames in os.walk(top, followlinks=True):
        try:
            st = os.stat(dirpath)
        except OSError as e:
            log.warning("cannot read folder %s: %s", dirpath, e)
            dirnames[:] = []
            continue
        key = (st.st_dev, st.st_ino)
        if key in seen:
            log.warning(
                "skipping %s: a symlink loop leads back to a folder already scanned", dirpath
            )
            dirnames[:] = []
            continue
        seen.add(key)
        found.extend((dirpath, f) for f in filenames if is_image_name(f))
    found.sort()
    return [os.path.join(d, f) for d, f in found]


def scan_tree(src: str | os.PathLike[str]) -> Scan:
    """List the images under ``src``; raise :class:`InputError` if there are none.

    Raises InputError when ``src`` is missing, is not a folder, or holds no image.
    """
    root = Path(src)
    if not root.exists():
        raise InputError(f"{root}: no such folder; check the path")
    if not root.is_dir():
        raise InputError(f"{root}: is a file, not a folder; give the folder that holds the images")
    try:
        top = sorted(os.scandir(root), key=lambda e: e.name)
    except PermissionError as e:
        raise InputError(
            f"{root}: cannot list the folder ({e.strerror}); check its permissions"
        ) from e
    class_dirs = [e.name for e in top if e.is_dir()]
    entries: list[Entry] = []
    classes: list[str] = []
    if class_dirs:
        classes = class_dirs
        loose = [e.name for e in top if e.is_file() and is_image_name(e.name)]
        if loose:
            log.warning(
                "%s: %d image(s) directly in the root are ignored (ImageFolder layout: "
                "images go in class folders)",
                root,
                len(loose),
            )
        for label, name in enumerate(classes):
            for path in walk_images(root / name):
                entries.append(Entry(Path(os.path.relpath(path, root)).as_posix(), label))
    else:
        for e in top:
            if e.is_file() and is_image_name(e.name):
                entries.append(Entry(e.name, -1))
    if not entries:
        raise InputError(
            f"{root}: no images found (looked for {', '.join(IMAGE_EXTENSIONS)} in any case, "
            "in class subfolders or directly in the folder)"
        )
    return Scan(root=root, classes=classes, entries=entries)
