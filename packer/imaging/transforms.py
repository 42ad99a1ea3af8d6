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

The crop and resize is one batched call, :func:`resized_crop`: per image,
separable antialiased interpolation weights (torchvision/PIL's triangle filter,
support ``max(scale, 1)``, the windows of ``torch``'s ``_upsample_bilinear2d_aa``)
with the crop box folded in. On CUDA a Triton kernel (``resample_triton``)
computes them from the boxes and applies them per 16x16 output tile as two small
float16 products on the tensor cores (uint8 values are exact in float16); on the
CPU, or without Triton, they are dense matrices applied as ``Ry @ X @ Rx^T`` in
batched matrix products. Host work per batch on CUDA (Compose of crop + flip):
one draw from the generator, about 25 numpy passes written straight into a
reused pinned [B, 5] int32 table, one async copy and one launch.
This module needs only torch and numpy, so it also imports standalone.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

Size = int | tuple[int, int] | Sequence[int]

# Tries before RandomResizedCrop falls back to a centre crop, as torchvision.
_TRIES = 10


# Largest output side any transform makes: twice the build's --size limit (8192),
# so upscaling a pack's images stays possible, while a typo such as 10**6 fails at
# once instead of asking the allocator for terabytes.
MAX_SIDE = 16384


def _pair(size: Size, name: str = "size") -> tuple[int, int]:
    """``size`` as (height, width), each 1 to :data:`MAX_SIDE`; ValueError otherwise."""
    if isinstance(size, bool):
        raise ValueError(f"{name} must be a positive int or (height, width), not {size!r}")
    if isinstance(size, int):
        size = (size, size)
    try:
        h, w = (int(s) for s in size)
    except (TypeError, ValueError):
        raise ValueError(
            f"{name} must be a positive int or (height, width), not {size!r}"
        ) from None
    if h < 1 or w < 1:
        raise ValueError(f"{name} must be positive, not {size!r}")
    if h > MAX_SIDE or w > MAX_SIDE:
        raise ValueError(
            f"{name} {size!r} is too large: each output side must be at most {MAX_SIDE} pixels"
        )
    return h, w


def _np_sizes(size: int | torch.Tensor, batch: int) -> np.ndarray:
    if isinstance(size, torch.Tensor):
        size = size.detach().cpu().numpy()
    return np.broadcast_to(np.asarray(size, dtype=np.int64), (batch,))


def _check_images(images: torch.Tensor) -> None:
    if not isinstance(images, torch.Tensor):
        raise ValueError(f"images must be a uint8 tensor [B, C, H, W], not {type(images)}")
    if images.dtype != torch.uint8:
        raise ValueError(
            f"images must be uint8 [B, C, H, W] in [0, 255], not {images.dtype}; "
            "augment before packer.Normalize"
        )
    if images.ndim != 4:
        raise ValueError(f"images must be a batch [B, C, H, W], not of shape {tuple(images.shape)}")


def _to(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small CPU tensor onto ``device`` without making the host wait."""
    if t.device == device:
        return t
    if device.type == "cuda" and t.device.type == "cpu":
        # Pinned (from torch's caching host allocator) so the copy is truly async.
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


class _PinnedTables:
    """A few reusable pinned int32 tables [cap, 5] feeding one CUDA device's kernel launches.

    Pinning per call (``pin_memory()``) costs the host an allocator round trip and
    a copy; here numpy writes the parameters straight into pinned memory and one
    async copy moves them. A slot is reused only once the event recorded after its
    copy has passed; a slot still in flight gets a fresh buffer instead (the old
    one is freed through torch's caching host allocator, which waits for that
    copy), so the host never waits for the device.
    """

    def __init__(self, device: torch.device, slots: int = 8) -> None:
        self.device = device
        self._bufs: list[torch.Tensor | None] = [None] * slots
        self._events: list[torch.cuda.Event | None] = [None] * slots
        self._next = 0
        self._lock = threading.Lock()

    def take(self, batch: int) -> tuple[int, torch.Tensor, np.ndarray]:
        """A free slot: (its index, pinned int32 [batch, 5] tensor, its numpy view)."""
        with self._lock:
            k = self._next
            self._next = (k + 1) % len(self._bufs)
            buf, ev = self._bufs[k], self._events[k]
            if buf is None or buf.shape[0] < batch or (ev is not None and not ev.query()):
                buf = torch.empty((max(batch, 256), 5), dtype=torch.int32, pin_memory=True)
                self._bufs[k] = buf
            # The slot is claimed until its copy is enqueued and recorded.
            self._events[k] = None
            self._bufs[k] = None
        return k, buf[:batch], buf.numpy()[:batch]

    def send(self, k: int, table: torch.Tensor) -> torch.Tensor:
        """Copy slot ``k``'s ``table`` to the device (async) and release the slot."""
        out = torch.empty(table.shape, dtype=torch.int32, device=self.device)
        out.copy_(table, non_blocking=True)
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(self.device))
        with self._lock:
            base = table if table._base is None else table._base
            if self._bufs[k] is None:
                self._bufs[k], self._events[k] = base, ev
        return out


_PINNED: dict[torch.device, _PinnedTables] = {}


def _pinned_tables(device: torch.device) -> _PinnedTables:
    ring = _PINNED.get(device)
    if ring is None:
        ring = _PINNED.setdefault(device, _PinnedTables(device))
    return ring


# ---------------------------------------------------------------- interpolation weights


def _taps(scale: float) -> int:
    """Upper bound on the antialias window length for crop length / output length <= scale."""
    return math.ceil(2 * max(scale, 1.0)) + 1


def aa_weights(
    start: torch.Tensor, length: torch.Tensor, out_size: int, taps: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Antialiased bilinear weights along one axis, one window per output pixel.

    ``start``, ``length``: int64 [B], the crop's first index and length along the
    axis (in the padded image). Returns ``index`` int64 [B, out_size, taps], the
    input positions (clamped inside the crop, so always readable), and ``weight``
    float32 [B, out_size, taps], summing to 1 over taps (0 for unused taps).

    Same rule as torch's ``_upsample_bilinear2d_aa`` (what torchvision's
    ``resize(..., antialias=True)`` calls): scale = length / out, support =
    max(scale, 1), centre = scale * (i + 0.5), triangle filter over
    ``(j - centre + 0.5) / support`` for j in the window clipped to the crop.
    """
    dev = start.device
    length_f = length.to(torch.float32)
    scale = (length_f / out_size)[:, None, None]
    support = scale.clamp(min=1.0)
    centre = scale * (torch.arange(out_size, device=dev, dtype=torch.float32)[None, :, None] + 0.5)
    first = (centre - support + 0.5).floor().clamp(min=0)
    j = first + torch.arange(taps, device=dev, dtype=torch.float32)
    w = (1.0 - ((j - centre + 0.5) / support).abs()).clamp(min=0.0)
    w = torch.where(j < length_f[:, None, None], w, 0.0)
    w = w / w.sum(-1, keepdim=True).clamp(min=1e-12)
    last = (length - 1)[:, None, None]
    index = start[:, None, None] + torch.minimum(j.to(torch.int64), last)
    return index, w


def check_boxes(boxes: np.ndarray, sizes: np.ndarray) -> None:
    """Raise ValueError naming the first box (int [B, 4] top, left, height, width) that
    is empty or leaves its image; ``sizes``: int [B, 2] (or [1, 2], for all) (h, w)."""
    top, left, bh, bw = boxes.T
    h, w = np.broadcast_to(sizes, (len(boxes), 2)).T
    bad = (top < 0) | (left < 0) | (bh < 1) | (bw < 1) | (top + bh > h) | (left + bw > w)
    if bad.any():
        i = int(bad.argmax())
        raise ValueError(
            f"box {i} {boxes[i].tolist()} (top, left, height, width) is empty or leaves "
            f"the {h[i]}x{w[i]} image"
        )


def _dense(index: torch.Tensor, weight: torch.Tensor, in_size: int) -> torch.Tensor:
    """Windowed weights as a dense interpolation matrix, float32 [B, out, in_size]."""
    b, out, _ = index.shape
    m = torch.zeros(b, out, in_size, device=index.device, dtype=torch.float32)
    return m.scatter_add_(2, index, weight)


def resized_crop(
    images: torch.Tensor,
    boxes: torch.Tensor,
    size: Size,
    *,
    flip: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Crop each image to its own box and resize it, antialiased, in one batched call.

    Args:
      images: Tensor[B, C, H, W], uint8 in [0, 255], CPU or CUDA. May be a
        padded batch of images of different sizes: only the pixels inside each
        box are read.
      boxes: Tensor[B, 4], int64 (top, left, height, width) in pixels, each box
        inside its image (checked when ``boxes`` is on the CPU; a CPU tensor is
        moved to the images' device without a sync).
      size: output (height, width), or one int for a square.
      flip: optional Tensor[B] bool: mirror those outputs left-right (free here:
        the rows of the width matrix are reversed).
      backend: "auto" (Triton kernel on CUDA when Triton imports, else batched
        matrix products), "matmul" (always the matrix products) or "triton"
        (always the kernel; on the CPU only under ``TRITON_INTERPRET=1``).

    Returns:
      Tensor[B, C, h, w], uint8 in [0, 255], on the images' device. Matches
      ``torchvision.transforms.v2.functional.resized_crop(img, top, left,
      height, width, size, antialias=True)`` image by image within rounding
      (about 0.2/255 mean absolute difference, at most 1-2/255 per pixel).
    """
    _check_images(images)
    oh, ow = _pair(size)
    if backend not in ("auto", "matmul", "triton"):
        raise ValueError(f"backend must be 'auto', 'matmul' or 'triton', not {backend!r}")
    b, c, h_img, w_img = images.shape
    if not isinstance(boxes, torch.Tensor) or boxes.shape != (b, 4):
        shape = tuple(boxes.shape) if isinstance(boxes, torch.Tensor) else type(boxes)
        raise ValueError(f"boxes must be an int64 tensor [{b}, 4] (top, left, h, w), not {shape}")
    if boxes.is_floating_point():
        raise ValueError("boxes must be integer pixels (top, left, height, width), not floats")
    boxes = boxes.to(torch.int64)
    dev = images.device
    boxes_on_cpu = boxes.device.type == "cpu"
    if boxes_on_cpu:
        bn = boxes.numpy()
        check_boxes(bn, np.array([[h_img, w_img]]))
        _, _, bh, bw = bn.T
        sy, sx = (int(bh.max()) / oh, int(bw.max()) / ow) if b else (1.0, 1.0)
    else:
        sy, sx = h_img / oh, w_img / ow
    ky, kx = _taps(sy), _taps(sx)
    use_triton = backend == "triton" or (backend == "auto" and dev.type == "cuda")
    kernels = _triton() if use_triton else None
    if backend == "auto" and kernels is not None and not kernels.fits((sy, sx)):
        kernels = None  # a huge downscale: the dense products handle it better
    if backend == "triton" and kernels is None:
        raise ValueError("backend='triton' needs Triton (it ships with CUDA builds of torch)")
    if flip is not None:
        flip = flip.to(torch.bool).reshape(b)
    if kernels is not None:
        if b == 0:
            return images.new_empty((0, c, oh, ow))
        # One small int32 table [B, 5] (box + flip), one async copy: the kernel
        # computes its weights itself, so the host launches nothing else.
        if boxes_on_cpu:  # on CUDA written straight into a reused pinned table
            ring = _pinned_tables(dev) if dev.type == "cuda" else None
            if ring is not None:
                k, pinned, arr = ring.take(b)
            else:
                arr = np.empty((b, 5), dtype=np.int32)
            arr[:, :4] = bn
            arr[:, 4] = flip.numpy() if flip is not None else 0
            table = ring.send(k, pinned) if ring is not None else torch.from_numpy(arr)
        else:
            f = _to(flip, dev) if flip is not None else torch.zeros(b, dtype=torch.bool, device=dev)
            table = torch.cat([boxes, f[:, None].to(torch.int64)], 1).to(torch.int32)
        return kernels.resample(images, table, oh, ow, ky, kx, (sy, sx))
    boxes = _to(boxes, dev)
    if flip is not None:
        flip = _to(flip, dev)
    if b == 0:
        return images.new_empty((0, c, oh, ow))
    top, left, bh, bw = boxes.unbind(1)
    iy, wy = aa_weights(top, bh, oh, ky)
    ix, wx = aa_weights(left, bw, ow, kx)
    if flip is not None:
        f = flip[:, None, None]
        ix, wx = torch.where(f, ix.flip(1), ix), torch.where(f, wx.flip(1), wx)
    return _resample_matmul(images, iy, wy, ix, wx, oh, ow)


def _resample_matmul(
    images: torch.Tensor,
    iy: torch.Tensor,
    wy: torch.Tensor,
    ix: torch.Tensor,
    wx: torch.Tensor,
    oh: int,
    ow: int,
) -> torch.Tensor:
    b, c, h, w = images.shape
    # uint8 values and these weights are exact enough in float16 (error < 0.3/255);
    # float16 products accumulate in float32 on CUDA. The CPU has fast float32 only.
    dt = torch.float16 if images.device.type == "cuda" else torch.float32
    ry = _dense(iy, wy, h).to(dt)  # [B, oh, H]
    rxt = _dense(ix, wx, w).to(dt).transpose(1, 2)  # [B, W, ow]
    # Lay X out as [B, H, C, W] while converting, so both products are plain bmm:
    # (B, H*C, W) @ (B, W, ow) -> (B, H, C*ow); (B, oh, H) @ that -> (B, oh, C, ow).
    x = torch.empty((b, h, c, w), dtype=dt, device=images.device)
    x.copy_(images.permute(0, 2, 1, 3))
    t = torch.bmm(x.view(b, h * c, w), rxt).view(b, h, c * ow)
    y = torch.bmm(ry, t).view(b, oh, c, ow)
    y = y.float() if dt != torch.float32 else y
    out = torch.empty((b, c, oh, ow), dtype=torch.uint8, device=images.device)
    out.copy_(y.add_(0.5).clamp_(0, 255).permute(0, 2, 1, 3))  # round half up, as torch's uint8
    return out


def _triton():  # -> module | None
    """The Triton kernels' module (``resample``, ``fits``), or None without Triton."""
    try:
        if __package__:
            from . import resample_triton as kernels
        else:  # imported standalone, next to resample_triton.py
            import resample_triton as kernels
    except ImportError:
        return None
    return kernels


# ---------------------------------------------------------------- modules


class _Transform(nn.Module):
    accepts_generator = True

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self._repr_fields().items())

    def _repr_fields(self) -> dict[str, object]:
        return {}


