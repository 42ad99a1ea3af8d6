"""A build's spool (:mod:`packer.builder.formats.spool`) under hostile names: a shard key
of many non-ASCII letters, a DST whose name leaves no room for the spool's, a folder of
the user's named like a spool, a living build's spool beside a second build's sweep."""

from __future__ import annotations

import os
from pathlib import Path

from packer.builder.formats import spool
from packer.builder.formats.options import SourceOptions


def _plan(dst: Path, names: list[str]) -> list[str]:
    with spool.spool_area(dst):
        files = spool.plan_spool(names, [10] * len(names), SourceOptions())
        for f in files:
            if f:
                Path(f).write_bytes(b"x" * 10)  # what the listing's fetch does
        return files


def test_a_shard_key_of_non_ascii_letters_makes_a_spool_file_that_fits(tmp_path: Path) -> None:
    # 4-byte letters (isalnum): 80 of them are 320 bytes, past a file name's 255
    names = ["\U0001d400" * 100 + ".tar", "é" * 200 + ".tar", "../../x.tar", "a" * 300]
    files = _plan(tmp_path / "pack", names)
    assert all(files) and len(set(files)) == len(files)
    for f in files:
        assert len(os.path.basename(f).encode()) <= 255
        assert Path(f).parent.parent == tmp_path  # inside the spool, beside DST
    assert os.listdir(tmp_path) == []  # removed at the end


def test_a_dst_name_too_long_for_the_spool_reads_in_place(tmp_path: Path) -> None:
    dst = tmp_path / ("p" * 240)  # a valid name; the spool's (+ 24 characters) is not
    assert _plan(dst, ["a.tar", "b.tar"]) == ["", ""]
    assert os.listdir(tmp_path) == []


def test_the_stale_sweep_removes_only_spool_named_folders(tmp_path: Path) -> None:
    dst = tmp_path / "pack"
    mine = [tmp_path / ".pack.imgpack-spool-notes", tmp_path / ".pack.imgpack-spool-123456789"]
    for d in mine:
        d.mkdir()
        (d / "keep.txt").write_text("the user's")
    stale = tmp_path / ".pack.imgpack-spool-dead_eef"  # a killed build's (mkdtemp's name)
    stale.mkdir()
    (tmp_path / "[p]ack").mkdir()  # glob characters in a sibling DST's name
    other = tmp_path / ".[p]ack.imgpack-spool-abcdefgh"
    other.mkdir()
    spool.remove_stale(dst)
    assert all((d / "keep.txt").exists() for d in mine)
    assert not stale.exists() and other.exists()
    spool.remove_stale(tmp_path / "[p]ack")
    assert not other.exists()


def test_a_second_build_to_the_same_dst_keeps_the_first_ones_spool(tmp_path: Path) -> None:
    dst = tmp_path / "pack"
    first = spool.Spool(dst)
    try:
        Path(first.file(0, "a.tar")).write_bytes(b"x")
        assert _plan(dst, ["b.tar"])[0]  # the second build spools beside it, and ends
        assert Path(first.file(0, "a.tar")).exists()
        assert [n for n in os.listdir(tmp_path)] == [first.path.name]
    finally:
        first.remove()
    assert os.listdir(tmp_path) == []


def test_the_folders_made_for_the_spool_go_with_it_unless_used(tmp_path: Path) -> None:
    """A DST in folders that do not exist yet: a build that fails leaves none behind (as
    a build from local files, which makes them only for its work); one that wrote there
    keeps them."""
    assert _plan(tmp_path / "a" / "b" / "pack", ["x.tar"])[0]
    assert os.listdir(tmp_path) == []
    dst = tmp_path / "c" / "d" / "pack"
    with spool.spool_area(dst):
        assert spool.plan_spool(["x.tar"], [10], SourceOptions())[0]
        dst.mkdir()  # the build's output
    assert os.listdir(dst.parent) == ["pack"]
