"""packer.imaging.jpeg: batched JPEG decode, boxes and resize (CPU; CUDA with skipif)."""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms.v2 import functional as F

from conftest import subprocess_env
from helpers.interpreted import run_interpreted
from packer.errors import PackFormatError
from packer.imaging.jpeg import (
    decode_batch,
    decode_resized,
    fit_boxes,
    pad_batch,
    resize_batch,
    resize_images,
    sizes_of,
)
from packer.transforms import RandomResizedCrop


def _jpeg(w: int, h: int, seed: int, quality: int = 90, smooth: bool = False) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (3, 3, 3) if smooth else (h // 8 + 1, w // 8 + 1, 3))
    im = Image.fromarray(base.astype(np.uint8)).resize((w, h), Image.Resampling.BILINEAR)
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=quality)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


SIZES = [(40, 30), (23, 57), (64, 64), (17, 9)]


@pytest.fixture
def datas() -> list[torch.Tensor]:
    return [_jpeg(w, h, i) for i, (w, h) in enumerate(SIZES)]


def test_decode_batch_matches_torchvision(datas):
    with ThreadPoolExecutor(2) as pool:
        out = decode_batch(datas, "cpu", pool=pool)
    for d, x, (w, h) in zip(datas, out, SIZES):
        assert x.shape == (3, h, w) and x.dtype == torch.uint8
        assert torch.equal(x, decode_jpeg(d, mode=ImageReadMode.RGB))


def test_corrupt_jpeg_names_the_index(datas):
    bad = datas[2].clone()
    bad[2:-2] = 0  # keep SOI and EOI, destroy the rest
    datas[2] = bad
    with pytest.raises(PackFormatError, match=r"image 17: its stored JPEG does not decode"):
        decode_batch(datas, "cpu", indices=[5, 9, 17, 3])
    with ThreadPoolExecutor(2) as pool, pytest.raises(PackFormatError, match="image 2:"):
        decode_batch(datas, "cpu", pool=pool)


def test_pad_batch_keeps_each_image_top_left(datas):
    imgs = decode_batch(datas)
    batch, sizes = pad_batch(imgs)
    assert batch.shape == (4, 3, 64, 64)
    assert sizes.tolist() == [[h, w] for w, h in SIZES]
    for i, x in enumerate(imgs):
        assert torch.equal(batch[i, :, : x.shape[1], : x.shape[2]], x)
        assert batch[i, :, x.shape[1] :].sum() == 0


def test_fit_boxes_crop_and_stretch():
    sizes = torch.tensor([[30, 40], [57, 23], [100, 100]])
    crop = fit_boxes(sizes, (20, 20), "crop").tolist()
    assert crop == [[0, 5, 30, 30], [17, 0, 23, 23], [0, 0, 100, 100]]
    assert fit_boxes(sizes, (20, 20), "stretch").tolist() == [
        [0, 0, 30, 40],
        [0, 0, 57, 23],
        [0, 0, 100, 100],
    ]
    ev = fit_boxes(sizes, (8, 8), "crop", fraction=0.875).tolist()
    assert ev[2] == [6, 6, 88, 88]  # centre 0.875 of the shorter side


def test_resize_batch_equals_per_image_torchvision(datas):
    imgs = decode_batch(datas)
    batch, sizes = pad_batch(imgs)
    gen = torch.Generator().manual_seed(0)
    boxes = RandomResizedCrop(16).sample_boxes(len(imgs), sizes[:, 0], sizes[:, 1], gen)
    out = resize_batch(batch, sizes, (16, 16), boxes=boxes)
    for x, b, y in zip(imgs, boxes.tolist(), out):
        ref = F.resized_crop(x, *b, [16, 16], antialias=True)
        assert (ref.int() - y.int()).abs().max() <= 2


def test_pad_mode_letterboxes(datas):
    imgs = decode_batch(datas)
    batch, sizes = pad_batch(imgs)
    out = resize_batch(batch, sizes, (20, 20), mode="pad")
    # 40x30 (w x h) fits as 20x15: rows 2..17 hold the image, the rest is black
    assert out[0, :, :2].sum() == 0 and out[0, :, 17:].sum() == 0
    assert out[0, :, 2:17].float().mean() > 10
    ref = F.resize(imgs[0], [15, 20], antialias=True)
    assert (out[0, :, 2:17].int() - ref.int()).abs().max() <= 2


