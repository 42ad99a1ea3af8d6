from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import write_image
from packer.cli import cli
from packer.errors import UsageError
from packer.verify import VerifyConfig, verify

NO_SPEED = VerifyConfig(throughput=False, sample=None)


def failed(report) -> dict[str, str]:
    return {c["name"]: c["detail"] for c in report.checks if not c["ok"]}


def test_good_pack_passes(packed: Path) -> None:
    r = verify(packed, NO_SPEED)
    assert r.ok and [c["name"] for c in r.checks][-1] == "sources"


def test_flipped_byte_is_found_and_located(packed: Path) -> None:
    data = packed / "_tensordict" / "images.memmap"
    b = bytearray(data.read_bytes())
    row = 3 * 24 * 32
    b[5 * row + 100] ^= 0x01  # image 5
    data.write_bytes(bytes(b))
    r = verify(packed, VerifyConfig(throughput=False, source=None, use_recorded_source=False))
    assert not r.ok
    assert "block 5 (images 5-5: dog/g.webp)" in failed(r)["images"]


def test_truncated_data_file(packed: Path) -> None:
    data = packed / "_tensordict" / "images.memmap"
    data.write_bytes(data.read_bytes()[:-10])
    r = verify(packed, NO_SPEED)
    assert "is 29,942 bytes, the manifest says 29,952" in failed(r)["files"]


def test_deleted_and_edited_sources_named(packed: Path, image_tree: Path) -> None:
    (image_tree / "cat" / "a.jpg").unlink()
    write_image(image_tree / "dog" / "e.jpg", (64, 64), seed=99)
    r = verify(packed, NO_SPEED)
    detail = failed(r)["sources"]
    assert "1 missing: cat/a.jpg" in detail and "1 changed since the build: dog/e.jpg" in detail


def test_manifest_that_disagrees_with_data(packed: Path) -> None:
    m = json.loads((packed / "imgpack.json").read_text())
    m["count"] = 12
    m["sources"] = m["sources"][:12]
    m["source_sizes"] = m["source_sizes"][:12]
    m["label_shape"] = [12]  # a consistent manifest, whose data files are the wrong size
    (packed / "imgpack.json").write_text(json.dumps(m))
    r = verify(packed, NO_SPEED)
    assert "the manifest says" in failed(r)["files"]


def test_label_out_of_range(packed: Path) -> None:
    import numpy as np

    lab = packed / "_tensordict" / "labels.memmap"
    a = np.frombuffer(lab.read_bytes(), "<i8").copy()
    a[2] = 9
    lab.write_bytes(a.tobytes())
    r = verify(packed, NO_SPEED)
    assert "checksum mismatch" in failed(r)["labels"] and "outside [-1, 2]" in failed(r)["labels"]


def test_missing_source_folder(packed: Path, image_tree: Path) -> None:
    shutil.rmtree(image_tree)
    # a folder the caller names that is not there is bad usage, before any work
    with pytest.raises(UsageError, match="--source must be a folder"):
        verify(packed, VerifyConfig(throughput=False, source=image_tree))


def test_cli_exit_1_names_the_problem(packed: Path) -> None:
    data = packed / "_tensordict" / "images.memmap"
    b = bytearray(data.read_bytes())
    b[-1] ^= 0xFF
    data.write_bytes(bytes(b))
    r = CliRunner().invoke(cli, ["verify", str(packed), "--no-speed"])
    assert r.exit_code == 1
    assert "FAIL  images    checksum mismatch in 1 of 13 blocks: block 12" in r.output


