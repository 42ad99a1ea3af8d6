"""Bad annotations (issue 46.7): each a skip with its file, annotation id and reason,
or an InputError naming AnnotationConfig.strict; bounds from AnnotationConfig."""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import pytest

from helpers.dense_data import coco_doc, make_truth, voc_xml, write_coco, write_voc, write_yolo
from packer.errors import InputError, UsageError
from packer.sources.annotations import AnnotationConfig
from packer.sources.annotations.coco import read_coco
from packer.sources.annotations.voc import read_voc
from packer.sources.annotations.yolo import read_yolo

STRICT = AnnotationConfig(strict=True)


def _coco(tmp_path, edit, n=2):
    """A COCO set whose JSON ``edit(doc)`` changed; returns its path."""
    path = write_coco(tmp_path, make_truth(n))
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    return path


def _ann(doc, aid):
    return next(a for a in doc["annotations"] if a["id"] == aid)


def _one_skip(ann):
    assert len(ann.skipped) == 1, ann.skipped
    return ann.skipped[0]


# ------------------------------------------------------------------ boxes


def test_a_box_partly_outside_is_clipped_and_counted(tmp_path):
    def edit(doc):
        _ann(doc, 100)["bbox"] = [-4, 40, 20, 30]  # image 0 is 64x48

    ann = read_coco(_coco(tmp_path, edit))
    assert ann.skipped == [] and ann.clipped == 1
    np.testing.assert_array_equal(ann.images[0].boxes[0], [0, 40, 16, 48])


def test_a_box_wholly_outside_is_dropped_counted_and_named(tmp_path):
    def edit(doc):
        _ann(doc, 101)["bbox"] = [70, 10, 5, 5]

    ann = read_coco(_coco(tmp_path, edit))
    s = _one_skip(ann)
    assert (s.file, s.annotation) == ("img_000.png", 101)
    assert "lies wholly outside the 64x48 image" in s.reason
    assert ann.outside == 1 and ann.images[0].count == 2
    with pytest.raises(InputError, match=r"img_000.png annotation 101: box .* wholly outside") as e:
        read_coco(_coco(tmp_path, edit), config=STRICT)
    assert e.value.field == "AnnotationConfig.strict"


@pytest.mark.parametrize(
    ("bbox", "reason"),
    [
        ([5, 5, -3, 4], "width -3 and height 4; both must be > 0"),
        ([5, 5, 3, 0], "width 3 and height 0; both must be > 0"),
        ([5, 5, float("nan"), 4], "non-finite coordinate"),
        ([5, float("inf"), 3, 4], "non-finite coordinate"),
        ([5, 5, 3], "is not four numbers"),
        ("5 5 3 3", "is not four numbers"),
    ],
)
def test_bad_box_sizes_are_skipped(tmp_path, bbox, reason):
    def edit(doc):
        _ann(doc, 102)["bbox"] = bbox

    ann = read_coco(_coco(tmp_path, edit))  # json writes NaN/Infinity literals, as some tools do
    s = _one_skip(ann)
    assert s.annotation == 102 and reason in s.reason
    assert ann.images[0].count == 2
    with pytest.raises(InputError, match=r"AnnotationConfig\.strict"):
        read_coco(_coco(tmp_path, edit), config=STRICT)


# ------------------------------------------------------------------ categories, images


def test_an_unknown_category_is_skipped(tmp_path):
    def edit(doc):
        _ann(doc, 100)["category_id"] = 99

    s = _one_skip(read_coco(_coco(tmp_path, edit)))
    assert s.annotation == 100 and "category_id 99 is not in the JSON's categories" in s.reason


def test_an_annotation_naming_a_missing_image_is_skipped(tmp_path):
    def edit(doc):
        _ann(doc, 100)["image_id"] = 5555

    path = _coco(tmp_path, edit)
    s = _one_skip(read_coco(path))
    assert (s.file, s.annotation) == (str(path), 100)
    assert "names image_id 5555, which the JSON's images do not list" in s.reason
    with pytest.raises(InputError, match="annotation 100: names image_id 5555"):
        read_coco(path, config=STRICT)


def test_an_image_whose_file_is_missing_is_skipped_once(tmp_path):
    path = write_coco(tmp_path, make_truth(2))
    (tmp_path / "train2017" / "img_001.png").unlink()
    ann = read_coco(path)
    s = _one_skip(ann)  # its three annotations are not listed again
    assert s.file == "img_001.png" and "not found under" in s.reason
    assert [im.file for im in ann.images] == ["img_000.png"]


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("file_name", "../../etc/passwd", "leads outside the image folder"),
        ("file_name", "/etc/passwd", "leads outside the image folder"),
        ("width", 0, "must be positive integers"),
        ("height", "48", "must be positive integers"),
    ],
)
def test_bad_image_entries_are_skipped(tmp_path, field, value, reason):
    def edit(doc):
        doc["images"][1][field] = value

    ann = read_coco(_coco(tmp_path, edit))
    s = _one_skip(ann)
    assert reason in s.reason and len(ann.images) == 1


