"""Issue 42.12, 42.14, 42.16: ``imgpack show`` on a pack set, bounded sheets, extreme
numbers as one ``Error:`` line, and output files that are not regular files refused
(show --out, verify --plot, verify --trace) before any work."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import cli_run, one_error
from packer.builder import BuildConfig, build
from packer.errors import UsageError
from packer.measure.show import MAX_DRAWS, ShowConfig, show_pack

pytest.importorskip("matplotlib")


@pytest.fixture
def pack_set(image_tree: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "set"
    build(image_tree, dst, BuildConfig(size=(32, 24), workers=1, shard_size=8000))
    return dst


@pytest.mark.parametrize("store", ["raw", "jpeg"])
def test_show_works_on_a_pack_set(image_tree: Path, tmp_path: Path, store: str) -> None:
    dst = tmp_path / f"set-{store}"
    build(image_tree, dst, BuildConfig(size=(32, 24), workers=1, shard_size=4000, store=store))
    assert (dst / "index.json").exists() or any(dst.glob("*.json"))
    single = tmp_path / f"one-{store}"
    build(image_tree, single, BuildConfig(size=(32, 24), workers=1, store=store))
    a = show_pack(ShowConfig(dst, tmp_path / "set.png", per_class=3))
    b = show_pack(ShowConfig(single, tmp_path / "one.png", per_class=3))
    assert (a.rows, a.columns, a.classes) == (b.rows, b.columns, b.classes)
    assert (tmp_path / "set.png").read_bytes() == (tmp_path / "one.png").read_bytes()
    out = tmp_path / "aug.png"
    code, _, err = cli_run("show", dst, "--out", out, "--augment", "ta_wide", "--draws", "2",
                           "--cutmix-alpha", "1.0", "--seed", "3")  # fmt: skip
    assert code == 0, err
    assert out.stat().st_size > 0


@pytest.mark.parametrize(
    "args, match",
    [
        (["--draws", "3000"], r"--draws must be an integer in \[1, 32\]"),
        (["--per-class", "1000000"], r"--per-class must be an integer in"),
        (["--max-classes", str(10**12)], r"--max-classes must be an integer"),
        (["--seed", "-5"], r"--seed must be an integer in \[0, 2\*\*63 - 1\]"),
        (["--seed", str(10**30)], r"--seed must be an integer"),
        (["--mixup-alpha", "1e308"], r"--mixup-alpha must be 0 \(off\)"),
        (["--cutmix-alpha", "inf"], r"--cutmix-alpha must be 0 \(off\)"),
        (["--mixup-alpha", "nan"], r"mixup_alpha|--mixup-alpha"),
        (["--random-erase", "nan"], r"random.erase"),
    ],
)
def test_extreme_show_options_are_one_error_line(
    packed: Path, tmp_path: Path, args: list[str], match: str
) -> None:
    out = tmp_path / "a.png"
    if "--per-class" in args and "--draws" in args:
        args = [*args, "--augment", "ta_wide"]
    code, _, err = cli_run("show", packed, "--out", out, *args)
    assert code == 2, err
    assert "Traceback" not in err
    import re

    assert re.search(match, one_error(err)), err
    assert not out.exists()


def test_the_draws_bound_itself_is_taken(packed: Path, tmp_path: Path) -> None:
    r = show_pack(
        ShowConfig(
            packed,
            tmp_path / "a.png",
            per_class=1,
            max_classes=1,
            draws=MAX_DRAWS,
            random_erase=0.5,
        )
    )
    assert r.draws == MAX_DRAWS and r.columns == MAX_DRAWS + 1


def test_a_sheet_past_its_cell_bound_is_refused_before_drawing(
    packed: Path, tmp_path: Path
) -> None:
    cfg = ShowConfig(
        packed, tmp_path / "a.png", per_class=1, draws=12, random_erase=0.5, _max_cells=20
    )
    with pytest.raises(UsageError, match=r"the sheet would hold 39 images, more than 20"):
        show_pack(cfg)
    assert not (tmp_path / "a.png").exists()


def _specials(tmp_path: Path) -> dict[str, Path]:
    fifo = tmp_path / "fifo.png"
    os.mkfifo(fifo)
    target = tmp_path / "target.png"
    target.write_bytes(b"keep me")
    link = tmp_path / "link.png"
    link.symlink_to(target)
    dangling = tmp_path / "dangling.png"
    dangling.symlink_to(tmp_path / "nowhere.png")
    return {"a FIFO": fifo, "a symbolic link": link, "a symbolic link ": dangling,
            "a device": Path("/dev/null")}  # fmt: skip


def test_show_out_that_is_not_a_regular_file_is_refused_before_any_work(
    packed: Path, tmp_path: Path
) -> None:
    for kind, path in _specials(tmp_path).items():
        code, _, err = cli_run("show", packed, "--out", path)
        assert code == 2, (kind, err)
        assert one_error(err) == (
            f"Error: {path}: --out exists and is {kind.strip()}, not a regular file; imgpack "
            "replaces only regular files: choose another path"
        )
        with pytest.raises(UsageError, match="not a regular file"):
            show_pack(ShowConfig(packed, path))
    assert os.path.islink(tmp_path / "link.png") and (tmp_path / "target.png").read_bytes() == (
        b"keep me"
    )
    assert Path("/dev/null").is_char_device()
    assert not list(tmp_path.glob(".*.tmp"))
    regular = tmp_path / "old.png"
    regular.write_bytes(b"old")
    code, _, err = cli_run("show", packed, "--out", regular)
    assert code == 0, err and regular.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("option", ["--plot", "--trace"])
def test_verify_outputs_that_are_not_regular_files_are_refused(
    packed: Path, tmp_path: Path, option: str
) -> None:
    for kind, path in _specials(tmp_path).items():
        code, out, err = cli_run("verify", packed, option, path, "--no-source")
        assert code == 2, (kind, err)
        assert one_error(err) == (
            f"Error: {path}: {option} exists and is {kind.strip()}, not a regular file; imgpack "
            "replaces only regular files: choose another path"
        )
        assert "checks" not in out  # refused before any work
