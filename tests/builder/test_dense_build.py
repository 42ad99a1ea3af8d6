"""Builds with dense targets (issue 46.1-2): COCO, YOLO, VOC and mask folders packed with
their boxes, masks and keypoints moved exactly as the build's resize moved each image,
raw and JPEG, single packs and sets (local and S3), append, verify, the CLI."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import packer
from helpers.dense_data import NAMES, make_truth, write_coco, write_masks, write_voc, write_yolo
from packer.builder.config import BuildConfig
from packer.builder.dense import DenseOptions
from packer.cli import cli
from packer.errors import InputError, UsageError
from packer.measure.verify import VerifyConfig
from packer.measure.verify_pack import verify_pack
from packer.pack.dense import decode_masks, dense_of

sys.path.insert(0, str(Path(__file__).parents[1] / "storage"))
from s3_server import new_url, s3, s3_server  # noqa: F401

TRUTHS = make_truth(4)


def expected_map(mode: str, hw: tuple[int, int], size: tuple[int, int]) -> tuple[float, ...]:
    """(sx, ox, sy, oy) of the build's resize, written out from the decoder's rules:
    stretch scales each axis; crop scales by the larger ratio and centres; pad by the
    smaller ratio (sizes rounded) and letterboxes."""
    h, w = hw
    W, H = size
    if mode == "stretch":
        return W / w, 0.0, H / h, 0.0
    if mode == "crop":
        s = max(W / w, H / h)
        bw, bh = min(w, W / s), min(h, H / s)
        return W / bw, -(w - bw) / 2 * W / bw, H / bh, -(h - bh) / 2 * H / bh
    s = min(W / w, H / h)
    nw, nh = max(1, round(w * s)), max(1, round(h * s))
    return nw / w, float((W - nw) // 2), nh / h, float((H - nh) // 2)


def expected_boxes(t, mode, size) -> tuple[np.ndarray, np.ndarray, int]:  # type: ignore[no-untyped-def]
    """The truth's boxes moved and clipped, the kept labels, and how many fell out."""
    sx, ox, sy, oy = expected_map(mode, t.size, size)
    W, H = size
    boxes, labels, dropped = [], [], 0
    for s in t.shapes:
        x1, y1, x2, y2 = s.box
        b = [
            min(max(x1 * sx + ox, 0), W),
            min(max(y1 * sy + oy, 0), H),
            min(max(x2 * sx + ox, 0), W),
            min(max(y2 * sy + oy, 0), H),
        ]
        if b[2] - b[0] <= 0 or b[3] - b[1] <= 0:
            dropped += 1
            continue
        boxes.append(b)
        labels.append(s.label)
    return np.array(boxes, np.float64).reshape(-1, 4), np.array(labels), dropped


@pytest.fixture(scope="module")
def coco_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dense") / "coco"
    write_coco(root, TRUTHS, keypoints=True)
    return root


def build(src: Path, dst: Path, **kw) -> packer.builder.config.BuildResult:  # type: ignore[name-defined,no-untyped-def]
    kw.setdefault("workers", 1)
    return packer.build_pack(src, dst, BuildConfig(**kw))


@pytest.mark.parametrize(
    "mode,size", [("stretch", (96, 80)), ("crop", (40, 40)), ("pad", (50, 30)), ("crop", (16, 64))]
)
def test_coco_boxes_are_the_known_boxes_moved_by_the_resize(
    coco_src: Path, tmp_path: Path, mode: str, size: tuple[int, int]
) -> None:
    r = build(coco_src, tmp_path / "p", size=size, resize=mode)
    cols = dense_of(packer.load(tmp_path / "p"))
    assert cols is not None and cols.categories.names == tuple(NAMES)
    assert cols.categories.ids == (3, 7, 12)
    total_dropped = 0
    for i, got in enumerate(cols.read(range(len(TRUTHS)))):
        want, labels, dropped = expected_boxes(TRUTHS[i], mode, size)
        total_dropped += dropped
        assert got["boxes"].dtype == np.float32 and got["boxes"].shape == want.shape
        np.testing.assert_allclose(got["boxes"], want, atol=1e-4)
        assert got["labels"].tolist() == labels.tolist()
        assert got["image_id"] == 1000 + i
        assert len(got["masks_rle"]) == len(labels) and got["size"] == (size[1], size[0])
    assert r.dense is not None and r.dense["dropped"] == total_dropped
    assert cols.record.dropped == total_dropped
    if size == (16, 64):  # a tall narrow crop leaves the square and the person out
        assert total_dropped >= len(TRUTHS) * 2


