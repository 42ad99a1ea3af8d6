"""The modern training recipe as a handful of kernels: :class:`~packer.transforms.Compose`'s
fast path on CUDA.

A Compose holding, in a row, some of

* ``RandomResizedCrop`` + ``RandomHorizontalFlip`` (one resample, as today),
* a policy (``TrivialAugmentWide``, ``RandAugment``, ``AutoAugment``; not AugMix),
* ``Normalize`` (float32 out), optionally then ``RandomErasing`` (a numeric value)
  and a batch mixer (``MixUp`` / ``CutMix`` in batch mode, or a ``RandomChoice`` of
  them) with class-index labels on the images' device,

runs them here on a CUDA batch: every op draws its parameters from the generator in
the order and with the calls of the ops run one by one (the same draws), all of the
batch's parameters go to the device in one copy, and the device work is the crop's
kernel, two launches per policy stage and one pass that normalizes, erases and mixes
(and writes the mixed one-hot labels): 4 launches for the reference recipe instead of
about 20, and the float32 batch written once instead of read and written four times.
The pixels are the separate ops' (the crop, the policy's and the erasing kernels are
the same; the tail rounds as ``addcmul``, the erasing and MixUp's kernel do).

Anything else (other ops, a CPU batch, no Triton, AugMix, ``value="random"``, soft
or CPU labels, elem-mode mixers) runs op by op as before: a Compose checks before it
draws anything, so both ways draw the same numbers. ``ENABLED = False`` turns the
fast path off (the benchmark's old path).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..imaging.normalize import Normalize
from ..imaging.resize import taps, triton_kernels
from .augmix import AugMix
from .erasing import RandomErasing
from .mixing import CutMix, MixUp, RandomChoice
from .params import send
from .policies import Policy
from .policy_apply import NCOL, fused_backend, fused_fill
from .transforms import RandomHorizontalFlip, RandomResizedCrop

ENABLED = True
# Where the kernels may run: "cuda", or "any" (CPU tensors too, under TRITON_INTERPRET=1:
# the tests).
DEVICES = "cuda"


class Plan:
    """A run of the recipe's ops inside a Compose, starting at ``mods[start]``.

    ``end``: the index after the run. Built by :func:`match`; :meth:`applies` says
    whether a batch can take the fast path (checked before anything is drawn).
    """

    def __init__(self, mods: Sequence[Any], start: int) -> None:
        i = start
        self.crop: RandomResizedCrop | None = None
        self.flip: RandomHorizontalFlip | None = None
        self.policy: Policy | None = None
        self.norm: Normalize | None = None
        self.erase: RandomErasing | None = None
        self.mixer: Any = None
        n = len(mods)
        if (
            i + 1 < n
            and type(mods[i]) is RandomResizedCrop
            and type(mods[i + 1]) is RandomHorizontalFlip
        ):
            self.crop, self.flip = mods[i], mods[i + 1]
            i += 2
        if i < n and isinstance(mods[i], Policy) and not isinstance(mods[i], AugMix):
            self.policy = mods[i]
            i += 1
        if i < n and type(mods[i]) is Normalize and mods[i].dtype == torch.float32:
            self.norm = mods[i]
            i += 1
            if i < n and type(mods[i]) is RandomErasing and mods[i].value != "random":
                self.erase = mods[i]
                i += 1
            if i < n and _is_mixer(mods[i]):
                self.mixer = mods[i]
                i += 1
        self.end = i
        parts = (self.crop, self.policy, self.norm)
        # Worth it where the run holds more than the crop alone (already one launch).
        self.useful = sum(p is not None for p in parts) >= 2 or self.norm is not None

    def applies(self, images: torch.Tensor, labels: torch.Tensor | None) -> bool:
        if not isinstance(images, torch.Tensor) or images.ndim != 4:
            return False
        if DEVICES == "cuda" and not images.is_cuda:
            return False
        if images.dtype != torch.uint8 or not images.is_contiguous() or images.shape[0] == 0:
            return False
        b, c, h, w = images.shape
        if c not in (1, 3):
            return False
        if self.crop is not None:
            kernels = triton_kernels()
            oh, ow = self.crop.size
            if kernels is None or not kernels.fits((h / oh, w / ow), self.crop.interpolation):
                return False
            h, w = oh, ow
        if self.policy is not None and (
            fused_backend(images) is None or isinstance(self.policy.fill, torch.Tensor)
        ):
            return False
        if self.norm is not None:
            if self.norm.shift.numel() not in (1, c) or _aug_triton() is None:
                return False
            if self.erase is not None:
                v = self.erase.value
                if isinstance(v, tuple) and len(v) not in (1, c):
                    return False
        if self.mixer is not None:
            ok = (
                isinstance(labels, torch.Tensor)
                and labels.ndim == 1
                and labels.shape[0] == b
                and not labels.dtype.is_floating_point
                and labels.dtype != torch.bool
                and labels.device == images.device
            )
            if not ok:
                return False
        return True

    def run(
        self,
        images: torch.Tensor,
        labels: torch.Tensor | None,
        generator: torch.Generator | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The run's ops on ``images`` (and ``labels``, mixed when a mixer is part of it)."""
        b, c, h, w = images.shape
        dev = images.device
        blocks: list[np.ndarray] = []  # 4-byte words, each block 16-byte aligned
        # Draws, in the ops' order.
        if self.crop is not None:
            crop = np.empty((b, 5), dtype=np.int32)
            self.crop._draw(b, h, w, generator, crop)
            crop[:, 4] = torch.rand(b, generator=generator).numpy() < self.flip.p
            oh, ow = self.crop.size
            scale = (int(crop[:, 2].max()) / oh, int(crop[:, 3].max()) / ow)
            blocks.append(crop.ravel())
            h, w = oh, ow
        if self.policy is not None:
            table, live, lut = _policy_table(self.policy, b, c, h, w, generator)
            fill, round_nearest = fused_fill(self.policy.fill, c, self.policy.interpolation)
            blocks.append(table.ravel().view(np.int32))
            if fill is not None:
                blocks.append(fill.view(np.int32))
        if self.norm is not None:
            head = np.zeros(8, dtype=np.int32)  # aug_triton.TAIL_HEAD words
            a = cc = 0.0
            if self.erase is not None:
                boxes = self.erase.sample(b, h, w, generator).boxes
                blocks.append(np.concatenate([head, boxes.numpy().astype(np.int32).ravel()]))
            else:
                blocks.append(head)
            if self.mixer is not None:
                a, cc, head[:5] = _mix_draw(self.mixer, b, h, w, generator)
                if self.erase is not None:
                    blocks[-1][:8] = head
            blocks.append(_norm_words(self.norm, self.erase, c))
        # One copy of all of it.
        offs, total = [], 0
        for blk in blocks:
            offs.append(total)
            total += -(-blk.size // 4) * 4
        words = np.zeros(total, dtype=np.int32)
        for o, blk in zip(offs, blocks, strict=True):
            words[o : o + blk.size] = blk
        params = send(torch.from_numpy(words), dev)
        floats = params.view(torch.float32)
        k = 0
        x = images
        if self.crop is not None:
            box = params[offs[k] : offs[k] + 5 * b].view(b, 5)
            k += 1
            mode, aa = self.crop.interpolation, self.crop.antialias
            ky, kx = taps(scale[0], mode, aa), taps(scale[1], mode, aa)
            x = triton_kernels().resample(x, box, oh, ow, ky, kx, scale, mode, aa)
        if self.policy is not None:
            s = table.shape[0]
            tab = floats[offs[k] : offs[k] + table.size].view(s, b, table.shape[2])
            k += 1
            fill_dev = None
            if fill is not None:
                fill_dev = floats[offs[k] : offs[k] + c]
                k += 1
            kernels = _aug_triton()
            bilinear = self.policy.interpolation == "bilinear"
            for st in range(s):
                if live[st]:
                    x = kernels.apply_stage(x, tab[st], fill_dev, bilinear, round_nearest, bool(lut[st]))  # fmt: skip
            if x is images and self.norm is None:  # a new tensor, as the policy returns
                x = images.clone()
        if self.norm is None:
            return x, labels
        prm = params[offs[k] : offs[k] + blocks[k].size]
        norm = floats[offs[k + 1] : offs[k + 1] + 3 * c]
        mixing = self.mixer is not None
        out, soft = _aug_triton().tail(
            x,
            prm,
            norm,
            self.erase is not None,
            labels if mixing else None,
            _num_classes(self.mixer) if mixing else 0,
            a,
            cc,
        )
        return out, (soft if mixing else labels)


def _is_mixer(t: Any) -> bool:
    if type(t) in (MixUp, CutMix):
        return t.mode == "batch" and t.num_classes is not None
    if type(t) is RandomChoice:
        if not all(_is_mixer(m) for m in t.transforms):
            return False
        return len({_num_classes(m) for m in t.transforms}) == 1
    return False


def _num_classes(t: Any) -> int:
    return t.num_classes if type(t) is not RandomChoice else t.transforms[0].num_classes


def _mix_draw(
    mixer: Any, b: int, h: int, w: int, generator: torch.Generator | None
) -> tuple[float, float, np.ndarray]:
    """The mixer's draws as the modules make them: (weight of the previous image,
    weight of the image, [mode, x1, y1, x2, y2]), the weights rounded to float32
    as torch rounds a Python scalar against a float32 tensor."""
    if type(mixer) is RandomChoice:
        mixer = mixer.transforms[mixer.sample(generator)]
    if type(mixer) is MixUp:
        lam = mixer._lam(generator)
        return float(np.float32(1.0 - lam)), float(np.float32(lam)), np.array([1, 0, 0, 0, 0])
    _, lam, box = mixer._batch_draw(h, w, generator)
    return float(np.float32(1.0 - lam)), float(np.float32(lam)), np.array([2, *box])


def _policy_table(
    policy: Policy, b: int, c: int, h: int, w: int, generator: torch.Generator | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The policy's draw (its ``sample``'s) as its fused kernels' table, float32
    [S, B, 12], and per stage whether any image changes and whether any needs a
    lookup table."""
    index = policy._row_index(b, generator)
    table = policy._rows(h, w, c).reshape(-1, NCOL).take(index.T, 0)
    kind = table[..., 0]  # 0: no op, 1: a lookup table, 2-4: other kinds
    return table, np.maximum.reduce(kind, 1) > 0, np.logical_or.reduce(kind == 1, 1)


_NORM_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _norm_words(norm: Normalize, erase: RandomErasing | None, c: int) -> np.ndarray:
    """float32 [3 C] as int32 words: the scales of uint8 values, the shifts, the
    erased value per channel (as RandomErasing converts it for float32 images);
    from the module's host copies, so nothing reads the device."""
    value = 0.0 if erase is None else erase.value
    per = _NORM_CACHE.setdefault(norm, {})
    words = per.get((value, c))
    if words is None:
        s, t = norm.host_scale_u8, norm.host_shift
        vals = (value,) * c if isinstance(value, float) else tuple(value) * (c // len(value))
        out = np.empty(3 * c, dtype=np.float32)
        out[:c] = s if s.size == c else s[0]
        out[c : 2 * c] = t if t.size == c else t[0]
        out[2 * c :] = np.asarray(vals, dtype=np.float32)
        words = per[(value, c)] = out.view(np.int32)
    return words


def _aug_triton():  # -> the aug_triton module or None
    try:
        from . import aug_triton
    except ImportError:
        return None
    return aug_triton


def match(mods: Sequence[Any], start: int) -> Plan | None:
    """The recipe run starting at ``mods[start]`` worth fusing, or None."""
    if not ENABLED:
        return None
    plan = Plan(mods, start)
    return plan if plan.end > start and plan.useful else None
