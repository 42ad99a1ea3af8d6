"""``run_bench``: the entry point of ``imgpack bench``, running the sections asked for."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from ..._interrupts import temporary_folder
from ..timing import resolve_device
from .config import BenchConfig, BenchResult, count_points
from .loading import prepare_data, run_loading, run_training
from .transfer import run_transfer

if TYPE_CHECKING:
    import torch

TRANSFER_ON_CPU = (
    "transfer times host-to-GPU copies over the bus; without a GPU there is no bus to "
    "cross (a copy is a memcpy in RAM); use a machine with a GPU"
)


def machine_info(device: torch.device) -> dict[str, Any]:
    import platform

    import torch

    info: dict[str, Any] = {
        "cores": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def run_bench(
    cfg: BenchConfig | None = None,
    progress: Callable[[int], None] | None = None,
    on_start: Callable[[int, int], None] | None = None,
) -> BenchResult:
    """Run the experiments of ``cfg``; every measured point is in the result.

    Raises PackerError for unusable options (no CUDA for ``device="cuda"``, a
    source folder without images).
    """
    import torch

    t0 = time.perf_counter()
    cfg = cfg or BenchConfig()
    cfg.validate()
    device = resolve_device(cfg.device, "BenchConfig.device")
    cuda = device.type == "cuda"
    cores = os.cpu_count() or 1
    workers = cfg.resolved_workers(cores)
    result = BenchResult(
        device=str(device),
        device_name=torch.cuda.get_device_name(device) if cuda else "CPU",
        quick=cfg.quick,
        machine=machine_info(device),
        grid=asdict(cfg.grid),
    )
    result.grid["workers"] = workers
    tick = (lambda: progress(1)) if progress else (lambda: None)
    if on_start:
        on_start(count_points(cfg, cuda), 0)
    wants_data = "loading" in cfg.sections or ("training" in cfg.sections and cuda)
    if "training" in cfg.sections and not cuda:
        result.skip("training", "all", "training runs on CUDA only; use a machine with a GPU")
    if "transfer" in cfg.sections and not cuda:
        # its tables read as bus bandwidth; on the CPU every "copy" is a memcpy in RAM
        result.skip("transfer", "all", TRANSFER_ON_CPU)
    if wants_data:
        # made and removed whole, whenever an interrupt comes (packer/_interrupts.py)
        with temporary_folder("imgpack-bench-") as tmp:
            paths = prepare_data(cfg, tmp, result)
            if "loading" in cfg.sections:
                run_loading(cfg, paths, device, workers, result, tick)
            if "training" in cfg.sections and cuda:
                run_training(cfg, paths, device, workers, result, tick)
    # last: its multi-GB buffers stay in torch's caching allocators, and PackLoader measured
    # after them ran slower (docs/PERFORMANCE.md, section "Figures behind the code", row
    # "imgpack bench order")
    if "transfer" in cfg.sections and cuda:
        run_transfer(cfg, device, result, tick)
    result.seconds = time.perf_counter() - t0
    return result