def test_decode_resized_with_boxes_for(datas):
    def boxes_for(sizes):
        return fit_boxes(sizes, (12, 12)), torch.tensor([True, False, False, True])

    out = decode_resized(datas, (12, 12), boxes_for=boxes_for)
    plain = decode_resized(datas, (12, 12), mode="crop")
    assert out.shape == (4, 3, 12, 12)
    assert torch.equal(out[1], plain[1]) and torch.equal(out[0], plain[0].flip(-1))


def test_truncated_jpeg_is_refused_before_decoding(datas):
    datas[1] = datas[1][: len(datas[1]) // 2]
    with pytest.raises(PackFormatError, match="image 1: its stored JPEG is truncated"):
        decode_batch(datas, "cpu")


@pytest.mark.cuda
def test_cuda_decode_matches_cpu_within_tolerance(datas):
    # nvjpeg upsamples 4:2:0 chroma otherwise than libjpeg: smooth content agrees
    # closely, noise does not (scripts/check_nvjpeg.py: mean 12.9 on pure noise)
    # (on the H100: 2.4 at 64x64 and 8.5 at 17x9 with this content; larger images agree)
    datas = [_jpeg(8 * w, 8 * h, i, smooth=True) for i, (w, h) in enumerate(SIZES)]
    cpu = decode_batch(datas, "cpu")
    gpu = decode_batch(datas, "cuda")
    for a, b in zip(cpu, gpu):
        assert a.shape == b.shape
        assert (a.int() - b.cpu().int()).abs().float().mean() < 4
    bad = datas[1].clone()
    bad[2:-2] = 0
    with pytest.raises(PackFormatError, match="image 1:"):
        decode_batch([datas[0], bad, datas[2]], "cuda")


def test_resize_images_equals_the_padded_route(datas):
    imgs = decode_batch(datas)
    sizes = sizes_of(imgs)
    assert sizes.tolist() == [[h, w] for w, h in SIZES]
    boxes = RandomResizedCrop(8).sample_boxes(4, sizes[:, 0], sizes[:, 1], torch.Generator())
    flip = torch.tensor([True, False, True, False])
    a = resize_images(imgs, (10, 14), boxes=boxes, flip=flip)
    b = resize_batch(*pad_batch(imgs), (10, 14), boxes=boxes, flip=flip)
    assert torch.equal(a, b)  # on the CPU it is the padded route
    # checked against each image's own size, not the padded batch (64x64)
    bad = torch.tensor([[0, 0, 5, 5]] * 3 + [[0, 0, 10, 12]])
    with pytest.raises(ValueError, match=r"box 3 \[0, 0, 10, 12\] .* leaves the 9x17 image"):
        resize_images(imgs, (10, 14), boxes=bad)


RAGGED = """
import numpy as np, torch, packer.transforms as T, packer.imaging.resample_triton as R
from packer.imaging import jpeg as J
g = torch.Generator().manual_seed(0)
shapes = [(20, 26), (17, 31), (33, 12), (40, 44), (9, 11)]
imgs = [torch.randint(0, 256, (3, h, w), generator=g, dtype=torch.uint8) for h, w in shapes]
sizes = J.sizes_of(imgs)
n = len(imgs)
boxes = T.RandomResizedCrop(8).sample_boxes(n, sizes[:, 0], sizes[:, 1], g)
flip = torch.tensor([True, False, True, False, True])
for size in [(12, 16), (30, 20), (6, 4)]:
    a = J.resize_batch(*J.pad_batch(imgs), size, boxes=boxes, flip=flip)
    table = np.empty((n, 9), np.int64)
    table[:, 0] = [x.data_ptr() for x in imgs]
    table[:, 1:5] = boxes.numpy()
    table[:, 5] = flip.numpy()
    table[:, 6:8] = sizes.numpy()
    table[:, 8] = np.arange(n)
    sc = (float(boxes[:, 2].max()) / size[0], float(boxes[:, 3].max()) / size[1])
    b = R.resample_ragged(torch.from_numpy(table), 3, *size, sc, torch.device("cpu"))
    d = (a.int() - b.int()).abs()
    assert d.max() <= 1 and d.float().mean() < 0.1, (size, d.max())
    old, R.RAGGED_CHUNK = R.RAGGED_CHUNK, 2  # the batch in slices of 2: the same bytes
    c = R.resample_ragged(torch.from_numpy(table), 3, *size, sc, torch.device("cpu"))
    # rows grouped by the patch each needs, each written to its own output row
    scales = (boxes[:, 2:].numpy() / np.array(size)).astype(np.float64)
    order, launches = R.ragged_order(scales)
    R.RAGGED_CHUNK = old
    assert torch.equal(b, c), size
    assert sorted(order.tolist()) == list(range(n)) and launches[-1][1] == n
    assert all(z - a <= 2 for a, z, _, _ in launches)
    e = R.resample_ragged(torch.from_numpy(table[order]), 3, *size, sc, torch.device("cpu"), launches)
    d = (b.int() - e.int()).abs()
    assert d.max() <= 1 and d.float().mean() < 0.01, (size, d.max())
    def square(y, x):  # the larger axis's span; from PARTS_FROM on, the parts kernel's
        return min(max(R._span(16, float(y)), R._span(16, float(x))), R.PARTS_FROM)

    def spans(rows):
        return {square(y, x) for y, x in scales[rows]}

    for a0, z0, sh, sw in launches:  # a launch's rows all need its patch, no larger
        assert spans(order[a0:z0]) == {square(sh, sw)}, (size, launches)
    assert len(launches) >= len(spans(np.arange(n)))
    # the parts kernel (the patch in 64 x 64 parts, a run-time loop) on every row
    f = R.resample_ragged(torch.from_numpy(table), 3, *size, sc, torch.device("cpu"), parts_from=16)
    d = (a.int() - f.int()).abs()
    assert d.max() <= 1 and d.float().mean() < 0.1, (size, d.max())
# boxes far beyond a single patch (18x, 16x) beside small ones: every row through the
# kernels (the big ones through the parts kernel), no padded copy of the batch
wide = [torch.randint(0, 256, (3, h, w), generator=g, dtype=torch.uint8) for h, w in
        [(40, 90), (20, 26), (36, 80), (17, 31)]]
wboxes = torch.tensor([[2, 3, 36, 86], [1, 2, 12, 20], [0, 0, 36, 80], [3, 4, 10, 9]])
wflip = torch.tensor([False, True, True, False])
ref = J.resize_batch(*J.pad_batch(wide), (4, 5), boxes=wboxes, flip=wflip)
called = []
real = R.resample_ragged
def counted(t, *a, **k):
    called.append(sorted(t[:, 8].tolist()))
    return real(t, *a, **k)
def no_pad(imgs):
    raise AssertionError("padded the whole batch")
R.resample_ragged, pad = counted, J.pad_batch
import packer.imaging.jpeg_crop as C
C._ragged_kernels, C.pad_batch = (lambda d: R), no_pad
got = C.resize_images(wide, (4, 5), boxes=wboxes, flip=wflip)
C.pad_batch = pad
assert called == [[0, 1, 2, 3]], called
d = (got.int() - ref.int()).abs()
assert d.max() <= 1 and d.float().mean() < 0.1, d.max()
print("ok")
"""


def test_vectorised_spans_equal_the_kernels_rule():
    pytest.importorskip("triton")
    import packer.imaging.resample_triton as R

    sc = np.concatenate([np.random.default_rng(0).uniform(0.05, 20, 4000), [0.0, 0.8, 1.0, 2.0]])
    assert R._spans(16, sc).tolist() == [R._span(16, float(x)) for x in sc]
    order, launches = R.ragged_order(np.zeros((0, 2)))
    assert len(order) == 0 and launches == []


@pytest.mark.slow
@pytest.mark.xdist_group("triton-interpreter")  # one zygote (helpers.interpreted)
def test_ragged_kernel_matches_the_padded_route_in_the_interpreter():
    # the CUDA kernel that reads each image where nvjpeg left it (a table of addresses),
    # run by Triton's interpreter on the CPU
    pytest.importorskip("triton")
    r = run_interpreted(RAGGED, subprocess_env(TRITON_INTERPRET="1"), timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]


@pytest.mark.cuda
def test_cuda_resize_images_reads_images_in_place(datas):
    imgs = decode_batch(datas, "cuda")
    sizes = sizes_of(imgs)
    boxes = RandomResizedCrop(8).sample_boxes(4, sizes[:, 0], sizes[:, 1], torch.Generator())
    flip = torch.tensor([True, False, True, False])
    a = resize_images(imgs, (24, 20), boxes=boxes, flip=flip)
    b = resize_batch(*pad_batch(imgs), (24, 20), boxes=boxes, flip=flip)
    assert a.is_cuda and (a.int() - b.int()).abs().max() <= 1
    c = resize_images(imgs, (24, 20), mode="crop")
    d = resize_batch(*pad_batch(imgs), (24, 20), mode="crop")
    assert (c.int() - d.int()).abs().max() <= 1


@pytest.mark.cuda
def test_cuda_resize_images_takes_boxes_beyond_the_kernels_patch_alone():
    # a 12 MP photo's near-whole crop to 224 is an ~18x downscale, beyond the kernel's
    # patch: those boxes are resized alone, the others by the kernel, as the padded route
    g = torch.Generator().manual_seed(3)
    shapes = [(400, 900), (60, 80), (300, 700), (50, 70)]
    imgs = [
        torch.randint(0, 256, (3, h, w), generator=g, dtype=torch.uint8).cuda() for h, w in shapes
    ]
    boxes = torch.tensor([[10, 20, 380, 860], [5, 5, 40, 50], [0, 0, 300, 700], [1, 2, 30, 40]])
    flip = torch.tensor([True, False, False, True])
    a = resize_images(imgs, (20, 24), boxes=boxes, flip=flip)
    b = resize_batch(*pad_batch(imgs), (20, 24), boxes=boxes, flip=flip)
    d = (a.int() - b.int()).abs()
    assert a.is_cuda and d.max() <= 1 and d.float().mean() < 0.1


def test_ragged_launches_need_at_most_five_compiled_kernels(monkeypatch):
    # every new (SY, SX) is a Triton compile (seconds; 256 x 256 over a minute) paid
    # when it first appears, often mid-epoch: RandomResizedCrop boxes over 12 MP photos
    # use square patches up to 128 and the parts kernel beyond, and one kernel whatever
    # the table slice's alignment
    pytest.importorskip("triton")
    import packer.imaging.resample_triton as R

    seen = set()

    class Kernel:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            def launch(table, out, oh, ow, **k):
                seen.add((self.name, k.get("SY"), k.get("SX"), k.get("T")))

            return launch

    monkeypatch.setattr(R, "resample_ragged_kernel", Kernel("patch"))
    monkeypatch.setattr(R, "resample_ragged_parts_kernel", Kernel("parts"))
    rng = np.random.default_rng(0)
    area = rng.uniform(0.08, 1.0, 4000) * 4000 * 3000
    ratio = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3), 4000))
    w = np.minimum(np.sqrt(area * ratio), 4000)
    h = np.minimum(np.sqrt(area / ratio), 3000)
    scales = np.concatenate([np.stack([h / 224, w / 224], 1), [[0.3, 0.4], [1.0, 1.2]]])
    _, launches = R.ragged_order(scales)
    table = torch.zeros((len(scales), 9), dtype=torch.int64)
    R.resample_ragged(table, 3, 224, 224, tuple(scales.max(0)), torch.device("cpu"), launches)
    patches = {(sy, sx) for name, sy, sx, _ in seen if name == "patch"}
    assert all(sy == sx < R.PARTS_FROM for sy, sx in patches) and len(patches) <= 4, sorted(seen)
    assert {(n, t) for n, _, _, t in seen if n == "parts"} == {("parts", 64)}, sorted(seen)
    monkeypatch.undo()
    for k in (R.resample_ragged_kernel, R.resample_ragged_parts_kernel):
        assert "table_ptr" in k.do_not_specialize_on_alignment
