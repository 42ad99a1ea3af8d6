from __future__ import annotations

import errno
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from conftest import cli_run as _cli
from conftest import one_error as _one_error
from conftest import subprocess_env, write_image
from packer.builder.run import BuildConfig, build
from packer.cli import cli
from packer.compress import CompressConfig, compress, output_names
from packer.sources.scan import walk_images


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
    r = subprocess.run(
        [sys.executable, "-m", "packer", "compress", tmp_path / "src", tmp_path / "out", "-q"],
        capture_output=True,
        text=True,
        env=subprocess_env(),
    )
    assert r.returncode == 0 and r.stderr == "", r.stderr


ENV = subprocess_env()


KILL_AT_RENAME = textwrap.dedent("""
    import os, signal, sys
    from packer.compress import CompressConfig, compress
    real_replace = os.replace
    def replace(a, b, **kw):
        if os.path.basename(a).startswith(".imgpack-tmp-") and b.name != ".imgpack-compress.json":
            os.kill(os.getpid(), signal.SIGKILL)  # after the fsync, before the rename
        real_replace(a, b, **kw)
    os.replace = replace
    compress(sys.argv[1], sys.argv[2], CompressConfig(workers=1))
""")


def test_compress_killed_before_rename_leaves_nothing_that_becomes_an_image(
    image_tree: Path, tmp_path: Path
) -> None:
    out = tmp_path / "small"
    script = tmp_path / "kill.py"
    script.write_text(KILL_AT_RENAME)
    p = subprocess.run(
        [sys.executable, str(script), str(image_tree), str(out)], env=ENV, timeout=60
    )
    assert p.returncode == -9
    left = [f for f in out.rglob(".imgpack-tmp-*")]
    assert len(left) == 1  # what a dead run leaves
    # scan never takes it (or a build's work folders, or any imgpack name) for an image
    (out / "cat" / ".p.imgpack-partial").mkdir()
    write_image(out / "cat" / ".p.imgpack-partial" / "x.jpg")
    write_image(out / "cat" / ".imgpack-old.jpg")
    assert not [p for p in walk_images(out) if "imgpack" in p]
    r = compress(image_tree, out, CompressConfig(workers=1))
    assert r.written + r.skipped == 13 and r.failed == []
    assert not list(out.rglob(".imgpack-tmp-*"))  # the rerun cleaned up
    assert build(out, tmp_path / "pack", BuildConfig(size=(8, 8), workers=1)).count == 13


def test_colliding_output_names_lose_nothing(tmp_path: Path) -> None:
    src = tmp_path / "src"
    for i, name in enumerate(["x.png", "x.jpg", "x.png.jpg", "x.JPG", "x.jpeg"]):
        write_image(src / name, seed=i)
    r = compress(src, tmp_path / "out", CompressConfig(workers=2))
    assert r.written == 5 and r.failed == []
    assert len(list((tmp_path / "out").glob("*.jpg"))) == 5


names = st.lists(
    st.builds(
        lambda d, stem, ext: f"{d}{stem}{ext}",
        st.sampled_from(["", "a/", "a.jpg/", "b/c/", "x.png/"]),
        st.sampled_from(["x", "x.png", "x.jpg", "X", "x.png~2", "a", "x.png.jpg"]),
        st.sampled_from([".jpg", ".png", ".JPG", ".jpeg", ".gif"]),
    ),
    unique=True,
    max_size=12,
)


@given(names, st.randoms())
@settings(max_examples=300, deadline=None)
def test_output_names_are_one_to_one(rels: list[str], rnd) -> None:
    out = output_names(rels)
    assert sorted(out) == sorted(rels)
    assert len(set(out.values())) == len(rels)  # injective
    folders = {"/".join(r.split("/")[: i + 1]) for r in rels for i in range(r.count("/"))}
    for rel, name in out.items():
        assert name.endswith(".jpg") and name not in folders
        assert name.rpartition("/")[0] == rel.rpartition("/")[0]  # same folder
    shuffled = list(rels)
    rnd.shuffle(shuffled)
    assert output_names(shuffled) == out  # a rerun maps them the same way


def test_unwritable_output_file_stops_compress_with_one_line(
    image_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import packer.compress as pc

    def no_write(path: Path, data: bytes) -> None:
        raise pc.WriteError(OSError(errno.EROFS, "Read-only file system", str(path)))

    out = tmp_path / "out"
    out.mkdir()
    (out / ".imgpack-compress.json").write_text('{"quality": 3, "max_side": null}')
    monkeypatch.setattr(pc, "_write_atomic", no_write)
    res = CliRunner().invoke(cli, ["compress", str(image_tree), str(out), "-q"])
    assert res.exit_code == 2 and res.stderr.startswith(f"Error: {out}/")


def test_compress_rerun_with_other_options_redoes_outputs(
    photos_small: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    q3 = compress(photos_small, out, CompressConfig(quality=3))
    assert q3.written == 3
    q25 = compress(photos_small, out, CompressConfig(quality=25))
    assert q25.written == 3 and q25.bytes_out < q3.bytes_out
    assert compress(photos_small, out, CompressConfig(quality=25)).skipped == 3
    assert compress(photos_small, out, CompressConfig(quality=25, max_side=16)).written == 3
    # the options record is not an image to build
    assert build(out, tmp_path / "p", BuildConfig(size=(8, 8), workers=1)).count == 3


@pytest.fixture
def photos_small(tmp_path: Path) -> Path:
    root = tmp_path / "photos"
    for i in range(3):
        write_image(root / f"{i}.png", (64, 48), seed=i)
    return root
