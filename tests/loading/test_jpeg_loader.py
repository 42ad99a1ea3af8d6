"""PackLoader on JPEG packs (issue 13 §2), on the CPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms.v2 import functional as F

import packer
from packer.builder.run import BuildConfig, build
from packer.errors import PackFormatError, UsageError
from packer.imaging.jpeg import fit_boxes
from packer.loading.crop import CROP_FRACTION
from packer.loading.order import batch_seed
from packer.transforms import CenterCrop, Compose, RandomHorizontalFlip, RandomResizedCrop

N = 37


@pytest.fixture(scope="module")
def grey(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """N flat grey JPEGs of assorted sizes: image i has value 6 * i, label i % 3."""
    tmp = tmp_path_factory.mktemp("grey")
    for i in range(N):
        w, h = 24 + (i * 7) % 29, 20 + (i * 5) % 23
        d = tmp / "src" / f"c{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (w, h), (6 * i,) * 3).save(d / f"{i:02d}.jpg", quality=95)
    build(tmp / "src", tmp / "pack", BuildConfig(store="jpeg", workers=1))
    return tmp / "pack"


def _ids(images: torch.Tensor) -> list[int]:
    return [round(float(v) / 6) for v in images.float().mean((1, 2, 3))]


def _value(pack, row: int) -> int:
    return int(pack.sources[row].split("/")[1][:2])


def test_every_image_once_per_epoch_and_across_ranks(grey: Path) -> None:
    pack = packer.load(grey)
    want = sorted(_value(pack, r) for r in range(N))
    for epoch in (0, 1):
        seen: list[int] = []
        for rank in range(3):
            ld = packer.PackLoader(
                pack, 5, device="cpu", image_size=8, rank=rank, world_size=3, even_split="trim"
            )
            ld.set_epoch(epoch)
            for x, y in ld:
                assert x.shape[1:] == (3, 8, 8) and x.dtype == torch.uint8
                ids = _ids(x)
                seen += ids
                assert y.tolist() == [
                    pack.labels[[_value(pack, r) for r in range(N)].index(i)] for i in ids
                ]
            assert ld.indices(epoch).tolist() == [
                [_value(pack, r) for r in range(N)].index(i)
                for i in seen[-len(ld.indices(epoch)) :]
            ]
        assert len(seen) == len(set(seen)) == N // 3 * 3
        assert set(seen) <= set(want)


def test_default_crops(grey: Path) -> None:
    pack = packer.load(grey)
    imgs = pack.decode(range(N))
    ev = packer.PackLoader(pack, 8, device="cpu", image_size=10, train=False, shuffle=False)
    x, _ = next(iter(ev))
    for i in range(8):
        hw = imgs[i].shape[1:]
        box = fit_boxes(torch.tensor([list(hw)]), (10, 10), "crop", CROP_FRACTION)[0].tolist()
        assert box[2] == box[3] == round(min(hw) * CROP_FRACTION)
        ref = F.resized_crop(imgs[i], *box, [10, 10], antialias=True)
        assert (ref.int() - x[i].int()).abs().max() <= 2
    tr = packer.PackLoader(pack, 8, device="cpu", image_size=10, shuffle=False, seed=4)
    x, _ = next(iter(tr))
    g = torch.Generator().manual_seed(batch_seed(4, 0, 0, 0))
    hs = torch.tensor([im.shape[1] for im in imgs[:8]])
    ws = torch.tensor([im.shape[2] for im in imgs[:8]])
    boxes = RandomResizedCrop(10).sample_boxes(8, hs, ws, g)
    flip = RandomHorizontalFlip().sample(8, g)
    for i in range(8):
        ref = F.resized_crop(imgs[i], *boxes[i].tolist(), [10, 10], antialias=True)
        ref = ref.flip(-1) if flip[i] else ref
        assert (ref.int() - x[i].int()).abs().max() <= 2
    # the same draws through an explicit transform, and a repeat of the epoch
    same = packer.PackLoader(
        pack,
        8,
        device="cpu",
        shuffle=False,
        seed=4,
        transform=Compose([RandomResizedCrop(10), RandomHorizontalFlip()]),
    )
    assert torch.equal(next(iter(same))[0], x)
    cc = packer.PackLoader(pack, 8, device="cpu", transform=CenterCrop(12), shuffle=False)
    x, _ = next(iter(cc))
    assert x.shape == (8, 3, 12, 12)


def test_state_dict_resumes_mid_epoch(grey: Path) -> None:
    pack = packer.load(grey)
    ld = packer.PackLoader(pack, 4, device="cpu", image_size=8, seed=1)
    it = iter(ld)
    for _ in range(3):
        next(it)
    state = ld.state_dict()
    rest = [x for x, _ in it]
    ld2 = packer.PackLoader(pack, 4, device="cpu", image_size=8, seed=1)
    ld2.load_state_dict(state)
    again = [x for x, _ in ld2]
    assert len(again) == len(rest) > 0
    assert all(torch.equal(a, b) for a, b in zip(rest, again))


def test_usage_errors(grey: Path, packed: Path) -> None:
    with pytest.raises(UsageError, match="a JPEG pack needs an output size"):
        packer.PackLoader(grey, 4, device="cpu")
    with pytest.raises(UsageError, match="image_size is for JPEG packs"):
        packer.PackLoader(packed, 4, device="cpu", image_size=8)
    with pytest.raises(UsageError, match="resident=True is for raw packs"):
        packer.PackLoader(grey, 4, device="cpu", image_size=8, resident=True)


@pytest.mark.parametrize(
    ("size", "message"),
    [
        (2.5, "image_size must be an int S or a pair .* not float 2.5"),
        (True, "image_size must be an int S or a pair .* not bool True"),
        ("8", "image_size must be an int S or a pair .* not str '8'"),
        ((8, 2.5), r"image_size\[1\] must be an integer, not float 2.5"),
        ((8, 8, 8), "image_size must be an int S or a pair"),
        (0, r"image_size must be in \[1, 16385\), not 0"),
        ((8, 10**6), r"image_size\[1\] must be in \[1, 16385\)"),
    ],
)
def test_image_size_is_checked_by_name(grey: Path, size: object, message: str) -> None:
    """A float raised a raw TypeError and True gave 1x1 images."""
    with pytest.raises(UsageError, match=message):
        packer.PackLoader(grey, 4, device="cpu", image_size=size)
    with pytest.raises(UsageError, match="train must be True or False"):
        packer.PackLoader(grey, 4, device="cpu", image_size=8, train=1)
    x, _ = next(iter(packer.PackLoader(grey, 4, device="cpu", image_size=np.int64(6))))
    assert x.shape == (4, 3, 6, 6)
    x, _ = next(iter(packer.PackLoader(grey, 4, device="cpu", image_size=[6, 5])))
    assert x.shape == (4, 3, 6, 5)


def test_decoders_are_imported_before_any_loader_thread_runs(grey: Path, tmp_path: Path) -> None:
    """A loader thread importing a decoder held the module's import lock; garbage
    collection inside that import ran a dead loader's finalizer, which waited for its
    threads, themselves waiting for the lock: a hang. The loader imports its decoders
    on the calling thread before any of its threads starts (in a fresh interpreter: a
    fork of one that has imported torch and torch._dynamo, which the loader's first
    import of tensordict imports on the calling thread too, and nothing of packer,
    torchvision or tensordict)."""
    import textwrap

    from conftest import subprocess_env
    from helpers.interpreted import run_fresh

    code = textwrap.dedent(
        """
        import sys, threading
        seen = []
        class Watch:
            def find_spec(self, name, path=None, target=None):
                seen.append((threading.current_thread().name, name))
                return None
        sys.meta_path.insert(0, Watch())
        import packer
        for decode in ("cpu", "device"):
            ld = packer.PackLoader(sys.argv[1], 4, device="cpu", image_size=8, decode=decode)
            assert sum(len(x) for x, _ in ld) == 37
        print("torchvision.io" in {n for _, n in seen})
        print(sorted({(t, n) for t, n in seen if t != "MainThread"}))
        """
    )
    p = run_fresh(code, [grey], env=subprocess_env(), timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    imported, on_threads = p.stdout.splitlines()[-2:]
    assert imported == "True"  # not vacuous: the decoders were imported in this run
    assert on_threads == "[]"


def test_corrupt_image_is_a_clean_error_in_the_loop(grey: Path, tmp_path: Path) -> None:
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(grey, bad)
    f = bad / "_tensordict" / "offsets.memmap"
    off = np.fromfile(f, dtype="<i8")
    off[9] = 1 << 40
    off.tofile(f)
    ld = packer.PackLoader(bad, 8, device="cpu", image_size=8, shuffle=False)
    it = iter(ld)
    next(it)
    with pytest.raises(PackFormatError, match="image 9: offset 1099511627776"):
        next(it)


@pytest.mark.cuda
def test_cuda_batches_match_cpu_and_errors_are_clean(grey: Path, tmp_path: Path) -> None:
    pack = packer.load(grey)
    for train in (False, True):
        kw = dict(image_size=16, train=train, shuffle=True, seed=3)
        cpu = [x for x, _ in packer.PackLoader(pack, 8, device="cpu", **kw)]
        gpu = [(x, y) for x, y in packer.PackLoader(pack, 8, device="cuda", **kw)]
        assert len(cpu) == len(gpu)
        for a, (b, y) in zip(cpu, gpu):
            assert b.is_cuda and y.is_cuda and a.shape == b.shape
            assert (a.int() - b.cpu().int()).abs().float().mean() < 2
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(grey, bad)
    f = bad / "_tensordict" / "jpeg.memmap"
    p2 = packer.load(grey)
    off, n = int(p2.offsets[3]), int(p2.lengths[3])
    raw = bytearray(f.read_bytes())
    raw[off + 2 : off + n - 2] = bytes(n - 4)  # keep SOI and EOI
    f.write_bytes(bytes(raw))
    ld = packer.PackLoader(bad, 8, device="cuda", image_size=8, shuffle=False)
    with pytest.raises(PackFormatError, match="image 3: its stored JPEG does not decode"):
        list(ld)
    x, _ = next(iter(packer.PackLoader(grey, 8, device="cuda", image_size=8)))
    assert x.is_cuda  # the process and the device still work after the error


# ---- who decodes: in batches on the device, or image by image on the CPU threads


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 photo-like JPEGs of two sizes (4:2:0, quality 90), so decoders can differ."""
    from packer.measure.bench.synth import make_jpeg_tree

    tmp = tmp_path_factory.mktemp("photos")
    make_jpeg_tree(tmp / "a", 12, (61, 47), quality=90, threads=1)
    make_jpeg_tree(tmp / "a" / "more", 12, (40, 52), quality=90, threads=1)
    build(tmp / "a", tmp / "pack", BuildConfig(store="jpeg", workers=1))
    return tmp / "pack"


