"""Reduced-scale decode on the CPU (packer.imaging.jpeg_scale): the scale each box gets,
and the pixels against Pillow's full decode + the same crop + the same resize (mean
<= 1/255 after the resize) over a sweep of boxes on photo-like images."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
import torchvision.transforms as tvt
from PIL import Image

from packer.errors import PackFormatError
from packer.imaging import jpeg_scale
from packer.imaging.jpeg import decode_crop_cpu
from packer.imaging.jpeg_scale import decode_crop_scaled, draft_scale
from packer.measure.bench.synth import synth_image

W, H = 1024, 768


def _jpeg(im: Image.Image, **kw) -> torch.Tensor:
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=kw.pop("quality", 90), **kw)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


@pytest.fixture(scope="module")
def photo() -> tuple[torch.Tensor, Image.Image]:
    data = _jpeg(synth_image(7, W, H))
    full = Image.open(io.BytesIO(data.numpy().tobytes()))
    full.load()
    return data, full


def _reference(full: Image.Image, box, out_hw, flip: bool) -> np.ndarray:
    """Pillow's full decode, the box cut and resized (antialiased bilinear), flipped."""
    t, left, bh, bw = box
    im = full.resize((out_hw[1], out_hw[0]), Image.Resampling.BILINEAR,
                     box=(left, t, left + bw, t + bh))  # fmt: skip
    if flip:
        im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(im).transpose(2, 0, 1)


def test_scale_is_the_largest_that_keeps_the_output_size() -> None:
    cases = {
        ((768, 1024), (224, 224)): 2,  # 3.4x: 1/4 would leave 192 rows
        ((1120, 1120), (224, 224)): 4,  # 5x: 1/4 leaves 280 = 1.25 x 224
        ((1119, 1792), (224, 224)): 2,  # one row short of that
        ((2240, 2240), (224, 224)): 8,
        ((2239, 2240), (224, 224)): 4,
        ((896, 1792), (224, 224)): 2,  # exactly 4x: 1/4 would resize 1:1
        ((559, 900), (224, 224)): 1,  # under 2.5x on one side: whole
        ((224, 224), (224, 224)): 1,
        ((100, 50), (224, 224)): 1,  # upsampled: whole
        ((80, 120), (8, 12)): 8,
        ((80, 120), (9, 12)): 4,
    }
    got = {k: draft_scale(*k) for k in cases}
    assert got == cases


def _boxes(n: int, seed: int) -> list[tuple[int, int, int, int]]:
    torch.manual_seed(seed)
    ref = tvt.RandomResizedCrop.get_params
    boxes = [tuple(ref(torch.empty(1, H, W), (0.08, 1.0), (3 / 4, 4 / 3))) for _ in range(n)]
    # the edges: a box on each corner, odd sizes and offsets, the whole image
    boxes += [(0, 0, H, W), (H - 461, W - 613, 461, 613), (1, 3, 767, 459), (377, 0, 391, 1024)]
    return boxes


@pytest.mark.parametrize("out_hw", [(224, 224), (96, 128), (37, 23)])
def test_scaled_decode_is_the_full_decode_within_1_of_255(photo, out_hw) -> None:
    data, full = photo
    scales = []
    for k, box in enumerate(_boxes(10, seed=sum(out_hw))):
        s = draft_scale(box[2:], out_hw)
        scales.append(s)
        out = np.zeros((3, *out_hw), np.uint8)
        flip = bool(k % 2)
        decode_crop_cpu(data, 0, (H, W), box, flip, out)
        ref = _reference(full, box, out_hw, flip)
        err = np.abs(out.astype(np.int16) - ref).mean()
        assert err <= 1.0, f"box {box} at 1/{s}: mean {err:.3f}/255"
        if s > 1:  # the scaled decode ran: not the full decode's exact pixels
            assert not np.array_equal(out, ref)
    assert max(scales) > 1, scales  # the sweep reaches the scaled path


def test_scaled_decode_is_chosen_per_image(photo, monkeypatch) -> None:
    data, _ = photo
    seen = []
    real = jpeg_scale.decode_crop_scaled

    def spy(*a, **kw):
        seen.append(a[-1])
        return real(*a, **kw)

    monkeypatch.setattr(jpeg_scale, "decode_crop_scaled", spy)
    out = np.zeros((3, 32, 32), np.uint8)
    for box in [(0, 0, H, W), (0, 0, 40, 40), (0, 0, 160, 200), (0, 0, 80, 80)]:
        decode_crop_cpu(data, 0, (H, W), box, False, out)
    assert seen == [8, 4, 2]  # 40x40 for 32x32: whole, never asked
    decode_crop_cpu(data, 0, (H, W), (0, 0, H, W), False, out, scaled=False)
    assert seen == [8, 4, 2]


def test_not_ycbcr_falls_back_to_the_whole_decode() -> None:
    """A greyscale JPEG: draft() keeps it grey, so the whole decode (torchvision's RGB)
    gives the same pixels as scaled=False."""
    grey = _jpeg(synth_image(3, 256, 192).convert("L"))
    a, b = np.zeros((2, 3, 16, 16), np.uint8)
    assert not decode_crop_scaled(grey, 0, (192, 256), (0, 0, 192, 256), False, a, 8)
    decode_crop_cpu(grey, 0, (192, 256), (0, 0, 192, 256), False, a)
    decode_crop_cpu(grey, 0, (192, 256), (0, 0, 192, 256), False, b, scaled=False)
    assert np.array_equal(a, b) and a.max() > 0


def test_a_damaged_file_at_reduced_scale_names_its_image(photo) -> None:
    data, _ = photo
    bad = bytearray(data.numpy().tobytes())
    mid = len(bad) // 3
    bad[mid : mid + 2] = b"\xff\xc4"  # a table marker in the middle of the scan
    t = torch.frombuffer(bad, dtype=torch.uint8)
    out = np.zeros((3, 32, 32), np.uint8)
    with pytest.raises(PackFormatError, match=r"image 41: its stored JPEG does not decode"):
        decode_crop_cpu(t, 41, (H, W), (0, 0, H, W), False, out)
    with pytest.raises(PackFormatError, match=r"image 41: its stored JPEG decodes to 1024x768"):
        decode_crop_cpu(data, 41, (H + 1, W), (0, 0, H, W), False, out)  # header first


def test_import_decoders_warms_the_scaled_path(monkeypatch) -> None:
    """The loader imports on its own thread what its decode threads will run: the
    scaled decode (Pillow's JPEG plugin, draft, crop) included."""
    from packer.imaging import jpeg

    seen = []
    real = jpeg_scale.decode_crop_scaled
    monkeypatch.setattr(jpeg, "_warmed", [])  # a fresh process: nothing warmed yet
    monkeypatch.setattr(
        jpeg_scale, "decode_crop_scaled", lambda *a, **kw: seen.append(real(*a, **kw)) or seen[-1]
    )
    jpeg.import_decoders(torch.device("cpu"))
    assert seen == [True]
