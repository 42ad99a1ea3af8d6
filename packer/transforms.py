"""Batched per-image augmentation on uint8 ``[B, C, H, W]`` batches, on the CPU and CUDA.

The public names of :mod:`packer.augment`'s ops. Every op draws each image's own
parameters on the CPU from the ``generator`` it is given (the loader's per-batch
generator), so a seed reproduces a run and a resume redraws the same augmentations;
nothing makes the host wait for the device.

    from packer.transforms import Compose, RandomResizedCrop, RandomHorizontalFlip, TrivialAugmentWide
    train_tf = Compose([RandomResizedCrop(224), RandomHorizontalFlip(), TrivialAugmentWide()])
    loader = packer.PackLoader(pack, 256, device=device, transform=train_tf)

Geometry: ``RandomResizedCrop``, ``RandomHorizontalFlip``, ``CenterCrop``, ``Resize``,
``RandomRotation``, ``RandomAffine`` (and the batched ``resized_crop``). The resizes take
``interpolation=`` (bilinear, nearest, nearest-exact, bicubic, lanczos) and ``antialias=``
as torchvision's, with its pixels; the warps and policies nearest or bilinear, as
torchvision's tensor warps. Colour and
pixels: ``ColorJitter``, ``RandomGrayscale``, ``GaussianBlur``, ``RandomPosterize``,
``RandomSolarize``, ``RandomAdjustSharpness``, ``RandomAutocontrast``,
``RandomEqualize``, ``RandomInvert``, ``RandomErasing`` (uint8 or normalized float).
Policies: ``TrivialAugmentWide``, ``RandAugment``, ``AutoAugment``, ``AugMix``. Batch
mixers, ``(images, labels) -> (images, soft_labels)``: ``MixUp``, ``CutMix``,
``RandomChoice``. ``Compose`` chains them; ``PerImage`` wraps a torchvision transform
to run image by image (slow, explicit).
"""

from __future__ import annotations

from .augment.augmix import AugMix
from .augment.color import (
    ColorJitter,
    GaussianBlur,
    RandomAdjustSharpness,
    RandomAutocontrast,
    RandomEqualize,
    RandomGrayscale,
    RandomInvert,
    RandomPosterize,
    RandomSolarize,
)
from .augment.compose import Compose
from .augment.erasing import RandomErasing
from .augment.geometry import RandomAffine, RandomRotation
from .augment.mixing import CutMix, MixUp, RandomChoice
from .augment.per_image import PerImage
from .augment.policies import AutoAugment, RandAugment, TrivialAugmentWide
from .augment.transforms import (
    CenterCrop,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
)
from .imaging.resize import MAX_SIDE, resized_crop

__all__ = [
    "MAX_SIDE",
    "AugMix",
    "AutoAugment",
    "CenterCrop",
    "ColorJitter",
    "Compose",
    "CutMix",
    "GaussianBlur",
    "MixUp",
    "PerImage",
    "RandAugment",
    "RandomAdjustSharpness",
    "RandomAffine",
    "RandomAutocontrast",
    "RandomChoice",
    "RandomEqualize",
    "RandomErasing",
    "RandomGrayscale",
    "RandomHorizontalFlip",
    "RandomInvert",
    "RandomPosterize",
    "RandomResizedCrop",
    "RandomRotation",
    "RandomSolarize",
    "Resize",
    "TrivialAugmentWide",
    "resized_crop",
]
