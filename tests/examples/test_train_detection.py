"""packer.examples.train_detection: the detection reference on packs trains two short CPU
epochs on a generated COCO-format set, resumes, evaluates with --test-only, and scores
the same weights the same through the pack and through the reference data path
(CocoDetection + v2 transforms + DataLoader)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import packer
from helpers.dense_data import make_truth, write_coco
from packer.builder.config import BuildConfig
from packer.builder.dense import DenseOptions

pytest.importorskip("pycocotools")

from packer.examples import train_detection as T

MODEL = ["--model", "fasterrcnn_mobilenet_v3_large_320_fpn", "--min-size", "64"]
MODEL += ["--max-size", "96", "--device", "cpu", "-j", "1", "--print-freq", "0"]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("det")
    truths = make_truth(4, ext=".jpg")  # a JPEG pack keeps JPEG files as they are
    for split in ("train2017", "val2017"):
        write_coco(root / "coco", truths, split=split)
        cfg = BuildConfig(store="jpeg", workers=1, dense=DenseOptions(format="coco", split=split))
        packer.build_pack(root / "coco", root / split, cfg)
    (root / "plain").mkdir()
    return {"root": root, "coco": root / "coco", "train": root / "train2017",
            "val": root / "val2017"}  # fmt: skip


def tiny_model(args, num_classes: int, device: torch.device) -> torch.nn.Module:
    """A two-layer Faster R-CNN (CPU seconds, not minutes) in place of a torchvision
    builder: the recipe's loaders, loop, checkpoints and COCO evaluation are what run."""
    from torchvision.models.detection import FasterRCNN
    from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
    from torchvision.models.detection.rpn import AnchorGenerator
    from torchvision.ops import MultiScaleRoIAlign

    backbone = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, 2, 1), torch.nn.ReLU())
    backbone.out_channels = 8
    return FasterRCNN(
        backbone,
        rpn_anchor_generator=AnchorGenerator(((16,),), ((1.0,),)),
        box_roi_pool=MultiScaleRoIAlign(["0"], 7, 2),
        box_head=TwoMLPHead(8 * 7 * 7, 64),
        box_predictor=FastRCNNPredictor(64, num_classes),
        min_size=args.min_size,
        max_size=args.max_size,
    ).to(device)


def _main(capsys: pytest.CaptureFixture, *argv: object) -> str:
    code = T.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_two_epochs_then_resume_then_test_only(data: dict[str, Path], capsys, monkeypatch) -> None:
    monkeypatch.setattr(T, "make_model", tiny_model)
    out = data["root"] / "run"
    common = ["--data-path", data["train"], "--val-pack", data["val"], "--output-dir", out,
              "-b", "2", "--lr", "0.01", *MODEL]  # fmt: skip
    text = _main(capsys, *common, "--epochs", "2")
    lines = re.findall(r"^epoch (\d): train loss ([\d.]+) .*\| bbox mAP ([\d.]+)$", text, re.M)
    assert [e for e, _, _ in lines] == ["0", "1"], text
    assert all(0 < float(loss) < 50 and 0 <= float(m) <= 100 for _, loss, m in lines)
    ck = torch.load(out / "checkpoint.pth", weights_only=True)
    assert ck["epoch"] == 1 and ck["cat_ids"] == [3, 7, 12]  # the COCO ids, in label order
    assert not list(out.glob(".*tmp*"))  # written under a temporary name, then renamed

    text = _main(capsys, *common, "--epochs", "3", "--resume", out / "checkpoint.pth")
    assert "resumed from" in text and "(epoch 1 done)" in text
    assert re.findall(r"^epoch (\d):", text, re.M) == ["2"], text
    assert torch.load(out / "checkpoint.pth", weights_only=True)["epoch"] == 2

    text = _main(
        capsys, "--val-pack", data["val"], "--test-only", "--resume", out / "checkpoint.pth", *MODEL
    )
    assert re.fullmatch(r"test: bbox mAP \d+\.\d{4}\n", text), text