def test_masks_are_resized_nearest_neighbour(coco_src: Path, tmp_path: Path) -> None:
    # an exact 2x stretch: each source pixel becomes a 2x2 block
    h, w = TRUTHS[0].size
    build(coco_src, tmp_path / "p", size=(2 * w, 2 * h), resize="stretch")
    got = dense_of(packer.load(tmp_path / "p")).read([0])[0]
    masks = decode_masks(got["masks_rle"], got["size"])
    want = np.stack([s.mask.repeat(2, 0).repeat(2, 1) for s in TRUTHS[0].shapes])
    np.testing.assert_array_equal(masks, want)


def test_masks_match_torch_nearest_at_a_fractional_scale(coco_src: Path, tmp_path: Path) -> None:
    build(coco_src, tmp_path / "p", size=(40, 36), resize="stretch")
    cols = dense_of(packer.load(tmp_path / "p"))
    for i, got in enumerate(cols.read(range(len(TRUTHS)))):
        masks = decode_masks(got["masks_rle"], got["size"])
        src = torch.from_numpy(np.stack([s.mask for s in TRUTHS[i].shapes]))[None].float()
        want = torch.nn.functional.interpolate(src, size=(36, 40), mode="nearest")[0]
        np.testing.assert_array_equal(masks, want.to(torch.uint8).numpy())


def test_keypoints_move_with_the_image_and_keep_visibility(coco_src: Path, tmp_path: Path) -> None:
    build(coco_src, tmp_path / "p", size=(96, 80), resize="stretch")
    cols = dense_of(packer.load(tmp_path / "p"))
    assert cols.has_keypoints and cols.categories.flip_map[2] == ((1, 2), (3, 4))
    for i, got in enumerate(cols.read(range(len(TRUTHS)))):
        t = TRUTHS[i]
        sx, ox, sy, oy = expected_map("stretch", t.size, (96, 80))
        person = next(k for k, s in enumerate(t.shapes) if s.name == "person")
        kp = got["keypoints"][person]
        for (x, y, v), row in zip(t.shapes[person].keypoints, kp):
            if v == 0:
                assert row.tolist() == [0, 0, 0]
            else:
                np.testing.assert_allclose(row, [x * sx + ox, y * sy + oy, v], atol=1e-4)


def test_jpeg_pack_keeps_boxes_in_the_stored_images_pixels(coco_src: Path, tmp_path: Path) -> None:
    build(coco_src, tmp_path / "p", store="jpeg", max_side=32)
    pack = packer.load(tmp_path / "p")
    cols = dense_of(pack)
    for i, got in enumerate(cols.read(range(len(TRUTHS)))):
        h, w = (int(v) for v in pack.sizes[i])
        assert max(h, w) <= 32 and got["size"] == (h, w)
        want, _, _ = expected_boxes(TRUTHS[i], "stretch", (w, h))
        np.testing.assert_allclose(got["boxes"], want, atol=1e-4)


