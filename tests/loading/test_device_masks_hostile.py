"""Instance masks decoded on the device from their run lengths, against hostile runs:
each run is bounded by the frame the pack records (runs of up to 2**62 that add up past
int64 and wrap round to exactly h * w are refused, before anything is sized by them);
a damaged mask names its image; valid ones (0x0 frames, no masks, runs ending on 0s or
1s) decode as pycocotools decodes them."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from pycocotools import mask as coco

from packer.errors import PackFormatError
from packer.loading import dense_pass
from packer.pack.dense import decode_masks, rle_counts
from packer.sources.annotations.coco import _rle_string as _string  # any values

SETUP = SimpleNamespace(semantic=False, masks=True)


def _wrapping() -> bytes:
    """Runs of up to 2**61, none negative, each number within 12 characters, whose sum
    is 2**65 + 16: int64 arithmetic sees 16 pixels, a 4x4 frame."""
    big = 1 << 57
    counts: list[int] = []
    for k in [*range(1, 17), *range(15, 0, -1)]:
        counts += [k * big, 0]
    counts += [0, 16]
    assert sum(counts) % (1 << 64) == 16 and sum(counts) > 16
    return _string(counts)


def test_runs_that_wrap_round_int64_are_refused() -> None:
    with pytest.raises(ValueError, match=r"run of \d+ pixels for a 4x4 mask"):
        rle_counts(_wrapping(), (4, 4))
    with pytest.raises(PackFormatError, match="instance mask 0"):
        decode_masks([_wrapping()], (4, 4))


@pytest.mark.parametrize(
    "counts", [_wrapping(), b"0" + b"o" * 11 + b"?", b"05", _string([3, -2, 15])]
)
def test_a_damaged_mask_names_its_image_before_the_decode(counts: bytes) -> None:
    rec = {"image_id": 7, "size": (4, 4), "masks_rle": [_string([16]), counts]}
    with pytest.raises(PackFormatError, match=r"^image 7: instance mask 1: .*damaged"):
        dense_pass._pixels(rec, SETUP)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize(
    "h,w,masks",
    [
        (0, 0, 1),  # a 0x0 frame
        (0, 5, 2),
        (5, 0, 1),
        (4, 3, 0),  # no masks
        (1, 1, 3),
        (6, 5, 4),
    ],
)
def test_valid_runs_decode_as_pycocotools(h: int, w: int, masks: int) -> None:
    rng = np.random.default_rng(h * 31 + w)
    m = (rng.random((h, w, masks)) < 0.5).astype(np.uint8)
    if masks >= 3 and h * w:
        m[..., 0], m[..., 1] = 0, 1  # one run of 0s (odd count); 0 then all 1s (even)
        m[-1, -1, 2] = 1  # ends on a run of 1s
    enc = coco.encode(np.asfortranarray(m))
    rec = {"image_id": 0, "size": (h, w), "masks_rle": [e["counts"] for e in enc]}
    empty = {"image_id": 1}  # an image without masks in the same batch
    got = dense_pass.upload_pixels(
        [dense_pass._pixels(rec, SETUP), None, dense_pass._pixels(empty, SETUP)],
        torch.device("cpu"),
    )
    want = coco.decode(enc).transpose(2, 0, 1) if masks else np.zeros((0, h, w), np.uint8)
    assert got[0].shape == (masks, h, w) and got[1] is None and got[2] is None
    np.testing.assert_array_equal(got[0].numpy(), want)
    np.testing.assert_array_equal(decode_masks(rec["masks_rle"], (h, w)), want)
