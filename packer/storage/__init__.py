"""Where the bytes are: a path, a pack set or an object-storage URL, decided once
(:mod:`packer.storage.open`); pack sets (:mod:`packer.storage.packset`), and sets at
``s3://``, ``gs://`` and ``az://`` URLs (obstore, the ``imgpack[cloud]`` extra) through the
bounded, node-shared local cache readers stream them through.

``load`` is ``packer.load``; the cache's rules are in :mod:`packer.storage.cache`.
"""

from __future__ import annotations

from .._lazy import lazy_getattr

_LAZY = {
    "load": ".open",
    "where": ".open",
    "PackSet": ".packset",
    "open_remote": ".remote",
    "RemoteShards": ".cache",
    "default_cache_dir": ".cache",
    "is_url": ".url",
    "parse_url": ".url",
}


__getattr__ = lazy_getattr(__name__, _LAZY)