# ------------------------------------------------------------------ masks, keypoints


def test_an_rle_of_another_size_than_its_image_is_skipped(tmp_path):
    def edit(doc):
        _ann(doc, 102)["segmentation"]["size"] = [10, 10]

    s = _one_skip(read_coco(_coco(tmp_path, edit)))
    assert s.annotation == 102 and "an RLE mask of 10x10, not the image's 64x48" in s.reason


@pytest.mark.parametrize(
    ("seg", "reason"),
    [
        ([[1, 1, 5, 5]], "polygon 0 has 4 coordinates; a polygon needs at least 3 points"),
        ([[1, 1, 5, 5, 9]], "polygon 0 has 5 coordinates"),
        ([[1, 1, 5, 1, 5, 5], []], "polygon 1 has 0 coordinates"),
        ([[1, 1, 5, "x", 5, 5]], "polygon 0 is not a list of numbers"),
        ({"size": [48, 64], "counts": "\x7f\x7f"}, "counts string is damaged"),
        ({"size": [48, 64], "counts": "0000"}, "a compressed RLE of 0 pixels"),
        ({"size": [48, 64], "counts": [10, 20]}, "an uncompressed RLE of 30 pixels"),
        ({"size": [48, 64], "counts": [-1, 3073]}, "not non-negative integers"),
    ],
)
def test_bad_segmentations_are_skipped(tmp_path, seg, reason):
    def edit(doc):
        _ann(doc, 100)["segmentation"] = seg

    s = _one_skip(read_coco(_coco(tmp_path, edit)))
    assert s.annotation == 100 and reason in s.reason


def test_an_overlong_compressed_rle_is_refused_before_pycocotools_decodes_it(tmp_path):
    """pycocotools writes past the mask for counts that sum beyond h*w: checked first."""
    from pycocotools import mask as cm

    big = np.ones((480, 640), np.uint8, order="F")
    counts = cm.encode(big)["counts"].decode()

    def edit(doc):
        _ann(doc, 102)["segmentation"] = {"size": [48, 64], "counts": counts}

    s = _one_skip(read_coco(_coco(tmp_path, edit)))
    assert "a compressed RLE of 307200 pixels, not the image's 3072" in s.reason


def test_keypoints_of_another_count_are_skipped(tmp_path):
    path = write_coco(tmp_path, make_truth(1), keypoints=True)
    doc = json.loads(path.read_text())
    _ann(doc, 102)["keypoints"] = [1, 2, 2]
    path.write_text(json.dumps(doc))
    s = _one_skip(read_coco(path))
    assert s.annotation == 102 and "keypoints must be 15 finite numbers" in s.reason


def test_coco_masks_without_pycocotools_name_the_extra(tmp_path, monkeypatch):
    path = write_coco(tmp_path, make_truth(1))
    monkeypatch.setitem(sys.modules, "pycocotools", None)
    with pytest.raises(UsageError, match=r"pip install 'imgpack\[dense\]'"):
        read_coco(path)


# ------------------------------------------------------------------ caps


def test_more_boxes_than_the_cap_skips_the_image(tmp_path):
    path = write_coco(tmp_path, make_truth(2))
    ann = read_coco(path, config=AnnotationConfig(max_boxes=2))
    assert ann.images == [] and len(ann.skipped) == 2
    assert "3 boxes, more than AnnotationConfig.max_boxes (2)" in ann.skipped[0].reason
    assert len(read_coco(path, config=AnnotationConfig(max_boxes=3)).images) == 2
    with pytest.raises(InputError, match=r"max_boxes \(2\)") as e:
        read_coco(path, config=AnnotationConfig(max_boxes=2, strict=True))
    assert e.value.field == "AnnotationConfig.strict"
    assert "AnnotationConfig.max_boxes" in e.value.fields


def test_a_json_over_the_byte_cap_is_refused_naming_the_cap(tmp_path):
    path = write_coco(tmp_path, make_truth(1))
    size = path.stat().st_size
    cap = size - 1
    match = rf"{size:,} bytes, more than AnnotationConfig\.max_json_bytes \({cap:,}\).*raise"
    with pytest.raises(InputError, match=match) as e:
        read_coco(path, config=AnnotationConfig(max_json_bytes=cap))
    assert e.value.field == "AnnotationConfig.max_json_bytes"
    assert read_coco(path, config=AnnotationConfig(max_json_bytes=size)).images


def test_a_10_gb_json_is_refused_from_its_size_without_reading(tmp_path):
    (tmp_path / "train2017").mkdir()
    path = tmp_path / "instances_train2017.json"
    with open(path, "wb") as f:
        f.truncate(10 << 30)  # sparse: nothing is written, a read would take minutes
    t0 = time.perf_counter()
    with pytest.raises(
        InputError,
        match=r"10,737,418,240 bytes, more than AnnotationConfig\.max_json_bytes \(2,147,483,648\)",
    ):
        read_coco(path)
    assert time.perf_counter() - t0 < 5
    os.unlink(path)


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_caps_must_be_positive_integers(bad):
    for name in ("max_boxes", "max_json_bytes", "max_file_bytes"):
        with pytest.raises(
            UsageError, match=rf"AnnotationConfig\.{name} must be a positive integer"
        ) as e:
            AnnotationConfig(**{name: bad})
        assert e.value.field == f"AnnotationConfig.{name}"


