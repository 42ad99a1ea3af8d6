"""nvImageCodec's batched decode with no Python per image: :class:`NvBatchDecoder`.

Why: through nvImageCodec's Python binding a loader pays, per image and under the GIL,
a ``CodeStream``, the output's ``__cuda_array_interface__`` and the bookkeeping around
them; with four decode threads at once these contend rather than overlap, and four
hardware-engine lanes fed a loader no faster than one
(docs/PERFORMANCE.md, "JPEG packs beside DALI"). Here one call into a small C helper
(``nvbatch.c``, nvImageCodec's C API) parses every header, checks each frame size
against the pack's, and decodes the whole batch into one buffer torch allocated; ctypes
releases the GIL for the whole call. Python's share is a few array operations a batch.

The helper is compiled on first use with the machine's C compiler (``$CC``, else ``cc``)
against the headers and library of the installed ``nvidia-nvimgcodec`` wheel, as Triton
compiles its launchers, and cached per user under ``$XDG_CACHE_HOME/imgpack`` (else
``~/.cache/imgpack``), keyed by the source, the header and the library. Where there is
no compiler or no nvImageCodec, :func:`available` says why and nothing else changes.
The compile needs no CUDA toolkit: the header's one CUDA type is an opaque pointer.

Output: planar RGB, rows padded to 64 bytes, each image's planes whole rows apart: a
:class:`~packer.imaging.decoders_nvimgcodec.KeptBatch` the crop kernel reads in place
(addresses, plane heights and pitches). The buffer lives as long as the batch does.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from .decoder_base import DecoderBase, Unavailable, undecodable

_SOURCE = Path(__file__).with_name("nvbatch.c")
_ALIGN = 64  # row pitch and image start, in bytes
_MASKS = {"hw": 1, "hybrid": 2, "hw+hybrid": 3, "cpu": 4}
_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_why: str | None = None


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "imgpack"


def _nvimgcodec_dir() -> Path:
    from .decoders_nvimgcodec import import_nvimgcodec

    return Path(import_nvimgcodec().__file__).resolve().parent


def _compile(out: Path, nv: Path) -> None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise Unavailable("no C compiler (cc) to build the batched nvImageCodec helper")
    lib = nv / "libnvimgcodec.so.0"
    if not lib.is_file() or not (nv / "include" / "nvimgcodec.h").is_file():
        raise Unavailable(f"the nvImageCodec wheel at {nv} has no C header or library")
    out.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".nvbatch-") as tmp:
        shim = Path(tmp) / "cuda_runtime_api.h"  # the header's one CUDA type
        shim.write_text("typedef struct CUstream_st* cudaStream_t;\n")
        so = Path(tmp) / out.name
        cmd = [cc, "-O2", "-shared", "-fPIC", "-I", tmp, "-I", str(nv / "include"),
               str(_SOURCE), "-o", str(so), str(lib), f"-Wl,-rpath,{nv}"]  # fmt: skip
        try:
            got = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise Unavailable(f"compiling the batched nvImageCodec helper failed: {e}") from None
        if got.returncode != 0:
            tail = (got.stderr or got.stdout).strip().splitlines()[-1:] or ["no output"]
            raise Unavailable(f"compiling the batched nvImageCodec helper failed: {tail[0]}")
        os.replace(so, out)  # whole or not at all: another process may load it meanwhile


def library() -> ctypes.CDLL:
    """The compiled helper, built on first use (Unavailable saying why it cannot be)."""
    global _lib, _why
    with _lock:
        if _lib is not None:
            return _lib
        if _why is not None:
            raise Unavailable(_why)
        try:
            nv = _nvimgcodec_dir()
            key = hashlib.sha256(_SOURCE.read_bytes())
            key.update((nv / "include" / "nvimgcodec.h").read_bytes())
            key.update(str(nv).encode())
            so = _cache_dir() / f"nvbatch-{key.hexdigest()[:16]}.so"
            if not so.is_file():
                _compile(so, nv)
            lib = ctypes.CDLL(str(so))
        except Unavailable as e:
            _why = str(e)
            raise
        except OSError as e:
            _why = f"the batched nvImageCodec helper does not load ({e})"
            raise Unavailable(_why) from None
        i64p = np.ctypeslib.ndpointer(np.int64, flags="C_CONTIGUOUS")
        lib.nvb_open.restype = ctypes.c_void_p
        lib.nvb_open.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_float, ctypes.c_int,
                                 ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int64,
                                 ctypes.c_int64, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]  # fmt: skip
        lib.nvb_pooled.restype = ctypes.c_int
        lib.nvb_pooled.argtypes = [ctypes.c_void_p]
        lib.nvb_pools_open.restype = ctypes.c_void_p
        lib.nvb_pools_open.argtypes = [ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64]
        for f in (lib.nvb_pools_pinned, lib.nvb_pools_device):
            f.restype = ctypes.c_int
            f.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                          ctypes.c_int]  # fmt: skip
        lib.nvb_pools_close.restype = None
        lib.nvb_pools_close.argtypes = [ctypes.c_void_p]
        lib.nvb_decode.restype = ctypes.c_int
        lib.nvb_decode.argtypes = [
            ctypes.c_void_p, ctypes.c_int,
            np.ctypeslib.ndpointer(np.uint64, flags="C_CONTIGUOUS"), i64p, i64p,
            ctypes.c_void_p, ctypes.c_uint64, i64p, i64p, ctypes.c_void_p,
            np.ctypeslib.ndpointer(np.int32, flags="C_CONTIGUOUS"), i64p,
        ]  # fmt: skip
        lib.nvb_close.restype = None
        lib.nvb_close.argtypes = [ctypes.c_void_p]
        _lib = lib
        return lib


def loaded_cudart() -> str:
    """The path of the CUDA runtime library this process has loaded (torch's), or ""
    where none is mapped: the pools of ``nvbatch.c`` call into it, never another copy."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return ""
    for line in maps.splitlines():
        path = line.split(None, 5)[-1] if line.count(" ") >= 5 else ""
        if "/libcudart.so" in path and Path(path).is_file():
            return path
    return ""


def hw_options(batch: int, height: int, width: int) -> str:
    """nvImageCodec options that size the hardware engines' memory pool up front for
    batches of ``batch`` images of at most ``height`` x ``width`` (the pack knows its
    largest), as DALI's ``preallocate_*_hint`` do, instead of growing it in the loop."""
    if min(batch, height, width) < 1:
        raise ValueError(f"batch, height and width must be >= 1, not {batch}, {height}, {width}")
    m = "nvjpeg_hw_decoder"
    return (
        f"{m}:preallocate_batch_size={int(batch)} {m}:preallocate_width_hint={int(width)} "
        f"{m}:preallocate_height_hint={int(height)}"
    )


def available() -> str | None:
    """None where :class:`NvBatchDecoder` can run here, else why not."""
    try:
        library()
    except Unavailable as e:
        return str(e)
    return None


class NvBatchDecoder(DecoderBase):
    """nvImageCodec's engines through one C call a batch (see the module). ``backends``:
    "hw" (the hardware engines; the default, the way that measured fastest), "hybrid",
    "hw+hybrid" on CUDA; the CPU backend (libjpeg-turbo) on the CPU, what the CPU tests
    run. ``roi``: the loader hands it each image's crop box and only the box is decoded
    (``decode_kept(..., boxes=)``), with smooth chroma upsampling off where the decoder
    needs it for regions (``options``). ``capacity``: the most images one call takes (a
    larger batch is split). ``hw_load`` ("hw+hybrid"): the engines' share of a batch,
    1.0 adaptive (nvImageCodec moves work to the idle backend), below 1.0 fixed, as DALI's
    ``hw_decoder_load`` (0.65 by default there), the CUDA decoder taking the rest;
    ``threads``: nvImageCodec's CPU threads (0: its default), which the CUDA decoder's
    Huffman decode runs on. ``pools``: nvImageCodec's device and pinned allocations come
    from pools kept across batches (stream-ordered device memory, pinned blocks reused;
    ``pools_mb`` = each request's rounding, device and pinned, DALI's paddings) instead of
    a cudaMalloc / cudaHostAlloc each time its buffers grow; ``pooled`` says whether they
    are in use (not where the process has no CUDA runtime loaded). ``pre_init``: its
    decoders' resources made at creation, not in the first batch. ``preallocate``
    ((batch, height, width)): the engines' pool sized for such batches up front
    (:func:`hw_options`)."""

    name = "nvimgcodec"
    supports_roi = False  # its regions go through decode_kept (the loader's kept way)
    kept = True  # decode_kept is its way: Decoding.run hands the crop the addresses
    batched = True

    def __init__(
        self,
        device: torch.device | str,
        *,
        backends: str = "hw",
        roi: bool = False,
        options: str | None = None,
        capacity: int = 1024,
        threads: int = 0,
        hw_load: float = 1.0,
        pools: bool = True,
        pools_mb: tuple[int, int] = (16, 8),
        pre_init: bool = True,
        preallocate: tuple[int, int, int] | None = None,
        check_tail: bool | None = None,
    ) -> None:
        super().__init__(device, check_tail=check_tail)
        if not 0.0 < float(hw_load) <= 1.0:
            raise ValueError(f"hw_load must be in (0, 1], not {hw_load!r}")
        cuda = self.device.type == "cuda"
        if cuda and backends not in ("hw", "hybrid", "hw+hybrid"):
            raise ValueError(f"backends must be 'hw', 'hybrid' or 'hw+hybrid', not {backends!r}")
        self.backends = backends if cuda else "cpu"
        self.roi_kept = bool(roi)
        if options is None:  # nvImageCodec decodes no region on the GPU with it on
            options = ":fancy_upsampling=0" if roi and cuda else ""
        if preallocate is not None and cuda:
            options = f"{options} {hw_options(*preallocate)}".strip()
        self.options = options
        if cuda and not torch.cuda.is_available():
            raise Unavailable("torch sees no CUDA device")
        self._lib = library()
        index = self.device.index
        dev_id = (torch.cuda.current_device() if index is None else index) if cuda else -1
        err = ctypes.c_int(0)
        self._cap = int(capacity)
        h = self._lib.nvb_open(
            dev_id, _MASKS[self.backends], float(hw_load), self._cap, int(threads),
            options.encode(), (loaded_cudart() if pools and cuda else "").encode(),
            int(pools_mb[0]) << 20, int(pools_mb[1]) << 20, int(bool(pre_init)),
            ctypes.byref(err),
        )  # fmt: skip
        if not h:
            raise Unavailable(f"nvImageCodec cannot decode JPEG here (status {err.value})")
        self._h = h
        self.pooled = bool(self._lib.nvb_pooled(h))
        self._call = threading.Lock()  # one batch at a time: the handles are reused

    def __del__(self) -> None:
        h, self._h = getattr(self, "_h", None), None
        if h and _lib is not None:
            _lib.nvb_close(h)

    @property
    def roi_path(self) -> str:
        return "roi" if self.roi_kept else "full+crop"

    def __repr__(self) -> str:
        pooled = ", pooled=True" if getattr(self, "pooled", False) else ""
        return super().__repr__()[:-1] + f", backends={self.backends!r}, batched=True{pooled})"

    def decode_kept(
        self,
        datas: Sequence[torch.Tensor],
        sizes: torch.Tensor | np.ndarray,
        names: Sequence[int],
        boxes: torch.Tensor | np.ndarray | None = None,
    ):  # -> KeptBatch
        """Each JPEG (or only each box of ``boxes``, int [n, 4] top, left, height, width)
        into one new buffer: a KeptBatch (addresses, plane heights, pitches; the output
        sizes). Every header is read and checked against ``sizes`` (the pack's,
        range-checked on load) before anything is decoded: a file cannot ask for more
        memory than its pack records. The caller has checked the end markers."""
        from .decoders_nvimgcodec import KeptBatch
        from .jpeg import size_mismatch
        from .resize import check_boxes

        names = [int(i) for i in names]
        hw = np.ascontiguousarray(np.asarray(sizes, dtype=np.int64).reshape(-1, 2))
        n = len(datas)
        if len(hw) != n or len(names) != n:
            raise ValueError(f"{len(hw)} sizes and {len(names)} names for {n} images")
        bx = None
        out_hw = hw
        if boxes is not None:
            bx = np.ascontiguousarray(np.asarray(boxes, dtype=np.int64).reshape(-1, 4))
            if len(bx) != n:
                raise ValueError(f"{len(bx)} boxes for {n} images")
            check_boxes(bx, hw)
            out_hw = np.ascontiguousarray(bx[:, 2:])
        ptrs = np.fromiter((d.data_ptr() for d in datas), np.uint64, n)
        lens = np.fromiter((d.numel() for d in datas), np.int64, n)
        pitch = -(-out_hw[:, 1] // _ALIGN) * _ALIGN
        span = -(-(3 * out_hw[:, 0] * pitch) // _ALIGN) * _ALIGN
        offs = np.zeros(n, np.int64)
        np.cumsum(span[:-1], out=offs[1:])
        total = int(span.sum()) if n else 0
        buf = torch.empty(max(total, 1), dtype=torch.uint8, device=self.device)
        cuda = self.device.type == "cuda"
        stream = torch.cuda.current_stream(self.device).cuda_stream if cuda else None
        status = np.zeros(n, np.int32)
        got = np.zeros((n, 2), np.int64)
        with self._call:
            for a in range(0, n, self._cap):
                z = min(n, a + self._cap)
                rc = self._lib.nvb_decode(
                    self._h, z - a, ptrs[a:z], lens[a:z], hw[a:z],
                    None if bx is None else bx[a:z].ctypes.data, buf.data_ptr(),
                    offs[a:z], pitch[a:z], stream, status[a:z], got[a:z],
                )  # fmt: skip
                if rc != 0 and not (status[a:z] < 0).any():
                    raise RuntimeError(f"nvImageCodec's batched decode failed (status {rc})")
                if (status[a:z] != 1).any():
                    break
        bad = np.flatnonzero(status < 0)  # 0: not decoded, as another image was refused
        if len(bad) or (status != 1).any():
            j = int(bad[0]) if len(bad) else int(np.flatnonzero(status != 1)[0])
            if status[j] == -2:
                raise size_mismatch(names[j], got[j].tolist(), hw[j].tolist())
            why = (
                "its header cannot be read"
                if status[j] == -1
                else "nvImageCodec could not decode it"
            )
            raise undecodable(names[j], why)
        table = np.stack([buf.data_ptr() + offs, out_hw[:, 0], pitch], 1).astype(np.int64)
        views = _Views(buf, offs, out_hw, pitch)
        return KeptBatch(table, torch.from_numpy(out_hw.copy()), views, self.device)

    def _decode_sized(
        self, datas: list[torch.Tensor], names: list[int], hw: np.ndarray
    ) -> list[torch.Tensor]:
        """The interface's whole-image decode: views of one buffer, rows padded."""
        return self.decode_kept(datas, hw, names).tensors()


class _Views:
    """The images of a batched decode, as uint8 [3, h, w] views of its one buffer (rows
    padded: strides of whole rows), made only when asked for (``KeptBatch.tensors``):
    the loader's crop reads the addresses instead. Holds the buffer."""

    __slots__ = ("buf", "hw", "offs", "pitch")

    def __init__(self, buf: torch.Tensor, offs: np.ndarray, hw: np.ndarray, pitch: np.ndarray):
        self.buf, self.offs, self.hw, self.pitch = buf, offs, hw, pitch

    def tensors(self) -> list[torch.Tensor]:
        return [
            self.buf[o : o + 3 * h * p].view(3, h, p)[:, :, :w]
            for o, (h, w), p in zip(self.offs.tolist(), self.hw.tolist(), self.pitch.tolist())
        ]