def _pass(pack: Path, decode: str, **kw) -> list:
    ld = packer.PackLoader(pack, 8, device="cpu", image_size=16, seed=5, decode=decode, **kw)
    return [(x, y) for x, y in ld]


@pytest.mark.parametrize("train", [True, False])
def test_pillow_batches_match_the_batched_decode(photos: Path, train: bool) -> None:
    ref = _pass(photos, "device", train=train)
    for decode in ("cpu", "auto"):  # "auto" on the CPU is image by image
        got = _pass(photos, decode, train=train)
        assert len(got) == len(ref) == 3
        for (a, ya), (b, yb) in zip(ref, got):
            assert torch.equal(ya, yb)  # same rows, same order
            assert a.shape == b.shape and b.dtype == torch.uint8
            d = (a.int() - b.int()).abs().float()
            assert d.mean() < 1.5 and d.max() <= 24, (decode, d.mean(), d.max())
        assert all(
            torch.equal(x, y) for (x, _), (y, _) in zip(got, _pass(photos, decode, train=train))
        )
    # and the same crops: a mirrored batch would differ far more than the decoders do
    flipped = _pass(photos, "cpu")
    assert any(
        (a.int() - b.flip(-1).int()).abs().float().mean() > 5
        for (a, _), (b, _) in zip(ref, flipped)
    )


