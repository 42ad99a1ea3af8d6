"""The batched decoder's memory pools (``nvbatch.c``), on the CPU against a stand-in
CUDA runtime built here (the same calls, host memory, counters), and the default lanes'
tuning by the pack's photo sizes. On CUDA: pooled decodes give the same pixels."""

from __future__ import annotations

import ctypes
import io

import numpy as np
import pytest
import torch
from PIL import Image

from helpers.fake_cudart import SOURCE, build, counts
from packer.imaging import decoders_split, nvbatch
from packer.loading.jpeg_pass import lane_tuning_for

needs_helper = pytest.mark.skipif(nvbatch.available() is not None, reason=str(nvbatch.available()))


@needs_helper
def test_pinned_blocks_are_reused_after_their_stream_and_freed_at_close(tmp_path):
    path, fake = build(tmp_path, "fakecudart")
    lib = nvbatch.library()
    pools = lib.nvb_pools_open(path.encode(), 16 << 20, 8 << 20)
    assert pools
    a, b, c = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    assert lib.nvb_pools_pinned(pools, ctypes.byref(a), 1000, 0) == 0
    # a busy block is never handed out twice
    assert lib.nvb_pools_pinned(pools, ctypes.byref(b), 10, 0) == 0
    assert a.value != b.value
    assert lib.nvb_pools_pinned(pools, ctypes.byref(a), 1000, 1) == 0  # given back
    assert counts(fake)["records"] == 1  # marked on the stream that gave it back
    # a smaller request takes the kept block, once its stream is past it
    assert lib.nvb_pools_pinned(pools, ctypes.byref(c), 500, 0) == 0
    assert c.value == a.value
    got = counts(fake)
    assert got["host_alloc"] == 2 and got["syncs"] == 1
    # a larger one than any kept block is a new allocation
    d = ctypes.c_void_p()
    assert lib.nvb_pools_pinned(pools, ctypes.byref(d), 5000, 0) == 0
    assert d.value not in (a.value, b.value) and counts(fake)["host_alloc"] == 3
    lib.nvb_pools_close(pools)
    assert counts(fake)["host_free"] == 3  # every block, busy or kept, at close


@needs_helper
def test_device_blocks_are_stream_ordered(tmp_path):
    path, fake = build(tmp_path, "fakecudart2")
    lib = nvbatch.library()
    pools = lib.nvb_pools_open(path.encode(), 0, 0)
    p = ctypes.c_void_p()
    assert lib.nvb_pools_device(pools, ctypes.byref(p), 4096, 0) == 0 and p.value
    assert lib.nvb_pools_device(pools, ctypes.byref(p), 4096, 1) == 0
    got = counts(fake)
    assert got["dev_alloc"] == 1 and got["dev_free"] == 1 and got["host_alloc"] == 0
    lib.nvb_pools_close(pools)


@needs_helper
def test_a_runtime_missing_a_call_leaves_the_defaults(tmp_path):
    cut = "int cudaFreeHost(void* p) { free(p); INC(3); return 0; }"
    assert cut in SOURCE
    path, _ = build(tmp_path, "partial", SOURCE.replace(cut, ""))
    lib = nvbatch.library()
    assert not lib.nvb_pools_open(path.encode(), 0, 0)
    assert not lib.nvb_pools_open(str(tmp_path / "absent.so").encode(), 0, 0)
    assert not lib.nvb_pools_open(b"", 0, 0)


def test_the_engines_share_follows_the_photos_size():
    share = decoders_split.engine_share
    assert share(500 * 375) == 1.0 and share(decoders_split.ENGINES_ALONE_PIXELS) == 1.0
    assert share(1600 * 1200) == 0.8
    assert share(4000 * 3000) == 0.65
    t = decoders_split.lane_tuning(256, (375, 500), 500 * 375)
    assert t == {"preallocate": (256, 375, 500)}  # the engines alone
    t = decoders_split.lane_tuning(64, (3000, 4000), 12e6)
    assert t == {"preallocate": (64, 3000, 4000), "backends": "hw+hybrid", "hw_load": 0.65}


def test_the_loader_tunes_its_lanes_by_the_packs_sizes():
    class Pack:
        sizes = torch.tensor([[1200, 1600]] * 5 + [[375, 500]] * 2 + [[3000, 4000]])

    t = lane_tuning_for(Pack(), 32)
    assert t["preallocate"] == (32, 3000, 4000)  # the largest image's height and width
    assert t["hw_load"] == 0.8  # by the median photo, 2 MP
    assert lane_tuning_for(object(), 32) is None


def test_the_engines_pool_options():
    assert nvbatch.hw_options(64, 3000, 4000) == (
        "nvjpeg_hw_decoder:preallocate_batch_size=64 "
        "nvjpeg_hw_decoder:preallocate_width_hint=4000 "
        "nvjpeg_hw_decoder:preallocate_height_hint=3000"
    )
    with pytest.raises(ValueError, match="must be >= 1"):
        nvbatch.hw_options(0, 10, 10)


@pytest.mark.cuda
@needs_helper
def test_pooled_decodes_give_the_same_pixels_on_cuda():
    rng = np.random.default_rng(1)
    datas = []
    for h, w in [(375, 500), (1200, 1600), (77, 101)]:
        b = io.BytesIO()
        Image.fromarray((rng.random((h, w, 3)) * 255).astype(np.uint8)).save(b, "JPEG")
        datas.append(torch.frombuffer(bytearray(b.getvalue()), dtype=torch.uint8))
    for backends, load in (("hw", 1.0), ("hw+hybrid", 0.65)):
        kw = {"backends": backends, "hw_load": load}
        plain = nvbatch.NvBatchDecoder("cuda", pools=False, pre_init=False, **kw)
        pooled = nvbatch.NvBatchDecoder("cuda", preallocate=(3, 1200, 1600), **kw)
        assert pooled.pooled and not plain.pooled
        for _ in range(2):  # the second time from the kept blocks
            a, b = plain.decode(datas), pooled.decode(datas)
            assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
