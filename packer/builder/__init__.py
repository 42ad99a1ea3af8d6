"""The writer: ``imgpack build``: config, worker processes, the GPU path, finalize
and the crash-safe work folder beside the destination.

``packer.builder.build`` is :func:`packer.build_pack`: :mod:`packer.builder.api` decides
once whether a job is one pack, a pack set, a set in a bucket, or a Ray cluster's.
"""

from __future__ import annotations

from .._lazy import lazy_getattr

_LAZY = {
    "build": ".api",
    "BuildConfig": ".config",
    "BuildResult": ".config",
    "DenseOptions": ".dense",
}


__getattr__ = lazy_getattr(__name__, _LAZY)
