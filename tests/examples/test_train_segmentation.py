"""packer.examples.train_segmentation: the segmentation reference on semantic packs trains
two short CPU epochs on generated image + mask folders, resumes, evaluates with
--test-only, and the same weights give the same mean IoU through the pack and through
the reference data path (Pillow + v2 transforms + DataLoader)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

import packer
from helpers.dense_data import make_truth, write_masks
from packer.builder.config import BuildConfig
from packer.builder.dense import DenseOptions
from packer.examples import train_segmentation as T

COMMON = ["--model", "deeplabv3_mobilenet_v3_large", "--base-size", "64", "--crop-size", "48",
          "--device", "cpu", "-j", "1", "--print-freq", "0"]  # fmt: skip


class Tiny(torch.nn.Module):
    """A per-pixel colour classifier with the torchvision segmenters' parts (backbone,
    classifier, aux_classifier) and output ({"out": logits}): CPU seconds, and it
    learns the generated shapes' colours in a few steps."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.backbone = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU())
        self.classifier = torch.nn.Conv2d(8, num_classes, 1)
        self.aux_classifier = None

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"out": self.classifier(self.backbone(x))}


def tiny_model(args, num_classes: int, device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    return Tiny(num_classes).to(device)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("seg")
    truths = make_truth(4, ext=".jpg")  # a JPEG pack keeps JPEG files as they are
    for split in ("train", "val"):
        write_masks(root / "folders" / split, truths)
        cfg = BuildConfig(store="jpeg", workers=1, dense=DenseOptions(format="masks"))
        packer.build_pack(root / "folders" / split, root / split, cfg)
    return {"root": root, "folders": root / "folders", "train": root / "train",
            "val": root / "val"}  # fmt: skip


def _main(capsys: pytest.CaptureFixture, *argv: object) -> str:
    code = T.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


@pytest.fixture(scope="module")
def trained(data: dict[str, Path]) -> tuple[Path, str]:
    """Two epochs of the tiny model on the train pack: (checkpoint, stdout)."""
    import contextlib
    import io

    out = data["root"] / "run"
    buf = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(buf):
        mp.setattr(T, "make_model", tiny_model)
        code = T.main([str(a) for a in ["--data-path", data["train"], "--val-pack", data["val"],
                       "--output-dir", out, "-b", "2", "--lr", "0.5", "--epochs", "2",
                       *COMMON]])  # fmt: skip
    assert code == 0
    return out / "checkpoint.pth", buf.getvalue()


def test_two_epochs_then_resume_then_test_only(
    data: dict[str, Path], trained: tuple[Path, str], capsys, monkeypatch
) -> None:
    monkeypatch.setattr(T, "make_model", tiny_model)
    ck_path, text = trained
    lines = re.findall(r"^epoch (\d): train loss ([\d.]+) .*\| mean IoU ([\d.]+) ", text, re.M)
    assert [e for e, _, _ in lines] == ["0", "1"], text
    assert all(0 < float(loss) < 20 and 0 <= float(m) <= 100 for _, loss, m in lines)
    ck = torch.load(ck_path, weights_only=True)
    assert ck["epoch"] == 1 and ck["num_classes"] == 4  # background + the three shapes
    assert not list(ck_path.parent.glob(".*tmp*"))

    copy = data["root"] / "resumed"
    copy.mkdir()
    (copy / "checkpoint.pth").write_bytes(ck_path.read_bytes())
    text = _main(capsys, "--data-path", data["train"], "--output-dir", copy, "-b", "2",
                 "--epochs", "3", "--resume", copy / "checkpoint.pth", *COMMON)  # fmt: skip
    assert "resumed from" in text and "(epoch 1 done)" in text
    assert re.findall(r"^epoch (\d):", text, re.M) == ["2"], text
    assert torch.load(copy / "checkpoint.pth", weights_only=True)["epoch"] == 2

    text = _main(capsys, "--val-pack", data["val"], "--test-only", "--resume", ck_path, *COMMON)
    assert re.fullmatch(r"test: mean IoU \d+\.\d{4} \(global acc [\d.]+\)\n", text), text


def test_the_same_weights_score_the_same_on_the_pack_and_the_reference_path(
    data: dict[str, Path], trained: tuple[Path, str], capsys, monkeypatch
) -> None:
    monkeypatch.setattr(T, "make_model", tiny_model)
    ck_path, _ = trained
    args = ["--test-only", "--resume", ck_path, *COMMON]
    pack = _main(capsys, "--val-pack", data["val"], *args)
    ref = _main(capsys, "--data-path-reference", data["folders"], "-j", "0", *args)
    miou = [float(re.search(r"mean IoU ([\d.]+)", t).group(1)) for t in (pack, ref)]
    assert miou[0] > 20, pack  # trained: the colours are learned, not a constant guess
    assert abs(miou[0] - miou[1]) < 0.1, (pack, ref)


def test_the_pack_and_the_reference_path_feed_the_same_pixels(data: dict[str, Path]) -> None:
    """At eval, image by image: masks identical after the resize, images within one grey
    level (packer's resize against torchvision's on uint8), so the same argmax."""
    args = T.parse(["--val-pack", str(data["val"]), "--test-only", "--weights", "x", *COMMON])
    loader = packer.PackLoader(
        packer.load(data["val"]), 1, device="cpu", shuffle=False,
        dense_transform=T.pack_pipeline(args, False),
    )  # fmt: skip
    ds = T.SegmentationFolder(data["folders"] / "val", T.reference_pipeline(args, False))
    assert len(ds) == 4
    for (x, y), (rx, ry) in zip(T.pack_batches(loader), (ds[i] for i in range(len(ds)))):
        assert x.shape[1:] == rx.shape and min(rx.shape[1:]) == 64
        assert torch.equal(y[0], ry), "the masks differ"
        step = 1 / (255 * torch.tensor(T.STD)[:, None, None])  # one grey level, normalized
        assert ((x[0] - rx).abs() <= step * 1.001).all()
        assert set(np.unique(ry.numpy())) <= {0, 1, 2, 3, 255}


def test_confusion_matrix_ignores_255_as_the_reference() -> None:
    cm = T.ConfusionMatrix(3, torch.device("cpu"))
    truth = torch.tensor([0, 1, 2, 2, 255, 255])
    pred = torch.tensor([0, 1, 1, 2, 0, 2])
    cm.update(truth, pred)
    assert cm.mat.tolist() == [[1, 0, 0], [0, 1, 0], [0, 1, 1]]
    acc, _, iu = cm.compute()
    assert acc == pytest.approx(3 / 4)
    assert iu.tolist() == pytest.approx([1.0, 0.5, 0.5])


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
    line = _error(capsys, "--data-path", tmp_path / "nope", "--device", "cpu")
    assert line == f"Error: {tmp_path / 'nope'}: no such pack (train)"
    line = _error(capsys, "--data-path-reference", tmp_path, "--test-only", "--weights", "x",
                  "--device", "cpu")  # fmt: skip
    assert re.fullmatch(r"Error: .*: no image folder beside a mask folder .*", line), line


def test_the_torchvision_model_with_aux_loss_takes_the_packs_batches(data: dict[str, Path]) -> None:
    args = T.parse(["--data-path", str(data["train"]), "--aux-loss", "-b", "2", *COMMON])
    model = T.make_model(args, 4, torch.device("cpu"))
    loader = packer.PackLoader(
        packer.load(data["train"]), 2, device="cpu", seed=0,
        dense_transform=T.pack_pipeline(args, True),
    )  # fmt: skip
    x, y = next(T.pack_batches(loader))
    assert x.shape == (2, 3, 48, 48) and y.shape == (2, 48, 48) and y.dtype == torch.int64
    out = model(x)
    assert set(out) == {"out", "aux"} and out["out"].shape == (2, 4, 48, 48)


def test_the_reference_path_trains(data: dict[str, Path], capsys, monkeypatch) -> None:
    monkeypatch.setattr(T, "make_model", tiny_model)
    out = data["root"] / "ref_run"
    text = _main(capsys, "--data-path-reference", data["folders"], "--output-dir", out, "-b", "2",
                 "--epochs", "1", "--num-classes", "4", *COMMON, "-j", "0")  # fmt: skip
    assert re.search(r"^epoch 0: train loss [\d.]+ .*\| mean IoU [\d.]+ ", text, re.M), text
    assert torch.load(out / "checkpoint.pth", weights_only=True)["num_classes"] == 4
