"""The dense columns' format (packer.pack.dense): what dense_of reads, and what it
refuses: offsets past the end or decreasing, an image over the reader's cap, sizes
other than the manifest's, labels outside the category map, RLE that does not cover
its frame, PNG masks of another size, records of a newer version. Packs without dense
targets open as before."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import packer
from helpers.dense_data import make_truth, write_coco, write_masks
from packer.builder.config import BuildConfig
from packer.builder.dense import DenseOptions
from packer.errors import PackFormatError
from packer.pack.dense import (
    BOXES,
    LABELS,
    OFFSETS,
    PNG,
    PNG_OFFSETS,
    RLE,
    RLE_OFFSETS,
    decode_masks,
    dense_of,
    encode_masks,
    rle_counts,
)

TRUTHS = make_truth(3)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("densefmt")
    write_coco(root / "coco", TRUTHS, keypoints=True)
    packer.build_pack(root / "coco", root / "pack", BuildConfig(size=(32, 32), workers=1))
    return root / "pack"


@pytest.fixture
def pack(built: Path, tmp_path: Path) -> Path:
    """A copy of the built pack to damage."""
    return Path(shutil.copytree(built, tmp_path / "p"))


def data(p: Path, name: str) -> Path:
    return p / "_tensordict" / name


def poke(p: Path, name: str, values: np.ndarray, at: int = 0) -> None:
    """Overwrite values of a dense file in place (same size: the pack still opens)."""
    f = data(p, name)
    raw = bytearray(f.read_bytes())
    b = values.tobytes()
    raw[at : at + len(b)] = b
    f.write_bytes(bytes(raw))


def test_reads_every_field(built: Path) -> None:
    cols = dense_of(packer.load(built))
    assert cols is not None and cols.has_masks and cols.has_keypoints and not cols.semantic
    rows = cols.read([2, 0])
    assert [r["image_id"] for r in rows] == [1002, 1000]
    r = rows[1]
    m = len(r["labels"])
    assert r["boxes"].dtype == np.float32 and r["boxes"].shape == (m, 4)
    assert r["labels"].dtype == np.int64 and r["iscrowd"].dtype == np.uint8
    assert r["area"].dtype == np.float32 and r["keypoints"].shape == (m, 5, 3)
    assert decode_masks(r["masks_rle"], r["size"]).shape == (m, 32, 32)
    with pytest.raises(IndexError, match="outside the pack of 3"):
        cols.read([3])


def test_reading_records_runs_no_numpy_memmap_code(built: Path) -> None:
    """The loader reads a batch's records on its producer thread, which holds the GIL
    beside the training step: the columns are plain views of their maps, not np.memmap
    objects whose Python-level __getitem__ / __array_finalize__ ran for every slice."""
    import sys

    cols = dense_of(packer.load(built))
    called: list[str] = []

    def seen(frame, event, arg) -> None:
        if event == "call":
            called.append(frame.f_code.co_filename)

    sys.setprofile(seen)
    try:
        records = cols.read(list(range(3)))
    finally:
        sys.setprofile(None)
    assert len(records) == 3 and called  # the profiler saw the read
    assert not [f for f in called if f.endswith("memmap.py")]


def test_the_manifest_records_files_and_the_category_map(built: Path) -> None:
    man = json.loads((built / "imgpack.json").read_text())
    d = man["dense"]
    assert d["categories"]["format"] == "imgpack-categories"
    assert [c["id"] for c in d["categories"]["categories"]] == [3, 7, 12]
    assert d["categories"]["categories"][2]["flip_map"] == [[1, 2], [3, 4]]
    for name, rec in d["files"].items():
        assert data(built, name).stat().st_size == rec["bytes"] and len(rec["sha256"]) == 64
    assert not list(built.rglob("*.pkl")) and not list(built.rglob("*.pickle"))


def test_a_pack_without_dense_targets_opens_as_before(tmp_path: Path) -> None:
    from PIL import Image

    (tmp_path / "src" / "a").mkdir(parents=True)
    Image.new("RGB", (10, 8), (1, 2, 3)).save(tmp_path / "src" / "a" / "x.png")
    packer.build_pack(tmp_path / "src", tmp_path / "p", BuildConfig(size=(8, 8), workers=1))
    assert "dense" not in json.loads((tmp_path / "p" / "imgpack.json").read_text())
    pack = packer.load(tmp_path / "p")
    assert dense_of(pack) is None and pack.manifest.dense is None


def test_offsets_past_the_end_are_refused(pack: Path) -> None:
    poke(pack, OFFSETS, np.array([10_000], "<i8"), at=8 * 3)  # the last offset of 3 images
    with pytest.raises(PackFormatError, match=r"dense_offsets\.memmap: offsets end at 10000"):
        dense_of(packer.load(pack))


def test_decreasing_offsets_are_refused(pack: Path) -> None:
    poke(pack, OFFSETS, np.array([0, 5, 2], "<i8"))
    with pytest.raises(PackFormatError, match=r"offsets decrease at row 1 \(5 then 2\)"):
        dense_of(packer.load(pack))


def test_an_image_over_the_readers_cap_is_refused(built: Path) -> None:
    with pytest.raises(PackFormatError, match=r"more than the reader's cap of 2"):
        dense_of(packer.load(built), max_instances=2)
    assert dense_of(packer.load(built), max_instances=3) is not None


def test_a_file_of_another_size_is_refused_when_the_pack_opens(pack: Path) -> None:
    f = data(pack, BOXES)
    f.write_bytes(f.read_bytes() + b"\0" * 16)
    with pytest.raises(PackFormatError, match=r"dense_boxes\.memmap is \d+ bytes, the manifest"):
        packer.load(pack)


def test_a_record_that_disagrees_with_the_counts_is_refused(pack: Path) -> None:
    man = json.loads((pack / "imgpack.json").read_text())
    f = data(pack, BOXES)
    f.write_bytes(f.read_bytes() + b"\0" * 16)
    man["dense"]["files"][BOXES]["bytes"] += 16
    (pack / "imgpack.json").write_text(json.dumps(man))
    with pytest.raises(PackFormatError, match=r"dense_boxes\.memmap is \d+ bytes for 3 images"):
        packer.load(pack)


def test_a_missing_or_unlisted_dense_file_is_refused(pack: Path) -> None:
    shutil.copy(data(pack, BOXES), data(pack, "dense_extra.memmap"))
    with pytest.raises(PackFormatError, match=r"unexpected file _tensordict/dense_extra"):
        packer.load(pack)
    data(pack, "dense_extra.memmap").unlink()
    data(pack, LABELS).unlink()
    with pytest.raises(PackFormatError, match=r"dense_labels\.memmap is missing"):
        packer.load(pack)


def test_labels_outside_the_category_map_are_refused(pack: Path) -> None:
    poke(pack, LABELS, np.array([7], "<i8"))
    with pytest.raises(PackFormatError, match=r"a label outside 0\.\.2"):
        dense_of(packer.load(pack))


def test_rle_offsets_past_the_end_are_refused(pack: Path) -> None:
    n = data(pack, RLE_OFFSETS).stat().st_size // 8
    poke(pack, RLE_OFFSETS, np.array([1 << 40], "<i8"), at=8 * (n - 1))
    with pytest.raises(PackFormatError, match=r"dense_rle_offsets\.memmap: offsets end at"):
        dense_of(packer.load(pack))


@pytest.mark.parametrize(
    "counts,why",
    [
        (b"", "an empty RLE"),
        (b"0`", "ends inside a number"),
        (b"\x01", "outside '0'..'o'"),
        (b"`" * 12 + b"0", "more than 12 characters"),
        (b"0" + b"o" * 11 + b"?", "pixels for a 4x4 mask"),  # runs of millions
        (b"05", "pixels for a 4x4 mask"),  # short
    ],
)
def test_rle_that_does_not_cover_its_frame_is_refused(counts: bytes, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        rle_counts(counts, (4, 4))
    with pytest.raises(PackFormatError, match="instance mask 0"):
        decode_masks([counts], (4, 4))


def test_rle_round_trips_through_pycocotools() -> None:
    rng = np.random.default_rng(0)
    masks = (rng.random((5, 13, 9)) < 0.4).astype(np.uint8)
    enc = encode_masks(masks)
    assert all(rle_counts(c, (13, 9)).sum() == 13 * 9 for c in enc)
    np.testing.assert_array_equal(decode_masks(enc, (13, 9)), masks)


def test_a_damaged_rle_in_a_pack_is_refused_on_decode(pack: Path) -> None:
    f = data(pack, RLE)
    raw = bytearray(f.read_bytes())
    raw[0] = ord("o")  # a huge first run
    f.write_bytes(bytes(raw))
    r = dense_of(packer.load(pack)).read([0])[0]
    with pytest.raises(PackFormatError, match="instance mask 0"):
        decode_masks(r["masks_rle"], r["size"])


def test_a_newer_or_damaged_record_is_refused(pack: Path) -> None:
    man = json.loads((pack / "imgpack.json").read_text())
    man["dense"]["version"] = 99
    (pack / "imgpack.json").write_text(json.dumps(man))
    with pytest.raises(PackFormatError, match="upgrade imgpack"):
        packer.load(pack)
    man["dense"]["version"] = 1
    man["dense"]["files"]["../../etc/passwd"] = {"bytes": 1, "sha256": "0" * 64}
    (pack / "imgpack.json").write_text(json.dumps(man))
    with pytest.raises(PackFormatError, match=r"not a dense file"):
        packer.load(pack)
    del man["dense"]["files"]["../../etc/passwd"]
    man["dense"]["categories"] = {"format": "pickle"}
    (pack / "imgpack.json").write_text(json.dumps(man))
    with pytest.raises(PackFormatError, match=r"dense\.categories"):
        packer.load(pack)


def test_png_masks_of_another_size_are_refused(tmp_path: Path) -> None:
    write_masks(tmp_path / "m", TRUTHS)
    cfg = BuildConfig(store="jpeg", workers=1, dense=DenseOptions(format="masks"))
    packer.build_pack(tmp_path / "m", tmp_path / "p", cfg)
    p = tmp_path / "p"
    assert dense_of(packer.load(p)).read([0])[0]["semantic"].shape == TRUTHS[0].size
    # a PNG of another size where the first image's should be (the record made to agree)
    from packer.pack.dense import encode_png

    off = np.fromfile(data(p, PNG_OFFSETS), "<i8")
    blob = data(p, PNG).read_bytes()
    wrong = encode_png(np.zeros((5, 7), np.uint8))
    new = wrong + blob[off[1] :]
    data(p, PNG).write_bytes(new)
    off2 = np.concatenate([[0], off[1:] - off[1] + len(wrong)]).astype("<i8")
    data(p, PNG_OFFSETS).write_bytes(off2.tobytes())
    man = json.loads((p / "imgpack.json").read_text())
    man["dense"]["files"][PNG]["bytes"] = len(new)
    (p / "imgpack.json").write_text(json.dumps(man))
    cols = dense_of(packer.load(p))
    assert cols.read([1])[0]["semantic"].shape == TRUTHS[1].size
    with pytest.raises(PackFormatError, match=r"a L 7x5 PNG for a 64x48 image"):
        cols.read([0])


def test_a_mask_frame_over_the_readers_pixel_bound_is_refused(pack: Path) -> None:
    from packer.pack.dense import FRAMES

    poke(pack, FRAMES, np.array([40_000, 40_000], "<i8"))  # 1.6 G pixels for image 0
    with pytest.raises(PackFormatError, match=r"dense_frames\.memmap: a frame .* max_pixels"):
        dense_of(packer.load(pack))
    poke(pack, FRAMES, np.array([32, 70_000], "<i8"))  # a side over 65536
    with pytest.raises(PackFormatError, match=r"dense_frames\.memmap: a frame outside"):
        dense_of(packer.load(pack), max_pixels=1 << 40)
