"""The build's DST: symbolic links, unwritable folders, one writer at a time, nothing
left beside it."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

import packer
from conftest import beside
from conftest import cli_build as _build
from conftest import one_error as _one_error
from packer.builder.run import BuildConfig, build, dest_lock
from packer.cli import cli
from packer.errors import InputError, PackBusyError


def _beside(tmp_path: Path) -> set[str]:
    return {p.name for p in tmp_path.iterdir()}


def test_dst_symlink_to_an_empty_folder_is_refused_up_front(src: Path, tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    before = _beside(tmp_path)
    for _ in range(2):  # and the rerun is refused the same way, nothing wedged
        code, _, err = _build(src, tmp_path / "link")
        assert code == 2
        line = _one_error(err)
        assert "is a symbolic link; give the real folder" in line and "real" in line
        assert _beside(tmp_path) == before and not any((tmp_path / "real").iterdir())
    code, _, err = _build(src, tmp_path / "real")  # the real folder works
    assert code == 0, err
    assert len(packer.load(tmp_path / "real")) == 3


@pytest.mark.parametrize("target", ["pack", "missing"])
def test_dst_symlink_with_overwrite_is_refused_and_link_kept(
    src: Path, tmp_path: Path, target: str
) -> None:
    assert _build(src, tmp_path / "pack")[0] == 0
    (tmp_path / "lp").symlink_to(target)
    before = _beside(tmp_path)
    code, _, err = _build(src, tmp_path / "lp", "--overwrite")
    assert code == 2 and "is a symbolic link" in _one_error(err)
    assert _beside(tmp_path) == before and (tmp_path / "lp").is_symlink()
    assert len(packer.load(tmp_path / "pack")) == 3


def test_library_build_refuses_symlinked_dst(src: Path, tmp_path: Path) -> None:
    from packer.builder.run import BuildConfig, build
    from packer.errors import InputError

    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    with pytest.raises(InputError, match="symbolic link"):
        build(src, tmp_path / "link", BuildConfig(size=(8, 6), workers=1))
    assert not any((tmp_path / "real").iterdir())


def test_leftover_old_pack_that_is_a_symlink_does_not_wedge_overwrite(
    src: Path, tmp_path: Path
) -> None:
    # what an older imgpack left after `--overwrite` onto a linked DST: the new pack
    # at DST and the user's link moved aside as .DST.imgpack-old
    assert _build(src, tmp_path / "rp")[0] == 0
    assert _build(src, tmp_path / "dst")[0] == 0
    (tmp_path / ".dst.imgpack-old").symlink_to("rp")
    for _ in range(2):
        code, _, err = _build(src, tmp_path / "dst", "--overwrite")
        assert code == 0, err
    assert not (tmp_path / ".dst.imgpack-old").is_symlink()
    assert len(packer.load(tmp_path / "rp")) == 3  # the link's target is untouched
    # a link left aside with no DST is put back (the swap never finished)
    (tmp_path / "gone").symlink_to("rp")
    (tmp_path / "gone").rename(tmp_path / ".gone.imgpack-old")
    from packer.builder.workdir import recover_trash

    recover_trash(tmp_path / "gone")
    assert (tmp_path / "gone").is_symlink() and not (tmp_path / ".gone.imgpack-old").exists()


@pytest.mark.parametrize("command", ["build", "compress"])
@pytest.mark.parametrize(
    "error", [(errno.EROFS, "Read-only file system"), (errno.EACCES, "Permission denied")]
)
def test_unwritable_destination_is_one_error_line_exit_2(
    image_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str, error
) -> None:
    real_mkdir = Path.mkdir
    out = tmp_path / "ro"

    def mkdir(self: Path, *a: object, **kw: object) -> None:
        if self.is_relative_to(out) and self != out:  # the first write in the read-only folder
            raise OSError(error[0], error[1], str(self))
        real_mkdir(self, *a, **kw)

    out.mkdir()
    monkeypatch.setattr(Path, "mkdir", mkdir)
    res = CliRunner().invoke(cli, [command, str(image_tree), str(out / "dst"), "-q"])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {out}/")
    assert f"cannot write there ({error[1]})" in lines[0]


def test_build_leaves_nothing_beside_dst(image_tree: Path, tmp_path: Path) -> None:
    dst = tmp_path / "out" / "pack"
    build(image_tree, dst, BuildConfig(size=(8, 8), workers=1))
    assert beside(dst) == ["pack"]
    with pytest.raises(InputError):
        build(image_tree, dst, BuildConfig(size=(8, 8), workers=1))  # refused: a pack exists
    assert beside(dst) == ["pack"]


def test_dst_dot_in_an_empty_folder(
    image_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    here = tmp_path / "empty"
    here.mkdir()
    monkeypatch.chdir(here)
    build(image_tree, ".", BuildConfig(size=(8, 8), workers=1))
    assert packer.load(here).images.shape == (13, 3, 8, 8)
    assert sorted(os.listdir(tmp_path)) == ["empty", "imgs"]


def test_second_writer_is_refused(image_tree: Path, tmp_path: Path) -> None:
    dst = tmp_path / "p"
    with dest_lock(dst), pytest.raises(PackBusyError, match="another imgpack process is writing"):
        build(image_tree, dst, BuildConfig(size=(8, 8), workers=1))