def test_the_same_weights_score_the_same_on_the_pack_and_the_reference_path(
    data: dict[str, Path],
) -> None:
    args = T.parse(["--val-pack", str(data["val"]), "--test-only", "--weights", "x", *MODEL,
                    "--box-score-thresh", "0"])  # fmt: skip
    args.weights = None
    device = torch.device("cpu")
    torch.manual_seed(0)
    model = T.make_model(args, 4, device)
    _, val_loader = T.pack_loaders(args, device)
    pack = T.PackData(data["val"], "val")
    cat_ids = list(pack.categories.ids)
    pack_gt = pack.coco()
    ds, ref_gt, ref_ids = T.reference_dataset(
        data["coco"], "val2017", T.reference_pipeline(None, False), False, None
    )
    assert ref_ids == cat_ids == [3, 7, 12]
    dl = torch.utils.data.DataLoader(ds, 1, num_workers=0, collate_fn=T._collate)

    dets_p, seen_p = T.predictions(model, T.pack_batches(val_loader, False), cat_ids, False,
                                   device, False)  # fmt: skip
    dets_r, seen_r = T.predictions(model, T.reference_batches(dl, device), cat_ids, False,
                                   device, False)  # fmt: skip
    assert sorted(seen_p) == sorted(seen_r) == [1000, 1001, 1002, 1003]
    assert len(dets_p) == len(dets_r) > 0  # the same pixels in: the same detections out
    key = lambda d: (d["image_id"], -d["score"], d["category_id"])  # noqa: E731
    for a, b in zip(sorted(dets_p, key=key), sorted(dets_r, key=key)):
        assert (a["image_id"], a["category_id"]) == (b["image_id"], b["category_id"])
        np.testing.assert_allclose(a["bbox"], b["bbox"], atol=1e-4)
        assert abs(a["score"] - b["score"]) < 1e-6
    map_p = T.coco_map(pack_gt, dets_p, seen_p, False)["bbox"]
    map_r = T.coco_map(ref_gt, dets_r, seen_r, False)["bbox"]
    assert abs(map_p - map_r) < 0.1, (map_p, map_r)

    # the pack's ground truth is the JSON's: each scores the other's boxes 100 points
    doc = json.loads((data["coco"] / "annotations" / "instances_val2017.json").read_text())
    truth = [{"image_id": a["image_id"], "category_id": a["category_id"], "bbox": a["bbox"],
              "score": 1.0} for a in doc["annotations"]]  # fmt: skip
    assert T.coco_map(pack_gt, truth, seen_p, False)["bbox"] == pytest.approx(100.0)
    from_pack = [{**a, "score": 1.0} for a in pack_gt.dataset["annotations"]]
    assert T.coco_map(ref_gt, from_pack, seen_r, False)["bbox"] == pytest.approx(100.0)
    assert T.coco_map(pack_gt, truth[1:], seen_p, False)["bbox"] < 100.0  # it can fail


@pytest.mark.parametrize("preset", ["lsj", "ssd", "ssdlite"])
def test_each_preset_streams_boxes_inside_its_images(data: dict[str, Path], preset: str) -> None:
    args = T.parse(["--data-path", str(data["train"]), "--data-augmentation", preset,
                    "--lsj-size", "96", "-b", "2", "--device", "cpu", "-j", "1"])  # fmt: skip
    train, _ = T.pack_loaders(args, torch.device("cpu"))
    for images, targets in T.pack_batches(train, False):
        for im, t in zip(images, targets):
            h, w = im.shape[-2:]
            if preset == "lsj":
                assert (h, w) == (96, 96)
            b = t["boxes"]
            assert len(b) == len(t["labels"]) and (t["labels"] >= 1).all()
            assert (b[:, 0] >= 0).all() and (b[:, 2] <= w).all() and (b[:, 3] <= h).all()
            assert ((b[:, 2] - b[:, 0]) >= 1).all()  # SanitizeBoundingBoxes ran


def _error(capsys, *argv: object) -> str:
    try:
        code = T.main([str(a) for a in argv])
    except SystemExit as e:  # argparse
        code = e.code
    err = capsys.readouterr().err.strip()
    assert code == 2 and "Traceback" not in err, err
    return err.splitlines()[-1]


