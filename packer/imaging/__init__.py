"""Pixels: decoders, transforms and normalization, on the CPU and on CUDA."""
