from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

import packer
from conftest import beside, write_image
from packer.builder.run import BuildConfig, build
from packer.cli import cli
from packer.errors import InputError, UsageError
from packer.imaging.decode import ResizeSpec, decode


def test_pixels_equal_decode_of_each_source(packed: Path, image_tree: Path) -> None:
    pack = packer.load(packed)
    assert len(pack) == 13 and pack.images.shape == (13, 3, 24, 32)
    assert pack.images.dtype == torch.uint8 and pack.labels.dtype == torch.int64
    spec = ResizeSpec(32, 24, "crop")
    for i, rel in enumerate(pack.sources):
        assert np.array_equal(pack.images[i].numpy(), decode(str(image_tree / rel), spec)), rel
    assert pack.classes == ["cat", "dog", "zebra"]
    assert pack.labels.tolist() == [0] * 4 + [1] * 4 + [2] * 5


def test_byte_identical_whatever_the_worker_count(image_tree: Path, tmp_path: Path) -> None:
    build(image_tree, tmp_path / "w1", BuildConfig(size=(32, 24), workers=1))
    build(image_tree, tmp_path / "w3", BuildConfig(size=(32, 24), workers=3))
    for f in ("_tensordict/images.memmap", "_tensordict/labels.memmap"):
        assert (tmp_path / "w1" / f).read_bytes() == (tmp_path / "w3" / f).read_bytes()


def test_broken_images_are_skipped_and_recorded(image_tree: Path, tmp_path: Path) -> None:
    (image_tree / "dog" / "empty.jpg").write_bytes(b"")
    (image_tree / "cat" / "aa.png").write_bytes(b"garbage bytes")
    r = build(image_tree, tmp_path / "p", BuildConfig(size=(16, 16), workers=2))
    assert r.count == 13
    assert [s["path"] for s in r.skipped] == ["cat/aa.png", "dog/empty.jpg"]
    assert all("not an image" in s["reason"] for s in r.skipped)
    pack = packer.load(tmp_path / "p")
    assert "cat/aa.png" not in pack.sources and len(pack.sources) == 13
    assert [{"path": k.path, "reason": k.reason} for k in pack.manifest.skipped] == r.skipped
    # the compacted data still matches each source, and checksums verify
    spec = ResizeSpec(16, 16, "crop")
    for i, rel in enumerate(pack.sources):
        assert np.array_equal(pack.images[i].numpy(), decode(str(image_tree / rel), spec))
    assert packer.verify_pack(tmp_path / "p", packer.VerifyConfig(throughput=False)).ok


def test_refuses_existing_pack_without_overwrite(packed: Path, image_tree: Path) -> None:
    with pytest.raises(InputError, match=r"a pack already exists; pass BuildConfig\.overwrite"):
        build(image_tree, packed, BuildConfig(size=(8, 8), workers=1))
    build(image_tree, packed, BuildConfig(size=(8, 8), workers=1, overwrite=True))
    assert packer.load(packed).images.shape[1:] == (3, 8, 8)


def test_refuses_to_replace_a_folder_that_is_not_a_pack(image_tree: Path, tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "keep.txt").write_text("precious")
    with pytest.raises(InputError, match="not an imgpack pack; refusing"):
        build(image_tree, tmp_path / "docs", BuildConfig(workers=1, overwrite=True))
    assert (tmp_path / "docs" / "keep.txt").exists()


def test_refuses_destination_inside_source(image_tree: Path) -> None:
    with pytest.raises(InputError, match="inside its source"):
        build(image_tree, image_tree / "pack", BuildConfig(workers=1))


