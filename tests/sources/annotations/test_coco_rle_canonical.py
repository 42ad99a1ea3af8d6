"""A COCO compressed RLE string is stored as pycocotools writes it: one that pads a
number with empty continuation characters (pycocotools reads it) would otherwise make a
pack its own reader refuses (no number of more than 12 characters); a string written by
pycocotools is stored unchanged."""

from __future__ import annotations

import numpy as np
import pytest
from pycocotools import mask as coco

from packer.pack.dense import decode_masks
from packer.sources.annotations.coco import _segmentation


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("pad", [0, 11, 20])
def test_a_padded_rle_is_stored_as_pycocotools_writes_it(pad: int) -> None:
    padded = "U" + "P" * pad + "0;"  # runs 5 and 11 of a 4x4 mask, the 5 padded
    want = coco.decode({"size": [4, 4], "counts": padded.encode()})
    stored, why = _segmentation({"size": [4, 4], "counts": padded}, (4, 4))
    assert why is None and stored == b"5;"  # as pycocotools encodes runs 5, 11
    np.testing.assert_array_equal(decode_masks([stored], (4, 4))[0], want)


def test_pycocotools_strings_are_stored_unchanged() -> None:
    rng = np.random.default_rng(3)
    masks = np.asfortranarray((rng.random((37, 29, 20)) < 0.3).astype(np.uint8))
    masks[..., 0], masks[..., 1] = 0, 1
    for rle in coco.encode(masks):
        stored, why = _segmentation({"size": [37, 29], "counts": rle["counts"].decode()}, (37, 29))
        assert why is None and stored == rle["counts"]
