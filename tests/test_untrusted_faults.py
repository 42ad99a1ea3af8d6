"""Untrusted packs run no code; killed builds resume to byte-identical packs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import packer
from packer.build.run import BuildConfig, build, dest_lock, work_dir_for
from packer.errors import DiskFullError, PackBusyError, PackFormatError


def edit_manifest(pack: Path, **changes: object) -> None:
    m = json.loads((pack / "imgpack.json").read_text())
    m.update(changes)
    (pack / "imgpack.json").write_text(json.dumps(m))


@pytest.mark.parametrize(
    "tamper, message",
    [
        (
            lambda p: (p / "meta.json").write_text('{"_type": "<class \'os.system\'>"}'),
            "meta.json names type \"<class 'os.system'>\"",
        ),
        (
            lambda p: (p / "_tensordict" / "other.pickle").write_bytes(b"cos\nsystem\n"),
            "holds _tensordict/other.pickle, a file type imgpack never writes",
        ),
        (
            lambda p: edit_manifest(
                p,
                sources=[
                    "../../etc/passwd",
                    *json.loads((p / "imgpack.json").read_text())["sources"][1:],
                ],
            ),
            "leaves the source folder",
        ),
        (lambda p: edit_manifest(p, image_shape=[3, 240, 320]), "the manifest says"),
        (lambda p: edit_manifest(p, version=99), "newer imgpack (format version 99"),
        (lambda p: (p / "imgpack.json").write_text("{not json"), "not valid JSON"),
    ],
)
def test_untrusted_pack_refused_before_anything_runs(packed: Path, tamper, message: str) -> None:
    tamper(packed)
    with pytest.raises(PackFormatError, match=message.replace("(", r"\(").replace("[", r"\[")):
        packer.load(packed)


def test_data_file_symlinked_outside_is_refused(packed: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.bin"
    data = packed / "_tensordict" / "images.memmap"
    outside.write_bytes(data.read_bytes())
    data.unlink()
    data.symlink_to(outside)
    with pytest.raises(PackFormatError, match="missing or not a regular file"):
        packer.load(packed)


def test_loading_imports_nothing_named_in_the_pack(packed: Path) -> None:
    (packed / "meta.json").write_text('{"_type": "<class \'evil_module_xyz.Payload\'>"}')
    with pytest.raises(PackFormatError):
        packer.load(packed)
    assert "evil_module_xyz" not in sys.modules


KILL_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    from packer.build.run import BuildConfig, build
    seen = 0
    def progress(n):
        global seen
        seen += 1
        if seen == int(sys.argv[3]):
            os.kill(os.getpid(), signal.SIGKILL)
    if __name__ == "__main__":  # worker processes import this module
        build(sys.argv[1], sys.argv[2], BuildConfig(size=(24, 24), workers=int(sys.argv[4])),
              progress=progress)
""")


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
    assert len(journal) == kill_after
    r = build(image_tree, dst, BuildConfig(size=(24, 24), workers=1))
    assert r.resumed == kill_after  # one image per chunk for 13 images
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
    assert build(image_tree, tmp_path / "p", BuildConfig(size=(8, 8), workers=1)).resumed == 3


def test_changed_inputs_restart_instead_of_mixing(image_tree: Path, tmp_path: Path) -> None:
    def stop(n: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build(image_tree, tmp_path / "p", BuildConfig(size=(8, 8), workers=1), progress=stop)
    assert build(image_tree, tmp_path / "p", BuildConfig(size=(9, 9), workers=1)).resumed == 0


def test_second_writer_is_refused(image_tree: Path, tmp_path: Path) -> None:
    dst = tmp_path / "p"
    with dest_lock(dst), pytest.raises(PackBusyError, match="another imgpack process is writing"):
        build(image_tree, dst, BuildConfig(size=(8, 8), workers=1))


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


def test_two_readers_share_one_pack(packed: Path) -> None:
    code = (
        "import packer,sys; p=packer.load(sys.argv[1]); "
        "print(int(p.images.sum()), p.labels.tolist()[-1])"
    )
    outs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(packed)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    results = {o.communicate()[0] for o in outs}
    assert len(results) == 1 and all(o.returncode == 0 for o in outs)


def test_rows_in_memory_are_not_preallocated_but_room_is_checked(
    image_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On tmpfs the rows file is made at its size without reserving pages (reserving
    would zero what the rows then overwrite); a lack of room is still the clear error
    before any decode, and the pack is the same bytes as one built on a disk."""
    import shutil
    from collections import namedtuple

    import packer.build.workdir as wd

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
    import packer.build.workdir as wd

    for path in (tmp_path, Path("/dev/shm"), Path("/")):
        if not path.is_dir():
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            assert wd._in_memory(fd) == (_mount_type(path.resolve()) in ("tmpfs", "ramfs")), path
        finally:
            os.close(fd)
