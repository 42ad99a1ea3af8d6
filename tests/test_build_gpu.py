"""imgpack build --device (issue 18 §2): the batched path, run here on the CPU."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import packer
import packer.build
from conftest import write_image
from packer.build import GPU_TOLERANCE, BuildConfig, build
from packer.cli import cli


@pytest.mark.parametrize("mode", ["crop", "stretch", "pad"])
def test_batched_path_matches_cpu_within_tolerance(
    photos: Path, tmp_path: Path, batched_on_cpu: None, mode: str
) -> None:
    cfg = dict(size=(24, 20), resize=mode, workers=2)
    cpu = build(photos, tmp_path / "cpu", BuildConfig(**cfg, device="cpu"))
    monkey = build(photos, tmp_path / "gpu", BuildConfig(**cfg, device="cuda"))
    assert monkey.count == cpu.count == 33
    assert [s["path"] for s in monkey.skipped] == [s["path"] for s in cpu.skipped]
    a, b = packer.load(tmp_path / "cpu"), packer.load(tmp_path / "gpu")
    assert a.sources == b.sources and torch.equal(a.labels, b.labels)
    assert a.manifest.source_sizes == b.manifest.source_sizes
    diff = (a.images.int() - b.images.int()).abs().float()
    assert diff.mean() <= GPU_TOLERANCE["mean_abs"], float(diff.mean())
    m = json.loads((tmp_path / "gpu" / "imgpack.json").read_text())
    assert m["build"]["device"] == "cpu" and m["build"]["tolerance"] == GPU_TOLERANCE
    assert "device" not in json.loads((tmp_path / "cpu" / "imgpack.json").read_text())["build"]
    # non-JPEG inputs went to the CPU workers: identical rows there
    for i, s in enumerate(a.sources):
        if not s.lower().endswith((".jpg", ".jpeg")):
            assert torch.equal(a.images[i], b.images[i]), s


def test_a_jpeg_too_short_for_its_frame_is_skipped_as_by_the_cpu_build(
    photos: Path, tmp_path: Path, batched_on_cpu: None
) -> None:
    """The header rule does not hand it to the GPU (which would pack it grey): the CPU
    decode names it corrupt, as the CPU build does."""
    from conftest import write_bomb_jpeg

    write_bomb_jpeg(photos / "zebra" / "short.jpg")
    cfg = dict(size=(16, 16), workers=1)
    cpu = build(photos, tmp_path / "cpu", BuildConfig(**cfg, device="cpu"))
    gpu = build(photos, tmp_path / "gpu", BuildConfig(**cfg, device="cuda"))
    assert gpu.skipped == cpu.skipped
    reasons = {s["path"]: s["reason"] for s in gpu.skipped}
    assert reasons["zebra/short.jpg"].startswith("corrupt JPEG data: premature end of data")
    assert "zebra/short.jpg" not in packer.load(tmp_path / "gpu").sources


def test_batched_build_resumes(photos: Path, tmp_path: Path, batched_on_cpu: None, monkeypatch):
    cfg = BuildConfig(size=(16, 16), workers=1, device="cuda")
    build(photos, tmp_path / "ref", cfg)
    calls = []

    def stop(n: int) -> None:
        calls.append(n)
        if len(calls) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build(photos, tmp_path / "out", cfg, progress=stop)
    r = build(photos, tmp_path / "out", cfg)
    assert r.resumed > 0
    for f in ("_tensordict/images.memmap", "_tensordict/labels.memmap"):
        assert (tmp_path / "out" / f).read_bytes() == (tmp_path / "ref" / f).read_bytes()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_device_cuda_without_cuda_exits_2(image_tree: Path, tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["build", str(image_tree), str(tmp_path / "p"), "--device", "cuda"])
    assert r.exit_code == 2
    assert r.output.strip().splitlines()[-1] == (
        "Error: --device cuda: no CUDA device is available to this process; use --device "
        "cpu (or auto, which falls back to the CPU)"
    )
    r = CliRunner().invoke(cli, ["build", str(image_tree), str(tmp_path / "q"), "--device", "auto"])
    assert r.exit_code == 0 and "device" not in packer.load(tmp_path / "q").manifest.build.extra


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_build_within_tolerance(photos: Path, tmp_path: Path) -> None:
    cfg = dict(size=(24, 20), workers=2)
    build(photos, tmp_path / "cpu", BuildConfig(**cfg))
    build(photos, tmp_path / "gpu", BuildConfig(**cfg, device="cuda"))
    a, b = packer.load(tmp_path / "cpu"), packer.load(tmp_path / "gpu")
    diff = (a.images.int() - b.images.int()).abs().float()
    assert diff.mean() <= GPU_TOLERANCE["mean_abs"]
    assert np.isfinite(float(diff.mean()))


def test_an_image_the_gpu_fails_is_decoded_by_the_cpu_workers(
    photos: Path, tmp_path: Path, batched_on_cpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A JPEG that passes the workers' checks but fails in the batched decode: the
    batch is retried image by image, and the one that still fails goes to the CPU
    workers' decode, whose row is the CPU build's own."""
    import packer.jpeg
    from packer.errors import PackFormatError

    cfg = dict(size=(24, 20), workers=2)
    cpu = build(photos, tmp_path / "cpu", BuildConfig(**cfg, device="cpu"))
    bad = (photos / "zebra" / "p07.jpg").read_bytes()
    real = packer.jpeg.decode_batch
    seen = {"batches": 0, "refused": 0}

    def flaky(datas, device="cpu", **kw):
        if any(bytes(d.numpy()) == bad for d in datas):
            seen["refused"] += 1
            raise PackFormatError("image 0: its stored JPEG does not decode (test)")
        seen["batches"] += 1
        return real(datas, device, **kw)

    monkeypatch.setattr(packer.jpeg, "decode_batch", flaky)
    out = build(photos, tmp_path / "gpu", BuildConfig(**cfg, device="cuda"))
    assert seen["refused"] == 2 and seen["batches"] > 1  # the batch, then the image alone
    assert out.count == cpu.count and out.skipped == cpu.skipped
    a, b = packer.load(tmp_path / "cpu"), packer.load(tmp_path / "gpu")
    i = a.sources.index("zebra/p07.jpg")
    assert torch.equal(a.images[i], b.images[i])  # the CPU workers' row, byte for byte


