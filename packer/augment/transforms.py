"""The crop and resize ops on uint8 image batches (RandomResizedCrop, RandomHorizontalFlip,
CenterCrop, Resize), on the CPU and on CUDA.

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
(Compose of crop + flip): a seed from the generator for numpy's uniforms
(:func:`~packer.augment.draws.host_rng`), the boxes from the exact table of
torchvision's rule for the image size (:func:`~packer.augment.draws.box_table`) in a
few numpy passes written straight into a reused pinned [B, 5] int32 table, one torch
draw for the flips, one async copy and one launch.
``Compose`` (which runs a crop and a flip as one kernel) is :mod:`packer.augment.compose`.
This module needs only torch and numpy (and ``resize.py``, ``draws.py`` and ``base.py``
beside it), so it also imports standalone.
"""

from __future__ import annotations

import numpy as np
import torch

if __package__:
    from ..imaging.resize import (
        MAX_SIDE,
        ArgumentError,
        Size,
        check_antialias,
        check_images,
        interpolation_mode,
        resized_crop,
        size_pair,
        to_device,
    )
    from .base import _Transform
    from .draws import TRIES, box_table, draw_boxes, first_fit, host_rng, size_column, try_sides
else:  # imported standalone, beside resize.py, draws.py and base.py
    from base import _Transform  # type: ignore[no-redef]
    from draws import (  # type: ignore[no-redef]
        TRIES,
        box_table,
        draw_boxes,
        first_fit,
        host_rng,
        size_column,
        try_sides,
    )
    from resize import (  # type: ignore[no-redef]
        MAX_SIDE,
        ArgumentError,
        Size,
        check_antialias,
        check_images,
        interpolation_mode,
        resized_crop,
        size_pair,
        to_device,
    )


def _np_sizes(size: int | torch.Tensor, batch: int) -> np.ndarray:
    if isinstance(size, torch.Tensor):
        size = size.detach().cpu().numpy()
    return np.broadcast_to(np.asarray(size, dtype=np.int64), (batch,))


# ---------------------------------------------------------------- modules


