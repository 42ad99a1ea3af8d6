"""Helpers shared by the benchmark scripts: synthetic JPEG folders and packs."""

from __future__ import annotations

import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = sorted((ROOT / "sample_data").rglob("*.jpg"))


def _one(args: tuple[int, str, int, int, int]) -> None:
    i, out, w, h, quality = args
    rng = np.random.default_rng(i)
    src = Image.open(SAMPLES[i % len(SAMPLES)]).convert("RGB")
    sw, sh = src.size
    # a random crop of a real photo, scaled to w x h, plus mild noise: realistic JPEG entropy
    cw, ch = int(sw * rng.uniform(0.5, 1)), int(sh * rng.uniform(0.5, 1))
    x0, y0 = int(rng.integers(0, sw - cw + 1)), int(rng.integers(0, sh - ch + 1))
    im = src.crop((x0, y0, x0 + cw, y0 + ch)).resize((w, h), Image.Resampling.BICUBIC)
    a = np.asarray(im).astype(np.int16) + rng.integers(-6, 7, (h, w, 3), dtype=np.int16)
    Image.fromarray(np.clip(a, 0, 255).astype(np.uint8)).save(out, quality=quality)


def make_jpeg_folder(
    root: Path, n: int, size: tuple[int, int] = (640, 480), classes: int = 10, quality: int = 90
) -> Path:
    """An ImageFolder tree of n JPEGs of ``size`` (w, h) made from the sample photos."""
    root.mkdir(parents=True, exist_ok=True)
    tasks = []
    for i in range(n):
        d = root / f"class_{i % classes:02d}"
        d.mkdir(exist_ok=True)
        p = d / f"img_{i:06d}.jpg"
        if not p.exists():
            tasks.append((i, str(p), size[0], size[1], quality))
    with ProcessPoolExecutor(os.cpu_count()) as ex:
        list(ex.map(_one, tasks, chunksize=32))
    return root


def make_random_pack(path: Path, n: int, side: int, classes: int = 10) -> Path:
    """A valid pack of n random uint8 images [3, side, side], written directly (fast),
    through imgpack's own writer, so it verifies like a built pack. Replaces a pack at path."""
    import shutil

    from packer.format import BuildInfo, Checksums, Manifest, is_pack, write_pack

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


def machine() -> dict[str, object]:
    import torch

    info: dict[str, object] = {
        "cores": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d"),
        "torch": torch.__version__,
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def dump(obj: object, name: str) -> None:
    out = Path(os.environ.get("OUT", ROOT / "out"))
    out.mkdir(parents=True, exist_ok=True)
    from packer.format import write_json_atomic

    write_json_atomic(out / name, obj, indent=1)