def test_pillow_path_errors_name_the_image(photos: Path, tmp_path: Path) -> None:
    import shutil

    p = packer.load(photos)
    bad = tmp_path / "bad"
    shutil.copytree(photos, bad)
    f = bad / "_tensordict" / "jpeg.memmap"
    off = int(p.offsets[3])
    raw = bytearray(f.read_bytes())
    raw[off + 2 : off + 40] = bytes(38)  # headers zeroed, SOI and EOI kept
    f.write_bytes(bytes(raw))
    ld = packer.PackLoader(bad, 8, device="cpu", image_size=8, shuffle=False, decode="cpu")
    with pytest.raises(PackFormatError, match="image 3: its stored JPEG does not decode"):
        list(ld)
    bad2 = tmp_path / "bad2"
    shutil.copytree(photos, bad2)
    s = bad2 / "_tensordict" / "sizes.memmap"
    sizes = np.fromfile(s, dtype="<i8")
    sizes[2 * 5] += 1  # image 5's height
    sizes.tofile(s)
    for decode in ("cpu", "device"):
        ld = packer.PackLoader(bad2, 8, device="cpu", image_size=8, shuffle=False, decode=decode)
        with pytest.raises(PackFormatError, match="image 5: its stored JPEG decodes to"):
            list(ld)


