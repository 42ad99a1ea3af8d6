"""imgpack build --device (issue 18 §2): the batched path, run here on the CPU."""

from __future__ import annotations

import io
import json
import os
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image

import packer
import packer.builder
import packer.builder.gpu
import packer.builder.gpu_read
import packer.builder.run
import packer.builder.workers
import packer.imaging.jpeg
from conftest import write_image
from packer.builder.api import BuildConfig, build
from packer.builder.config import GpuTuning
from packer.builder.run import GPU_TOLERANCE
from packer.builder.workdir import work_dir_for
from packer.cli import cli
from packer.errors import DecodeError, PackFormatError
from packer.imaging.decode import decode_into
from packer.pack.writer import digest, image_bytes


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


def test_gpu_build_starts_its_cpu_workers_only_when_a_file_needs_them(
    photos: Path, tmp_path: Path, batched_on_cpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CPU workers decode what the GPU does not take: a tree of plain JPEGs starts
    none (16 booting workers slowed the GPU pipeline 2x), a mixed tree starts them once,
    and the pack is the same as with the workers started up front."""
    started: list[int] = []
    real = packer.builder.run.start_pool

    def counted(workers, *a, **k):
        started.append(workers)
        return real(workers, *a, **k)

    monkeypatch.setattr(packer.builder.run, "start_pool", counted)
    jpegs = tmp_path / "jpegs"
    for i in range(12):
        write_image(jpegs / ("a" if i % 2 else "b") / f"{i:02d}.jpg", (30 + i, 20 + i), seed=i)
    cfg = dict(size=(16, 16), workers=2, device="cuda")
    assert build(jpegs, tmp_path / "j", BuildConfig(**cfg)).count == 12
    assert started == []
    lazy = build(photos, tmp_path / "lazy", BuildConfig(**cfg))
    assert started == [2] and lazy.count == 33
    monkeypatch.setattr(packer.builder.run, "LazyPool", lambda start: start())  # up front
    build(photos, tmp_path / "eager", BuildConfig(**cfg))
    assert started == [2, 2]
    for f in ("_tensordict/images.memmap", "_tensordict/labels.memmap"):
        assert (tmp_path / "lazy" / f).read_bytes() == (tmp_path / "eager" / f).read_bytes()


def test_lazy_pool_never_started_stops_and_refuses_work_after_shutdown() -> None:
    from packer.builder.chunks import LazyPool, stop_pool

    calls: list[int] = []
    pool = LazyPool(lambda: calls.append(1))  # type: ignore[arg-type,return-value]
    assert not pool.started and pool._processes is None
    stop_pool(pool)  # a pool never started: nothing to kill or wait for
    pool.shutdown(wait=True)
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(print)
    assert calls == []


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


@pytest.mark.parametrize(
    ("device", "gpus", "says"),
    [
        ("cuda", 0, "BuildConfig.device cuda: no CUDA device is available to this process"),
        (
            "cuda:2",
            1,
            r"BuildConfig.device cuda:2: this process sees 1 CUDA device \(cuda:0 to cuda:0\)",
        ),
    ],
)
def test_a_device_this_process_lacks_is_refused_before_a_bucket_is_touched(
    image_tree: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    device: str,
    gpus: int,
    says: str,
) -> None:
    """Issue 43: every build checks --device before any work, a build into object
    storage too (it used to reach the bucket, list and stage first); and cuda:N past
    the devices there is refused as bad usage, not a CUDA error at the first batch."""
    import packer.builder.upload

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    touched: list[str] = []
    monkeypatch.setattr(packer.builder.upload, "open_store", lambda u: touched.append(str(u)))
    cfg = BuildConfig(size=(8, 6), workers=1, shard_size=300, device=device)
    with pytest.raises(packer.UsageError, match=says):
        build(image_tree, "s3://bucket/set", cfg)
    assert touched == []
    with pytest.raises(packer.UsageError, match=says):  # a folder set, and a plain pack
        build(image_tree, tmp_path / "set", cfg)
    with pytest.raises(packer.UsageError, match=says):
        build(image_tree, tmp_path / "p", BuildConfig(size=(8, 6), workers=1, device=device))
    assert sorted(os.listdir(tmp_path)) == ["imgs"]


@pytest.mark.cuda
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
    import packer.imaging.jpeg
    from packer.errors import PackFormatError

    cfg = dict(size=(24, 20), workers=2)
    cpu = build(photos, tmp_path / "cpu", BuildConfig(**cfg, device="cpu"))
    bad = (photos / "zebra" / "p07.jpg").read_bytes()
    real = packer.imaging.jpeg.decode_batch
    seen = {"batches": 0, "refused": 0}

    def flaky(datas, device="cpu", **kw):
        if any(bytes(d.numpy()) == bad for d in datas):
            seen["refused"] += 1
            raise PackFormatError("image 0: its stored JPEG does not decode (test)")
        seen["batches"] += 1
        return real(datas, device, **kw)

    monkeypatch.setattr(packer.imaging.jpeg, "decode_batch", flaky)
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

    import packer.builder.gpu
    from packer.errors import DiskFullError

    cfg = BuildConfig(size=(16, 16), workers=2, device="cuda")
    build(photos, tmp_path / "ref", cfg)
    cfg = replace(cfg, _gpu=GpuTuning(group_images=4))
    real = packer.builder.gpu.write_group
    calls: list[int] = []

    def full_at_third(*a):
        calls.append(1)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*a)

    monkeypatch.setattr(packer.builder.gpu, "write_group", full_at_third)
    with pytest.raises(DiskFullError, match="disk is full"):
        build(photos, tmp_path / "out", cfg)
    monkeypatch.setattr(packer.builder.gpu, "write_group", real)
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

    from packer.builder.gpu_read import read_group

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

    r = read_group([str(tmp_path / n) for n in names], 10**8, cpu_decode)
    assert r.gpu == [0, 7] and r.sizes == [(40, 30), (50, 20)]
    assert bytes(r.datas[0].numpy()) == good.read_bytes()
    assert r.cpu == [1, 2, 3, 4, 5, 6]
    assert sent == [[str(tmp_path / names[i]) for i in r.cpu]]
    assert r.decoded() == [(None, "test")] * 6
    assert read_group([str(tmp_path / "a.jpg")], 1199, cpu_decode).cpu == [0]  # > max pixels


def test_a_jpeg_the_reader_does_not_pass_is_decoded_by_the_cpu_workers(
    photos: Path, tmp_path: Path, batched_on_cpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import packer.builder.gpu

    cfg = dict(size=(24, 20), workers=2)
    cpu = build(photos, tmp_path / "cpu", BuildConfig(**cfg, device="cpu"))
    real = packer.builder.gpu_read.plain_jpeg_size
    size03 = (40 + 9 * 3, 30 + 5 * 3)  # zebra/p03.jpg's, no other image's

    def refuse(data, max_pixels):
        size = real(data, max_pixels)
        return None if size == size03 else size

    monkeypatch.setattr(packer.builder.gpu_read, "plain_jpeg_size", refuse)
    out = build(photos, tmp_path / "gpu", BuildConfig(**cfg, device="cuda"))
    assert out.count == cpu.count and out.skipped == cpu.skipped
    a, b = packer.load(tmp_path / "cpu"), packer.load(tmp_path / "gpu")
    i = a.sources.index("zebra/p03.jpg")
    assert torch.equal(a.images[i], b.images[i])  # the CPU workers' row, byte for byte
    j = a.sources.index("zebra/p04.jpg")
    assert not torch.equal(a.images[j], b.images[j])  # the others: the batched decode's


FILES = ("_tensordict/images.memmap", "_tensordict/labels.memmap")


def _same(a: Path, b: Path) -> bool:
    return all((a / f).read_bytes() == (b / f).read_bytes() for f in FILES)


def _our_threads(before: set[threading.Thread]) -> list[str]:
    """The threads alive now that were not before the build (``before``: the threads
    then), whatever their names: what the build left running. Not every ``imgpack-``
    thread alive: another component's (a loader that an earlier test on this process
    dropped without close(): its ``imgpack-gather`` threads end when its pool is
    collected) are not the build's."""
    return [t.name for t in threading.enumerate() if t not in before]


