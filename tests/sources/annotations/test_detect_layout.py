"""Which layout a folder holds, or the named one; errors list what was looked for."""

from __future__ import annotations

import pytest

from helpers.dense_data import make_truth, write_coco, write_masks, write_voc, write_yolo
from packer.errors import InputError, UsageError
from packer.sources.annotations import AnnotationConfig, detect_layout


def test_each_layout_is_detected(tmp_path):
    t = make_truth(1)
    coco = write_coco(tmp_path / "coco", t)
    write_yolo(tmp_path / "yolo", t)
    write_voc(tmp_path / "voc", t)
    write_masks(tmp_path / "masks", t)
    assert detect_layout(tmp_path / "coco").annotations == coco
    assert detect_layout(tmp_path / "yolo").format == "yolo"
    assert detect_layout(tmp_path / "voc").format == "voc"
    layout = detect_layout(tmp_path / "masks")
    assert (layout.format, layout.masks) == ("masks", tmp_path / "masks" / "masks")


def test_an_empty_folder_lists_what_was_looked_for(tmp_path):
    with pytest.raises(InputError, match=r"looked for a COCO JSON .*YOLO .*Pascal VOC .*mask") as e:
        detect_layout(tmp_path)
    assert e.value.field == "AnnotationConfig.format"


def test_a_named_format_that_is_absent_says_what_it_looked_for(tmp_path):
    with pytest.raises(InputError, match=r"no COCO JSON: looked for annotations/instances_\*"):
        detect_layout(tmp_path, AnnotationConfig(format="coco"))
    with pytest.raises(InputError, match=r"no image \+ mask folders: looked for images/ \+ masks/"):
        detect_layout(tmp_path, AnnotationConfig(format="masks"))
    with pytest.raises(UsageError, match=r"AnnotationConfig\.format 'kitti' is not one of"):
        AnnotationConfig(format="kitti")


def test_several_coco_splits_need_a_split(tmp_path):
    write_coco(tmp_path, make_truth(1), split="train2017")
    write_coco(tmp_path, make_truth(1), split="val2017")
    write_coco(tmp_path, make_truth(1), split="val2017", keypoints=True)
    with pytest.raises(InputError, match="several splits \\(train2017, val2017\\)") as e:
        detect_layout(tmp_path)
    assert e.value.field == "AnnotationConfig.split"
    got = detect_layout(tmp_path, AnnotationConfig(split="val2017")).annotations
    assert got.name == "instances_val2017.json"  # instances wins its split
    with pytest.raises(InputError, match="no COCO JSON of split 'test'"):
        detect_layout(tmp_path, AnnotationConfig(split="test"))


def test_a_named_format_wins_over_detection(tmp_path):
    """VOC's folder with SegmentationClass/ is VOC unless the masks are asked for."""
    t = make_truth(1)
    write_voc(tmp_path, t)
    write_masks(tmp_path, t, images="JPEGImages", masks="SegmentationClass")
    assert detect_layout(tmp_path).format == "voc"
    assert detect_layout(tmp_path, AnnotationConfig(format="masks")).format == "masks"
