"""The GPU build's decoder processes (packer.build.gpu._Decoders), run here on the CPU:
the groups go round spawned processes as on CUDA, with torch.device("cpu") in place of
the GPU. Each build spawns two interpreters (a few seconds)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
from pathlib import Path

import pytest
import torch

import packer
import packer.build.gpu
import packer.build.run
from packer.build.run import BuildConfig, build
from packer.errors import PackerError, WorkerDiedError

FILES = ("_tensordict/images.memmap", "_tensordict/labels.memmap")


def _same(a: Path, b: Path) -> bool:
    return all((a / f).read_bytes() == (b / f).read_bytes() for f in FILES)


def _decoders() -> list:
    return [p for p in mp.active_children() if p.name.startswith("imgpack-decoder")]


def _our_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("imgpack-")]


@pytest.fixture
def in_processes(batched_on_cpu: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two decoder processes on the CPU (on CUDA the default; on the CPU the build's
    decoder is a thread of its own process)."""
    monkeypatch.setattr(packer.build.gpu, "decoder_count", lambda device, images: 2)
    monkeypatch.setattr(packer.build.gpu, "_LOCAL_FIRST", False)  # no thread: they do all
    monkeypatch.setattr(packer.build.gpu, "GROUP_IMAGES", 4)  # 9 groups, round both


