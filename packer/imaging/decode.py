"""Decode one image file into a fixed-size RGB uint8 array.

This is the single definition of "what a packed image is": build uses it to
fill the pack and verify uses it to re-check packed pixels, so the two agree
byte for byte.

* Anything Pillow reads, first frame of animated/multi-page files.
* EXIF orientation is applied, so pixels come out upright.
* Grayscale, palette and CMYK become RGB. Alpha (RGBA, LA, PA, palette with
  transparency) is flattened onto black: each colour is multiplied by its
  alpha, so fully transparent pixels are 0, the same value as ``pad`` borders.
* 16-bit images are scaled to 8 bits (``round(v * 255 / 65535)``), not clipped.
* Resize is antialiased bilinear (Pillow), the same filter as torchvision's
  ``Resize`` on PIL images. Modes for a target of W×H:
  ``stretch`` resizes to W×H ignoring aspect; ``crop`` (default) scales the
  shorter side to fit and takes the centre W×H; ``pad`` scales the longer side
  to fit and centres the image on black (letterbox).
* JPEGs use Pillow's ``draft()`` to decode at a reduced DCT scale when the
  target is much smaller; the scale is chosen from the target size alone, so
  the result is deterministic.
* Images with more than ``max_pixels`` pixels are refused before decoding, so
  a decompression bomb cannot exhaust a worker's memory. That limit is the only
  one: Pillow's own (``Image.MAX_IMAGE_PIXELS``) is bypassed, not changed.
* A JPEG that libjpeg decodes with only a warning, which Pillow drops, is broken
  (``corrupt JPEG data: ...``): one too short for the frame its header declares
  (refused from the header and the file's size, before decoding), and one whose
  image data stop before its last block (libjpeg fills the rest with grey: such a
  decode is checked again, :func:`_check_whole`).
* Only regular files are read (after following symlinks): a FIFO, a device or
  a folder named like an image is refused before any read, so none can block
  or feed endless bytes (:func:`open_regular`).
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np
from PIL import Image, ImageOps

from ..errors import DecodeError
from ..sources.scan import NotRegularFile, file_kind, open_if_regular

RESIZE_MODES = ("stretch", "crop", "pad")
DEFAULT_MAX_PIXELS = 100_000_000
_TRANSPOSED = {5, 6, 7, 8}  # EXIF orientations that swap width and height
_EXIF_ORIENTATION = 0x0112


@dataclass(frozen=True)
class ResizeSpec:
    """Target of decoding: ``width`` × ``height`` pixels, fitted by ``mode``."""

    width: int
    height: int
    mode: str = "crop"
    max_pixels: int = DEFAULT_MAX_PIXELS

    @property
    def shape(self) -> tuple[int, int, int]:
        return (3, self.height, self.width)


def _scaled_size(w: int, h: int, spec: ResizeSpec) -> tuple[int, int]:
    """Size the whole image is scaled to before cropping or padding."""
    if spec.mode == "stretch":
        return spec.width, spec.height
    fit = max if spec.mode == "crop" else min
    s = fit(spec.width / w, spec.height / h)
    return max(1, round(w * s)), max(1, round(h * s))


def _to_rgb(im: Image.Image) -> Image.Image:
    mode = im.mode
    if mode == "RGB":
        return im
    if mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        a = np.asarray(im).astype(np.int64)
        if mode == "I" and a.size and (a.min() < 0 or a.max() > 65535):
            a = np.clip(a, 0, 65535)  # 32-bit data: treat as 16-bit range
        a8 = ((a * 255 + 32767) // 65535).astype(np.uint8)
        return Image.fromarray(a8, "L").convert("RGB")
    if mode == "F":
        a = np.asarray(im, dtype=np.float64)
        a8 = np.clip(np.rint(a), 0, 255).astype(np.uint8)
        return Image.fromarray(a8, "L").convert("RGB")
    if mode == "P" and "transparency" in im.info:
        im = im.convert("RGBA")
        mode = "RGBA"
    elif mode == "P":
        return im.convert("RGB")
    if mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = im.convert("RGBA")
        a = np.asarray(rgba, dtype=np.uint16)
        rgb = (a[..., :3] * a[..., 3:4] + 127) // 255
        return Image.fromarray(rgb.astype(np.uint8), "RGB")
    return im.convert("RGB")


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """Open ``path`` for reading if it is a regular file (:func:`packer.sources.scan.open_if_regular`:
    no race with a swap, never blocks on a FIFO). Raises DecodeError for anything else,
    naming what it is.
    """
    try:
        return open_if_regular(path)
    except FileNotFoundError:
        raise DecodeError("file vanished (or is a broken symlink)") from None
    except PermissionError:
        raise DecodeError("permission denied; make the file readable") from None
    except OSError as e:
        raise DecodeError(f"cannot open: {e.strerror}") from None
    except NotRegularFile as e:
        raise DecodeError(
            f"not a regular file ({file_kind(e.mode)}); only image files are read"
        ) from None


def open_image(fp: BinaryIO, path: str = "") -> Image.Image:
    """``Image.open`` less Pillow's own pixel limit, which would otherwise refuse
    images above ``Image.MAX_IMAGE_PIXELS`` that ``--max-pixels`` allows.

    Same format detection as ``Image.open``; the process-wide setting is left alone.
    """
    Image.init()
    prefix = fp.read(16)
    for fmt in Image.ID:
        factory, accept = Image.OPEN[fmt]
        try:
            ok = not accept or accept(prefix)
            if ok and not isinstance(ok, str):
                fp.seek(0)
                return factory(fp, path)
        except (SyntaxError, IndexError, TypeError, struct.error):
            continue
    raise Image.UnidentifiedImageError(f"cannot identify image file {path!r}")


def load_resized(path: str, spec: ResizeSpec) -> tuple[Image.Image, tuple[int, int]]:
    """Decode ``path`` to an upright RGB PIL image of spec's size.

    Returns the image and the source's upright (width, height) in pixels.
    Raises DecodeError with a one-line reason for anything that cannot be used.
    """
    with _decoder_errors(), open_regular(path) as fp, open_image(fp, path) as im:
        orientation, upright = _upright_size(im, spec.max_pixels)
        draft, full = None, im.size
        if im.format == "JPEG":
            _refuse_short_jpeg(fp)
        if im.format == "JPEG" and im.mode in ("RGB", "L", "CMYK", "YCbCr"):
            tw, th = _scaled_size(*upright, spec)
            if orientation in _TRANSPOSED:
                tw, th = th, tw
            draft = (tw, th)
            im.draft(None, draft)
        im.seek(0)
        im.load()
        _check_whole(im, functools.partial(_read_whole, fp, full), draft, path)
        im = ImageOps.exif_transpose(im)
        rgb = _to_rgb(im)
        return _fit(rgb, spec), upright


def _refuse_short_jpeg(fp: BinaryIO) -> None:
    """:func:`jpeg_too_short` of an opened JPEG file, as a DecodeError; the file's
    position is kept (Pillow reads on from it)."""
    at = fp.tell()
    fp.seek(0)
    head = fp.read(1 << 20)  # the header; one larger is left to the decoder
    fp.seek(at)
    why = jpeg_too_short(head, os.fstat(fp.fileno()).st_size)
    if why:
        raise DecodeError(why)


def _read_whole(fp: BinaryIO, size: tuple[int, int]) -> bytes | None:
    """The whole of an opened file, if it is no larger than a JPEG of ``size`` pixels
    can plausibly be (8 bytes a pixel, and a MiB of header): None otherwise."""
    if os.fstat(fp.fileno()).st_size > 8 * size[0] * size[1] + (1 << 20):
        return None
    at = fp.tell()
    fp.seek(0)
    data = fp.read()
    fp.seek(at)
    return data


@contextlib.contextmanager
def _decoder_errors() -> Iterator[None]:
    """Any failure while opening or decoding an input as a one-line DecodeError
    (hostile files can raise anything from a decoder)."""
    try:
        yield
    except DecodeError:
        raise
    except Image.UnidentifiedImageError:
        raise DecodeError("not an image Pillow can read (unknown or corrupt format)") from None
    except MemoryError:
        raise DecodeError("out of memory while decoding") from None
    except FileNotFoundError:
        raise DecodeError("file vanished during the build") from None
    except PermissionError:
        raise DecodeError("permission denied; make the file readable") from None
    except Exception as e:
        msg = str(e).splitlines()[0] if str(e) else ""
        raise DecodeError(f"{type(e).__name__}: {msg}"[:300]) from None


def _upright_size(im: Image.Image, max_pixels: int) -> tuple[int, tuple[int, int]]:
    """An opened image's EXIF orientation and upright (width, height); DecodeError
    above ``max_pixels`` (before anything is decoded)."""
    w, h = im.size
    if w * h > max_pixels:
        raise DecodeError(
            f"image is {w}x{h} = {w * h:,} pixels, above the limit of "
            f"{max_pixels:,} (possible decompression bomb)"
        )
    orientation = im.getexif().get(_EXIF_ORIENTATION, 1)
    return orientation, ((h, w) if orientation in _TRANSPOSED else (w, h))


def _fit(im: Image.Image, spec: ResizeSpec) -> Image.Image:
    w, h = im.size
    size = (spec.width, spec.height)
    if spec.mode == "stretch":
        return im.resize(size, Image.Resampling.BILINEAR) if im.size != size else im
    if spec.mode == "crop":
        # Source box with the target's aspect, centred: one resample of only the pixels kept.
        s = max(spec.width / w, spec.height / h)
        # min(): w / (tw / w) can come out a hair above w in floating point, and
        # Pillow refuses a box even 1e-15 outside the image
        bw, bh = min(w, spec.width / s), min(h, spec.height / s)
        box = ((w - bw) / 2, (h - bh) / 2, (w + bw) / 2, (h + bh) / 2)
        return im.resize(size, Image.Resampling.BILINEAR, box=box)
    nw, nh = _scaled_size(w, h, spec)
    scaled = im.resize((nw, nh), Image.Resampling.BILINEAR) if (nw, nh) != (w, h) else im
    canvas = Image.new("RGB", size)
    canvas.paste(scaled, ((spec.width - nw) // 2, (spec.height - nh) // 2))
    return canvas


def store_into(im: Image.Image, out: np.ndarray) -> None:
    """Copy an RGB image of spec's size into ``out`` (uint8 [3, H, W]), planar."""
    if im.mode != "RGB":
        out[...] = np.asarray(im).transpose(2, 0, 1)
        return
    # Pillow's own deinterleave, one contiguous plane per band: twice as fast as
    # numpy's transpose of the interleaved pixels (a 3-byte-strided copy)
    h, w = out.shape[1:]
    for c, band in enumerate(im.split()):
        out[c] = np.frombuffer(band.tobytes(), dtype=np.uint8).reshape(h, w)


