"""The loader's transform, applied to a batch and its result checked: uint8 or float
images [B, 3, h, w] on the loader's device, and, from a label-mixing transform, soft
labels float [B, K]. Shared by every pass strategy and the resident path."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..errors import UsageError
from .order import batch_seed


def _transform_name(transform: Callable[..., Any]) -> str:
    return getattr(transform, "__qualname__", None) or type(transform).__name__


def _check_transformed(
    transform: Callable[..., Any], images: torch.Tensor, out: Any
) -> torch.Tensor:
    """What a transform returned, if it can be yielded as the batch's images beside its
    labels: a Tensor [B, 3, h, w] (the same B as its input, h and w >= 1), uint8 or
    floating point, on the input's device. Metadata only, so no host sync on CUDA."""
    name = _transform_name(transform)
    if not isinstance(out, torch.Tensor):
        raise UsageError(
            f"transform {name} returned {type(out).__name__}, not a Tensor; a transform "
            "maps a uint8 batch [B, 3, H, W] to a Tensor [B, 3, h, w]"
        )
    b = images.shape[0]
    if out.dim() == 0 or out.shape[0] != b:
        raise UsageError(
            f"transform {name} returned shape {list(out.shape)} for a batch of {b}; it must "
            f"keep the batch size (first dimension {b}) so images and labels stay paired"
        )
    if out.dim() != 4 or out.shape[1] != images.shape[1] or min(out.shape[2:]) < 1:
        raise UsageError(
            f"transform {name} returned shape {list(out.shape)}; it must return images "
            f"[B, 3, h, w] ({b} images of 3 channels), as it is given"
        )
    if out.dtype != torch.uint8 and not out.dtype.is_floating_point:
        raise UsageError(
            f"transform {name} returned {out.dtype}; a transform returns uint8 or floating "
            "point images"
        )
    if out.device != images.device:
        raise UsageError(
            f"transform {name} returned images on {out.device}, not on the loader's device "
            f"{images.device}"
        )
    return out


def _apply_transform(
    transform: Callable[..., torch.Tensor] | None,
    images: torch.Tensor,
    gen: torch.Generator | None,
    seeds: tuple[int, int, int],
    b: int,
) -> torch.Tensor:
    if transform is None:
        return images
    if gen is None:
        return _check_transformed(transform, images, transform(images))
    gen.manual_seed(batch_seed(seeds[0], seeds[1], seeds[2], b))
    return _check_transformed(transform, images, transform(images, generator=gen))


def _transform_batch(
    transform: Callable[..., Any] | None,
    images: torch.Tensor,
    labels: torch.Tensor,
    gen: torch.Generator | None,
    seeds: tuple[int, int, int],
    b: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch through the loader's transform: ``(images, labels)``, the labels mixed
    (float [B, K]) by a transform with ``mixes_labels``, else as they came."""
    if not getattr(transform, "mixes_labels", False):
        return _apply_transform(transform, images, gen, seeds, b), labels
    if gen is not None:
        gen.manual_seed(batch_seed(seeds[0], seeds[1], seeds[2], b))
    return _mix(transform, images, labels, gen)


def _mix(
    transform: Callable[..., Any],
    images: torch.Tensor,
    labels: torch.Tensor,
    gen: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``transform(images, labels, generator=gen)`` for a label-mixing transform, its
    result checked: images as :func:`_check_transformed`, soft labels a floating point
    Tensor [B, K] on the images' device. Metadata only, so no host sync on CUDA."""
    out = transform(images, labels, generator=gen)
    name = _transform_name(transform)
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise UsageError(
            f"transform {name} mixes labels (mixes_labels = True) but returned "
            f"{type(out).__name__}, not (images, soft_labels)"
        )
    mixed, soft = out
    mixed = _check_transformed(transform, images, mixed)
    b = images.shape[0]
    if (
        not isinstance(soft, torch.Tensor)
        or not soft.dtype.is_floating_point
        or soft.dim() != 2
        or soft.shape[0] != b
    ):
        got = (
            f"{soft.dtype} {list(soft.shape)}"
            if isinstance(soft, torch.Tensor)
            else type(soft).__name__
        )
        raise UsageError(
            f"transform {name} returned soft labels {got}; a label-mixing transform "
            f"returns float labels [{b}, num_classes]"
        )
    if soft.device != images.device:
        raise UsageError(
            f"transform {name} returned soft labels on {soft.device}, not on the loader's "
            f"device {images.device}"
        )
    return mixed, soft
