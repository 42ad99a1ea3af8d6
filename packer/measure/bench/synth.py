"""Synthetic data for ``imgpack bench``, the benchmark scripts and the tests: photo-like
JPEG trees (:func:`make_jpeg_tree`) and packs of random pixels (:func:`make_random_pack`).

Random pixels would be a poor stand-in: they compress badly and decode slowly,
flattering a pack against JPEGs. These images have what photos have (smooth
colour gradients, a few hard-edged shapes, fine grain), so their JPEG sizes and
decode costs are in the range of real photos of the same resolution.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw


def synth_image(seed: int, width: int, height: int) -> Image.Image:
    """One RGB image of ``width`` x ``height``, determined by ``seed``."""
    rng = np.random.default_rng(seed)
    grid = rng.integers(
        0, 256, (int(rng.integers(2, 6)), int(rng.integers(2, 6)), 3), dtype=np.uint8
    )
    # shapes drawn at a quarter of the size, then scaled up: soft, photo-like edges
    sw, sh = max(1, width // 4), max(1, height // 4)
    im = Image.fromarray(grid).resize((sw, sh), Image.Resampling.BICUBIC)
    draw = ImageDraw.Draw(im)
    for _ in range(int(rng.integers(3, 9))):
        x0, x1 = sorted(rng.integers(0, sw, 2).tolist())
        y0, y1 = sorted(rng.integers(0, sh, 2).tolist())
        fill = tuple(rng.integers(0, 256, 3).tolist())
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)((x0, y0, x1, y1), fill=fill)
    im = im.resize((width, height), Image.Resampling.BICUBIC)
    # texture at two scales: blotches a few pixels wide, and sensor-like grain
    coarse = rng.normal(0, 10, (max(1, height // 4), max(1, width // 4), 3)).astype(np.float32)
    coarse_im = Image.fromarray(np.clip(coarse + 128, 0, 255).astype(np.uint8))
    coarse = (
        np.asarray(coarse_im.resize((width, height), Image.Resampling.BILINEAR), dtype=np.int16)
        - 128
    )
    grain = rng.integers(-4, 5, (height, width, 3), dtype=np.int16)
    a = np.asarray(im, dtype=np.int16) + coarse + grain
    return Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))


def _write(args: tuple[int, Path, int, int, int]) -> int:
    seed, path, w, h, quality = args
    tmp = path.with_name(f".{path.name}.tmp")
    synth_image(seed, w, h).save(tmp, format="JPEG", quality=quality)
    os.replace(tmp, path)
    return path.stat().st_size


def make_jpeg_tree(
    root: Path,
    n: int,
    size: tuple[int, int],
    *,
    classes: int = 4,
    quality: int = 95,
    threads: int | None = None,
) -> int:
    """Write an ImageFolder tree of ``n`` JPEGs (``size`` = (w, h)) under ``root``.

    Files are ``class_K/img_NNNNNN.jpg``; image i is in class i mod ``classes``.
    Returns the bytes written. Pillow's encoder releases the GIL, so threads
    suffice (and keep torch, if imported, out of forked processes).
    """
    root.mkdir(parents=True, exist_ok=True)
    tasks = []
    for i in range(n):
        d = root / f"class_{i % classes}"
        d.mkdir(exist_ok=True)
        tasks.append((i, d / f"img_{i:06d}.jpg", size[0], size[1], quality))
    with ThreadPoolExecutor(threads or os.cpu_count() or 1) as ex:
        return sum(ex.map(_write, tasks))


def make_random_pack(path: Path, n: int, side: int, classes: int = 10) -> Path:
    """A valid pack of ``n`` random images, uint8 [3, side, side] in [0, 255], labels
    ``i mod classes``, written directly (fast, no decoding) through imgpack's own writer,
    so it verifies like a built pack. Replaces a pack at ``path``."""
    import shutil

    from ...pack.describe import is_pack
    from ...pack.schema import BuildInfo, Checksums, Manifest
    from ...pack.writer import write_pack

    if is_pack(path):
        shutil.rmtree(path)
    row = 3 * side * side
    rng = np.random.default_rng(0)
    block = rng.integers(0, 256, size=min(n, max(1, (256 << 20) // row)) * row, dtype=np.uint8)

    def chunks():  # the same random block over and over: fast, and enough for streaming tests
        left = n * row
        while left:
            k = min(left, len(block))
            yield block[:k].data
            left -= k

    labels = (np.arange(n) % classes).astype("<i8")
    manifest = Manifest(
        count=n,
        image_shape=(3, side, side),
        resize="stretch",
        classes=tuple(f"c{i}" for i in range(classes)),
        class_counts=tuple(np.bincount(labels, minlength=classes).tolist()),
        sources=tuple(f"synthetic/{i}.jpg" for i in range(n)),
        source_sizes=((side, side),) * n,
        build=BuildInfo(created=time.strftime("%F"), extra={"synthetic": True}),
        checksums=Checksums(block_rows=0),  # write_pack computes them
    )
    return write_pack(path, chunks(), labels.tolist(), manifest)
