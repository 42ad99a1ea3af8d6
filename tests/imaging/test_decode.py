from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import write_bomb_jpeg, write_cut_jpeg, write_image
from packer.builder.run import BuildConfig, build
from packer.compress import CompressConfig, compress
from packer.errors import DecodeError, NoUsableImagesError
from packer.imaging.decode import (
    ResizeSpec,
    decode,
    jpeg_for_pack,
    load_resized,
    open_image,
)


@pytest.mark.parametrize("mode", ["crop", "stretch", "pad"])
@pytest.mark.parametrize("size", [(4000, 50), (1, 1), (64, 48), (48, 64)])
def test_output_shape_for_any_size(tmp_path: Path, mode: str, size: tuple[int, int]) -> None:
    p = write_image(tmp_path / "x.png", size)
    out = decode(str(p), ResizeSpec(32, 24, mode))
    assert out.shape == (3, 24, 32) and out.dtype == np.uint8


def test_pad_letterboxes_with_black(tmp_path: Path) -> None:
    p = tmp_path / "white.png"
    Image.new("RGB", (100, 50), (255, 255, 255)).save(p)
    out = decode(str(p), ResizeSpec(40, 40, "pad"))
    assert out[:, :9].max() == 0 and out[:, -9:].max() == 0  # 40x20 image centred, rows 10..29
    assert out[:, 12:28].min() == 255


def test_crop_takes_the_centre(tmp_path: Path) -> None:
    a = np.zeros((20, 60, 3), np.uint8)
    a[:, 16:44] = 255  # white centre third, plus the filter's reach of 2 px
    Image.fromarray(a).save(tmp_path / "c.png")
    out = decode(str(tmp_path / "c.png"), ResizeSpec(10, 10, "crop"))
    assert out.min() == 255


def test_exif_rotation_applied(tmp_path: Path) -> None:
    a = np.zeros((20, 40, 3), np.uint8)
    a[:, :20] = 255  # left half white, stored landscape
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90° clockwise to display
    Image.fromarray(a).save(tmp_path / "r.jpg", exif=exif, quality=100)
    out = decode(str(tmp_path / "r.jpg"), ResizeSpec(20, 40, "stretch"))
    # displayed portrait: the white left half becomes the top half
    assert out[:, :18].mean() > 200 and out[:, 22:].mean() < 50


def test_alpha_flattened_onto_black(tmp_path: Path) -> None:
    a = np.zeros((10, 10, 4), np.uint8)
    a[..., :3] = 200
    a[:, :5, 3] = 0  # left half transparent
    a[:, 5:, 3] = 255
    Image.fromarray(a, "RGBA").save(tmp_path / "a.png")
    out = decode(str(tmp_path / "a.png"), ResizeSpec(10, 10, "stretch"))
    assert out[:, :, :5].max() == 0 and out[:, :, 5:].min() == 200


def test_16bit_scaled_not_clipped(tmp_path: Path) -> None:
    a = np.array([[0, 1000, 32768, 65535]], dtype=np.uint16)
    Image.fromarray(a).save(tmp_path / "g16.png")
    assert Image.open(tmp_path / "g16.png").mode.startswith("I")
    out = decode(str(tmp_path / "g16.png"), ResizeSpec(4, 1, "stretch"))
    assert out[0, 0].tolist() == [0, 4, 128, 255]


@pytest.mark.parametrize("mode", ["L", "P", "CMYK", "LA", "1"])
def test_odd_modes_become_rgb(tmp_path: Path, mode: str) -> None:
    fmt = "JPEG" if mode == "CMYK" else "PNG"
    p = write_image(tmp_path / f"x.{fmt.lower()}", (30, 20), mode=mode, fmt=fmt)
    out = decode(str(p), ResizeSpec(30, 20, "stretch"))
    assert out.shape == (3, 20, 30)
    if mode in ("L", "LA", "1"):
        assert (out[0] == out[1]).all() and (out[1] == out[2]).all()


@pytest.mark.parametrize(
    "content, reason",
    [
        (b"", "not an image"),
        (b"hello, not an image", "not an image"),
    ],
)
def test_unusable_files(tmp_path: Path, content: bytes, reason: str) -> None:
    (tmp_path / "bad.jpg").write_bytes(content)
    with pytest.raises(DecodeError, match=reason):
        decode(str(tmp_path / "bad.jpg"), ResizeSpec(8, 8))


