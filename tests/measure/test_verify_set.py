"""``verify_set``: the index and every shard checked, a mismatch named by shard and file."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conftest import write_image
from packer.builder.api import BuildConfig, build
from packer.errors import PackFormatError, UsageError
from packer.measure.verify import VerifyConfig
from packer.measure.verify_set import verify_set
from packer.pack.index import read_index


@pytest.fixture
def pack_set(tmp_path: Path) -> Path:
    for c in ("cat", "dog"):
        for i in range(3):
            write_image(tmp_path / "src" / c / f"{i}.png", (20, 16), seed=i + 10 * (c == "dog"))
    build(tmp_path / "src", tmp_path / "set", BuildConfig(size=(8, 6), workers=1, shard_size=300))
    return tmp_path / "set"


def test_a_whole_set_verifies(pack_set: Path) -> None:
    r = verify_set(pack_set, VerifyConfig(sample=2))
    assert r.ok, r.checks
    names = [c["name"] for c in r.checks]
    assert names[0] == "index" and len(names) == 4
    assert all(n.startswith("shard 0000") for n in names[1:])
    assert "manifest, files, images, labels, sources ok" in r.checks[1]["detail"]


def test_damaged_shards_are_named_and_the_rest_still_checked(pack_set: Path) -> None:
    shards = read_index(pack_set).shards
    rows = pack_set / shards[1].name / "_tensordict" / "images.memmap"
    data = bytearray(rows.read_bytes())
    data[5] ^= 0xFF
    rows.write_bytes(bytes(data))
    shutil.rmtree(pack_set / shards[2].name)
    r = verify_set(pack_set, VerifyConfig(sample=0, use_recorded_source=False))
    assert not r.ok
    by_name = {c["name"]: c for c in r.checks}
    assert by_name["index"]["ok"] and by_name[f"shard {shards[0].name}"]["ok"]
    bad = by_name[f"shard {shards[1].name}"]
    assert not bad["ok"]
    assert bad["detail"].startswith("images (_tensordict/images.memmap): checksum mismatch")
    gone = by_name[f"shard {shards[2].name}"]
    assert not gone["ok"] and "is missing; the set is incomplete" in gone["detail"]


def test_no_index_is_nothing_to_verify(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(PackFormatError, match=r"not a pack set \(imgpack-set\.json is missing\)"):
        verify_set(tmp_path / "empty")


def test_a_set_refuses_a_device_this_process_lacks_before_any_shard(
    pack_set: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    import packer.measure.verify_set as vs

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    checked: list[int] = []
    monkeypatch.setattr(vs, "_check_shard", lambda *a: checked.append(1))
    with pytest.raises(
        UsageError, match=r"VerifyConfig\.device cuda, but torch sees no CUDA device"
    ):
        verify_set(pack_set, VerifyConfig(device="cuda"))
    assert checked == []


def test_a_jpeg_set_is_described_as_stored_jpegs(tmp_path: Path) -> None:
    for i in range(4):
        write_image(tmp_path / "src" / "c" / f"{i}.jpg", (40 + i, 30), fmt="JPEG")
    config = BuildConfig(workers=1, store="jpeg", max_side=32, shard_size=2000)
    build(tmp_path / "src", tmp_path / "set", config)
    first = verify_set(tmp_path / "set", VerifyConfig(sample=0)).checks[0]
    assert "images of [" not in first["detail"]
    assert (
        "4 stored JPEGs (each its own size, up to 32 wide x 24 high, max side 32)"
        in (first["detail"])
    )
