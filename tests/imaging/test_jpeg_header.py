"""packer.imaging.jpeg_header.plain_jpeg_size: which files the GPU build decodes on the GPU, read from
the header bytes alone, against what Pillow says of the same bytes."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from packer.imaging.decode import open_image
from packer.imaging.jpeg_header import plain_jpeg_size

BIG = 10**9


def _frame(data: bytes) -> tuple[int, int, int] | None:
    """(SOF marker, precision, components) of the first frame header, walking the
    segments as the rule's reference did before it read headers itself."""
    pos = 2
    while data[:2] == b"\xff\xd8" and pos + 4 <= len(data) and data[pos] == 0xFF:
        marker = data[pos + 1]
        if marker == 0xFF or marker == 0x01 or 0xD0 <= marker <= 0xD7:
            pos += 1 if marker == 0xFF else 2
            continue
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return (marker, data[pos + 4], data[pos + 9]) if pos + 10 <= len(data) else None
        length = int.from_bytes(data[pos + 2 : pos + 4], "big")
        if marker == 0xDA or length < 2:
            return None
        pos += 2 + length
    return None


def _pillow(data: bytes, max_pixels: int = BIG) -> tuple[int, int] | None:
    """The reference: the same rule with Pillow opening the file (its mode, its EXIF and
    XMP orientation), as the GPU build classified before it read headers itself."""
    frame = _frame(data)
    if frame is None or frame[0] not in (0xC0, 0xC1, 0xC2) or frame[1:] not in ((8, 1), (8, 3)):
        return None
    try:
        with open_image(io.BytesIO(data)) as im:
            orientation = im.getexif().get(0x0112, 1)
            ok = (
                im.size[0] * im.size[1] <= max_pixels
                and im.mode in ("RGB", "L")
                and orientation in (0, 1)
                and data.endswith(b"\xff\xd9")
            )
            return im.size if ok else None
    except Exception:
        return None


