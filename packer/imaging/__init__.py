"""Pixels: decoders, transforms and normalization, batched on the CPU or CUDA.
The augmentation ops live here; their public names are in ``packer.transforms``."""
