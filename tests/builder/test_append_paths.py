"""``--append`` from another folder (issue 42.8): a new image whose path relative to SRC
is already in the set is added; the same image is left out, and every image left out
is listed with its reason."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

import packer
from conftest import cli_run, write_image
from packer.builder.api import BuildConfig, build

RAW = BuildConfig(size=(8, 6), workers=1, shard_size=300)  # 2 rows a shard


def _week(root: Path, seeds: dict[str, int]) -> Path:
    for rel, seed in seeds.items():
        write_image(root / rel, (20, 16), seed=seed)
    return root


@pytest.mark.parametrize("store", ["raw", "jpeg"])
def test_append_adds_a_different_image_at_a_path_the_set_holds(tmp_path: Path, store: str) -> None:
    cfg = replace(RAW, store=store)
    week1 = _week(tmp_path / "week1", {"a/IMG_0001.png": 1, "a/IMG_0002.png": 2, "b/0.png": 3})
    build(week1, tmp_path / "set", cfg)
    week2 = _week(tmp_path / "week2", {"a/IMG_0001.png": 11, "b/9.png": 12})  # another photo
    shutil.copy(week1 / "a/IMG_0002.png", week2 / "a/IMG_0002.png")  # the same bytes
    r = build(week2, tmp_path / "set", replace(cfg, append=True))
    assert r.count == 5  # 3 + the other IMG_0001 + b/9 (was 4: IMG_0001 dropped silently)
    left = {s["path"]: s["reason"] for s in r.skipped}
    assert list(left) == ["a/IMG_0002.png"]
    assert "the same image as a/IMG_0002.png in shard" in left["a/IMG_0002.png"]
    s = packer.load(tmp_path / "set")
    assert sorted(s.sources) == sorted(
        ["a/IMG_0001.png", "a/IMG_0002.png", "b/0.png", "a/IMG_0001.png", "b/9.png"]
    )
    # (source root, path) is unique: each shard records the folder it was built from
    roots = [m.build.source_root for m in s.manifests for _ in m.sources]
    assert len(set(zip(roots, s.sources))) == 5
    assert {str(week1.resolve()), str(week2.resolve())} == set(roots)
    # both photos are in the set, different
    i, j = (k for k, p in enumerate(s.sources) if p == "a/IMG_0001.png")
    a, b = (s.shard(int(s.locate(k)[0])) for k in (i, j))
    if store == "raw":
        rows = [x.images[int(s.locate(k)[1])] for x, k in ((a, i), (b, j))]
        assert not rows[0].equal(rows[1])


def test_reappending_the_same_folder_adds_nothing_and_lists_why(tmp_path: Path) -> None:
    week1 = _week(tmp_path / "week1", {"a/0.png": 1, "a/1.png": 2, "b/0.png": 3})
    build(week1, tmp_path / "set", RAW)
    before = (tmp_path / "set" / "imgpack-set.json").read_bytes()
    write_image(week1 / "a" / "1.png", (20, 16), seed=99)  # edited in place: another image
    code, out, err = cli_run(
        "build", week1, tmp_path / "set", "--size", "8x6", "--workers", "1",
        "--shard-size", "300", "--append", "--json",
    )  # fmt: skip
    assert code == 0, err
    j = json.loads(out)
    assert j["count"] == 4  # the edited a/1.png is added, the two unchanged are not
    assert sorted(s["path"] for s in j["skipped"]) == ["a/0.png", "b/0.png"]
    assert all("already in the set" in s["reason"] for s in j["skipped"])
    assert (tmp_path / "set" / "imgpack-set.json").read_bytes() != before
    code, _out, err = cli_run(
        "build", week1, tmp_path / "set", "--size", "8x6", "--workers", "1",
        "--shard-size", "300", "--append",
    )  # fmt: skip
    assert code == 0 and err.count("already in the set") == 3, err