def test_a_failed_group_write_stops_the_build_and_a_rerun_resumes(
    photos: Path, tmp_path: Path, batched_on_cpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writers and the journal run on threads of their own: an error there (here a
    full disk at the third group) still ends the build with its one-line error, the
    groups journaled before it are kept, and the rerun's pack is the same bytes."""
    import errno

    import packer.build_gpu
    from packer.errors import DiskFullError

    cfg = BuildConfig(size=(16, 16), workers=2, device="cuda")
    build(photos, tmp_path / "ref", cfg)
    monkeypatch.setattr(packer.build_gpu, "GROUP_IMAGES", 4)
    real = packer.build_gpu._write_group
    calls: list[int] = []

    def full_at_third(*a):
        calls.append(1)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*a)

    monkeypatch.setattr(packer.build_gpu, "_write_group", full_at_third)
    with pytest.raises(DiskFullError, match="disk is full"):
        build(photos, tmp_path / "out", cfg)
    monkeypatch.setattr(packer.build_gpu, "_write_group", real)
    r = build(photos, tmp_path / "out", cfg)
    assert r.resumed >= 4  # at least the first two groups
    for f in ("_tensordict/images.memmap", "_tensordict/labels.memmap"):
        assert (tmp_path / "out" / f).read_bytes() == (tmp_path / "ref" / f).read_bytes()


def test_each_file_is_read_once_and_what_the_gpu_does_not_take_goes_to_the_cpu(
    tmp_path: Path,
) -> None:
    """A reader thread reads each file once and classifies those bytes: the JPEGs the GPU
    takes as they are keep their bytes and size; everything else (PNG, CMYK, EXIF-rotated,
    no end marker, a FIFO, a file gone) goes, in one call, to the CPU build's decode."""
    import os

    from PIL import Image

    from packer.build_gpu import _read_group

    good = write_image(tmp_path / "a.jpg", (40, 30))
    write_image(tmp_path / "b.png", (40, 30))
    write_image(tmp_path / "c.jpg", (40, 30), mode="CMYK")
    exif = Image.Exif()
    exif[0x0112] = 6
    write_image(tmp_path / "d.jpg", (40, 30), exif=exif.tobytes())
    (tmp_path / "e.jpg").write_bytes(good.read_bytes()[:-2])  # cut before its end marker
    os.mkfifo(tmp_path / "f.jpg")  # refused, not waited on
    write_image(tmp_path / "g.jpg", (50, 20), mode="L")
    names = ["a.jpg", "b.png", "c.jpg", "d.jpg", "e.jpg", "f.jpg", "gone.jpg", "g.jpg"]
    sent: list[list[str]] = []

    def cpu_decode(paths: list[str]):
        sent.append(paths)
        return lambda: [(None, "test")] * len(paths)

    r = _read_group([str(tmp_path / n) for n in names], 10**8, cpu_decode)
    assert r.gpu == [0, 7] and r.sizes == [(40, 30), (50, 20)]
    assert bytes(r.datas[0].numpy()) == good.read_bytes()
    assert r.cpu == [1, 2, 3, 4, 5, 6]
    assert sent == [[str(tmp_path / names[i]) for i in r.cpu]]
    assert r.decoded() == [(None, "test")] * 6
    assert _read_group([str(tmp_path / "a.jpg")], 1199, cpu_decode).cpu == [0]  # > max pixels


def test_a_jpeg_the_reader_does_not_pass_is_decoded_by_the_cpu_workers(
    photos: Path, tmp_path: Path, batched_on_cpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import packer.build_gpu

    cfg = dict(size=(24, 20), workers=2)
    cpu = build(photos, tmp_path / "cpu", BuildConfig(**cfg, device="cpu"))
    real = packer.build_gpu.plain_jpeg_size
    size03 = (40 + 9 * 3, 30 + 5 * 3)  # zebra/p03.jpg's, no other image's

    def refuse(data, max_pixels):
        size = real(data, max_pixels)
        return None if size == size03 else size

    monkeypatch.setattr(packer.build_gpu, "plain_jpeg_size", refuse)
    out = build(photos, tmp_path / "gpu", BuildConfig(**cfg, device="cuda"))
    assert out.count == cpu.count and out.skipped == cpu.skipped
    a, b = packer.load(tmp_path / "cpu"), packer.load(tmp_path / "gpu")
    i = a.sources.index("zebra/p03.jpg")
    assert torch.equal(a.images[i], b.images[i])  # the CPU workers' row, byte for byte
    j = a.sources.index("zebra/p04.jpg")
    assert not torch.equal(a.images[j], b.images[j])  # the others: the batched decode's
