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

else:  # imported standalone, beside resample_triton.py: plain ValueErrors
    UsageError = ValueError  # type: ignore[misc,assignment]
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


# The resize's interpolations: torchvision's ``InterpolationMode`` values that its
# ``resize`` takes for uint8 tensors (lanczos only antialiased, as torchvision).
INTERPOLATIONS = ("nearest", "nearest-exact", "bilinear", "bicubic", "lanczos")
# Half the width of each filter at scale 1 (torch's ``interp_size / 2``).
_HALF = {"nearest": 1, "nearest-exact": 1, "bilinear": 1, "bicubic": 2, "lanczos": 3}
# Pillow's integer constants, which torchvision also takes.
_PIL_MODES = {0: "nearest", 2: "bilinear", 3: "bicubic", 1: "lanczos"}


def interpolation_mode(
    value: object, op: str, allowed: Sequence[str] = INTERPOLATIONS, why: str = ""
) -> str:
    """``value`` (torchvision's ``InterpolationMode``, its string value or Pillow's
    integer constant) as its string, one of ``allowed``; UsageError naming ``op``
    (and ``why``, appended)."""
    mode = getattr(value, "value", value)
    if isinstance(mode, int) and not isinstance(mode, bool):
        mode = _PIL_MODES.get(mode, mode)
    if not isinstance(mode, str) or mode not in allowed:
        names = ", ".join(repr(m) for m in allowed)
        raise UsageError(f"{op}: interpolation must be one of {names}, not {value!r}{why}")
    return mode


def check_antialias(mode: str, antialias: object, op: str) -> bool:
    """torchvision's rule: ``antialias`` (a bool; None is False) matters for bilinear,
    bicubic and lanczos, which must be antialiased; nearest modes ignore it."""
    if antialias is not None and not isinstance(antialias, bool):
        raise UsageError(f"{op}: antialias must be True or False, not {antialias!r}")
    if mode == "lanczos" and not antialias:
        raise UsageError(f"{op}: interpolation 'lanczos' needs antialias=True (as torchvision)")
    return bool(antialias)


def taps(scale: float, mode: str = "bilinear", antialias: bool = True) -> int:
    """Upper bound on the window length for crop length / output length <= scale."""
    if mode.startswith("nearest"):
        return 1
    half = _HALF[mode]
    return math.ceil(2 * half * (max(scale, 1.0) if antialias else 1.0)) + 1


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


def _cubic(x: torch.Tensor, a: float) -> torch.Tensor:
    """Keys' cubic convolution kernel (torch's ``cubic_convolution1/2``), 0 beyond 2."""
    x = x.abs()
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    far = ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
    return torch.where(x < 1.0, near, torch.where(x < 2.0, far, 0.0))


def _lanczos(x: torch.Tensor) -> torch.Tensor:
    """Lanczos-3 (torch's and PIL's): sinc(x) sinc(x / 3) inside |x| < 3."""
    x = x.abs()
    px = x * math.pi
    safe = torch.where(x == 0, 1.0, px)
    w = torch.sin(safe) * torch.sin(safe / 3.0) * 3.0 / (safe * safe)
    return torch.where(x < 3.0, torch.where(x == 0, 1.0, w), 0.0)


