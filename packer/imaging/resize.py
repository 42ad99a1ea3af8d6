"""The batched crop and resize core: :func:`resized_crop`, on uint8 ``[B, C, H, W]``.

Per image, separable antialiased interpolation weights (torchvision/PIL's triangle
filter, support ``max(scale, 1)``, the windows of ``torch``'s ``_upsample_bilinear2d_aa``)
with the crop box folded in. On CUDA a Triton kernel (``resample_triton``) computes them
from the boxes and applies them per 16x16 output tile as two small float16 products on
the tensor cores (uint8 values are exact in float16); on the CPU, or without Triton,
they are dense matrices applied as ``Ry @ X @ Rx^T`` in batched matrix products. Box
tables reach the device through reused pinned memory (:func:`pinned_tables`) with one
async copy: nothing here makes the host wait for the device.

Also what every batched op of :mod:`packer.imaging` shares: the check of an image batch
(:func:`check_images`), the non-blocking copy of small parameter tensors
(:func:`to_device`) and the size rule (:func:`size_pair`, :data:`MAX_SIDE`).
This module needs only torch and numpy, so it also imports standalone (beside
``resample_triton.py``, which it uses when Triton imports).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence

import numpy as np
import torch

Size = int | tuple[int, int] | Sequence[int]

if __package__:
    from ..errors import UsageError

    class ArgumentError(UsageError, ValueError):
        """A bad argument or input of an op of :mod:`packer.transforms`: a
        :class:`~packer.errors.UsageError` (the CLI's one ``Error:`` line, exit 2) that
        is also the ``ValueError`` the ops have always raised. The message names the op
        (or function) and the argument."""

else:  # imported standalone, beside resample_triton.py
    ArgumentError = ValueError  # type: ignore[misc,assignment]


# Largest output side any transform makes: twice the build's --size limit (8192),
# so upscaling a pack's images stays possible, while a typo such as 10**6 fails at
# once instead of asking the allocator for terabytes.
MAX_SIDE = 16384


def size_pair(size: Size, name: str = "size") -> tuple[int, int]:
    """``size`` as (height, width), each 1 to :data:`MAX_SIDE`; ValueError otherwise."""
    if isinstance(size, bool):
        raise ArgumentError(f"{name} must be a positive int or (height, width), not {size!r}")
    if isinstance(size, int):
        size = (size, size)
    try:
        h, w = (int(s) for s in size)
    except (TypeError, ValueError):
        raise ArgumentError(
            f"{name} must be a positive int or (height, width), not {size!r}"
        ) from None
    if h < 1 or w < 1:
        raise ArgumentError(f"{name} must be positive, not {size!r}")
    if h > MAX_SIDE or w > MAX_SIDE:
        raise ArgumentError(
            f"{name} {size!r} is too large: each output side must be at most {MAX_SIDE} pixels"
        )
    return h, w


def check_images(images: torch.Tensor, op: object = None) -> None:
    """A uint8 batch [B, C, H, W]; ValueError otherwise, and :class:`ArgumentError`
    (naming ``op``: an op, or its name) for images of zero pixels (H or W of 0) in a
    non-empty batch: no op of :mod:`packer.transforms` means anything on them."""
    if not isinstance(images, torch.Tensor):
        raise ValueError(f"images must be a uint8 tensor [B, C, H, W], not {type(images)}")
    if images.dtype != torch.uint8:
        raise ValueError(
            f"images must be uint8 [B, C, H, W] in [0, 255], not {images.dtype}; "
            "augment before packer.Normalize"
        )
    if images.ndim != 4:
        raise ValueError(f"images must be a batch [B, C, H, W], not of shape {tuple(images.shape)}")
    if images.shape[0] and not (images.shape[2] and images.shape[3]):
        raise ArgumentError(f"{op_name(op)}: images {zero_size(images)}")


def op_name(op: object) -> str:
    """``op``'s name for a message: a string as it is, else its class's name."""
    if op is None:
        return "images"
    return op if isinstance(op, str) else type(op).__name__


def zero_size(images: torch.Tensor) -> str:
    h, w = images.shape[-2:]
    return (
        f"of {h}x{w} pixels (a batch {list(images.shape)}) hold nothing to transform; "
        "every image needs at least one pixel"
    )


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
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


def pinned_tables(device: torch.device) -> _PinnedTables:
    ring = _PINNED.get(device)
    if ring is None:
        ring = _PINNED.setdefault(device, _PinnedTables(device))
    return ring


# ---------------------------------------------------------------- interpolation weights


def taps(scale: float) -> int:
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
    check_images(images, "resized_crop")
    oh, ow = size_pair(size)
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
    ky, kx = taps(sy), taps(sx)
    use_triton = backend == "triton" or (backend == "auto" and dev.type == "cuda")
    kernels = triton_kernels() if use_triton else None
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
            ring = pinned_tables(dev) if dev.type == "cuda" else None
            if ring is not None:
                k, pinned, arr = ring.take(b)
            else:
                arr = np.empty((b, 5), dtype=np.int32)
            arr[:, :4] = bn
            arr[:, 4] = flip.numpy() if flip is not None else 0
            table = ring.send(k, pinned) if ring is not None else torch.from_numpy(arr)
        else:
            f = (
                to_device(flip, dev)
                if flip is not None
                else torch.zeros(b, dtype=torch.bool, device=dev)
            )
            table = torch.cat([boxes, f[:, None].to(torch.int64)], 1).to(torch.int32)
        return kernels.resample(images, table, oh, ow, ky, kx, (sy, sx))
    boxes = to_device(boxes, dev)
    if flip is not None:
        flip = to_device(flip, dev)
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


def triton_kernels():  # -> module | None
    """The Triton kernels' module (``resample``, ``fits``), or None without Triton."""
    try:
        if __package__:
            from . import resample_triton as kernels
        else:  # imported standalone, next to resample_triton.py
            import resample_triton as kernels
    except ImportError:
        return None
    return kernels
