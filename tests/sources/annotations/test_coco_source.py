"""COCO JSON read into the common model: boxes, sparse ids, polygon and RLE masks,
keypoints and their flip map, exactly as the generator drew them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers.dense_data import COCO_IDS, FLIP_PAIRS, KEYPOINTS, NAMES, make_truth, write_coco
from packer.errors import InputError
from packer.sources.annotations import AnnotationConfig, CategoryMap, read_annotations
from packer.sources.annotations.coco import read_coco


def _check_against(ann, truths, *, masks=True):
    assert [t.file for t in ann.images] == [t.file for t in truths]
    for got, t in zip(ann.images, truths):
        assert got.size == t.size
        want_boxes = np.array([s.box for s in t.shapes], dtype=np.float32)
        np.testing.assert_array_equal(got.boxes, want_boxes)
        assert got.boxes.dtype == np.float32 and got.labels.dtype == np.int64
        assert got.labels.tolist() == [s.label for s in t.shapes]
        assert got.iscrowd.tolist() == [0, 0, 0]
        np.testing.assert_array_equal(got.area, [s.mask.sum() for s in t.shapes])
        if masks:
            dec = got.decode_masks()
            assert dec.shape == (3, *t.size)
            for k, s in enumerate(t.shapes):
                np.testing.assert_array_equal(dec[k], s.mask, err_msg=f"{t.file} {s.name}")


def test_instances_boxes_masks_and_sparse_ids(tmp_path):
    truths = make_truth(4)
    path = write_coco(tmp_path, truths)
    ann = read_coco(path)
    assert ann.format == "coco" and ann.root == tmp_path / "train2017"
    # ids 3, 7, 12 (listed out of order) become indices 0, 1, 2, the ids kept
    assert ann.categories.names == tuple(NAMES)
    assert ann.categories.ids == tuple(COCO_IDS[n] for n in NAMES)
    assert ann.skipped == [] and ann.clipped == 0
    _check_against(ann, truths)
    assert ann.images[0].image_id == 1000
    assert ann.images[0].keypoints is None


def test_uncompressed_rle_is_converted(tmp_path):
    truths = make_truth(2)
    path = write_coco(tmp_path, truths, uncompressed=True)
    ann = read_coco(path)
    _check_against(ann, truths)


def test_person_keypoints_and_flip_map(tmp_path):
    truths = make_truth(3)
    path = write_coco(tmp_path, truths, split="val2017", keypoints=True)
    ann = read_annotations(tmp_path)
    assert ann.format == "coco" and path.name == "person_keypoints_val2017.json"
    person = NAMES.index("person")
    assert ann.categories.keypoints[person] == tuple(KEYPOINTS)
    assert ann.categories.flip_maps() == {person: FLIP_PAIRS}
    for got, t in zip(ann.images, truths):
        assert got.keypoints.shape == (3, len(KEYPOINTS), 3)
        assert got.keypoints.dtype == np.float32
        np.testing.assert_array_equal(got.keypoints[2], np.array(t.shapes[2].keypoints))
        assert not got.keypoints[:2].any()  # shapes without keypoints: invisible zeros
    _check_against(ann, truths)


def test_a_set_without_segmentations_has_no_masks(tmp_path):
    truths = make_truth(2)
    path = write_coco(tmp_path, truths)
    doc = json.loads(path.read_text())
    for a in doc["annotations"]:
        del a["segmentation"]
    path.write_text(json.dumps(doc))
    ann = read_coco(path)
    assert all(im.masks is None for im in ann.images)
    _check_against(ann, truths, masks=False)


def test_an_image_without_annotations_is_kept_empty(tmp_path):
    truths = make_truth(2)
    path = write_coco(tmp_path, truths)
    doc = json.loads(path.read_text())
    doc["annotations"] = [a for a in doc["annotations"] if a["image_id"] != 1001]
    path.write_text(json.dumps(doc))
    ann = read_coco(path)
    empty = ann.images[1]
    assert empty.count == 0 and empty.boxes.shape == (0, 4) and empty.masks == ()
    assert empty.decode_masks().shape == (0, *truths[1].size)


def test_categories_are_stable_across_splits(tmp_path):
    """A map saved from train and given to val fixes the indices even where val lists
    its categories in another order, lacks one, and uses other ids."""
    train = write_coco(tmp_path, make_truth(2), split="train2017")
    t_ann = read_coco(train)
    map_file = tmp_path / "categories.json"
    t_ann.categories.save(map_file)

    val = write_coco(tmp_path, make_truth(2), split="val2017")
    doc = json.loads(val.read_text())
    doc["categories"] = [
        {"id": 1, "name": "person"},
        {"id": 2, "name": "ell"},
    ]  # "square" absent, ids renumbered
    remap = {12: 1, 7: 2}
    doc["annotations"] = [
        {**a, "category_id": remap[a["category_id"]]}
        for a in doc["annotations"]
        if a["category_id"] in remap
    ]
    val.write_text(json.dumps(doc))
    derived = read_coco(val)
    assert derived.categories.names == ("person", "ell")  # by the split's own ids

    v_ann = read_coco(val, config=AnnotationConfig(categories=map_file))
    assert v_ann.categories == t_ann.categories
    assert v_ann.images[0].labels.tolist() == [NAMES.index("ell"), NAMES.index("person")]


def test_a_category_outside_the_fixed_map_is_refused_or_appended(tmp_path):
    path = write_coco(tmp_path, make_truth(1))
    fixed = CategoryMap.build(["person", "square"], [12, 3])
    with pytest.raises(InputError, match=r"'ell' of .* not in the category map") as e:
        read_coco(path, config=AnnotationConfig(categories=fixed))
    assert e.value.field == "AnnotationConfig.allow_new_categories"
    ann = read_coco(path, config=AnnotationConfig(categories=fixed, allow_new_categories=True))
    assert ann.categories.names == ("person", "square", "ell")
    assert ann.categories.ids == (12, 3, 7)
    assert ann.images[0].labels.tolist() == [1, 2, 0]


def test_images_folder_beside_the_annotations(tmp_path):
    truths = make_truth(1)
    path = write_coco(tmp_path, truths, split="train2017")
    (tmp_path / "train2017").rename(tmp_path / "pictures")
    with pytest.raises(InputError, match=r"AnnotationConfig\.images"):
        read_coco(path)
    ann = read_coco(path, tmp_path / "pictures")
    _check_against(ann, truths)
