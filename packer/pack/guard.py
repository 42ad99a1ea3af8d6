"""tensordict's loaders made safe on a pack: the hook :func:`install` puts on its metadata reader.

tensordict's loaders (``TensorDict.load_memmap``, ``tensordict.load_memmap``,
``tensordict.load``, any tensorclass's ``load_memmap``) first read a folder's
``meta.json`` with ``tensordict.base._load_metadata``; that file alone picks the class
whose loader runs, and most of those unpickle ``other.pickle``. The hook makes the
reader refuse a pack (a folder holding imgpack's manifest) whose metadata is not exactly
imgpack's, before anything else of the folder is read, and registers ``ImagePack`` so a
clean pack is handed to :func:`packer.load`. Other folders load as before.

``import packer`` installs it (:func:`install`), without importing tensordict or torch:
if tensordict is imported already, the reader is wrapped at once; otherwise a one-shot
import hook wraps it as soon as ``import tensordict`` has finished. tensordict keeps
its own references to the reader in several modules (``tensordict.base``,
``tensordict._base.serialization``, ``tensordict._td``); every one is replaced. Only
the standard library is imported here: the checks themselves are imported when a
folder is read.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import threading
from typing import Any

_READER = "_load_metadata"
_lock = threading.Lock()


def refuse_unchecked(prefix: Any) -> None:
    """What tensordict's loaders call before reading a directory's ``meta.json``: a pack
    whose ``meta.json`` is not exactly imgpack's is refused (``PackFormatError``). A
    pack's ``_tensordict`` folder (which tensordict reads as a TensorDict) is let through
    only after the pack's checks (no pickle or other file, sizes as the manifest says)
    and with its ``meta.json`` as imgpack writes it. A clean pack goes on to
    ``ImagePack._load_memmap``, that is :func:`packer.load`."""
    if not isinstance(prefix, (str, os.PathLike)):
        return  # a member of a tensordict archive file, not a folder
    from pathlib import Path

    from .files import check_files, check_tensordict_meta, read_manifest
    from .schema import DATA_DIR, MANIFEST
    from .writer import check_data_meta

    path = Path(prefix)
    if os.path.lexists(path / MANIFEST):
        check_tensordict_meta(path)
        # tensordict finds the class meta.json names among the classes imported so far:
        # register ImagePack, whose loader is packer.load
        from . import reader  # noqa: F401
    elif path.name == DATA_DIR and os.path.lexists(path.parent / MANIFEST):
        m = read_manifest(path.parent)
        check_files(path.parent, m)
        check_data_meta(path.parent, m)


def _wrap(read: Any) -> Any:
    def _load_metadata(prefix: Any) -> Any:
        refuse_unchecked(prefix)
        return read(prefix)

    _load_metadata._imgpack_guard = True  # type: ignore[attr-defined]
    _load_metadata._imgpack_unguarded = read  # type: ignore[attr-defined]
    _load_metadata.__doc__ = read.__doc__
    return _load_metadata


def guard_loaded() -> bool:
    """Wrap tensordict's metadata reader wherever a loaded tensordict module holds it.
    Returns False where tensordict (its ``base`` module) is not loaded yet."""
    base = sys.modules.get("tensordict.base")
    if base is None or not hasattr(base, _READER):
        return False
    with _lock:
        current = getattr(base, _READER)
        original = getattr(current, "_imgpack_unguarded", current)
        guarded = current if getattr(current, "_imgpack_guard", False) else _wrap(original)
        for name, module in list(sys.modules.items()):
            ours = name == "tensordict" or name.startswith("tensordict.")
            if ours and getattr(module, _READER, None) is original:
                setattr(module, _READER, guarded)
    return True


def installed() -> bool:
    """Whether the hook is in force: on every loaded reference, or waiting for tensordict."""
    if "tensordict.base" in sys.modules:
        refs = [
            getattr(m, _READER)
            for n, m in list(sys.modules.items())
            if (n == "tensordict" or n.startswith("tensordict.")) and hasattr(m, _READER)
        ]
        return all(getattr(r, "_imgpack_guard", False) for r in refs)
    return any(isinstance(f, _Finder) for f in sys.meta_path)


class _Loader(importlib.abc.Loader):
    """Runs tensordict's own loader, then wraps the reader in what it loaded."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.inner.exec_module(module)  # type: ignore[attr-defined]
        guard_loaded()

    def __getattr__(self, name: str) -> Any:  # resource readers and the like
        return getattr(self.inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when ``tensordict`` is imported, it asks the other finders
    for the spec and wraps the spec's loader. It stays in place, so a tensordict
    imported again (after ``del sys.modules[...]``) is guarded too."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "tensordict":
            return None
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, _Finder):
                continue
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


def install() -> None:
    """Put the hook on tensordict's metadata reader now, or as soon as tensordict is
    imported. Idempotent; imports nothing outside the standard library."""
    if guard_loaded():
        return
    with _lock:
        if not any(isinstance(f, _Finder) for f in sys.meta_path):
            sys.meta_path.insert(0, _Finder())
