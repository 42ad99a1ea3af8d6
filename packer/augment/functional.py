"""Batched colour and pixel ops: one call per batch, each image with its own parameters.

Every op takes ``img``: Tensor[B, C, H, W], uint8 in [0, 255] (C = 3, or 1 where
torchvision allows it), on the CPU or CUDA, and returns a uint8 Tensor[B, C, H, W]
on the same device (:func:`erase` also takes floating images). Per-image
parameters are a Tensor[B] (or [B, k]) on any device, or one Python number for
every image.

Pixels follow ``torchvision.transforms.v2.functional`` on uint8 tensors, image by
image: the same float32 operations in the same order, clamped and converted back
to uint8 as torchvision does (the blends clamp then truncate, the geometric ops
round). Per-image factors are float32 tensors where torchvision has Python
scalars, so an add-with-alpha becomes a multiply-add: an output may differ from
torchvision's by one level where the float result lies within a rounding error
of an integer (a handful of pixels per million). Each function's docstring says
where it differs more. Pass factors as float64 (as Python floats are) to get
``1 - factor`` rounded as torchvision rounds it.

Nothing here makes the host wait for the device: CPU parameters move with
non-blocking copies (:func:`packer.augment.params.send`), and no value is read back.

The geometric ops (``affine``, ``rotate``) are :mod:`packer.augment.warps`'s; the
parameter plumbing (:func:`~packer.augment.params.apply_to`,
:func:`~packer.augment.params.apply_groups`, ...) is :mod:`packer.augment.params`'s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as nnf

from ..imaging.resize import check_images
from .params import Param, check_batch, constant, param, send, send_params


def _ratio(f: np.ndarray | torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(factor, 1 - factor), each float32 [B, 1, 1, 1] on ``device``: ``1 - factor``
    computed in float64 first, as torchvision computes ``1.0 - ratio`` in Python."""
    r, omr = send_params(device, torch.float32, f, 1.0 - f)
    return r.view(-1, 1, 1, 1), omr.view(-1, 1, 1, 1)


# ---------------------------------------------------------------- colour


def _blend(
    img: torch.Tensor, other: torch.Tensor, r: torch.Tensor, omr: torch.Tensor
) -> torch.Tensor:
    """torchvision's ``_blend``: ``img * r + other * (1 - r)``, clamped, truncated to uint8."""
    out = torch.mul(img, r)
    out.addcmul_(other, omr)
    return out.clamp_(0, 255).to(torch.uint8)


def _gray(img: torch.Tensor) -> torch.Tensor:
    """Luma float32 [B, 1, H, W] of uint8 RGB, torchvision's weights and operation order."""
    r, g, b = img.unbind(dim=-3)
    return r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114).unsqueeze(-3)


def rgb_to_grayscale(img: torch.Tensor, num_output_channels: int = 1) -> torch.Tensor:
    """Luma ``0.2989 R + 0.587 G + 0.114 B`` truncated to uint8, as torchvision.

    Returns Tensor[B, num_output_channels (1 or 3), H, W] uint8 (3: the luma
    repeated). A 1-channel input is copied (or repeated to 3).
    """
    check_batch(img, "rgb_to_grayscale")
    if num_output_channels not in (1, 3):
        raise ValueError(f"num_output_channels must be 1 or 3, not {num_output_channels!r}")
    if img.shape[1] == 1:
        return img.repeat(1, num_output_channels, 1, 1)
    lum = _gray(img).to(torch.uint8)
    return lum.expand(-1, 3, -1, -1).contiguous() if num_output_channels == 3 else lum


def adjust_brightness(img: torch.Tensor, factor: Param) -> torch.Tensor:
    """``img * factor`` per image, clamped to [0, 255] and truncated (torchvision's rule).

    ``factor``: Tensor[B] (or a number) >= 0; 1 keeps the image.
    """
    check_batch(img, "adjust_brightness")
    f = param(factor, img.shape[0], "brightness factor", lo=0)
    (col,) = send_params(img.device, torch.float32, f)
    out = torch.mul(img, col.view(-1, 1, 1, 1))
    return out.clamp_(0, 255).to(torch.uint8)


