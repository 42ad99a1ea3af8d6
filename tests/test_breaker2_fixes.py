"""Regression tests for the second adversarial round (issue 16's standard): odd names,
symlinked destinations, compress nesting, signals, hostile JSON, huge sizes, bad paths."""

from __future__ import annotations

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
