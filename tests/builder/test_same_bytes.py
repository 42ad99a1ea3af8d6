"""The same inputs and options build the same bytes: digests recorded from the code
before the storage kinds became objects (issue 28), asserted after every change.

Decoded rows and re-encoded JPEGs are Pillow's output, deterministic for one Pillow
release, so the test runs only under the Pillow it was recorded with (``PILLOW``);
under another it is skipped, not failed. The manifest is compared without what
depends on the machine or the clock (``build.created``, ``build.source_root``).
"""

from __future__ import annotations

from pathlib import Path

import PIL
import pytest

from conftest import pack_digests, write_image
from packer.builder.run import BuildConfig, build

PILLOW = "13.0.0"

RAW = {
    "_tensordict/images.memmap": "7efd433fb71bb214ae85c5736b0c5a04f0655a2a57502a038489f0c584f97e1f",
    "_tensordict/labels.memmap": "2d955b43c8ff6932f35ea4fccceea9608667682b8ebb2cce282dc00a1f8aa7fe",
    "_tensordict/meta.json": "a644b4f61ff15f1edaca62f03c7929a5be59c4eba12c2aaa3e432b40f0ba9652",
    "imgpack.json": "dde853e25e644c9d1a7008927b32c93780a66bf8ccb094eadde038f80be63269",
    "meta.json": "dcca0dc7f8ca2dcf30813a2e98e9add8b937087763626c0a4318837d97a14632",
}
JPEG = {
    "_tensordict/jpeg.memmap": "b00f81ff8d30575c0c045f7f5ac7de59a33469ef91292d34dab51065610aacb9",
    "_tensordict/labels.memmap": "2d955b43c8ff6932f35ea4fccceea9608667682b8ebb2cce282dc00a1f8aa7fe",
    "_tensordict/lengths.memmap": "cdd79e85672c707551acfc32b1fb10c3f185ac81853b91133db8df50a1f080b1",
    "_tensordict/meta.json": "1203f44e57640396a503c10d625f49a81237de8ff9b88093a8ca56efa38c9efc",
    "_tensordict/offsets.memmap": "5268323219f5fbad2362cec1ba13b927aa0fbc5c86abdae10944ab9473cae525",
    "_tensordict/sizes.memmap": "2b548540da56c2e7c8965bf0719bbbbe1d9501a328187ff7d46870b0b3fd7179",
    "imgpack.json": "dce491dfbbaa21161f94dfe01ae67d2fccfdd41fa9231b26b98750155f11f634",
    "meta.json": "dcca0dc7f8ca2dcf30813a2e98e9add8b937087763626c0a4318837d97a14632",
}


def _tree(root: Path) -> Path:
    """10 PNGs and 10 baseline JPEGs of assorted sizes in two classes."""
    for c in ("cat", "dog"):
        for i in range(5):
            seed = i + 10 * (c == "dog")
            write_image(root / c / f"{i}.png", (40 + 3 * i, 30 + 2 * i), seed=seed)
            write_image(root / c / f"j{i}.jpg", (50 + 5 * i, 36 + i), seed=100 + i, quality=90)
    return root


pytestmark = pytest.mark.skipif(
    PIL.__version__ != PILLOW, reason=f"digests recorded with Pillow {PILLOW}"
)


@pytest.mark.parametrize(
    ("options", "expected"),
    [({}, RAW), ({"store": "jpeg", "max_side": 48}, JPEG)],
    ids=["raw", "jpeg"],
)
def test_same_bytes_as_before(tmp_path: Path, options: dict, expected: dict[str, str]) -> None:
    src = _tree(tmp_path / "src")
    build(src, tmp_path / "p", BuildConfig(size=(16, 12), workers=1, **options))
    assert pack_digests(tmp_path / "p", "source_root") == expected