def adjust_saturation(img: torch.Tensor, factor: Param) -> torch.Tensor:
    """Blend each image with its luma (floored): ``img * f + gray * (1 - f)``.

    ``factor``: Tensor[B] (or a number) >= 0; 0 gives grayscale, 1 the image. A
    1-channel image comes back as it is (torchvision, after PIL).
    """
    check_batch(img, "adjust_saturation")
    f = param(factor, img.shape[0], "saturation factor", lo=0)
    if img.shape[1] == 1:
        return img
    r, omr = _ratio(f, img.device)
    return _blend(img, _gray(img).floor_(), r, omr)


def adjust_contrast(img: torch.Tensor, factor: Param) -> torch.Tensor:
    """Blend each image with the mean of its (floored) luma: ``img * f + mean * (1 - f)``.

    ``factor``: Tensor[B] (or a number) >= 0; 0 gives a flat grey, 1 the image.
    """
    check_batch(img, "adjust_contrast")
    f = param(factor, img.shape[0], "contrast factor", lo=0)
    gray = _gray(img).floor_() if img.shape[1] == 3 else img.to(torch.float32)
    mean = gray.mean(dim=(-3, -2, -1), keepdim=True)
    r, omr = _ratio(f, img.device)
    return _blend(img, mean, r, omr)


def _rgb_to_hsv(image: torch.Tensor) -> torch.Tensor:
    # torchvision's v2 _rgb_to_hsv (after Pillow), operation for operation.
    r, g, _ = image.unbind(dim=-3)
    minc, maxc = torch.aminmax(image, dim=-3)
    eqc = maxc == minc
    channels_range = maxc - minc
    ones = torch.ones_like(maxc)
    s = channels_range / torch.where(eqc, ones, maxc)
    channels_range_divisor = torch.where(eqc, ones, channels_range).unsqueeze_(dim=-3)
    rc, gc, bc = ((maxc.unsqueeze(dim=-3) - image) / channels_range_divisor).unbind(dim=-3)
    mask_maxc_neq_r = maxc != r
    mask_maxc_eq_g = maxc == g
    hg = rc.add(2.0).sub_(bc).mul_(mask_maxc_eq_g & mask_maxc_neq_r)
    hr = bc.sub_(gc).mul_(~mask_maxc_neq_r)
    hb = gc.add_(4.0).sub_(rc).mul_(mask_maxc_neq_r.logical_and_(mask_maxc_eq_g.logical_not_()))
    h = hr.add_(hg).add_(hb)
    h = h.mul_(1.0 / 6.0).add_(1.0).fmod_(1.0)
    return torch.stack((h, s, maxc), dim=-3)


_HSV_SELECT = ((0, 2, 1, 1, 3, 0), (3, 0, 0, 2, 1, 1), (1, 1, 3, 0, 0, 2))


def _hsv_to_rgb(img: torch.Tensor) -> torch.Tensor:
    # torchvision's v2 _hsv_to_rgb; the sector table is indexed per pixel.
    h, s, v = img.unbind(dim=-3)
    h6 = h.mul(6)
    i = torch.floor(h6)
    f = h6.sub_(i)
    i = i.to(dtype=torch.int64)
    sxf = s * f
    one_minus_s = 1.0 - s
    q = (1.0 - sxf).mul_(v).clamp_(0.0, 1.0)
    t = sxf.add_(one_minus_s).mul_(v).clamp_(0.0, 1.0)
    p = one_minus_s.mul_(v).clamp_(0.0, 1.0)
    i.remainder_(6)
    vpqt = torch.stack((v, p, q, t), dim=-3)
    dev = img.device
    select = constant(("hsv",), dev, lambda: send(torch.tensor(_HSV_SELECT), dev))
    return vpqt.gather(-3, select[:, i].moveaxis(0, -3))


