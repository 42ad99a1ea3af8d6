"""Crop and resize a batch of JPEG-decoded images of different sizes: per-image boxes
(:func:`fit_boxes`), :func:`resize_images` (one Triton kernel on CUDA, a padded batch
elsewhere). Re-exported by :mod:`packer.imaging.jpeg`. The loader's crop drawn from
its ``transform`` (``JpegCrop``, ``crop_for``) is :mod:`packer.loading.crop`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .resize import check_boxes, resized_crop, triton_kernels


def pad_batch(images: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack variable-size images into one zero-padded batch.

    ``images``: Tensor[3, h_i, w_i] uint8, all on one device. Returns the batch
    uint8 [B, 3, Hmax, Wmax] (image i in its top-left corner, zeros elsewhere) and
    the sizes int64 [B, 2] (h_i, w_i) on the CPU.
    """
    sizes = torch.tensor([[int(x.shape[1]), int(x.shape[2])] for x in images], dtype=torch.int64)
    if not len(images):
        return torch.empty((0, 3, 1, 1), dtype=torch.uint8), sizes.reshape(0, 2)
    hmax, wmax = (int(v) for v in sizes.max(0).values)
    out = images[0].new_zeros((len(images), 3, hmax, wmax))
    for i, x in enumerate(images):
        out[i, :, : x.shape[1], : x.shape[2]] = x
    return out, sizes


def fit_boxes(
    sizes: torch.Tensor | np.ndarray,
    out_size: tuple[int, int],
    mode: str = "crop",
    fraction: float = 1.0,
) -> torch.Tensor:
    """Per-image boxes int64 [B, 4] (top, left, height, width) inside each image.

    ``sizes``: int [B, 2] (h, w) per image. ``out_size``: (height, width) the box is
    resized to. ``mode``: "crop" = the centred box with the output's aspect, the
    largest that fits, scaled by ``fraction`` (1.0: build's ``--resize crop``;
    :data:`packer.loading.crop.CROP_FRACTION`: the eval centre crop); "stretch" = the whole image.
    """
    s = np.asarray(sizes, dtype=np.int64).reshape(-1, 2)
    h, w = s[:, 0].astype(np.float64), s[:, 1].astype(np.float64)
    oh, ow = out_size
    if mode == "stretch":
        z = np.zeros(len(s), dtype=np.int64)
        return torch.from_numpy(np.stack([z, z, s[:, 0], s[:, 1]], 1))
    if mode != "crop":
        raise ValueError(f"fit_boxes: mode must be 'crop' or 'stretch', not {mode!r}")
    scale = np.maximum(ow / w, oh / h)
    bw = np.clip(np.round(np.minimum(w, ow / scale) * fraction), 1, w).astype(np.int64)
    bh = np.clip(np.round(np.minimum(h, oh / scale) * fraction), 1, h).astype(np.int64)
    top = (s[:, 0] - bh) // 2
    left = (s[:, 1] - bw) // 2
    return torch.from_numpy(np.stack([top, left, bh, bw], 1))


def _pad_fit(hw: tuple[int, int], out_size: tuple[int, int]) -> tuple[int, int]:
    """(h, w) of an image letterboxed into ``out_size``: the CPU build's own rule."""
    from .decode import ResizeSpec, _scaled_size

    w, h = _scaled_size(hw[1], hw[0], ResizeSpec(out_size[1], out_size[0], "pad"))
    return h, w


def resize_batch(
    images: torch.Tensor,
    sizes: torch.Tensor,
    out_size: tuple[int, int],
    *,
    boxes: torch.Tensor | None = None,
    mode: str = "crop",
    flip: torch.Tensor | None = None,
) -> torch.Tensor:
    """Crop/resize a padded batch to ``out_size`` in batched calls.

    ``images``: uint8 [B, 3, Hmax, Wmax] from :func:`pad_batch`; ``sizes`` int64 [B, 2]
    (h, w) of each image's valid region. ``boxes``: int64 [B, 4] inside each image
    (e.g. RandomResizedCrop.sample_boxes); else ``mode`` "crop"/"stretch" boxes of
    :func:`fit_boxes`, or "pad" (whole image fitted inside, centred on black: one
    batched call per distinct fitted size). Returns uint8 [B, 3, *out_size].
    """
    if boxes is not None or mode != "pad":
        if boxes is None:
            boxes = fit_boxes(sizes, out_size, mode)
        return resized_crop(images, boxes, out_size, flip=flip)
    b = images.shape[0]
    out = images.new_zeros((b, 3, *out_size))
    fits = [_pad_fit((int(h), int(w)), out_size) for h, w in sizes.tolist()]
    groups: dict[tuple[int, int], list[int]] = {}
    for i, f in enumerate(fits):
        groups.setdefault(f, []).append(i)
    oh, ow = out_size
    for (nh, nw), rows in groups.items():
        idx = torch.tensor(rows, dtype=torch.int64)
        sub = images.index_select(0, idx.to(images.device))
        whole = torch.zeros((len(rows), 4), dtype=torch.int64)
        whole[:, 2:] = sizes[idx]
        part = resized_crop(sub, whole, (nh, nw))
        top, left = (oh - nh) // 2, (ow - nw) // 2
        out[idx.to(out.device), :, top : top + nh, left : left + nw] = part
    if flip is not None:
        mask = flip.to(out.device, non_blocking=True)[:, None, None, None]
        out = torch.where(mask, out.flip(-1), out)
    return out


