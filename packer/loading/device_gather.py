"""The GPU reads a batch's rows straight out of the page-cached pack (``gather="device"``).

The CPU way copies each batch's rows with 8 threads into pinned memory, then the copy
engine moves them: every byte crosses DRAM three times and every copy hands the GIL
back. Here each of the pack's files (images, labels, targets) is mapped read-only a
second time and registered with CUDA (``cudaHostRegister``: mapped, read-only,
portable). Its page-cache pages are then locked in RAM and visible to the GPU, and a
Triton kernel copies the rows of each batch over the bus into device memory: no CPU
copy, no staging buffer, nothing per row on the host. The loader streams faster this
way, but a model beside it trains slower than with the CPU way, so it is an option
(``PackLoader(gather="device")``), not the default (see docs/PERFORMANCE.md, section "Figures behind the code", row "device gather").

Locking a file in RAM is only for packs that fit: :func:`unavailable` says why a pack
cannot be read this way (too large, not a whole file, a register call refused).
Imported only for CUDA work.
"""

from __future__ import annotations

import mmap
import os

import torch

# The part of physical RAM a pack's files may lock (the rest stays for everything else).
MAX_RAM_SHARE = 0.5
_PROGRAMS = 16  # persistent programs: enough to fill the bus, few SMs held
_BLOCK = 4096  # words per load


def _whole_file(t: torch.Tensor) -> str | None:
    """The file ``t`` maps from its first byte to its last, else None."""
    name = getattr(t, "filename", None)
    if not name or not t.is_contiguous() or t.numel() == 0:
        return None
    if t.data_ptr() != t.untyped_storage().data_ptr():
        return None  # a view into the file, not all of it
    try:
        if os.path.getsize(name) != t.numel() * t.element_size():
            return None
    except OSError:
        return None
    return str(name)


def ram_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def unavailable(tensors: list[torch.Tensor]) -> str | None:
    """Why these (CPU, memory-mapped) tensors cannot be read by the GPU in place, or None."""
    total = sum(t.numel() * t.element_size() for t in tensors)
    for t in tensors:
        if _whole_file(t) is None:
            return "its fields are not whole memory-mapped files (a slice or a built tensor)"
    ram = ram_bytes()
    if ram and total > MAX_RAM_SHARE * ram:
        return (
            f"it is {total / 2**30:.1f} GiB, over {MAX_RAM_SHARE:.0%} of this machine's "
            f"{ram / 2**30:.0f} GiB of RAM, and would be locked in it"
        )
    try:
        import triton  # noqa: F401  (bundled with CUDA builds of torch)
    except ImportError:
        return "Triton is not installed"
    return None


class _Ptr:
    """What a Triton launch needs of a pointer argument."""

    def __init__(self, ptr: int, dtype: torch.dtype) -> None:
        self.ptr, self.dtype = ptr, dtype

    def data_ptr(self) -> int:
        return self.ptr


class DeviceRows:
    """One pack file, mapped read-only and registered with CUDA; ``gather`` copies rows
    of it into a device tensor on the current stream."""

    def __init__(self, t: torch.Tensor) -> None:
        name = _whole_file(t)
        if name is None:
            raise OSError("not a whole memory-mapped file")
        self.rows = len(t)
        self.row_bytes = t.numel() * t.element_size() // max(1, len(t))
        self.nbytes = self.rows * self.row_bytes
        with open(name, "rb") as f:
            self._mm: mmap.mmap | None = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        self._buf = memoryview(self._mm)
        # the address of the mapping (a read-only buffer; ctypes gives it without a copy)
        import numpy as np

        self.ptr = int(np.frombuffer(self._buf, np.uint8).ctypes.data)
        # Portable | Mapped | ReadOnly: visible to every device, never written
        rc = int(torch.cuda.cudart().cudaHostRegister(self.ptr, self.nbytes, 1 | 2 | 8))
        if rc != 0:
            self._release()
            raise OSError(f"cudaHostRegister refused the mapping (CUDA error {rc})")
        self._registered = True
        self.word = 4 if self.row_bytes % 4 == 0 else 1
        self.dtype = torch.int32 if self.word == 4 else torch.uint8

    def gather(self, idx: torch.Tensor, out: torch.Tensor) -> None:
        """``out[i] = rows[idx[i]]``, bytewise: idx int64 on the device (every value in
        range: the loader's own order), out contiguous on the device with
        ``len(idx) * row_bytes`` bytes. Runs on the current stream."""
        from .rows_triton import copy_rows

        assert self._registered and out.is_contiguous() and idx.dtype == torch.int64
        assert out.numel() * out.element_size() == len(idx) * self.row_bytes
        if len(idx) == 0:
            return
        words = self.row_bytes // self.word
        copy_rows(_Ptr(self.ptr, self.dtype), idx, out.view(self.dtype), words, _PROGRAMS, _BLOCK)

    def _release(self) -> None:
        self._buf.release()
        if self._mm is not None:
            self._mm.close()
            self._mm = None

    def close(self) -> None:
        """Unregister and unmap, after every kernel reading from it has finished."""
        if getattr(self, "_registered", False):
            self._registered = False
            try:
                torch.cuda.synchronize()
                torch.cuda.cudart().cudaHostUnregister(self.ptr)
            except Exception:  # CUDA already torn down at exit: nothing to undo
                return  # and leave the mapping: a late kernel must not read unmapped memory
        self._release()


class PackRows:
    """The registered files of one pack (images, labels, targets or None)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, targets: torch.Tensor | None):
        opened: list[DeviceRows] = []
        try:
            for t in (images, labels) + (() if targets is None else (targets,)):
                opened.append(DeviceRows(t))
        except BaseException:
            for r in opened:
                r.close()
            raise
        self.images, self.labels = opened[0], opened[1]
        self.targets = opened[2] if targets is not None else None

    def close(self) -> None:
        for r in (self.images, self.labels, self.targets):
            if r is not None:
                r.close()


def open_rows(
    images: torch.Tensor, labels: torch.Tensor, targets: torch.Tensor | None
) -> tuple[PackRows | None, str | None]:
    """The pack's files registered for device reads, or (None, why not)."""
    tensors = [images, labels] + ([] if targets is None else [targets])
    why = unavailable(tensors)
    if why is not None:
        return None, why
    try:
        return PackRows(images, labels, targets), None
    except (OSError, RuntimeError) as e:
        return None, str(e)
