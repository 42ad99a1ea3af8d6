"""Which JPEGs torchvision's batched ``decode_jpeg(list, device="cuda")`` takes, and how
it fails: one line per input kind, alone and inside a batch of good ones.

    python scripts/check_nvjpeg.py     # needs CUDA; writes $OUT/nvjpeg_inputs.json
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torchvision.io import ImageReadMode, decode_jpeg

from _out import dump
from packer.errors import PackFormatError
from packer.jpeg import decode_batch


def _jpeg(mode: str = "RGB", **save: object) -> bytes:
    rng = np.random.default_rng(0)
    im = Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).convert(mode)
    buf = io.BytesIO()
    im.save(buf, "JPEG", **save)
    return buf.getvalue()


def main() -> None:
    good = _jpeg(quality=90)
    kinds = {
        "baseline 4:2:0": good,
        "baseline 4:4:4": _jpeg(quality=90, subsampling=0),
        "progressive": _jpeg(quality=90, progressive=True),
        "grayscale": _jpeg("L", quality=90),
        "cmyk": _jpeg("CMYK", quality=90),
        "restart markers": _jpeg(quality=90, restart_marker_blocks=4),
        "truncated half": good[: len(good) // 2],
        "zeroed body": good[:2] + bytes(len(good) - 2),
    }
    res = {}
    for name, data in kinds.items():
        t = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        row: dict[str, str] = {}
        try:
            x = decode_jpeg([t], mode=ImageReadMode.RGB, device="cuda")[0]
            ref = decode_jpeg(t, mode=ImageReadMode.RGB)
            d = (x.cpu().int() - ref.int()).abs().float().mean().item()
            row["alone"] = f"ok {tuple(x.shape)} mean|gpu-cpu| {d:.2f}"
        except Exception as e:
            row["alone"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        g = torch.frombuffer(bytearray(good), dtype=torch.uint8)
        try:
            decode_jpeg([g, t, g], mode=ImageReadMode.RGB, device="cuda")
            row["in_batch"] = "ok"
        except Exception as e:
            row["in_batch"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        try:
            decode_batch([g, t, g], "cuda", indices=[10, 11, 12])
            row["packer"] = "ok"
        except PackFormatError as e:
            row["packer"] = f"PackFormatError: {str(e)[:120]}"
        torch.cuda.synchronize()
        res[name] = row
        print(f"{name:<16} alone: {row['alone'][:70]:<70} batch: {row['in_batch'][:40]}")
        print(f"{'':<16} packer: {row['packer'][:110]}")
    dump(res, "nvjpeg_inputs.json")


if __name__ == "__main__":
    main()
