"""A build stopped anywhere (SIGKILL, Ctrl-C, a crash in finalize) resumes to the same
bytes; changed inputs start over."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import packer
import packer.builder.finalize
from conftest import KILL_SCRIPT, assert_same_pack, beside
from packer.builder.run import BuildConfig, build, work_dir_for

STEPS = ["data", "labels", "manifest", "assembled", "journal.jsonl", "plan.json", "aside", "moved"]


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("with_skips", [True, False])
def test_crash_at_every_finalize_step_resumes_to_the_same_pack(
    image_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str, with_skips: bool
) -> None:
    if with_skips:  # compaction is a step of its own
        (image_tree / "dog" / "broken.jpg").write_bytes(b"not a jpeg")
    config = BuildConfig(size=(8, 6), workers=1, overwrite=True)
    build(image_tree, tmp_path / "ref", config)
    dst = tmp_path / "out" / "pack"
    build(image_tree, dst, BuildConfig(size=(4, 4), workers=1))  # an old pack to replace

    def crash(name: str) -> None:
        if name == step:
            raise RuntimeError(f"crash after {name}")

    monkeypatch.setattr(packer.builder.finalize, "_reached", crash)
    with pytest.raises(RuntimeError, match="crash after"):
        build(image_tree, dst, config)
    monkeypatch.undo()
    r = build(image_tree, dst, config)
    assert r.count == 13
    assert_same_pack(dst, tmp_path / "ref")
    assert beside(dst) == ["pack"]  # no work folder, old pack or lock left


@pytest.mark.parametrize("kill_after, workers", [(1, 1), (5, 1), (12, 2)])
def test_killed_build_resumes_byte_identical(
    image_tree: Path, tmp_path: Path, kill_after: int, workers: int
) -> None:
    ref = tmp_path / "ref"
    build(image_tree, ref, BuildConfig(size=(24, 24), workers=1))
    dst = tmp_path / "out" / "pack"
    dst.parent.mkdir()
    script = tmp_path / "kill.py"
    script.write_text(KILL_SCRIPT)
    # Output to a file, not a pipe: multiprocessing's resource tracker outlives the
    # killed process for a moment and would hold a pipe open.
    with open(tmp_path / "log.txt", "w") as log:
        p = subprocess.run(
            [sys.executable, str(script), str(image_tree), str(dst), str(kill_after), str(workers)],
            stdout=log,
            stderr=log,
            timeout=120,
        )
    assert p.returncode == -9, (tmp_path / "log.txt").read_text()
    assert not dst.exists()  # never a partial pack at DST
    journal = (work_dir_for(dst) / "journal.jsonl").read_text().splitlines()
    # every reported chunk is in the journal; chunks that arrived together are journaled
    # (one fsync) before any of them is reported, so it may hold a few more
    assert kill_after <= len(journal) <= 13
    r = build(image_tree, dst, BuildConfig(size=(24, 24), workers=1))
    assert r.resumed == len(journal)  # one image per chunk for 13 images
    for f in (
        "_tensordict/images.memmap",
        "_tensordict/labels.memmap",
        "_tensordict/meta.json",
        "meta.json",
    ):
        assert (dst / f).read_bytes() == (ref / f).read_bytes(), f
    a, b = (json.loads((d / "imgpack.json").read_text()) for d in (dst, ref))
    a["build"].pop("created"), b["build"].pop("created")
    assert a == b


def test_interrupted_build_keeps_work_and_resumes(image_tree: Path, tmp_path: Path) -> None:
    calls = {"n": 0}

    def ctrl_c(n: int) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build(image_tree, tmp_path / "p", BuildConfig(size=(8, 8), workers=1), progress=ctrl_c)
    assert not (tmp_path / "p").exists()
    # every reported chunk is kept (those journaled with it in one fsync too)
    resumed = build(image_tree, tmp_path / "p", BuildConfig(size=(8, 8), workers=1)).resumed
    assert 3 <= resumed < 13


def test_changed_inputs_restart_instead_of_mixing(image_tree: Path, tmp_path: Path) -> None:
    def stop(n: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build(image_tree, tmp_path / "p", BuildConfig(size=(8, 8), workers=1), progress=stop)
    assert build(image_tree, tmp_path / "p", BuildConfig(size=(9, 9), workers=1)).resumed == 0


def test_progress_never_runs_ahead_of_the_fsynced_journal(image_tree: Path, tmp_path: Path) -> None:
    """Chunks that arrive together are journaled with one fsync: ``progress`` hears of
    each only after it, so a kill right after a report never loses a reported chunk."""
    import time

    dst = tmp_path / "pack"
    seen: list[tuple[int, int]] = []  # (chunks reported, journal lines on disk)

    def progress(n: int) -> None:
        lines = (work_dir_for(dst) / "journal.jsonl").read_text().splitlines()
        seen.append((len(seen) + 1, len(lines)))
        if len(seen) == 1:  # the parent busy: the next chunks arrive together (the case)
            time.sleep(0.5)

    build(image_tree, dst, BuildConfig(size=(8, 8), workers=2), progress=progress)
    assert len(seen) == 13  # one image a chunk
    assert all(lines >= k for k, lines in seen), seen
