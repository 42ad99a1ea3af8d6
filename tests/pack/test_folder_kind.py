"""Pack sets, round 4 (issue 42): one rule for what a folder is (17), a large index
checked in linear time (13)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

import packer
from conftest import cli_run, one_error, write_image
from packer.builder.api import BuildConfig, build
from packer.errors import PackFormatError
from packer.measure.verify import VerifyConfig, verify
from packer.measure.verify_set import verify_set
from packer.pack.describe import describe, describe_set
from packer.pack.index import INDEX, SetIndex, read_index
from packer.pack.schema import MANIFEST
from packer.storage.open import read_class_map

SET_CONFIG = BuildConfig(size=(8, 6), workers=1, shard_size=300)
BOTH = r"holds both a pack set's index \(imgpack-set.json\) and a single pack's manifest"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A set of three raw shards (SET/) and a single pack (PACK/) of the same images."""
    root = tmp_path_factory.mktemp("r4")
    for c in ("cat", "dog"):
        for i in range(3):
            write_image(root / "src" / c / f"{i}.png", (20, 16), seed=i + 10 * (c == "dog"))
    build(root / "src", root / "set", SET_CONFIG)
    build(root / "src", root / "pack", BuildConfig(size=(8, 6), workers=1))
    return root


@pytest.fixture(params=["set_with_manifest", "pack_with_index"])
def both(built: Path, tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """A folder holding a set index and a pack manifest: a set with a pack's manifest
    copied in, or a pack with a set's index copied in."""
    if request.param == "set_with_manifest":
        dst = tmp_path / "set"
        shutil.copytree(built / "set", dst)
        shutil.copy(built / "pack" / MANIFEST, dst / MANIFEST)
    else:
        dst = tmp_path / "pack"
        shutil.copytree(built / "pack", dst)
        shutil.copy(built / "set" / INDEX, dst / INDEX)
    return dst


def test_a_folder_that_is_both_a_set_and_a_pack_is_refused_everywhere(both: Path) -> None:
    """Issue 42.17: verify and info called it a healthy set while load refused it as a
    pack. Now every entry refuses it with the same message."""
    for call in (
        lambda: packer.load(both),
        lambda: packer.load(str(both)),
        lambda: describe(both),
        lambda: describe_set(both),
        lambda: read_index(both),
        lambda: verify(both, VerifyConfig(throughput=False, use_recorded_source=False)),
        lambda: verify_set(both),
        lambda: read_class_map(both),
    ):
        with pytest.raises(PackFormatError, match=BOTH):
            call()
    for args in (("info", both), ("info", both, "--json"), ("verify", both, "--no-speed")):
        code, _out, err = cli_run(*args)
        assert code == 2, (args, err)
        assert "holds both a pack set's index" in one_error(err)


def test_plain_sets_and_packs_are_still_what_they_were(built: Path) -> None:
    assert type(packer.load(built / "set")).__name__ == "PackSet"
    assert type(packer.load(built / "pack")).__name__ == "ImagePack"
    assert cli_run("info", built / "set", "--json")[0] == 0
    assert cli_run("info", built / "pack", "--json")[0] == 0


def _big_index(n: int, dup: bool) -> dict:
    shards = [
        {"name": f"{k:05d}-{k:016x}", "count": 1, "bytes": 144, "sha256": "0" * 64}
        for k in range(n)
    ]
    if dup:
        shards[-1]["name"] = shards[-2]["name"]
    return {
        "format": "imgpack-set",
        "version": 1,
        "count": n,
        "image_shape": [3, 6, 8],
        "storage": "raw",
        "classes": ["cat", "dog"],
        "targets": [],
        "options": {
            "size": [8, 6],
            "resize": "crop",
            "max_pixels": 100_000_000,
            "store": "raw",
            "quality": 95,
            "max_side": None,
            "device": "cpu",
        },
        "shard_size": 300,
        "shards": shards,
        "skipped": [],
    }


def test_an_index_of_50000_shards_is_checked_in_linear_time(tmp_path: Path) -> None:
    """Issue 42.13: the duplicate check was quadratic (40,000 shards: 25 s). A guard,
    not a speed target: the linear check takes well under a second here; the quadratic
    one took over half a minute, so the 10 s bound is far from both."""
    obj = _big_index(50_000, dup=False)
    t = time.perf_counter()
    index = SetIndex.from_json(obj, "x")
    assert len(index.shards) == 50_000
    (tmp_path / INDEX).write_text(json.dumps(_big_index(50_000, dup=True)))
    with pytest.raises(PackFormatError, match=r"shard '49998-000000000000c34e' is listed twice"):
        read_index(tmp_path)
    assert time.perf_counter() - t < 10