@pytest.mark.parametrize("fmt", ["yolo", "voc"])
def test_yolo_and_voc_boxes(tmp_path: Path, fmt: str) -> None:
    src = tmp_path / fmt
    (write_yolo if fmt == "yolo" else write_voc)(src, TRUTHS)
    r = build(src, tmp_path / "p", size=(96, 80), resize="stretch")  # detected: no option
    assert r.dense is not None and r.dense["format"] == fmt
    cols = dense_of(packer.load(tmp_path / "p"))
    names = cols.categories.names
    for i, got in enumerate(cols.read(range(len(TRUTHS)))):
        want, labels, _ = expected_boxes(TRUTHS[i], "stretch", (96, 80))
        order = np.lexsort((want[:, 0],))
        got_order = np.lexsort((got["boxes"][:, 0],))
        np.testing.assert_allclose(got["boxes"][got_order], want[order], atol=1e-4)
        got_names = [names[k] for k in got["labels"][got_order]]
        assert got_names == [NAMES[k] for k in labels[order]]


def test_semantic_masks_beside_raw_rows_and_jpeg_files(tmp_path: Path) -> None:
    src = write_masks(tmp_path / "m", TRUTHS)
    h, w = TRUTHS[0].size
    build(
        src,
        tmp_path / "raw",
        size=(2 * w, 2 * h),
        resize="stretch",
        dense=DenseOptions(format="masks"),
    )
    cols = dense_of(packer.load(tmp_path / "raw"))
    assert cols.semantic and not cols.has_masks and cols.record.semantic == "rows"
    got = cols.read([0])[0]["semantic"]
    np.testing.assert_array_equal(got, TRUTHS[0].semantic().repeat(2, 0).repeat(2, 1))
    # pad: the letterbox is the ignore value
    build(src, tmp_path / "pad", size=(w, 2 * h), resize="pad", dense=DenseOptions(format="masks"))
    got = dense_of(packer.load(tmp_path / "pad")).read([0])[0]["semantic"]
    assert (got[0] == 255).all() and (got[-1] == 255).all() and got.shape == (2 * h, w)
    build(src, tmp_path / "jpeg", store="jpeg", dense=DenseOptions(format="masks"))
    cols = dense_of(packer.load(tmp_path / "jpeg"))
    assert cols.record.semantic == "png"
    for i, d in enumerate(cols.read(range(len(TRUTHS)))):
        np.testing.assert_array_equal(d["semantic"], TRUTHS[i].semantic())


def test_a_set_carries_the_columns_and_append_keeps_the_category_map(
    coco_src: Path, tmp_path: Path
) -> None:
    row = 32 * 32 * 3
    one = build(coco_src, tmp_path / "one", size=(32, 32))
    r = build(coco_src, tmp_path / "set", size=(32, 32), shard_size=2 * row)
    assert r.shards == 2 and r.dense["instances"] == one.dense["instances"]
    a = dense_of(packer.load(tmp_path / "one")).read(range(4))
    b = dense_of(packer.load(tmp_path / "set")).read([3, 0, 2, 1])
    for x, y in zip([a[3], a[0], a[2], a[1]], b):
        np.testing.assert_array_equal(x["boxes"], y["boxes"])
        assert x["masks_rle"] == y["masks_rle"] and x["image_id"] == y["image_id"]
    # a YOLO source names its categories otherwise: refused, then read with the set's map
    more = make_truth(6)[4:]
    ysrc = write_yolo(tmp_path / "yolo", more)
    cfg = {"size": (32, 32), "shard_size": 2 * row, "append": True}
    (ysrc / "data.yaml").write_text("names:\n  0: ell\n  1: square\n  2: person\n")
    for f in (ysrc / "labels").iterdir():  # the same shapes under the new indices
        lines = [ln.split() for ln in f.read_text().split("\n") if ln]
        swap = {"0": "1", "1": "0", "2": "2"}
        f.write_text("".join(" ".join([swap[p[0]], *p[1:]]) + "\n" for p in lines))
    with pytest.raises(InputError, match=r"categories .* are not the set's .*BuildConfig\.classes"):
        build(ysrc, tmp_path / "set", **cfg)
    r = build(ysrc, tmp_path / "set", classes=tmp_path / "set", **cfg)
    pack = packer.load(tmp_path / "set")
    assert len(pack) == 6
    cols = dense_of(pack)
    got = cols.read([4])[0]
    names = [cols.categories.names[k] for k in got["labels"]]
    assert sorted(names) == sorted(s.name for s in more[0].shapes)


