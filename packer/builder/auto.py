"""``imgpack build --device auto``: the CPU workers or the GPU, whichever finishes first.

The rule (:func:`gpu_pays`), from the job's size and the machine, before torch is
imported (a CPU build never imports it)::

    CPU build:  n / (workers * CPU_IMG_S_PER_WORKER)
    GPU build:  GPU_START_S + n / GPU_IMG_S

The GPU is taken when its estimate is shorter by ``MARGIN`` (so a near tie, where the
estimates' error decides, stays on the CPU), the pack stores raw rows (``--store jpeg``
decodes nothing), a CUDA device is there, and a batched JPEG decoder starts on it
(nvImageCodec, torchcodec or torchvision: the last comes with torch's CUDA wheels). Every
other case builds on the CPU. The constants are measured (their figures, machine and
date: docs/PERFORMANCE.md, section "Figures behind the code", row "device auto
constants"; the thresholds they give: section "``--device auto``"):

* ``CPU_IMG_S_PER_WORKER``: the CPU build's rate over its worker count;
* ``GPU_START_S``: what a fresh process spends before the GPU decodes its first batch
  (importing torch and torchvision, the CUDA context, the decoder's handles, the crop
  kernel);
* ``GPU_IMG_S``: the warm GPU build's rate once started, pack on local disk.

They were taken on 640x480 inputs; larger inputs cost the CPU more per image than the
GPU, so the rule errs toward the CPU for them, never toward a slower build than the CPU's.
"""

from __future__ import annotations

from typing import Any

CPU_IMG_S_PER_WORKER = 222.0
GPU_START_S = 12.0
GPU_IMG_S = 9_000.0
MARGIN = 1.15


def estimates(n: int, workers: int) -> tuple[float, float]:
    """(CPU build seconds, GPU build seconds) estimated for ``n`` images, ``workers``."""
    cpu = n / (max(1, workers) * CPU_IMG_S_PER_WORKER)
    gpu = GPU_START_S + n / GPU_IMG_S
    return cpu, gpu


def gpu_pays(n: int, workers: int) -> bool:
    """Whether a GPU build of ``n`` images would beat ``workers`` CPU workers by ``MARGIN``."""
    cpu, gpu = estimates(n, workers)
    return gpu * MARGIN < cpu


def auto_device(config: Any, n: int, workers: int) -> Any:
    """``--device auto``: the torch.device to build on, or None for the CPU workers.
    CUDA and a decoder are looked for only when the job is large enough to pay."""
    if not config.kind.gpu_build or not gpu_pays(n, workers):
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    from ..imaging.decoders import _import

    try:  # torchvision's nvjpeg decoder: the last of the chain, there with torch's CUDA
        _import("torchvision.io")
    except ImportError:
        return None
    return torch.device("cuda")


__all__ = [
    "CPU_IMG_S_PER_WORKER",
    "GPU_IMG_S",
    "GPU_START_S",
    "MARGIN",
    "auto_device",
    "estimates",
    "gpu_pays",
]
