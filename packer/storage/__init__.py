"""Where the bytes are: a path, a pack set or an object-storage URL, decided once
(:mod:`packer.storage.open`); pack sets (:mod:`packer.storage.packset`), and sets at
``s3://``, ``gs://`` and ``az://`` URLs (obstore, the ``imgpack[cloud]`` extra) through the
bounded, node-shared local cache readers stream them through.

``load`` is ``packer.load``; the cache's rules are in :mod:`packer.storage.cache`.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "load": "open",
    "where": "open",
    "PackSet": "packset",
    "open_remote": "remote",
    "RemoteShards": "cache",
    "default_cache_dir": "cache",
    "is_url": "url",
    "parse_url": "url",
}


def __getattr__(name: str) -> Any:
    import importlib

    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'packer.storage' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"packer.storage.{module}"), name)
    globals()[name] = value
    return value
