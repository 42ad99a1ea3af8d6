"""The build's time split and its start-up shortcuts keep every promise."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import packer.builder.run as pb
import packer.builder.workers as pbw
from packer.builder.plan import plan_fingerprint, plan_labels
from packer.builder.run import BuildConfig, build
from packer.builder.workdir import JOURNAL
from packer.imaging.decode import ResizeSpec, decode_into, load_resized, store_into


def test_time_split_accounts_for_each_chunk(image_tree: Path, tmp_path: Path) -> None:
    r = build(image_tree, tmp_path / "p", BuildConfig(size=(32, 32), workers=2))
    e = r.extra
    steps = e["worker"]
    assert set(pb._WORKER_STEPS) | {"tail"} <= set(steps)
    assert all(v >= 0 for v in steps.values())
    assert steps["decode"] > 0
    assert 1 <= e["processes_used"] <= 2
    # the workers' steps fit in the window they ran in (plus idle before their first chunk)
    busy = sum(steps[k] for k in ("decode", "copy", "pwrite", "sha256", "writeback"))
    assert busy <= e["processes_used"] * e["decode_window_s"] + 0.01
    assert e["parent"]["journal_fsyncs"] >= 1
    assert {"fsync_rows", "metadata", "move"} <= {
        k.removeprefix("finalize_") for k in e["parent"] if k.startswith("finalize_")
    }


def test_time_split_of_a_jpeg_build(image_tree: Path, tmp_path: Path) -> None:
    """--store jpeg workers report the same steps, beside their journal fields."""
    r = build(image_tree, tmp_path / "p", BuildConfig(size=(32, 32), workers=2, store="jpeg"))
    steps = r.extra["worker"]
    assert set(pb._WORKER_STEPS) | {"tail"} <= set(steps)
    assert steps["decode"] > 0 and all(v >= 0 for v in steps.values())
    assert r.extra["parent"]["journal_fsyncs"] >= 1
    assert r.image_shape[0] == 3


@pytest.mark.parametrize(
    ("workers", "store", "batched"),
    [(1, "raw", False), (2, "raw", False), (2, "jpeg", False), (1, "jpeg", False),
     (1, "raw", True), (2, "raw", True)],
)  # fmt: skip
def test_plan_is_written_before_the_first_journal_line(
    image_tree: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    workers: int,
    store: str,
    batched: bool,
) -> None:
    """A fresh build fingerprints while the workers decode; a journal line without a
    plan would let a rerun mix work of other inputs. The late fingerprint is the full
    one: it names the store options and the --device path (here the batched path run
    on the CPU, as tests/builder/test_build_gpu.py does)."""
    dst = tmp_path / "p"
    device = None
    if batched:
        torch = pytest.importorskip("torch")
        device = torch.device("cpu")
        monkeypatch.setattr(pb, "_build_device", lambda config: device)
    config = BuildConfig(size=(32, 32), workers=workers, store=store)
    seen: list[bool] = []
    prints: list[str] = []
    real = pb.start_plan

    def start_plan(work: Path, fingerprint: str) -> None:
        j = work / JOURNAL
        seen.append(not j.exists() or j.stat().st_size == 0)
        prints.append(fingerprint)
        real(work, fingerprint)

    monkeypatch.setattr(pb, "start_plan", start_plan)
    build(image_tree, dst, config)
    assert seen == [True]
    plan = plan_labels(image_tree, config)
    assert prints == [plan_fingerprint(plan, config, device)]
    if batched or store != "raw":
        assert prints[0] != plan_fingerprint(plan, BuildConfig(size=(32, 32)))


def test_forked_worker_closes_the_work_folder_lock(tmp_path: Path) -> None:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    other = os.open(os.devnull, os.O_RDONLY)
    try:
        pb._close_work_dir_fds(str(tmp_path))
        with pytest.raises(OSError):
            os.fstat(fd)
        os.fstat(other)  # others stay open
    finally:
        os.close(other)


def test_start_method_falls_back_when_threads_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("IMGPACK_BUILD_START", raising=False)
    monkeypatch.setattr(pbw, "client_used_here", lambda: False)  # no object storage here
    monkeypatch.setattr(pbw.threading, "active_count", lambda: 1)
    assert pbw._start_method() in ("fork", "forkserver")  # forkserver only with CUDA up
    monkeypatch.setattr(pbw.threading, "active_count", lambda: 3)
    assert pbw._start_method() == "forkserver"


def test_planar_copy_matches_numpy_transpose(image_tree: Path) -> None:
    spec = ResizeSpec(33, 21, "pad")
    compared = 0
    for path in sorted(image_tree.rglob("*.*"))[:6]:
        try:
            im, _ = load_resized(str(path), spec)
        except Exception:
            continue  # broken fixtures
        compared += 1
        out = np.full(spec.shape, 7, np.uint8)
        store_into(im, out)
        assert np.array_equal(out, np.asarray(im.convert("RGB")).transpose(2, 0, 1))
        again = np.empty(spec.shape, np.uint8)
        decode_into(str(path), spec, again)
        assert np.array_equal(out, again)
    assert compared >= 3


def test_same_bytes_whether_workers_fork_or_come_from_the_server(
    image_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = {}
    for method in ("fork", "forkserver"):
        monkeypatch.setenv("IMGPACK_BUILD_START", method)
        build(image_tree, tmp_path / method, BuildConfig(size=(24, 24), workers=2))
        out[method] = (tmp_path / method / "_tensordict" / "images.memmap").read_bytes()
    assert out["fork"] == out["forkserver"]


def test_client_used_here_follows_the_client_runtime() -> None:
    """``client_used_here`` is true once this process's client ran (its runtime's pid)."""
    import packer.storage.client as client

    client._check_not_forked("s3://b/k")
    assert pbw.client_used_here()


def test_no_early_pool_forked_for_a_bucket_once_this_process_used_object_storage(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A bucket source's workers read the bucket: forked early from a process that has
    used its object-store client (an upload, say), they could not; such a build starts its
    pool after the listing, when the workers are spawned. A local source keeps its early
    pool."""
    import sys

    from packer.builder import run
    from packer.builder.config import BuildConfig

    monkeypatch.delenv("IMGPACK_BUILD_START", raising=False)
    monkeypatch.setattr(pbw.threading, "active_count", lambda: 1)
    # the bucket's readers not imported yet, as at a build's start
    monkeypatch.delitem(sys.modules, "packer.builder.formats.remote", raising=False)
    started: list[object] = []
    monkeypatch.setattr(run, "_early_pool", lambda config, dst: started.append(dst) or "pool")
    config = BuildConfig(size=(8, 8), workers=2)
    monkeypatch.setattr(pbw, "client_used_here", lambda: False)
    assert run._listing_pool("s3://b/imgs", tmp_path / "a", config) == "pool"
    monkeypatch.setattr(pbw, "client_used_here", lambda: True)  # the client ran here
    assert run._listing_pool("s3://b/imgs", tmp_path / "b", config) is None
    assert run._listing_pool(str(tmp_path / "x.tar"), tmp_path / "c", config) == "pool"