def test_bad_input_is_one_error_line(data: dict[str, Path], capsys, tmp_path: Path) -> None:
    line = _error(capsys, "--val-pack", data["val"], "--test-only", "--device", "cpu")
    assert line == "Error: --test-only evaluates --resume CHECKPOINT (or --weights)"
    line = _error(capsys, "--data-path", data["train"], "--data-path-reference", data["coco"])
    assert line.startswith("Error: give the packs (--data-path, --val-pack) or --data-path-ref")
    from conftest import write_image

    write_image(tmp_path / "src" / "a.png", (8, 8), seed=0)
    packer.build_pack(tmp_path / "src", tmp_path / "plain", BuildConfig(size=(8, 8), workers=1))
    line = _error(capsys, "--data-path", tmp_path / "plain", "--device", "cpu")
    assert re.fullmatch(r"Error: .*plain: the train pack has no boxes; build it .*", line), line
    (tmp_path / "bad.pth").write_text("not a checkpoint")
    line = _error(capsys, "--val-pack", data["val"], "--test-only", "--resume",
                  tmp_path / "bad.pth")  # fmt: skip
    assert re.fullmatch(r"Error: .*bad\.pth: not a checkpoint this script wrote .*", line), line


def test_pack_batches_give_each_image_at_its_own_size(data: dict[str, Path]) -> None:
    """Images of several sizes in one batch come back unpadded, as the files decode,
    with the JSON's boxes and labels + 1 (the models' background is 0)."""
    from PIL import Image

    args = T.parse(["--val-pack", str(data["val"]), "--test-only", "--weights", "x",
                    "--val-batch-size", "4", "--device", "cpu", "-j", "1",
                    "--model", "maskrcnn_resnet50_fpn"])  # fmt: skip
    _, val = T.pack_loaders(args, torch.device("cpu"))
    doc = json.loads((data["coco"] / "annotations" / "instances_val2017.json").read_text())
    files = {im["id"]: im["file_name"] for im in doc["images"]}
    label = {3: 1, 7: 2, 12: 3}
    (images, targets), *rest = list(T.pack_batches(val, True))  # Mask R-CNN's targets
    assert not rest and len({im.shape for im in images}) == 4  # four sizes in one batch
    for im, t in zip(images, targets):
        path = data["coco"] / "val2017" / files[t["image_id"]]
        want = torch.from_numpy(np.array(Image.open(path).convert("RGB"))).permute(2, 0, 1)
        assert torch.equal((im * 255).round().to(torch.uint8), want)
        anns = [a for a in doc["annotations"] if a["image_id"] == t["image_id"]]
        xyxy = [[x, y, x + w, y + h] for x, y, w, h in (a["bbox"] for a in anns)]
        np.testing.assert_allclose(t["boxes"].numpy(), xyxy, atol=1e-4)
        assert t["labels"].tolist() == [label[a["category_id"]] for a in anns]
        m = t["masks"]  # cropped with the image: each mask's extent is its box
        assert m.shape == (len(anns), *im.shape[1:]) and m.dtype == torch.uint8
        for mask, (x1, y1, x2, y2) in zip(m, xyxy):
            ys, xs = torch.nonzero(mask, as_tuple=True)
            assert [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1] == [x1, y1, x2, y2]


def test_a_box_models_loaders_leave_the_masks_unread(data: dict[str, Path]) -> None:
    """Faster R-CNN's loaders (the train one with its preset, the val one) read no masks,
    as the reference's targets for a box model have none; Mask R-CNN's read them."""
    for model, masks in (("fasterrcnn_resnet50_fpn", False), ("maskrcnn_resnet50_fpn", True)):
        args = T.parse(["--data-path", str(data["train"]), "--val-pack", str(data["val"]),
                        "--model", model, "--data-augmentation", "lsj", "--lsj-size", "64",
                        "--device", "cpu", "-j", "1", "-b", "2"])  # fmt: skip
        for loader in T.pack_loaders(args, torch.device("cpu")):
            _, targets = next(iter(loader))
            assert ("masks" in targets) is masks, (model, sorted(targets))


@pytest.mark.parametrize("preset", ["hflip", "lsj", "ssd", "ssdlite"])
def test_each_preset_on_the_reference_path_gives_the_models_labels(
    data: dict[str, Path], preset: str
) -> None:
    args = T.parse(["--data-path-reference", str(data["coco"]), "--data-augmentation", preset,
                    "--lsj-size", "96", "--device", "cpu"])  # fmt: skip
    ds, _, ids = T.reference_dataset(
        data["coco"], "train2017", T.reference_pipeline(args, True), True, None
    )
    assert ids == [3, 7, 12]
    torch.manual_seed(0)
    for i in range(len(ds)):
        im, t = ds[i]
        assert im.dtype == torch.float32 and len(t["masks"]) == len(t["boxes"])
        if preset == "lsj":
            assert tuple(im.shape[1:]) == (96, 96)
        assert set(t["labels"].tolist()) <= {1, 2, 3}  # COCO ids 3, 7, 12 -> 1, 2, 3