@pytest.mark.parametrize(
    "config, message",
    [
        (BuildConfig(size=(0, 5)), "out of range"),
        (BuildConfig(resize="zoom"), "BuildConfig.resize must be"),
        (BuildConfig(workers=0), "BuildConfig.workers must be"),
    ],
)
def test_bad_options(image_tree: Path, tmp_path: Path, config: BuildConfig, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        build(image_tree, tmp_path / "p", config)


def test_tensordict_opens_the_same_directory(packed: Path) -> None:
    from packer.pack.reader import ImagePack

    td = ImagePack.load_memmap(packed)
    ours = packer.load(packed)
    assert torch.equal(td.images, ours.images) and torch.equal(td.labels, ours.labels)


def test_in_place_edits_never_reach_the_files(packed: Path) -> None:
    before = (packed / "_tensordict" / "images.memmap").read_bytes()
    pack = packer.load(packed)
    pack.images[0] += 1
    pack.labels[:] = 7
    assert (packed / "_tensordict" / "images.memmap").read_bytes() == before
    assert packer.load(packed).labels.tolist()[0] == 0


def test_no_temporary_files_left(packed: Path) -> None:
    assert sorted(p.name for p in packed.parent.iterdir() if "partial" in p.name) == []
    assert sorted(p.name for p in packed.iterdir()) == ["_tensordict", "imgpack.json", "meta.json"]


def test_manifest_contents(packed: Path) -> None:
    m = json.loads((packed / "imgpack.json").read_text())
    assert m["version"] == 1 and m["image_shape"] == [3, 24, 32] and m["resize"] == "crop"
    assert m["class_counts"] == [4, 4, 5]
    assert m["source_sizes"][m["sources"].index("cat/b.JPG")] == [30, 60]
    assert m["checksums"]["algorithm"] == "sha256" and len(m["checksums"]["images"]) == 13


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sizes=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 40)), min_size=1, max_size=5),
    target=st.tuples(st.integers(1, 20), st.integers(1, 20)),
    mode=st.sampled_from(["crop", "stretch", "pad"]),
    fmt=st.sampled_from(["png", "jpg", "bmp"]),
    seed=st.integers(0, 2**16),
)
def test_round_trip_property(
    tmp_path_factory: pytest.TempPathFactory, sizes, target, mode, fmt, seed
) -> None:
    root = tmp_path_factory.mktemp("rt")
    src = root / "src"
    for i, size in enumerate(sizes):
        rng = np.random.default_rng(seed + i)
        a = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
        src.mkdir(exist_ok=True)
        Image.fromarray(a).save(src / f"{i:02d}.{fmt}")
    build(src, root / "p", BuildConfig(size=target, resize=mode, workers=1))
    pack = packer.load(root / "p")
    spec = ResizeSpec(target[0], target[1], mode)
    assert len(pack) == len(sizes), pack.manifest.skipped
    assert pack.labels.tolist() == [-1] * len(sizes)
    for i, rel in enumerate(pack.sources):
        assert np.array_equal(pack.images[i].numpy(), decode(str(src / rel), spec))


def test_empty_class_folder_keeps_imagefolder_indices(tmp_path: Path) -> None:
    write_image(tmp_path / "src" / "a" / "1.png")
    (tmp_path / "src" / "b").mkdir()
    write_image(tmp_path / "src" / "c" / "2.png")
    build(tmp_path / "src", tmp_path / "p", BuildConfig(size=(8, 8), workers=1))
    pack = packer.load(tmp_path / "p")
    assert pack.classes == ["a", "b", "c"] and pack.labels.tolist() == [0, 2]
    assert list(pack.manifest.class_counts) == [1, 0, 1]


def test_all_images_broken_is_an_error_and_writes_nothing(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jpg").write_bytes(b"")
    (src / "b.png").write_bytes(b"garbage")
    dst = tmp_path / "out" / "pack"
    res = CliRunner().invoke(cli, ["build", str(src), str(dst), "--workers", "1", "-q"])
    assert res.exit_code == 1
    assert res.stderr.startswith(f"Error: {src}: none of its 2 images could be used (first: a.jpg")
    assert "no pack was written" in res.stderr
    assert beside(dst) == []