def sizes_of(images: Sequence[torch.Tensor]) -> torch.Tensor:
    """int64 [B, 2] (h, w) of images uint8 [3, h_i, w_i], on the CPU."""
    return torch.tensor([x.shape[1:] for x in images], dtype=torch.int64).reshape(-1, 2)


def resize_images(
    images: Sequence[torch.Tensor],
    out_size: tuple[int, int],
    *,
    boxes: torch.Tensor | None = None,
    mode: str = "crop",
    flip: torch.Tensor | None = None,
    sizes: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`resize_batch` of a list of images of different sizes, uint8 [3, h_i, w_i]
    (or a decoder's kept batch of them: addresses, pitches and sizes, no tensors).

    On CUDA with Triton (``mode`` "crop"/"stretch" or ``boxes``) one kernel reads every
    image where it lies, through a table of addresses: no padded batch is made or
    copied, whatever the downscale (a box of many times the output goes through the
    kernel's parts loop). Otherwise (the CPU, "pad") the images are padded first. Same result either
    way (the kernels' rounding: at most 1/255 apart). ``sizes``: their (h, w), if known.
    """
    # a decoder's kept batch (decoders_nvimgcodec.KeptBatch): its addresses, no tensors
    rows = getattr(images, "table", None)
    if sizes is None:
        sizes = images.sizes if rows is not None else sizes_of(images)  # type: ignore[union-attr]
    n = len(images)
    dev = images.device if rows is not None else images[0].device if n else torch.device("cpu")  # type: ignore[union-attr]
    if boxes is None and mode != "pad":
        boxes = fit_boxes(sizes, out_size, mode)
    if boxes is None or not n:
        imgs = images.tensors() if rows is not None else images  # type: ignore[union-attr]
        return resize_batch(*pad_batch(imgs), out_size, mode=mode, flip=flip)
    s = sizes.numpy()
    bn = boxes.to(torch.int64).numpy()
    check_boxes(bn, s)  # against each image, not the padded batch
    _, _, bh, bw = bn.T
    oh, ow = out_size
    kernels = _ragged_kernels(dev)
    if kernels is None:
        imgs = images.tensors() if rows is not None else images  # type: ignore[union-attr]
        return resize_batch(*pad_batch(imgs), out_size, boxes=boxes, flip=flip)
    table = np.empty((n, 9), dtype=np.int64)
    if rows is not None:
        table[:, [0, 6, 7]] = rows
    else:
        for i, x in enumerate(images):
            table[i, 0], table[i, 6], table[i, 7] = _planes(x, i, dev)
    table[:, 1:5] = bn
    table[:, 5] = 0 if flip is None else flip.reshape(n).cpu().numpy()
    table[:, 8] = np.arange(n)
    launches = None
    if kernels.RAGGED_GROUP:
        order, launches = kernels.ragged_order(np.stack([bh / oh, bw / ow], 1))
        table = table[order]
    t = torch.from_numpy(table)
    if dev.type == "cuda":
        t = t.pin_memory().to(dev, non_blocking=True)
    scale = (float(bh.max()) / oh, float(bw.max()) / ow)
    return kernels.resample_ragged(t, 3, oh, ow, scale, dev, launches)


def _planes(x: torch.Tensor, i: int, dev: torch.device) -> tuple[int, int, int]:
    """(address, plane height, row pitch) of a uint8 [3, h, w] the ragged kernel reads as
    a contiguous [3, H, W] (its plane stride H * W, its row stride W): contiguous
    (H, W = h, w), or with padded rows and planes whose stride is whole rows (a
    decoder's pitched output, read in place rather than copied)."""
    s0, s1, s2 = x.stride() if x.ndim == 3 else (0, 0, 0)
    if (
        x.ndim != 3
        or x.shape[0] != 3
        or x.device != dev
        or x.dtype != torch.uint8
        or s2 != 1
        or s1 < x.shape[2]
        or s0 % max(s1, 1)
        or s0 < s1 * x.shape[1]
    ):
        raise ValueError(f"image {i} must be a uint8 [3, H, W] on {dev} with whole-row strides")
    return x.data_ptr(), s0 // s1, s1


def _ragged_kernels(device: torch.device):  # -> module | None
    return triton_kernels() if device.type == "cuda" else None
