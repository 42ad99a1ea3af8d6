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
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np
from PIL import Image, ImageOps

from .._fs import NotRegularFile, file_kind, open_if_regular
from ..errors import DecodeError
from .jpeg_header import CORRUPT, jpeg_too_short, plain_jpeg_size
from .limits import DEFAULT_MAX_PIXELS, RESIZE_MODES

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
    """Open ``path`` for reading if it is a regular file (:func:`packer._fs.open_if_regular`:
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

    Same format detection as ``Image.open``: the common formats' plugins first
    (``Image.preinit``), every other plugin loaded (``Image.init``, about 45 ms in each
    process) only for a file none of those takes. The process-wide setting is left alone.
    """
    prefix = fp.read(16)
    Image.preinit()
    tried: set[str] = set()
    for everything in (False, True):
        if everything and not Image.init():
            break  # every plugin was loaded already: all were tried
        for fmt in [f for f in Image.ID if f not in tried]:
            tried.add(fmt)
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
    with _decoder_errors(), open_regular(path) as fp:
        return _load_resized(fp, path, spec)


def load_resized_bytes(
    data: bytes, spec: ResizeSpec, name: str = "the image"
) -> tuple[Image.Image, tuple[int, int]]:
    """:func:`load_resized` of an image's bytes in memory (a member of a tar, a row of
    a parquet file), through the same checks and decoder as a file's, so the pixels are
    a file's byte for byte; ``name`` stands for the path in its messages."""
    with _decoder_errors():
        return _load_resized(io.BytesIO(data), name, spec)


def _load_resized(fp: BinaryIO, path: str, spec: ResizeSpec) -> tuple[Image.Image, tuple[int, int]]:
    with open_image(fp, path) as im:
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


def _size_of(fp: BinaryIO) -> int:
    """The size of an opened file, or of bytes in memory."""
    if isinstance(fp, io.BytesIO):
        return fp.getbuffer().nbytes
    return os.fstat(fp.fileno()).st_size


def _refuse_short_jpeg(fp: BinaryIO) -> None:
    """:func:`jpeg_too_short` of an opened JPEG file, as a DecodeError; the file's
    position is kept (Pillow reads on from it)."""
    at = fp.tell()
    fp.seek(0)
    head = fp.read(1 << 20)  # the header; one larger is left to the decoder
    fp.seek(at)
    why = jpeg_too_short(head, _size_of(fp))
    if why:
        raise DecodeError(why)


def _read_whole(fp: BinaryIO, size: tuple[int, int]) -> bytes | None:
    """The whole of an opened file, if it is no larger than a JPEG of ``size`` pixels
    can plausibly be (8 bytes a pixel, and a MiB of header): None otherwise."""
    if _size_of(fp) > 8 * size[0] * size[1] + (1 << 20):
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
    with _decoder_errors(), open_regular(path) as fp:
        data = fp.read()
    return jpeg_for_pack_bytes(data, max_side, quality, max_pixels, path)


def jpeg_for_pack_bytes(
    data: bytes,
    max_side: int | None,
    quality: int,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    path: str = "the image",
) -> tuple[bytes, tuple[int, int], tuple[int, int], bool]:
    """:func:`jpeg_for_pack` of an image's bytes in memory; ``path`` stands for the
    file in its messages."""
    with _decoder_errors(), open_image(io.BytesIO(data), path) as im:
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


__all__ = [
    "DEFAULT_MAX_PIXELS",
    "RESIZE_MODES",
    "ResizeSpec",
    "decode",
    "decode_into",
    "jpeg_for_pack",
    "jpeg_for_pack_bytes",
    "load_resized",
    "load_resized_bytes",
    "open_image",
    "open_regular",
    "pil_quality",
    "store_into",
]
