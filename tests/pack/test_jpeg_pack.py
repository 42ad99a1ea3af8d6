"""--store jpeg (issue 13): building, opening and checking JPEG packs (CPU)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_jpeg

import packer
import packer.builder.finalize
import packer.builder.run
from conftest import subprocess_env, write_image
from packer.builder.run import BuildConfig, build
from packer.errors import PackFormatError, UsageError
from packer.imaging.decode import pil_quality

JPEG_FILES = (
    "_tensordict/jpeg.memmap",
    "_tensordict/offsets.memmap",
    "_tensordict/lengths.memmap",
    "_tensordict/sizes.memmap",
    "_tensordict/labels.memmap",
    "_tensordict/meta.json",
    "meta.json",
)
CFG = BuildConfig(store="jpeg", workers=1)


def _chw(im: Image.Image) -> torch.Tensor:
    return torch.from_numpy(np.array(im.convert("RGB"))).permute(2, 0, 1)


def same_pack(a: Path, b: Path) -> None:
    for f in JPEG_FILES:
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    ma, mb = (json.loads((p / "imgpack.json").read_text()) for p in (a, b))
    for m in (ma, mb):
        del m["build"]["created"]
    assert ma == mb


@pytest.fixture
def jpack(image_tree: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "jpack"
    build(image_tree, dst, CFG)
    return dst


def test_round_trip_bytes_and_pixels(image_tree: Path, jpack: Path) -> None:
    pack = packer.load(jpack)
    assert pack.manifest.storage == "jpeg" and len(pack) == 13
    data = pack.read(range(len(pack)))
    for i, rel in enumerate(pack.sources):
        src = image_tree / rel
        stored = bytes(data[i].numpy())
        if src.suffix.lower() in (".jpg", ".jpeg"):
            assert stored == src.read_bytes(), rel  # kept byte for byte
        px = decode_jpeg(data[i], mode=ImageReadMode.RGB)
        assert torch.equal(pack.decode([i])[0], px)
        assert list(px.shape[1:]) == pack.sizes[i].tolist()
        with Image.open(src) as im:
            rgb = im.convert("RGB")
            ref = _chw(rgb)
            again = io.BytesIO()
            rgb.save(again, "JPEG", quality=pil_quality(3))
        assert ref.shape == px.shape, rel
        err = (ref.int() - px.int()).abs().float().mean()
        if src.suffix.lower() in (".jpg", ".jpeg"):
            assert err < 1, rel  # the same file, libjpeg in both
        else:  # JPEG tolerance: what Pillow's own encode at that quality loses, no more
            own = (ref.int() - _chw(Image.open(again)).int()).abs().float().mean()
            assert err <= own + 0.25, rel
    m = json.loads((jpack / "imgpack.json").read_text())
    assert m["storage"] == "jpeg" and m["storage_version"] == 1 and m["quality"] == 3
    assert m["build"]["reencoded"] == 6  # png x2, webp, bmp, gif, tiff
    with pytest.raises(UsageError, match="a JPEG pack stores compressed files"):
        pack.images  # noqa: B018


def _cmyk(path: Path) -> Path:
    write_image(path, (30, 20), seed=3)
    Image.open(path).convert("CMYK").save(path, "JPEG", quality=95)
    return path


def test_reencodes_cmyk_16bit_exif_and_oversize(tmp_path: Path) -> None:
    src = tmp_path / "src" / "c"
    _cmyk(src / "cmyk.jpg")
    a = (np.arange(24 * 32).reshape(24, 32) * 80).astype(np.uint16)
    Image.frombytes("I;16", (32, 24), a.astype("<u2").tobytes()).save(src / "deep.png")
    write_image(src / "rot.jpg", (40, 20), seed=4)
    im = Image.open(src / "rot.jpg")
    exif = im.getexif()
    exif[0x0112] = 6  # rotate 90: upright it is 20 wide, 40 high
    im.save(src / "rot.jpg", "JPEG", exif=exif, quality=95)
    write_image(src / "big.jpg", (300, 100), seed=5)
    write_image(src / "ok.jpg", (50, 40), seed=6)
    ok = (src / "ok.jpg").read_bytes()  # the same, marked as colour stored as RGB (Adobe
    adobe = b"Adobe\x00\x64\x00\x00\x00\x00\x00"  # transform 0), which nvjpeg ignores
    (src / "rgb.jpg").write_bytes(ok[:2] + b"\xff\xee\x00\x0e" + adobe + ok[2:])
    dst = tmp_path / "p"
    build(src.parent, dst, BuildConfig(store="jpeg", max_side=100, workers=1, quality=2))
    pack = packer.load(dst)
    got = dict(zip(pack.sources, pack.sizes.tolist()))
    assert got == {
        "c/big.jpg": [33, 100],
        "c/cmyk.jpg": [20, 30],
        "c/deep.png": [24, 32],
        "c/ok.jpg": [40, 50],
        "c/rgb.jpg": [40, 50],
        "c/rot.jpg": [40, 20],
    }
    data = dict(zip(pack.sources, pack.read(range(6))))
    assert bytes(data["c/ok.jpg"].numpy()) == (src / "ok.jpg").read_bytes()
    for rel, d in data.items():
        assert bytes(d.numpy()) != (src.parent / rel).read_bytes() or rel == "c/ok.jpg"
        px = decode_jpeg(d, mode=ImageReadMode.RGB)
        assert list(px.shape[1:]) == got[rel]
    with Image.open(src / "rgb.jpg") as im:  # re-encoded as YCbCr, libjpeg's colours kept
        rgb = decode_jpeg(data["c/rgb.jpg"], mode=ImageReadMode.RGB)
        assert (_chw(im).int() - rgb.int()).abs().float().mean() < 4
    with Image.open(src / "cmyk.jpg") as im:
        ref = _chw(im)
    cmyk = decode_jpeg(data["c/cmyk.jpg"], mode=ImageReadMode.RGB)
    assert (ref.int() - cmyk.int()).abs().float().mean() < 4
    deep = decode_jpeg(data["c/deep.png"], mode=ImageReadMode.RGB)
    want = torch.from_numpy((a.astype(np.int64) * 255 + 32767) // 65535)
    assert (deep[0].int() - want.int()).abs().float().mean() < 3


def test_options_are_checked() -> None:
    with pytest.raises(UsageError, match=r"BuildConfig\.max_side bounds stored JPEGs"):
        BuildConfig(max_side=64).validate()
    with pytest.raises(UsageError, match=r"BuildConfig\.quality must be 2"):
        BuildConfig(store="jpeg", quality=1).validate()
    with pytest.raises(UsageError, match=r"BuildConfig\.store must be one of raw, jpeg"):
        BuildConfig(store="png").validate()


def test_broken_input_is_skipped_and_listed(image_tree: Path, tmp_path: Path) -> None:
    (image_tree / "dog" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really")
    data = (image_tree / "cat" / "a.jpg").read_bytes()
    (image_tree / "dog" / "cut.jpg").write_bytes(data[: len(data) // 2])  # truncated
    r = build(image_tree, tmp_path / "p", CFG)
    assert r.count == 13
    assert [s["path"] for s in r.skipped] == ["dog/broken.jpg", "dog/cut.jpg"]


STEPS = ["data", "labels", "manifest", "assembled", "journal.jsonl", "plan.json"]


@pytest.mark.parametrize("step", STEPS)
def test_crash_at_every_finalize_step_resumes_to_the_same_pack(
    image_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    (image_tree / "dog" / "broken.jpg").write_bytes(b"not a jpeg")
    build(image_tree, tmp_path / "ref", CFG)
    dst = tmp_path / "out"

    def crash(name: str) -> None:
        if name == step:
            raise RuntimeError(f"crash after {name}")

    monkeypatch.setattr(packer.builder.finalize, "_reached", crash)
    with pytest.raises(RuntimeError, match="crash after"):
        build(image_tree, dst, CFG)
    monkeypatch.undo()
    build(image_tree, dst, CFG)
    same_pack(dst, tmp_path / "ref")
    assert sorted(os.listdir(tmp_path)) == ["imgs", "out", "ref"]


KILL = textwrap.dedent("""
    import os, signal, sys
    from packer.builder.run import BuildConfig, build
    def progress(n):
        os.kill(os.getpid(), signal.SIGKILL)  # after the first journaled chunk
    if __name__ == "__main__":
        build(sys.argv[1], sys.argv[2], BuildConfig(store="jpeg", workers=2), progress=progress)