def test_decoder_processes_give_the_in_process_build_byte_for_byte(
    photos: Path, tmp_path: Path, batched_on_cpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Groups spread over two processes, journaled in chunk order: the same pack as one
    decoder thread (and the same skips); no process or thread is left behind."""
    monkeypatch.setattr(packer.build.gpu, "GROUP_IMAGES", 4)
    cfg = BuildConfig(size=(16, 12), workers=2, device="cuda")
    ref = build(photos, tmp_path / "ref", cfg)
    monkeypatch.setattr(packer.build.gpu, "decoder_count", lambda device, images: 2)
    monkeypatch.setattr(packer.build.gpu, "_LOCAL_FIRST", False)
    seen: list[int] = []
    real = packer.build.gpu.decode_chunks_batched

    def wrapped(chunks, spec, rows_path, device, pool, record, after_submit=lambda: None):
        def rec(res, sync=True):
            seen.append(res[0])
            record(res, sync=sync)

        return real(chunks, spec, rows_path, device, pool, rec, after_submit)

    monkeypatch.setattr(packer.build.gpu, "decode_chunks_batched", wrapped)
    out = build(photos, tmp_path / "out", cfg)
    assert out.count == ref.count and out.skipped == ref.skipped
    assert seen == sorted(seen) and len(seen) > 8
    assert _same(tmp_path / "out", tmp_path / "ref")
    assert _decoders() == [] and _our_threads() == []


def test_the_build_starts_on_a_thread_and_kills_processes_that_never_started(
    photos: Path, tmp_path: Path, batched_on_cpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default: the build's own decoder thread takes the groups until a process is
    ready. A build that ends first (here: every process is held before it can start)
    kills them and gives the same pack; one where they start takes them over."""
    monkeypatch.setattr(packer.build.gpu, "GROUP_IMAGES", 4)
    cfg = BuildConfig(size=(16, 12), workers=2, device="cuda")
    build(photos, tmp_path / "ref", cfg)
    monkeypatch.setattr(packer.build.gpu, "decoder_count", lambda device, images: 2)
    real = packer.build.gpu._Decoders.pick
    used: set[int] = set()

    def pick(self, g):
        k = real(self, g)
        used.add(k if k == self.local else -1)
        return k

    monkeypatch.setattr(packer.build.gpu._Decoders, "pick", pick)
    real_spawn = packer.build.gpu._Decoders._spawn

    def spawn_stopped(self, n, rows_path, spec, device):
        real_spawn(self, n, rows_path, spec, device)
        for p in self.procs:  # stopped before they can say they are ready
            os.kill(p.pid, signal.SIGSTOP)

    monkeypatch.setattr(packer.build.gpu._Decoders, "_spawn", spawn_stopped)
    build(photos, tmp_path / "out", cfg)
    assert used == {2}  # the thread (index 2, after the two processes) did every group
    assert _same(tmp_path / "out", tmp_path / "ref")
    assert _decoders() == [] and _our_threads() == []


def test_a_killed_decoder_process_stops_the_build_and_the_rerun_resumes(
    photos: Path, tmp_path: Path, in_processes: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL a decoder process once the first group is journaled: the build ends with
    WorkerDiedError (no hang), the other process is ended too, and the rerun keeps the
    journaled chunks and gives the clean build's bytes."""
    monkeypatch.setattr(packer.build.gpu, "GROUP_IMAGES", 1)  # 33 groups: most are left
    cfg = BuildConfig(size=(16, 12), workers=2, device="cuda")
    build(photos, tmp_path / "ref", cfg)
    killed: list[int] = []

    def kill_one(n: int) -> None:
        if not killed:
            p = _decoders()[0]
            killed.append(p.pid)
            os.kill(p.pid, signal.SIGKILL)

    with pytest.raises(WorkerDiedError, match="GPU decoder"):
        build(photos, tmp_path / "out", cfg, progress=kill_one)
    assert killed and _decoders() == [] and _our_threads() == []
    r = build(photos, tmp_path / "out", cfg)
    assert r.resumed > 0
    assert _same(tmp_path / "out", tmp_path / "ref")


def test_an_error_in_a_decoder_process_reaches_the_caller(
    photos: Path, tmp_path: Path, in_processes: None
) -> None:
    """The decoder processes cannot open the rows file for writing (given a folder's
    path in its place): the OSError comes back through the pipe as itself and ends
    the build; the processes are gone."""
    real = packer.build.gpu._Decoders.__init__

    def folder_for_rows(self, n, rows_path, spec, device, pool, local=True):
        real(self, n, str(tmp_path), spec, device, pool, local)

    packer.build.gpu._Decoders.__init__ = folder_for_rows
    try:
        with pytest.raises(IsADirectoryError):
            build(photos, tmp_path / "out", BuildConfig(size=(16, 12), workers=2, device="cuda"))
    finally:
        packer.build.gpu._Decoders.__init__ = real
    assert _decoders() == [] and _our_threads() == []


def test_an_error_where_the_build_writes_its_plan_ends_the_decoder_processes(
    tmp_path: Path, photos: Path
) -> None:
    """``after_submit()`` (the build's plan, written while the decoders start) raises:
    the error leaves as itself, the processes are killed and every thread joined."""
    rows = tmp_path / "rows"
    rows.write_bytes(b"")
    spec = BuildConfig(size=(8, 8)).spec
    paths = sorted(str(p) for p in photos.rglob("*.jpg"))[:2]  # 2 groups of 1: 2 decoders

    class Boom(Exception):
        pass

    def plan_fails():
        assert _decoders()  # started, not yet done
        raise Boom("injected")

    real, size = packer.build.gpu.decoder_count, packer.build.gpu.GROUP_IMAGES
    packer.build.gpu.decoder_count = lambda device, images: 2
    packer.build.gpu.GROUP_IMAGES = 1
    try:
        with pytest.raises(Boom):
            packer.build.gpu.decode_chunks_batched(
                [(0, 0, paths[:1]), (1, 1, paths[1:])], spec, str(rows), torch.device("cpu"),
                None, lambda *a, **k: None, plan_fails,
            )  # fmt: skip
    finally:
        packer.build.gpu.decoder_count, packer.build.gpu.GROUP_IMAGES = real, size
    assert _decoders() == [] and _our_threads() == []


def test_an_exception_that_cannot_cross_the_pipe_becomes_a_packer_error() -> None:
    class Local(Exception):  # defined in a function: pickle cannot find it by name
        pass

    e = packer.build.gpu._picklable(Local("disk on fire"))
    assert isinstance(e, PackerError) and "Local: disk on fire" in str(e)
    ok = OSError(28, "No space left on device")
    assert packer.build.gpu._picklable(ok) is ok


def test_processes_start_only_for_builds_on_cuda_big_enough_to_repay_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bg = packer.build.gpu
    assert bg.DECODERS == 0  # off by default: measured no faster (docs/BENCHMARKS.md)
    monkeypatch.setattr(bg, "DECODERS", 2)
    assert bg.decoder_count(torch.device("cpu"), 10**7) == 0
    assert bg.decoder_count(torch.device("cuda"), bg.PROCESSES_FROM - 1) == 0
    assert bg.decoder_count(torch.device("cuda"), bg.PROCESSES_FROM) == bg.DECODERS > 0
