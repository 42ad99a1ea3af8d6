"""A JPEG pack built from a label table streams (images, labels, targets) like a raw pack."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

import packer
from packer.measure.bench.synth import make_jpeg_tree


@pytest.mark.parametrize("store", ["raw", "jpeg"])
def test_pack_from_a_table_streams_targets_in_both_storages(tmp_path: Path, store: str) -> None:
    src = tmp_path / "src"
    make_jpeg_tree(src, 12, (64, 48), classes=3, quality=90, threads=1)
    rels = sorted(p.relative_to(src).as_posix() for p in src.rglob("*.jpg"))
    table = tmp_path / "t.csv"
    with open(table, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "label", "a", "b"])
        for i, r in enumerate(rels):
            w.writerow([r, r.split("/")[0], i * 0.5, -i])
    cfg = packer.BuildConfig(
        size=(32, 32), workers=1, store=store, labels=table, targets=("a", "b")
    )
    pack = packer.load(packer.build_pack(src, tmp_path / "p", cfg).path)
    kw = {"image_size": 24} if store == "jpeg" else {}
    batches = list(packer.PackLoader(pack, 5, device="cpu", shuffle=False, **kw))
    assert all(len(b) == 3 for b in batches)
    images = torch.cat([b[0] for b in batches])
    labels = torch.cat([b[1] for b in batches])
    targets = torch.cat([b[2] for b in batches])
    assert images.dtype == torch.uint8 and images.shape[0] == 12
    assert targets.dtype == torch.float32 and torch.equal(targets, pack.targets[:])
    assert torch.equal(labels, pack.labels[:])
    # the table's values, row for row: a = 0.5 * i, b = -i for the i-th listed path
    order = [rels.index(s) for s in pack.sources]
    assert targets[:, 0].tolist() == [0.5 * i for i in order]
    assert targets[:, 1].tolist() == [-float(i) for i in order]


def test_jpeg_build_keeps_the_tables_missing_row_count(tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_jpeg_tree(src, 6, (40, 30), classes=2, quality=90, threads=1)
    table = tmp_path / "t.csv"
    with open(table, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "label"])
        for p in sorted(src.rglob("*.jpg")):
            w.writerow([p.relative_to(src).as_posix(), "a"])
        w.writerow(["gone.jpg", "a"])
    cfg = packer.BuildConfig(size=(16, 16), workers=1, store="jpeg", labels=table)
    extra = packer.load(packer.build_pack(src, tmp_path / "p", cfg).path).manifest.build.extra
    assert extra["missing_rows"] == 1 and extra["reencoded"] == 0
