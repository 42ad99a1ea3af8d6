"""Bounds that protect the reader come from the reader (constants, the user's options),
never from the pack being checked (issue 42.3)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

import packer
from conftest import write_image
from packer.builder.api import BuildConfig, build
from packer.errors import PackFormatError, UsageError
from packer.imaging.decode import DEFAULT_MAX_PIXELS
from packer.pack.index import INDEX

JPEG = BuildConfig(store="jpeg", workers=1)
BIG = 65000  # both sides fit a JPEG header: 4.2 Gpx, 12.7 GB decoded


@pytest.fixture
def src(tmp_path: Path) -> Path:
    for i in range(4):
        write_image(tmp_path / "src" / f"c{i % 2}" / f"{i}.png", (20, 16), seed=i)
    return tmp_path / "src"


def _raise_own_cap(pack: Path, row: int) -> None:
    """What a hostile pack does: its manifest's build.max_pixels raised to a JPEG's most,
    and image ``row``'s stored size 65000x65000 (the frame header would say the same)."""
    j = json.loads((pack / "imgpack.json").read_text())
    j["build"]["max_pixels"] = 65535 * 65535
    (pack / "imgpack.json").write_text(json.dumps(j))
    f = pack / "_tensordict" / "sizes.memmap"
    hw = np.fromfile(f, dtype="<i8")
    hw[2 * row : 2 * row + 2] = BIG
    hw.tofile(f)


def test_a_pack_cannot_raise_its_own_decode_bound(src: Path, tmp_path: Path) -> None:
    build(src, tmp_path / "j", JPEG)
    _raise_own_cap(tmp_path / "j", 2)
    msg = r"image 2: the pack gives its size as 65000x65000, .* at most 100,000,000 pixels"
    with pytest.raises(PackFormatError, match=msg):
        packer.load(tmp_path / "j")
    with pytest.raises(PackFormatError, match=msg):
        packer.PackLoader(tmp_path / "j", 2, device="cpu", image_size=8)
    # the user's option is the one way up (then each frame header is checked against it)
    pack = packer.load(tmp_path / "j", max_pixels=BIG * BIG)
    assert len(pack) == 4
    with pytest.raises(PackFormatError):
        pack.decode([2])  # the stored JPEG's header says 20x16, not what the pack says
    for bad in (0, -1, 2.5, True, 65536 * 65536):
        with pytest.raises(UsageError, match="max_pixels must be"):
            packer.load(tmp_path / "j", max_pixels=bad)


def test_a_set_cannot_raise_its_own_decode_bound(src: Path, tmp_path: Path) -> None:
    build(src, tmp_path / "s", BuildConfig(store="jpeg", workers=1, shard_size=1))
    index = json.loads((tmp_path / "s" / INDEX).read_text())
    shard = index["shards"][1]
    _raise_own_cap(tmp_path / "s" / shard["name"], 0)
    # the index pins the shard's manifest: a hostile set re-pins it
    data = (tmp_path / "s" / shard["name"] / "imgpack.json").read_bytes()
    shard["sha256"] = hashlib.sha256(data).hexdigest()
    (tmp_path / "s" / INDEX).write_text(json.dumps(index))
    with pytest.raises(PackFormatError, match=r"65000x65000, .* at most 100,000,000 pixels"):
        packer.load(tmp_path / "s")
    assert len(packer.load(tmp_path / "s", max_pixels=BIG * BIG)) == 4


def test_a_pack_may_lower_the_bound(src: Path, tmp_path: Path) -> None:
    """A pack built with a smaller --max-pixels keeps it: a stored size above what its
    build allowed is refused even under the reader's default."""
    build(src, tmp_path / "j", JPEG)
    j = json.loads((tmp_path / "j" / "imgpack.json").read_text())
    j["build"]["max_pixels"] = 100
    (tmp_path / "j" / "imgpack.json").write_text(json.dumps(j))
    with pytest.raises(PackFormatError, match=r"at most 100 pixels\)"):
        packer.load(tmp_path / "j", max_pixels=DEFAULT_MAX_PIXELS)
