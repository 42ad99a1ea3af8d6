"""``imgpack show`` of packs with dense targets (issue 46.6): boxes drawn at their
outline, mask overlays inside the masks only, semantic overlays off the ignore value,
keypoints of visibility 0 left out; the sheet's rows per category and its size; draws
of the dense transforms; the refusals naming ShowConfig fields."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import packer
from conftest import cli_run, one_error, write_image
from helpers.dense_data import NAMES, draw, make_truth, write_coco, write_masks
from packer.builder.config import BuildConfig
from packer.builder.dense import DenseOptions
from packer.errors import UsageError
from packer.measure.show import ShowConfig, show_pack
from packer.measure.show_dense import annotate, colour, enlarge
from packer.pack.dense import dense_of

pytest.importorskip("matplotlib")
pytest.importorskip("pycocotools")

TRUTHS = make_truth(6)


class _Cats:
    names = tuple(NAMES)
    ids = (3, 7, 12)


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("showdense")
    write_coco(root / "coco", TRUTHS, keypoints=True)
    out = {"coco": root / "coco_pack", "sem": root / "sem", "plain": root / "plain"}
    packer.build_pack(
        root / "coco", out["coco"], BuildConfig(size=(64, 48), resize="stretch", workers=1)
    )
    packer.build_pack(
        write_masks(root / "m", TRUTHS),
        out["sem"],
        BuildConfig(store="jpeg", workers=1, dense=DenseOptions(format="masks")),
    )
    for i in range(4):
        write_image(root / "flat" / f"c{i % 2}" / f"{i}.jpg", (24, 18), seed=i)
    packer.build_pack(root / "flat", out["plain"], BuildConfig(size=(8, 6), workers=1))
    return out


def _plain(t):  # the truth's image as an HWC array
    return np.asarray(draw(t))


def test_a_box_outline_is_drawn_along_the_known_box() -> None:
    t = TRUTHS[2]
    img = _plain(t)
    person = t.shapes[2]
    x1, _y1, x2, y2 = person.box
    out = annotate(img, {"boxes": [person.box], "labels": [person.label]}, _Cats)
    assert out.shape == img.shape
    want = np.array(colour(person.label), np.uint8)
    # the bottom edge (last row inside), the right edge low down (below the name's tag)
    for x in range(x1, x2):
        assert (out[y2 - 1, x] == want).all() and (out[y2 - 1, x] != img[y2 - 1, x]).any()
    for y in range(y2 - 5, y2):
        assert (out[y, x2 - 1] == want).all() and (out[y, x1] == want).all()
    # inside the box, away from the outline and the tag, the image is as it was
    assert (out[y2 - 3, x1 + 2 : x2 - 2] == img[y2 - 3, x1 + 2 : x2 - 2]).all()
    # outside the box and its tag, nothing changed
    assert (out[y2 + 1 :] == img[y2 + 1 :]).all()
    assert (out[:, : x1 - 1] == img[:, : x1 - 1]).all()


def test_instance_masks_change_pixels_inside_the_masks_only() -> None:
    t = TRUTHS[1]
    img = _plain(t)
    masks = np.stack([s.mask for s in t.shapes])
    out = annotate(img, {"masks": masks, "labels": [s.label for s in t.shapes]}, _Cats)
    changed = (out != img).any(axis=-1)
    np.testing.assert_array_equal(changed, masks.any(axis=0))


def test_semantic_overlay_leaves_the_ignore_value_alone() -> None:
    t = TRUTHS[0]
    img = _plain(t)
    sem = t.semantic()
    out = annotate(img, {"semantic": sem}, _Cats, ignore_index=255)
    changed = (out != img).any(axis=-1)
    np.testing.assert_array_equal(changed, sem != 255)


def test_keypoints_of_visibility_zero_are_not_drawn() -> None:
    t = TRUTHS[0]
    img = _plain(t)
    kps = np.array([t.shapes[2].keypoints], np.float32)  # the 5th is (0, 0, 0)
    out = annotate(img, {"keypoints": kps, "labels": [2]}, _Cats)
    assert (out[:3, :3] == img[:3, :3]).all()  # around (0, 0): not drawn
    for x, y, v in kps[0]:
        if v > 0:
            assert (out[int(y), int(x)] != img[int(y), int(x)]).any()


def test_enlarging_keeps_the_targets_on_their_pixels() -> None:
    t = TRUTHS[0]
    img = _plain(t)
    big, tg = enlarge(img, {"boxes": np.array([t.shapes[0].box], np.float32), "masks": None})
    f = big.shape[0] // img.shape[0]
    assert f > 1 and big.shape[1] == img.shape[1] * f
    np.testing.assert_array_equal(tg["boxes"][0], np.array(t.shapes[0].box) * f)


def test_the_sheet_has_a_row_per_category_of_images_holding_it(
    packs: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "sheet.png"
    r = show_pack(ShowConfig(packs["coco"], out, per_class=2))
    assert out.is_file() and r.classes == tuple(NAMES)
    assert (r.rows, r.columns, r.draws) == (3, 2, 0)
    with Image.open(out) as im:
        assert im.size == (r.width, r.height) == (420, 470)  # (2 * 1.4 + 1.4, 3 * 1.4 + .5) in
    recs = dense_of(packer.load(packs["coco"])).read(r.indices)
    for k, rec in enumerate(recs):
        assert NAMES.index(r.classes[k // 2]) in rec["labels"].tolist()


@pytest.mark.parametrize("augment", ["hflip", "lsj", "ssd"])
def test_augmented_draws_of_a_dense_pack(
    packs: dict[str, Path], tmp_path: Path, augment: str
) -> None:
    out = tmp_path / "aug.png"
    r = show_pack(ShowConfig(packs["coco"], out, per_class=1, augment=augment, draws=2, seed=3))
    assert (r.rows, r.columns, r.draws) == (3, 3, 2)
    assert r.augment[-2:] == ("RandomHorizontalFlip", "SanitizeBoundingBoxes")
    with Image.open(out) as im:
        assert im.size == (r.width, r.height) == (560, 470)


def test_semantic_pack_rows_per_pixel_class(packs: dict[str, Path], tmp_path: Path) -> None:
    r = show_pack(ShowConfig(packs["sem"], tmp_path / "s.png", per_class=1, augment="lsj", draws=1))
    assert r.rows == 4 and r.draws == 1  # pixel values 0..3, the ignore value not a row


def test_image_only_augments_are_refused_on_a_dense_pack(
    packs: dict[str, Path], tmp_path: Path
) -> None:
    with pytest.raises(UsageError, match=r"ShowConfig\.augment 'ta_wide'.* hflip") as e:
        show_pack(ShowConfig(packs["coco"], tmp_path / "x.png", augment="ta_wide"))
    assert e.value.field == "ShowConfig.augment"
    with pytest.raises(UsageError, match=r"ShowConfig\.mixup_alpha") as e:
        show_pack(ShowConfig(packs["coco"], tmp_path / "x.png", mixup_alpha=0.2))
    assert e.value.field == "ShowConfig.mixup_alpha"
    with pytest.raises(UsageError, match=r"ShowConfig\.augment 'lsj'.* holds none"):
        show_pack(ShowConfig(packs["plain"], tmp_path / "x.png", augment="lsj"))
    assert not (tmp_path / "x.png").exists()


def test_cli_show_of_a_dense_pack(packs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "c.png"
    code, stdout, _ = cli_run("show", packs["coco"], "--out", out, "--augment", "hflip",
                              "--per-class", "1", "--draws", "1", "--json")  # fmt: skip
    assert code == 0 and out.is_file()
    assert json.loads(stdout)["classes"] == NAMES
    code, _, err = cli_run("show", packs["coco"], "--out", out, "--augment", "ra")
    assert code == 2 and "--augment 'ra'" in one_error(err)
    # a plain pack's sheet is as it was
    code, stdout, _ = cli_run("show", packs["plain"], "--out", tmp_path / "p.png", "--json")
    assert code == 0 and json.loads(stdout)["classes"] == ["c0", "c1"]


def test_a_grey_image_is_drawn_in_colour() -> None:
    grey = np.full((40, 30, 1), 90, np.uint8)
    out = annotate(grey, {"boxes": [[2, 2, 12, 30]], "labels": [1]}, _Cats)
    assert out.shape == (40, 30, 3) and (out[29, 2:12] == colour(1)).all()