def test_category_map_json_fixes_the_indices(coco_src: Path, tmp_path: Path) -> None:
    from packer.sources.annotations import CategoryMap

    CategoryMap.build(["person", "ell", "square"], [12, 7, 3]).save(tmp_path / "cats.json")
    build(coco_src, tmp_path / "p", size=(32, 32), classes=tmp_path / "cats.json")
    cols = dense_of(packer.load(tmp_path / "p"))
    assert cols.categories.names == ("person", "ell", "square")
    got = cols.read([0])[0]
    names = [cols.categories.names[k] for k in got["labels"]]
    assert names == [s.name for s in TRUTHS[0].shapes]
    man = json.loads((tmp_path / "p" / "imgpack.json").read_text())
    assert [c["name"] for c in man["dense"]["categories"]["categories"]] == [
        "person",
        "ell",
        "square",
    ]


def test_verify_checks_the_columns_and_derives_them_again(coco_src: Path, tmp_path: Path) -> None:
    import shutil

    build(coco_src, tmp_path / "p", size=(32, 32))
    rep = verify_pack(tmp_path / "p", VerifyConfig(source=coco_src, throughput=False))
    checks = {c["name"]: c for c in rep.to_json()["checks"]}
    assert rep.ok and checks["dense"]["ok"] and checks["dense_source"]["ok"], checks
    # the annotations changed: the derived columns differ
    src2 = tmp_path / "coco2"
    shutil.copytree(coco_src, src2)
    ann = src2 / "annotations" / "person_keypoints_train2017.json"
    doc = json.loads(ann.read_text())
    doc["annotations"][0]["bbox"][0] += 1
    ann.write_text(json.dumps(doc))
    rep = verify_pack(tmp_path / "p", VerifyConfig(source=src2, throughput=False))
    checks = {c["name"]: c for c in rep.to_json()["checks"]}
    assert not rep.ok and not checks["dense_source"]["ok"]
    assert "dense_boxes.memmap" in checks["dense_source"]["detail"]
    # a dense file changed after the build: its checksum says so
    f = tmp_path / "p" / "_tensordict" / "dense_boxes.memmap"
    data = bytearray(f.read_bytes())
    data[0] ^= 1
    f.write_bytes(bytes(data))
    rep = verify_pack(tmp_path / "p", VerifyConfig(throughput=False, use_recorded_source=False))
    checks = {c["name"]: c for c in rep.to_json()["checks"]}
    assert not checks["dense"]["ok"] and "dense_boxes.memmap" in checks["dense"]["detail"]


