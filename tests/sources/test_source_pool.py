"""The CPU workers of a source build (parquet, tar, zip, a bucket) are started before
the source is listed, so they boot while it is (a folder's start before its scan), when
they would be forked now; a source that is refused stops them; a refused symlink DST
starts none."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
from source_data import digests, tree, write_shards

import packer.builder.formats.base as base
from packer.builder.api import BuildConfig, build
from packer.errors import InputError, UsageError

CONFIG = BuildConfig(size=(24, 24), workers=2)


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The worker processes alive when the build lists its source."""
    monkeypatch.setenv("IMGPACK_BUILD_START", "fork")  # as a CLI process without threads
    seen: list[int] = []
    real = base.source_plan

    def listing(*args: object, **kwargs: object) -> object:
        seen.append(len(multiprocessing.active_children()))
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(base, "source_plan", listing)
    return seen


def test_workers_boot_while_tars_are_listed(tmp_path: Path, spy: list[int]) -> None:
    folder = tree(tmp_path / "src")
    write_shards(folder, tmp_path / "shards", maxcount=5)
    src = str(tmp_path / "shards" / "train-{000000..000003}.tar")
    r = build(src, tmp_path / "pack", CONFIG)
    assert spy == [2] and r.count == 16 and not r.skipped
    build(src, tmp_path / "ref", BuildConfig(size=(24, 24), workers=1))  # no pool at all
    assert spy == [2, 0]
    assert digests(tmp_path / "pack") == digests(tmp_path / "ref")


def test_a_refused_source_stops_the_workers(tmp_path: Path, spy: list[int]) -> None:
    (tmp_path / "a.tar").write_bytes(b"")
    (tmp_path / "b.zip").write_bytes(b"")
    with pytest.raises(UsageError, match="files of one kind at a time"):
        build([str(tmp_path / "a.tar"), str(tmp_path / "b.zip")], tmp_path / "pack", CONFIG)
    assert spy == [2]
    assert multiprocessing.active_children() == []
    assert not (tmp_path / "pack").exists()


def test_a_symlink_destination_starts_no_workers(tmp_path: Path, spy: list[int]) -> None:
    folder = tree(tmp_path / "src")
    write_shards(folder, tmp_path / "shards", maxcount=5)
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(InputError, match="is a symbolic link"):
        build(str(tmp_path / "shards" / "train-000000.tar"), tmp_path / "link", CONFIG)
    assert multiprocessing.active_children() == []
