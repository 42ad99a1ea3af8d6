"""Demo: stream a pack in shuffled batches to the GPU (or CPU) and normalize there.

python -m packer.examples.demo_stream PACK
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import torch

import packer


def main(argv: Sequence[str] | None = None) -> int:
    packer.configure_cuda_queues()  # before any CUDA call: 32 queues for a JPEG pack's decodes
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("pack", help="a pack or pack set (imgpack build)")
    args = ap.parse_args(argv)
    try:
        pack = packer.load(args.pack)
    except packer.PackerError as e:
        print(f"Error: {e}", file=sys.stderr)
        return e.exit_code
    device = "cuda" if torch.cuda.is_available() else "cpu"
    # a JPEG pack (imgpack build --store jpeg) is decoded to the size the reader asks for
    size = {"image_size": 224} if pack.kind.decoded else {}
    loader = packer.PackLoader(pack, batch_size=8, device=device, seed=0, **size)
    norm = packer.Normalize().to(device)
    print(f"{len(pack)} images, classes {pack.classes}, streaming to {device}")
    for epoch in range(2):
        loader.set_epoch(epoch)  # every epoch, also on one GPU: a resumed run starts where it was
        t0 = time.perf_counter()
        for i, (images, labels, *_) in enumerate(loader):  # a pack with targets adds a third
            x = norm(images)  # uint8 [B,3,H,W] -> float32, normalized on the device
            if i == 0:
                print(
                    f"epoch {epoch}: batch {tuple(images.shape)} {images.dtype} -> {x.dtype}, "
                    f"mean {x.mean().item():+.3f}, labels {labels.tolist()}"
                )
        if device == "cuda":
            torch.cuda.synchronize()
        print(f"epoch {epoch}: {len(loader)} batches in {(time.perf_counter() - t0) * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
