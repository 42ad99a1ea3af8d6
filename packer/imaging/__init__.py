"""Pixels: decoders, transforms and normalization, batched on the CPU or CUDA.
Augmentation ops live here; their public names are in ``packer.transforms``."""

# packer.transforms re-exports the ops defined here, which subclass its helpers:
# loading it first lets any module of this package be the first one imported.
from .. import transforms as _transforms  # noqa: F401
