"""The writer: ``imgpack build``: config, worker processes, the GPU path, finalize
and the crash-safe work folder beside the destination.

``packer.build.build`` is :func:`packer.build_pack`.
"""

from __future__ import annotations

from typing import Any

_LAZY = {"build": "run", "BuildConfig": "config", "BuildResult": "config"}


def __getattr__(name: str) -> Any:
    import importlib

    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'packer.build' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"packer.build.{module}"), name)
    globals()[name] = value
    return value