def adjust_hue(img: torch.Tensor, hue_factor: Param) -> torch.Tensor:
    """Rotate each image's hue by ``hue_factor`` turns (in [-0.5, 0.5]) in HSV space.

    torchvision's algorithm (RGB/255 -> HSV -> shift -> RGB, then
    ``* (256 - 1e-3)`` truncated). A 1-channel image comes back as it is.
    """
    check_batch(img, "adjust_hue")
    f = param(hue_factor, img.shape[0], "hue factor", lo=-0.5, hi=0.5)
    if img.shape[1] == 1 or img.numel() == 0:
        return img
    x = img.to(torch.float32).mul_(1.0 / 255)
    h, s, v = _rgb_to_hsv(x).unbind(dim=-3)
    (shift,) = send_params(img.device, torch.float32, f)
    h = h.add_(shift.view(-1, 1, 1)).remainder_(1.0)
    rgb = _hsv_to_rgb(torch.stack((h, s, v), dim=-3))
    return rgb.mul_(255 + 1.0 - 1e-3).to(torch.uint8)


def _smooth_kernel(device: torch.device) -> torch.Tensor:
    a, m = 1.0 / 13.0, 5.0 / 13.0
    return send(torch.tensor(((a, a, a), (a, m, a), (a, a, a)), dtype=torch.float32), device)


def adjust_sharpness(img: torch.Tensor, factor: Param) -> torch.Tensor:
    """Blend each image with its 3x3 smoothed copy (PIL's SMOOTH kernel /13), rounded.

    ``factor``: Tensor[B] (or a number) >= 0; 0 blurs, 1 keeps, 2 sharpens. The
    one-pixel border is kept, and images of side <= 2 come back as they are
    (torchvision's rule).
    """
    check_batch(img, "adjust_sharpness")
    b, c, h, w = img.shape
    f = param(factor, b, "sharpness factor", lo=0)
    if img.numel() == 0 or h <= 2 or w <= 2:
        return img
    dev = img.device
    kernel = constant(("smooth",), dev, lambda: _smooth_kernel(dev)).expand(c, 1, 3, 3)
    out = img.to(torch.float32)
    blurred = nnf.conv2d(out, kernel, groups=c).round_()
    view = out[..., 1:-1, 1:-1]
    _, omr = _ratio(f, dev)
    view.addcmul_(blurred.sub_(view), omr)
    return out.clamp_(0, 255).to(torch.uint8)


def posterize(img: torch.Tensor, bits: Param) -> torch.Tensor:
    """Keep the ``bits`` (0 to 8, an int Tensor[B] or an int) high bits of every value."""
    check_batch(img, "posterize")
    nb = param(bits, img.shape[0], "bits", lo=0, hi=8)
    if isinstance(nb, np.ndarray):
        keep = 256 - np.left_shift(1, 8 - nb.astype(np.int64))  # 0 bits: 0; 8 bits: 255
    else:
        nb = nb.to(torch.int32)
        keep = 256 - torch.bitwise_left_shift(torch.ones_like(nb), 8 - nb)
    (mask,) = send_params(img.device, torch.uint8, keep)
    return img & mask.view(-1, 1, 1, 1)


def solarize(img: torch.Tensor, threshold: Param) -> torch.Tensor:
    """Invert the values >= ``threshold`` (Tensor[B] or a number, compared in float32)."""
    check_batch(img, "solarize")
    t = param(threshold, img.shape[0], "threshold", hi=255)
    (col,) = send_params(img.device, torch.float32, t)
    return torch.where(img >= col.view(-1, 1, 1, 1), img.bitwise_not(), img)


def invert(img: torch.Tensor) -> torch.Tensor:
    """``255 - img``."""
    check_images(img, "invert")
    return img.bitwise_not()


