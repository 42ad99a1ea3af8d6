"""Image + mask folders: pairing by stem, palette indices read as class ids, the ignore
value, sizes from headers."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from helpers.dense_data import make_truth, write_masks
from packer.errors import DecodeError, InputError
from packer.sources.annotations import AnnotationConfig, CategoryMap, read_annotations
from packer.sources.annotations.masks import read_masks, read_semantic_mask

SEMANTIC = CategoryMap.build(["background", "square", "ell", "person"], [0, 1, 2, 3])


@pytest.mark.parametrize("palette", [True, False])
def test_masks_pair_and_read_as_class_ids(tmp_path, palette):
    truths = make_truth(3, ext=".jpg")
    write_masks(tmp_path, truths, palette=palette)
    ann = read_annotations(tmp_path, AnnotationConfig(categories=SEMANTIC))
    assert ann.format == "masks" and ann.mask_root == tmp_path / "masks"
    assert ann.skipped == []
    for got, t in zip(ann.images, truths):
        assert got.size == t.size and got.semantic == f"{t.stem}.png" and got.count == 0
        arr = read_semantic_mask(ann.mask_root / got.semantic, got.size, ann.categories)
        assert arr.dtype == np.uint8
        np.testing.assert_array_equal(arr, t.semantic())  # palette indices, not colours
        assert (arr == 255).any()  # the ignore value passes the category check


def test_voc_and_ade_folder_names_are_detected(tmp_path):
    truths = make_truth(2, ext=".jpg")
    write_masks(tmp_path / "voc", truths, images="JPEGImages", masks="SegmentationClass")
    write_masks(tmp_path / "ade", truths, images="images", masks="annotations")
    assert read_annotations(tmp_path / "voc").mask_root == tmp_path / "voc" / "SegmentationClass"
    assert read_annotations(tmp_path / "ade").mask_root == tmp_path / "ade" / "annotations"


def test_a_mask_of_another_size_is_skipped(tmp_path):
    truths = make_truth(2, ext=".jpg")
    write_masks(tmp_path, truths)
    Image.new("L", (10, 10)).save(tmp_path / "masks" / "img_001.png")
    ann = read_masks(tmp_path / "images", tmp_path / "masks")
    assert [im.file for im in ann.images] == ["img_000.jpg"]
    [skip] = ann.skipped
    assert skip.file == "img_001.jpg" and "is 10x10, the image 80x60" in skip.reason


def test_unpaired_and_rgb_masks_are_skipped_with_reasons(tmp_path):
    truths = make_truth(3, ext=".jpg")
    write_masks(tmp_path, truths)
    (tmp_path / "masks" / "img_000.png").unlink()
    Image.new("L", (4, 4)).save(tmp_path / "masks" / "orphan.png")
    Image.new("RGB", (80, 60)).save(tmp_path / "masks" / "img_001.png")
    ann = read_masks(tmp_path / "images", tmp_path / "masks")
    assert [im.file for im in ann.images] == ["img_002.jpg"]
    reasons = {s.file: s.reason for s in ann.skipped}
    assert "no mask named img_000.*" in reasons["img_000.jpg"]
    assert "is RGB, not one channel" in reasons["img_001.jpg"]
    assert "a mask with no image" in reasons["orphan.png"]


def test_mask_values_outside_the_categories_are_refused(tmp_path):
    arr = np.zeros((4, 5), np.uint8)
    arr[0, 0] = 9
    Image.fromarray(arr).save(tmp_path / "m.png")
    with pytest.raises(DecodeError, match=r"values \[9\] are neither category ids"):
        read_semantic_mask(tmp_path / "m.png", (4, 5), SEMANTIC)
    with pytest.raises(DecodeError, match="a 5x4 mask for a 6x4 image"):
        read_semantic_mask(tmp_path / "m.png", (4, 6))
    # another ignore value makes 9 allowed
    assert read_semantic_mask(tmp_path / "m.png", (4, 5), SEMANTIC, ignore_index=9)[0, 0] == 9


def test_strict_refuses_a_mask_of_another_size(tmp_path):
    write_masks(tmp_path, make_truth(1, ext=".jpg"))
    Image.new("L", (10, 10)).save(tmp_path / "masks" / "img_000.png")
    with pytest.raises(InputError, match=r"img_000.jpg: its mask img_000.png is 10x10") as e:
        read_masks(tmp_path / "images", tmp_path / "masks", AnnotationConfig(strict=True))
    assert e.value.field == "AnnotationConfig.strict"
