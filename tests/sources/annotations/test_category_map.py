"""The category map: contiguous indices, original ids, keypoints and flip maps, saved
and loaded as JSON, fixed across splits like BuildConfig.classes."""

from __future__ import annotations

import json

import pytest

from packer.errors import InputError
from packer.sources.annotations import CategoryMap, load_category_map, resolve_categories
from packer.sources.annotations.model import derive_flip_map

COCO_KP = [
    "nose", "left_eye", "right_eye", "left_ear", "right_ear", "left_shoulder",
    "right_shoulder", "left_elbow", "right_elbow", "left_wrist", "right_wrist", "left_hip",
    "right_hip", "left_knee", "right_knee", "left_ankle", "right_ankle",
]  # fmt: skip


def test_coco_keypoints_flip_pairs():
    pairs = derive_flip_map(COCO_KP)
    assert pairs == ((1, 2), (3, 4), (5, 6), (7, 8), (9, 10), (11, 12), (13, 14), (15, 16))
    assert derive_flip_map(["Left Hand", "Right Hand", "leftover", "rightover"]) == ((0, 1),)


def test_save_and_load_round_trip(tmp_path):
    m = CategoryMap.build(["person", "dog"], [1, 18], [COCO_KP, []])
    m.save(tmp_path / "cats.json")
    assert not list(tmp_path.glob("*.tmp"))
    back = load_category_map(tmp_path / "cats.json")
    assert back == m and back.flip_maps() == {0: list(derive_flip_map(COCO_KP))}
    assert back.index_of_id == {1: 0, 18: 1} and back.num_keypoints == 17


def test_a_text_file_of_names_is_a_map(tmp_path):
    (tmp_path / "names.txt").write_text("cat\ndog\n")
    m = load_category_map(tmp_path / "names.txt")
    assert m.names == ("cat", "dog") and m.ids == (0, 1)


@pytest.mark.parametrize(
    ("obj", "match"),
    [
        ({"format": "x"}, "not an imgpack category map"),
        ({"format": "imgpack-categories", "version": 9, "categories": []}, "version 9"),
        ({"format": "imgpack-categories", "version": 1, "categories": []}, "non-empty list"),
        (
            {"format": "imgpack-categories", "version": 1,
             "categories": [{"name": "a", "id": 1}, {"name": "b", "id": 1}]},
            "id 1 is given to both 'a' and 'b'",
        ),
        (
            {"format": "imgpack-categories", "version": 1,
             "categories": [{"name": "a"}, {"name": "a"}]},
            "'a' appears twice",
        ),
        (
            {"format": "imgpack-categories", "version": 1,
             "categories": [{"name": "a", "keypoints": ["x"], "flip_map": [[0, 3]]}]},
            r"flip_map pair \(0, 3\) is not two keypoint indices in 0..0",
        ),
    ],
)  # fmt: skip
def test_bad_map_files_are_refused(tmp_path, obj, match):
    p = tmp_path / "m.json"
    p.write_text(json.dumps(obj))
    with pytest.raises(InputError, match=match):
        load_category_map(p)


def test_a_category_map_file_has_a_size_bound(tmp_path):
    p = tmp_path / "m.json"
    p.write_text(" " * 2000)
    with pytest.raises(InputError, match="larger than"):
        load_category_map(p, max_bytes=1000)


def test_resolve_keeps_the_fixed_order_and_appends_new():
    fixed = CategoryMap.build(["b", "a"], [20, 10])
    found = CategoryMap.build(["a", "c", "b"], [10, 20, 30])
    with pytest.raises(InputError, match="category 'c' of x not in the category map"):
        resolve_categories(found, fixed, source="x")
    got = resolve_categories(found, fixed, allow_new=True)
    # 'c' keeps its id unless the map already uses it (20 is b's): then a fresh one
    assert got.names == ("b", "a", "c") and got.ids == (20, 10, 21)
    assert resolve_categories(found, None) is found


def test_resolve_takes_keypoints_from_the_source_and_refuses_another_order():
    fixed = CategoryMap.build(["person"], [1])
    found = CategoryMap.build(["person"], [1], [["left_a", "right_a"]])
    assert resolve_categories(found, fixed).flip_map == (((0, 1),),)
    other = CategoryMap.build(["person"], [1], [["right_a", "left_a"]])
    with pytest.raises(InputError, match="the order of keypoints must match"):
        resolve_categories(other, resolve_categories(found, fixed))
