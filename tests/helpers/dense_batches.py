"""Shared by the dense loader's tests: one batch equality for batches made two ways
(grouped or alone, a worker process or the thread), the COCO packs those tests build,
and a JPEG pack with one image's end marker broken."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

import packer
from helpers.dense_data import make_truth, write_coco, write_masks
from packer.builder.config import BuildConfig
from packer.builder.dense import DenseOptions


def assert_same(a: Any, b: Any, contiguous: bool = False) -> None:
    """The same batches: sequences of one type and length, dicts of the same keys in
    the same order, tensors of one dtype, shape and device, contiguous alike and equal
    bit for bit (``contiguous``: and contiguous), anything else equal."""
    if isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y, contiguous)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k], contiguous)
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and a.device == b.device
        assert a.is_contiguous() == b.is_contiguous()
        assert not contiguous or a.is_contiguous()
        assert torch.equal(a, b)
    else:
        assert a == b


def coco_packs(root: Path, n: int = 10, semantic: bool = False) -> dict[str, Path]:
    """``n`` shapes with boxes and instance masks as a COCO set, packed as a JPEG pack
    (``"jpeg"``) and a raw one (``"raw"``, 40x48 padded); ``semantic``: also an image +
    mask folder of the same images as a JPEG pack (``"seg"``)."""
    truths = make_truth(n, ext=".jpg")
    write_coco(root / "coco", truths)
    dense = DenseOptions(format="coco", split="train2017")
    out = {}
    for store in ("jpeg", "raw"):
        kw = {"store": store} if store == "jpeg" else {"size": (40, 48), "resize": "pad"}
        cfg = BuildConfig(workers=1, dense=dense, **kw)
        out[store] = packer.build_pack(root / "coco", root / store, cfg).path
    if semantic:
        write_masks(root / "seg", truths)
        cfg = BuildConfig(store="jpeg", workers=1, dense=DenseOptions(format="masks"))
        out["seg"] = packer.build_pack(root / "seg", root / "semantic", cfg).path
    return out


def break_jpeg_end(pack: Path, to: Path, i: int) -> Path:
    """A copy of JPEG pack ``pack`` at ``to`` whose image ``i`` has its end marker
    overwritten (its decode then fails, naming it)."""
    shutil.copytree(pack, to)
    p = packer.load(to)
    off, ln = int(p.offsets[i]), int(p.lengths[i])
    data = to / "_tensordict" / "jpeg.memmap"
    raw = bytearray(data.read_bytes())
    raw[off + ln - 2 : off + ln] = b"\x00\x00"
    data.write_bytes(bytes(raw))
    return to


@contextlib.contextmanager
def failing_forks_forgotten() -> Iterator[None]:
    """A test that makes this process's host worker fail to fork: the failure is kept
    for the process (packer.loading.dense_host.fork_failed), so it is forgotten after."""
    from packer.loading import dense_host

    assert not dense_host._FORK_FAILED, "a fork failure left by another test"
    try:
        yield
    finally:
        dense_host._FORK_FAILED.clear()


def host_workers() -> list:
    """This process's dense host workers alive (packer.loading.dense_host.HostWorker)."""
    return [p for p in mp.active_children() if p.name == "imgpack-dense-host"]
