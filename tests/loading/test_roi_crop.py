"""packer.loading.roi_crop: RandomResizedCrop fused with the JPEG decode: torchvision's
boxes per image size, the JPEG-pack loader's crop (``crop_for``) reproduced draw for draw
and pixel for pixel; through nvImageCodec's ROI (CPU) and each GPU decoder (CUDA)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.transforms as tv
from PIL import Image

from aug_checks import assert_same_categories, assert_same_distribution, mad
from packer.errors import UsageError
from packer.imaging import decoders as D
from packer.imaging.jpeg import decode_batch, resize_images
from packer.loading.crop import crop_for
from packer.loading.roi_crop import RoiResizedCrop

SIZES = [(120, 90), (57, 23), (64, 64), (17, 9)]  # (w, h)
HW = torch.tensor([[h, w] for w, h in SIZES])


def _jpeg(w: int, h: int, seed: int, quality: int = 90) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (h // 8 + 1, w // 8 + 1, 3)).astype(np.uint8)
    im = Image.fromarray(base).resize((w, h), Image.Resampling.BILINEAR)
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=quality)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


@pytest.fixture
def datas() -> list[torch.Tensor]:
    return [_jpeg(w, h, i) for i, (w, h) in enumerate(SIZES)]


def _photos(n: int = 16) -> list[torch.Tensor]:
    import tempfile

    from packer.measure.bench.synth import make_jpeg_tree

    with tempfile.TemporaryDirectory() as d:
        make_jpeg_tree(Path(d), n, (500, 375), quality=90, threads=2)
        files = sorted(Path(d).rglob("*.jpg"))
        return [torch.frombuffer(bytearray(f.read_bytes()), dtype=torch.uint8) for f in files]


def _gpu_decoders() -> list[D.DecoderBase]:
    out = []
    for name in D.GPU_CHAIN:
        try:
            out.append(D.get_decoder("cuda", prefer=name))
        except UsageError:
            continue
    return out


def test_roi_boxes_follow_torchvisions_get_params():
    """Per-image sizes in one batch: each size's boxes against torchvision's get_params
    for that size (KS at alpha 0.001, fixed seeds); a small image's heights by chi-square."""
    crop = RoiResizedCrop(D.get_decoder("cpu"), 224, flip_p=0)
    n, shapes = 3000, [(375, 500), (23, 57)]
    sizes = torch.tensor(shapes * n)
    boxes, flip = crop.boxes(sizes, torch.Generator().manual_seed(3))
    assert flip is None and boxes.shape == (2 * n, 4)
    torch.manual_seed(0)
    for k, (h, w) in enumerate(shapes):
        ours = boxes[k::2].double()
        ref = torch.tensor(
            [
                tv.RandomResizedCrop.get_params(torch.empty(1, h, w), (0.08, 1.0), (3 / 4, 4 / 3))
                for _ in range(n)
            ]
        ).double()
        assert_same_distribution(ours[:, 2] * ours[:, 3], ref[:, 2] * ref[:, 3])
        assert_same_distribution(ours[:, 3] / ours[:, 2], ref[:, 3] / ref[:, 2])
        assert_same_distribution(ours[:, 0], ref[:, 0])
        assert_same_distribution(ours[:, 1], ref[:, 1])
        if h < 50:
            assert_same_categories(ours[:, 2].numpy(), ref[:, 2].numpy(), range(1, h + 1))


def test_roi_crop_equals_the_loaders_crop(datas):
    """The same draws as the JPEG-pack loader's crop (JpegCrop), the same pixels as its
    decode + one batched resize."""
    dec = D.get_decoder("cpu", threads=0)
    crop = RoiResizedCrop(dec, 32)
    out = crop(datas, HW, torch.Generator().manual_seed(7))
    boxes, flip = crop_for(None, 32, True).boxes(HW, torch.Generator().manual_seed(7))
    ref = resize_images(decode_batch(datas), (32, 32), boxes=boxes, flip=flip)
    assert out.shape == (4, 3, 32, 32) and torch.equal(out, ref)
    assert crop.path == "full+crop" and "path='full+crop'" in repr(crop)


def test_roi_crop_through_nvimgcodec_roi_equals_full_decode(datas):
    pytest.importorskip("nvidia.nvimgcodec")
    dec = D.get_decoder("cpu", prefer="nvimgcodec")
    gen = lambda: torch.Generator().manual_seed(1)  # noqa: E731
    roi = RoiResizedCrop(dec, 24)(datas, HW, gen())
    assert dec.roi_path == "roi"
    full = RoiResizedCrop(D.get_decoder("cpu"), 24)(datas, HW, gen())
    assert mad(roi, full) <= 1.0


@pytest.mark.cuda
def test_gpu_roi_crop_matches_the_loaders_crop():
    datas = _photos()
    hw = torch.tensor([[375, 500]] * len(datas))
    boxes, flip = crop_for(None, 224, True).boxes(hw, torch.Generator().manual_seed(2))
    ref = resize_images(decode_batch(datas, "cuda"), (224, 224), boxes=boxes, flip=flip)
    for dec in _gpu_decoders():
        out = RoiResizedCrop(dec, 224).apply(datas, hw, boxes, flip)
        assert mad(out, ref) <= 1.0, (dec.name, dec.roi_path)


class _Recording:
    """A region decoder that records which images it decodes alone and which whole."""

    supports_roi = True
    roi_path = "roi (no fancy upsampling)"
    coarse_regions = True
    name = "recording"
    device = torch.device("cpu")

    def __init__(self) -> None:
        self.alone: list[int] = []
        self.whole: list[int] = []

    def decode_rois(self, datas, boxes, *, sizes, indices):
        self.alone += list(indices)
        return [
            torch.full((3, int(h), int(w)), i) for i, (_, _, h, w) in zip(indices, boxes.tolist())
        ]

    def decode(self, datas, *, sizes, indices):
        self.whole += list(indices)
        return [torch.full((3, int(h), int(w)), i) for i, (h, w) in zip(indices, sizes.tolist())]


def test_a_region_decoder_decodes_alone_only_the_boxes_the_resize_shrinks_2x() -> None:
    """Where regions come without smooth chroma upsampling (nvImageCodec on the GPU),
    only a box the resize shrinks at least 2x on both sides is decoded alone, the rest
    whole, in the batch's order."""
    from packer.loading.jpeg_pass import Decoding

    sizes = torch.tensor([[400, 400], [400, 400], [100, 90], [300, 500]])
    boxes = torch.tensor([[0, 0, 300, 300], [5, 5, 300, 50], [0, 0, 100, 90], [10, 20, 64, 64]])
    dec = _Recording()
    cut, imgs = Decoding(dec).run(dec, [torch.zeros(1)] * 4, sizes, boxes, [10, 11, 12, 13],
                                  None, (32, 32))  # fmt: skip
    assert cut == [True, False, True, True]  # each side >= 2 x 32, but 50 of 300 x 50
    assert dec.alone == [10, 12, 13] and dec.whole == [11]
    assert [int(x[0, 0, 0]) for x in imgs] == [10, 11, 12, 13]
    assert [tuple(x.shape[1:]) for x in imgs] == [(300, 300), (400, 400), (100, 90), (64, 64)]
    cut, _ = Decoding(dec).run(dec, [torch.zeros(1)] * 4, sizes, boxes, [0, 1, 2, 3],
                               None, (60, 60))  # fmt: skip
    assert cut == [True, False, False, False]  # only 300 x 300 is 2 x 60 on both sides