def test_workers_that_read_files_fork_where_this_process_used_object_storage(
    image_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only workers that read a bucket need a fresh interpreter once this process has used
    its object-store client (an upload, a pack set's shards sent to a bucket): a folder's
    build, or a tar's on disk, forks its workers as before (issue 45.11: spawned workers
    cost a fresh interpreter each, 0.3 CPU-s, at every build of such a process)."""
    import multiprocessing
    import sys

    import packer.builder.formats.remote  # noqa: F401 (a bucket was read here)
    from packer.builder.formats.common import Container, SourceScan

    monkeypatch.delenv("IMGPACK_BUILD_START", raising=False)
    monkeypatch.setattr(pbw.threading, "active_count", lambda: 1)
    monkeypatch.setattr(pbw, "client_used_here", lambda: True)  # the client ran here
    assert "packer.builder.formats.remote" in sys.modules
    assert pbw._start_method() == "spawn"
    assert pbw._start_method(reads_bucket=False) == "fork"
    url, tar = "s3://b/imgs", str(tmp_path / "a.tar")
    bucket = SourceScan(Path(url), [], [], containers=(Container("object", url, url, 1),))
    tar = SourceScan(tmp_path, [], [], containers=(Container("tar", tar, "a.tar", 1),))
    assert pbw.reads_object_storage(bucket) and not pbw.reads_object_storage(tar)
    assert not pbw.reads_object_storage(plan_labels(image_tree, BuildConfig(size=(8, 8))).scan)
    methods: list[str] = []
    real = multiprocessing.get_context

    def spied(method: str | None = None) -> object:
        methods.append(str(method))
        return real(method)

    monkeypatch.setattr(multiprocessing, "get_context", spied)
    r = build(image_tree, tmp_path / "p", BuildConfig(size=(16, 16), workers=2))
    assert r.count == 13 and methods == ["fork"]
