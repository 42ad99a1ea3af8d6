"""The writer: ``imgpack build``: config, worker processes, the GPU path, finalize
and the crash-safe work folder beside the destination.

``packer.builder.build`` is :func:`packer.build_pack`: :mod:`packer.builder.api` decides
once whether a job is one pack, a pack set, a set in a bucket, or a Ray cluster's.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "build": "api",
    "BuildConfig": "config",
    "BuildResult": "config",
    "DenseOptions": "dense",
}


def __getattr__(name: str) -> Any:
    import importlib

    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'packer.builder' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"packer.builder.{module}"), name)
    globals()[name] = value
    return value