def autocontrast(img: torch.Tensor) -> torch.Tensor:
    """Stretch each channel of each image to [0, 255] (a flat channel is kept)."""
    check_batch(img, "autocontrast")
    if img.numel() == 0:
        return img
    x = img.to(torch.float32)
    lo, hi = torch.aminmax(x.flatten(-2), dim=-1)
    lo, hi = lo[..., None, None], hi[..., None, None]
    flat = hi == lo
    # torchvision's masked assignment, as a select: boolean indexing waits for the device.
    inv_scale = torch.where(flat, 1.0, hi.sub_(lo).mul_(1.0 / 255))
    lo = torch.where(flat, 0.0, lo)
    return x.sub_(lo).div_(inv_scale).clamp_(0, 255).to(torch.uint8)


def equalize(img: torch.Tensor) -> torch.Tensor:
    """Histogram-equalize each channel of each image with PIL's lookup table (torchvision's).

    A channel whose histogram has a single non-maximal step (``step == 0``) is kept.
    """
    check_images(img, "equalize")
    if img.numel() == 0:
        return img
    b, c, h, w = img.shape
    flat = img.reshape(b, c, h * w).to(torch.int64)
    hist = torch.zeros((b, c, 256), dtype=torch.int32, device=img.device)
    hist.scatter_add_(-1, flat, hist.new_ones(1).expand_as(flat))
    cum = hist.cumsum(-1, dtype=torch.int32)
    last = cum.argmax(-1, keepdim=True)  # the first bin holding every pixel: the maximum
    step = (h * w - hist.gather(-1, last)).div_(255, rounding_mode="floor")
    valid = step.ne(0).unsqueeze(-1)
    lut = cum[..., :-1].add_(step // 2).div_(step.clamp(min=1), rounding_mode="floor")
    lut = torch.cat([torch.zeros_like(lut[..., :1]), lut.clamp_(0, 255)], -1).to(torch.uint8)
    out = lut.gather(-1, flat).view(b, c, h, w)
    return torch.where(valid, out, img)


def gaussian_blur(
    img: torch.Tensor, kernel_size: int | Sequence[int], sigma: Param | Sequence[float]
) -> torch.Tensor:
    """Gaussian blur with a per-image sigma, reflect-padded, as torchvision's.

    ``kernel_size``: odd int, or (kx, ky) as torchvision (x first). ``sigma``:
    Tensor[B] (the same in x and y), Tensor[B, 2] (sx, sy), a number or a pair, > 0. The
    blur runs as two 1-D passes (a grouped conv with one kernel per image)
    where torchvision convolves once with their outer product: float32 sums in
    another order, rarely one level apart after rounding.
    """
    check_batch(img, "gaussian_blur")
    kx, ky = (kernel_size, kernel_size) if isinstance(kernel_size, int) else kernel_size
    for k in (kx, ky):
        if isinstance(k, bool) or not isinstance(k, int) or k < 1 or k % 2 == 0:
            raise ValueError(f"kernel_size must be odd and positive, not {kernel_size!r}")
    b, c, h, w = img.shape
    s = param(sigma, b, "sigma", width=2 if _is_pair(sigma) else 0)
    if isinstance(s, np.ndarray) and s.size and s.min() <= 0:
        raise ValueError(f"sigma must be positive, not {s.min()}")
    if kx // 2 >= w or ky // 2 >= h:
        raise ValueError(f"kernel_size {kernel_size!r} is too large for {h}x{w} images")
    if img.numel() == 0:
        return img
    (s,) = send_params(img.device, torch.float32, s)
    s = s if s.ndim == 2 else s[:, None].expand(b, 2)
    # One reflect pad of the uint8 images for both passes (padding rows, then
    # filtering along them, equals filtering then padding), one float32 copy.
    x = nnf.pad(img, (kx // 2, kx // 2, ky // 2, ky // 2), mode="reflect").to(torch.float32)
    x = x.reshape(1, b * c, *x.shape[-2:])  # any layout (channels-last too)
    for axis, k, shape in ((0, kx, (1, kx)), (1, ky, (ky, 1))):  # x (sigma[:, 0]), then y
        if k == 1:
            continue
        lim = (k - 1) / (2.0 * math.sqrt(2.0))
        lin = torch.linspace(-lim, lim, steps=k, dtype=torch.float32, device=img.device)
        weight = torch.softmax(lin.div(s[:, axis, None]).pow(2).neg(), dim=1)  # [B, k]
        weight = weight[:, None].expand(b, c, k).reshape(b * c, 1, *shape)
        x = nnf.conv2d(x, weight, groups=b * c)
    x = x.view(b, c, h, w)
    return x.round_().to(torch.uint8)


def _is_pair(x: object) -> bool:
    """A sigma given per axis: (sx, sy) numbers, or a tensor [B, 2]."""
    return x.ndim == 2 if isinstance(x, torch.Tensor) else isinstance(x, Sequence)


# ---------------------------------------------------------------- erasing


def erase(
    img: torch.Tensor,
    boxes: torch.Tensor,
    value: float | Sequence[float] | torch.Tensor = 0,
    inplace: bool = False,
) -> torch.Tensor:
    """Set each image's box (top, left, height, width) to ``value``.

    Args:
      img: Tensor[B, C, H, W], uint8 or floating (e.g. normalized).
      boxes: int Tensor[B, 4] (top, left, height, width) per image, any device;
        a zero height or width erases nothing.
      value: a number, C numbers, or a tensor broadcastable to [B, C, H, W] (such
        as per-pixel noise [B, C, H, W], read inside the box only). Converted to
        the images' dtype as torchvision's ``erase`` assigns (uint8 truncates;
        numbers must then lie in [0, 255]).

    Returns a new tensor of the images' dtype and device; with ``inplace``,
    ``img`` itself, erased.
    """
    if not isinstance(img, torch.Tensor) or img.ndim != 4:
        shape = tuple(img.shape) if isinstance(img, torch.Tensor) else type(img)
        raise ValueError(f"images must be a batch [B, C, H, W], not {shape}")
    b, c, h, w = img.shape
    if not isinstance(boxes, torch.Tensor) or boxes.shape != (b, 4):
        raise ValueError(f"boxes must be an int tensor [{b}, 4] (top, left, height, width)")
    dev = img.device
    if isinstance(value, torch.Tensor):
        v = send(value, dev).to(img.dtype)
    else:
        vals = (value,) if isinstance(value, (int, float)) else tuple(value)
        if len(vals) not in (1, c):
            raise ValueError(f"value must be one number or {c} (one per channel), not {value!r}")
        if not img.is_floating_point():
            if not all(0 <= x < 256 for x in vals):
                raise ValueError(f"value must lie in [0, 255] for uint8 images, not {value!r}")
            vals = tuple(int(x) for x in vals)  # float -> uint8 truncates, as assigning does
        if len(vals) == 1:
            v = vals[0]
        else:
            v = constant(
                ("fill", vals, img.dtype),
                dev,
                lambda: send(torch.tensor(vals, dtype=img.dtype).view(1, c, 1, 1), dev),
            )
    if boxes.device.type == "cpu":
        # Row and column masks on the host, one small copy: no index arithmetic on the device.
        top, left, bh, bw = (col[:, None] for col in boxes.numpy().T)
        rows, cols = np.arange(h), np.arange(w)
        rc = np.concatenate(
            [(rows >= top) & (rows < top + bh), (cols >= left) & (cols < left + bw)], 1
        )
        rc = send(torch.from_numpy(rc), dev)
        inside = rc[:, None, :h, None] & rc[:, None, None, h:]
    else:
        top, left, bh, bw = (t.view(b, 1, 1, 1) for t in boxes.to(dev).unbind(1))
        rows = torch.arange(h, device=dev).view(1, 1, h, 1)
        cols = torch.arange(w, device=dev).view(1, 1, 1, w)
        inside = (rows >= top) & (rows < top + bh) & (cols >= left) & (cols < left + bw)
    if not inplace:
        return torch.where(inside, v, img)
    if isinstance(v, torch.Tensor):
        return torch.where(inside, v.expand_as(img), img, out=img)
    return img.masked_fill_(inside, v)