def _row(pack: Path, rel: str) -> bytes:
    p = packer.load(pack)
    return p.images[p.sources.index(rel)].contiguous().numpy().tobytes()


class Boom(Exception):
    pass


def _nth(n: int, real, err: type[BaseException]):
    calls = [0]

    def fn(*a, **k):
        calls[0] += 1
        if calls[0] == n:
            raise err("injected")
        return real(*a, **k)

    return fn


STAGES = {
    # where: (module, attribute) of the function made to fail on its 2nd call
    "reader": (packer.builder.gpu, "read_group"),  # where the pipeline looks it up
    "decoder": (packer.imaging.jpeg, "decode_batch"),
    "main": (packer.imaging.jpeg, "resize_images"),
    "writer": (packer.builder.gpu, "write_group"),
    "retry": (packer.builder.workers, "_decode_paths"),  # on a writer thread: workers=1 only
}


@pytest.mark.parametrize("err", [Boom, KeyboardInterrupt])
@pytest.mark.parametrize(
    "stage,workers",
    [(s, w) for s in STAGES for w in (1, 2) if not (s == "retry" and w == 2)]
    + [("journal", 1), ("journal", 2)],
)
def test_an_error_in_any_stage_ends_the_build_and_the_rerun_is_identical(
    photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    stage: str, workers: int, err: type[BaseException],
) -> None:  # fmt: skip
    """The error reaches the caller as itself (not swallowed, no hang), no pipeline
    thread outlives the build, and a rerun gives a clean build's bytes."""

    def refuse(datas, device="cpu", **kw):
        raise PackFormatError("image 0: test")

    def setting() -> None:  # the same for the clean build, the faulty one and the rerun
        monkeypatch.setattr(packer.builder.run, "_build_device", lambda c: torch.device("cpu"))
        if stage == "retry":  # no JPEG decodes: the writers run the CPU decode (pool None)
            monkeypatch.setattr(packer.imaging.jpeg, "decode_batch", refuse)

    setting()
    four = GpuTuning(group_images=4)  # 9 groups
    cfg = BuildConfig(size=(16, 12), workers=workers, device="cuda", _gpu=four)
    build(photos, tmp_path / "ref", cfg)
    progress = None
    if stage == "journal":  # record() runs progress() on the journal thread
        progress = _nth(6, lambda n: None, err)
    else:
        mod, name = STAGES[stage]
        monkeypatch.setattr(mod, name, _nth(2, getattr(mod, name), err))
    before = set(threading.enumerate())
    with pytest.raises(err, match="injected"):
        build(photos, tmp_path / "out", cfg, progress=progress)
    assert _our_threads(before) == []
    monkeypatch.undo()
    setting()
    build(photos, tmp_path / "out", cfg)
    assert _same(tmp_path / "out", tmp_path / "ref")


