"""Where the data is, decided once (issue 45.4): :mod:`packer.storage.open` says whether a
path is a URL, a set or a pack, and ``packer.load``, ``describe`` and ``packer.verify_pack``
follow it; the pack format's reader opens one local pack and nothing else."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import packer
from conftest import write_image
from packer.builder.api import BuildConfig, build
from packer.errors import PackFormatError, UsageError
from packer.pack.describe import describe_set
from packer.pack.reader import open_pack
from packer.storage.open import describe, load, read_class_map, where
from packer.storage.packset import PackSet

SET_CONFIG = BuildConfig(size=(8, 6), workers=1, shard_size=300)  # two images per shard


@pytest.fixture
def src(tmp_path: Path) -> Path:
    for c in ("cat", "dog"):
        for i in range(2):
            write_image(tmp_path / "src" / c / f"{i}.png", (20, 16), seed=i + 10 * (c == "dog"))
    return tmp_path / "src"


@pytest.fixture
def pack(src: Path, tmp_path: Path) -> Path:
    build(src, tmp_path / "pack", BuildConfig(size=(8, 6), workers=1))
    return tmp_path / "pack"


@pytest.fixture
def pack_set(src: Path, tmp_path: Path) -> Path:
    build(src, tmp_path / "set", SET_CONFIG)
    return tmp_path / "set"


def test_where_names_a_url_a_set_and_a_pack(pack: Path, pack_set: Path) -> None:
    assert where("s3://bucket/train").kind == "url"
    assert where("gs://bucket").path == "gs://bucket"
    assert where(pack_set).kind == "set" and where(str(pack_set)).path == pack_set
    assert where(pack).kind == "pack" and not where(pack).cached
    assert where(pack / "missing").kind == "pack"  # the pack's reader says what is wrong


def test_a_url_folded_by_pathlib_is_named_as_one() -> None:
    with pytest.raises(UsageError, match=r"folded by pathlib .*pass the URL as a str"):
        where(Path("s3://bucket/train"))


def test_a_folder_that_is_both_is_refused_by_every_entry(pack: Path, pack_set: Path) -> None:
    shutil.copy(pack / "imgpack.json", pack_set / "imgpack.json")
    for call in (where, load, describe, read_class_map, packer.verify_pack):
        with pytest.raises(PackFormatError, match="holds both a pack set's index"):
            call(pack_set)


def test_load_opens_a_pack_or_a_set(pack: Path, pack_set: Path) -> None:
    assert packer.load is load
    assert isinstance(load(pack), packer.ImagePack) and len(load(pack)) == 4
    s = load(str(pack_set))
    assert isinstance(s, PackSet) and len(s) == 4 and s.classes == ["cat", "dog"]


def test_the_format_reader_opens_one_local_pack_only(pack_set: Path) -> None:
    """pack/ is the format: its reader neither opens sets nor reaches object storage."""
    with pytest.raises(PackFormatError, match=r"imgpack\.json"):
        open_pack(pack_set)
    with pytest.raises(PackFormatError):
        open_pack("s3://bucket/train")  # a folder name like any other, not a URL


def test_max_pixels_for_a_url_is_refused_before_any_request() -> None:
    with pytest.raises(UsageError, match="max_pixels= applies to packs and sets on this"):
        load("s3://bucket/train", max_pixels=1000)


def test_describe_follows_the_decision(pack: Path, pack_set: Path) -> None:
    d = describe(pack_set)
    assert d == describe_set(pack_set) and d["shards"]["count"] == 2
    d = describe(str(pack))
    assert d["path"] == str(pack) and "shards" not in d and d["count"] == 4


def test_verify_pack_checks_a_set_as_the_cli_does(pack_set: Path) -> None:
    """The library's verify_pack had no set dispatch (only the CLI had): a set was a
    PackFormatError (no manifest). Now the index and every shard are checks."""
    report = packer.verify_pack(pack_set, packer.VerifyConfig(throughput=False))
    assert report.ok
    names = [f"shard {s}" for s in _shards(pack_set)]
    assert [c["name"] for c in report.checks] == ["index", *names] and len(names) == 2


def test_verify_pack_reports_a_damaged_shard(pack_set: Path) -> None:
    second = _shards(pack_set)[1]
    data = pack_set / second / "_tensordict" / "images.memmap"
    data.write_bytes(b"\0" * data.stat().st_size)
    report = packer.verify_pack(pack_set, packer.VerifyConfig(throughput=False))
    assert not report.ok
    bad = [c for c in report.checks if not c["ok"]]
    assert [c["name"] for c in bad] == [f"shard {second}"]
    assert "images (_tensordict/images.memmap)" in bad[0]["detail"]


def test_read_class_map_of_a_set_a_pack_and_a_file(pack: Path, pack_set: Path) -> None:
    assert read_class_map(pack_set) == ["cat", "dog"]
    assert read_class_map(pack) == ["cat", "dog"]
    (pack.parent / "classes.txt").write_text("dog\ncat\n")
    assert read_class_map(pack.parent / "classes.txt") == ["dog", "cat"]


def _shards(root: Path) -> list[str]:
    return [s["name"] for s in json.loads((root / "imgpack-set.json").read_text())["shards"]]