def filter_weights(
    start: torch.Tensor,
    length: torch.Tensor,
    out_size: int,
    taps: int,
    mode: str = "bilinear",
    antialias: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`aa_weights` for any of :data:`INTERPOLATIONS`: ``index`` int64 and
    ``weight`` float32, [B, out_size, taps] (``taps`` from :func:`taps`).

    torch's rules (what torchvision's ``resize`` of a uint8 tensor calls), scale =
    length / out in float32: "nearest" reads ``min(floor(i * scale), length - 1)``,
    "nearest-exact" ``floor((i + 0.5) * scale)``; bilinear, bicubic (Keys' a = -0.5,
    PIL's) and lanczos-3 antialiased as :func:`aa_weights` with their filter (support
    stretched by the scale when downscaling, window clipped to the crop, weights
    normalized); bilinear without antialias the same with the support unstretched;
    bicubic without antialias four taps at ``floor(src) - 1 ..`` with src = scale *
    (i + 0.5) - 0.5, Keys' a = -0.75, border pixels repeated (indices clamped).
    """
    if mode == "bilinear" and antialias:
        return aa_weights(start, length, out_size, taps)
    dev = start.device
    length_f = length.to(torch.float32)[:, None, None]
    scale = length_f / out_size
    i = torch.arange(out_size, device=dev, dtype=torch.float32)[None, :, None]
    last = (length - 1)[:, None, None]
    k = torch.arange(taps, device=dev, dtype=torch.float32)
    if mode.startswith("nearest"):
        pos = (i + 0.5 if mode == "nearest-exact" else i) * scale
        src = torch.minimum(pos.floor().to(torch.int64), last)
        return start[:, None, None] + src, torch.ones(src.shape, device=dev)
    if mode == "bicubic" and not antialias:
        src = scale * (i + 0.5) - 0.5
        f = src.floor()
        j = f - 1.0 + k
        w = _cubic(src - j, -0.75)
        index = start[:, None, None] + j.to(torch.int64).clamp(min=0).minimum(last)
        return index, w
    stretch = scale.clamp(min=1.0) if antialias else torch.ones_like(scale)
    support = _HALF[mode] * stretch
    centre = scale * (i + 0.5)
    first = (centre - support + 0.5).floor().clamp(min=0)
    j = first + k
    x = (j - centre + 0.5) / stretch
    if mode == "bilinear":
        w = (1.0 - x.abs()).clamp(min=0.0)
    elif mode == "bicubic":
        w = _cubic(x, -0.5)
    else:
        w = _lanczos(x)
    w = torch.where(j < length_f, w, 0.0)
    w = w / w.sum(-1, keepdim=True).clamp(min=1e-12)
    index = start[:, None, None] + torch.minimum(j.to(torch.int64), last)
    return index, w


def overshoots(mode: str) -> bool:
    """Whether ``mode``'s filter has negative lobes (bicubic, lanczos): torch's uint8
    resize then rounds and clamps the horizontal pass to bytes before the vertical one
    (the order and the rounding this module's paths follow for those modes)."""
    return mode in ("bicubic", "lanczos")


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
    interpolation: object = "bilinear",
    antialias: bool | None = True,
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
      interpolation: "bilinear" (default), "nearest", "nearest-exact", "bicubic" or
        "lanczos" (or torchvision's ``InterpolationMode``): :func:`filter_weights`.
      antialias: as torchvision's (default True; ignored by the nearest modes,
        required by lanczos).

    Returns:
      Tensor[B, C, h, w], uint8 in [0, 255], on the images' device. Matches
      ``torchvision.transforms.v2.functional.resized_crop(img, top, left,
      height, width, size, interpolation, antialias=antialias)`` of a uint8 CPU
      tensor image by image within rounding (bilinear: about 0.2/255 mean absolute
      difference, at most 1-2/255 per pixel; nearest: equal; bicubic and lanczos
      round and clamp the horizontal pass to bytes, as torch's CPU kernel does, and
      differ by at most 1-2/255 on a few pixels). CUDA computes the same pixels.
    """
    check_images(images, "resized_crop")
    mode = interpolation_mode(interpolation, "resized_crop")
    aa = check_antialias(mode, antialias, "resized_crop")
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
    ky, kx = taps(sy, mode, aa), taps(sx, mode, aa)
    use_triton = backend == "triton" or (backend == "auto" and dev.type == "cuda")
    kernels = triton_kernels() if use_triton else None
    if backend == "auto" and kernels is not None and not kernels.fits((sy, sx), mode):
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
        return kernels.resample(images, table, oh, ow, ky, kx, (sy, sx), mode, aa)
    boxes = to_device(boxes, dev)
    if flip is not None:
        flip = to_device(flip, dev)
    if b == 0:
        return images.new_empty((0, c, oh, ow))
    top, left, bh, bw = boxes.unbind(1)
    iy, wy = filter_weights(top, bh, oh, ky, mode, aa)
    ix, wx = filter_weights(left, bw, ow, kx, mode, aa)
    if flip is not None:
        f = flip[:, None, None]
        ix, wx = torch.where(f, ix.flip(1), ix), torch.where(f, wx.flip(1), wx)
    return _resample_matmul(images, iy, wy, ix, wx, oh, ow, overshoots(mode))


def _resample_matmul(
    images: torch.Tensor,
    iy: torch.Tensor,
    wy: torch.Tensor,
    ix: torch.Tensor,
    wx: torch.Tensor,
    oh: int,
    ow: int,
    clamp_rows: bool = False,
) -> torch.Tensor:
    """``Ry @ X @ Rx^T`` per image, the width first; ``clamp_rows``: round and clamp
    that first pass to bytes (torch's uint8 kernel, for the filters that overshoot)."""
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
    if clamp_rows:
        t = t.add_(0.5).floor_().clamp_(0, 255)
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
