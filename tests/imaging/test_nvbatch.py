"""The batched nvImageCodec decoder (packer/imaging/nvbatch.py): one C call a batch.

On the CPU it runs nvImageCodec's CPU backend through the same C helper, what these
tests check: pixels, the size check made before anything is decoded, the errors, the
compile cache, and a JPEG-pack loader fed by it. The CUDA twins run on a GPU."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("nvidia.nvimgcodec")

from helpers.forked import run_code
from packer.errors import PackFormatError
from packer.imaging import nvbatch

if nvbatch.available() is not None:  # no C compiler here
    pytest.skip(nvbatch.available(), allow_module_level=True)

SIZES = [(37, 50), (64, 64), (101, 77), (8, 9)]


@pytest.fixture(scope="module")
def files():
    rng = np.random.default_rng(0)
    datas, refs = [], []
    for h, w in SIZES:
        a = (rng.random((h, w, 3)) * 255).astype(np.uint8)
        b = io.BytesIO()
        Image.fromarray(a).save(b, "JPEG", quality=90)
        datas.append(torch.frombuffer(bytearray(b.getvalue()), dtype=torch.uint8))
        refs.append(np.asarray(Image.open(io.BytesIO(b.getvalue())).convert("RGB")))
    return datas, refs


def _devices():
    out = ["cpu"]
    if torch.cuda.is_available():
        out.append(pytest.param("cuda", marks=pytest.mark.cuda))
    return out


@pytest.mark.parametrize("device", _devices())
def test_pixels_equal_pillow(files, device):
    datas, refs = files
    dec = nvbatch.NvBatchDecoder(device)
    out = dec.decode(datas)
    assert [tuple(o.shape) for o in out] == [(3, h, w) for h, w in SIZES]
    for o, r in zip(out, refs):
        diff = np.abs(o.permute(1, 2, 0).cpu().numpy().astype(int) - r)
        assert diff.mean() <= 1 / 255 * 255 * 0.01  # libjpeg-turbo both: the same pixels
    kept = dec.decode_kept(datas, torch.tensor(SIZES), [10, 11, 12, 13])
    assert len(kept) == 4
    h, p = kept.table[:, 1], kept.table[:, 2]
    assert (h == [s[0] for s in SIZES]).all()
    assert (p % 64 == 0).all() and (p >= [s[1] for s in SIZES]).all()
    # the addresses are each image's planes in one buffer, none overlapping
    starts = kept.table[:, 0]
    assert (np.diff(starts) >= 3 * h[:-1] * p[:-1]).all()


def test_a_size_the_pack_does_not_record_is_refused_before_decoding(files):
    datas, _ = files
    dec = nvbatch.NvBatchDecoder("cpu")
    wrong = torch.tensor(SIZES)
    wrong[2] = torch.tensor([101, 76])
    with pytest.raises(
        PackFormatError, match=r"image 12: .*decodes to 77x101, the pack says 76x101"
    ):
        dec.decode_kept(datas, wrong, [10, 11, 12, 13])


def test_an_unreadable_file_is_named(files):
    datas, _ = files
    junk = torch.tensor([0xFF, 0xD8, 1, 2, 3, 4, 0xFF, 0xD9], dtype=torch.uint8)
    dec = nvbatch.NvBatchDecoder("cpu")
    with pytest.raises(PackFormatError, match=r"image 7: .*does not decode"):
        dec.decode_kept([datas[0], junk], torch.tensor([SIZES[0], (4, 4)]), [6, 7])
    # and the decoder still works after a refused batch
    assert len(dec.decode(datas[:2])) == 2


def test_batches_larger_than_one_call_are_split(files):
    datas, _ = files
    dec = nvbatch.NvBatchDecoder("cpu", capacity=3)
    many = datas * 3
    out = dec.decode(many)
    assert [tuple(o.shape[1:]) for o in out] == SIZES * 3
    assert all(torch.equal(out[k], out[k + 4]) for k in range(4))


# Each command below runs in a fork of this test process (tests/helpers/forked.py: no
# fresh import of torch, about 3 CPU-seconds a process), its nvbatch as a fresh
# interpreter's: no helper loaded and no failure remembered (this process has loaded its
# own at import, above). The compiler ($CC) and the cache folder ($XDG_CACHE_HOME) are
# read from the child's environment at the call.
_FRESH = "from packer.imaging import nvbatch\nnvbatch._lib = nvbatch._why = None\n"


def test_no_compiler_says_why_and_changes_nothing(tmp_path):
    code = _FRESH + (
        "from packer.imaging.decoders_split import nvimgcodec_batched; "
        "print(nvbatch.available()); "
        "import packer.errors as E\n"
        "try:\n nvimgcodec_batched('cpu')\nexcept E.UsageError as e:\n print('usage:', e)"
    )
    env = dict(os.environ, CC=str(tmp_path / "no-such-cc"), XDG_CACHE_HOME=str(tmp_path))
    got = run_code(code, env=env, timeout=120)
    assert got.returncode == 0, got.stderr
    lines = got.stdout.strip().splitlines()
    assert "compiling the batched nvImageCodec helper failed" in lines[0]
    assert lines[1].startswith("usage:") and "install imgpack[gpu] and a C compiler" in lines[1]
    assert not list(tmp_path.glob("imgpack/*.so"))  # nothing half-made left behind


@pytest.mark.slow
def test_the_helper_is_compiled_once_and_cached_per_user(tmp_path):
    code = _FRESH + "nvbatch.library(); print('ok')"
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    made = []
    for _ in range(2):
        got = run_code(code, env=env, timeout=120)
        assert got.stdout.strip() == "ok", got.stderr
        made.append({p.name: p.stat().st_ino for p in (tmp_path / "imgpack").glob("*.so")})
    sos = list((tmp_path / "imgpack").glob("nvbatch-*.so"))
    assert len(sos) == 1
    assert made[0] == made[1]  # the second process loaded the first one's file
    assert (tmp_path / "imgpack").stat().st_mode & 0o077 == 0  # this user's alone
    assert not list((tmp_path / "imgpack").glob(".nvbatch-*"))


def test_a_jpeg_pack_loader_fed_by_it(tmp_path):
    import packer
    from packer.imaging.decoders_split import nvimgcodec_batched

    src = tmp_path / "src"
    rng = np.random.default_rng(1)
    for c in ("a", "b"):
        (src / c).mkdir(parents=True)
        for i in range(10):
            a = (rng.random((40 + i, 50 + 2 * i, 3)) * 255).astype(np.uint8)
            Image.fromarray(a).save(src / c / f"{i}.jpg", quality=90)
    pack = tmp_path / "pack"
    from packer.builder.run import BuildConfig, build

    build(src, pack, BuildConfig(store="jpeg", workers=1))
    p = packer.load(pack)
    kw = dict(device="cpu", image_size=32, shuffle=True, seed=3)
    base = packer.PackLoader(p, 8, decode="device", **kw)
    ours = packer.PackLoader(p, 8, decode=nvimgcodec_batched("cpu"), **kw)
    seen = []
    for (xa, ya), (xb, yb) in zip(base, ours, strict=True):
        assert torch.equal(ya, yb)
        assert (xa.float() - xb.float()).abs().mean() <= 1.0  # the same crops, same pixels
        seen.append(len(yb))
    assert sum(seen) == 20
    assert "nvimgcodec-batched(cpu)" in ours.decode_path


def test_only_the_box_is_decoded_and_equals_the_whole_images_crop(files):
    datas, refs = files
    dec = nvbatch.NvBatchDecoder("cpu", roi=True)
    boxes = torch.tensor([[3, 5, 20, 30], [0, 0, 64, 64], [50, 10, 51, 60], [2, 3, 6, 6]])
    kept = dec.decode_kept(datas, torch.tensor(SIZES), [0, 1, 2, 3], boxes=boxes)
    assert kept.sizes.tolist() == boxes[:, 2:].tolist()
    for img, ref, (t, l, h, w) in zip(kept.tensors(), refs, boxes.tolist()):  # noqa: E741
        want = ref[t : t + h, l : l + w].astype(int)
        got = img.permute(1, 2, 0).numpy().astype(int)
        assert got.shape == want.shape
        assert np.abs(got - want).mean() <= 1.0  # the region's blocks alone: ≤ 1/255 mean
    with pytest.raises(ValueError, match="box"):
        dec.decode_kept(datas, torch.tensor(SIZES), [0, 1, 2, 3], boxes=boxes + 40)


def test_a_loader_decoding_only_the_boxes(tmp_path):
    import packer
    from packer.imaging.decoders_split import nvimgcodec_batched

    src = tmp_path / "src"
    rng = np.random.default_rng(2)
    for c in ("a", "b"):
        (src / c).mkdir(parents=True)
        for i in range(6):
            a = (rng.random((60 + i, 70 + 3 * i, 3)) * 255).astype(np.uint8)
            Image.fromarray(a).save(src / c / f"{i}.jpg", quality=90)
    from packer.builder.run import BuildConfig, build

    build(src, tmp_path / "pack", BuildConfig(store="jpeg", workers=1))
    p = packer.load(tmp_path / "pack")
    kw = dict(device="cpu", image_size=24, shuffle=True, seed=5)
    whole = packer.PackLoader(p, 4, decode=nvimgcodec_batched("cpu"), **kw)
    boxes = packer.PackLoader(p, 4, decode=nvimgcodec_batched("cpu", roi=True), **kw)
    for (xa, ya), (xb, yb) in zip(whole, boxes, strict=True):
        assert torch.equal(ya, yb)
        assert (xa.float() - xb.float()).abs().mean() <= 1.0
    assert "nvimgcodec-batched(cpu): roi" in boxes.decode_path


@pytest.mark.parametrize("load", [0.0, -0.5, 1.5])
def test_an_engine_share_outside_0_1_is_refused(load):
    with pytest.raises(ValueError, match=r"hw_load must be in \(0, 1\]"):
        nvbatch.NvBatchDecoder("cpu", hw_load=load)


def test_a_fixed_engine_share_and_threads_decode_the_same_pixels(files):
    """hw_load and threads reach nvImageCodec's decoder (on the CPU backend they change
    nothing in the pixels; on CUDA they split a batch between the engines and the CUDA
    decoder, as DALI's hw_decoder_load)."""
    datas, _ = files
    sizes = torch.tensor(SIZES)
    a = nvbatch.NvBatchDecoder("cpu").decode(datas, sizes=sizes)
    b = nvbatch.NvBatchDecoder("cpu", hw_load=0.65, threads=2).decode(datas, sizes=sizes)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