def test_a_loaders_threads_alive_beside_a_failed_build_are_not_counted_as_its(
    photos: Path, tmp_path: Path, batched_on_cpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The suite's flake: a loader that an earlier test on this process left open had
    its ``imgpack-gather`` threads alive when a build failed, and they were counted as
    the build's. Here one is open on purpose: the build still leaves no thread of its
    own, and the loader's are there, untouched, until it is closed."""
    cfg = BuildConfig(size=(16, 12), workers=1, device="cuda", _gpu=GpuTuning(group_images=4))
    build(photos, tmp_path / "ref", cfg)
    loader = packer.PackLoader(tmp_path / "ref", 4, device="cpu")
    try:
        next(iter(loader))
        gather = [t for t in threading.enumerate() if t.name.startswith("imgpack-gather")]
        assert gather
        mod, name = STAGES["reader"]
        monkeypatch.setattr(mod, name, _nth(2, getattr(mod, name), Boom))
        before = set(threading.enumerate())
        with pytest.raises(Boom, match="injected"):
            build(photos, tmp_path / "out", cfg)
        assert _our_threads(before) == []
        assert all(t.is_alive() for t in gather)
    finally:
        loader.close()


def test_journal_in_order_one_thread_one_sync_per_group_rows_on_disk_first(
    photos: Path, tmp_path: Path, batched_on_cpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every chunk is recorded once, in chunk order, from one thread; ``sync`` only on a
    group's last chunk; and when a chunk is recorded its rows are already in the rows
    file (its SHA-256 matches). Groups mix GPU rows, workers' rows, skips and retries."""
    real_decode = packer.imaging.jpeg.decode_batch

    def some_fail(datas, device="cpu", **kw):  # every image of an odd length: retried
        if any(len(d) % 2 for d in datas):
            raise PackFormatError("image 0: test")
        return real_decode(datas, device, **kw)

    monkeypatch.setattr(packer.imaging.jpeg, "decode_batch", some_fail)
    real = packer.builder.gpu.decode_chunks_batched
    seen: list[tuple[int, bool, str]] = []
    given: list[int] = []

    def wrapped(chunks, spec, rows_path, device, pool, record, after_submit, tuning):
        given.extend(c for c, _, _ in chunks)
        row = image_bytes(spec.shape)
        where = {c: (start, len(ps)) for c, start, ps in chunks}

        def rec(res, sync=True):
            start, n = where[res[0]]
            with open(rows_path, "rb") as f:
                f.seek(start * row)
                assert digest(f.read(n * row)) == res[3], f"chunk {res[0]} not written"
            seen.append((res[0], sync, threading.current_thread().name))
            record(res, sync=sync)

        return real(chunks, spec, rows_path, device, pool, rec, after_submit, tuning)

    monkeypatch.setattr(packer.builder.gpu, "decode_chunks_batched", wrapped)
    cfg = dict(size=(16, 12), workers=2)
    build(photos, tmp_path / "cpu", BuildConfig(**cfg))
    build(
        photos, tmp_path / "gpu", BuildConfig(**cfg, device="cuda", _gpu=GpuTuning(group_images=3))
    )
    n = len(seen)
    assert [c for c, _, _ in seen] == given == list(range(n)) and n > 30  # a chunk per image
    assert [s for _, s, _ in seen] == [(c % 3 == 2) or c == n - 1 for c in range(n)]
    assert {t for _, _, t in seen} == {"imgpack-journal_0"}
    a, b = packer.load(tmp_path / "cpu"), packer.load(tmp_path / "gpu")
    assert a.sources == b.sources and a.manifest.source_sizes == b.manifest.source_sizes


def test_a_pinned_buffer_is_never_reused_while_a_writer_holds_it(
    photos: Path, tmp_path: Path, batched_on_cpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first GPU group's writer is held until the writer of the group 8 later (as
    far ahead as the main thread goes) has started, the buffers going round meanwhile:
    no buffer is handed to two writers at once, a held buffer's rows do not change
    under its writer, buffers are reused, and the pack is the unheld build's."""
    one = GpuTuning(group_images=1)  # a group per image
    cfg = BuildConfig(size=(16, 12), workers=2, device="cuda", _gpu=one)
    build(photos, tmp_path / "ref", cfg)
    real = packer.builder.gpu.write_group
    lock, go = threading.Lock(), threading.Event()
    in_use: set[int] = set()
    ptrs: set[int] = set()
    first: list[int] = []
    groups = [0]

    def held(fd, row, group, at, sizes, host, copied, cpu, writeback, release):
        with lock:  # 8 groups past the held one: as far as the main thread goes
            if first and group[0][0] >= first[0] + 2 * one.writers:
                go.set()
        if host is None:
            return real(fd, row, group, at, sizes, host, copied, cpu, writeback, release)
        ptr = host.untyped_storage().data_ptr()
        with lock:
            assert ptr not in in_use, "a buffer in use was handed to another writer"
            in_use.add(ptr)
            ptrs.add(ptr)
            groups[0] += 1
            if not first:
                first.append(group[0][0])
        snap = host.clone()
        if group[0][0] == first[0]:
            assert go.wait(timeout=30), "later writers never started"

        def rel():
            assert torch.equal(host, snap), "rows changed under their writer"
            with lock:
                in_use.discard(ptr)
            release()

        return real(fd, row, group, at, sizes, host, copied, cpu, writeback, rel)

    monkeypatch.setattr(packer.builder.gpu, "write_group", held)
    build(photos, tmp_path / "out", cfg)
    assert go.is_set() and len(ptrs) < groups[0] and len(ptrs) <= 2 * one.writers + 2
    assert _same(tmp_path / "out", tmp_path / "ref")


def test_a_write_failing_mid_group_journals_no_chunk_of_that_group(
    photos: Path, tmp_path: Path, batched_on_cpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pwrite fails on the 2nd chunk of a group: its 1st chunk (written) is not
    journaled either, the error ends the build, and the rerun is a clean build."""
    cfg = BuildConfig(size=(16, 12), workers=2, device="cuda", _gpu=GpuTuning(group_images=4))
    build(photos, tmp_path / "ref", cfg)
    row = image_bytes(cfg.spec.shape)
    real_pwrite = os.pwrite

    def pwrite(fd, data, offset):
        if threading.current_thread().name.startswith("imgpack-write") and offset == 9 * row:
            raise Boom("injected")  # chunk 9 (block of 1 row): the 2nd of group 2
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    before = set(threading.enumerate())
    with pytest.raises(Boom):
        build(photos, tmp_path / "out", cfg)
    monkeypatch.setattr(os, "pwrite", real_pwrite)
    journal = work_dir_for(tmp_path / "out") / "journal.jsonl"
    chunks = [json.loads(line)["chunk"] for line in journal.read_text().splitlines()]
    assert not {8, 9, 10, 11} & set(chunks) and set(range(8)) <= set(chunks)
    assert _our_threads(before) == []
    build(photos, tmp_path / "out", cfg)
    assert _same(tmp_path / "out", tmp_path / "ref")


def _jpeg(size: tuple[int, int], seed: int, solid: bool = False) -> bytes:
    if solid:
        im = Image.new("RGB", size, (seed % 256, 90, 200))
    else:
        rng = np.random.default_rng(seed)
        im = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    b = io.BytesIO()
    im.save(b, "JPEG", quality=90)
    return b.getvalue()


def _pad(data: bytes, n: int) -> bytes:
    """``data`` made ``n`` bytes long with a COM segment after SOI (still a valid JPEG)."""
    k = n - len(data) - 4
    assert 0 <= k <= 65533
    return data[:2] + b"\xff\xfe" + (k + 2).to_bytes(2, "big") + b"c" * k + data[2:]


def _change(path: Path, how: str, small_big: tuple[bytes, bytes]) -> None:
    data = path.read_bytes()
    if how == "grow":
        path.write_bytes(data + b"trailing junk")
    elif how == "shrink":
        path.write_bytes(data[: len(data) // 2])
    elif how == "vanish":
        path.unlink()
    elif how == "fifo":
        path.unlink()
        os.mkfifo(path)
    elif how == "directory":
        path.unlink()
        path.mkdir()
    elif how == "same_length_too_many_pixels":
        path.write_bytes(small_big[1])  # another JPEG, as long, over --max-pixels


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize(
    "how", ["grow", "shrink", "vanish", "fifo", "directory", "same_length_too_many_pixels"]
)
def test_a_file_changed_before_or_after_its_one_read_gets_one_consistent_answer(
    image_tree: Path, tmp_path: Path, batched_on_cpu: None, monkeypatch: pytest.MonkeyPatch,
    how: str, when: str,
) -> None:  # fmt: skip
    """A GPU-able JPEG changes while the build runs. Before the reader's read: the image
    gets what the CPU path makes of the file as it now is (its row, or a skip with the
    reason). After it: the GPU decodes the bytes the reader read and classified, so the
    pack holds the unchanged file's image; never a decode of bytes no check has seen."""
    small, big = _jpeg((40, 30), 1), _jpeg((300, 200), 2, solid=True)
    n = max(len(small), len(big)) + 8
    small, big = _pad(small, n), _pad(big, n)
    target = image_tree / "zebra" / "swap.jpg"
    target.write_bytes(small)
    cfg = BuildConfig(size=(16, 12), workers=2, device="cuda", max_pixels=20_000)
    build(image_tree, tmp_path / "ref", cfg)
    real = packer.builder.gpu.read_group

    def change_once(paths, max_pixels, cpu_decode):
        mine = str(target) in paths and target.is_file() and target.read_bytes() == small
        if mine and when == "before":
            _change(target, how, (small, big))
        out = real(paths, max_pixels, cpu_decode)
        if mine and when == "after":
            _change(target, how, (small, big))
        return out

    monkeypatch.setattr(packer.builder.gpu, "read_group", change_once)
    out = build(image_tree, tmp_path / "out", cfg)
    skips = {s["path"]: s["reason"] for s in out.skipped}
    if when == "after":
        assert "zebra/swap.jpg" not in skips
        assert _row(tmp_path / "out", "zebra/swap.jpg") == _row(tmp_path / "ref", "zebra/swap.jpg")
        return
    buf = np.empty(cfg.spec.shape, dtype=np.uint8)
    try:
        decode_into(str(target), cfg.spec, buf)
        want: str | None = None
    except DecodeError as e:
        want = str(e)
    if want is None:
        assert "zebra/swap.jpg" not in skips
        assert _row(tmp_path / "out", "zebra/swap.jpg") == buf.tobytes()
    else:
        assert skips.get("zebra/swap.jpg") == want


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("group", [2, 256])
@pytest.mark.parametrize("where", ["decode", "classify"])
def test_every_gpu_image_falling_back_gives_the_cpu_build_byte_for_byte(
    photos: Path, tmp_path: Path, batched_on_cpu: None, monkeypatch: pytest.MonkeyPatch,
    workers: int, group: int, where: str,
) -> None:  # fmt: skip
    """No image decodes on the "GPU" (the batch and every image alone fail, or the
    reader passes none): every group is written from the CPU workers' rows alone (no pinned
    buffer), and the pack is the CPU build's, byte for byte."""
    cfg = dict(size=(16, 12), workers=workers)
    cpu = build(photos, tmp_path / "cpu", BuildConfig(**cfg))
    if where == "decode":

        def refuse(datas, device="cpu", **kw):
            raise PackFormatError("image 0: test")

        monkeypatch.setattr(packer.imaging.jpeg, "decode_batch", refuse)
    else:
        monkeypatch.setattr(
            packer.builder.gpu_read, "plain_jpeg_size", lambda data, max_pixels: None
        )
    tuned = GpuTuning(group_images=group)
    gpu = build(photos, tmp_path / "gpu", BuildConfig(**cfg, device="cuda", _gpu=tuned))
    assert gpu.count == cpu.count and gpu.skipped == cpu.skipped
    assert _same(tmp_path / "cpu", tmp_path / "gpu")
    a, b = packer.load(tmp_path / "cpu"), packer.load(tmp_path / "gpu")
    assert a.manifest.source_sizes == b.manifest.source_sizes


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("kind", ["jpeg", "png", "broken"])
def test_a_set_of_one_image(tmp_path: Path, batched_on_cpu: None, workers: int, kind: str) -> None:
    src = tmp_path / "src"
    if kind == "broken":
        (src / "a").mkdir(parents=True)
        (src / "a" / "x.jpg").write_bytes(b"\xff\xd8\xff\xe0 broken")
        write_image(src / "b" / "y.png", (20, 20))  # a pack needs one good image
    else:
        write_image(src / "a" / f"x.{kind}", (50, 40), seed=3)
    cfg = dict(size=(16, 12), workers=workers)
    cpu = build(src, tmp_path / "cpu", BuildConfig(**cfg))
    gpu = build(src, tmp_path / "gpu", BuildConfig(**cfg, device="cuda"))
    assert gpu.count == cpu.count and gpu.skipped == cpu.skipped
    a, b = packer.load(tmp_path / "cpu"), packer.load(tmp_path / "gpu")
    assert a.sources == b.sources and a.manifest.source_sizes == b.manifest.source_sizes
    if kind == "jpeg":
        diff = (a.images.int() - b.images.int()).abs().float()
        assert diff.mean() <= GPU_TOLERANCE["mean_abs"]
    else:
        assert _same(tmp_path / "cpu", tmp_path / "gpu")


@pytest.mark.parametrize("stop_at", [1, 4, 15, 30])
def test_interrupted_anywhere_then_rerun_is_byte_identical(
    photos: Path, tmp_path: Path, batched_on_cpu: None, monkeypatch: pytest.MonkeyPatch,
    stop_at: int,
) -> None:  # fmt: skip
    """KeyboardInterrupt at the n-th journaled chunk (groups of 4, 2 workers), then a
    rerun: the clean build's bytes. (How far the first run's journal got varies: the
    journal thread goes on with groups already written until the main thread stops it.)"""
    cfg = BuildConfig(size=(16, 12), workers=2, device="cuda", _gpu=GpuTuning(group_images=4))
    build(photos, tmp_path / "ref", cfg)
    stop = _nth(stop_at, lambda n: None, KeyboardInterrupt)
    before = set(threading.enumerate())
    with pytest.raises(KeyboardInterrupt):
        build(photos, tmp_path / "out", cfg, progress=stop)
    assert _our_threads(before) == []
    r = build(photos, tmp_path / "out", cfg)
    assert r.resumed >= stop_at
    assert _same(tmp_path / "out", tmp_path / "ref")


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
