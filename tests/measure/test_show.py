"""imgpack show: a contact sheet of a pack, with augmented draws."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

import packer
import packer.transforms as PT
from conftest import cli_run, one_error
from packer.builder import BuildConfig, build
from packer.errors import UsageError
from packer.measure.show import ShowConfig, show_pack

pytest.importorskip("matplotlib")


class StandInMix:
    """A MixUp stand-in until packer.transforms.MixUp lands: one lambda per batch."""

    mixes_labels = True
    accepts_generator = True

    def __init__(self, alpha: float, num_classes: int) -> None:
        self.num_classes = num_classes

    def __call__(self, images, labels, generator=None):
        lam = float(torch.rand((), generator=generator)) * 0.5 + 0.25
        soft = torch.nn.functional.one_hot(labels, self.num_classes).float()
        x = lam * images.float() + (1 - lam) * images.roll(1, 0).float()
        return x.round().to(torch.uint8), lam * soft + (1 - lam) * soft.roll(1, 0)


@pytest.fixture
def ops(monkeypatch: pytest.MonkeyPatch) -> None:
    """packer.transforms' recipe ops, or stand-ins where this checkout lacks them."""
    if not hasattr(PT, "TrivialAugmentWide"):
        monkeypatch.setattr(
            PT, "TrivialAugmentWide", lambda: PT.RandomResizedCrop(8), raising=False
        )
    if not hasattr(PT, "MixUp"):
        monkeypatch.setattr(PT, "MixUp", StandInMix, raising=False)


def png_size(path: Path) -> tuple[int, int]:
    with Image.open(path) as im:
        im.load()
        assert im.format == "PNG"
        return im.size


def test_a_sheet_per_class_then_with_draws(packed: Path, tmp_path: Path, ops: None) -> None:
    pack = packer.load(packed)
    plain = show_pack(ShowConfig(packed, tmp_path / "a.png", per_class=2))
    assert (plain.rows, plain.columns, plain.draws) == (3, 2, 0)  # a row per class
    assert plain.classes == ("cat", "dog", "zebra")
    labels = pack.labels.tolist()
    first = [[i for i, y in enumerate(labels) if y == c][:2] for c in range(3)]
    assert list(plain.indices) == [i for f in first for i in f]  # the first 2 in pack order
    w, h = png_size(tmp_path / "a.png")
    assert (w, h) == (plain.width, plain.height) and h > w  # 3 rows of 2

    aug = show_pack(ShowConfig(packed, tmp_path / "b.png", per_class=1, augment="ta_wide"))
    assert (aug.rows, aug.columns, aug.draws) == (3, 5, 4)  # a row per image: stored + 4 draws
    assert aug.classes == ("cat", "dog", "zebra") and len(aug.augment) == 1
    w2, h2 = png_size(tmp_path / "b.png")
    assert w2 > h2 and w2 > w  # 5 columns


def test_seeded_choice_stays_in_class(packed: Path, tmp_path: Path) -> None:
    labels = packer.load(packed).labels.tolist()
    picks = [
        show_pack(ShowConfig(packed, tmp_path / f"{s}.png", per_class=2, seed=s)).indices
        for s in (1, 1, 2, 3)
    ]
    assert picks[0] == picks[1] and len(set(picks)) > 1
    for p in picks:
        assert [labels[i] for i in p] == [0, 0, 1, 1, 2, 2]


def test_jpeg_pack_with_mixing(photos: Path, tmp_path: Path, ops: None) -> None:
    build(photos, tmp_path / "jp", BuildConfig(store="jpeg", workers=1))
    out = tmp_path / "mix.png"
    code, stdout, stderr = cli_run(
        "show", tmp_path / "jp", "--out", out, "--per-class", "2", "--max-classes", "2",
        "--mixup-alpha", "0.2", "--draws", "2", "--json",
    )  # fmt: skip
    assert code == 0, stderr
    r = json.loads(stdout)
    assert (r["rows"], r["columns"], r["draws"], r["images"]) == (4, 3, 2, 4)
    assert r["classes"] == ["cat", "cat", "dog", "dog"]
    assert png_size(out) == (r["width"], r["height"])
    code, stdout, _ = cli_run("show", tmp_path / "jp", "--out", tmp_path / "raw.png")
    assert code == 0 and "Wrote" in stdout and "images of 3 classes" in stdout


def test_without_matplotlib_one_line_naming_the_extra(
    packed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(UsageError, match=r"needs matplotlib: pip install 'imgpack\[plot\]'"):
        show_pack(ShowConfig(packed, tmp_path / "a.png"))
    code, _, err = cli_run("show", packed, "--out", tmp_path / "a.png")
    assert code == 2
    assert one_error(err) == "Error: imgpack show needs matplotlib: pip install 'imgpack[plot]'"
    assert not (tmp_path / "a.png").exists()


def test_bad_pack_path_and_missing_op_exit_2(
    packed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = cli_run("show", tmp_path / "nope", "--out", tmp_path / "a.png")
    assert code == 2 and "nope" in one_error(err) and "no such pack" in err
    monkeypatch.delattr(PT, "RandAugment", raising=False)
    code, _, err = cli_run("show", packed, "--out", tmp_path / "a.png", "--augment", "ra")
    assert code == 2
    assert one_error(err).startswith(
        "Error: --augment ra needs packer.transforms.RandAugment, which this imgpack does not have"
    )
    code, _, err = cli_run("show", packed, "--out", tmp_path / "missing" / "a.png")
    assert code == 2 and "no such folder for --out" in one_error(err)
