"""The dense ops of a whole batch at once: per-image parameters drawn on the host, one
resampling of all images, one gather of all masks, all boxes moved in one vectorized
pass on the host (issue 46's dense pass: O(1) torch calls a batch, not O(images)).

:func:`batched_ops` says whether an op (a :class:`~packer.augment.dense.Compose`) has a
batched path: every op one of :data:`BATCHED` (exact types), at most one resampling op
(ScaleJitter, Resize, RandomResize, RandomResizedCrop; bilinear or nearest) and only
flips before it, one image fill (and mask fills) for every op that pads. Others
(IoU crop, affine, rotation, colour ops, bicubic, ...) keep the per-image path.

:func:`run` takes the batch's images, host targets and masks (flat buffers, as the dense
pass decodes them) and returns the transformed batch on a common canvas (:class:`Out`).
Per image, each axis is a map from output pixel ``o`` to a pixel ``v = off + sign * o``
of the source's crop ``[start, start + length)`` resized to ``n`` pixels (the single
resampling), with crops, pads and flips folded into ``off``, ``sign`` and the size; ``v``
outside ``[0, n)`` is the ops' fill, ``o`` beyond the image the canvas's padding.

The same draws in the same order as the per-image path (image by image, op by op, each
op's own ``sample_params``), so a seed gives the same crops; boxes and keypoints take the
per-image kernels' float32 operations (the same bits), masks the same nearest indices
(identical), images the same filter weights (within the rounding of one product).

The parts: ``dense_batched_plan`` (the plan and the draws), ``dense_batched_targets``
(host targets), ``dense_batched_geometry`` (the axis maps, targets moved with them),
``dense_batched_resample`` (the maps on the device, the images' resampling, fills),
``dense_batched_masks`` (the masks' gather). This module composes them (:func:`run`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .dense_batched_geometry import Geometry, apply
from .dense_batched_masks import Planes, gather_masks
from .dense_batched_plan import Plan, batched_ops, draw
from .dense_batched_resample import axis_maps, fill_in, fill_tensor, padded, resample, u8
from .dense_batched_targets import Targets

__all__ = ["Drawn", "Out", "Plan", "Planes", "Targets", "batched_ops", "drawn", "on_device", "run"]


@dataclass
class Out:
    """The transformed batch: ``images`` uint8 [B, C, H, W] (each image at the top left,
    ``sizes`` (h, w) each, padded beyond), ``targets`` (host), ``masks`` uint8 [R, H, W]
    (one per row of ``targets``) or None, ``semantic`` uint8 [B, H, W] or None."""

    images: torch.Tensor
    sizes: list[tuple[int, int]]
    targets: Targets | None
    masks: torch.Tensor | None
    semantic: torch.Tensor | None


@dataclass
class Drawn:
    """The host half of :func:`run` (:func:`drawn`): the input ``sizes``, every image's
    :class:`~packer.augment.dense_batched_geometry.Geometry` and output size, and the
    ``canvas`` (h, w). Plain data: another process may make it."""

    sizes: list[tuple[int, int]]
    geo: Geometry
    canvas: tuple[int, int]

    @property
    def out_sizes(self) -> list[tuple[int, int]]:
        return self.geo.sizes


def drawn(
    plan: Plan,
    sizes: Sequence[tuple[int, int]],
    targets: Targets | None,
    gen: torch.Generator | Sequence[tuple[int, torch.Generator | None]] | None,
    divisible: int = 32,
) -> Drawn:
    """:func:`run`'s host half: the parameters drawn image by image, the geometry, the
    ``targets`` moved with it (in place), the canvas."""
    sizes = [(int(h), int(w)) for h, w in sizes]
    if isinstance(gen, (list, tuple)):
        params, at = [], 0
        for n, g in gen:
            params += draw(plan, sizes[at : at + n], g)
            at += n
    else:
        params = draw(plan, sizes, gen)
    geo = apply(plan, params, sizes, targets)
    out_sizes = geo.sizes
    d = 1 if len(set(out_sizes)) == 1 else divisible
    ch = -(-max(s[0] for s in out_sizes) // d) * d
    cw = -(-max(s[1] for s in out_sizes) // d) * d
    return Drawn(sizes, geo, (ch, cw))


def on_device(
    plan: Plan,
    images: Sequence[torch.Tensor],
    made: Drawn,
    targets: Targets | None,
    planes: Planes | None,
    pad_fill: int = 0,
    pad_semantic: int = 255,
) -> Out:
    """:func:`run`'s device half: the images resampled (or gathered) and the masks
    gathered by ``made`` (:func:`drawn` of these images)."""
    ch, cw = made.canvas
    src = padded(images)
    dev = src.device
    maps = axis_maps(made.geo, ch, cw, dev)
    pixels = resample(plan, made.geo, maps, src)
    fill = fill_tensor(plan.fill, src.shape[1], dev)
    out_images = fill_in(pixels, maps.axes, fill, u8(pad_fill), maps.flags)
    masks = semantic = None
    if planes is not None:
        masks, semantic = gather_masks(planes, targets, plan, maps, pad_semantic, dev)
    return Out(out_images, made.out_sizes, targets, masks, semantic)


def run(
    plan: Plan,
    images: Sequence[torch.Tensor],
    targets: Targets | None,
    planes: Planes | None,
    gen: torch.Generator | Sequence[tuple[int, torch.Generator | None]] | None,
    divisible: int = 32,
    pad_fill: int = 0,
    pad_semantic: int = 255,
) -> Out:
    """The batch through ``plan``: parameters drawn per image from ``gen``, targets moved
    on the host, images resampled (or gathered) in one go, masks gathered in one go;
    every image on a canvas of the largest output size (rounded up to ``divisible``
    when the sizes differ), padded with ``pad_fill`` (masks 0, semantic masks
    ``pad_semantic``). The host waits for the device nowhere. ``gen`` may also be
    ``[(n, generator), ...]``: the first n images draw from the first generator, the
    next from the second, ... (several batches made at once, each with its own draws;
    each image's output does not depend on the others'). :func:`drawn` then
    :func:`on_device`."""
    sizes = [(int(i.shape[-2]), int(i.shape[-1])) for i in images]
    made = drawn(plan, sizes, targets, gen, divisible)
    return on_device(plan, images, made, targets, planes, pad_fill, pad_semantic)
