"""Find the images under a source folder, in a deterministic order.

Two layouts:

* an ImageFolder tree (``root/<class>/**/<image>``): classes are the sorted
  names of root's subfolders, indexed exactly as ``torchvision.datasets.ImageFolder``
  assigns them, and files are ordered as ImageFolder orders them (by folder path,
  then file name). Files directly in root are ignored, as ImageFolder does.
* a flat folder of images: no classes, every label is -1.

For labels from a table (``--labels``), :func:`list_images` lists every image under
root, at any depth (files directly in root included), in the same order, label -1:
the table, not the folder, says what each image is.

Images are found by extension in any case; other files are ignored, not failures.
Symbolic links are followed (as ImageFolder does), also when they point outside
root; a link that leads back into a folder already being walked is skipped, so a
symlink loop ends instead of recursing forever.

Never listed: imgpack's own files and folders (hidden names holding
``imgpack-``: compress's temporary files and options record, a build's work
and old-pack folders), so a dead run's leftovers never become images.
Reported as skips, with the reason, instead of silently missing: folders that
cannot be read, and names that are not valid UTF-8 (a pack's manifest is JSON).
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from .._fs import file_kind
from ..errors import InputError

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
    # what could not be listed: {"path": relative to root, "reason": why}
    skipped: list[dict[str, str]] = field(default_factory=list)


OUTSIDE = "a link leading outside the source folder"


def source_image(
    real_root: str, rel: str, links_out: bool = False
) -> tuple[str | None, str | None]:
    """Where to read source image ``rel`` (a pack's relative POSIX source path) under the
    folder whose real path (:func:`os.path.realpath`) is ``real_root``: ``(path, None)``,
    or ``(None, why)`` when it must not be read: ``"missing"``, :data:`OUTSIDE` (links are
    followed only inside the folder, unless ``links_out``: for a folder of links the
    caller made itself), not an image file name (a build lists no other), not a regular
    file, or empty. Nothing is opened; read the path through :func:`open_if_regular`,
    so a file swapped for a FIFO since is still never read.

    A manifest names the files, so it must not make a reader open ``/proc/self/environ``
    or a device: see ``imgpack verify``, which re-reads the sources.
    """
    if not is_image_name(rel.rsplit("/", 1)[-1]):
        return None, "not an image file name"
    real = os.path.realpath(os.path.join(real_root, rel))
    if not links_out and os.path.commonpath([real_root, real]) != real_root:
        return None, OUTSIDE
    try:
        st = os.stat(real)
    except FileNotFoundError:
        return None, "missing"
    except OSError as e:
        return None, f"cannot be read ({e.strerror})"
    if not stat.S_ISREG(st.st_mode):
        return None, f"not a regular file ({file_kind(st.st_mode)})"
    if st.st_size == 0:
        return None, "empty"
    return real, None


def is_image_name(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS) and not is_own_name(name)


def is_own_name(name: str) -> bool:
    """A name imgpack gives its own temporary or bookkeeping files and folders."""
    return name.startswith(".") and "imgpack-" in name


def printable(path: str) -> str:
    """``path`` with bytes that are not UTF-8 shown as ``\\xNN`` (safe to print or store)."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _valid_utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
        return True
    except UnicodeEncodeError:  # os.listdir's surrogate escapes of undecodable bytes
        return False


NOT_UTF8 = "file name is not valid UTF-8; rename it"


def walk_images(
    top: Path,
    skipped: list[tuple[str, str]] | None = None,
    followed: list[str] | None = None,
) -> list[str]:
    """Image paths under ``top`` as absolute strings, ImageFolder's order, loop-safe.

    What cannot be used is appended to ``skipped`` as (absolute path, reason):
    folders that cannot be read, and names that are not valid UTF-8. Without
    ``skipped`` they are logged. ``followed``, when given, gets the real path
    (symbolic links resolved) of every folder scanned: a writer checks its
    output is under none of them, also where a link leads back into it.
    """
    if skipped is None:
        found_skips: list[tuple[str, str]] = []
        paths = walk_images(top, found_skips, followed)
        for path, reason in found_skips:
            log.warning("skipping %s: %s", printable(path), reason)
        return paths
    found: list[tuple[str, str]] = []
    seen: set[tuple[int, int]] = set()

    def unreadable(e: OSError) -> None:
        skipped.append((str(e.filename or top), f"cannot read this folder ({e.strerror})"))

    for dirpath, dirnames, filenames in os.walk(top, onerror=unreadable, followlinks=True):
        try:
            st = os.stat(dirpath)
        except OSError as e:
            skipped.append((dirpath, f"cannot read this folder ({e.strerror})"))
            dirnames[:] = []
            continue
        key = (st.st_dev, st.st_ino)
        if key in seen:
            # expected and handled (the folder's images are listed once): not a warning
            log.info("skipping %s: a symlink loop leads back to a folder already scanned", dirpath)
            dirnames[:] = []
            continue
        seen.add(key)
        if followed is not None:
            followed.append(os.path.realpath(dirpath))
        for d in list(dirnames):
            if is_own_name(d):
                dirnames.remove(d)
            elif not _valid_utf8(d):
                dirnames.remove(d)
                skipped.append((os.path.join(dirpath, d), "folder " + NOT_UTF8))
        for f in filenames:
            if is_image_name(f):
                if _valid_utf8(f):
                    found.append((dirpath, f))
                else:
                    skipped.append((os.path.join(dirpath, f), NOT_UTF8))
    found.sort()
    return [os.path.join(d, f) for d, f in found]


def _source_root(src: str | os.PathLike[str]) -> Path:
    root = Path(src)
    if not root.exists():
        raise InputError(f"{root}: no such folder; check the path")
    if not root.is_dir():
        raise InputError(f"{root}: is a file, not a folder; give the folder that holds the images")
    return root


def relative(path: str, root: Path) -> str:
    """``path``, found under ``root`` by :func:`walk_images`, relative to it in POSIX form.

    os.walk joins names onto the folder given: a path under it starts with its text,
    so slicing gives relpath's answer without its per-file normalisation (seconds for
    a million files).
    """
    prefix = str(root) + os.sep
    rel = path[len(prefix) :] if path.startswith(prefix) else os.path.relpath(path, root)
    return rel.replace(os.sep, "/")


def _relative_skips(root: Path, skips: list[tuple[str, str]]) -> list[dict[str, str]]:
    skipped = [{"path": printable(relative(p, root)), "reason": r} for p, r in skips]
    for s in skipped:
        log.warning("skipping %s: %s", s["path"], s["reason"])
    return skipped


def list_images(src: str | os.PathLike[str]) -> Scan:
    """Every image under ``src`` at any depth, ImageFolder's order, each labelled -1.

    For a label table: images directly in ``src`` count too, and no folder is a class.
    Unreadable folders and names that are not UTF-8 are in ``skipped`` with the reason.
    Raises InputError when ``src`` is missing, is not a folder, or holds no image.
    """
    root = _source_root(src)
    try:
        with os.scandir(root):
            pass
    except PermissionError as e:
        raise InputError(
            f"{root}: cannot list the folder ({e.strerror}); check its permissions"
        ) from e
    skips: list[tuple[str, str]] = []
    paths = walk_images(root, skips)
    entries = [Entry(relative(p, root), -1) for p in paths]
    skipped = _relative_skips(root, skips)
    if not entries:
        raise InputError(
            f"{root}: no images found (looked for {', '.join(IMAGE_EXTENSIONS)} in any case, "
            "at any depth)"
        )
    return Scan(root=root, classes=[], entries=entries, skipped=skipped)


def scan_tree(src: str | os.PathLike[str]) -> Scan:
    """List the images under ``src``; raise :class:`InputError` if there are none.

    Raises InputError when ``src`` is missing, is not a folder, or holds no image.
    """
    root = _source_root(src)
    try:
        top = sorted(os.scandir(root), key=lambda e: e.name)
    except PermissionError as e:
        raise InputError(
            f"{root}: cannot list the folder ({e.strerror}); check its permissions"
        ) from e
    skips: list[tuple[str, str]] = []
    usable = []
    for e in top:
        if is_own_name(e.name):
            continue
        if not _valid_utf8(e.name):
            if e.is_dir() or is_image_name(e.name):
                skips.append((e.path, ("folder " if e.is_dir() else "") + NOT_UTF8))
            continue
        usable.append(e)
    class_dirs = [e.name for e in usable if e.is_dir()]
    entries: list[Entry] = []
    classes: list[str] = []
    if class_dirs:
        classes = class_dirs
        loose = [e.name for e in usable if e.is_file() and is_image_name(e.name)]
        if loose:
            log.warning(
                "%s: %d image(s) directly in the root are ignored (ImageFolder layout: "
                "images go in class folders)",
                root,
                len(loose),
            )
        for label, name in enumerate(classes):
            for path in walk_images(root / name, skips):
                entries.append(Entry(relative(path, root), label))
    else:
        for e in usable:
            if is_image_name(e.name) and not e.is_dir():
                entries.append(Entry(e.name, -1))
    skipped = _relative_skips(root, skips)
    if not entries:
        raise InputError(
            f"{root}: no images found (looked for {', '.join(IMAGE_EXTENSIONS)} in any case, "
            "in class subfolders or directly in the folder)"
        )
    return Scan(root=root, classes=classes, entries=entries, skipped=skipped)
