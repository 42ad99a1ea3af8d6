"""Reduced-scale JPEG decode on the CPU: where a crop box is much larger than its output
(RandomResizedCrop 224 of a 12 MP photo), libjpeg-turbo decodes at 1/2, 1/4 or 1/8 of the
size through its DCT scaling (Pillow's ``Image.draft``) and only the scaled box is resampled.

:func:`draft_scale` picks, per image, the largest reduction that still leaves the box at
least the output's size (with a margin, :data:`MARGIN`); :func:`decode_crop_scaled` decodes at it, cuts the scaled pixels
the box touches and resamples the box inside them (its edges divided by the scale,
fractional edges kept: Pillow's ``resize(box=...)``), and flips. The pixels are Pillow's full decode + the same crop + the same resize within
1/255 mean (tests/imaging/test_jpeg_scale.py sweeps boxes on photo-like images): an
8x8 block's scaled IDCT is a low-pass as the antialiased resize is.

:func:`packer.imaging.jpeg.decode_crop_cpu` (the loader's ``decode="cpu"`` and the CPU
lane, :mod:`packer.imaging.cpu_lane`) calls it where the scale is above 1.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
import torch

from ..errors import PackFormatError

SCALES = (8, 4, 2)  # JPEG's DCT scalings libjpeg offers through Pillow's draft(), largest first
# the scaled box is at least MARGIN times the output on each side: at 1:1 the resize
# after the scaled decode filters nothing, and a scaled IDCT alone is 1.2-1.6/255 mean
# from the antialiased resize of the full decode; from 1.25 up 0.5-0.8/255 (1/8 the
# worst; 1/2 and 1/4 are within 0.7 from 1.05). Measured on make_set's photo-like images.
MARGIN = 1.25


def draft_scale(box_hw: Sequence[int], out_hw: Sequence[int]) -> int:
    """The reduction (8, 4, 2, or 1: none) to decode an image at for a box of
    ``box_hw`` (h, w) resized to ``out_hw``: the largest whose scaled box still has at
    least :data:`MARGIN` times the output's pixels on each side."""
    bh, bw = (int(v) for v in box_hw)
    oh, ow = (int(v) for v in out_hw)
    for s in SCALES:
        if bh >= MARGIN * oh * s and bw >= MARGIN * ow * s:
            return s
    return 1


def _max_pixels() -> int | None:
    from PIL import Image

    return Image.MAX_IMAGE_PIXELS


def decode_crop_scaled(
    data: torch.Tensor,
    index: int,
    hw: Sequence[int],
    box: Sequence[int],
    flip: bool,
    out: np.ndarray,
    scale: int,
) -> bool:
    """Decode one JPEG at 1/``scale`` (Pillow's draft mode) and resample its box into
    ``out`` (uint8 [3, h, w], planar); True when done.

    False, with nothing written, where the scaled decode does not apply: a file that is
    not YCbCr (greyscale, CMYK: torchvision's conversion to RGB stays the one), a draft
    that gives another scale, an image above Pillow's pixel bound; the caller then decodes it whole.
    ``hw`` is its stored (h, w), the frame header already checked against it by the
    caller. A file that does not decode raises PackFormatError naming ``index``.
    """
    from PIL import Image

    from .decode import store_into

    h, w = (int(v) for v in hw)
    limit = _max_pixels()
    if scale <= 1 or (limit is not None and h * w > limit):
        return False
    try:
        im = Image.open(io.BytesIO(data.numpy().tobytes()), formats=("JPEG",))
        if im.size != (w, h):
            return False  # the caller's whole decode names the mismatch
        target = (-(-w // scale), -(-h // scale))
        im.draft("RGB", target)
        if im.mode != "RGB" or im.size != target:
            return False
        im.load()
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        msg = (str(e).splitlines() or [""])[0][:200]
        raise PackFormatError(
            f"image {index}: its stored JPEG does not decode ({msg}); the pack is damaged, "
            "run `imgpack verify` and rebuild it"
        ) from None
    top, left, bh, bw = (int(v) for v in box)
    oh, ow = out.shape[1:]
    s = float(scale)
    # cut the scaled pixels the box touches, then resample the box's exact (fractional)
    # edges inside that cut: the filter reads nothing beyond the box (as the full decode's
    # crop-then-resize), only the edge pixels' own share of their 8x8 blocks
    cut = (left // scale, top // scale, -(-(left + bw) // scale), -(-(top + bh) // scale))
    im = im.crop(cut)
    x0, y0 = cut[0], cut[1]
    area = (left / s - x0, top / s - y0, (left + bw) / s - x0, (top + bh) / s - y0)
    im = im.resize((ow, oh), Image.Resampling.BILINEAR, box=area)
    if flip:
        im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    store_into(im, out)
    return True


__all__ = ["SCALES", "decode_crop_scaled", "draft_scale"]