# ------------------------------------------------------------------ YOLO


def test_yolo_bad_lines_are_skipped_with_their_line(tmp_path):
    truths = make_truth(2)
    write_yolo(tmp_path, truths)
    (tmp_path / "labels" / "img_000.txt").write_text(
        "0 0.5 0.5 0.2 0.2\n"  # kept
        "7 0.5 0.5 0.2 0.2\n"  # class 7: not among the names
        "1 0.5 0.5 nan 0.2\n"
        "1 1.5 1.5 0.2 0.2\n"  # wholly outside
        "2 0.5 0.5 -0.1 0.2\n"
        "2 0.5 0.5\n"
        "x 0.5 0.5 0.2 0.2\n"
        "2 0.05 0.5 0.2 0.2\n"  # partly outside: clipped
    )
    (tmp_path / "labels" / "ghost.txt").write_text("0 0.5 0.5 0.1 0.1\n")
    ann = read_yolo(tmp_path)
    assert ann.images[0].count == 2 and ann.clipped == 1 and ann.outside == 1
    reasons = [(s.file, s.annotation, s.reason) for s in ann.skipped]
    assert (
        reasons[0][:2] == ("img_000.png", 2) and "class 7 is not among the names" in reasons[0][2]
    )
    assert "non-finite" in reasons[1][2] and "wholly outside" in reasons[2][2]
    assert "both must be > 0" in reasons[3][2] and "3 values" in reasons[4][2]
    assert "not a class number and four numbers" in reasons[5][2]
    assert reasons[6][0] == "ghost.txt" and "a label file with no image" in reasons[6][2]
    with pytest.raises(InputError, match=r"img_000.png annotation 2: .*class 7"):
        read_yolo(tmp_path, STRICT)


def test_yolo_more_lines_than_the_cap_skips_the_image(tmp_path):
    write_yolo(tmp_path, make_truth(1))
    ann = read_yolo(tmp_path, AnnotationConfig(max_boxes=2))
    assert ann.images == [] and "more than AnnotationConfig.max_boxes (2)" in ann.skipped[0].reason


def test_yolo_label_file_over_the_byte_cap_is_skipped(tmp_path):
    write_yolo(tmp_path, make_truth(1))
    (tmp_path / "labels" / "img_000.txt").write_text("0 0.5 0.5 0.2 0.2\n" * 100)
    ann = read_yolo(tmp_path, AnnotationConfig(max_file_bytes=500))
    assert ann.images == [] and "larger than" in ann.skipped[0].reason


# ------------------------------------------------------------------ VOC


def test_voc_bad_objects_and_missing_images(tmp_path):
    truths = make_truth(3)
    write_voc(tmp_path, truths)
    xml = voc_xml(truths[0]).replace("<xmax>14</xmax>", "<xmax>99</xmax>")  # clipped
    xml = xml.replace("<xmin>21</xmin>", "<xmin>x</xmin>")  # the ell: not a number
    (tmp_path / "Annotations" / "img_000.xml").write_text(xml)
    (tmp_path / "JPEGImages" / "img_002.png").unlink()
    ann = read_voc(tmp_path)
    assert [im.file for im in ann.images] == ["img_000.png", "img_001.png"]
    assert ann.images[0].count == 2 and ann.clipped == 1
    assert ann.images[0].boxes[0].tolist() == [2, 3, 64, 13]
    (b, a) = ann.skipped  # the missing image is found first, when the XML files are listed
    assert (a.file, a.annotation) == ("img_000.png", 1) and "is not four numbers" in a.reason
    assert b.file == "img_002.png" and "not found under" in b.reason
    with pytest.raises(InputError, match=r"AnnotationConfig\.strict"):
        read_voc(tmp_path, STRICT)


def test_voc_more_objects_than_the_cap_skips_the_image(tmp_path):
    write_voc(tmp_path, make_truth(1))
    ann = read_voc(tmp_path, AnnotationConfig(max_boxes=1))
    assert (
        ann.images == []
        and "3 boxes, more than AnnotationConfig.max_boxes (1)" in ann.skipped[0].reason
    )


def test_coco_doc_helper_matches_the_written_set():
    """The generator's JSON lists categories out of id order (the sparse-id test relies on it)."""
    doc = coco_doc(make_truth(1))
    assert [c["id"] for c in doc["categories"]] == [12, 3, 7]


def test_yolo_an_image_that_is_a_fifo_is_skipped_not_waited_on(tmp_path):
    write_yolo(tmp_path, make_truth(2))
    fifo = tmp_path / "images" / "img_001.png"
    fifo.unlink()
    os.mkfifo(fifo)
    ann = read_yolo(tmp_path)
    assert [im.file for im in ann.images] == ["img_000.png"]
    assert "a FIFO, not a regular file" in ann.skipped[0].reason