def _image(size: tuple[int, int] = (64, 48), mode: str = "RGB", seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    arr = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    im = Image.fromarray(arr, "RGB")
    return im if mode == "RGB" else im.convert(mode)


def _jpeg(im: Image.Image, **save: object) -> bytes:
    b = io.BytesIO()
    im.save(b, "JPEG", **save)
    return b.getvalue()


def _exif(orientation: int | None, order: str = "<") -> bytes:
    """A TIFF block with one IFD: the orientation tag, or (None) another tag only."""
    head = (b"II*\x00" if order == "<" else b"MM\x00*") + struct.pack(order + "I", 8)
    tag = 0x0112 if orientation is not None else 0x010F  # Orientation, or Make
    kind, count, value = (3, 1, orientation) if orientation is not None else (2, 4, 0)
    entry = struct.pack(order + "HHI", tag, kind, count)
    entry += struct.pack(order + "HH", value, 0) if kind == 3 else b"abc\x00"
    return head + struct.pack(order + "H", 1) + entry + struct.pack(order + "I", 0)


def _with_segment(data: bytes, marker: int, payload: bytes) -> bytes:
    """``data`` with a ``marker`` segment of ``payload`` right after SOI."""
    head = bytes([0xFF, marker]) + struct.pack(">H", len(payload) + 2)
    return data[:2] + head + payload + data[2:]


def _with_app1(data: bytes, payload: bytes) -> bytes:
    return _with_segment(data, 0xE1, payload)


# Stored as RGB, not YCbCr: Pillow calls them "RGB" too, so its rule would pass them, but
# whether nvjpeg reads the Adobe transform or the component names is not known here;
# they go to the CPU build's decode (libjpeg honours both)
# A restart marker has no place before the scan: Pillow skips it; this rule sends the
# file to Pillow rather than guess.
STRICTER = {"adobe, transform 0 (RGB)", "components named R, G, B", "restart marker in the header"}


XMP = b"http://ns.adobe.com/xap/1.0/\x00"


def _xmp(orientation: int) -> bytes:
    return XMP + f'<x:xmpmeta><rdf:Description tiff:Orientation="{orientation}"/>'.encode()


def corpus() -> dict[str, bytes]:
    rgb = _jpeg(_image())
    out = {
        "baseline": rgb,
        "grey": _jpeg(_image(mode="L")),
        "progressive": _jpeg(_image((80, 60)), progressive=True),
        "optimized 4:4:4": _jpeg(_image((33, 17)), optimize=True, subsampling=0),
        "quality 5": _jpeg(_image(), quality=5),
        "cmyk": _jpeg(_image(mode="CMYK")),
        "no end marker": rgb[:-2],
        "trailer": rgb + b"\x00junk",
        "png": b"\x89PNG\r\n\x1a\n" + b"\x00" * 40,
        "empty": b"",
        "soi only": b"\xff\xd8\xff\xd9",
        "big-endian exif, upright": _with_app1(rgb, b"Exif\x00\x00" + _exif(1, ">")),
        "big-endian exif, rotated": _with_app1(rgb, b"Exif\x00\x00" + _exif(6, ">")),
        "exif without orientation": _with_app1(rgb, b"Exif\x00\x00" + _exif(None)),
        "xmp rotated, no exif": _with_app1(rgb, _xmp(6)),
        "xmp rotated, exif upright": _with_app1(
            _with_app1(rgb, _xmp(6)), b"Exif\x00\x00" + _exif(1)
        ),
        "xmp rotated, exif without it": _with_app1(
            _with_app1(rgb, _xmp(8)), b"Exif\x00\x00" + _exif(None)
        ),
        "xmp upright": _with_app1(rgb, _xmp(1)),
        "xmp unclear": _with_app1(rgb, XMP + b"<tiff:Orientation>six</tiff:Orientation>"),
    }
    adobe = b"Adobe\x00\x64\x00\x00\x00\x00"  # version, flags, then the transform
    out["adobe, transform 0 (RGB)"] = _with_segment(rgb, 0xEE, adobe + b"\x00")
    out["adobe, transform 1 (YCbCr)"] = _with_segment(rgb, 0xEE, adobe + b"\x01")
    out["adobe, transform 0, grey"] = _with_segment(_jpeg(_image(mode="L")), 0xEE, adobe + b"\x00")
    sof = rgb.index(b"\xff\xc0")
    named = bytearray(rgb)
    named[sof + 10 : sof + 17 : 3] = b"RGB"  # the three components' ids
    out["components named R, G, B"] = bytes(named)
    # an FF 00 "segment" whose length would hide what libjpeg and Pillow read (a review
    # found this: the EXIF rotation of 6 was skipped, and nvjpeg decoded the file)
    exif6 = b"\xff\xe1" + struct.pack(">H", len(_exif(6)) + 8) + b"Exif\x00\x00" + _exif(6)
    out["ff00 hiding exif 6"] = (
        rgb[:2] + b"\xff\x00" + struct.pack(">H", len(exif6) + 2) + exif6 + rgb[2:]
    )
    out["restart marker in the header"] = rgb[:2] + b"\xff\xd0" + rgb[2:]
    for o in (1, 2, 3, 6, 8):
        ex = Image.Exif()
        ex[0x0112] = o
        out[f"exif orientation {o}"] = _jpeg(_image(), exif=ex.tobytes())
    return out


@pytest.mark.parametrize("name", list(corpus()))
def test_agrees_with_pillow_on_the_corpus(name: str) -> None:
    data = corpus()[name]
    if name in STRICTER:
        assert plain_jpeg_size(data, BIG) is None and _pillow(data) is not None
    else:
        assert plain_jpeg_size(data, BIG) == _pillow(data)


def test_the_expected_ones_go_to_the_gpu() -> None:
    """Not vacuous: the plain ones pass, the rest do not."""
    passed = {n for n, d in corpus().items() if plain_jpeg_size(d, BIG) is not None}
    assert passed == {
        "baseline", "grey", "progressive", "optimized 4:4:4", "quality 5",
        "big-endian exif, upright", "exif orientation 1", "exif without orientation",
        "xmp rotated, exif upright", "xmp upright", "xmp unclear",
        "adobe, transform 1 (YCbCr)", "adobe, transform 0, grey",
    }  # fmt: skip
    assert plain_jpeg_size(corpus()["baseline"], BIG) == (64, 48)


def test_the_pixel_limit_is_inclusive() -> None:
    data = _jpeg(_image((40, 30)))
    assert plain_jpeg_size(data, 1200) == (40, 30) == _pillow(data, 1200)
    assert plain_jpeg_size(data, 1199) is None and _pillow(data, 1199) is None


@pytest.mark.filterwarnings("ignore:Corrupt EXIF")
def test_a_damaged_header_never_passes_with_other_facts_than_pillow_reads() -> None:
    """Random bytes of the header overwritten, 400 times: whenever the bytes pass and
    Pillow opens them too, Pillow reads the same size, an RGB or grey image, upright.
    (What Pillow cannot open but passes here goes to nvjpeg; where that fails, the CPU
    build's decode names the reason.)"""
    good = _with_app1(_jpeg(_image((50, 40), seed=3)), b"Exif\x00\x00" + _exif(1))
    head = good.index(b"\xff\xda")  # up to the scan
    rng = np.random.default_rng(0)
    passed = 0
    for _ in range(400):
        data = bytearray(good)
        for at in rng.integers(2, head, int(rng.integers(1, 4))):
            data[at] = int(rng.integers(0, 256))
        size = plain_jpeg_size(data, BIG)
        if size is None:
            continue
        passed += 1
        try:
            with open_image(io.BytesIO(bytes(data))) as im:
                facts = (im.size, im.mode, im.getexif().get(0x0112, 1))
        except Exception:
            continue
        assert facts[0] == size and facts[1] in ("RGB", "L") and facts[2] in (0, 1)
    assert passed > 50  # most damage lands in tables this check does not read


def test_a_file_too_short_for_its_frame_never_goes_to_the_gpu(tmp_path: Path) -> None:
    """nvjpeg would decode it as the CPU would keep it, mostly grey: the CPU decode
    names it corrupt instead (tests/test_scan_decode.py)."""
    from conftest import write_bomb_jpeg

    data = write_bomb_jpeg(tmp_path / "short.jpg").read_bytes()
    assert len(data) == 674 and _pillow(data) == (65000, 1500)
    assert plain_jpeg_size(data, BIG) is None
    whole = _jpeg(_image((400, 300), seed=4))
    assert plain_jpeg_size(whole, BIG) == (400, 300)
    head = whole.index(b"\xff\xda")
    assert plain_jpeg_size(whole[: head + 40] + b"\xff\xd9", BIG) is None
