from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from conftest import write_image
from packer.cli import cli
from packer.compress import CompressConfig, compress, output_names


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    root = tmp_path / "photos"
    write_image(root / "a" / "big.jpg", (300, 200), quality=98)
    write_image(root / "a" / "gray.png", (120, 90), mode="L")
    write_image(root / "b" / "alpha.png", (64, 64), mode="RGBA")
    write_image(root / "b" / "pal.gif", (50, 40), mode="P")
    write_image(root / "b" / "cmyk.jpg", (80, 60), mode="CMYK")
    write_image(root / "b" / "-dash name é.png", (40, 30))
    Image.fromarray(np.arange(0, 65535, 8, dtype=np.uint16).reshape(64, 128)).save(
        root / "b" / "g16.png"
    )
    write_image(root / "b" / "scan.tiff", (30, 30))
    (root / "b" / "notes.txt").write_text("not an image")
    return root


def test_tree_mirrored_upright_rgb(photos: Path, tmp_path: Path) -> None:
    r = compress(photos, tmp_path / "out", CompressConfig(workers=2))
    assert r.failed == [] and r.written == 8 and r.skipped == 0
    outs = sorted(
        p.relative_to(tmp_path / "out").as_posix()
        for p in (tmp_path / "out").rglob("*")
        if p.is_file() and p.name != ".imgpack-compress.json"  # the options record
    )
    assert outs == [
        "a/big.jpg",
        "a/gray.jpg",
        "b/-dash name é.jpg",
        "b/alpha.jpg",
        "b/cmyk.jpg",
        "b/g16.jpg",
        "b/pal.jpg",
        "b/scan.jpg",
    ]
    for p in (tmp_path / "out").rglob("*.jpg"):
        with Image.open(p) as im:
            assert im.format == "JPEG" and im.mode == "RGB"
    g16 = np.asarray(Image.open(tmp_path / "out" / "b" / "g16.jpg").convert("L"), dtype=float)
    assert g16[:4].mean() < 20 and g16[-4:].mean() > 235  # scaled, not clipped


def test_quality_orders_file_sizes(photos: Path, tmp_path: Path) -> None:
    sizes = [
        compress(photos / "a", tmp_path / f"q{q}", CompressConfig(quality=q)).bytes_out
        for q in (2, 10, 31)
    ]
    assert sizes[0] > sizes[1] > sizes[2]


def test_max_side_shrinks_never_enlarges(photos: Path, tmp_path: Path) -> None:
    compress(photos, tmp_path / "o", CompressConfig(max_side=100))
    assert Image.open(tmp_path / "o" / "a" / "big.jpg").size == (100, 67)
    assert Image.open(tmp_path / "o" / "b" / "pal.jpg").size == (50, 40)


def test_exif_orientation_applied(tmp_path: Path) -> None:
    a = np.zeros((20, 40, 3), np.uint8)
    a[:, :20] = 255
    exif = Image.Exif()
    exif[0x0112] = 6
    (tmp_path / "s").mkdir()
    Image.fromarray(a).save(tmp_path / "s" / "r.jpg", exif=exif, quality=100)
    compress(tmp_path / "s", tmp_path / "o")
    out = np.asarray(Image.open(tmp_path / "o" / "r.jpg").convert("L"), dtype=float)
    assert out.shape == (40, 20) and out[:16].mean() > 200 and out[24:].mean() < 50


def test_truncated_input_fails_and_run_goes_on(photos: Path, tmp_path: Path) -> None:
    big = photos / "a" / "big.jpg"
    big.write_bytes(big.read_bytes()[:2000])
    (photos / "a" / "empty.png").write_bytes(b"")
    r = compress(photos, tmp_path / "o")
    assert sorted(f["path"] for f in r.failed) == ["a/big.jpg", "a/empty.png"]
    assert "ffmpeg" in dict((f["path"], f["reason"]) for f in r.failed)["a/big.jpg"]
    assert not (tmp_path / "o" / "a" / "big.jpg").exists() and r.written == 7


def test_rerun_skips_done_and_redoes_missing(photos: Path, tmp_path: Path) -> None:
    compress(photos, tmp_path / "o")
    (tmp_path / "o" / "b" / "alpha.jpg").unlink()
    (tmp_path / "o" / "b" / ".imgpack-tmp-123-pal.jpg").write_bytes(b"partial")
    r = compress(photos, tmp_path / "o")
    assert (r.written, r.skipped) == (1, 7)
    assert compress(photos, tmp_path / "o", CompressConfig(overwrite=True)).written == 8


def test_name_collisions_keep_both() -> None:
    assert output_names(["x.jpg", "x.png", "y.PNG"]) == {
        "x.jpg": "x.jpg",
        "x.png": "x.png.jpg",
        "y.PNG": "y.jpg",
    }


def test_cli_json(photos: Path, tmp_path: Path) -> None:
    (photos / "a" / "bad.jpg").write_bytes(b"nope")
    r = CliRunner().invoke(
        cli, ["compress", str(photos), str(tmp_path / "o"), "--json", "--strict"]
    )
    assert r.exit_code == 1
    out = json.loads(r.stdout)
    assert out["written"] == 8 and out["skipped"] == 0 and out["bytes_in"] > 0 < out["bytes_out"]
    assert out["failed"][0]["path"] == "a/bad.jpg"


def test_output_inside_source_refused(photos: Path) -> None:
    r = CliRunner().invoke(cli, ["compress", str(photos), str(photos / "out")])
    assert r.exit_code == 2 and "inside the source" in r.stderr


def test_cli_words_already_done_vs_skipped(photos: Path, tmp_path: Path) -> None:
    """One word per meaning: a rerun's outputs are "already done", a bad input is "skipped"."""
    (photos / "a" / "bad.jpg").write_bytes(b"nope")
    dst = str(tmp_path / "o")
    assert CliRunner().invoke(cli, ["compress", str(photos), dst, "-q"]).exit_code == 0
    r = CliRunner().invoke(cli, ["compress", str(photos), dst])
    assert r.exit_code == 0
    lines = r.stderr.splitlines()
    assert next(ln for ln in lines if "skipped a/" in ln).startswith("  skipped a/bad.jpg: ")
    assert lines[-1].startswith("Wrote 0, 8 already done, 1 skipped (bad input); ")
    out = json.loads(CliRunner().invoke(cli, ["compress", str(photos), dst, "--json"]).stdout)
    assert out["already_done"] == out["skipped"] == 8 and out["written"] == 0
    assert (
        [s["path"] for s in out["skipped_inputs"]]
        == ["a/bad.jpg"]
        == [s["path"] for s in out["failed"]]
    )
