"""The build's work folder: hostile contents discarded, disk room checked before any
decode, rows files in memory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from packer.builder.run import BuildConfig, build
from packer.errors import DiskFullError

DEEP = "[" * 100_000


@pytest.mark.parametrize("name", ["plan.json", "journal.jsonl"])
def test_work_folder_files_nested_deeply_are_discarded(tmp_path: Path, name: str) -> None:
    from packer.builder.workdir import prepare_work_dir, read_journal

    work = tmp_path / "w"
    work.mkdir()
    (work / name).write_text(DEEP + "\n")
    assert read_journal(work / "journal.jsonl") == {}
    state = prepare_work_dir(work, "fp", 16)
    assert state.done == {} and not state.assembled


def test_full_disk_gives_clear_error_and_rerun_completes(
    image_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    def no_space(fd: int, off: int, n: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    with pytest.raises(DiskFullError, match=r"not enough disk space .* run the same command again"):
        build(image_tree, tmp_path / "p", BuildConfig(size=(8, 8), workers=1))
    monkeypatch.undo()
    assert build(image_tree, tmp_path / "p", BuildConfig(size=(8, 8), workers=1)).count == 13


def test_rows_in_memory_are_not_preallocated_but_room_is_checked(
    image_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On tmpfs the rows file is made at its size without reserving pages (reserving
    would zero what the rows then overwrite); a lack of room is still the clear error
    before any decode, and the pack is the same bytes as one built on a disk."""
    import shutil
    from collections import namedtuple

    import packer.builder.workdir as wd

    monkeypatch.setattr(wd, "_in_memory", lambda fd: False)
    build(image_tree, tmp_path / "disk", BuildConfig(size=(8, 8), workers=1))
    monkeypatch.setattr(wd, "_in_memory", lambda fd: True)
    build(image_tree, tmp_path / "mem", BuildConfig(size=(8, 8), workers=1))
    for f in ("_tensordict/images.memmap", "_tensordict/labels.memmap"):
        assert (tmp_path / "mem" / f).read_bytes() == (tmp_path / "disk" / f).read_bytes()

    path = tmp_path / "rows.u8"
    wd._preallocate(path, 1 << 22)
    assert path.stat().st_size == 1 << 22 and path.stat().st_blocks * 512 < 1 << 20  # sparse
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(1 << 30, 1 << 30, 100))
    with pytest.raises(DiskFullError, match=r"not enough disk space .* 0.00 GB free"):
        build(image_tree, tmp_path / "full", BuildConfig(size=(8, 8), workers=1))


def _mount_type(path: Path) -> str | None:
    """The file system type of ``path``'s mount, from /proc/self/mounts (longest match)."""
    best, kind = "", None
    with open("/proc/self/mounts") as f:
        for line in f:
            _, at, fs = line.split()[:3]
            at = at.replace("\\040", " ")
            if (str(path) == at or str(path).startswith(at.rstrip("/") + "/")) and len(at) > len(
                best
            ):
                best, kind = at, fs
    return kind


@pytest.mark.skipif(not Path("/proc/self/mounts").exists(), reason="Linux only")
def test_in_memory_agrees_with_the_mount_table(tmp_path: Path) -> None:
    import packer.builder.workdir as wd

    for path in (tmp_path, Path("/dev/shm"), Path("/")):
        if not path.is_dir():
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            assert wd._in_memory(fd) == (_mount_type(path.resolve()) in ("tmpfs", "ramfs")), path
        finally:
            os.close(fd)
