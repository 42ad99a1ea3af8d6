"""Batched functional image ops: one call per batch, each image with its own parameters.

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
non-blocking copies (``packer.transforms._to``), and no value is read back.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as nnf

from ..transforms import _check_images, _to

Param = float | int | torch.Tensor
Fill = float | int | Sequence[float] | torch.Tensor | None

_INTERPOLATIONS = ("nearest", "bilinear")


# ---------------------------------------------------------------- parameters


def _check(img: torch.Tensor, name: str, channels: tuple[int, ...] = (1, 3)) -> None:
    _check_images(img)
    if img.shape[1] not in channels:
        allowed = " or ".join(map(str, channels))
        raise ValueError(f"{name} takes {allowed} channels, not {img.shape[1]}")


def _per_image(
    x: Param, b: int, name: str, width: int = 0, minimum: float | None = None
) -> torch.Tensor:
    """``x`` as a tensor [b] (``width`` 0) or [b, width], on its own device.

    Python numbers become float64 CPU tensors (what torchvision computes with);
    a CPU tensor's values are checked against ``minimum`` (cheap, no device
    involved); a device tensor is taken as it is.
    """
    shape = (b,) if width == 0 else (b, width)
    if not isinstance(x, torch.Tensor):
        try:
            x = torch.tensor(x, dtype=torch.float64)
        except (TypeError, ValueError):
            raise ValueError(
                f"{name} must be a number or a tensor {list(shape)}, not {x!r}"
            ) from None
    if x.ndim == 0 or (width and x.shape == (width,)):
        x = x.expand(shape)
    if tuple(x.shape) != shape:
        raise ValueError(f"{name} must be a tensor {list(shape)}, not of shape {tuple(x.shape)}")
    if minimum is not None and x.device.type == "cpu" and x.numel() and bool((x < minimum).any()):
        raise ValueError(f"{name} must be at least {minimum}, not {x.min().item()}")
    return x


def _column(x: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A per-image [B] tensor as [B, 1, 1, 1] of ``dtype`` on ``device`` (no host wait)."""
    if x.device.type == "cpu":
        x = x.to(dtype).contiguous()
    return _to(x, device).to(dtype).view(-1, 1, 1, 1)