class _SizedTransform(_Transform):
    """A transform with an output ``size`` (h, w), settable between epochs (progressive
    resizing); validated by ``_pair``."""

    @property
    def size(self) -> tuple[int, int]:
        return self._size

    @size.setter
    def size(self, value: Size) -> None:
        self._size = _pair(value)


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
        _check_images(images)
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
        _check_images(images)
        mask = _to(self.sample(images.shape[0], generator), images.device)
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
        _check_images(images)
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
        pair = _pair(value)  # validates
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
        _check_images(images)
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
    random numbers in the same order as the two run one after the other.

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
        i = 0
        while i < len(mods):
            t = mods[i]
            nxt = mods[i + 1] if i + 1 < len(mods) else None
            if isinstance(t, RandomResizedCrop) and isinstance(nxt, RandomHorizontalFlip):
                _check_images(images)
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
    kernels = _triton()
    if kernels is None:
        return None
    b, _, h, w = images.shape
    oh, ow = crop.size
    # The largest box is the whole image: if the kernel suits that, it suits all.
    if not kernels.fits((h / oh, w / ow)):
        return None
    ring = _pinned_tables(images.device)
    k, table, arr = ring.take(b)
    crop._draw(b, h, w, generator, arr)
    arr[:, 4] = torch.rand(b, generator=generator).numpy() < flip.p
    sy, sx = int(arr[:, 2].max()) / oh, int(arr[:, 3].max()) / ow
    return kernels.resample(images, ring.send(k, table), oh, ow, _taps(sy), _taps(sx), (sy, sx))