def test_the_reference_path_trains_and_keeps_the_category_ids(
    data: dict[str, Path], capsys, monkeypatch
) -> None:
    monkeypatch.setattr(T, "make_model", tiny_model)
    out = data["root"] / "ref_run"
    text = _main(capsys, "--data-path-reference", data["coco"], "--output-dir", out, "-b", "2",
                 "--epochs", "1", "--max-steps", "1", *MODEL, "-j", "0")  # fmt: skip
    assert re.search(r"^epoch 0: train loss [\d.]+ .*\| bbox mAP [\d.]+$", text, re.M), text
    assert torch.load(out / "checkpoint.pth", weights_only=True)["cat_ids"] == [3, 7, 12]


def test_the_packs_instance_masks_are_the_jsons(data: dict[str, Path]) -> None:
    """segm (Mask R-CNN's second mAP): the JSON's masks, as detections, score 100 against
    the COCO object built from the pack, and one dropped mask makes it less."""
    from pycocotools.coco import COCO

    pack_gt = T.PackData(data["val"], "val").coco()
    with T._quiet():
        ref = COCO(str(data["coco"] / "annotations" / "instances_val2017.json"))
    dets = []
    for a in ref.dataset["annotations"]:
        rle = ref.annToRLE(a)
        dets.append({"image_id": a["image_id"], "category_id": a["category_id"],
                     "bbox": a["bbox"], "score": 1.0,
                     "segmentation": {"size": rle["size"], "counts": rle["counts"]}})  # fmt: skip
    ids = sorted(ref.getImgIds())
    assert T.coco_map(pack_gt, dets, ids, True) == pytest.approx({"bbox": 100.0, "segm": 100.0})
    assert T.coco_map(pack_gt, dets[1:], ids, True)["segm"] < 100.0


def test_a_checkpoint_of_another_model_or_category_map_is_refused(
    data: dict[str, Path], capsys, tmp_path: Path
) -> None:
    name = "fasterrcnn_mobilenet_v3_large_320_fpn"
    torch.save({"model": {}, "epoch": 0, "model_name": name, "cat_ids": [1, 2, 3]},
               tmp_path / "cats.pth")  # fmt: skip
    torch.save({"model": {}, "epoch": 0, "model_name": "retinanet_resnet50_fpn",
                "cat_ids": [3, 7, 12]}, tmp_path / "retina.pth")  # fmt: skip
    base = ["--val-pack", data["val"], "--test-only", *MODEL, "--resume"]
    line = _error(capsys, *base, tmp_path / "cats.pth")
    assert line.endswith("cats.pth: trained on categories [1, 2, 3], not [3, 7, 12]"), line
    line = _error(capsys, *base, tmp_path / "retina.pth")
    assert line.endswith(
        "retina.pth: a retinanet_resnet50_fpn checkpoint; resume it with --model "
        "retinanet_resnet50_fpn"
    ), line


def tiny_mask_model(args, num_classes: int, device: torch.device) -> torch.nn.Module:
    """tiny_model with Mask R-CNN's mask branch (small heads)."""
    from torchvision.models.detection import MaskRCNN
    from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
    from torchvision.models.detection.mask_rcnn import MaskRCNNHeads, MaskRCNNPredictor
    from torchvision.models.detection.rpn import AnchorGenerator
    from torchvision.ops import MultiScaleRoIAlign

    backbone = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, 2, 1), torch.nn.ReLU())
    backbone.out_channels = 8
    return MaskRCNN(
        backbone,
        rpn_anchor_generator=AnchorGenerator(((16,),), ((1.0,),)),
        box_roi_pool=MultiScaleRoIAlign(["0"], 7, 2),
        box_head=TwoMLPHead(8 * 7 * 7, 64),
        box_predictor=FastRCNNPredictor(64, num_classes),
        mask_roi_pool=MultiScaleRoIAlign(["0"], 14, 2),
        mask_head=MaskRCNNHeads(8, (8,), 1),
        mask_predictor=MaskRCNNPredictor(8, 8, num_classes),
        min_size=args.min_size,
        max_size=args.max_size,
        box_score_thresh=0.0,
        box_detections_per_img=5,  # pasting masks on the CPU is the slow part
    ).to(device)


