"""Regression tests for the second adversarial round (issue 16's standard): odd names,
symlinked destinations, compress nesting, signals, hostile JSON, huge sizes, bad paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import packer
from conftest import write_image
from packer.cli import cli


def _cli(*args: object) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, [str(a) for a in args])
    return r.exit_code, r.stdout, r.stderr


def _build(src: Path, dst: Path, *extra: object) -> tuple[int, str, str]:
    return _cli("build", src, dst, "--size", "8x6", "--workers", "1", "-q", *extra)


def _one_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def src(tmp_path: Path) -> Path:
    for rel in ("cat/0.png", "cat/1.png", "dog/0.png"):
        write_image(tmp_path / "src" / rel, (12, 10), seed=len(rel))
    return tmp_path / "src"


# ---------------------------------------------------------------- 1. odd names


@pytest.mark.parametrize("name", ["x\\y.png", "..\\..\\up.png", "c:x.png", "..x.png", "tail\\.png"])
def test_backslash_and_odd_names_build_load_info_verify(src: Path, tmp_path: Path, name: str):
    write_image(src / "cat" / name, (12, 10), seed=7)
    code, _, err = _build(src, tmp_path / "pk")
    assert code == 0, err
    pack = packer.load(tmp_path / "pk")
    assert f"cat/{name}" in pack.sources and len(pack) == 4
    code, out, err = _cli("info", tmp_path / "pk", "--json")
    assert code == 0, err
    code, out, err = _cli(
        "verify", tmp_path / "pk", "--source", src, "--sample", "all", "--no-speed", "-q"
    )
    assert code == 0, out + err
    assert "4 source images re-decoded" in out, out


@pytest.mark.parametrize(
    "bad", ["/etc/passwd", "../x.png", "cat/../../x.png", "", "a\x00b", "cat/..", 5]
)
def test_sources_that_leave_the_root_are_still_refused(bad: object) -> None:
    from packer.format import _source_ok

    assert not _source_ok(bad)
    assert _source_ok("cat/x\\..\\y.png")  # one POSIX name: stays under the root


# ---------------------------------------------------------------- 2, 3. symlinked DST


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
    from packer.build import BuildConfig, build
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
    from packer.workdir import recover_trash

    recover_trash(tmp_path / "gone")
    assert (tmp_path / "gone").is_symlink() and not (tmp_path / ".gone.imgpack-old").exists()


# ---------------------------------------------------------------- 6. deep JSON

DEEP = "[" * 100_000


def test_compress_with_a_deeply_nested_options_record_redoes_instead_of_crashing(
    src: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    assert _cli("compress", src, out, "-q")[0] == 0
    (out / ".imgpack-compress.json").write_text(DEEP)
    code, _, err = _cli("compress", src, out, "-q", "--json")
    assert code == 0 and "Traceback" not in err, err
    assert json.loads((out / ".imgpack-compress.json").read_text())["quality"] == 3


@pytest.mark.parametrize("name", ["plan.json", "journal.jsonl"])
def test_work_folder_files_nested_deeply_are_discarded(tmp_path: Path, name: str) -> None:
    from packer.workdir import prepare_work_dir, read_journal

    work = tmp_path / "w"
    work.mkdir()
    (work / name).write_text(DEEP + "\n")
    assert read_journal(work / "journal.jsonl") == {}
    state = prepare_work_dir(work, "fp", 16)
    assert state.done == {} and not state.assembled


def test_every_json_reader_shares_the_guard() -> None:
    # the class of problem: any json.loads on a file imgpack reads back
    import re

    root = Path(packer.__file__).parent
    for mod in ("format.py", "workdir.py", "compress.py", "verify.py", "scan.py", "cli.py"):
        text = (root / mod).read_text()
        calls = re.findall(r"json\.loads?\(", text)
        allowed = 1 if mod == "format.py" else 0  # loads_json itself
        assert len(calls) == allowed, (mod, calls)


# ---------------------------------------------------------------- 7. huge sizes


def test_transform_sizes_are_bounded_up_front() -> None:
    import torch

    from packer import transforms as T

    huge = 10**6
    for make in (
        lambda: T.RandomResizedCrop(huge),
        lambda: T.Resize(huge),
        lambda: T.CenterCrop(huge),
        lambda: T.Resize((8, T.MAX_SIDE + 1)),
        lambda: T.RandomResizedCrop(8).__setattr__("size", huge),
    ):
        with pytest.raises(ValueError, match="too large"):
            make()
    images = torch.zeros(1, 3, 4, 4, dtype=torch.uint8)
    boxes = torch.tensor([[0, 0, 4, 4]])
    with pytest.raises(ValueError, match="too large"):
        T.resized_crop(images, boxes, size=huge)
    # an int Resize whose longer side would exceed the bound (a 1x40 strip to 1000 short)
    strip = torch.zeros(1, 3, 1, 40, dtype=torch.uint8)
    with pytest.raises(ValueError, match="too large"):
        T.Resize(1000)(strip)
    assert T.Resize(T.MAX_SIDE).size == T.MAX_SIDE  # the bound itself is allowed
    assert T.resized_crop(images, boxes, size=(2, 3)).shape == (1, 3, 2, 3)


# ---------------------------------------------------------------- 8. verify --source


def test_verify_source_missing_or_a_file_is_bad_usage(src: Path, tmp_path: Path) -> None:
    assert _build(src, tmp_path / "pk")[0] == 0
    (tmp_path / "f.txt").write_text("x")
    for bad, what in ((tmp_path / "nonexist", "no such folder"), (tmp_path / "f.txt", "a file")):
        code, out, err = _cli("verify", tmp_path / "pk", "--source", bad, "--no-speed", "-q")
        assert code == 2, out + err
        line = _one_error(err)
        assert line.startswith(f"Error: {bad}: --source must be a folder") and what in line
    # the folder recorded at build time gone is not the user's mistake: no error
    src.rename(tmp_path / "moved")
    assert _cli("verify", tmp_path / "pk", "--no-speed", "-q")[0] == 0


# ---------------------------------------------------------------- 4. compress nesting


@pytest.mark.parametrize("dst_rel", ["real/out", "real", "real/deeper/out", "holder/s/out"])
def test_compress_into_a_folder_src_reaches_through_a_link_is_refused(
    tmp_path: Path, dst_rel: str
) -> None:
    for i in range(2):
        write_image(tmp_path / "real" / f"{i}.png", (12, 10), seed=i)
    (tmp_path / "holder").mkdir()
    (tmp_path / "holder" / "s").symlink_to("../real")
    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "real").rglob("*"))
    for _ in range(2):
        code, _, err = _cli("compress", tmp_path / "holder", tmp_path / dst_rel, "-q")
        assert code == 2, err
        line = _one_error(err)
        assert "through a symbolic link" in line or "inside the source" in line
    after = sorted(p.relative_to(tmp_path) for p in (tmp_path / "real").rglob("*"))
    assert after == before  # nothing written, nothing nested


def test_compress_beside_a_linked_source_still_works(tmp_path: Path) -> None:
    write_image(tmp_path / "real" / "0.png", (12, 10))
    (tmp_path / "holder").mkdir()
    (tmp_path / "holder" / "s").symlink_to("../real")
    code, _, err = _cli("compress", tmp_path / "holder", tmp_path / "out", "-q")
    assert code == 0, err
    assert [
        p.relative_to(tmp_path / "out").parts[0] for p in (tmp_path / "out").rglob("*.jpg")
    ] == ["s"]


def test_compress_quiet_prints_nothing_for_a_symlink_loop(tmp_path: Path) -> None:
    write_image(tmp_path / "src" / "a" / "0.png", (12, 10))
    (tmp_path / "src" / "a" / "loop").symlink_to("..")
    import subprocess
    import sys

    from conftest import subprocess_env

    r = subprocess.run(
        [sys.executable, "-m", "packer", "compress", tmp_path / "src", tmp_path / "out", "-q"],
        capture_output=True,
        text=True,
        env=subprocess_env(),
    )
    assert r.returncode == 0 and r.stderr == "", r.stderr
