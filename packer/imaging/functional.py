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
non-blocking copies (:func:`_to`), and no value is read back.
"""

from __future__ import annotations

import collections
import math
import threading
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as nnf

from .transforms import _check_images

Param = float | int | torch.Tensor
Fill = float | int | Sequence[float] | torch.Tensor | None

_INTERPOLATIONS = ("nearest", "bilinear")
_NUMPY = {torch.float32: np.float32, torch.uint8: np.uint8}


# ---------------------------------------------------------------- parameters


class _Staging:
    """Reused pinned buffers for the small host-to-device copies of one process.

    First in, first out: a copy takes the oldest buffer once the event recorded
    after its last copy has passed (one query), else a new one; so once as many
    buffers exist as copies are in flight, no call allocates pinned memory.
    Both ``Tensor.pin_memory()`` (which asks the driver whether the tensor is
    pinned) and torch's caching pinned allocator (which queries every pending
    block's event) cost tens to hundreds of microseconds a call on an H100 host
    whose queue runs far ahead of the device.
    """

    _MAX = 64  # buffers kept; beyond, the oldest is dropped (torch frees it once its copy ran)

    def __init__(self) -> None:
        self._ring: collections.deque = collections.deque()
        self._lock = threading.Lock()

    def send(self, t: torch.Tensor, device: torch.device) -> torch.Tensor:
        nbytes = t.numel() * t.element_size()
        buf = None
        with self._lock:
            if self._ring and self._ring[0][1].query():
                buf = self._ring.popleft()[0]
        if buf is None or buf.numel() < nbytes:
            buf = torch.empty(max(nbytes, 1 << 16), dtype=torch.uint8, pin_memory=True)
        staged = buf[:nbytes].view(t.dtype).view(t.shape)
        staged.copy_(t)
        out = staged.to(device, non_blocking=True)
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(device))
        with self._lock:
            self._ring.append((buf, ev))
            if len(self._ring) > self._MAX:
                self._ring.popleft()
        return out


_STAGING = _Staging()


def _to(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small CPU tensor onto ``device`` without making the host wait: through a
    reused pinned buffer (:class:`_Staging`), then one non-blocking copy."""
    if t.device == device:
        return t
    if device.type == "cuda" and t.device.type == "cpu":
        return _STAGING.send(t, device)
    return t.to(device)


def _check(img: torch.Tensor, name: str, channels: tuple[int, ...] = (1, 3)) -> None:
    _check_images(img)
    if img.shape[1] not in channels:
        allowed = " or ".join(map(str, channels))
        raise ValueError(f"{name} takes {allowed} channels, not {img.shape[1]}")


