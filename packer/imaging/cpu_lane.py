"""A CPU lane for a JPEG-pack loader on CUDA: :class:`CpuLane`, one decoder of a
``decode=[...]`` list (batch ``b`` goes whole to decoder ``b % n``) that decodes and
crops its batches on CPU threads of its own, into pinned memory the loader copies to the
GPU on its stream, so a
machine whose cores idle beside the GPU decoders adds their throughput.

Each image goes through :func:`packer.imaging.jpeg.decode_crop_cpu` (libjpeg-turbo; only
the box resampled; at 1/2, 1/4 or 1/8 scale where the box is much larger than the output,
:mod:`packer.imaging.jpeg_scale`), so the lane's batch comes out at the output size, flipped:
the loader uses it as it is (``resizes``), no crop on the GPU.

Opt-in: ``decode=[*best_lanes(dev), cpu_lane(dev, threads)]``
(:func:`packer.imaging.decoders_split.cpu_lane`); whether it pays beside the GPU
decoders is measured by ``benchmarks/dali.py --decodes cpu-lane:K``.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from ..errors import UsageError
from .decoders import CpuDecoder

_TASK = 4  # images a thread's task takes at most (one submit per image costs GIL)


class CpuLane(CpuDecoder):
    """Decodes whole batches on ``threads`` CPU threads of its own for a loader on
    ``device`` (CUDA or the CPU), each image cropped and resized on its thread.

    As a decoder it offers the interface of :class:`~packer.imaging.decoders.CpuDecoder`
    (whole images, moved to ``device``); a loader calls :meth:`decode_resized`."""

    name = "cpu-lane"
    resizes = True  # decode_resized gives the batch at its output size

    def __init__(self, device: torch.device | str, threads: int) -> None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise UsageError(f"cpu_lane threads must be a whole number >= 1, not {threads!r}")
        super().__init__(device, threads=threads, check_tail=True)
        self.name = f"cpu-lane({threads})"

    @property
    def roi_path(self) -> str:
        return "box+scale on the CPU"

    def _decode(self, datas: list[torch.Tensor], names: list[int]) -> list[torch.Tensor]:
        from . import jpeg

        out = jpeg.decode_batch(datas, "cpu", indices=names, pool=self._threads(),
                                ends_checked=True)  # fmt: skip
        if self.device.type == "cpu":
            return out
        return [x.pin_memory().to(self.device, non_blocking=True) for x in out]

    def _threads(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="imgpack-cpu-lane")
        return self._pool

    def decode_resized(
        self,
        datas: Sequence[torch.Tensor],
        sizes: torch.Tensor | np.ndarray,
        boxes: torch.Tensor | np.ndarray,
        flip: torch.Tensor | np.ndarray | None,
        size: tuple[int, int],
        indices: Sequence[int],
    ) -> torch.Tensor:
        """Each image's box resized to ``size`` (and mirrored where ``flip``): uint8
        [n, 3, *size] on the CPU, in pinned memory where ``device`` is CUDA (the loader
        copies it on its own stream, as its ``decode="cpu"`` batches). PackFormatError naming the first image (in
        batch order) that does not decode or is not its stored size."""
        from .jpeg import decode_crop_cpu

        n = len(datas)
        cuda = self.device.type == "cuda"
        out = torch.empty((n, 3, *size), dtype=torch.uint8, pin_memory=cuda)
        o = out.numpy()
        hw = np.asarray(sizes, dtype=np.int64).reshape(-1, 2)
        bx = np.asarray(boxes, dtype=np.int64).reshape(-1, 4)
        fl = np.zeros(n, bool) if flip is None else np.asarray(flip, dtype=bool)
        names = [int(i) for i in indices]
        if not (len(hw) == len(bx) == len(fl) == len(names) == n):
            raise ValueError(
                f"{n} images, {len(hw)} sizes, {len(bx)} boxes, {len(fl)} flips, "
                f"{len(names)} indices"
            )

        def run(a: int, z: int) -> None:
            for j in range(a, z):
                decode_crop_cpu(datas[j], names[j], hw[j], bx[j], bool(fl[j]), o[j])

        step = max(1, min(_TASK, -(-n // self.threads)))
        pool = self._threads()
        futs = [pool.submit(run, a, min(a + step, n)) for a in range(0, n, step)]
        for f in futs:  # every task waited for before the first error is raised
            f.exception()
        for f in futs:
            f.result()
        return out


__all__ = ["CpuLane"]
