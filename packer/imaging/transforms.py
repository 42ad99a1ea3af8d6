"""Batched per-sample augmentation on uint8 image batches, on the CPU and on CUDA.

Every module takes ``images``: Tensor[B, C, H, W], uint8 in [0, 255], on any
device, and returns uint8 on the same device; each image gets its own random
parameters. Random numbers are drawn on the CPU from ``generator`` (a CPU
``torch.Generator``; None = torch's default one), so the CPU and CUDA draw the
same parameters for the same seed, then moved to the device with non-blocking
copies: nothing here makes the host wait for the device.

    from packer.transforms import Compose, RandomResizedCrop, RandomHorizontalFlip
    train_tf = Compose([RandomResizedCrop(224), RandomHorizontalFlip()])
    loader = packer.PackLoader(pack, 256, device="cuda", transform=train_tf)
    train_tf[0].size = 160  # progressive resizing: set before an epoch starts
The crop and resize is one batched call, :func:`packer.imaging.resize.resized_crop`
(this module's pixels, its weights and its CUDA kernel). Host work per batch on CUDA
(Compose of crop + flip): one draw from the generator, about 25 numpy passes written
straight into a reused pinned [B, 5] int32 table, one async copy and one launch.
This module needs only torch and numpy (and ``resize.py`` beside it), so it also
imports standalone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

if __package__:
    from .resize import (
        Size,
        check_images,
        pinned_tables,
        resized_crop,
        size_pair,
        taps,
        to_device,
        triton_kernels,
    )
else:  # imported standalone, beside resize.py
    from resize import (  # type: ignore[no-redef]
        Size,
        check_images,
        pinned_tables,
        resized_crop,
        size_pair,
        taps,
        to_device,
        triton_kernels,
    )

# Tries before RandomResizedCrop falls back to a centre crop, as torchvision.
_TRIES = 10


def _np_sizes(size: int | torch.Tensor, batch: int) -> np.ndarray:
    if isinstance(size, torch.Tensor):
        size = size.detach().cpu().numpy()
    return np.broadcast_to(np.asarray(size, dtype=np.int64), (batch,))


# ---------------------------------------------------------------- modules


class _Transform(nn.Module):
    accepts_generator = True

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self._repr_fields().items())

    def _repr_fields(self) -> dict[str, object]:
        return {}


class _SizedTransform(_Transform):
    """A transform with an output ``size`` (h, w), settable between epochs (progressive
    resizing); validated by ``size_pair``."""

    @property
    def size(self) -> tuple[int, int]:
        return self._size

    @size.setter
    def size(self, value: Size) -> None:
        self._size = size_pair(value)


class RandomResizedCrop(_SizedTransform):
    """Per image, a random box of random area and aspect ratio, resized to ``size``.

    Boxes follow ``torchvision.transforms.RandomResizedCrop.get_params`` exactly
    (:meth:`sample_boxes`); pixels follow :func:`resized_crop`. ``size`` is an
    attribute: set it between epochs for progressive resizing.

    Input: Tensor[B, C, H, W] uint8; output: Tensor[B, C, *size] uint8, same device.
    """

    def __init__(
        self,
        size: Size,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        antialias: bool = True,
    ) -> None:
        super().__init__()
        self.size = size
        lo, hi = (float(s) for s in scale)
        if not (0 < lo <= 1 and 0 < hi <= 1):
            raise ValueError(f"scale must lie in (0, 1], not {scale!r}")
        if lo > hi:
            raise ValueError(f"scale must be (min, max) with min <= max, not {scale!r}")
        rlo, rhi = (float(r) for r in ratio)
        if not (rlo > 0 and rhi > 0):
            raise ValueError(f"ratio must be positive, not {ratio!r}")
        if rlo > rhi:
            raise ValueError(f"ratio must be (min, max) with min <= max, not {ratio!r}")
        if not antialias:
            raise ValueError("only antialias=True is implemented (torchvision's default)")
        self.scale = (lo, hi)
        self.ratio = (rlo, rhi)
        self.antialias = antialias

    def _repr_fields(self) -> dict[str, object]:
        return {"size": self.size, "scale": self.scale, "ratio": self.ratio}

    def sample_boxes(
        self,
        batch: int,
        height: int | torch.Tensor,
        width: int | torch.Tensor,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Draw ``batch`` boxes, int64 [B, 4] (top, left, height, width), on the CPU.

        ``height``/``width``: the image size, or int64 [B] per image (a padded
        batch of variable-size images). Per image: up to 10 tries of area ~
        U(scale) * H * W and log aspect ~ U(log ratio), w = round(sqrt(a * r)),
        h = round(sqrt(a / r)); the first try with 0 < w <= W and 0 < h <= H
        wins and its corner is uniform; else a centre crop of the whole image
        with its aspect clamped into ``ratio``. All tries are drawn at once.
        """
        out = np.empty((batch, 4), dtype=np.int64)
        self._draw(batch, height, width, generator, out)
        return torch.from_numpy(out)

    def _draw(
        self,
        batch: int,
        height: int | torch.Tensor,
        width: int | torch.Tensor,
        generator: torch.Generator | None,
        out: np.ndarray,
    ) -> None:
        """:meth:`sample_boxes` into ``out[:, :4]`` (any integer dtype, [B, >=4])."""
        if type(height) is int and type(width) is int:  # one size: no numpy sizes
            if height < 1 or width < 1:
                raise ValueError(f"image size must be positive, not {height!r}x{width!r}")
            hh, ww = height, width
        else:
            hh = _np_sizes(height, batch)
            ww = _np_sizes(width, batch)
            if batch and ((hh < 1) | (ww < 1)).any():
                raise ValueError(f"image size must be positive, not {height!r}x{width!r}")
        # One draw from the generator, then a few numpy passes over [B, 10] in
        # place: each numpy or torch call costs the host microseconds, so there
        # are as few as the arithmetic allows (about 25 for a batch).
        u = torch.rand(batch, 2 * _TRIES + 2, generator=generator, dtype=torch.float64).numpy()
        scalar = batch > 0 and (isinstance(hh, int) or (hh.strides == (0,) and ww.strides == (0,)))
        if scalar:
            hh, ww = int(np.asarray(hh).flat[0]), int(np.asarray(ww).flat[0])
            hf, wf = float(hh), float(ww)  # one image size: Python scalars
        else:
            hh, ww = np.broadcast_to(hh, (batch,)), np.broadcast_to(ww, (batch,))
            hf, wf = hh.astype(np.float64), ww.astype(np.float64)
        area = hf * wf if scalar else (hf * wf)[:, None]
        lo, hi = self.scale
        # The same float operations, in the same order, as torchvision's get_params.
        target = u[:, :_TRIES] * (hi - lo)
        target += lo
        target *= area
        lr0, lr1 = math.log(self.ratio[0]), math.log(self.ratio[1])
        aspect = u[:, _TRIES : 2 * _TRIES] * (lr1 - lr0)
        aspect += lr0
        np.exp(aspect, out=aspect)
        w = target * aspect
        np.sqrt(w, out=w)
        np.round(w, out=w)  # round half to even, as Python's round
        h = np.divide(target, aspect, out=target)
        np.sqrt(h, out=h)
        np.round(h, out=h)
        hcol, wcol = (hf, wf) if scalar else (hf[:, None], wf[:, None])
        ok = w <= wcol
        ok &= h <= hcol
        ok &= w > 0
        ok &= h > 0
        first = ok.argmax(1)  # the first accepted try
        rows = np.arange(batch)
        found = ok[rows, first]
        h = h[rows, first]
        w = w[rows, first]
        # Corner ~ randint(0, H - h + 1), used where a try was accepted.
        top = np.floor(u[:, -2] * (hf - h + 1.0))
        left = np.floor(u[:, -1] * (wf - w + 1.0))
        np.minimum(top, hf - h, out=top)
        np.minimum(left, wf - w, out=left)
        if not found.all():
            # Fallback: the whole image, its aspect clamped into [min, max] ratio,
            # centred.
            hfa = np.broadcast_to(np.asarray(hf), (batch,))
            wfa = np.broadcast_to(np.asarray(wf), (batch,))
            in_ratio = wfa / hfa
            rmin, rmax = min(self.ratio), max(self.ratio)
            fw = np.where(in_ratio > rmax, np.round(hfa * rmax), wfa)
            fh = np.where(in_ratio < rmin, np.round(wfa / rmin), hfa)
            h = np.where(found, h, fh)
            w = np.where(found, w, fw)
            top = np.where(found, top, (hh - h.astype(np.int64)) // 2)
            left = np.where(found, left, (ww - w.astype(np.int64)) // 2)
        out[:, 0] = top
        out[:, 1] = left
        out[:, 2] = h
        out[:, 3] = w

    def forward(
        self,
        images: torch.Tensor,
        generator: torch.Generator | None = None,
        *,
        flip: torch.Tensor | None = None,
    ) -> torch.Tensor:
        check_images(images)
        b, _, h, w = images.shape
        boxes = self.sample_boxes(b, h, w, generator)
        return resized_crop(images, boxes, self.size, flip=flip)


class RandomHorizontalFlip(_Transform):
    """Mirror each image left-right with probability ``p``, independently per image.

    Input and output: Tensor[B, C, H, W] uint8, same device.
    """

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if not 0.0 <= float(p) <= 1.0:
            raise ValueError(f"p must lie in [0, 1], not {p!r}")
        self.p = float(p)

    def _repr_fields(self) -> dict[str, object]:
        return {"p": self.p}

    def sample(self, batch: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Which images to flip: Tensor[B] bool, on the CPU."""
        return torch.rand(batch, generator=generator) < self.p

    def forward(
        self, images: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        check_images(images)
        mask = to_device(self.sample(images.shape[0], generator), images.device)
        return torch.where(mask[:, None, None, None], images.flip(-1), images)


class CenterCrop(_SizedTransform):
    """The centre ``size`` of every image (no resampling), as torchvision's CenterCrop.

    Input: Tensor[B, C, H, W] uint8 with H, W >= size; output Tensor[B, C, *size]
    uint8 (a new tensor). ``size`` is settable.
    """

    def __init__(self, size: Size) -> None:
        super().__init__()
        self.size = size

    def _repr_fields(self) -> dict[str, object]:
        return {"size": self.size}

    def forward(
        self, images: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        check_images(images)
        oh, ow = self.size
        h, w = images.shape[-2:]
        if oh > h or ow > w:
            raise ValueError(f"CenterCrop{self.size} is larger than the {h}x{w} images")
        top = round((h - oh) / 2.0)
        left = round((w - ow) / 2.0)
        return images[..., top : top + oh, left : left + ow].contiguous()


class Resize(_Transform):
    """Antialiased resize of every image, as torchvision's ``Resize(size, antialias=True)``.

    ``size``: (height, width), or an int for the shorter side (the longer one
    becomes ``int(size * long / short)``, torchvision's rule). Input
    Tensor[B, C, H, W] uint8; output uint8 on the same device.
    """

    def __init__(self, size: Size) -> None:
        super().__init__()
        self.size = size

    @property
    def size(self) -> int | tuple[int, int]:
        return self._size

    @size.setter
    def size(self, value: Size) -> None:
        pair = size_pair(value)  # validates
        self._size = value if isinstance(value, int) else pair

    def _repr_fields(self) -> dict[str, object]:
        return {"size": self.size}

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        if not isinstance(self.size, int):
            return self.size
        short, long = (height, width) if height <= width else (width, height)
        new_long = int(self.size * long / short)
        return (self.size, new_long) if height <= width else (new_long, self.size)

    def forward(
        self, images: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        check_images(images)
        b, _, h, w = images.shape
        boxes = torch.tensor([[0, 0, h, w]], dtype=torch.int64).expand(b, 4)
        return resized_crop(images, boxes, self.output_size(h, w))


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
    (:mod:`packer.imaging.fused`).

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
                check_images(images)
                b, _, h, w = images.shape
                if images.is_cuda and b:
                    fused = _crop_flip_cuda(t, nxt, images, generator)
                    if fused is not None:
                        images = fused
                        i += 2
                        continue
                boxes = t.sample_boxes(b, h, w, generator)
                flip = nxt.sample(b, generator)
                images = resized_crop(images, boxes, t.size, flip=flip)
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


def _fused_module(images: object):  # -> packer.imaging.fused or None
    """The fused recipe's module where a batch may take it (a CUDA tensor; the tests
    also let CPU tensors through, under Triton's interpreter)."""
    if not __package__ or not isinstance(images, torch.Tensor):
        return None
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
    # The largest box is the whole image: if the kernel suits that, it suits all.
    if not kernels.fits((h / oh, w / ow)):
        return None
    ring = pinned_tables(images.device)
    k, table, arr = ring.take(b)
    crop._draw(b, h, w, generator, arr)
    arr[:, 4] = torch.rand(b, generator=generator).numpy() < flip.p
    sy, sx = int(arr[:, 2].max()) / oh, int(arr[:, 3].max()) / ow
    return kernels.resample(images, ring.send(k, table), oh, ow, taps(sy), taps(sx), (sy, sx))
