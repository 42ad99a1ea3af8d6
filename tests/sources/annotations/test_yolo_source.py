"""YOLO folders: normalized boxes back to pixels, data.yaml names in every form the
subset reads, sizes from image headers."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from helpers.dense_data import NAMES, make_truth, write_yolo
from packer.errors import InputError
from packer.sources.annotations import AnnotationConfig, read_annotations
from packer.sources.annotations.yolo import parse_names, read_yolo


def test_boxes_come_back_in_pixels(tmp_path):
    truths = make_truth(4)
    write_yolo(tmp_path, truths, split="train")
    ann = read_annotations(tmp_path, AnnotationConfig(split="train"))
    assert ann.format == "yolo" and ann.root == tmp_path / "images" / "train"
    assert ann.categories.names == tuple(NAMES) and ann.categories.ids == (0, 1, 2)
    assert ann.skipped == []
    for got, t in zip(ann.images, truths):
        assert got.size == t.size
        np.testing.assert_allclose(got.boxes, [s.box for s in t.shapes], atol=1e-4)
        assert got.labels.tolist() == [s.label for s in t.shapes]
        assert got.masks is None and got.keypoints is None


def test_an_image_without_a_label_file_has_no_boxes(tmp_path):
    truths = make_truth(2)
    write_yolo(tmp_path, truths)
    (tmp_path / "labels" / "img_001.txt").unlink()
    ann = read_yolo(tmp_path)
    assert [im.count for im in ann.images] == [3, 0]


def test_size_comes_from_the_header_exif_applied(tmp_path):
    truths = make_truth(1, ext=".jpg")
    write_yolo(tmp_path, truths)
    path = tmp_path / "images" / "img_000.jpg"
    im = Image.open(path)
    exif = im.getexif()
    exif[0x0112] = 6  # rotated: the decoder swaps width and height
    im.save(path, exif=exif)
    ann = read_yolo(tmp_path)
    h, w = truths[0].size
    assert ann.images[0].size == (w, h)


@pytest.mark.parametrize(
    "text",
    [
        "names: [square, ell, person]\n",
        "names: ['square', \"ell\", person]  # comment\n",
        "nc: 3\nnames:\n  - square\n  - ell\n  # a comment\n  - person\n",
        "names:\n  0: square\n  1: 'ell'\n  2: person\ntrain: images/train\n",
        "names: {0: square, 1: ell, 2: person}\n",
    ],
)
def test_data_yaml_names_in_each_form(text):
    assert parse_names(text, "data.yaml") == ([0, 1, 2], ["square", "ell", "person"])


def test_sparse_yolo_class_numbers_map_to_indices():
    assert parse_names("names:\n  2: a\n  7: b\n", "d") == ([2, 7], ["a", "b"])


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("nc: 3\n", "no top-level 'names:'"),
        ("names: [a, [b]]\n", "nested"),
        ("names: a\n", "must be a list or a mapping"),
        ("names:\n  x: a\n", "not 'number: name'"),
        ("names: [a, 'b]\n", "unclosed quote"),
        ("names:\n  0: a\n  0: b\n", "appears twice"),
    ],
)
def test_data_yaml_outside_the_subset_is_refused(text, match):
    with pytest.raises(InputError, match=match):
        parse_names(text, "data.yaml")


def test_no_names_anywhere_says_what_was_looked_for(tmp_path):
    write_yolo(tmp_path, make_truth(1))
    (tmp_path / "data.yaml").unlink()
    (tmp_path / "labels" / "x").mkdir()
    with pytest.raises(InputError, match=r"looked for data.yaml .*classes.txt") as e:
        read_yolo(tmp_path)
    assert e.value.field == "AnnotationConfig.categories"
    (tmp_path / "classes.txt").write_text("square\nell\nperson\n")
    assert read_yolo(tmp_path).categories.names == tuple(NAMES)
