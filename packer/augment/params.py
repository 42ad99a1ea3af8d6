"""What the batched ops of :mod:`packer.imaging` share to take per-image parameters.

A parameter is one Python number for every image, or a Tensor[B] (or [B, k]) on any
device: :func:`param` checks it and keeps host values in numpy, :func:`send_params`
moves a call's host values to the device in one non-blocking copy through reused
pinned buffers (:func:`send`), :func:`constant` makes small device constants once, and
:func:`fill_values` reads a warp's ``fill``. :func:`apply_to`, :func:`where` and
:func:`apply_groups` run an op on the chosen images only, or one op per group. Used by
:mod:`~packer.augment.functional` (colour and pixels), :mod:`~packer.augment.warps`
(geometry) and the modules built on them; nothing here makes the host wait for the
device.
"""

from __future__ import annotations

import collections
import math
import threading
from collections.abc import Callable, Sequence

import numpy as np
import torch

from ..imaging.resize import ArgumentError, check_images

Param = float | int | torch.Tensor
Fill = float | int | Sequence[float] | torch.Tensor | None

_NUMPY = {torch.float32: np.float32, torch.uint8: np.uint8}


class _Staging:
    """Reused pinned buffers for the small host-to-device copies of one process.

    First in, first out: a copy takes the oldest buffer once the event recorded
    after its last copy has passed (one query), else a new one; so once as many
    buffers exist as copies are in flight, no call allocates pinned memory.
    Both ``Tensor.pin_memory()`` (which asks the driver whether the tensor is
    pinned) and torch's caching pinned allocator (which queries every pending
    block's event) cost much a call on a host whose queue runs far ahead of the
    device (see docs/PERFORMANCE.md, section "Figures behind the code", row "pinned
    buffers").
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


def send(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small CPU tensor onto ``device`` without making the host wait: through a
    reused pinned buffer (:class:`_Staging`), then one non-blocking copy."""
    if t.device == device:
        return t
    if device.type == "cuda" and t.device.type == "cpu":
        return _STAGING.send(t, device)
    return t.to(device)


def check_batch(img: torch.Tensor, name: str, channels: tuple[int, ...] = (1, 3)) -> None:
    check_images(img, name)
    if img.shape[1] not in channels:
        allowed = " or ".join(map(str, channels))
        raise ValueError(f"{name} takes {allowed} channels, not {img.shape[1]}")


