"""``imgpack build --device auto`` (packer.builder.auto): the GPU only where it pays."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import packer
from packer.builder import auto
from packer.builder.config import BuildConfig
from packer.builder.run import build


def test_the_rule_takes_the_gpu_only_for_large_jobs() -> None:
    for workers in (1, 2, 4, 8, 16, 32):
        small = not auto.gpu_pays(1_000, workers)
        assert small  # a fresh process's start alone outlasts a CPU build of 1k images
        # monotonic in the job size: once it pays it keeps paying
        took = [auto.gpu_pays(n, workers) for n in range(0, 2_000_000, 5_000)]
        assert took == sorted(took)
    # more workers: the CPU build is faster, so the GPU needs a larger job
    first = [next(n for n in range(0, 10**7, 500) if auto.gpu_pays(n, w)) for w in (2, 4, 8)]
    assert first == sorted(first) and first[0] < 10_000 < first[2]
    cpu, gpu = auto.estimates(90_000, 16)
    assert gpu == pytest.approx(auto.GPU_START_S + 90_000 / auto.GPU_IMG_S)
    assert cpu == pytest.approx(90_000 / (16 * auto.CPU_IMG_S_PER_WORKER))


def test_auto_device_looks_for_cuda_only_when_it_pays(monkeypatch) -> None:
    asked = []

    def available() -> bool:
        asked.append(True)
        return True

    monkeypatch.setattr(torch.cuda, "is_available", available)
    raw, jpeg = BuildConfig(device="auto"), BuildConfig(device="auto", store="jpeg")
    assert auto.auto_device(raw, 1_000, 16) is None and asked == []
    assert auto.auto_device(jpeg, 10**7, 2) is None and asked == []
    assert auto.auto_device(raw, 10**7, 2) == torch.device("cuda") and asked == [True]
    monkeypatch.setitem(sys.modules, "torchvision.io", None)  # no decoder at all
    assert auto.auto_device(raw, 10**7, 2) is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delitem(sys.modules, "torchvision.io")
    assert auto.auto_device(raw, 10**7, 2) is None


def test_a_small_auto_build_is_the_cpu_build(image_tree: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: pytest.fail("asked for CUDA"))
    build(image_tree, tmp_path / "auto", BuildConfig(size=(16, 16), workers=2, device="auto"))
    build(image_tree, tmp_path / "cpu", BuildConfig(size=(16, 16), workers=2))
    a, b = packer.load(tmp_path / "auto"), packer.load(tmp_path / "cpu")
    assert "device" not in a.manifest.build.extra
    assert torch.equal(a.images, b.images)


def test_a_large_auto_build_takes_the_batched_path(
    image_tree: Path, tmp_path: Path, monkeypatch
) -> None:
    """Where the rule says the GPU pays, the batched path runs (here with the CPU
    standing in for the GPU, as tests/builder/test_build_gpu.py does)."""
    monkeypatch.setattr(auto, "gpu_pays", lambda n, workers: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch, "device", lambda name: torch.empty(0).device)  # the CPU
    build(image_tree, tmp_path / "auto", BuildConfig(size=(16, 16), workers=2, device="auto"))
    assert packer.load(tmp_path / "auto").manifest.build.extra["device"] == "cpu"