def _ratio(x: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(factor, 1 - factor), each float32 [B, 1, 1, 1]: ``1 - factor`` computed in the
    factor's own precision first, as torchvision computes ``1.0 - ratio`` in Python."""
    x = x if x.is_floating_point() else x.to(torch.float64)
    return _column(x, device, torch.float32), _column(1.0 - x, device, torch.float32)


def where(mask: torch.Tensor, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """Per image, ``new`` where ``mask`` (bool [B], any device), else ``old``.

    ``new`` and ``old``: [B, ...] tensors (broadcastable). Use this when the op was
    computed for every image anyway; :func:`apply_to` computes it only for the
    chosen ones.
    """
    m = _to(mask.to(torch.bool), old.device)
    return torch.where(m.view((-1,) + (1,) * (old.ndim - 1)), new, old)


def apply_to(
    img: torch.Tensor,
    mask: torch.Tensor,
    fn: Callable[..., torch.Tensor],
    *params: torch.Tensor,
) -> torch.Tensor:
    """``fn(img[mask], *(p[mask] for p in params))`` put back in place of those images.

    ``mask``: bool [B]. On the CPU (as the modules draw it), the chosen images are
    known without asking the device: ``fn`` runs only on them (gathered with one
    ``index_select``, scattered back with one ``index_copy``), and with none
    chosen the input itself comes back. On the device, ``fn`` runs on every
    image and :func:`where` selects. ``params``: per-image tensors [B, ...] (on the
    CPU with a CPU mask), indexed like the images. The images not chosen are
    unchanged; the result is a new tensor unless no image was chosen.
    """
    b = img.shape[0]
    if mask.shape != (b,):
        raise ValueError(f"mask must be a bool tensor [{b}], not of shape {tuple(mask.shape)}")
    mask = mask.to(torch.bool)
    if mask.device.type != "cpu":
        return where(mask, fn(img, *params), img)
    n = int(mask.sum())
    if n == 0:
        return img
    if n == b:
        return fn(img, *params)
    idx = mask.nonzero().view(-1)
    idx_dev = _to(idx, img.device)
    out = fn(img.index_select(0, idx_dev), *_take(params, idx, idx_dev))
    return img.index_copy(0, idx_dev, out)


def _take(params: Sequence[torch.Tensor], idx: torch.Tensor, idx_dev: torch.Tensor) -> list:
    """Rows ``idx`` of each per-image tensor, on its own device."""
    return [
        p.index_select(0, idx if p.device.type == "cpu" else _to(idx_dev, p.device)) for p in params
    ]


def apply_groups(
    img: torch.Tensor,
    group: torch.Tensor,
    fns: Sequence[Callable[..., torch.Tensor] | None],
    *params: torch.Tensor,
) -> torch.Tensor:
    """Per image ``i``, ``fns[group[i]]`` applied to it; each function runs once, on its group.

    ``group``: int Tensor[B] on the CPU, values in ``[0, len(fns))``; a None entry
    of ``fns`` leaves its images unchanged. Each ``fn(images, *params)`` gets its
    images gathered in batch order (one ``index_select``) with the matching rows
    of ``params`` (per-image tensors [B, ...]) and returns them transformed
    (same shape and dtype); results are scattered into one output. The batch's
    order is sent to the device once. A batch in a single group is passed
    whole, without a gather (and comes back as it is for a None group).
    """
    b = img.shape[0]
    if not isinstance(group, torch.Tensor) or group.shape != (b,) or group.device.type != "cpu":
        raise ValueError(f"group must be an int CPU tensor [{b}]")
    group = group.to(torch.int64)
    if b and (int(group.min()) < 0 or int(group.max()) >= len(fns)):
        raise ValueError(f"group values must lie in [0, {len(fns)}), not {group.tolist()}")
    counts = torch.bincount(group, minlength=len(fns)).tolist()
    present = [k for k, n in enumerate(counts) if n]
    if len(present) <= 1:
        fn = fns[present[0]] if present else None
        return img if fn is None else fn(img, *params)
    order = torch.argsort(group, stable=True)
    order_dev = _to(order, img.device)
    out = img.clone() if any(fns[k] is None for k in present) else torch.empty_like(img)
    start = 0
    for k, n in enumerate(counts):
        fn = fns[k]
        if n and fn is not None:
            idx, idx_dev = order[start : start + n], order_dev[start : start + n]
            res = fn(img.index_select(0, idx_dev), *_take(params, idx, idx_dev))
            out.index_copy_(0, idx_dev, res)
        start += n
    return out


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
    _check(img, "rgb_to_grayscale")
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
    _check(img, "adjust_brightness")
    f = _per_image(factor, img.shape[0], "brightness factor", minimum=0)
    out = torch.mul(img, _column(f, img.device, torch.float32))
    return out.clamp_(0, 255).to(torch.uint8)


def adjust_saturation(img: torch.Tensor, factor: Param) -> torch.Tensor:
    """Blend each image with its luma (floored): ``img * f + gray * (1 - f)``.

    ``factor``: Tensor[B] (or a number) >= 0; 0 gives grayscale, 1 the image. A
    1-channel image comes back as it is (torchvision, after PIL).
    """
    _check(img, "adjust_saturation")
    f = _per_image(factor, img.shape[0], "saturation factor", minimum=0)
    if img.shape[1] == 1:
        return img
    r, omr = _ratio(f, img.device)
    return _blend(img, _gray(img).floor_(), r, omr)


def adjust_contrast(img: torch.Tensor, factor: Param) -> torch.Tensor:
    """Blend each image with the mean of its (floored) luma: ``img * f + mean * (1 - f)``.

    ``factor``: Tensor[B] (or a number) >= 0; 0 gives a flat grey, 1 the image.
    """
    _check(img, "adjust_contrast")
    f = _per_image(factor, img.shape[0], "contrast factor", minimum=0)
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
    select = torch.tensor(_HSV_SELECT, dtype=torch.int64)
    select = _to(select, img.device)[:, i].moveaxis(0, -3)
    return vpqt.gather(-3, select)


def adjust_hue(img: torch.Tensor, hue_factor: Param) -> torch.Tensor:
    """Rotate each image's hue by ``hue_factor`` turns (in [-0.5, 0.5]) in HSV space.

    torchvision's algorithm (RGB/255 -> HSV -> shift -> RGB, then
    ``* (256 - 1e-3)`` truncated). A 1-channel image comes back as it is.
    """
    _check(img, "adjust_hue")
    f = _per_image(hue_factor, img.shape[0], "hue factor", minimum=-0.5)
    if f.device.type == "cpu" and f.numel() and bool((f > 0.5).any()):
        raise ValueError(f"hue factor must lie in [-0.5, 0.5], not {f.max().item()}")
    if img.shape[1] == 1 or img.numel() == 0:
        return img
    x = img.to(torch.float32).mul_(1.0 / 255)
    h, s, v = _rgb_to_hsv(x).unbind(dim=-3)
    h = h.add_(_column(f, img.device, torch.float32)[:, 0]).remainder_(1.0)
    rgb = _hsv_to_rgb(torch.stack((h, s, v), dim=-3))
    return rgb.mul_(255 + 1.0 - 1e-3).to(torch.uint8)


_SHARPEN = ((1.0, 1.0, 1.0), (1.0, 5.0, 1.0), (1.0, 1.0, 1.0))


def adjust_sharpness(img: torch.Tensor, factor: Param) -> torch.Tensor:
    """Blend each image with its 3x3 smoothed copy (PIL's SMOOTH kernel /13), rounded.

    ``factor``: Tensor[B] (or a number) >= 0; 0 blurs, 1 keeps, 2 sharpens. The
    one-pixel border is kept, and images of side <= 2 come back as they are
    (torchvision's rule).
    """
    _check(img, "adjust_sharpness")
    b, c, h, w = img.shape
    f = _per_image(factor, b, "sharpness factor", minimum=0)
    if img.numel() == 0 or h <= 2 or w <= 2:
        return img
    a, m = 1.0 / 13.0, 5.0 / 13.0
    kernel = torch.tensor(((a, a, a), (a, m, a), (a, a, a)), dtype=torch.float32)
    kernel = _to(kernel, img.device).expand(c, 1, 3, 3)
    out = img.to(torch.float32)
    blurred = nnf.conv2d(out, kernel, groups=c).round_()
    view = out[..., 1:-1, 1:-1]
    _, omr = _ratio(f, img.device)
    view.addcmul_(blurred.sub_(view), omr)
    return out.clamp_(0, 255).to(torch.uint8)


def posterize(img: torch.Tensor, bits: Param) -> torch.Tensor:
    """Keep the ``bits`` (0 to 8, an int Tensor[B] or an int) high bits of every value."""
    _check(img, "posterize")
    nb = _per_image(bits, img.shape[0], "bits", minimum=0)
    if nb.device.type == "cpu" and nb.numel() and bool((nb > 8).any()):
        raise ValueError(f"bits must lie in [0, 8], not {nb.max().item()}")
    nb = _column(nb, img.device, torch.int32)
    mask = (256 - torch.bitwise_left_shift(torch.ones_like(nb), 8 - nb)).to(torch.uint8)
    return img & mask


def solarize(img: torch.Tensor, threshold: Param) -> torch.Tensor:
    """Invert the values >= ``threshold`` (Tensor[B] or a number, compared in float32)."""
    _check(img, "solarize")
    t = _per_image(threshold, img.shape[0], "threshold")
    if t.device.type == "cpu" and t.numel() and bool((t > 255).any()):
        raise ValueError(f"threshold must be at most 255, not {t.max().item()}")
    return torch.where(img >= _column(t, img.device, torch.float32), img.bitwise_not(), img)


def invert(img: torch.Tensor) -> torch.Tensor:
    """``255 - img``."""
    _check_images(img)
    return img.bitwise_not()


def autocontrast(img: torch.Tensor) -> torch.Tensor:
    """Stretch each channel of each image to [0, 255] (a flat channel is kept)."""
    _check(img, "autocontrast")
    if img.numel() == 0:
        return img
    x = img.to(torch.float32)
    lo = x.amin(dim=(-2, -1), keepdim=True)
    hi = x.amax(dim=(-2, -1), keepdim=True)
    flat = hi == lo
    # torchvision's masked assignment, as a select: boolean indexing waits for the device.
    inv_scale = torch.where(flat, 1.0, hi.sub_(lo).mul_(1.0 / 255))
    lo = torch.where(flat, 0.0, lo)
    return x.sub_(lo).div_(inv_scale).clamp_(0, 255).to(torch.uint8)


def equalize(img: torch.Tensor) -> torch.Tensor:
    """Histogram-equalize each channel of each image with PIL's lookup table (torchvision's).

    A channel whose histogram has a single non-maximal step (``step == 0``) is kept.
    """
    _check_images(img)
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
    img: torch.Tensor, kernel_size: int | Sequence[int], sigma: Param
) -> torch.Tensor:
    """Gaussian blur with a per-image sigma, reflect-padded, as torchvision's.

    ``kernel_size``: odd int, or (kx, ky) as torchvision (x first). ``sigma``:
    Tensor[B] (the same in x and y), Tensor[B, 2] (sx, sy), a number or a pair, > 0. The
    blur runs as two 1-D passes (a grouped conv with one kernel per image)
    where torchvision convolves once with their outer product: float32 sums in
    another order, rarely one level apart after rounding.
    """
    _check(img, "gaussian_blur")
    kx, ky = (kernel_size, kernel_size) if isinstance(kernel_size, int) else kernel_size
    for k in (kx, ky):
        if isinstance(k, bool) or not isinstance(k, int) or k < 1 or k % 2 == 0:
            raise ValueError(f"kernel_size must be odd and positive, not {kernel_size!r}")
    b, c, h, w = img.shape
    s = _per_image(sigma, b, "sigma", width=2 if _is_pair(sigma) else 0)
    if s.device.type == "cpu" and s.numel() and bool((s <= 0).any()):
        raise ValueError(f"sigma must be positive, not {s.min().item()}")
    if kx // 2 >= w or ky // 2 >= h:
        raise ValueError(f"kernel_size {kernel_size!r} is too large for {h}x{w} images")
    if img.numel() == 0:
        return img
    s = s if s.ndim == 2 else s[:, None].expand(b, 2)
    s = _to(s.to(torch.float32) if s.device.type == "cpu" else s, img.device).to(torch.float32)
    x = img.to(torch.float32)
    for dim, k in ((-1, kx), (-2, ky)):
        if k == 1:
            continue
        lim = (k - 1) / (2.0 * math.sqrt(2.0))
        lin = torch.linspace(-lim, lim, steps=k, dtype=torch.float32, device=img.device)
        sig = s[:, 0 if dim == -1 else 1]
        weight = torch.softmax(lin.div(sig[:, None]).pow(2).neg(), dim=1)  # [B, k]
        weight = weight[:, None].expand(b, c, k).reshape(b * c, k)
        if dim == -1:
            x = nnf.pad(x, (k // 2, k // 2, 0, 0), mode="reflect")
            weight = weight.view(b * c, 1, 1, k)
        else:
            x = nnf.pad(x, (0, 0, k // 2, k // 2), mode="reflect")
            weight = weight.view(b * c, 1, k, 1)
        x = nnf.conv2d(x.reshape(1, b * c, *x.shape[-2:]), weight, groups=b * c)
        x = x.view(b, c, *x.shape[-2:])
    return x.round_().to(torch.uint8)


def _is_pair(x: object) -> bool:
    """A sigma given per axis: (sx, sy) numbers, or a tensor [B, 2]."""
    return x.ndim == 2 if isinstance(x, torch.Tensor) else isinstance(x, Sequence)


# ---------------------------------------------------------------- geometry


def _interpolation(mode: object) -> str:
    mode = getattr(mode, "value", mode)  # torchvision's InterpolationMode
    if mode not in _INTERPOLATIONS:
        raise ValueError(f"interpolation must be 'nearest' or 'bilinear', not {mode!r}")
    return mode


def _fill_values(fill: Fill, b: int, c: int) -> tuple[torch.Tensor | None, bool]:
    """``fill`` as float32 [1 or B, C, 1, 1] (CPU or device), and whether it is all zeros
    as far as the host knows without asking the device."""
    if fill is None:
        return None, False
    if isinstance(fill, torch.Tensor):
        t = fill
    else:
        vals = [float(fill)] if isinstance(fill, (int, float)) else [float(v) for v in fill]
        t = torch.tensor(vals, dtype=torch.float32)
    if t.ndim == 0 or (t.ndim == 1 and t.shape[0] in (1, c)):
        t = t.reshape(1, -1).expand(1, c)
    elif not (t.ndim == 2 and t.shape[0] == b and t.shape[1] in (1, c)):
        raise ValueError(f"fill must be a number, {c} numbers or a tensor [{b}, {c}], not {fill!r}")
    zero = t.device.type == "cpu" and not bool(t.any())
    return t.to(torch.float32).expand(-1, c).reshape(-1, c, 1, 1), zero


def affine_matrix(
    angle: torch.Tensor,
    translate: torch.Tensor,
    scale: torch.Tensor,
    shear: torch.Tensor,
    center: torch.Tensor,
) -> torch.Tensor:
    """torchvision's inverse affine matrices (output pixel -> input pixel), [B, 2, 3].

    ``angle`` [B] degrees clockwise, ``translate`` [B, 2] (tx, ty) pixels, ``scale``
    [B], ``shear`` [B, 2] (x, y) degrees, ``center`` [B, 2] relative to the image
    centre. ``M = T C R S SHy SHx C^-1``, inverted in closed form; computed in the
    inputs' dtype (float64 for Python numbers, as torchvision's ``math``).
    """
    rot = torch.deg2rad(angle)
    sx, sy = torch.deg2rad(shear).unbind(-1)
    cx, cy = center.unbind(-1)
    tx, ty = translate.unbind(-1)
    cos_sy = torch.cos(sy)
    tan_sx = torch.tan(sx)
    rot_minus_sy = rot - sy
    cx_plus_tx = cx + tx
    cy_plus_ty = cy + ty
    a = torch.cos(rot_minus_sy) / cos_sy
    b = -(a * tan_sx + torch.sin(rot))
    c = torch.sin(rot_minus_sy) / cos_sy
    d = torch.cos(rot) - c * tan_sx
    m0, m1, m3, m4 = d / scale, -b / scale, -c / scale, a / scale
    m2 = cx - m0 * cx_plus_tx - m1 * cy_plus_ty
    m5 = cy - m3 * cx_plus_tx - m4 * cy_plus_ty
    return torch.stack([m0, m1, m2, m3, m4, m5], -1).view(-1, 2, 3)


def affine(
    img: torch.Tensor,
    angle: Param,
    translate: Param | Sequence[float] = 0.0,
    scale: Param = 1.0,
    shear: Param | Sequence[float] = 0.0,
    interpolation: str = "nearest",
    fill: Fill = None,
    center: Sequence[float] | torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-image affine warp about the centre, torchvision's ``affine`` geometry.

    Args:
      img: Tensor[B, C, H, W] uint8.
      angle: clockwise degrees, Tensor[B] or a number.
      translate: (tx, ty) pixels, Tensor[B, 2], a pair, or 0.
      scale: Tensor[B] or a number, > 0.
      shear: (x, y) degrees, Tensor[B, 2], a pair, or one number (x only).
      interpolation: "nearest" or "bilinear".
      fill: None (zero padding, torchvision's ``fill=None``), a number, C numbers,
        or Tensor[B, C]: the value of pixels mapped from outside the image.
        Given, the sample of a ones channel weighs it in as torchvision does
        (bilinear edges blend towards it).
      center: (x, y) pixels of the fixed point (Tensor[B, 2] or a pair); None =
        the image centre.

    Returns uint8 Tensor[B, C, H, W]. The sampling grid is torchvision's
    (pixel-centre coordinates, ``grid_sample(align_corners=False)``), so most
    pixels match exactly; a nearest sample exactly halfway between two pixels
    may pick the other one.
    """
    _check_images(img)
    b, _, h, w = img.shape
    mode = _interpolation(interpolation)
    ang = _per_image(angle, b, "angle")
    tr = _per_image(translate, b, "translate", width=2)
    sc = _per_image(scale, b, "scale")
    if sc.device.type == "cpu" and sc.numel() and bool((sc <= 0).any()):
        raise ValueError(f"scale must be positive, not {sc.min().item()}")
    sh = shear
    if not isinstance(sh, torch.Tensor) and not isinstance(sh, Sequence):
        sh = (float(sh), 0.0)
    elif isinstance(sh, torch.Tensor) and sh.ndim == 1 and sh.shape == (b,):
        sh = torch.stack([sh, torch.zeros_like(sh)], -1)
    sh = _per_image(sh, b, "shear", width=2)
    if center is None:
        ctr = torch.zeros((b, 2), dtype=torch.float64)
    else:
        ctr = _per_image(center, b, "center", width=2)
        ctr = ctr - torch.tensor([w * 0.5, h * 0.5], dtype=ctr.dtype, device=ctr.device)
    params = (ang, tr, sc, sh, ctr)
    on_cpu = all(p.device.type == "cpu" for p in params)
    dev = (
        torch.device("cpu") if on_cpu else next(p.device for p in params if p.device.type != "cpu")
    )
    dt = torch.float64 if on_cpu else torch.float32
    theta = affine_matrix(*(_to(p.to(dt), dev).to(dt) for p in params))
    return _warp(img, theta, mode, fill)


def rotate(
    img: torch.Tensor,
    angle: Param,
    interpolation: str = "nearest",
    fill: Fill = None,
    center: Sequence[float] | torch.Tensor | None = None,
) -> torch.Tensor:
    """Rotate each image by ``angle`` degrees counter-clockwise (Tensor[B] or a number)
    about the centre, keeping its size: torchvision's ``rotate(expand=False)``.
    ``interpolation``, ``fill``, ``center``: as :func:`affine`."""
    _check_images(img)
    ang = _per_image(angle, img.shape[0], "angle")
    return affine(img, -ang, 0.0, 1.0, 0.0, interpolation, fill, center)


def _warp(img: torch.Tensor, theta: torch.Tensor, mode: str, fill: Fill) -> torch.Tensor:
    """Sample ``img`` at ``theta`` (float [B, 2, 3], pixel units about the centre)."""
    b, c, h, w = img.shape
    fill_t, fill_zero = _fill_values(fill, b, c)
    if img.numel() == 0:
        return img.clone()
    dev = img.device
    # torchvision's _affine_grid: pixel-centre coordinates about the centre, the
    # matrix applied, then normalised by the half sizes.
    theta = theta.to(torch.float32)
    rows = torch.stack([theta[:, 0] / (0.5 * w), theta[:, 1] / (0.5 * h)], 1)
    rescaled = _to(rows.transpose(1, 2).contiguous(), dev)
    base = torch.empty(1, h, w, 3, dtype=torch.float32, device=dev)
    base[..., 0].copy_(torch.linspace((1.0 - w) * 0.5, (w - 1.0) * 0.5, steps=w, device=dev))
    base[..., 1].copy_(
        torch.linspace((1.0 - h) * 0.5, (h - 1.0) * 0.5, steps=h, device=dev).unsqueeze_(-1)
    )
    base[..., 2].fill_(1)
    grid = base.view(1, h * w, 3).expand(b, h * w, 3).bmm(rescaled).view(b, h, w, 2)
    # Nearest with a zero fill equals zero padding: no ones channel needed.
    use_mask = fill_t is not None and not (mode == "nearest" and fill_zero)
    x = torch.empty((b, c + use_mask, h, w), dtype=torch.float32, device=dev)
    x[:, :c].copy_(img)
    if use_mask:
        x[:, c].fill_(1.0)
    x = nnf.grid_sample(x, grid, mode=mode, padding_mode="zeros", align_corners=False)
    if use_mask:
        x, mask = x[:, :c], x[:, c:]
        f = _to(fill_t, dev)
        # torchvision's rule: nearest takes the fill where the ones channel fell
        # below one half; bilinear blends, (sample - fill) * mask + fill.
        nearest = mode == "nearest"
        x = torch.where(mask < 0.5, f, x) if nearest else x.sub_(f).mul_(mask).add_(f)
    return x.round_().clamp_(0, 255).to(torch.uint8)


# ---------------------------------------------------------------- erasing


def erase(img: torch.Tensor, boxes: torch.Tensor, value: Fill | torch.Tensor = 0) -> torch.Tensor:
    """Set each image's box (top, left, height, width) to ``value``.

    Args:
      img: Tensor[B, C, H, W], uint8 or floating (e.g. normalized).
      boxes: int Tensor[B, 4] (top, left, height, width) per image, any device;
        a zero height or width erases nothing.
      value: a number, C numbers, or a tensor broadcastable to [B, C, H, W] (such
        as per-pixel noise [B, C, H, W], read inside the box only). Converted to
        the images' dtype as torchvision's ``erase`` assigns (uint8 truncates).

    Returns a new tensor of the images' dtype and device.
    """
    if not isinstance(img, torch.Tensor) or img.ndim != 4:
        shape = tuple(img.shape) if isinstance(img, torch.Tensor) else type(img)
        raise ValueError(f"images must be a batch [B, C, H, W], not {shape}")
    b, c, h, w = img.shape
    if not isinstance(boxes, torch.Tensor) or boxes.shape != (b, 4):
        raise ValueError(f"boxes must be an int tensor [{b}, 4] (top, left, height, width)")
    dev = img.device
    box = _to(boxes.to(torch.int32) if boxes.device.type == "cpu" else boxes, dev).to(torch.int32)
    top, left, bh, bw = (t.view(b, 1, 1, 1) for t in box.unbind(1))
    rows = torch.arange(h, device=dev, dtype=torch.int32).view(1, 1, h, 1)
    cols = torch.arange(w, device=dev, dtype=torch.int32).view(1, 1, 1, w)
    inside = ((rows >= top) & (rows < top + bh)) & ((cols >= left) & (cols < left + bw))
    if isinstance(value, torch.Tensor):
        v = _to(value, dev)
    else:
        vals = [float(value)] if isinstance(value, (int, float)) else [float(x) for x in value]
        if len(vals) not in (1, c):
            raise ValueError(f"value must be one number or {c} (one per channel), not {value!r}")
        v = _to(torch.tensor(vals, dtype=torch.float32).view(1, -1, 1, 1), dev)
    return torch.where(inside, v.to(img.dtype), img)
