"""The pack-set index: its round trip, and every way a tampered index or shard is refused
with a PackFormatError naming the shard."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import packer
from conftest import write_image
from packer.builder.api import BuildConfig, build
from packer.errors import PackFormatError
from packer.pack.describe import describe_set
from packer.pack.index import INDEX, SetIndex, read_index, write_index
from packer.storage.packset import PackSet

# 8x6 raw rows are 144 bytes: two images per shard
SET_CONFIG = BuildConfig(size=(8, 6), workers=1, shard_size=300)


@pytest.fixture
def set_src(tmp_path: Path) -> Path:
    """cat/0..2.png, dog/0..2.png (20x16)."""
    for c in ("cat", "dog"):
        for i in range(3):
            write_image(tmp_path / "src" / c / f"{i}.png", (20, 16), seed=i + 10 * (c == "dog"))
    return tmp_path / "src"


@pytest.fixture
def pack_set(set_src: Path, tmp_path: Path) -> Path:
    """A set of three raw shards of two images each."""
    build(set_src, tmp_path / "set", SET_CONFIG)
    return tmp_path / "set"


def _edit(root: Path, change: Callable[[dict[str, Any]], None]) -> None:
    obj = json.loads((root / INDEX).read_text())
    change(obj)
    (root / INDEX).write_text(json.dumps(obj))


def test_index_round_trips(pack_set: Path, tmp_path: Path) -> None:
    index = read_index(pack_set)
    assert [s.count for s in index.shards] == [2, 2, 2] and index.count == 6
    assert index.classes == ("cat", "dog") and index.storage == "raw"
    assert index.image_shape == (3, 6, 8) and index.shard_size == 300
    assert index.options["size"] == [8, 6] and index.options["device"] == "cpu"
    assert json.loads((pack_set / INDEX).read_text()) == index.to_json()
    assert SetIndex.from_json(index.to_json(), "x") == index
    (tmp_path / "copy").mkdir()
    write_index(tmp_path / "copy", index)
    assert (tmp_path / "copy" / INDEX).read_bytes() == (pack_set / INDEX).read_bytes()
    assert not list((tmp_path / "copy").glob("*.tmp"))


def test_load_opens_a_set_and_each_shard_alone(pack_set: Path, set_src: Path) -> None:
    s = packer.load(pack_set)
    assert isinstance(s, PackSet) and len(s) == 6 and len(s.shards) == 3
    assert s.labels.tolist() == [0, 0, 0, 1, 1, 1] and s.targets is None
    assert s.classes == ["cat", "dog"] and s.class_to_idx == {"cat": 0, "dog": 1}
    assert s.sources == [f"{c}/{i}.png" for c in ("cat", "dog") for i in range(3)]
    assert s.image_shape == (3, 6, 8) and s.storage == "raw"
    assert s.offsets.tolist() == [0, 2, 4, 6]
    shard, row = s.locate([0, 1, 2, 5])
    assert shard.tolist() == [0, 0, 1, 2] and row.tolist() == [0, 1, 0, 1]
    shard, row = s.locate(np.array([[3], [4]]))  # any shape, vectorised
    assert shard.shape == (2, 1) and shard.ravel().tolist() == [1, 2]
    with pytest.raises(packer.UsageError, match="index 6 is outside the set of 6"):
        s.locate([0, 6])
    alone = packer.load(s.shards[1].path)  # a shard is a complete pack
    assert isinstance(alone, packer.ImagePack) and len(alone) == 2
    assert alone.sources == ["cat/2.png", "dog/0.png"]


def test_describe_set(pack_set: Path) -> None:
    d = describe_set(pack_set)
    assert d["count"] == 6 and d["class_counts"] == {"cat": 3, "dog": 3}
    assert d["shards"]["count"] == 3 and d["shards"]["images"] == {"min": 2, "max": 2, "total": 6}
    assert d["shards"]["bytes"] == 3 * (2 * 144 + 2 * 8)  # rows and int64 labels
    assert [x["count"] for x in d["shards"]["list"]] == [2, 2, 2]
    assert d["storage"] == "raw" and d["build"]["size"] == [8, 6] and d["targets"] is None


def _first(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["shards"][0]


TAMPER: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "count wrong": (
        lambda o: (_first(o).update(count=3), o.update(count=7)),
        r"shard '00000-[0-9a-f]+': holds 2 images, the index says 3",
    ),
    "total wrong": (lambda o: o.update(count=5), "the shards hold 6 images, field 'count' says 5"),
    "hash wrong": (
        lambda o: _first(o).update(sha256="0" * 64),
        r"shard '00000-[0-9a-f]+': imgpack.json does not match the SHA-256",
    ),
    "bytes wrong": (
        lambda o: _first(o).update(bytes=1),
        r"shard '00000-[0-9a-f]+': has 304 data bytes, the index says 1",
    ),
    "dotdot name": (
        lambda o: _first(o).update(name="../00000-x"),
        r"shard 0: name '../00000-x' is not a plain folder name",
    ),
    "absolute name": (
        lambda o: _first(o).update(name="/etc"),
        r"shard 0: name '/etc' is not a plain folder name",
    ),
    "dot name": (lambda o: _first(o).update(name=".."), "name '..' is not a plain folder name"),
    "listed twice": (
        lambda o: o["shards"].__setitem__(1, dict(o["shards"][0])),
        r"shard '00000-[0-9a-f]+' is listed twice",
    ),
    "newer": (lambda o: o.update(version=99), "set format 99.*upgrade imgpack"),
    "other options": (lambda o: o["options"].pop("size"), "field 'options' must hold exactly"),
    "no shards": (lambda o: o.update(shards=[], count=0), "field 'shards' must list the shards"),
}


@pytest.mark.parametrize("case", sorted(TAMPER))
def test_tampered_index_is_refused_naming_the_shard(pack_set: Path, case: str) -> None:
    change, message = TAMPER[case]
    _edit(pack_set, change)
    with pytest.raises(PackFormatError, match=message):
        packer.load(pack_set)


def test_missing_shard_is_named(pack_set: Path) -> None:
    name = read_index(pack_set).shards[1].name
    shutil.rmtree(pack_set / name)
    with pytest.raises(PackFormatError, match=f"shard '{name}' is missing; the set is incomplete"):
        packer.load(pack_set)


def test_changed_shard_manifest_is_refused(pack_set: Path) -> None:
    name = read_index(pack_set).shards[2].name
    m = json.loads((pack_set / name / "imgpack.json").read_text())
    m["sources"][0] = "cat/other.png"
    (pack_set / name / "imgpack.json").write_text(json.dumps(m))
    with pytest.raises(PackFormatError, match=f"shard '{name}': imgpack.json does not match"):
        packer.load(pack_set)


def test_shard_linked_out_of_the_set_is_refused(pack_set: Path, tmp_path: Path) -> None:
    """A link is refused even to an identical shard: opening never leaves the set."""
    name = read_index(pack_set).shards[0].name
    outside = tmp_path / "elsewhere"
    shutil.move(pack_set / name, outside)
    (pack_set / name).symlink_to(outside)
    with pytest.raises(PackFormatError, match=f"shard '{name}' is a symbolic link"):
        packer.load(pack_set)


def test_shard_data_file_linked_out_is_refused(pack_set: Path, tmp_path: Path) -> None:
    name = read_index(pack_set).shards[0].name
    labels = pack_set / name / "_tensordict" / "labels.memmap"
    shutil.copy(labels, tmp_path / "labels.memmap")
    labels.unlink()
    labels.symlink_to(tmp_path / "labels.memmap")
    with pytest.raises(PackFormatError, match=r"labels\.memmap is missing or not a regular file"):
        packer.load(pack_set)


def test_shard_of_another_set_is_refused(set_src: Path, pack_set: Path, tmp_path: Path) -> None:
    """A shard with its own valid hash but another class map (a shard swapped in)."""
    build(set_src, tmp_path / "one", BuildConfig(size=(8, 6), workers=1))
    name = read_index(pack_set).shards[0].name
    shutil.rmtree(pack_set / name)
    shutil.copytree(tmp_path / "one", pack_set / name)
    m = json.loads((pack_set / name / "imgpack.json").read_text())
    m["classes"], m["class_counts"] = ["cat", "cow"], [3, 3]
    data = json.dumps(m).encode()
    (pack_set / name / "imgpack.json").write_bytes(data)
    import hashlib

    def swap(o: dict[str, Any]) -> None:
        _first(o).update(count=6, bytes=6 * 152, sha256=hashlib.sha256(data).hexdigest())
        o["count"] = 10

    _edit(pack_set, swap)
    with pytest.raises(PackFormatError, match=f"shard '{name}': has another class map"):
        packer.load(pack_set)


def test_bad_index_json_is_refused(pack_set: Path) -> None:
    (pack_set / INDEX).write_text("{not json")
    with pytest.raises(PackFormatError, match=r"imgpack-set\.json is not valid JSON"):
        packer.load(pack_set)
    (pack_set / INDEX).write_text("[" * 100_000)
    with pytest.raises(PackFormatError, match="nested too deeply"):
        packer.load(pack_set)


def test_classes_from_a_set_fix_another_builds_class_map(pack_set: Path, tmp_path: Path) -> None:
    from packer.storage.open import read_class_map

    assert read_class_map(pack_set) == ["cat", "dog"]
    write_image(tmp_path / "val" / "dog" / "0.png", (20, 16))
    build(
        tmp_path / "val",
        tmp_path / "valpack",
        BuildConfig(size=(8, 6), workers=1, classes=pack_set),
    )
    assert packer.load(tmp_path / "valpack").classes == ["cat", "dog"]
    _edit(pack_set, lambda o: o.update(count=-1))
    with pytest.raises(packer.InputError, match=r"imgpack-set.json.*\(given as a class map\)"):
        read_class_map(pack_set)