def decode_into(path: str, spec: ResizeSpec, out: np.ndarray) -> tuple[int, int]:
    """Decode ``path`` into ``out`` (uint8 [3, H, W], values 0-255); return its upright size."""
    im, size = load_resized(path, spec)
    store_into(im, out)
    return size


def decode(path: str, spec: ResizeSpec) -> np.ndarray:
    """Decode ``path`` to a new uint8 array [3, H, W] with values in [0, 255]."""
    out = np.empty(spec.shape, dtype=np.uint8)
    decode_into(path, spec, out)
    return out


# ---------------------------------------------------------------- JPEG packs

# what torchvision's decode_jpeg (nvjpeg on CUDA, libjpeg on the CPU) takes as stored:
# baseline, extended sequential or progressive Huffman JPEG, 8-bit, 1 or 3 components
_SOF_OK = {0xC0, 0xC1, 0xC2}
_SOF_ANY = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


_HUFFMAN_DCT = {0xC0, 0xC1, 0xC2}  # frames whose every block costs a Huffman code (>= 1 bit)
CORRUPT = "corrupt JPEG data: "  # the start of libjpeg's own warnings, which Pillow drops


def _frame_blocks(data: bytes | bytearray | memoryview, sof: int) -> int | None:
    """The 8x8 blocks a frame header at ``sof`` (its FF Cn) asks for, over every
    component; None if it is not a plain, readable Huffman-coded DCT frame."""
    if data[sof + 1] not in _HUFFMAN_DCT:
        return None
    try:
        h = (data[sof + 5] << 8) | data[sof + 6]
        w = (data[sof + 7] << 8) | data[sof + 8]
        nc = data[sof + 9]
        factors = [(data[sof + 11 + 3 * k] >> 4, data[sof + 11 + 3 * k] & 15) for k in range(nc)]
    except IndexError:
        return None
    if not nc or not all(a and b for a, b in factors):
        return None
    hmax, vmax = max(a for a, _ in factors), max(b for _, b in factors)

    def up(x: int, d: int) -> int:
        return -(-x // d)

    return sum(up(up(w * a, hmax), 8) * up(up(h * b, vmax), 8) for a, b in factors)


def _short_of_data(blocks: int, w: int, h: int, available: int) -> str | None:
    """Why ``available`` bytes of image data cannot be a whole ``w`` x ``h`` frame of
    ``blocks`` Huffman-coded blocks (each costs at least one bit), or None."""
    if available * 8 >= blocks:
        return None
    return (
        f"{CORRUPT}premature end of data (its {w}x{h} frame needs at least "
        f"{-(-blocks // 8):,} bytes of image data, the file has {max(0, available):,})"
    )


def jpeg_too_short(head: bytes, size: int) -> str | None:
    """Why a JPEG of ``size`` bytes (``head``: its first bytes, holding the header) is too
    short to hold the frame its header declares, or None (also when the header is not
    read plainly: the decoder then judges). libjpeg decodes such a file with a warning
    ("premature end of data segment") and fills what is missing with grey, and Pillow
    drops libjpeg's warnings: a 674-byte file then decodes as a 65000x1500 image."""
    pos, n, sof = 2, len(head), None
    if n < 4 or head[:2] != b"\xff\xd8":
        return None
    while pos + 4 <= n:
        if head[pos] != 0xFF:
            return None
        marker = head[pos + 1]
        if marker == 0xFF:
            pos += 1
            continue
        if marker == 0xDA:
            break
        if marker not in _HEADER_SEGMENTS:
            return None
        if marker in _SOF_ANY and sof is None:
            sof = pos
        pos += 2 + ((head[pos + 2] << 8) | head[pos + 3])
    else:
        return None
    if sof is None or (blocks := _frame_blocks(head, sof)) is None:
        return None
    h = (head[sof + 5] << 8) | head[sof + 6]
    w = (head[sof + 7] << 8) | head[sof + 8]
    return _short_of_data(blocks, w, h, size - pos)


_GREY = (128, (128, 128, 128))  # a block with no coefficients, as L and as RGB
_FILLER = b"\x5a\xa5" * 64  # image data bytes (no FF) for the confirming decode


def _check_whole(im: Image.Image, read: Any, draft: tuple[int, int] | None, path: str) -> None:
    """DecodeError when a decoded JPEG's image data stopped before its last block.

    libjpeg then warns ("Corrupt JPEG data: premature end of data segment") and gives
    the missing blocks no coefficients: mid-grey to the end of the image. Pillow drops
    libjpeg's warnings, so only an image whose last pixel is that grey is checked
    further: it is decoded again with filler bytes before its final marker. A whole
    file's decoder has finished by then and skips them (the same pixels); a short
    one's reads them as image data (other pixels). ``read()`` gives the file's bytes
    (None: too large to check), ``draft`` the size ``draft()`` was asked for."""
    if im.format != "JPEG" or im.mode not in ("RGB", "L"):
        return
    if im.getpixel((im.width - 1, im.height - 1)) not in _GREY:
        return
    data = read()
    end = -1 if data is None else data.rfind(b"\xff\xd9")
    if end < 0:
        return
    with open_image(io.BytesIO(data[:end] + _FILLER + data[end:]), path) as again:
        if draft is not None:
            again.draft(None, draft)
        again.load()
        if again.size == im.size and again.tobytes() != im.tobytes():
            raise DecodeError(
                f"{CORRUPT}premature end of data segment (the image data stop before "
                "its last block; libjpeg would fill the rest with grey)"
            )


def pil_quality(q: int) -> int:
    """Pillow's JPEG quality for ``--quality Q`` (ffmpeg's ``-q:v``, 2 best .. 31 worst):
    ``100 - 3 * Q`` clamped to [5, 95], so 2 -> 94, 3 (the default) -> 91, 5 -> 85,
    10 -> 70, 31 -> 7: about the size and look ffmpeg's mjpeg gives at that ``-q:v``."""
    return max(5, min(95, 100 - 3 * int(q)))


def jpeg_for_pack(
    path: str, max_side: int | None, quality: int, max_pixels: int = DEFAULT_MAX_PIXELS
) -> tuple[bytes, tuple[int, int], tuple[int, int], bool]:
    """The JPEG file to store for ``path`` in a JPEG pack.

    A baseline/progressive 8-bit YCbCr or grayscale JPEG, upright (no EXIF
    rotation), within ``max_side`` and that Pillow decodes whole, is kept byte for
    byte (when it ends with its EOI marker: bytes appended after it are dropped by the
    re-encode): :func:`plain_jpeg_size`, the GPU build's rule. Anything else (PNG, CMYK,
    16-bit, EXIF-rotated, arithmetic-coded, colour stored as RGB, oversize) is decoded
    as :func:`load_resized` does (upright RGB, alpha on black, 16-bit scaled), its
    longer side scaled down to ``max_side`` (antialiased bilinear) and encoded once
    with Pillow at :func:`pil_quality` of ``quality``.

    Returns (bytes, stored (height, width), source upright (width, height),
    re-encoded?). Raises DecodeError for an input that cannot be used, corrupt JPEG
    data included (as :func:`load_resized`), so a pack never keeps such a file.
    """
    with _decoder_errors():
        with open_regular(path) as fp:
            data = fp.read()
        with open_image(io.BytesIO(data), path) as im:
            w, h = im.size
            orientation, upright = _upright_size(im, max_pixels)
            if im.format == "JPEG" and (why := jpeg_too_short(data, len(data))):
                raise DecodeError(why)
            keep = (
                im.format == "JPEG"
                and plain_jpeg_size(data, max_pixels) == (w, h)  # as the GPU build's rule
                and orientation in (0, 1)
                and (max_side is None or max(w, h) <= max_side)
            )
            im.seek(0)
            im.load()  # a truncated or corrupt file is refused here, not at read time
            _check_whole(im, lambda: data, None, path)
            if keep:
                return data, (h, w), upright, False
            im = ImageOps.exif_transpose(im)
            rgb = _to_rgb(im)
            if max_side is not None and max(rgb.size) > max_side:
                s = max_side / max(rgb.size)
                size = (max(1, round(rgb.size[0] * s)), max(1, round(rgb.size[1] * s)))
                rgb = rgb.resize(size, Image.Resampling.BILINEAR)
            out = io.BytesIO()
            rgb.save(out, "JPEG", quality=pil_quality(quality))
            return out.getvalue(), (rgb.size[1], rgb.size[0]), upright, True


_EXIF = b"Exif\x00\x00"
_XMP = b"http://ns.adobe.com/xap/1.0/\x00"
# the segments a JPEG header holds: SOFn, DHT, DAC, DQT, DRI, APPn, COM
_HEADER_SEGMENTS = (
    (set(range(0xC0, 0xD0)) - {0xC8}) | {0xDB, 0xDD} | set(range(0xE0, 0xF0)) | {0xFE}
)
_XMP_ORIENTATION = re.compile(rb'tiff:Orientation(="|>)([0-9])')  # as Pillow's getexif


def _exif_orientation(tiff: bytes | bytearray) -> int | None:
    """The orientation tag of an EXIF block's first IFD (0 when it has none), or None
    where the block cannot be read plainly (the caller then lets Pillow decide)."""
    order = {b"II*\x00": "<", b"MM\x00*": ">"}.get(bytes(tiff[:4]))
    if order is None:
        return None
    try:
        (ifd,) = struct.unpack_from(order + "I", tiff, 4)
        (count,) = struct.unpack_from(order + "H", tiff, ifd)
        for k in range(count):
            at = ifd + 2 + 12 * k
            tag, kind, n = struct.unpack_from(order + "HHI", tiff, at)
            if tag == 0x0112:  # SHORT, one value, in the entry itself
                if (kind, n) != (3, 1):
                    return None
                return struct.unpack_from(order + "H", tiff, at + 8)[0]
    except struct.error:
        return None
    return 0


def plain_jpeg_size(data: bytes | bytearray, max_pixels: int) -> tuple[int, int] | None:
    """(width, height) of ``data`` if it is a JPEG that torchvision's decoder takes as it
    is, read from its header bytes alone (no Pillow: about 2 us, where opening it with
    Pillow and reading its EXIF takes 50): baseline, extended or progressive Huffman,
    8-bit, YCbCr or grey (Pillow's "RGB" and "L"; not colour stored as RGB, which an Adobe
    transform of 0 or components named R, G, B mean), at most ``max_pixels``, upright (no
    EXIF or XMP orientation other than 1), ending with its EOI marker. Else None: the
    caller decodes it as the CPU build does (which names the reason for anything it
    refuses). Anything unusual in the header (two frames or EXIF blocks, a bad length, a
    frame without its height, a marker that is no header segment, such as FF 00, which
    libjpeg reads past where this walk would skip a length) is None too, so the answer
    errs towards Pillow. So is a file too short for its frame (:func:`jpeg_too_short`):
    nvjpeg would decode it grey where the CPU decode names it corrupt."""
    n = len(data)
    if n < 4 or data[:2] != b"\xff\xd8" or data[-2:] != b"\xff\xd9":
        return None
    pos, size, sof = 2, None, 0
    orientation: int | None = None  # EXIF's tag; 0: an EXIF block without it
    xmp: int | None = None  # XMP's tiff:Orientation
    colour = adobe_rgb = False
    while True:
        if pos + 4 > n or data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker == 0xDA:  # start of scan: the header is over
            break
        if marker not in _HEADER_SEGMENTS:  # FF 00, RST, reserved: libjpeg reads on past
            return None  # them, so what follows is not what this walk would skip
        end = pos + 2 + ((data[pos + 2] << 8) | data[pos + 3])
        if end < pos + 4 or end > n:
            return None
        if marker in _SOF_ANY:
            if size is not None or end < pos + 10:
                return None
            if marker not in _SOF_OK or data[pos + 4] != 8 or data[pos + 9] not in (1, 3):
                return None
            h = (data[pos + 5] << 8) | data[pos + 6]
            w = (data[pos + 7] << 8) | data[pos + 8]
            if not w or not h or w * h > max_pixels:
                return None
            colour = data[pos + 9] == 3
            if colour and (end < pos + 19 or bytes(data[pos + 10 : pos + 17 : 3]) == b"RGB"):
                return None  # components named R, G, B: libjpeg reads RGB, not YCbCr
            size, sof = (w, h), pos
        elif marker == 0xEE and data[pos + 4 : pos + 9] == b"Adobe":
            if end < pos + 16:
                return None
            adobe_rgb = data[pos + 15] == 0  # transform 0: colour stored as RGB, not YCbCr
        elif marker == 0xE1:
            if data[pos + 4 : pos + 10] == _EXIF:
                if orientation is not None:
                    return None
                orientation = _exif_orientation(data[pos + 10 : end])
                if orientation is None:
                    return None
            elif data[pos + 4 : pos + 33] == _XMP:
                found = _XMP_ORIENTATION.search(data, pos + 33, end)
                if found and xmp is not None:  # Pillow keeps the last: too unusual
                    return None
                xmp = int(found[2]) if found else xmp
        pos = end
    if not orientation and xmp is not None:  # Pillow reads XMP's when EXIF has no tag
        orientation = xmp
    if size is None or orientation not in (None, 0, 1) or (colour and adobe_rgb):
        return None
    blocks = _frame_blocks(data, sof)
    if blocks is None or _short_of_data(blocks, *size, n - pos):
        return None  # too short for its frame: the CPU decode names it corrupt
    return size


def parse_size(text: str) -> tuple[int, int]:
    """``"224"`` -> (224, 224); ``"320x240"`` -> (320, 240) as (width, height).

    Only the syntax is checked here; the range (1 to 8192 a side) is checked once,
    by ``BuildConfig.validate``, for the CLI and library callers alike.
    """
    t = text.strip().lower()
    try:
        if "x" in t:
            w, h = t.split("x", 1)
            size = (int(w), int(h))
        else:
            size = (int(t), int(t))
    except ValueError:
        raise ValueError(
            f"size must be S or WxH in pixels, like 224 or 320x240, not {text!r}"
        ) from None
    return size


__all__ = [
    "DEFAULT_MAX_PIXELS",
    "RESIZE_MODES",
    "ResizeSpec",
    "decode",
    "decode_into",
    "jpeg_for_pack",
    "load_resized",
    "open_image",
    "open_regular",
    "parse_size",
    "pil_quality",
    "plain_jpeg_size",
    "store_into",
]
