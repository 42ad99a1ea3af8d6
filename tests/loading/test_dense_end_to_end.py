"""Issue 46, end to end: a COCO folder built into a raw and a JPEG pack with targets
(packer/builder/dense.py), streamed by PackLoader with its targets (loading/dense_pass.py)
through the real storage (packer/pack/dense.py), not the contract's fake."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import packer
from helpers.dense_data import make_truth, write_coco
from packer.builder.config import BuildConfig
from packer.pack.dense import decode_masks, dense_of

pytest.importorskip("pycocotools")

TRUTHS = make_truth(6)


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("e2e")
    write_coco(root / "coco", TRUTHS, keypoints=True)
    out = {}
    for store in ("raw", "jpeg"):
        out[store] = root / store
        cfg = BuildConfig(size=(64, 48), resize="stretch", store=store, workers=1)
        packer.build_pack(root / "coco", out[store], cfg)
    return out


@pytest.mark.parametrize("store", ["raw", "jpeg"])
def test_the_loader_yields_the_packs_own_targets(packs: dict[str, Path], store: str) -> None:
    pack = packer.load(packs[store])
    cols = dense_of(pack)
    assert cols is not None and cols.has_masks and cols.has_keypoints
    stored = cols.read(range(len(TRUTHS)))
    loader = packer.PackLoader(pack, 4, device="cpu", shuffle=False)
    seen = 0
    for images, targets in loader:
        assert images.dtype == torch.uint8 and images.shape[1] == 3
        for t in targets:
            i = seen
            want = stored[i]
            np.testing.assert_allclose(t["boxes"].numpy(), want["boxes"], atol=1e-4)
            assert t["labels"].tolist() == want["labels"].tolist()
            assert int(t["image_id"]) == want["image_id"]
            masks = decode_masks(want["masks_rle"], want["size"])
            h, w = masks.shape[1:]
            assert torch.equal(t["masks"][:, :h, :w], torch.from_numpy(masks))
            seen += 1
    assert seen == len(TRUTHS)


def test_a_detection_model_trains_on_a_dense_pack(packs: dict[str, Path]) -> None:
    from torchvision.models.detection import FasterRCNN
    from torchvision.models.detection.backbone_utils import BackboneWithFPN  # noqa: F401
    from torchvision.models.detection.rpn import AnchorGenerator
    from torchvision.ops import MultiScaleRoIAlign

    torch.manual_seed(0)
    backbone = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU())
    backbone.out_channels = 8
    model = FasterRCNN(
        backbone,
        num_classes=len(dense_of(packer.load(packs["raw"])).categories.names) + 1,
        rpn_anchor_generator=AnchorGenerator(((16,),), ((1.0,),)),
        box_roi_pool=MultiScaleRoIAlign(["0"], 7, 2),
        min_size=48,
        max_size=64,
    )
    model.train()
    loader = packer.PackLoader(packer.load(packs["raw"]), 3, device="cpu", shuffle=True, seed=1)
    images, targets = next(iter(loader))
    targets = [{"boxes": t["boxes"], "labels": t["labels"] + 1} for t in targets]
    losses = model([im.float() / 255 for im in images], targets)
    loss = sum(losses.values())
    assert torch.isfinite(loss)
    loss.backward()