def _param(
    x: Param | Sequence[float],
    b: int,
    name: str,
    width: int = 0,
    lo: float | None = None,
    hi: float | None = None,
) -> np.ndarray | torch.Tensor:
    """A per-image parameter: float64 numpy [b] (``width`` 0) or [b, width] when it is
    on the host (a number, numbers, a CPU tensor), checked against [lo, hi]; a device
    tensor as it is (only its shape checked: its values would make the host wait).

    Host values stay in numpy until one copy takes them all to the device: each
    torch call on a tiny CPU tensor costs the host microseconds.
    """
    shape = (b,) if width == 0 else (b, width)
    if isinstance(x, torch.Tensor) and x.device.type != "cpu":
        if x.ndim == 0 or (width and tuple(x.shape) == (width,)):
            x = x.expand(shape)
        if tuple(x.shape) != shape:
            raise ValueError(
                f"{name} must be a tensor {list(shape)}, not of shape {tuple(x.shape)}"
            )
        return x
    try:
        a = np.asarray(x.detach().numpy() if isinstance(x, torch.Tensor) else x, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number or a tensor {list(shape)}, not {x!r}") from None
    if a.ndim == 0 or (width and a.shape == (width,)):
        full = np.empty(shape)
        full[...] = a  # cheaper than np.broadcast_to for these tiny arrays
        a = full
    if a.shape != shape:
        raise ValueError(f"{name} must be a tensor {list(shape)}, not of shape {a.shape}")
    if a.size and lo is not None and a.min() < lo:
        raise ValueError(f"{name} must be at least {lo}, not {a.min()}")
    if a.size and hi is not None and a.max() > hi:
        raise ValueError(f"{name} must be at most {hi}, not {a.max()}")
    return a


def _send(
    device: torch.device, dtype: torch.dtype, *params: np.ndarray | torch.Tensor
) -> list[torch.Tensor]:
    """Each parameter as ``dtype`` on ``device``, the host ones in one non-blocking copy."""
    host = [p for p in params if isinstance(p, np.ndarray)]
    if len(host) == 1:
        flat = np.asarray(host[0], dtype=_NUMPY[dtype]).ravel()
    elif host:
        flat = np.concatenate([np.asarray(p, dtype=_NUMPY[dtype]).ravel() for p in host])
    if host:
        buf = _to(torch.from_numpy(flat), device)
    out, start = [], 0
    for p in params:
        if isinstance(p, np.ndarray):
            out.append(buf[start : start + p.size].view(p.shape))
            start += p.size
        else:
            out.append(p.to(device=device, dtype=dtype))
    return out


def _ratio(f: np.ndarray | torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(factor, 1 - factor), each float32 [B, 1, 1, 1] on ``device``: ``1 - factor``
    computed in float64 first, as torchvision computes ``1.0 - ratio`` in Python."""
    r, omr = _send(device, torch.float32, f, 1.0 - f)
    return r.view(-1, 1, 1, 1), omr.view(-1, 1, 1, 1)


_CONSTANTS: dict[tuple, torch.Tensor] = {}


def _constant(key: tuple, device: torch.device, make: Callable[[], torch.Tensor]) -> torch.Tensor:
    """A small constant tensor on ``device``, made once (kernels, tables, base grids).

    ``make`` builds it on the device or copies it there with ``_to``: a plain copy
    from pageable memory would make the host wait."""
    key = (*key, device)
    t = _CONSTANTS.get(key)
    if t is None:
        if len(_CONSTANTS) >= 64:  # many image sizes: start over rather than grow
            _CONSTANTS.clear()
        t = _CONSTANTS[key] = make()
    return t


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
    if not isinstance(mask, torch.Tensor) or mask.shape != (b,):
        raise ValueError(f"mask must be a bool tensor [{b}]")
    if mask.device.type != "cpu":
        return where(mask, fn(img, *params), img)
    idx = np.flatnonzero(mask.numpy())
    if len(idx) == 0:
        return img
    if len(idx) == b:
        return fn(img, *params)
    idx_cpu = torch.from_numpy(idx)
    idx_dev = _to(idx_cpu, img.device)
    out = fn(img.index_select(0, idx_dev), *_take(params, idx_cpu, idx_dev))
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
    g = group.numpy().astype(np.int64, copy=False)
    if b and (g.min() < 0 or g.max() >= len(fns)):
        raise ValueError(f"group values must lie in [0, {len(fns)}), not {g.min()}..{g.max()}")
    counts = np.bincount(g, minlength=len(fns)).tolist()
    present = [k for k, n in enumerate(counts) if n]
    if len(present) <= 1:
        fn = fns[present[0]] if present else None
        return img if fn is None else fn(img, *params)
    order = torch.from_numpy(np.argsort(g, kind="stable"))
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
    f = _param(factor, img.shape[0], "brightness factor", lo=0)
    (col,) = _send(img.device, torch.float32, f)
    out = torch.mul(img, col.view(-1, 1, 1, 1))
    return out.clamp_(0, 255).to(torch.uint8)


def adjust_saturation(img: torch.Tensor, factor: Param) -> torch.Tensor:
    """Blend each image with its luma (floored): ``img * f + gray * (1 - f)``.

    ``factor``: Tensor[B] (or a number) >= 0; 0 gives grayscale, 1 the image. A
    1-channel image comes back as it is (torchvision, after PIL).
    """
    _check(img, "adjust_saturation")
    f = _param(factor, img.shape[0], "saturation factor", lo=0)
    if img.shape[1] == 1:
        return img
    r, omr = _ratio(f, img.device)
    return _blend(img, _gray(img).floor_(), r, omr)


def adjust_contrast(img: torch.Tensor, factor: Param) -> torch.Tensor:
    """Blend each image with the mean of its (floored) luma: ``img * f + mean * (1 - f)``.

    ``factor``: Tensor[B] (or a number) >= 0; 0 gives a flat grey, 1 the image.
    """
    _check(img, "adjust_contrast")
    f = _param(factor, img.shape[0], "contrast factor", lo=0)
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
    select = _constant(("hsv",), dev, lambda: _to(torch.tensor(_HSV_SELECT), dev))
    return vpqt.gather(-3, select[:, i].moveaxis(0, -3))


def adjust_hue(img: torch.Tensor, hue_factor: Param) -> torch.Tensor:
    """Rotate each image's hue by ``hue_factor`` turns (in [-0.5, 0.5]) in HSV space.

    torchvision's algorithm (RGB/255 -> HSV -> shift -> RGB, then
    ``* (256 - 1e-3)`` truncated). A 1-channel image comes back as it is.
    """
    _check(img, "adjust_hue")
    f = _param(hue_factor, img.shape[0], "hue factor", lo=-0.5, hi=0.5)
    if img.shape[1] == 1 or img.numel() == 0:
        return img
    x = img.to(torch.float32).mul_(1.0 / 255)
    h, s, v = _rgb_to_hsv(x).unbind(dim=-3)
    (shift,) = _send(img.device, torch.float32, f)
    h = h.add_(shift.view(-1, 1, 1)).remainder_(1.0)
    rgb = _hsv_to_rgb(torch.stack((h, s, v), dim=-3))
    return rgb.mul_(255 + 1.0 - 1e-3).to(torch.uint8)


def _smooth_kernel(device: torch.device) -> torch.Tensor:
    a, m = 1.0 / 13.0, 5.0 / 13.0
    return _to(torch.tensor(((a, a, a), (a, m, a), (a, a, a)), dtype=torch.float32), device)


def adjust_sharpness(img: torch.Tensor, factor: Param) -> torch.Tensor:
    """Blend each image with its 3x3 smoothed copy (PIL's SMOOTH kernel /13), rounded.

    ``factor``: Tensor[B] (or a number) >= 0; 0 blurs, 1 keeps, 2 sharpens. The
    one-pixel border is kept, and images of side <= 2 come back as they are
    (torchvision's rule).
    """
    _check(img, "adjust_sharpness")
    b, c, h, w = img.shape
    f = _param(factor, b, "sharpness factor", lo=0)
    if img.numel() == 0 or h <= 2 or w <= 2:
        return img
    dev = img.device
    kernel = _constant(("smooth",), dev, lambda: _smooth_kernel(dev)).expand(c, 1, 3, 3)
    out = img.to(torch.float32)
    blurred = nnf.conv2d(out, kernel, groups=c).round_()
    view = out[..., 1:-1, 1:-1]
    _, omr = _ratio(f, dev)
    view.addcmul_(blurred.sub_(view), omr)
    return out.clamp_(0, 255).to(torch.uint8)


def posterize(img: torch.Tensor, bits: Param) -> torch.Tensor:
    """Keep the ``bits`` (0 to 8, an int Tensor[B] or an int) high bits of every value."""
    _check(img, "posterize")
    nb = _param(bits, img.shape[0], "bits", lo=0, hi=8)
    if isinstance(nb, np.ndarray):
        keep = 256 - np.left_shift(1, 8 - nb.astype(np.int64))  # 0 bits: 0; 8 bits: 255
    else:
        nb = nb.to(torch.int32)
        keep = 256 - torch.bitwise_left_shift(torch.ones_like(nb), 8 - nb)
    (mask,) = _send(img.device, torch.uint8, keep)
    return img & mask.view(-1, 1, 1, 1)


def solarize(img: torch.Tensor, threshold: Param) -> torch.Tensor:
    """Invert the values >= ``threshold`` (Tensor[B] or a number, compared in float32)."""
    _check(img, "solarize")
    t = _param(threshold, img.shape[0], "threshold", hi=255)
    (col,) = _send(img.device, torch.float32, t)
    return torch.where(img >= col.view(-1, 1, 1, 1), img.bitwise_not(), img)


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
    img: torch.Tensor, kernel_size: int | Sequence[int], sigma: Param | Sequence[float]
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
    s = _param(sigma, b, "sigma", width=2 if _is_pair(sigma) else 0)
    if isinstance(s, np.ndarray) and s.size and s.min() <= 0:
        raise ValueError(f"sigma must be positive, not {s.min()}")
    if kx // 2 >= w or ky // 2 >= h:
        raise ValueError(f"kernel_size {kernel_size!r} is too large for {h}x{w} images")
    if img.numel() == 0:
        return img
    (s,) = _send(img.device, torch.float32, s)
    s = s if s.ndim == 2 else s[:, None].expand(b, 2)
    # One reflect pad of the uint8 images for both passes (padding rows, then
    # filtering along them, equals filtering then padding), one float32 copy.
    x = nnf.pad(img, (kx // 2, kx // 2, ky // 2, ky // 2), mode="reflect").to(torch.float32)
    x = x.view(1, b * c, *x.shape[-2:])
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


# ---------------------------------------------------------------- geometry


def _interpolation(mode: object) -> str:
    mode = getattr(mode, "value", mode)  # torchvision's InterpolationMode
    if mode not in _INTERPOLATIONS:
        raise ValueError(f"interpolation must be 'nearest' or 'bilinear', not {mode!r}")
    return mode


def affine_matrix(angle, translate, scale, shear, center):  # -> same kind as the inputs
    """torchvision's inverse affine matrices (output pixel -> input pixel), [B, 2, 3].

    Inputs all numpy float64 arrays or all tensors: ``angle`` [B] degrees
    clockwise, ``translate`` [B, 2] (tx, ty) pixels, ``scale`` [B], ``shear``
    [B, 2] (x, y) degrees, ``center`` [B, 2] relative to the image centre.
    ``M = T C R S SHy SHx C^-1``, inverted in closed form as
    ``_get_inverse_affine_matrix`` does, in the inputs' precision (float64 for
    host values, as torchvision's ``math``).
    """
    xp = np if isinstance(angle, np.ndarray) else torch
    rot = xp.deg2rad(angle)
    sx, sy = xp.deg2rad(shear[..., 0]), xp.deg2rad(shear[..., 1])
    cx, cy = center[..., 0], center[..., 1]
    tx, ty = translate[..., 0], translate[..., 1]
    cos_sy = xp.cos(sy)
    tan_sx = xp.tan(sx)
    rot_minus_sy = rot - sy
    cx_plus_tx = cx + tx
    cy_plus_ty = cy + ty
    a = xp.cos(rot_minus_sy) / cos_sy
    b = -(a * tan_sx + xp.sin(rot))
    c = xp.sin(rot_minus_sy) / cos_sy
    d = xp.cos(rot) - c * tan_sx
    m0, m1, m3, m4 = d / scale, -b / scale, -c / scale, a / scale
    m2 = cx - m0 * cx_plus_tx - m1 * cy_plus_ty
    m5 = cy - m3 * cx_plus_tx - m4 * cy_plus_ty
    return xp.stack([m0, m1, m2, m3, m4, m5], -1).reshape(-1, 2, 3)


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
      shear: (x, y) degrees, Tensor[B, 2], a pair, or Tensor[B] / one number (x only).
      interpolation: "nearest" or "bilinear" (or torchvision's InterpolationMode).
      fill: None (zero padding, torchvision's ``fill=None``), a number, C numbers,
        or Tensor[B, C], in [0, 255]: the value of pixels mapped from outside the
        image. Given, the sample of a ones channel weighs it in as torchvision
        does (bilinear edges blend towards it).
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
    ang = _param(angle, b, "angle")
    tr = _param(translate, b, "translate", width=2)
    sc = _param(scale, b, "scale")
    if isinstance(sc, np.ndarray) and sc.size and sc.min() <= 0:
        raise ValueError(f"scale must be positive, not {sc.min()}")
    if isinstance(shear, torch.Tensor) and shear.ndim == 1 and shear.shape[0] == b != 2:
        shear = torch.stack([shear, torch.zeros_like(shear)], -1)
    elif not isinstance(shear, (torch.Tensor, Sequence)):
        shear = (float(shear), 0.0)
    sh = _param(shear, b, "shear", width=2)
    ctr = np.zeros((b, 2)) if center is None else _param(center, b, "center", width=2)
    ctr = ctr - np.array([w * 0.5, h * 0.5]) if center is not None else ctr
    params = (ang, tr, sc, sh, ctr)
    if all(isinstance(p, np.ndarray) for p in params):
        theta = affine_matrix(*params)
    else:  # some parameters on a device: the matrices are built there, in float32
        dev = next(p.device for p in params if isinstance(p, torch.Tensor))
        theta = affine_matrix(*_send(dev, torch.float32, *params))
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
    ang = _param(angle, img.shape[0], "angle")
    return affine(img, -ang, 0.0, 1.0, 0.0, interpolation, fill, center)


def _fill_values(fill: Fill, b: int, c: int) -> np.ndarray | torch.Tensor | None:
    """``fill`` as float [1 or B, C] (numpy, checked in [0, 255], or a device tensor)."""
    if fill is None:
        return None
    if isinstance(fill, torch.Tensor) and fill.device.type != "cpu":
        t = fill.reshape(1, -1) if fill.ndim < 2 else fill
        if t.shape[0] not in (1, b) or t.shape[1] not in (1, c):
            raise ValueError(f"fill must be a number, {c} numbers or a tensor [{b}, {c}]")
        return t.expand(-1, c)
    try:
        f = np.asarray(fill.numpy() if isinstance(fill, torch.Tensor) else fill, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"fill must be a number, {c} numbers or a tensor [{b}, {c}]") from None
    f = f.reshape(1, -1) if f.ndim < 2 else f
    if f.ndim != 2 or f.shape[0] not in (1, b) or f.shape[1] not in (1, c):
        raise ValueError(f"fill must be a number, {c} numbers or a tensor [{b}, {c}], not {fill!r}")
    if f.size and (f.min() < 0 or f.max() > 255):
        raise ValueError(f"fill must lie in [0, 255] for uint8 images, not {fill!r}")
    if f.shape[1] == c:
        return f
    full = np.empty((f.shape[0], c))
    full[...] = f
    return full


def _base_grid(h: int, w: int, device: torch.device) -> torch.Tensor:
    """torchvision's ``_affine_grid`` base: float32 [H*W, 3] rows (x, y, 1), pixel centres
    about the image centre, x fastest; built once per size and device."""

    def make() -> torch.Tensor:
        base = torch.empty(h, w, 3, dtype=torch.float32, device=device)
        base[..., 0].copy_(torch.linspace((1.0 - w) * 0.5, (w - 1.0) * 0.5, steps=w, device=device))
        base[..., 1].copy_(
            torch.linspace((1.0 - h) * 0.5, (h - 1.0) * 0.5, steps=h, device=device)[:, None]
        )
        base[..., 2].fill_(1.0)
        return base.view(h * w, 3)

    return _constant(("grid", h, w), device, make)


def _warp(
    img: torch.Tensor, theta: np.ndarray | torch.Tensor, mode: str, fill: Fill
) -> torch.Tensor:
    """Sample ``img`` at ``theta`` (float [B, 2, 3], pixel units about the centre)."""
    b, c, h, w = img.shape
    fills = _fill_values(fill, b, c)
    if img.numel() == 0:
        return img.clone()
    dev = img.device
    # torchvision's _affine_grid: the matrix's rows (in float32) over the half sizes.
    if isinstance(theta, np.ndarray):
        rows = theta.astype(np.float32)
        rows[:, 0] /= np.float32(0.5 * w)
        rows[:, 1] /= np.float32(0.5 * h)
    else:
        rows = torch.stack([theta[:, 0] / (0.5 * w), theta[:, 1] / (0.5 * h)], 1)
    rows, *fills_dev = _send(dev, torch.float32, rows, *(() if fills is None else (fills,)))
    # [H*W, 3] @ [B, 3, 2] as torchvision's bmm (the base shared, not copied): grid [B, H, W, 2].
    base = _base_grid(h, w, dev).expand(b, h * w, 3)
    grid = torch.bmm(base, rows.transpose(1, 2)).view(b, h, w, 2)
    # Nearest with a zero fill is zero padding: the ones channel is not needed then.
    zero_fill = isinstance(fills, np.ndarray) and not fills.any()
    use_mask = fills is not None and not (mode == "nearest" and zero_fill)
    if use_mask:
        x = torch.empty((b, c + 1, h, w), dtype=torch.float32, device=dev)
        x[:, :c].copy_(img)
        x[:, c].fill_(1.0)
    else:
        x = img.to(torch.float32)
    x = nnf.grid_sample(x, grid, mode=mode, padding_mode="zeros", align_corners=False)
    if use_mask:
        x, mask = x[:, :c], x[:, c:]
        f = fills_dev[0].view(-1, c, 1, 1)
        # torchvision's rule: nearest takes the fill where the ones channel fell
        # below one half; bilinear blends, (sample - fill) * mask + fill.
        nearest = mode == "nearest"
        x = torch.where(mask < 0.5, f, x) if nearest else x.sub_(f).mul_(mask).add_(f)
    # Nearest samples are whole values unless a fill is fractional: no rounding then.
    integral = fills is None or (isinstance(fills, np.ndarray) and (fills == np.round(fills)).all())
    if mode == "bilinear" or not integral:
        x = x.round_()
    if isinstance(fills, torch.Tensor):  # device fills: unchecked, so clamp
        x = x.clamp_(0, 255)
    return x.to(torch.uint8)


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
        v = _to(value, dev).to(img.dtype)
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
            v = _constant(
                ("fill", vals, img.dtype),
                dev,
                lambda: _to(torch.tensor(vals, dtype=img.dtype).view(1, c, 1, 1), dev),
            )
    if boxes.device.type == "cpu":
        # Row and column masks on the host, one small copy: no index arithmetic on the device.
        top, left, bh, bw = (col[:, None] for col in boxes.numpy().T)
        rows, cols = np.arange(h), np.arange(w)
        rc = np.concatenate(
            [(rows >= top) & (rows < top + bh), (cols >= left) & (cols < left + bw)], 1
        )
        rc = _to(torch.from_numpy(rc), dev)
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
