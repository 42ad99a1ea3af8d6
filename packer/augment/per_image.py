"""torchvision transforms on a batch: which ones draw once per call, and :class:`PerImage`.

A torchvision transform draws its random parameters once per call. Called on a
loader's batch [B, C, H, W], that is one crop, one flip, one erased box for the
whole batch: every image of the batch gets the same augmentation, silently.
:func:`refuse_batch_wide` is the loader's check against that; :class:`PerImage`
is the slow, exact escape hatch (one call per image).

Imports only torch (and packer.errors), so the loader can run the check without
importing torchvision or packer.transforms.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from ..errors import UsageError

# torchvision classes known to draw nothing at random: allowed on a batch. Anything
# else from torchvision is refused; a new torchvision op is refused until it is listed
# here (an allow-list, so a random op is never let through by omission).
DETERMINISTIC = frozenset(
    {
        # torchvision.transforms (v1) and .v2
        "CenterCrop",
        "ClampBoundingBoxes",
        "ClampKeyPoints",
        "ConvertBoundingBoxFormat",
        "ConvertImageDtype",
        "FiveCrop",
        "Grayscale",
        "Identity",
        "LinearTransformation",
        "Normalize",
        "Pad",
        "PILToTensor",
        "Resize",
        "RGB",
        "SanitizeBoundingBoxes",
        "SanitizeKeyPoints",
        "SetClampingMode",
        "TenCrop",
        "ToDtype",
        "ToImage",
        "ToPILImage",
        "ToPureTensor",
        "ToTensor",
        "UniformTemporalSubsample",
        # torchvision.transforms._presets: the weights' eval transforms
        "ImageClassification",
    }
)

# Containers looked into (each element is checked).
# The global RNGs PerImage seeds are one per process: two loaders' producer threads
# running PerImage at once would draw from each other's seeds (a resume would then not
# redraw the same augmentations). One at a time.
_GLOBAL_RNG = threading.Lock()

_CONTAINERS = frozenset({"Compose"})

# Base classes of user-written torchvision transforms: a subclass of one of these is
# the user's own code, whose randomness imgpack cannot see.
_BASES = frozenset({"Transform", "Module"})

# What a refused op draws once per call, and its packer.transforms equivalent (None: none).
_OPS: dict[str, tuple[str, str | None]] = {
    "RandomResizedCrop": ("one crop box", "RandomResizedCrop"),
    "RandomHorizontalFlip": ("one coin flip", "RandomHorizontalFlip"),
    "ColorJitter": ("one set of colour factors", "ColorJitter"),
    "RandomErasing": ("one box", "RandomErasing"),
    "TrivialAugmentWide": ("one op and magnitude", "TrivialAugmentWide"),
    "RandAugment": ("one set of ops and magnitudes", "RandAugment"),
    "AutoAugment": ("one sub-policy", "AutoAugment"),
    "AugMix": ("one set of chains and mixing weights", "AugMix"),
    "GaussianBlur": ("one sigma", "GaussianBlur"),
    "RandomRotation": ("one angle", "RandomRotation"),
    "RandomAffine": ("one set of affine parameters", "RandomAffine"),
    "RandomGrayscale": ("one coin flip", "RandomGrayscale"),
    "RandomPosterize": ("one coin flip", "RandomPosterize"),
    "RandomSolarize": ("one coin flip", "RandomSolarize"),
    "RandomAdjustSharpness": ("one coin flip", "RandomAdjustSharpness"),
    "RandomAutocontrast": ("one coin flip", "RandomAutocontrast"),
    "RandomEqualize": ("one coin flip", "RandomEqualize"),
    "RandomInvert": ("one coin flip", "RandomInvert"),
    "RandomApply": ("one coin flip", None),
    "RandomChoice": ("one choice", None),
    "RandomOrder": ("one order", None),
    "RandomCrop": ("one crop position", None),
    "RandomVerticalFlip": ("one coin flip", None),
    "RandomPerspective": ("one distortion", None),
    "ElasticTransform": ("one displacement field", None),
}

# torchvision's batch mixers need the labels, which a plain transform never gets.
_MIXERS = frozenset({"MixUp", "CutMix"})


def _torchvision_class(t: object) -> type | None:
    """The class that makes ``t`` a torchvision transform: its own class when torchvision
    defines it, else its nearest torchvision base (a user's subclass of, say,
    RandomErasing), else None (not torchvision, or only a subclass of a generic base)."""
    for cls in type(t).__mro__:
        if cls.__module__.split(".")[0] == "torchvision":
            return None if cls.__name__ in _BASES and cls is not type(t) else cls
    return None


def _elements(t: object) -> Iterator[object]:
    """What a container holds: a torchvision Compose's ``transforms``, an nn.Sequential's
    modules (packer.transforms.Compose included: a plain callable in it is ``.fn``)."""
    if isinstance(t, nn.Sequential):
        for m in t:
            yield getattr(m, "fn", m) if type(m).__name__ == "_Call" else m
    else:
        yield from getattr(t, "transforms", ())


def _message(name: str, cls: type) -> str:
    where = "torchvision.transforms.v2" if ".v2" in cls.__module__ else "torchvision.transforms"
    if name in _MIXERS or name.startswith("RandomChoice of"):
        twin = f"{name}(alpha, num_classes)" if name in _MIXERS else "RandomChoice"
        return (
            f"transform: {where}.{name} needs the labels, which a loader's transform gets only "
            f"when it mixes them; use packer.transforms.{twin} (MixUp, CutMix, RandomChoice "
            "of them): the loader passes it the labels and yields soft labels"
        )
    if name == "Lambda":
        return (
            f"transform: {where}.Lambda may draw random numbers, and would draw them once for "
            "the whole batch here; pass its function itself (transform=fn, called on the "
            "uint8 batch [B, 3, H, W]), or wrap it: packer.transforms.PerImage(t) (a loop "
            "over images, slow)"
        )
    what, twin = _OPS.get(name, ("its random parameters once", None))
    use = (
        f"use packer.transforms.{twin} (per image), or wrap it"
        if twin is not None
        else "packer.transforms has no batched equivalent; wrap it"
    )
    return (
        f"transform: torchvision's {name} draws {what} for the whole batch here ({where}."
        f"{name} is called once per batch); {use}: packer.transforms.PerImage(t) (a loop "
        "over images, slow)"
    )


def refuse_batch_wide(transform: object) -> None:
    """Raise UsageError when ``transform`` (or anything inside it) is a torchvision
    transform that draws random parameters, naming it and its ``packer.transforms``
    equivalent.

    The rule is an allow-list: a transform from ``torchvision.transforms`` (v1) or
    ``torchvision.transforms.v2`` passes only if its class is in
    :data:`DETERMINISTIC` (Normalize, Resize, CenterCrop, ToDtype, Pad, Grayscale,
    ...); every other torchvision class is refused, so a random op is never let
    through because nobody listed it. torchvision ``Compose`` (v1 and v2),
    ``nn.Sequential`` and ``packer.transforms.Compose`` are looked into;
    :class:`PerImage` and callables that are not torchvision's pass as they are.
    """
    seen: set[int] = set()
    todo = [transform]
    while todo:
        t = todo.pop()
        if id(t) in seen or isinstance(t, PerImage):
            continue
        seen.add(id(t))
        cls = _torchvision_class(t)
        if cls is not None and cls.__name__ in _CONTAINERS:
            todo.extend(_elements(t))
            continue
        if cls is None:
            if isinstance(t, nn.Sequential):
                todo.extend(_elements(t))
            continue
        if cls.__name__ not in DETERMINISTIC:
            name = cls.__name__
            inner = [_torchvision_class(e) for e in getattr(t, "transforms", ())]
            if name == "RandomChoice" and any(
                c is not None and c.__name__ in _MIXERS for c in inner
            ):
                name = "RandomChoice of MixUp/CutMix"
            raise UsageError(_message(name, cls))


class PerImage(nn.Module):
    """Run a per-image transform (any torchvision transform) on each image of a batch.

    ``PerImage(t)(images, generator=g)`` calls ``t`` once per image, so each image
    gets its own random parameters, drawn by torchvision's own code. For the ops
    ``packer.transforms`` has, use those instead: this is a Python loop.

    Reproducible: one seed is drawn from ``generator`` (the loader's per-batch
    generator, on the CPU) per batch, and the loop runs with torch's RNG (CPU, and
    the images' CUDA device) and Python's ``random`` seeded from it inside a fork
    (:func:`torch.random.fork_rng`), so the same seed gives the same images, a
    resumed loader redraws what the uninterrupted one drew, and the global RNG
    states are left as they were.

    Cost: B calls of ``t`` and one ``torch.stack`` per batch, where a
    ``packer.transforms`` op is one batched call. On CUDA that is B times the op's
    kernel launches, each waiting on Python: many times one torchvision call on the
    whole batch (docs/PERFORMANCE.md, section "Figures behind the code", row
    "PerImage").

    Input: Tensor[B, C, H, W] (what the loader gives: uint8 in [0, 255], or what an
    earlier transform made), any device. Output: the per-image results stacked,
    Tensor[B, ...] on the same device; they must all have one shape.
    """

    accepts_generator = True

    def __init__(self, transform: Callable[[torch.Tensor], Any]) -> None:
        super().__init__()
        if not callable(transform):
            raise ValueError(f"PerImage takes a callable, not {type(transform).__name__}")
        if getattr(transform, "mixes_labels", False) or type(transform).__name__ in _MIXERS:
            raise ValueError(
                f"PerImage cannot run {type(transform).__name__}: it mixes images with their "
                "labels; use packer.transforms.MixUp/CutMix as the loader's transform"
            )
        self.transform = transform

    def extra_repr(self) -> str:
        return "" if isinstance(self.transform, nn.Module) else repr(self.transform)

    def forward(
        self, images: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        if not isinstance(images, torch.Tensor) or images.dim() != 4:
            shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images)
            raise ValueError(f"images must be a batch Tensor [B, C, H, W], not {shape}")
        seed = int(torch.randint(0, 2**62, (1,), generator=generator))
        devices = [images.device] if images.device.type == "cuda" else []
        with _GLOBAL_RNG:
            outs = self._each(images, seed, devices)
        if not outs:
            return images.clone()
        shapes = {tuple(o.shape) for o in outs}
        if len(shapes) > 1:
            raise ValueError(
                f"PerImage({type(self.transform).__name__}) gave images of {len(shapes)} "
                f"shapes ({sorted(shapes)[:3]}...); a batch needs one (e.g. no expand=True)"
            )
        return torch.stack([torch.as_tensor(o) for o in outs])

    def _each(self, images: torch.Tensor, seed: int, devices: list) -> list:
        py_state = random.getstate()
        try:
            with torch.random.fork_rng(devices=devices):
                torch.random.default_generator.manual_seed(seed)
                if devices:
                    with torch.cuda.device(images.device):
                        torch.cuda.manual_seed(seed)
                random.seed(seed)
                return [self.transform(img) for img in images]
        finally:
            random.setstate(py_state)
