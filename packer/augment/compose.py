"""``Compose``: the augment stage's ops in order, each given the loader's generator, the
labels passed through the batch mixers. A RandomResizedCrop followed by a
RandomHorizontalFlip runs as one resample (on CUDA one launch from a pinned table of
draws, :func:`_crop_flip_cuda`); on CUDA the modern recipe's ops in a row take the
fused kernels of :mod:`packer.augment.fused`. It sits above every op, so no op module
imports it."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..imaging.resize import check_images, pinned_tables, resized_crop, taps, triton_kernels
from .transforms import RandomHorizontalFlip, RandomResizedCrop


class _Call(nn.Module):
    """A plain callable inside Compose (nn.Sequential holds modules only)."""

    def __init__(self, fn: object) -> None:
        super().__init__()
        self.fn = fn
        self.accepts_generator = getattr(fn, "accepts_generator", False)
        self.mixes_labels = getattr(fn, "mixes_labels", False)

    def forward(self, images: torch.Tensor, *args: object, **kw: object) -> torch.Tensor:
        return self.fn(images, *args, **kw)

    def extra_repr(self) -> str:
        return repr(self.fn)


class Compose(nn.Sequential):
    """Apply transforms in order, passing ``generator`` to those that accept one.

    A RandomResizedCrop directly followed by a RandomHorizontalFlip runs as one
    resample (the flip reverses the interpolation matrix), drawing the same
    random numbers in the same order as the two run one after the other. On
    CUDA, the modern recipe's ops in a row (crop + flip, a policy, Normalize,
    RandomErasing, MixUp/CutMix) run as a few fused kernels with the same draws
    (:mod:`packer.augment.fused`).

    Labels: ``compose(images, labels, generator=g)`` returns ``(images, labels)``,
    the labels passed through the batch mixers (MixUp, CutMix: elements with
    ``mixes_labels``) and left as they are by the other elements. A Compose
    holding a mixer has ``mixes_labels`` True and must be given labels; one
    without returns just the images when called without labels, as before.
    """

    accepts_generator = True

    @property
    def mixes_labels(self) -> bool:
        return any(getattr(t, "mixes_labels", False) for t in self)

    def __init__(self, transforms: Sequence[nn.Module]) -> None:
        for t in transforms:
            if not callable(t):
                raise ValueError(f"Compose takes callables, not {t!r}")
        super().__init__(*(t if isinstance(t, nn.Module) else _Call(t) for t in transforms))

    def forward(
        self,
        images: torch.Tensor,
        labels: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if isinstance(labels, torch.Generator):  # the old call compose(images, generator)
            labels, generator = None, labels
        mods = list(self)
        fast = _fused_module(images)
        i = 0
        while i < len(mods):
            plan = None if fast is None else fast.match(mods, i)
            if plan is not None and plan.applies(images, labels):
                images, labels = plan.run(images, labels, generator)
                i = plan.end
                continue
            t = mods[i]
            nxt = mods[i + 1] if i + 1 < len(mods) else None
            if isinstance(t, RandomResizedCrop) and isinstance(nxt, RandomHorizontalFlip):
                check_images(images, t)
                b, _, h, w = images.shape
                if images.is_cuda and b:
                    fused = _crop_flip_cuda(t, nxt, images, generator)
                    if fused is not None:
                        images = fused
                        i += 2
                        continue
                boxes = t.sample_boxes(b, h, w, generator)
                flip = nxt.sample(b, generator)
                mode, aa = t.interpolation, t.antialias
                images = resized_crop(
                    images, boxes, t.size, flip=flip, interpolation=mode, antialias=aa
                )
                i += 2
                continue
            if getattr(t, "mixes_labels", False):
                if labels is None:
                    raise ValueError(
                        f"{type(t).__name__} mixes labels: call the Compose as "
                        "compose(images, labels, generator=g)"
                    )
                if getattr(t, "accepts_generator", False):
                    images, labels = t(images, labels, generator=generator)
                else:
                    images, labels = t(images, labels)
            elif getattr(t, "accepts_generator", False):
                images = t(images, generator=generator)
            else:
                images = t(images)
            i += 1
        return images if labels is None else (images, labels)


def _fused_module(images: object):  # -> packer.augment.fused or None
    """The fused recipe's module where a batch may take it (a CUDA tensor; the tests
    also let CPU tensors through, under Triton's interpreter)."""
    if not isinstance(images, torch.Tensor):
        return None
    # Imported on the first call, not for a circle (fused.py never imports this module):
    # it loads every op of the recipe (0.2 s), and the JPEG loader's crop
    # (loading/crop.py) imports Compose only to recognise one.
    from . import fused

    if not fused.ENABLED or (fused.DEVICES == "cuda" and not images.is_cuda):
        return None
    return fused


def _crop_flip_cuda(
    crop: RandomResizedCrop,
    flip: RandomHorizontalFlip,
    images: torch.Tensor,
    generator: torch.Generator | None,
) -> torch.Tensor | None:
    """RandomResizedCrop then flip on CUDA, with the least host work per batch.

    Draws exactly what ``sample_boxes`` then ``RandomHorizontalFlip.sample`` draw,
    writes them into one pinned int32 [B, 5] table (boxes from the sampler lie
    inside the image, so there is nothing to check), copies it once and launches
    the kernel. Returns None where the kernel does not apply (no Triton, or a
    downscale the dense route handles better); nothing has been drawn then.
    """
    kernels = triton_kernels()
    if kernels is None:
        return None
    b, _, h, w = images.shape
    oh, ow = crop.size
    mode, aa = crop.interpolation, crop.antialias
    # The largest box is the whole image: if the kernel suits that, it suits all.
    if not kernels.fits((h / oh, w / ow), mode):
        return None
    ring = pinned_tables(images.device)
    k, table, arr = ring.take(b)
    crop._draw(b, h, w, generator, arr)
    arr[:, 4] = torch.rand(b, generator=generator).numpy() < flip.p
    sy, sx = int(arr[:, 2].max()) / oh, int(arr[:, 3].max()) / ow
    ky, kx = taps(sy, mode, aa), taps(sx, mode, aa)
    return kernels.resample(images, ring.send(k, table), oh, ow, ky, kx, (sy, sx), mode, aa)
