"""``imgpack bench``: the questions behind imgpack, measured on this machine.

Three experiments, each a list of points (one dict per measurement):

transfer    a batch of images from host memory to the device: uint8 vs
            float16 vs float32, pinned vs pageable memory, over batch and image
            sizes; and the order of conversion: ``x.cuda().half()`` (copy
            uint8, convert on the device) vs ``x.half().cuda()`` (convert on
            the host, copy twice the bytes).
loading     images/s delivered to the device, normalized, by: the original
            JPEG folder (ImageFolder + Pillow + DataLoader workers), the same
            folder after ``imgpack compress``, the pack read on the CPU, and
            the pack streamed to the device by PackLoader.
training    ResNet-18 with bf16 autocast fed by each loader, and by batches
            already on the GPU (the ceiling). CUDA only.

Timing: warm-up first, the device synchronized before every clock read, the
median of repeats. Data: synthetic photo-like JPEGs (see :mod:`packer.measure.bench.synth`)
or, with ``source``, an even sample of the user's images, written to a
temporary folder that is removed at the end.

A peer of ``verify``, not part of the core: nothing in ``packer`` imports it but the
CLI. Modules: ``config`` (sections, grids, options, forecast), ``transfer``,
``loading`` (loading and training), ``run`` (the entry point), ``report`` (tables
and files), ``plots``, ``synth`` (synthetic images and packs).
"""

from __future__ import annotations

from .config import (
    FULL,
    QUICK,
    SECTIONS,
    BenchConfig,
    BenchResult,
    Grid,
    count_points,
    estimate_seconds,
)
from .report import to_markdown, write_results
from .run import machine_info, run_bench

__all__ = [
    "FULL",
    "QUICK",
    "SECTIONS",
    "BenchConfig",
    "BenchResult",
    "Grid",
    "count_points",
    "estimate_seconds",
    "machine_info",
    "run_bench",
    "to_markdown",
    "write_results",
]
