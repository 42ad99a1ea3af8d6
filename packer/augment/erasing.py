"""RandomErasing: per image, with probability ``p``, a random box set to ``value``.

Works on uint8 images (before ``packer.Normalize``) and on floating, normalized
ones (after it, where torchvision's classification reference erases), returning
the input's dtype. Boxes follow torchvision's rule (``RandomErasing.get_params``): its
exact distribution for the image size, drawn with four uniforms per image (or, for a
fixed scale or ratio, the ten tries of each image to erase at once); an image without
a fitting try is left as it is.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from ..imaging.resize import MAX_SIDE, ArgumentError, zero_size
from . import functional as F
from .base import _Transform
from .draws import TRIES, box_table, draw_boxes, first_fit, host_rng, size_column, try_sides
from .params import constant, number, send


class ErasingParams(NamedTuple):
    """RandomErasing's draw for a batch, on the CPU."""

    erase: torch.Tensor  # bool [B]: chosen (probability p) and a try fitted
    boxes: torch.Tensor  # int64 [B, 4] (top, left, height, width); zeros where not erased


class RandomErasing(_Transform):
    """Erase a random box of each image with probability ``p``, as torchvision's RandomErasing.

    Args:
      p: probability that an image is erased.
      scale: (min, max) of the box area as a fraction of the image area, in [0, 1].
      ratio: (min, max) of the box aspect ratio (height / width), drawn log-uniform.
      value: the erased pixels: a number, one number per channel, or "random":
        for floating images standard normal noise per pixel (torchvision's);
        for uint8 images (where torchvision's float noise would wrap) uniform
        integers in [0, 255]. Numbers are converted to the images' dtype as
        torchvision assigns them (uint8 truncates). The noise comes from a
        generator on the images' device seeded from ``generator``: a seed gives
        the same noise on the same device, not the same on the CPU and CUDA
        (the boxes are the same).
      inplace: write into ``images`` instead of a copy.

    Input ``images``: Tensor[B, C, H, W], uint8 in [0, 255] or floating (e.g.
    normalized), any device. Output: the same dtype, shape and device (the
    input itself when no image is erased, or with ``inplace``).
    """

    def __init__(
        self,
        p: float = 0.5,
        scale: Sequence[float] = (0.02, 0.33),
        ratio: Sequence[float] = (0.3, 3.3),
        value: float | Sequence[float] | str = 0,
        inplace: bool = False,
    ) -> None:
        super().__init__()
        if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 <= p <= 1.0:
            raise ValueError(f"p must be a probability in [0, 1], not {p!r}")
        if not isinstance(scale, Sequence) or len(scale) != 2:
            raise ValueError(f"scale must be (min, max), not {scale!r}")
        if not isinstance(ratio, Sequence) or len(ratio) != 2:
            raise ValueError(f"ratio must be (min, max), not {ratio!r}")
        lo, hi = float(scale[0]), float(scale[1])
        if not 0.0 <= lo <= hi <= 1.0:
            raise ValueError(f"scale must be (min, max) within [0, 1], not {scale!r}")
        rlo, rhi = float(ratio[0]), float(ratio[1])
        if not 0.0 < rlo <= rhi:
            raise ValueError(f"ratio must be (min, max), both positive, not {ratio!r}")
        for r in (rlo, rhi):
            number(r, "ratio", "RandomErasing", 1 / MAX_SIDE, MAX_SIDE)
        if isinstance(value, str):
            if value != "random":
                raise ValueError(f"value must be a number, numbers or 'random', not {value!r}")
        elif isinstance(value, numbers.Real) and not isinstance(value, bool):
            value = float(value)
        elif (
            isinstance(value, Sequence)
            and value
            and all(isinstance(v, numbers.Real) for v in value)
        ):
            value = tuple(float(v) for v in value)
        else:
            raise ValueError(f"value must be a number, numbers or 'random', not {value!r}")
        self.p = float(p)
        self.scale = (lo, hi)
        self.ratio = (rlo, rhi)
        self.value = value
        self.inplace = bool(inplace)

    def _repr_fields(self) -> dict[str, object]:
        keys = ("p", "scale", "ratio", "value", "inplace")
        return {k: getattr(self, k) for k in keys}

    def sample(
        self, batch: int, height: int, width: int, generator: torch.Generator | None = None
    ) -> ErasingParams:
        """Per image, whether it is erased and its box, for ``height`` x ``width`` images.

        As torchvision: with probability p, up to ten tries of an area ``U(scale) * H *
        W`` and an aspect ``exp(U(log ratio))``, h = round(sqrt(area * aspect)), w =
        round(sqrt(area / aspect)) (half to even, as Python's round); the first try
        with h < H and w < W wins and its corner is uniform (``randint(0, H - h + 1)``,
        ``randint(0, W - w + 1)``); an image without one is not erased. From the exact
        table of that distribution (:func:`~packer.augment.draws.box_table`): four
        uniforms per image from :func:`~packer.augment.draws.host_rng` (one draw from
        ``generator``); where there is none (a fixed scale or ratio), from the coins
        and then the tries of the images to erase.
        """
        if height < 1 or width < 1:
            raise ValueError(f"image size must be positive, not {height!r}x{width!r}")
        table = box_table("erase", height, width, self.scale, self.ratio, self.p)
        rng = host_rng(generator)
        if table is not None:
            k, box = draw_boxes(table, rng.random((4, batch)))  # zeros where not erased
            erase = torch.from_numpy(k < table.found)
            return ErasingParams(erase, torch.from_numpy(box.T.astype(np.int64, order="C")))
        idx = (rng.random(batch) < self.p).nonzero()[0]
        erase = np.zeros(batch, dtype=bool)
        boxes = np.zeros((batch, 4), dtype=np.int64)
        n = len(idx)
        if n:
            u = rng.random((2 * TRIES + 2, n))  # areas, aspects, the corner
            area = float(height * width)
            wh = try_sides(u[:TRIES], u[TRIES : 2 * TRIES], area, self.scale, self.ratio)
            size = size_column(height, width)  # [2, 1, 1]
            fit = wh[::-1] < size
            box = np.empty((4, n))  # top, left, h, w
            np.take(wh[::-1].reshape(2, -1), first_fit(fit[0] & fit[1]), 1, box[2:])
            # floor(u * (H - h + 1)): u is at most 1 - 2**-53, so this stays below H - h + 1.
            np.subtract(size[:, 0] + 1.0, box[2:], out=box[:2])
            box[:2] *= u[2 * TRIES :]
            np.floor(box[:2], out=box[:2])
            found = np.logical_or.reduce(fit[0] & fit[1], 0)
            erase[idx[found]] = True
            boxes[idx[found]] = box.T[found]
        return ErasingParams(torch.from_numpy(erase), torch.from_numpy(boxes))

    def forward(
        self, images: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        if not isinstance(images, torch.Tensor) or images.ndim != 4:
            shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images)
            raise ValueError(f"images must be a batch [B, C, H, W], not {shape}")
        if images.dtype != torch.uint8 and not images.is_floating_point():
            raise ValueError(f"images must be uint8 or floating, not {images.dtype}")
        b, c, h, w = images.shape
        if b and not (h and w):
            raise ArgumentError(f"RandomErasing: images {zero_size(images)}")
        if isinstance(self.value, tuple) and len(self.value) not in (1, c):
            raise ValueError(
                f"value has {len(self.value)} numbers for {c}-channel images: give 1 or {c}"
            )
        erase, boxes = self.sample(b, h, w, generator)
        seed = None
        if self.value == "random":  # drawn whatever the coins say: a fixed number of draws
            seed = int(torch.randint(0, 2**62, (1,), generator=generator))
        idx = np.flatnonzero(erase.numpy())
        n = len(idx)
        if n == 0:
            return images
        if seed is None:
            # One pass over the batch: the boxes of the images left alone are empty,
            # so this costs what the copy would, with no gather or scatter.
            kernels = _erase_kernels(images)
            if kernels is not None:
                v = _values(self.value, images)
                box = send(torch.from_numpy(boxes.numpy().astype(np.int32)), images.device)
                return kernels.erase(images, box, v, self.inplace)
            if not self.inplace:
                return F.erase(images, boxes, self.value)
            return F.erase(images, boxes, self.value, inplace=True)
        dev = images.device
        idx_dev = send(torch.from_numpy(idx), dev)
        sub = images if n == b else images.index_select(0, idx_dev)
        value = self.value if seed is None else _noise(sub, seed)
        out = F.erase(sub, torch.from_numpy(boxes.numpy()[idx]), value)
        if not self.inplace:
            return out if n == b else images.index_copy(0, idx_dev, out)
        return images.copy_(out) if n == b else images.index_copy_(0, idx_dev, out)


