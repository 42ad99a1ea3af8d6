"""The pack on disk: the on-disk contract and its one reader.

The layout, the manifest schema and its version (``schema``), the storage kinds (the
interface ``kind``, one file each with its pack class: ``raw``, ``jpeg``; the registry
``kinds``), and opening a pack read-only (``reader``). Everything a pack holds is
checked here before use.
"""

from __future__ import annotations

from .._lazy import lazy_getattr

# tensordict's meta.json names the class as ``packer.pack.ImagePack`` (schema.TD_TYPE):
# tensordict.load_memmap resolves it here, so these names stay importable from this
# package, lazily (``import packer.pack.schema`` must not import torch).
_LAZY = {"ImagePack": ".reader", "JpegPack": ".jpeg", "open_pack": ".reader"}


__getattr__ = lazy_getattr(__name__, _LAZY)
