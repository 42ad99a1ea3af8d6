"""The folder baseline: images loaded the way people write it, for ``verify`` and ``bench``.

Pillow decodes each file in a DataLoader worker, torchvision resizes it the
way the pack was made, ``ToTensor`` + ``Normalize`` turn it into normalized
float32, and the DataLoader pins the batch for the copy to the device. This is
what a pack is measured against, in the same run.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .timing import time_loader

if TYPE_CHECKING:
    import torch


def folder_transform(height: int, width: int, resize: str) -> Callable[[Any], Any]:
    """PIL image -> Tensor[3, height, width] float32, normalized with ImageNet's mean
    and std; ``resize`` as the pack's (``pad`` is timed as a stretch: the same cost)."""
    from torchvision import transforms

    # the mean/std Normalize uses on the pack side: defined once, beside Normalize
    from ..imaging.normalize import IMAGENET_MEAN, IMAGENET_STD

    if resize == "crop":
        steps = [
            transforms.Resize(min(height, width))
            if height == width
            else transforms.Resize((height, width)),
            transforms.CenterCrop((height, width)),
        ]
    else:
        steps = [transforms.Resize((height, width))]
    return transforms.Compose(
        [*steps, transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    )


class Files:
    """A map-style dataset over explicit files: (Tensor[3, H, W] float32, int label)."""

    def __init__(self, paths: Sequence[str], labels: Sequence[int], transform: Any) -> None:
        self.paths, self.labels, self.transform = list(paths), list(labels), transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        from PIL import Image

        # as torchvision's pil_loader: open, convert to RGB, close
        with open(self.paths[i], "rb") as f, Image.open(f) as im:
            return self.transform(im.convert("RGB")), self.labels[i]


def image_folder(root: Path, height: int, width: int, resize: str = "crop") -> Any:
    """``root`` as torchvision's ImageFolder with :func:`folder_transform`."""
    from torchvision import datasets

    return datasets.ImageFolder(str(root), transform=folder_transform(height, width, resize))


def pack_files(
    source: Path, manifest: Any, labels: Sequence[int], links_out: bool = False
) -> tuple[Files, int]:
    """The images a pack holds, read from ``source``: exactly the pack's ``sources``,
    with its labels, so files the build skipped are never timed. Returns the dataset
    and how many of the pack's sources it leaves out: no longer regular image files
    under ``source`` (:func:`packer.sources.scan.source_image`: a manifest's paths never make
    it read a special file, nor a link out of the folder unless ``links_out``, for a
    folder of links the caller made to images it was given)."""
    from ..sources.scan import source_image

    root = os.path.realpath(source)
    paths, labs, missing = [], [], 0
    for rel, label in zip(manifest.sources, labels):
        p, _ = source_image(root, rel, links_out)
        if p is not None:
            paths.append(p)
            labs.append(int(label))
        else:
            missing += 1
    return Files(
        paths, labs, folder_transform(manifest.height, manifest.width, manifest.resize)
    ), missing


def folder_loader(
    dataset: Any, batch_size: int, device: torch.device, workers: int, *, endless: bool = False
) -> Any:
    """A shuffling DataLoader with ``workers`` processes, pinned on CUDA. ``endless``:
    sample with replacement without end, so no epoch boundary lands in a timed run."""
    import torch

    sampler = (
        torch.utils.data.RandomSampler(dataset, replacement=True, num_samples=1 << 40)
        if endless
        else None
    )
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=None if endless else True,
        sampler=sampler,
        num_workers=workers,
        pin_memory=device.type == "cuda",
        persistent_workers=workers > 0 and not endless,
    )


def burst_batches(workers: int, batch_size: int, images: int = 0) -> tuple[int, int]:
    """(warm-up, timed) batches for a folder DataLoader. It delivers in bursts (every
    worker builds a whole batch, all start together; prefetch_factor 2): warm up past
    two bursts and time whole rounds of one batch per worker, or a burst reads as speed."""
    rnd = max(1, workers)
    return max(3, 2 * rnd), max(rnd, math.ceil(images / batch_size))


def time_folder(
    dataset: Any,
    device: torch.device,
    batch_size: int,
    workers: int | None = None,
    batches: int = 20,
    repeats: int = 3,
) -> float:
    """Median images/s of ``dataset`` through :func:`folder_loader` onto ``device``."""
    workers = workers if workers is not None else min(8, os.cpu_count() or 1)
    dl = folder_loader(dataset, batch_size, device, workers)
    warmup, rnd = burst_batches(workers, batch_size)
    return time_loader(
        lambda: iter(dl),
        lambda b: b[0].to(device, non_blocking=True),
        device,
        max(batches, rnd),
        repeats,
        warmup=warmup,
    )