def test_mask_rcnn_trains_on_the_packs_masks_and_reports_segm(
    data: dict[str, Path], capsys, monkeypatch
) -> None:
    monkeypatch.setattr(T, "make_model", tiny_mask_model)
    model = ["--model", "maskrcnn_resnet50_fpn", *MODEL[2:]]
    text = _main(capsys, "--data-path", data["train"], "--val-pack", data["val"], "-b", "2",
                 "--output-dir", data["root"] / "mask_run", "--epochs", "1", *model)  # fmt: skip
    assert re.search(r"^epoch 0: .*\| bbox mAP [\d.]+, segm mAP [\d.]+$", text, re.M), text


def test_the_val_pack_decodes_on_the_cpu_unless_asked(data: dict[str, Path]) -> None:
    """Evaluation reads the reference's pixels (libjpeg-turbo) whatever the training
    device, so the same weights give the reference path's mAP; ``--val-decode device``
    keeps the training device's decoder."""
    base = ["--val-pack", str(data["val"]), "--test-only", "--weights", "x", *MODEL]
    args = T.parse(base)
    assert args.val_decode == "cpu"
    # asked for CUDA: the val loader still decodes on the CPU (no CUDA needed for it)
    _, val = T.pack_loaders(args, torch.device("cuda"))
    assert val.device.type == "cpu"
    args = T.parse([*base, "--val-decode", "device"])
    _, val = T.pack_loaders(args, torch.device("cpu"))
    assert val.device.type == "cpu"
    batches = list(T.on_device(T.pack_batches(val, False), torch.device("meta")))
    assert batches and all(im.device.type == "meta" for ims, _ in batches for im in ims)
    assert all(t["boxes"].device.type == "meta" for _, ts in batches for t in ts)


def _padded_batch(b: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A padded batch as the loader yields it: pixels and targets on the device, the
    shapes and ids on the host."""
    from helpers.sync_count import SyncCounter

    g = torch.Generator().manual_seed(b)
    x = torch.randint(0, 256, (b, 3, 40, 48), generator=g, dtype=torch.uint8)
    counts = [(i * 3) % 4 for i in range(b)]
    t = {
        "boxes": torch.rand(b, 3, 4, generator=g) * 30,
        "labels": torch.randint(0, 5, (b, 3), generator=g),
        "counts": torch.tensor(counts),
        "image_sizes": torch.tensor([[40 - i % 3, 48 - 2 * (i % 2)] for i in range(b)]),
        "image_ids": torch.arange(100, 100 + b),
    }
    SyncCounter.device(x, t["boxes"], t["labels"])
    return x, t


def test_pack_batches_cuts_a_batch_without_waiting_in_a_fixed_few_kernels() -> None:
    """The train loop's cut of a padded batch into the model's lists: the same floats as
    ToDtype(scale=True) per image, labels + 1, each image at its own size; no host wait
    (the shapes are the loader's host ones) and device kernels that do not grow with the
    batch (views cost none)."""
    from helpers.sync_count import SyncCounter

    kernels = {}
    for b in (2, 8):
        x, t = _padded_batch(b)
        with SyncCounter() as c:
            images, targets = next(T.pack_batches([(x, t)], False))
        assert c.syncs == 0, c.where
        kernels[b] = c.ops - c.op_names["__getitem__"]
        for i, (im, d) in enumerate(zip(images, targets)):
            h, w = t["image_sizes"][i].tolist()
            n = int(t["counts"][i])
            assert torch.equal(im, x[i, :, :h, :w].float().mul_(1.0 / 255))
            assert torch.equal(d["boxes"], t["boxes"][i, :n])
            assert torch.equal(d["labels"], t["labels"][i, :n] + 1)
            assert d["image_id"] == 100 + i and isinstance(d["image_id"], int)
    assert kernels[8] == kernels[2] <= 3, kernels