def test_damaged_scan_data_and_sizes_are_errors_both_ways(photos: Path, tmp_path: Path) -> None:
    import shutil

    p = packer.load(photos)
    bad = tmp_path / "scan"
    shutil.copytree(photos, bad)
    f = bad / "_tensordict" / "jpeg.memmap"
    off, n = int(p.offsets[7]), int(p.lengths[7])
    raw = bytearray(f.read_bytes())
    junk = np.random.default_rng(0).integers(0, 256, n - 2 - n // 2, dtype=np.uint8)
    raw[off + n // 2 : off + n - 2] = junk.tobytes()  # the second half of the scan
    f.write_bytes(bytes(raw))
    zero = tmp_path / "zero"
    shutil.copytree(photos, zero)
    s = zero / "_tensordict" / "sizes.memmap"
    sizes = np.fromfile(s, dtype="<i8")
    sizes[2 * 6 + 1] = 0  # image 6's width
    sizes.tofile(s)
    for decode in ("cpu", "device"):
        kw = dict(device="cpu", image_size=8, shuffle=False, decode=decode)
        with pytest.raises(PackFormatError, match="image 7: its stored JPEG does not decode"):
            list(packer.PackLoader(bad, 8, **kw))
        # every stored size is range-checked when the pack is opened, not at crop time
        with pytest.raises(PackFormatError, match="image 6: the pack gives its size as 0x"):
            packer.PackLoader(zero, 4, **kw)


def test_cpu_crop_reads_only_its_box(tmp_path: Path) -> None:
    """The box is cut out before resampling: nothing from outside it bleeds in."""
    from packer.imaging.jpeg import decode_crop_cpu

    im = Image.new("RGB", (64, 32))
    im.paste((255, 255, 255), (32, 0, 64, 32))  # black left half, white right half
    buf = tmp_path / "half.jpg"
    im.save(buf, quality=100, subsampling=0)
    data = torch.frombuffer(bytearray(buf.read_bytes()), dtype=torch.uint8)
    out = np.empty((3, 8, 8), np.uint8)
    decode_crop_cpu(data, 0, (32, 64), (0, 0, 32, 32), False, out)  # the black half
    assert out.max() <= 2
    from torchvision.io import decode_jpeg

    ref = F.resized_crop(decode_jpeg(data), 0, 8, 32, 48, [8, 8], antialias=True).flip(-1)
    ref = ref.numpy().astype(int)
    decode_crop_cpu(data, 0, (32, 64), (0, 8, 32, 48), True, out, scaled=False)  # both, mirrored
    assert np.abs(out.astype(int) - ref).max() <= 2
    # at 1/2 scale (box 4x the output): the hard edge within 4/255, the mean within 1/255
    decode_crop_cpu(data, 0, (32, 64), (0, 8, 32, 48), True, out)
    assert np.abs(out.astype(int) - ref).max() <= 4 and np.abs(out.astype(int) - ref).mean() <= 1


def test_decode_usage_errors(photos: Path, packed: Path) -> None:
    with pytest.raises(UsageError, match="decode must be 'auto', 'device' or 'cpu', not 'gpu'"):
        packer.PackLoader(photos, 4, device="cpu", image_size=8, decode="gpu")
    with pytest.raises(UsageError, match="decode= is for JPEG packs"):
        packer.PackLoader(packed, 4, device="cpu", decode="cpu")


@pytest.mark.cuda
def test_cuda_decode_modes_agree(photos: Path) -> None:
    kw = dict(device="cuda", image_size=16, seed=2)
    ref = [(x.cpu(), y.cpu()) for x, y in packer.PackLoader(photos, 8, decode="device", **kw)]
    runs = {m: packer.PackLoader(photos, 8, decode=m, **kw) for m in ("cpu", "auto", "device")}
    for name, ld in runs.items():
        got = [(x, y) for x, y in ld]
        assert len(got) == len(ref)
        for (a, ya), (b, yb) in zip(ref, got):
            assert b.is_cuda and yb.is_cuda and b.shape == a.shape
            assert torch.equal(ya, yb.cpu())
            d = (a.int() - b.cpu().int()).abs().float()
            if name != "cpu":
                assert d.max() == 0  # "auto" is nvjpeg on CUDA; the same pixels each run
            assert d.mean() < 2, (name, d.mean())