def _erase_kernels(images: torch.Tensor):  # -> the aug_triton module or None
    """The Triton kernels for a contiguous CUDA batch, when Triton imports."""
    if not images.is_cuda or not images.is_contiguous():
        return None
    try:
        from . import aug_triton
    except ImportError:
        return None
    return aug_triton


def _values(value: float | tuple[float, ...], images: torch.Tensor) -> torch.Tensor:
    """``value`` as one number per channel in the images' dtype on their device,
    converted as assigning converts (uint8 truncates); made once per value."""
    c, dtype, dev = images.shape[1], images.dtype, images.device
    vals = (value,) * c if isinstance(value, float) else tuple(value) * (c // len(value))
    if not images.is_floating_point():
        if not all(0 <= v < 256 for v in vals):
            raise ValueError(f"value must lie in [0, 255] for uint8 images, not {value!r}")
        vals = tuple(int(v) for v in vals)
    key = ("erase value", vals, dtype)
    return constant(key, dev, lambda: send(torch.tensor(vals, dtype=dtype), dev))


def _noise(like: torch.Tensor, seed: int) -> torch.Tensor:
    """Noise shaped like ``like`` on its device: standard normal for floating images,
    uniform integers in [0, 255] for uint8."""
    gen = torch.Generator(device=like.device)
    gen.manual_seed(seed)
    if like.is_floating_point():
        return torch.randn(like.shape, generator=gen, device=like.device, dtype=like.dtype)
    return torch.randint(0, 256, like.shape, generator=gen, device=like.device, dtype=torch.uint8)
