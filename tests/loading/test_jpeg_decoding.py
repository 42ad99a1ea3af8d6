"""Who decodes a JPEG pack's batches (packer.loading.jpeg_pass.Decoding): the decoder
chosen from ``decode=``, the ROI-fused crop and its fallback to full decode + crop, and
what the loader says ran. CPU twins of the CUDA path (a decoder with ROI, on the CPU);
the CUDA checks at the end are skipped without a GPU."""

from __future__ import annotations

import shutil
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import packer
from helpers.gpu_decoders import default_lanes, runnable
from packer.builder.run import BuildConfig, build
from packer.errors import PackFormatError, UsageError
from packer.imaging import decoders as D
from packer.imaging.decoders_split import best_decoder
from packer.imaging.jpeg_crop import _planes, resize_images
from packer.loading.jpeg_pass import decoding_for

N = 29
CPU = torch.device("cpu")
CUDA = torch.device("cuda")


@pytest.fixture(scope="module")
def grey(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """N flat grey JPEGs of assorted sizes: image i has value 8 * i (labels i % 2)."""
    tmp = tmp_path_factory.mktemp("grey")
    for i in range(N):
        w, h = 20 + (i * 7) % 31, 18 + (i * 5) % 27
        d = tmp / "src" / f"c{i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (w, h), (8 * i,) * 3).save(d / f"{i:02d}.jpg", quality=95)
    build(tmp / "src", tmp / "pack", BuildConfig(store="jpeg", workers=1))
    return tmp / "pack"


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from packer.measure.bench.synth import make_jpeg_tree

    tmp = tmp_path_factory.mktemp("photos")
    make_jpeg_tree(tmp / "a", 10, (61, 47), quality=90, threads=1)
    make_jpeg_tree(tmp / "a" / "more", 10, (40, 52), quality=90, threads=1)
    build(tmp / "a", tmp / "pack", BuildConfig(store="jpeg", workers=1))
    return tmp / "pack"


class RoiCpu(D.CpuDecoder):
    """A CPU decoder that says it decodes regions (whole, then cropped: the same pixels
    a region decoder gives), counting its calls; ``works`` False: its ROI probe finds
    ROI does not work here, as nvImageCodec's does on some versions."""

    name = "roi-cpu"
    supports_roi = True

    def __init__(self, works: bool = True) -> None:
        super().__init__(CPU, threads=0)
        self.works, self.calls, self.boxes = works, {"rois": 0, "whole": 0}, []
        self._path: str | None = None

    @property
    def roi_path(self) -> str:
        return self._path or "roi (not yet probed)"

    def _decode(self, datas, names):
        self.calls["whole"] += 1
        return super()._decode(datas, names)

    def _decode_rois(self, datas, boxes, names, hw):
        self.calls["rois"] += 1
        self.boxes.append(boxes.copy())
        self._path = "roi" if self.works else "full+crop"
        return super()._decode_rois(datas, boxes, names, hw)


def _batches(pack: Path, decode, **kw) -> list[tuple[torch.Tensor, torch.Tensor]]:
    ld = packer.PackLoader(pack, 8, device="cpu", image_size=12, seed=4, decode=decode, **kw)
    return [(x, y) for x, y in ld]


# ---------------------------------------------------------------- choosing the decoder


def _block(monkeypatch, *modules: str) -> None:
    for m in modules:
        monkeypatch.setitem(sys.modules, m, None)


def test_decode_modes_pick_the_decoder(monkeypatch) -> None:
    assert decoding_for("cpu", CPU) is None and decoding_for("auto", CPU) is None
    assert decoding_for("cpu", CUDA) is None
    d = decoding_for("device", CPU)
    assert d.decoder is None and d.name == "cpu" and d.path == "cpu: not yet run"
    assert isinstance(d.for_pass(None), D.CpuDecoder)
    # on CUDA: the chain, quietly, each missing decoder passed over
    _block(monkeypatch, "nvidia.nvimgcodec", "torchcodec", "torchcodec.decoders")
    for mode in ("auto", "device"):
        d = decoding_for(mode, CUDA)
        assert d.name == "torchvision" and d.decoder.device.type == "cuda"
        assert [p.split(":")[0] for p in d.decoder.passed_over] == ["torchcodec"]
    assert decoding_for("torchvision", CUDA).name == "torchvision"
    with pytest.raises(UsageError, match=r"decoder 'nvimgcodec' cannot run here .*imgpack\[gpu\]"):
        decoding_for("nvimgcodec", CUDA)
    with pytest.raises(UsageError, match=r"decoder 'torchcodec' cannot run here"):
        decoding_for("torchcodec", CUDA)


def test_nvimgcodec_is_asked_for_pitched_output_and_comes_last(monkeypatch) -> None:
    seen = {}

    def fake(device, **opts):
        seen.update(opts)
        raise D.Unavailable("not here (test)")

    monkeypatch.setitem(D._MAKERS, "nvimgcodec", fake)
    auto = decoding_for("auto", CUDA).name
    assert auto in ("torchcodec", "torchvision", "torchcodec+torchvision") and seen == {}
    _block(monkeypatch, "torchcodec", "torchcodec.decoders", "torchvision.io")
    with pytest.raises(UsageError, match=r"no JPEG decoder runs on cuda"):
        decoding_for("auto", CUDA)
    assert seen["pitched"] is True
    with pytest.raises(UsageError, match=r"decoder 'nvimgcodec' cannot run here"):
        decoding_for("nvimgcodec", CUDA)


def test_decode_argument_errors(grey: Path) -> None:
    with pytest.raises(UsageError, match=r"decode must be 'auto', .* not 'gpu' \(or a GPU "):
        packer.PackLoader(grey, 4, device="cpu", image_size=8, decode="gpu")
    with pytest.raises(
        UsageError, match=r"decode= decodes on cuda, but the loader's device is cpu"
    ):
        packer.PackLoader(grey, 4, device="cpu", image_size=8, decode=D.get_decoder("cuda"))


# ---------------------------------------------------------------- the ROI-fused crop


@pytest.mark.parametrize("train", [True, False])
def test_roi_path_gives_the_full_decode_paths_batches(photos: Path, train: bool) -> None:
    ref = _batches(photos, "device", train=train)
    dec = RoiCpu()
    got = _batches(photos, dec, train=train)
    assert dec.calls == {"rois": len(ref), "whole": len(ref)}  # RoiCpu: whole, then its box
    assert len(got) == len(ref)
    for (a, ya), (b, yb) in zip(ref, got):
        assert torch.equal(ya, yb) and a.shape == b.shape
        d = (a.int() - b.int()).abs().float()
        assert d.mean() <= 1.0, float(d.mean())  # resampling rounding only


def test_roi_boxes_are_the_seeds_boxes(photos: Path) -> None:
    """The decoder is asked for the boxes drawn on the host from the stored sizes, the
    same whichever way decodes: two loaders of one seed ask for the same ones, each in
    its image."""
    pack = packer.load(photos)
    a, b = RoiCpu(), RoiCpu()
    _batches(photos, a)
    _batches(photos, b)
    assert len(a.boxes) == 3 and all(np.array_equal(x, y) for x, y in zip(a.boxes, b.boxes))
    ld = packer.PackLoader(photos, 8, device="cpu", image_size=12, seed=4)
    rows = ld.indices(0).numpy()
    hw = pack.sizes.numpy()[rows]
    boxes = np.concatenate(a.boxes)
    assert (boxes[:, 0] + boxes[:, 2] <= hw[:, 0]).all() and (boxes[:, 2:] >= 1).all()
    assert (boxes[:, 1] + boxes[:, 3] <= hw[:, 1]).all()


def test_roi_that_does_not_work_falls_back_to_full_decode_and_says_so(photos: Path) -> None:
    ref = _batches(photos, "device")
    dec = RoiCpu(works=False)
    ld = packer.PackLoader(photos, 8, device="cpu", image_size=12, seed=4, decode=dec)
    assert ld.decode_path == "roi-cpu: not yet run"
    got = [(x, y) for x, y in ld]
    # the probe batch's crops come from whole decodes; every later batch is whole
    assert dec.calls == {"rois": 1, "whole": len(ref)}
    assert ld.decode_path == "roi-cpu: full+crop"
    assert "decode='roi-cpu: full+crop'" in repr(ld) and "image_size=(12, 12)" in repr(ld)
    for (a, _), (b, _) in zip(ref, got):
        assert (a.int() - b.int()).abs().float().mean() <= 1.0


def test_the_loader_says_which_path_ran(photos: Path, grey: Path) -> None:
    ld = packer.PackLoader(photos, 8, device="cpu", image_size=12, decode=RoiCpu())
    next(iter(ld))
    assert ld.decode_path == "roi-cpu: roi"
    assert "decode='roi-cpu: roi'" in repr(ld)
    ld = packer.PackLoader(photos, 8, device="cpu", image_size=12, decode="device")
    next(iter(ld))
    assert ld.decode_path == "cpu: full+crop"
    ld = packer.PackLoader(photos, 8, device="cpu", image_size=12)
    assert ld.decode_path == "cpu threads: decode + crop per image"
    raw = Path(str(grey) + "_raw")
    if not raw.exists():
        build(Path(grey).parent / "src", raw, BuildConfig(size=(8, 8), workers=1))
    ld = packer.PackLoader(raw, 8, device="cpu")
    assert ld.decode_path is None and "decode=" not in repr(ld)
    assert repr(ld).startswith(f"PackLoader({str(raw)!r}, batch_size=8, device='cpu'")


def test_every_image_once_per_epoch_through_roi(grey: Path) -> None:
    pack = packer.load(grey)
    value = [int(s.split("/")[1][:2]) for s in pack.sources]
    for epoch in (0, 1):
        ld = packer.PackLoader(grey, 6, device="cpu", image_size=8, decode=RoiCpu())
        ld.set_epoch(epoch)
        seen = []
        for x, y in ld:
            ids = [round(float(v) / 8) for v in x.float().mean((1, 2, 3))]
            assert y.tolist() == [pack.labels[value.index(i)] for i in ids]
            seen += ids
        assert sorted(seen) == sorted(value)


def test_corrupt_and_truncated_bytes_name_the_image_through_roi(
    photos: Path, tmp_path: Path
) -> None:
    p = packer.load(photos)

    def emptied(raw: bytearray, off: int, n: int) -> None:
        raw[off + 2 : off + n - 2] = bytes(n - 4)  # SOI and EOI kept, nothing between

    def cut(raw: bytearray, off: int, n: int) -> None:
        raw[off + n - 2 : off + n] = b"\x00\x00"  # no end-of-image marker

    cases = ((5, emptied, "image 5: its stored JPEG does not decode"), (11, cut, "image 11: "))
    for row, damage, match in cases:
        bad = tmp_path / f"bad{row}"
        shutil.copytree(photos, bad)
        f = bad / "_tensordict" / "jpeg.memmap"
        raw = bytearray(f.read_bytes())
        damage(raw, int(p.offsets[row]), int(p.lengths[row]))
        f.write_bytes(bytes(raw))
        dec = RoiCpu()
        ld = packer.PackLoader(bad, 8, device="cpu", image_size=8, shuffle=False, decode=dec)
        it = iter(ld)
        for _ in range(row // 8):
            next(it)
        with pytest.raises(PackFormatError, match=match):
            next(it)


# ---------------------------------------------------------------- several decoders at once


class Refusing(RoiCpu):
    """A region decoder that refuses every batch holding an image of ``refuse`` bytes
    (as the hardware engines refuse a progressive JPEG)."""

    def __init__(self, refuse: int) -> None:
        super().__init__()
        self.refuse = refuse

    def _decode_rois(self, datas, boxes, names, hw):
        if any(len(d) % self.refuse == 0 for d in datas):
            raise PackFormatError("image 0: refused (test)")
        return super()._decode_rois(datas, boxes, names, hw)


def test_best_decoder_takes_the_measured_order(monkeypatch) -> None:
    assert best_decoder("cpu").name == "cpu"
    made = []
    ready = [RoiCpu(), RoiCpu()]  # made while torchvision.io imports

    def fake(device, **opts):
        made.append(opts)
        dec = ready.pop()
        dec.device = torch.device(device)
        return dec

    monkeypatch.setitem(D._MAKERS, "nvimgcodec", fake)
    fake_tc = types.ModuleType("torchcodec.decoders")
    fake_tc.decode_jpeg = lambda datas, mode, device: [torch.zeros(3, 1, 1)] * len(datas)
    monkeypatch.setitem(sys.modules, "torchcodec", types.ModuleType("torchcodec"))
    monkeypatch.setitem(sys.modules, "torchcodec.decoders", fake_tc)
    assert best_decoder(CUDA, pitched=True).name == "torchcodec" and made == []
    _block(monkeypatch, "torchcodec", "torchcodec.decoders")
    dec = best_decoder(CUDA, pitched=True)
    assert dec.name == "torchvision" and [p.split(":")[0] for p in dec.passed_over] == [
        "torchcodec"
    ]
    _block(monkeypatch, "torchvision.io")
    dec = best_decoder(CUDA, pitched=True)
    assert dec.name == "roi-cpu" and made == [{"pitched": True}]


# ---------------------------------------------------------------- pitched decoder output


def test_planes_reads_padded_rows_in_place() -> None:
    buf = torch.arange(3 * 5 * 16, dtype=torch.int64).remainder(251).to(torch.uint8)
    x = buf.view(3, 5, 16)[:, :, :11]  # rows padded from 11 to 16
    assert not x.is_contiguous()
    assert _planes(x, 0, CPU) == (x.data_ptr(), 5, 16)
    y = torch.zeros(3, 4, 7, dtype=torch.uint8)
    assert _planes(y, 0, CPU) == (y.data_ptr(), 4, 7)
    with pytest.raises(ValueError, match=r"image 2 must be a uint8 .* whole-row strides"):
        _planes(y.permute(0, 2, 1), 2, CPU)
    with pytest.raises(ValueError, match="image 1 must be"):
        _planes(torch.zeros(3, 4, 7, 2, dtype=torch.uint8)[..., 0], 1, CPU)
    # the CPU way pads them into a batch: the same result as the contiguous copy
    boxes = torch.tensor([[1, 2, 3, 8]])
    a = resize_images([x], (4, 4), boxes=boxes)
    b = resize_images([x.contiguous()], (4, 4), boxes=boxes)
    assert torch.equal(a, b)


# ---------------------------------------------------------------- CUDA


@pytest.mark.cuda
def test_cuda_pitched_images_resize_as_contiguous() -> None:
    buf = torch.randint(0, 256, (3 * 40 * 64,), dtype=torch.uint8, device="cuda")
    x = buf.view(3, 40, 64)[:, :, :50]
    boxes = torch.tensor([[3, 4, 30, 40]])
    a = resize_images([x], (16, 16), boxes=boxes)
    b = resize_images([x.contiguous()], (16, 16), boxes=boxes)
    assert torch.equal(a, b)


def _cuda_decoders() -> list[str]:
    return runnable(("nvimgcodec", "torchcodec", "torchvision"))


@pytest.mark.cuda
def test_cuda_loader_each_decoder_against_the_cpu(photos: Path, grey: Path) -> None:
    """Every decoder that runs here: the path it took is said, every image comes once an
    epoch, and the pixels are the CPU loader's within 2/255 mean (decoder and resampling
    rounding; the ROI path without fancy upsampling within that)."""
    kw = dict(image_size=12, seed=4)
    ref = [(x, y) for x, y in packer.PackLoader(photos, 8, device="cpu", decode="device", **kw)]
    names = _cuda_decoders()
    auto = packer.PackLoader(photos, 8, device="cuda", **kw)
    expect = "; ".join(f"{n}: not yet run" for n in default_lanes())
    assert auto.decode_path == expect, auto.decode_path
    pack = packer.load(grey)
    value = sorted(int(s.split("/")[1][:2]) for s in pack.sources)
    for name in ["auto", *names]:
        ld = packer.PackLoader(photos, 8, device="cuda", decode=name, **kw)
        got = [(x, y) for x, y in ld]
        if name != "auto":
            assert ld.decode_path.split(": ")[0] == name
            assert ld.decode_path.split(": ")[1] in ROI_WAYS
            assert (name == "nvimgcodec") == ("roi" in ld.decode_path), ld.decode_path
        assert len(got) == len(ref)
        for (a, ya), (b, yb) in zip(ref, got):
            assert b.is_cuda and torch.equal(ya, yb.cpu())
            d = (a.int() - b.cpu().int()).abs().float().mean()
            assert d <= 2.0, (name, float(d))
        seen = []
        for x, _ in packer.PackLoader(grey, 6, device="cuda", image_size=8, decode=name):
            seen += [round(float(v) / 8) for v in x.float().mean((1, 2, 3)).cpu()]
        assert sorted(seen) == value, name


ROI_WAYS = ("roi", "roi (no fancy upsampling)", "full+crop")


@pytest.mark.cuda
def test_cuda_nvimgcodec_kept_buffers_give_the_batches_of_fresh_ones(photos: Path) -> None:
    """The loader's nvImageCodec lanes decode into kept buffers: the same batches, pixel
    for pixel, as the same decoders allocating afresh, over two epochs (a buffer reused
    while its crop still read it would show), and the buffers were in fact reused."""
    pytest.importorskip("nvidia.nvimgcodec")
    from packer.imaging.decoders_nvimgcodec import NvImageCodecDecoder
    from packer.imaging.decoders_split import nvimgcodec_lanes

    kept = nvimgcodec_lanes("cuda", 2)
    fresh = [
        NvImageCodecDecoder("cuda", backends=d.backends, pitched=True, roi=False) for d in kept
    ]
    kw = dict(image_size=12, seed=4)
    a = packer.PackLoader(photos, 4, device="cuda", decode=kept, **kw)
    b = packer.PackLoader(photos, 4, device="cuda", decode=fresh, **kw)
    for epoch in range(2):
        a.set_epoch(epoch)
        b.set_epoch(epoch)
        for (x, y), (u, v) in zip(a, b, strict=True):
            assert torch.equal(x, u) and torch.equal(y, v)
    assert sum(d.reused for d in kept) > 0
    assert all(d.reused == 0 for d in fresh)
