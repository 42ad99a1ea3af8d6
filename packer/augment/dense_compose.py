"""What a dense op is (:class:`DenseOp`), how ops chain (:class:`Compose`), image-only
colour ops (:class:`ColorOnly`), and the refusal of anything else where a dense op is
expected (:func:`as_dense_op`): a torchvision transform (it draws from torch's global
generator once per call and knows no Sample) or a batch-only ``packer.transforms`` op
(it would move the image and leave its boxes and masks behind), named in the error."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from ..errors import UsageError
from ..imaging.resize import ArgumentError
from .dense_sample import Sample

Params = dict[str, Any] | None

# The ops of packer.augment.dense, named in a refusal of torchvision's namesake.
DENSE_OPS = frozenset(
    {
        "FixedSizeCrop", "Pad", "PadTo", "PadToMultiple", "RandomAffine",
        "RandomHorizontalFlip", "RandomIoUCrop", "RandomResize", "RandomResizedCrop",
        "RandomRotation", "RandomZoomOut", "Resize", "SanitizeBoundingBoxes", "ScaleJitter",
    }
)  # fmt: skip


class DenseOp:
    """Base of the ops: ``op(sample, generator)`` = ``apply(sample, sample_params(...))``."""

    def sample_params(self, s: Sample, generator: torch.Generator | None = None) -> Params:
        return {}

    def apply(self, s: Sample, params: Params) -> Sample:
        raise NotImplementedError

    def __call__(self, s: Sample, generator: torch.Generator | None = None) -> Sample:
        if not isinstance(s, Sample):
            raise ArgumentError(
                f"{type(self).__name__}: takes a packer.augment.dense.Sample, not "
                f"{type(s).__name__}"
            )
        params = self.sample_params(s, generator)
        return s if params is None else self.apply(s, params)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"


# packer.transforms ops that move pixels (or mix images): they would leave the targets behind.
_MOVES_PIXELS = frozenset(
    {
        "RandomResizedCrop", "RandomHorizontalFlip", "CenterCrop", "Resize", "RandomRotation",
        "RandomAffine", "TrivialAugmentWide", "RandAugment", "AutoAugment", "AugMix", "MixUp",
        "CutMix", "RandomChoice", "PerImage",
    }
)  # fmt: skip


def _torchvision_name(obj: object) -> str | None:
    for cls in type(obj).__mro__:
        if cls.__module__.split(".")[0] == "torchvision":
            return f"{cls.__module__.replace('._', '.').rsplit('.', 1)[0]}.{type(obj).__name__}"
    return None


def _refuse_torchvision(obj: object, where: str) -> None:
    name = _torchvision_name(obj)
    if name is None:
        return
    op = type(obj).__name__
    twin = f"packer.augment.dense.{op}" if op in DENSE_OPS else "the packer.augment.dense op"
    raise UsageError(
        f"{where}: {name} is a torchvision transform, not a packer dense op: it draws from "
        f"torch's global generator once per call and does not take a Sample; use {twin} "
        "(colour ops: ColorOnly(packer.transforms.<op>))"
    )


class ColorOnly(DenseOp):
    """Apply an image-only transform (a ``packer.transforms`` colour op such as
    ColorJitter, RandomGrayscale, GaussianBlur, RandomErasing, or a callable on a uint8
    batch [1, C, H, W]) to the image; the targets are kept as they are. Ops that move
    pixels (crops, flips, warps, the policies) or mix images are refused."""

    def __init__(self, transform: Any) -> None:
        _refuse_torchvision(transform, "ColorOnly")
        todo = [transform]
        while todo:
            t = todo.pop()
            _refuse_torchvision(t, "ColorOnly")
            name = type(t).__name__
            if name in _MOVES_PIXELS and type(t).__module__.startswith("packer."):
                raise UsageError(
                    f"ColorOnly: packer.transforms.{name} moves pixels (or mixes images) and "
                    f"would leave the boxes and masks behind; use packer.augment.dense's ops"
                )
            if isinstance(t, nn.Sequential):
                todo.extend(getattr(m, "fn", m) for m in t)
        if not callable(transform):
            raise UsageError(f"ColorOnly: takes a callable, not {type(transform).__name__}")
        self.transform = transform
        self._takes_generator = getattr(transform, "accepts_generator", False) or isinstance(
            transform, nn.Sequential
        )

    def apply(self, s: Sample, params: Params) -> Sample:
        raise UsageError("ColorOnly: draws while it runs; call it as op(sample, generator)")

    def __call__(self, s: Sample, generator: torch.Generator | None = None) -> Sample:
        batch = s.image[None]
        out = (
            self.transform(batch, generator=generator)
            if self._takes_generator
            else self.transform(batch)
        )
        if (
            not isinstance(out, torch.Tensor)
            or out.shape != batch.shape
            or out.dtype != torch.uint8
        ):
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise UsageError(
                f"ColorOnly({type(self.transform).__name__}): must return a uint8 batch of "
                f"{tuple(batch.shape)}, not {got}"
            )
        return replace(s, image=out[0])


def as_dense_op(obj: object, where: str = "transform") -> DenseOp:
    """``obj`` when it is a dense op; UsageError naming it otherwise (a torchvision
    transform, a batched ``packer.transforms`` op, any other object)."""
    if isinstance(obj, DenseOp):
        return obj
    _refuse_torchvision(obj, where)
    name = type(obj).__name__
    if type(obj).__module__.startswith("packer."):
        raise UsageError(
            f"{where}: packer.transforms.{name} works on image batches only; geometry: use "
            f"packer.augment.dense's ops, colour: ColorOnly(packer.transforms.{name}(...))"
        )
    raise UsageError(f"{where}: expected a packer.augment.dense op, not {name}")


class Compose(DenseOp):
    """Run ``ops`` in order, each drawing from the same generator."""

    def __init__(self, ops: Sequence[object]) -> None:
        if isinstance(ops, (str, bytes)) or not isinstance(ops, Sequence):
            raise UsageError(f"Compose: takes a list of dense ops, not {type(ops).__name__}")
        self.ops = [as_dense_op(op, f"Compose (item {i})") for i, op in enumerate(ops)]

    def apply(self, s: Sample, params: Params) -> Sample:
        raise UsageError("Compose: draws while it runs; call it as op(sample, generator)")

    def __call__(self, s: Sample, generator: torch.Generator | None = None) -> Sample:
        for op in self.ops:
            s = op(s, generator)
        return s