def test_truncated_jpeg_fails(tmp_path: Path) -> None:
    p = write_image(tmp_path / "t.jpg", (200, 150), quality=95)
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(DecodeError):
        decode(str(p), ResizeSpec(8, 8))


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")  # Image.open's
@pytest.mark.parametrize("progressive", [False, True])
def test_a_jpeg_too_short_for_its_frame_is_corrupt(tmp_path: Path, progressive: bool) -> None:
    """674 bytes whose header claims 65000x1500 (under --max-pixels): libjpeg decodes
    it with a warning Pillow drops, as a grey image. Refused from the header and the
    file's size, before decoding, by both the raw and the JPEG-pack decode."""
    p = write_bomb_jpeg(tmp_path / "short.jpg")
    if progressive:  # the same frame claim on a progressive file
        data = bytearray(p.read_bytes())
        data[data.find(b"\xff\xc0") + 1] = 0xC2
        p.write_bytes(bytes(data))
    with Image.open(p) as im:
        assert im.size == (65000, 1500)
    for run in (
        lambda: decode(str(p), ResizeSpec(8, 8)),
        lambda: jpeg_for_pack(str(p), None, 3),
    ):
        with pytest.raises(DecodeError, match=r"corrupt JPEG data: premature end of data .*"):
            run()


@pytest.mark.parametrize("keep", [0.3, 0.6, 0.95])
@pytest.mark.parametrize("size", [(8, 8), (120, 90)])  # draft (1/8 DCT scale) and full
def test_a_jpeg_whose_image_data_stop_early_is_corrupt(
    tmp_path: Path, keep: float, size: tuple[int, int]
) -> None:
    p = write_cut_jpeg(tmp_path / "cut.jpg", keep)
    with Image.open(p) as im:
        im.load()  # Pillow decodes it without a word: the rest is grey
        assert im.getpixel((119, 89)) == (128, 128, 128)
    with pytest.raises(DecodeError, match="corrupt JPEG data: premature end of data segment"):
        decode(str(p), ResizeSpec(*size))
    with pytest.raises(DecodeError, match="corrupt JPEG data: premature end of data segment"):
        jpeg_for_pack(str(p), None, 3)


def test_a_whole_jpeg_ending_in_grey_is_kept(tmp_path: Path) -> None:
    """The check's trigger (an image ending in exact mid-grey) on a whole file: decoded
    again with filler bytes before its end marker, it gives the same pixels."""
    arr = np.full((48, 64, 3), 128, np.uint8)
    arr[:16, :16] = (200, 30, 60)
    p = tmp_path / "grey.jpg"
    Image.fromarray(arr).save(p, quality=90)
    with Image.open(p) as im:
        assert im.getpixel((63, 47)) == (128, 128, 128)
    out = decode(str(p), ResizeSpec(64, 48))
    assert out.shape == (3, 48, 64) and tuple(out[:, -1, -1]) == (128, 128, 128)
    data, hw, _, reencoded = jpeg_for_pack(str(p), None, 3)
    assert data == p.read_bytes() and hw == (48, 64) and not reencoded


def test_decompression_bomb_refused_before_decoding(tmp_path: Path) -> None:
    p = write_image(tmp_path / "big.png", (300, 300))
    with pytest.raises(DecodeError, match="above the limit"):
        decode(str(p), ResizeSpec(8, 8, max_pixels=10_000))


@pytest.mark.parametrize(
    ("size", "target"),
    [((7, 1), (17, 2)), ((8, 7), (17, 17)), ((13, 16), (15, 8)), ((10, 7), (5, 17))],
)
def test_crop_box_rounding_never_falls_outside(
    tmp_path: Path, size: tuple[int, int], target: tuple[int, int]
) -> None:
    """Found by the hypothesis round trip: w / (tw / w) can exceed w by 1e-15."""
    p = tmp_path / "x.png"
    Image.fromarray(np.full((size[1], size[0], 3), 200, np.uint8)).save(p)
    out = decode(str(p), ResizeSpec(target[0], target[1], "crop"))
    assert out.shape == (3, target[1], target[0]) and (out == 200).all()


@pytest.fixture
def big_png(tmp_path: Path) -> Path:
    """10000x9000 = 90 Mpx, above Pillow's own 89.5 Mpx warning, yet a tiny file."""
    path = tmp_path / "big" / "big.png"
    path.parent.mkdir()
    Image.new("1", (10000, 9000), 1).save(path)
    return path


def test_max_pixels_is_the_only_limit(big_png: Path, tmp_path: Path) -> None:
    im, size = load_resized(str(big_png), ResizeSpec(8, 8))  # default limit: 100 M
    assert size == (10000, 9000) and np.asarray(im).min() == 255
    r = build(big_png.parent, tmp_path / "p", BuildConfig(size=(8, 8), workers=1))
    assert r.count == 1 and r.skipped == []
    with pytest.raises(NoUsableImagesError, match="above the limit of 1,000,000"):
        build(big_png.parent, tmp_path / "q", BuildConfig(size=(8, 8), max_pixels=1_000_000))
    # above twice Pillow's limit, where Pillow raises instead of warning: the header opens
    huge = tmp_path / "huge.png"
    Image.new("1", (20000, 10000)).save(huge)
    with open(huge, "rb") as f, open_image(f) as h:
        assert h.size == (20000, 10000)
    r = compress(big_png.parent, tmp_path / "c", CompressConfig(max_pixels=1000))
    assert r.failed[0]["reason"].startswith("image is 10000x9000 = 90,000,000 pixels, above")
