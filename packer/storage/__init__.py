"""Object storage: pack sets at ``s3://``, ``gs://`` and ``az://`` URLs (obstore, the
``imgpack[cloud]`` extra), and the bounded, node-shared local cache readers stream them through.

``open_remote`` is ``packer.load(URL)``; the cache's rules are in :mod:`packer.storage.cache`.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
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
