"""Read a JPEG's header bytes, no Pillow: what the GPU build may hand to nvjpeg as it is.

:func:`plain_jpeg_size` classifies a file from its header (SOF type, precision,
components, size, EXIF and XMP orientation, Adobe transform, end marker) in about 2 us,
where opening it with Pillow and reading its EXIF takes 50; :func:`jpeg_too_short`
says when a file cannot hold the frame its header declares (libjpeg would decode it
with a warning, filling the rest with grey). :mod:`packer.imaging.decode` uses both for
the CPU decode and for what a JPEG pack stores; :mod:`packer.builder.gpu_read` for the GPU
build's split.
"""

from __future__ import annotations

import re
import struct

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


__all__ = ["CORRUPT", "jpeg_too_short", "plain_jpeg_size"]