class _Interpolated:
    """``interpolation`` and ``antialias`` of a resizing op, checked when set as
    :func:`~packer.imaging.resize.resized_crop` takes them (torchvision's modes)."""

    def __init__(self, op: str, interpolation: object, antialias: object) -> None:
        self.mode = interpolation_mode(interpolation, op)
        self.antialias = check_antialias(self.mode, antialias, op)

    def repr_fields(self) -> dict[str, object]:
        """The non-default values (bilinear, antialiased), for a module's repr."""
        out: dict[str, object] = {}
        if self.mode != "bilinear":
            out["interpolation"] = self.mode
        if not self.antialias and not self.mode.startswith("nearest"):
            out["antialias"] = False
        return out


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
    (:meth:`sample_boxes`); pixels follow :func:`resized_crop`, with
    ``interpolation`` ("bilinear", "nearest", "nearest-exact", "bicubic", "lanczos" or
    torchvision's ``InterpolationMode``) and ``antialias`` as torchvision's. ``size``
    is an attribute: set it between epochs for progressive resizing.

    Input: Tensor[B, C, H, W] uint8; output: Tensor[B, C, *size] uint8, same device.
    """

    def __init__(
        self,
        size: Size,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        interpolation: object = "bilinear",
        antialias: bool | None = True,
    ) -> None:
        super().__init__()
        self._interp = _Interpolated("RandomResizedCrop", interpolation, antialias)
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
        if not (rlo >= 1 / MAX_SIDE and rhi <= MAX_SIDE):  # finite: an aspect an image can have
            raise ArgumentError(
                f"RandomResizedCrop: ratio must lie in [1/{MAX_SIDE}, {MAX_SIDE}], not {ratio!r}"
            )
        self.scale = (lo, hi)
        self.ratio = (rlo, rhi)

    @property
    def interpolation(self) -> str:
        return self._interp.mode

    @property
    def antialias(self) -> bool:
        return self._interp.antialias

    def _repr_fields(self) -> dict[str, object]:
        fields = {"size": self.size, "scale": self.scale, "ratio": self.ratio}
        return {**fields, **self._interp.repr_fields()}

    def sample_boxes(
        self,
        batch: int,
        height: int | torch.Tensor,
        width: int | torch.Tensor,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Draw ``batch`` boxes, int64 [B, 4] (top, left, height, width), on the CPU.

        ``height``/``width``: the image size, or int64 [B] per image (a padded
        batch of variable-size images). Per image, torchvision's rule: up to 10
        tries of area ~ U(scale) * H * W and log aspect ~ U(log ratio), w =
        round(sqrt(a * r)), h = round(sqrt(a / r)); the first try with 0 < w <= W
        and 0 < h <= H wins and its corner is uniform; else a centre crop of the
        whole image with its aspect clamped into ``ratio``. For one image size the
        box comes from that rule's exact distribution
        (:func:`~packer.augment.draws.box_table`): one uniform per image; else the
        tries are drawn. The uniforms come from
        :func:`~packer.augment.draws.host_rng` (one draw from ``generator``).
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
            table = box_table("crop", height, width, self.scale, self.ratio)
            if table is not None:
                if batch:
                    out[:, :4] = draw_boxes(table, host_rng(generator).random((4, batch)))[1].T
                return
            hw = size_column(height, width)
            area = float(height * width)
        else:
            hh = _np_sizes(height, batch)
            ww = _np_sizes(width, batch)
            if batch and ((hh < 1) | (ww < 1)).any():
                raise ValueError(f"image size must be positive, not {height!r}x{width!r}")
            hw = np.stack([hh, ww]).astype(np.float64)[:, None, :]  # [2, 1, B]
            area = hw[0] * hw[1]  # [1, B]
        if batch == 0:
            return
        # No table: all ten tries of every image at once (try-major: contiguous rows).
        u = host_rng(generator).random((2 * TRIES + 2, batch))  # areas, aspects, corner
        box = try_sides(u[:TRIES], u[TRIES : 2 * TRIES], area, self.scale, self.ratio)
        fit = box <= hw
        fit &= box > 0
        ok = fit[0] & fit[1]
        res = np.empty((4, batch))  # top, left, h, w
        np.take(box.reshape(2, -1), first_fit(ok), 1, res[2:])
        found = np.logical_or.reduce(ok, 0)
        # Corner ~ randint(0, H - h + 1), randint(0, W - w + 1), as floor(u * n): u is
        # at most 1 - 2**-53, so u * n rounds below n for every integer n >= 1.
        corner = res[:2]
        np.subtract(hw[:, 0] + 1.0, res[2:], out=corner)
        corner *= u[2 * TRIES :]
        np.floor(corner, out=corner)
        if not found.all():
            # Fallback: the whole image, its aspect clamped into [min, max] ratio, centred.
            miss = np.flatnonzero(~found)
            fh, fw = np.broadcast_to(hw[:, 0], (2, batch))[:, miss]
            in_ratio = fw / fh
            rmin, rmax = min(self.ratio), max(self.ratio)
            h = np.where(in_ratio < rmin, np.round(fw / rmin), fh)
            w = np.where(in_ratio > rmax, np.round(fh * rmax), fw)
            res[:, miss] = (fh - h) // 2, (fw - w) // 2, h, w
        out[:, :4] = res.T

    def forward(
        self,
        images: torch.Tensor,
        generator: torch.Generator | None = None,
        *,
        flip: torch.Tensor | None = None,
    ) -> torch.Tensor:
        check_images(images, self)
        b, _, h, w = images.shape
        boxes = self.sample_boxes(b, h, w, generator)
        mode, aa = self.interpolation, self.antialias
        return resized_crop(images, boxes, self.size, flip=flip, interpolation=mode, antialias=aa)


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
        check_images(images, self)
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
        check_images(images, self)
        oh, ow = self.size
        h, w = images.shape[-2:]
        if oh > h or ow > w:
            raise ValueError(f"CenterCrop{self.size} is larger than the {h}x{w} images")
        top = round((h - oh) / 2.0)
        left = round((w - ow) / 2.0)
        return images[..., top : top + oh, left : left + ow].contiguous()


class Resize(_Transform):
    """Resize every image, as torchvision's ``Resize(size, interpolation, antialias=...)``.

    ``size``: (height, width), or an int for the shorter side (the longer one
    becomes ``int(size * long / short)``, torchvision's rule). ``interpolation``
    and ``antialias``: as :class:`RandomResizedCrop`'s (default bilinear,
    antialiased). Input Tensor[B, C, H, W] uint8; output uint8 on the same device.
    """

    def __init__(
        self, size: Size, interpolation: object = "bilinear", *, antialias: bool | None = True
    ) -> None:
        super().__init__()
        self._interp = _Interpolated("Resize", interpolation, antialias)
        self.size = size

    @property
    def interpolation(self) -> str:
        return self._interp.mode

    @property
    def antialias(self) -> bool:
        return self._interp.antialias

    @property
    def size(self) -> int | tuple[int, int]:
        return self._size

    @size.setter
    def size(self, value: Size) -> None:
        pair = size_pair(value)  # validates
        self._size = value if isinstance(value, int) else pair

    def _repr_fields(self) -> dict[str, object]:
        return {"size": self.size, **self._interp.repr_fields()}

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        if not isinstance(self.size, int):
            return self.size
        short, long = (height, width) if height <= width else (width, height)
        if short < 1:
            raise ArgumentError(f"Resize: images of {height}x{width} pixels have no side to scale")
        new_long = int(self.size * long / short)
        if new_long > MAX_SIDE:
            raise ArgumentError(
                f"Resize({self.size}) of {height}x{width} images makes a side of {new_long} "
                f"pixels, too large: "
                f"each output side must be at most {MAX_SIDE}"
            )
        return (self.size, new_long) if height <= width else (new_long, self.size)

    def forward(
        self, images: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        check_images(images, self)
        b, _, h, w = images.shape
        boxes = torch.tensor([[0, 0, h, w]], dtype=torch.int64).expand(b, 4)
        mode, aa = self.interpolation, self.antialias
        return resized_crop(images, boxes, self.output_size(h, w), interpolation=mode, antialias=aa)