""")


def test_kill_9_then_rerun_gives_identical_bytes(tmp_path: Path) -> None:
    src = tmp_path / "src" / "a"
    for i in range(300):
        write_image(src / f"{i:03d}.{'png' if i % 7 == 0 else 'jpg'}", (16, 12), seed=i)
    ref = tmp_path / "ref"
    build(src.parent, ref, BuildConfig(store="jpeg", workers=2))
    script = tmp_path / "kill.py"
    script.write_text(KILL)
    dst = tmp_path / "out"
    err = tmp_path / "stderr"
    with open(err, "wb") as f:  # not a pipe: the fork server may hold it after the kill
        p = subprocess.run(
            [sys.executable, str(script), str(src.parent), str(dst)],
            env=subprocess_env(),
            stdout=subprocess.DEVNULL,
            stderr=f,
            timeout=120,
        )
    assert p.returncode == -signal.SIGKILL, err.read_text()[-2000:]
    work = packer.builder.run.work_dir_for(dst)
    assert (work / "journal.jsonl").read_text().count("\n") >= 1
    r = build(src.parent, dst, BuildConfig(store="jpeg", workers=2))
    assert r.resumed > 0
    same_pack(dst, ref)


def _tamper(path: Path, name: str, index: int, value: int) -> None:
    f = path / "_tensordict" / name
    a = np.fromfile(f, dtype="<i8")
    a[index] = value
    a.tofile(f)


@pytest.mark.parametrize(
    ("name", "value"), [("offsets.memmap", 10**9), ("offsets.memmap", -5), ("lengths.memmap", 0)]
)
def test_tampered_offsets_or_lengths_name_the_image(jpack: Path, name: str, value: int) -> None:
    _tamper(jpack, name, 4, value)
    pack = packer.load(jpack)
    with pytest.raises(PackFormatError, match=r"image 4: offset .* leaves the .*-byte JPEG"):
        pack.decode([1, 4])


def test_corrupt_jpeg_names_the_image(jpack: Path) -> None:
    pack = packer.load(jpack)
    off, n = int(pack.offsets[6]), int(pack.lengths[6])
    f = jpack / "_tensordict" / "jpeg.memmap"
    raw = bytearray(f.read_bytes())
    raw[off + 2 : off + n - 2] = bytes(n - 4)  # keep SOI and EOI
    f.write_bytes(bytes(raw))
    with pytest.raises(PackFormatError, match="image 6: its stored JPEG does not decode"):
        packer.load(jpack).decode([5, 6])


def test_a_file_without_its_end_marker_names_the_image(jpack: Path) -> None:
    # nvjpeg decodes a truncated file inside a batch without an error: the reader checks
    # every file's last two bytes (one gather per batch) before decoding
    pack = packer.load(jpack)
    off, n = int(pack.offsets[3]), int(pack.lengths[3])
    del pack
    f = jpack / "_tensordict" / "jpeg.memmap"
    raw = bytearray(f.read_bytes())
    raw[off + n - 1] = 0
    f.write_bytes(bytes(raw))
    pack = packer.load(jpack)
    pack.read([3])  # bytes only: not checked unless asked
    with pytest.raises(PackFormatError, match="image 3: its stored JPEG is truncated"):
        pack.read([1, 3], check_ends=True)
    with pytest.raises(PackFormatError, match="image 3: its stored JPEG is truncated"):
        pack.decode([2, 3])
    assert len(pack.decode([0, 1, 2])) == 3


def test_jpeg_smaller_than_raw_at_full_size(jpack: Path) -> None:
    pack = packer.load(jpack)
    raw = int((pack.sizes[:, 0] * pack.sizes[:, 1] * 3).sum())
    assert pack.jpeg.shape[0] < raw


def test_pil_decode_of_reencoded_bytes_is_upright_rgb(tmp_path: Path) -> None:
    src = tmp_path / "s" / "x"
    write_image(src / "a.png", (20, 10), mode="RGBA", seed=1)
    build(src.parent, tmp_path / "p", CFG)
    pack = packer.load(tmp_path / "p")
    with Image.open(io.BytesIO(bytes(pack.read([0])[0].numpy()))) as im:
        assert im.format == "JPEG" and im.mode == "RGB" and im.size == (20, 10)


def test_verify_checks_bytes_index_and_decodes(image_tree: Path, jpack: Path) -> None:
    from packer.measure.verify import VerifyConfig, verify

    cfg = VerifyConfig(source=image_tree, throughput=False, sample=None)
    r = verify(jpack, cfg)
    assert r.ok, r.checks
    assert [c["name"] for c in r.checks][-2:] == ["decode", "sources"]
    pack = packer.load(jpack)
    off, n = int(pack.offsets[6]), int(pack.lengths[6])
    del pack
    f = jpack / "_tensordict" / "jpeg.memmap"
    raw = bytearray(f.read_bytes())
    raw[off + 2 : off + n - 2] = bytes(n - 4)  # keep SOI and EOI
    f.write_bytes(bytes(raw))
    r = verify(jpack, cfg)
    fails = {c["name"]: c["detail"] for c in r.checks if not c["ok"]}
    assert set(fails) == {"images", "decode", "sources"}
    assert "image 6: its stored JPEG does not decode" in fails["decode"]
    _tamper(jpack, "lengths.memmap", 2, 5)
    r = verify(jpack, VerifyConfig(throughput=False, use_recorded_source=False))
    assert "offsets/lengths/sizes checksum mismatch" in r.checks[2]["detail"]


# ---- a decompression bomb inside a pack: stored sizes and frame headers bounded


@pytest.mark.parametrize(
    ("hw", "shown"),
    [
        ((65000, 65000), "65000x65000"),  # both sides fit a JPEG, 4.2 Gpx over max_pixels
        ((0, 0), "0x0"),
        ((-3, 20), "20x-3"),
        ((1 << 62, 1), f"1x{1 << 62}"),
        ((20, 70000), "70000x20"),  # wider than any JPEG
    ],
)
def test_stored_sizes_are_range_checked_when_opened(
    jpack: Path, hw: tuple[int, int], shown: str
) -> None:
    from packer.measure.verify import VerifyConfig, verify

    _tamper(jpack, "sizes.memmap", 2 * 5, hw[0])
    _tamper(jpack, "sizes.memmap", 2 * 5 + 1, hw[1])
    msg = f"image 5: the pack gives its size as {shown}, outside what this reader allows"
    with pytest.raises(PackFormatError, match=msg):
        packer.load(jpack)
    with pytest.raises(PackFormatError, match=msg):
        packer.PackLoader(jpack, 4, device="cpu", image_size=8)
    r = verify(jpack, VerifyConfig(throughput=False, use_recorded_source=False))
    assert not r.ok and msg in r.checks[-1]["detail"]  # a failed check, not a traceback


def test_stored_sizes_are_checked_against_max_side(image_tree: Path, tmp_path: Path) -> None:
    build(image_tree, tmp_path / "p", BuildConfig(store="jpeg", workers=1, max_side=40))
    pack = packer.load(tmp_path / "p")
    assert int(pack.sizes.max()) == 40
    _tamper(tmp_path / "p", "sizes.memmap", 1, 41)
    with pytest.raises(PackFormatError, match=r"image 0: .* outside .*sides 1 to 40"):
        packer.load(tmp_path / "p")


def _claim(pack: Path, index: int, h: int, w: int) -> None:
    """Make image ``index``'s stored JPEG claim ``w`` x ``h`` in its frame header, its
    bytes' count kept (the pack's index stays as it was)."""
    p = packer.load(pack)
    off, n = int(p.offsets[index]), int(p.lengths[index])
    del p
    f = pack / "_tensordict" / "jpeg.memmap"
    raw = bytearray(f.read_bytes())
    sof = raw.index(b"\xff\xc0", off, off + n)
    raw[sof + 5 : sof + 9] = h.to_bytes(2, "big") + w.to_bytes(2, "big")
    f.write_bytes(bytes(raw))


def test_a_frame_header_claiming_more_than_the_pack_is_never_decoded(
    jpack: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stored JPEG whose header says 4000x4000 where the pack says its real size:
    every reader compares the header with the stored size before a decoder (which
    allocates what the header says: 65000x65000 would be 12.7 GB) sees it."""
    import torchvision.io

    _claim(jpack, 3, 4000, 4000)
    decoded = []
    real = torchvision.io.decode_jpeg

    def spy(data, *a, **kw):
        decoded.append(data)
        return real(data, *a, **kw)

    monkeypatch.setattr(torchvision.io, "decode_jpeg", spy)
    pack = packer.load(jpack)
    h, w = pack.sizes[3].tolist()
    msg = f"image 3: its stored JPEG decodes to 4000x4000, the pack says {w}x{h}"
    with pytest.raises(PackFormatError, match=msg):
        pack.decode([3])
    for decode in ("cpu", "device"):
        for train in (True, False):
            kw = dict(device="cpu", image_size=8, shuffle=False, decode=decode, train=train)
            with pytest.raises(PackFormatError, match=msg):
                list(packer.PackLoader(jpack, 16, **kw))
    assert all(not torch.equal(d, pack.read([3])[0]) for d in decoded)