def test_cli_builds_targets_and_names_flags_in_errors(tmp_path: Path) -> None:
    src = write_voc(tmp_path / "voc", TRUTHS)
    res = CliRunner().invoke(
        cli, ["build", str(src), str(tmp_path / "p"), "--size", "32", "--workers", "1",
              "--targets-from", "voc", "--json", "-q"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["dense"]["format"] == "voc" and out["dense"]["instances"] == 12
    res = CliRunner().invoke(
        cli, ["build", str(src), str(tmp_path / "q"), "--workers", "1", "--targets-from", "coco"]
    )
    assert res.exit_code == 2
    assert res.output.startswith("Error: ") and "--annotations" in res.output
    assert "Traceback" not in res.output


def test_options_are_checked_naming_fields(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"DenseOptions\.format 'tiff'") as e:
        BuildConfig(dense=DenseOptions(format="tiff")).validate()
    assert e.value.field == "DenseOptions.format"
    with pytest.raises(UsageError, match=r"BuildConfig\.dense .* BuildConfig\.labels"):
        BuildConfig(dense=DenseOptions(), labels=tmp_path / "t.csv").validate()


def test_a_plain_folder_builds_no_dense_files(tmp_path: Path) -> None:
    from PIL import Image

    (tmp_path / "src" / "a").mkdir(parents=True)
    Image.new("RGB", (10, 8)).save(tmp_path / "src" / "a" / "x.png")
    r = build(tmp_path / "src", tmp_path / "p", size=(8, 8))
    assert r.dense is None and "dense" not in r.to_json()
    assert not [f for f in (tmp_path / "p" / "_tensordict").iterdir() if f.name.startswith("dense")]
    assert "dense" not in json.loads((tmp_path / "p" / "imgpack.json").read_text())
    assert dense_of(packer.load(tmp_path / "p")) is None


@pytest.mark.usefixtures("s3")
def test_a_set_in_s3_carries_the_columns(coco_src: Path, tmp_path: Path) -> None:
    url = new_url()
    packer.build_pack(
        coco_src, url, BuildConfig(size=(32, 32), workers=1, shard_size=2 * 32 * 32 * 3)
    )
    local = build(coco_src, tmp_path / "one", size=(32, 32))
    assert local.dense is not None
    remote = dense_of(packer.load(url))
    want = dense_of(packer.load(tmp_path / "one")).read(range(4))
    got = remote.read(range(4))
    # the targets came with each shard's small files: no image data was fetched for them
    assert len(list((tmp_path / "cache").rglob("dense_offsets.memmap"))) == 2
    assert not list((tmp_path / "cache").rglob("images.memmap"))
    assert remote.categories.names == tuple(NAMES)
    for x, y in zip(want, got):
        np.testing.assert_array_equal(x["boxes"], y["boxes"])
        assert x["masks_rle"] == y["masks_rle"]
        assert math.isclose(float(x["area"].sum()), float(y["area"].sum()))


@pytest.mark.parametrize("step", ["data", "labels", "manifest", "assembled"])
def test_a_crash_in_finalize_resumes_to_the_same_dense_pack(
    coco_src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    import packer.builder.finalize
    from conftest import assert_same_pack

    build(coco_src, tmp_path / "ref", size=(32, 32))

    def crash(name: str) -> None:
        if name == step:
            raise RuntimeError(f"crash after {name}")

    monkeypatch.setattr(packer.builder.finalize, "_reached", crash)
    with pytest.raises(RuntimeError, match="crash after"):
        build(coco_src, tmp_path / "p", size=(32, 32))
    monkeypatch.undo()
    r = build(coco_src, tmp_path / "p", size=(32, 32))
    assert r.dense is not None and r.dense["instances"] == 12
    assert_same_pack(tmp_path / "p", tmp_path / "ref")
    for name in (tmp_path / "ref" / "_tensordict").iterdir():
        assert (tmp_path / "p" / "_tensordict" / name.name).read_bytes() == name.read_bytes()


def test_semantic_values_are_mapped_to_the_category_maps_indices(tmp_path: Path) -> None:
    from packer.sources.annotations import CategoryMap

    src = write_masks(tmp_path / "m", TRUTHS)
    # pixel values 0..3; the map lists them in another order: the pack stores indices
    CategoryMap.build(["person", "bg", "ell", "square"], [3, 0, 2, 1]).save(tmp_path / "c.json")
    cfg = {"store": "jpeg", "classes": tmp_path / "c.json", "dense": DenseOptions(format="masks")}
    build(src, tmp_path / "p", **cfg)
    got = dense_of(packer.load(tmp_path / "p")).read([0])[0]["semantic"]
    lut = np.array([1, 3, 2, 0] + [0] * 251 + [255], dtype=np.uint8)
    np.testing.assert_array_equal(got, lut[TRUTHS[0].semantic()])