def param(
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


def send_params(
    device: torch.device, dtype: torch.dtype, *params: np.ndarray | torch.Tensor
) -> list[torch.Tensor]:
    """Each parameter as ``dtype`` on ``device``, the host ones in one non-blocking copy."""
    host = [p for p in params if isinstance(p, np.ndarray)]
    if len(host) == 1:
        flat = np.asarray(host[0], dtype=_NUMPY[dtype]).ravel()
    elif host:
        flat = np.concatenate([np.asarray(p, dtype=_NUMPY[dtype]).ravel() for p in host])
    if host:
        buf = send(torch.from_numpy(flat), device)
    out, start = [], 0
    for p in params:
        if isinstance(p, np.ndarray):
            out.append(buf[start : start + p.size].view(p.shape))
            start += p.size
        else:
            out.append(p.to(device=device, dtype=dtype))
    return out


_CONSTANTS: dict[tuple, torch.Tensor] = {}


def constant(key: tuple, device: torch.device, make: Callable[[], torch.Tensor]) -> torch.Tensor:
    """A small constant tensor on ``device``, made once (kernels, tables, base grids).

    ``make`` builds it on the device or copies it there with ``send``: a plain copy
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
    m = send(mask.to(torch.bool), old.device)
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
    idx_dev = send(idx_cpu, img.device)
    out = fn(img.index_select(0, idx_dev), *_take(params, idx_cpu, idx_dev))
    return img.index_copy(0, idx_dev, out)


def _take(params: Sequence[torch.Tensor], idx: torch.Tensor, idx_dev: torch.Tensor) -> list:
    """Rows ``idx`` of each per-image tensor, on its own device."""
    return [
        p.index_select(0, idx if p.device.type == "cpu" else send(idx_dev, p.device))
        for p in params
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
    order_dev = send(order, img.device)
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


def fill_values(fill: Fill, b: int, c: int) -> np.ndarray | torch.Tensor | None:
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
    if f.size and not (np.isfinite(f).all() and f.min() >= 0 and f.max() <= 255):
        raise ArgumentError(f"fill must lie in [0, 255] for uint8 images, not {fill!r}")
    if f.shape[1] == c:
        return f
    full = np.empty((f.shape[0], c))
    full[...] = f
    return full


# ---------------------------------------------------------------- argument bounds
# The bounds of packer.transforms' size-like and numeric arguments, checked when an
# op is made (docs/RELIABILITY.md, "Arguments and outputs, round 4"): past them an op
# would allocate or loop without limit, or compute NaN or infinity.
MAX_BINS = 1024  # num_magnitude_bins (torchvision's default 31)
MAX_OPS = 64  # RandAugment's num_ops (default 2): one pass over the batch each
MAX_CHAINS = 16  # AugMix's mixture_width and chain_depth (defaults 3 and 1-3)
MAX_ALPHA = 1000.0  # the Beta/Dirichlet concentration of MixUp, CutMix, AugMix
MAX_CLASSES = 1_000_000  # MixUp/CutMix num_classes: soft labels [B, num_classes] float32
MAX_FACTOR = 256.0  # ColorJitter's brightness/contrast/saturation, sharpness factors
MAX_SIGMA = 1000.0  # GaussianBlur's sigma
MAX_DEGREES = 360.0  # rotation angles (either sign)
MAX_SHEAR = 89.0  # shear angles (either sign): tan(90 degrees) is infinite
MAX_SCALE = 1000.0  # RandomAffine's scale


def number(
    value: object,
    name: str,
    op: str,
    lo: float | None = None,
    hi: float | None = None,
    *,
    lo_open: bool = False,
) -> float:
    """``value`` as a finite float within [lo, hi] ((lo, hi] with ``lo_open``); an
    :class:`~packer.imaging.resize.ArgumentError` naming ``op`` and ``name`` otherwise
    (NaN, an infinity, a bool, a string)."""
    bad = isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating))
    v = math.nan if bad else float(value)  # type: ignore[arg-type]
    if bad or not math.isfinite(v):
        raise ArgumentError(f"{op}: {name} must be a finite number, not {value!r}")
    if (lo is not None and (v <= lo if lo_open else v < lo)) or (hi is not None and v > hi):
        where = f"{'(' if lo_open else '['}{'-inf' if lo is None else lo:g}, {hi:g}]"
        raise ArgumentError(f"{op}: {name} must lie in {where}, not {value!r}")
    return v


def count(value: object, name: str, op: str, lo: int, hi: int) -> int:
    """``value`` as an int in [lo, hi]; ArgumentError naming ``op`` and ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ArgumentError(f"{op}: {name} must be an int in [{lo}, {hi}], not {value!r}")
    if not lo <= int(value) <= hi:
        raise ArgumentError(f"{op}: {name} must be an int in [{lo}, {hi}], not {value!r}")
    return int(value)


def check_fill(fill: object, op: str) -> None:
    """A fill given to an op: None, or numbers each finite in [0, 255] (uint8 images);
    ArgumentError naming ``op`` otherwise. Device tensors are checked when used."""
    if fill is None or (isinstance(fill, torch.Tensor) and fill.device.type != "cpu"):
        return
    try:
        f = np.asarray(fill.numpy() if isinstance(fill, torch.Tensor) else fill, dtype=np.float64)
    except (TypeError, ValueError):
        return  # the op's own check names what it takes
    if f.size and not (np.isfinite(f).all() and f.min() >= 0 and f.max() <= 255):
        raise ArgumentError(
            f"{op}: fill must be finite, in [0, 255] for uint8 images, not {fill!r}"
        )
