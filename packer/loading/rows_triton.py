"""Triton kernel behind :class:`packer.loading.device_gather.DeviceRows`: copy whole rows.

``out[b] = src[idx[b]]`` for rows of ``ROW`` words. A few persistent programs walk
the (row, block) pairs of the batch, one ``BLOCK``-word load and store each (16-byte
vector loads for int32 words on 16-byte aligned rows). ``src`` may be host memory
registered with CUDA: the loads then cross the bus, and few programs keep few SMs
waiting on them. Imported only when CUDA work asks for it.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl


@triton.jit
def _copy_rows_kernel(src, idx, dst, nb, ROW: tl.constexpr, BLOCK: tl.constexpr,
                      CHUNKS: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    for t in range(pid, nb * CHUNKS, tl.num_programs(0)):
        b = t // CHUNKS
        offs = (t % CHUNKS) * BLOCK + tl.arange(0, BLOCK)
        m = offs < ROW
        r = tl.load(idx + b).to(tl.int64)
        x = tl.load(src + r * ROW + offs, mask=m)
        tl.store(dst + b.to(tl.int64) * ROW + offs, x, mask=m)


def copy_rows(src: Any, idx: torch.Tensor, out: torch.Tensor, row: int, programs: int,
              block: int) -> None:  # fmt: skip
    """Rows ``idx`` of ``src`` (rows of ``row`` elements of ``out``'s dtype) into ``out``."""
    block = min(block, triton.next_power_of_2(row))
    chunks = triton.cdiv(row, block)
    grid = (max(1, min(programs, len(idx) * chunks)),)
    _copy_rows_kernel[grid](src, idx, out, len(idx), ROW=row, BLOCK=block, CHUNKS=chunks)
