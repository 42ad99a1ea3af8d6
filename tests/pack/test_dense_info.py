"""``imgpack info`` of packs with dense targets (issue 46.6): the counts per category,
boxes per image, crowd and keypoint instances and the semantic masks' pixel shares
equal the generated set's known truth; a plain pack's info is what it was; info stays
torch-free (numpy reads the dense columns)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import packer
from conftest import subprocess_env, write_image
from helpers.dense_data import NAMES, make_truth, write_coco, write_masks
from packer.builder.config import BuildConfig
from packer.builder.dense import DenseOptions
from packer.cli import cli
from packer.pack.dense_info import dense_summary

pytest.importorskip("pycocotools")

TRUTHS = make_truth(6)


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("info")
    write_coco(root / "coco", TRUTHS, keypoints=True)
    src = write_masks(root / "m", TRUTHS)
    out = {"coco": root / "coco_pack", "sem": root / "sem", "plain": root / "plain"}
    packer.build_pack(
        root / "coco", out["coco"], BuildConfig(size=(64, 48), resize="stretch", workers=1)
    )
    packer.build_pack(
        src, out["sem"], BuildConfig(store="jpeg", workers=1, dense=DenseOptions(format="masks"))
    )
    for i in range(4):
        write_image(root / "flat" / f"c{i % 2}" / f"{i}.jpg", (24, 18), seed=i)
    packer.build_pack(root / "flat", out["plain"], BuildConfig(size=(8, 6), workers=1))
    return out


def test_counts_equal_the_known_truth(packs: dict[str, Path]) -> None:
    d = dense_summary(packs["coco"])
    assert d is not None
    assert d["images"] == len(TRUTHS) and d["instances"] == 3 * len(TRUTHS)
    want = {n: sum(s.name == n for t in TRUTHS for s in t.shapes) for n in NAMES}
    assert d["categories"] == want
    assert d["boxes_per_image"] == {"min": 3, "median": 3.0, "max": 3}
    assert d["crowd"] == 0
    assert d["keypoint_instances"] == len(TRUTHS)  # one person per image
    assert d["masks"] is True and d["semantic"] is None


def test_semantic_histogram_equals_the_masks_pixels(packs: dict[str, Path]) -> None:
    d = dense_summary(packs["sem"], sample=0)
    assert d is not None and d["instances"] == 0 and d["masks"] is False
    hist = np.zeros(256, np.int64)
    for t in TRUTHS:
        hist += np.bincount(t.semantic().reshape(-1), minlength=256)
    s = d["semantic"]
    assert s["images"] == s["of"] == len(TRUTHS) and s["ignore_index"] == 255
    assert s["ignore_share"] == pytest.approx(hist[255] / hist.sum())
    assert sum(s["classes"].values()) + s["ignore_share"] == pytest.approx(1.0)
    assert sorted(s["classes"].values()) == pytest.approx(
        sorted((hist[:255][hist[:255] > 0] / hist.sum()).tolist())
    )
    # a bounded sample reads fewer images, spread over the pack
    assert dense_summary(packs["sem"], sample=2)["semantic"]["images"] == 2


def test_info_json_holds_the_dense_keys(packs: dict[str, Path]) -> None:
    r = CliRunner().invoke(cli, ["info", str(packs["coco"]), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)["dense"]
    for key in (
        "images",
        "instances",
        "categories",
        "boxes_per_image",
        "crowd",
        "keypoint_instances",
        "masks",
        "semantic",
    ):
        assert key in d
    assert d["categories"]["person"] == len(TRUTHS)
    r = CliRunner().invoke(cli, ["info", str(packs["sem"]), "--json", "--sample", "3"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["dense"]["semantic"]["images"] == 3


def test_info_text_names_categories_and_pixel_shares(packs: dict[str, Path]) -> None:
    r = CliRunner().invoke(cli, ["info", str(packs["coco"])])
    assert r.exit_code == 0, r.output
    assert "instances 18 in 6 images" in r.output and "masks yes" in r.output
    assert "median 3" in r.output and "person" in r.output
    r = CliRunner().invoke(cli, ["info", str(packs["sem"])])
    assert r.exit_code == 0, r.output
    assert "ignore (255)" in r.output


def test_a_plain_packs_info_is_unchanged(packs: dict[str, Path]) -> None:
    assert dense_summary(packs["plain"]) is None
    r = CliRunner().invoke(cli, ["info", str(packs["plain"]), "--json"])
    assert r.exit_code == 0 and "dense" not in json.loads(r.output)
    r = CliRunner().invoke(cli, ["info", str(packs["plain"])])
    assert "instances" not in r.output and "categories" not in r.output


def test_info_on_a_dense_pack_imports_no_torch(packs: dict[str, Path], tmp_path: Path) -> None:
    code = textwrap.dedent(
        """
        import json, sys
        from packer.cli import main
        out, sys.argv = sys.argv[1], ["imgpack", "info", *sys.argv[2:]]
        try:
            main()
        except SystemExit as e:
            code = e.code
        mods = [m for m in sys.modules if m.split(".")[0] in ("torch", "tensordict")]
        json.dump({"code": code, "torch": mods}, open(out, "w"))
        """
    )
    out = tmp_path / "o.json"
    for pack in ("coco", "sem"):
        subprocess.run(
            [sys.executable, "-c", code, str(out), str(packs[pack]), "--json"],
            env=subprocess_env(),
            check=True,
            capture_output=True,
            timeout=120,
        )
        got = json.loads(out.read_text())
        assert got == {"code": 0, "torch": []}


def test_a_sets_counts_are_summed_over_its_shards(tmp_path: Path) -> None:
    write_coco(tmp_path / "coco", TRUTHS, keypoints=True)
    cfg = BuildConfig(size=(64, 48), resize="stretch", workers=1, shard_size=2 * 64 * 48 * 3)
    packer.build_pack(tmp_path / "coco", tmp_path / "set", cfg)
    assert len([p for p in (tmp_path / "set").iterdir() if p.is_dir()]) == 3
    d = dense_summary(tmp_path / "set")
    assert d is not None and d["images"] == 6 and d["instances"] == 18
    assert d["categories"] == dict.fromkeys(NAMES, 6) and d["keypoint_instances"] == 6
    r = CliRunner().invoke(cli, ["info", str(tmp_path / "set"), "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["dense"]["instances"] == 18
