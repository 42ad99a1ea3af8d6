"""Batch mixers: MixUp, CutMix and a random choice between them, with soft labels.

Each mixer is called ``mixer(images, labels, generator=g) -> (images, soft_labels)``:

* ``images``: Tensor[B, C, H, W] on any device, uint8 in [0, 255] (mixed in
  float32, rounded back to uint8) or floating (mixed in its dtype);
* ``labels``: int64 [B] class indices in [0, num_classes), or already soft
  floating [B, num_classes] (for instance the output of another mixer);
* ``soft_labels``: float32 [B, num_classes] (a floating input keeps its dtype),
  each row summing to 1 when the input rows do.

As torchvision's v2 MixUp/CutMix, image ``i`` is mixed with image ``i - 1`` (the
batch rolled by one, so shuffle the batch) with one ``lam ~ Beta(alpha, alpha)``
for the whole batch; ``mode="elem"`` draws one ``lam`` (and one CutMix box) per
image instead. Random numbers come from ``generator`` on the CPU, in torchvision's
order: a batch-mode mixer seeded like torch's default generator draws exactly
torchvision's ``lam`` and box. Label smoothing is the loss's job
(``CrossEntropyLoss(label_smoothing=...)``), not the mixer's.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from ..imaging.resize import ArgumentError, zero_size
from .draws import uniform
from .params import MAX_ALPHA, MAX_CLASSES, count, send

_MODES = ("batch", "elem")


def sample_beta(alpha: float, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """``n`` draws of Beta(alpha, alpha), float32 [n] on the CPU.

    The first of a two-parameter Dirichlet, as ``torch.distributions.Beta``
    samples, so the same generator state gives torchvision's ``lam``.
    """
    return torch._sample_dirichlet(_concentration(alpha, n), generator=generator)[:, 0]


def _beta_one(alpha: float, generator: torch.Generator | None) -> float:
    """``float(sample_beta(alpha, 1, generator)[0])``, the same draw, with less host work."""
    return torch._sample_dirichlet(_concentration(alpha, 1), generator=generator).tolist()[0][0]


_CONCENTRATIONS: dict[tuple[float, int], torch.Tensor] = {}


def _concentration(alpha: float, n: int) -> torch.Tensor:
    """float32 [n, 2] of ``alpha``, made once per (alpha, n): ``torch.full`` costs about
    what the draw does."""
    key = (float(alpha), n)
    conc = _CONCENTRATIONS.get(key)
    if conc is None:
        if len(_CONCENTRATIONS) >= 64:  # many batch sizes: start over rather than grow
            _CONCENTRATIONS.clear()
        conc = _CONCENTRATIONS[key] = torch.full((n, 2), key[0], dtype=torch.float32)
    return conc


class CutMixDraw(NamedTuple):
    """One CutMix draw for ``n`` boxes (n = 1 in batch mode, B in elem mode), on the CPU."""

    lam: torch.Tensor  # float32 [n], the Beta draw
    boxes: torch.Tensor  # int64 [n, 4], (x1, y1, x2, y2), the pasted region, maybe empty
    lam_adjusted: torch.Tensor  # float64 [n], 1 - box area / image area: the labels' weight


class _Mixer(nn.Module):
    accepts_generator = True
    mixes_labels = True

    def __init__(self, alpha: float, num_classes: int | None, mode: str) -> None:
        super().__init__()
        name = type(self).__name__
        ok = not isinstance(alpha, bool) and isinstance(alpha, (int, float))
        if not (ok and 0 < alpha <= MAX_ALPHA):  # NaN and infinities too
            raise ArgumentError(
                f"{name}: alpha must be a positive number at most {MAX_ALPHA:g}, not {alpha!r}"
            )
        alpha = float(alpha)
        if num_classes is not None and (
            isinstance(num_classes, bool)
            or not isinstance(num_classes, int)
            or not 1 <= num_classes <= MAX_CLASSES
        ):
            raise ArgumentError(
                f"{name}: num_classes must be a positive int at most {MAX_CLASSES:,} or None, "
                f"not {num_classes!r}"
            )
        if mode not in _MODES:
            raise ValueError(f"mode must be 'batch' or 'elem', not {mode!r}")
        self.alpha = alpha
        self.num_classes = num_classes
        self.mode = mode

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}, num_classes={self.num_classes}, mode={self.mode!r}"

    def _check(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        name = type(self).__name__
        if not isinstance(images, torch.Tensor) or images.ndim != 4:
            shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images)
            raise ValueError(f"{name}: images must be a batch [B, C, H, W], not {shape}")
        if images.dtype != torch.uint8 and not images.dtype.is_floating_point:
            raise ValueError(f"{name}: images must be uint8 or floating, not {images.dtype}")
        if images.shape[0] and not (images.shape[2] and images.shape[3]):
            raise ArgumentError(f"{name}: images {zero_size(images)}")
        if not isinstance(labels, torch.Tensor):
            raise ValueError(f"{name}: labels must be a tensor, not {type(labels).__name__}")
        if labels.ndim == 1:
            if labels.dtype.is_floating_point or labels.dtype == torch.bool:
                raise ValueError(
                    f"{name}: 1-D labels must be integer class indices, not {labels.dtype}"
                )
            if self.num_classes is None:
                raise ValueError(
                    f"{name}: class-index labels need num_classes= (the number of classes)"
                )
            # Checked where it costs nothing: on the device it would make the host wait.
            if labels.device.type == "cpu" and labels.numel():
                lo, hi = int(labels.min()), int(labels.max())
                if lo < 0 or hi >= self.num_classes:
                    raise ValueError(
                        f"{name}: labels must lie in [0, {self.num_classes}), "
                        f"not {lo if lo < 0 else hi}"
                    )
        elif labels.ndim == 2:
            if not labels.dtype.is_floating_point:
                raise ValueError(f"{name}: 2-D labels must be floating, not {labels.dtype}")
            if self.num_classes is not None and labels.shape[1] != self.num_classes:
                raise ValueError(
                    f"{name}: soft labels have {labels.shape[1]} classes, "
                    f"num_classes is {self.num_classes}"
                )
        else:
            raise ValueError(
                f"{name}: labels must be class indices [B] or soft labels [B, num_classes], "
                f"not of shape {tuple(labels.shape)}"
            )
        if labels.shape[0] != images.shape[0]:
            raise ValueError(
                f"{name}: {labels.shape[0]} labels for a batch of {images.shape[0]} images"
            )

    def _soft(self, labels: torch.Tensor) -> torch.Tensor:
        """Labels as floating [B, K]: one-hot float32 for class indices."""
        if labels.ndim == 2:
            return labels
        # scatter_, not one_hot: one_hot checks the range on the device, which waits for it.
        out = torch.zeros((labels.shape[0], self.num_classes), device=labels.device)
        return out.scatter_(1, labels[:, None].long(), 1.0)

    @staticmethod
    def _mix_labels(soft: torch.Tensor, lam: float | torch.Tensor) -> torch.Tensor:
        # torchvision's order of operations, so batch mode gives its values bit for bit.
        return soft.roll(1, 0).mul_(1.0 - lam).add_(soft.mul(lam))


def _mix_kernels(x: torch.Tensor):  # -> the aug_triton module or None
    """The Triton kernels for a contiguous float32 CUDA batch, when Triton imports."""
    if not x.is_cuda or x.dtype != torch.float32 or not x.is_contiguous():
        return None
    try:
        from . import aug_triton
    except ImportError:
        return None
    return aug_triton


class MixUp(_Mixer):
    """``lam * x[i] + (1 - lam) * x[i - 1]`` for images and labels, lam ~ Beta(alpha, alpha).

    ``mode="batch"`` (torchvision's): one lam per batch; ``"elem"``: one per image.
    uint8 images are mixed in float32 and rounded (half to even) back to uint8.
    """

    def __init__(
        self, alpha: float = 1.0, num_classes: int | None = None, *, mode: str = "batch"
    ) -> None:
        super().__init__(alpha, num_classes, mode)

    def sample(self, batch: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """The mixing weights, float32 on the CPU: [1] in batch mode, [batch] in elem mode."""
        return sample_beta(self.alpha, 1 if self.mode == "batch" else batch, generator)

    def _lam(self, generator: torch.Generator | None) -> float:
        """Batch mode's weight: ``float(self.sample(b, generator)[0])``, the same draw."""
        return _beta_one(self.alpha, generator)

    def forward(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self._check(images, labels)
        b = images.shape[0]
        x = images.float() if images.dtype == torch.uint8 else images
        soft = self._soft(labels)
        if self.mode == "batch":
            lam_img = lam_lab = self._lam(generator)
        else:
            lam_cpu = self.sample(b, generator)
            lam_dev = send(lam_cpu, images.device)
            lam_img = lam_dev.to(x.dtype)[:, None, None, None]
            if soft.device != images.device:
                lam_dev = send(lam_cpu, soft.device)
            lam_lab = lam_dev.to(soft.dtype)[:, None]
        kernels = _mix_kernels(x) if self.mode == "batch" else None
        if kernels is not None:  # one pass instead of four, the same bits
            out = kernels.mixup(x, lam_img)
        else:
            out = x.roll(1, 0).mul_(1.0 - lam_img).add_(x.mul(lam_img))
        if images.dtype == torch.uint8:
            out = out.round_().to(torch.uint8)
        return out, self._mix_labels(soft, lam_lab)


class CutMix(_Mixer):
    """Paste a box of ``x[i - 1]`` into ``x[i]``; labels weighted by the areas.

    As torchvision's v2 CutMix: lam ~ Beta(alpha, alpha), box centre uniform over
    the pixels, half sides ``int(0.5 * sqrt(1 - lam) * W)`` (and H), clamped to the
    image; the labels use ``1 - box area / image area``. ``mode="batch"``: one box
    for the batch; ``"elem"``: one per image. Pixels are copied, never blended, so
    uint8 stays exact.
    """

    def __init__(
        self, alpha: float = 1.0, num_classes: int | None = None, *, mode: str = "batch"
    ) -> None:
        super().__init__(alpha, num_classes, mode)

    def sample(
        self, batch: int, height: int, width: int, generator: torch.Generator | None = None
    ) -> CutMixDraw:
        """The boxes for a batch of ``height`` x ``width`` images (:class:`CutMixDraw`)."""
        count(height, "height", "CutMix.sample", 1, 1 << 31)
        count(width, "width", "CutMix.sample", 1, 1 << 31)
        if self.mode == "batch":
            lam, lam_adj, box = self._batch_draw(height, width, generator)
            return CutMixDraw(
                torch.tensor([lam], dtype=torch.float32),
                torch.tensor([box], dtype=torch.int64),
                torch.tensor([lam_adj], dtype=torch.float64),
            )
        lam = sample_beta(self.alpha, batch, generator)
        # One draw for all centres, as floor(u * size).
        u = torch.rand(batch, 2, generator=generator, dtype=torch.float64).numpy()
        cx = np.minimum(np.floor(u[:, 0] * width), width - 1).astype(np.int64)
        cy = np.minimum(np.floor(u[:, 1] * height), height - 1).astype(np.int64)
        r = 0.5 * np.sqrt(1.0 - lam.numpy().astype(np.float64))
        rw = (r * width).astype(np.int64)  # int(): truncation, as torchvision
        rh = (r * height).astype(np.int64)
        boxes = np.stack(
            [
                np.maximum(cx - rw, 0),
                np.maximum(cy - rh, 0),
                np.minimum(cx + rw, width),
                np.minimum(cy + rh, height),
            ],
            1,
        )
        area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
        lam_adj = 1.0 - area / (width * height)
        return CutMixDraw(lam, torch.from_numpy(boxes), torch.from_numpy(lam_adj))

    def _batch_draw(
        self, height: int, width: int, generator: torch.Generator | None
    ) -> tuple[float, float, tuple[int, int, int, int]]:
        """Batch mode's (lam, lam_adjusted, (x1, y1, x2, y2)) in Python numbers, with
        torchvision's draws and arithmetic: lam, then ``randint(W)``, ``randint(H)``."""
        lam = _beta_one(self.alpha, generator)
        cx = int(torch.randint(width, (1,), generator=generator))
        cy = int(torch.randint(height, (1,), generator=generator))
        r = 0.5 * math.sqrt(1.0 - lam)
        rw, rh = int(r * width), int(r * height)
        x1, y1 = max(cx - rw, 0), max(cy - rh, 0)
        x2, y2 = min(cx + rw, width), min(cy + rh, height)
        return lam, 1.0 - (x2 - x1) * (y2 - y1) / (width * height), (x1, y1, x2, y2)

    def forward(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self._check(images, labels)
        b, _, h, w = images.shape
        soft = self._soft(labels)
        if self.mode == "batch":
            _, lam_adj, (x1, y1, x2, y2) = self._batch_draw(h, w, generator)
            out = images.clone()
            out[..., y1:y2, x1:x2] = images[..., y1:y2, x1:x2].roll(1, 0)
            return out, self._mix_labels(soft, lam_adj)
        draw = self.sample(b, h, w, generator)
        # One transfer: the boxes and the label weights, as float64 (exact for ints).
        params = torch.cat([draw.boxes.double(), draw.lam_adjusted[:, None]], 1)
        params = send(params, images.device)
        box = params[:, :4].long()
        dev = images.device
        ys = torch.arange(h, device=dev)
        xs = torch.arange(w, device=dev)
        inside = ((ys >= box[:, 1, None]) & (ys < box[:, 3, None]))[:, None, :, None] & (
            (xs >= box[:, 0, None]) & (xs < box[:, 2, None])
        )[:, None, None, :]
        out = torch.where(inside, images.roll(1, 0), images)
        lam = params[:, 4:] if soft.device == dev else send(draw.lam_adjusted[:, None], soft.device)
        return out, self._mix_labels(soft, lam.to(soft.dtype))


class RandomChoice(nn.Module):
    """One of ``transforms`` (mixers) per batch, picked with probabilities ``p``.

    As torchvision's v2 RandomChoice: ``p`` (default uniform) is normalized to sum
    to 1, and the pick follows it (one uniform from ``generator`` against the
    cumulative ``p``, where torchvision calls ``multinomial``, some twenty times the
    host's time), after which the chosen mixer draws its own numbers. The reference recipe's
    ``RandomChoice([MixUp(0.2, K), CutMix(1.0, K)])`` mixes each batch one way.
    """

    accepts_generator = True
    mixes_labels = True

    def __init__(self, transforms: Sequence[nn.Module], p: Sequence[float] | None = None) -> None:
        super().__init__()
        transforms = list(transforms)
        if not transforms:
            raise ValueError("RandomChoice needs at least one transform")
        for t in transforms:
            if not getattr(t, "mixes_labels", False):
                raise ValueError(
                    f"RandomChoice takes mixers (MixUp, CutMix: called with images and labels), "
                    f"not {t!r}; put other transforms in a Compose before it"
                )
        if p is None:
            p = [1.0] * len(transforms)
        p = [float(x) for x in p]
        if len(p) != len(transforms):
            raise ValueError(f"p has {len(p)} probabilities for {len(transforms)} transforms")
        if any(not (x >= 0 and math.isfinite(x)) for x in p) or not 0 < sum(p) < math.inf:
            raise ValueError(f"p must be non-negative with a positive sum, not {p!r}")
        total = sum(p)
        self.transforms = nn.ModuleList(
            t if isinstance(t, nn.Module) else _Plain(t) for t in transforms
        )
        self.p = [x / total for x in p]
        # The pick is the first index whose cumulative p exceeds the uniform; the last
        # positive one takes the rest (where the sum rounds below 1), and indices of
        # zero probability are never picked.
        last = max(i for i, x in enumerate(self.p) if x > 0)
        self._cum = list(itertools.accumulate(self.p))[:last] + [math.inf] * (len(p) - last)

    def extra_repr(self) -> str:
        return f"p={self.p}"

    def sample(self, generator: torch.Generator | None = None) -> int:
        """The index of the transform to apply to the next batch."""
        return bisect.bisect_right(self._cum, uniform(generator))

    def forward(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        t = self.transforms[self.sample(generator)]
        if getattr(t, "accepts_generator", False):
            return t(images, labels, generator=generator)
        return t(images, labels)


class _Plain(nn.Module):
    """A plain callable mixer inside RandomChoice (ModuleList holds modules only)."""

    def __init__(self, fn: object) -> None:
        super().__init__()
        self.fn = fn
        self.accepts_generator = getattr(fn, "accepts_generator", False)
        self.mixes_labels = True

    def forward(self, *args: object, **kw: object) -> object:
        return self.fn(*args, **kw)