def test_plot_is_written(packed: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "v.png"
    r = CliRunner().invoke(
        cli,
        [
            "verify",
            str(packed),
            "--device",
            "cpu",
            "--batch-size",
            "4",
            "--batches",
            "1",
            "--plot",
            str(png),
        ],
    )
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_folder_baseline_times_only_the_packed_images(image_tree: Path, tmp_path: Path) -> None:
    from packer.build import BuildConfig, build

    (image_tree / "cat" / "empty.jpg").write_bytes(b"")
    (image_tree / "dog" / "trunc.jpg").write_bytes(
        (image_tree / "cat" / "a.jpg").read_bytes()[:200]
    )
    (image_tree / "zebra" / "text.png").write_text("not a png")
    pack = tmp_path / "p"
    assert len(build(image_tree, pack, BuildConfig(size=(16, 16), workers=1)).skipped) == 3
    (image_tree / "zebra" / "i.jpg").unlink()  # and one source gone since the build
    # every batch of 4 from 13 files: the broken ones would be met within an epoch
    cfg = VerifyConfig(device="cpu", batch_size=4, batches=4, repeats=1, workers=0, sample=0)
    r = verify(pack, cfg)
    assert r.folder_images_per_s and r.folder_images_per_s > 0
    assert r.folder_left_out == 4 and r.folder_skipped == 3
    assert r.to_json()["folder_left_out"] == 4


def test_cli_verify_says_what_the_baseline_left_out(image_tree: Path, tmp_path: Path) -> None:
    from packer.build import BuildConfig, build

    (image_tree / "cat" / "empty.jpg").write_bytes(b"")
    build(image_tree, tmp_path / "p", BuildConfig(size=(16, 16), workers=1))
    r = CliRunner().invoke(
        cli, ["verify", str(tmp_path / "p"), "--device", "cpu", "--batch-size", "4", "-q"]
    )
    assert r.exit_code == 0, r.output
    assert "left out 1 the build skipped, 0 missing" in r.stdout


def test_parallel_checks_report_progress_and_find_the_same(packed: Path) -> None:
    data = packed / "_tensordict" / "images.memmap"
    b = bytearray(data.read_bytes())
    b[3 * 3 * 24 * 32] ^= 0xFF  # image 3
    data.write_bytes(bytes(b))
    seen: list[int] = []
    started: list[tuple[int, int]] = []
    r = verify(packed, NO_SPEED, progress=seen.append, on_start=lambda t, d: started.append((t, d)))
    assert started == [(13 + 13, 0)] and sum(seen) == 26
    assert failed(r)["images"].startswith("checksum mismatch in 1 of 13 blocks: block 3 ")
    assert "1 changed since the build: cat/d.jpeg" in failed(r)["sources"]


def test_source_broken_since_the_build_leaves_the_baseline_untimed(
    packed: Path, image_tree: Path
) -> None:
    (image_tree / "zebra" / "i.jpg").write_bytes(b"garbage")  # outside the sample of 0
    cfg = VerifyConfig(device="cpu", batch_size=4, batches=4, repeats=1, workers=0, sample=0)
    r = verify(packed, cfg)
    assert r.ok and r.pack_images_per_s and r.pack_images_per_s > 0
    assert r.folder_images_per_s is None and r.folder_left_out == 0


def _point_sources(pack: Path, root: str, sources: dict[int, str]) -> None:
    m = json.loads((pack / "imgpack.json").read_text())
    m["build"]["source_root"] = root
    for i, rel in sources.items():
        m["sources"][i] = rel
    (pack / "imgpack.json").write_text(json.dumps(m))


@pytest.mark.parametrize("store", ["raw", "jpeg"])
def test_a_hostile_manifest_never_makes_verify_read_outside_the_source_images(
    image_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store: str
) -> None:
    """``build.source_root`` set to ``/`` and sources such as ``proc/self/environ``: only
    regular image files under the source folder are read (links not followed out of
    it, no device, FIFO or /proc file), and the others are named in the report."""
    import os

    import packer.decode
    from packer.build import BuildConfig, build

    pack = tmp_path / "p"
    build(image_tree, pack, BuildConfig(size=(16, 16), workers=1, store=store))
    opened: list[str] = []
    real_open = packer.decode.open_regular

    def spy(path):
        opened.append(str(path))
        return real_open(path)

    monkeypatch.setattr(packer.decode, "open_regular", spy)
    as_built = (pack / "imgpack.json").read_text()
    _point_sources(pack, "/", {0: "proc/self/environ", 1: "dev/zero", 2: "etc/passwd"})
    r = verify(pack, NO_SPEED)
    detail = failed(r)["sources"]
    assert "3 not read, not regular image files: proc/self/environ (not an image file name)" in (
        detail
    )
    assert not any(p.startswith(("/proc", "/dev", "/etc")) for p in opened), opened
    # under a real source folder: a FIFO and a device link named like images, a link
    # leading out of the folder (its target a copy of the image: not followed all the same)
    cfg = VerifyConfig(source=image_tree, throughput=False, sample=None)
    outside = tmp_path / "elsewhere.jpg"
    shutil.copy(image_tree / "cat" / "a.jpg", outside)
    (image_tree / "cat" / "a.jpg").unlink()
    (image_tree / "cat" / "a.jpg").symlink_to(outside)
    (image_tree / "dog" / "e.jpg").unlink()
    os.mkfifo(image_tree / "dog" / "e.jpg")
    (image_tree / "zebra" / "i.jpg").unlink()
    (image_tree / "zebra" / "i.jpg").symlink_to("/dev/zero")
    opened.clear()
    (pack / "imgpack.json").write_text(as_built)
    r = verify(pack, cfg)
    detail = failed(r)["sources"]
    assert "1 not read, not regular image files: dog/e.jpg (not a regular file (a FIFO))" in (
        detail
    )
    out = "2 not checked, a link leading outside the source folder: cat/a.jpg, zebra/i.jpg"
    assert out in detail
    assert "missing" not in detail and "changed" not in detail
    assert len(opened) == 10 and not any(
        p.endswith(("e.jpg", "i.jpg", "elsewhere.jpg", "/a.jpg")) for p in opened
    ), opened


def test_links_inside_the_source_folder_are_followed(packed: Path, image_tree: Path) -> None:
    real = image_tree / "cat" / "a.jpg"
    moved = image_tree / "cat" / "kept" / "a.jpg"
    moved.parent.mkdir()
    real.rename(moved)
    real.symlink_to(moved)
    r = verify(packed, NO_SPEED)
    assert r.ok, failed(r)
