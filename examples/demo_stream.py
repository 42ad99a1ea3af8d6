"""Demo: stream a pack in shuffled batches to the GPU (or CPU) and normalize there.

python examples/demo_stream.py PACK
"""

import sys
import time

import torch

import packer

pack = packer.load(sys.argv[1])
device = "cuda" if torch.cuda.is_available() else "cpu"
loader = packer.PackLoader(pack, batch_size=8, device=device, seed=0)
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
