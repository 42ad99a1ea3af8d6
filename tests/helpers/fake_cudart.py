"""A stand-in CUDA runtime for the CPU tests of the batched decoder's pools
(``packer/imaging/nvbatch.c``): the calls the pools make, on host memory, with counters
and switchable failures, compiled here with ``cc`` (:func:`build`)."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

# host memory; counters atomic (the pools are called from several threads); each call
# can be made to fail; a block handed out is checked free of any other holder
SOURCE = r"""
#include <stdlib.h>
#include <stddef.h>
static int n[8]; /* device allocs, device frees, host allocs, host frees, syncs, records */
int fail_event_create, fail_record, fail_host_alloc;
#define INC(i) __atomic_fetch_add(&n[i], 1, __ATOMIC_SEQ_CST)
int cudaMallocAsync(void** p, size_t s, void* st) { *p = malloc(s); INC(0); return 0; }
int cudaFreeAsync(void* p, void* st) { free(p); INC(1); return 0; }
int cudaHostAlloc(void** p, size_t s, unsigned f) {
    if (fail_host_alloc) { *p = (void*)0x1; return 2; /* cudaErrorMemoryAllocation */ }
    *p = malloc(s ? s : 1); INC(2); return 0;
}
int cudaFreeHost(void* p) { free(p); INC(3); return 0; }
int cudaEventCreateWithFlags(void** e, unsigned f) {
    if (fail_event_create) { *e = (void*)0x1; return 2; }
    *e = calloc(1, sizeof(int)); return 0;
}
/* an event: 1 while recorded and not yet waited for */
int cudaEventRecord(void* e, void* st) { if (fail_record) return 400; *(int*)e = 1; INC(5); return 0; }
int cudaEventSynchronize(void* e) { *(int*)e = 0; INC(4); return 0; }
int cudaEventDestroy(void* e) { free(e); return 0; }
void counts(int* out) { for (int i = 0; i < 6; i++) out[i] = __atomic_load_n(&n[i], __ATOMIC_SEQ_CST); }
"""


def build(tmp_path: Path, name: str, source: str | None = None) -> tuple[str, ctypes.CDLL]:
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    src = tmp_path / f"{name}.c"
    src.write_text(SOURCE if source is None else source)
    so = tmp_path / f"{name}.so"
    subprocess.run([cc, "-shared", "-fPIC", str(src), "-o", str(so)], check=True)
    return str(so), ctypes.CDLL(str(so))  # the pools dlopen the same file: one copy


def counts(fake: ctypes.CDLL) -> dict[str, int]:
    out = (ctypes.c_int * 6)()
    fake.counts(out)
    keys = ("dev_alloc", "dev_free", "host_alloc", "host_free", "syncs", "records")
    return dict(zip(keys, out, strict=True))
