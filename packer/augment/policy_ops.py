"""The automatic augmentation policies' op spaces and draws, on the CPU.

torchvision's v2 op spaces (``torchvision.transforms.v2._auto_augment``): per op name,
its magnitudes over the bins and whether it takes a random sign
(:func:`magnitude_table`); AutoAugment's sub-policies; and the draws a policy's
``sample`` returns (:class:`PolicyDraw`, :class:`AugMixDraw`, made by
:func:`signed_draw`). Used by :mod:`packer.augment.policies` and
:mod:`packer.augment.augmix`; :mod:`packer.augment.policy_apply` runs the draws.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

# ---------------------------------------------------------------- op spaces

# Per op name, (magnitudes, signed), the magnitudes over the bins being: ("lin", a, b)
# torchvision's linspace(a, b); ("posterize", top, k) its (top - arange / ((bins - 1)
# / k)).round(); ("width" or "height", f) linspace(0, f * side); None: no magnitude.
_LIN = "lin"


def _lin(a: float, b: float) -> tuple[str, float, float]:
    return (_LIN, a, b)


TA_SPACE = {
    "Identity": (None, False),
    "ShearX": (_lin(0.0, 0.99), True),
    "ShearY": (_lin(0.0, 0.99), True),
    "TranslateX": (_lin(0.0, 32.0), True),
    "TranslateY": (_lin(0.0, 32.0), True),
    "Rotate": (_lin(0.0, 135.0), True),
    "Brightness": (_lin(0.0, 0.99), True),
    "Color": (_lin(0.0, 0.99), True),
    "Contrast": (_lin(0.0, 0.99), True),
    "Sharpness": (_lin(0.0, 0.99), True),
    "Posterize": (("posterize", 8, 6), False),
    "Solarize": (_lin(1.0, 0.0), False),
    "AutoContrast": (None, False),
    "Equalize": (None, False),
}

# AutoAugment's and RandAugment's (RandAugment adds Identity first, AutoAugment Invert).
_AA_SPACE = {
    "ShearX": (_lin(0.0, 0.3), True),
    "ShearY": (_lin(0.0, 0.3), True),
    "TranslateX": (("width", 150.0 / 331.0), True),
    "TranslateY": (("height", 150.0 / 331.0), True),
    "Rotate": (_lin(0.0, 30.0), True),
    "Brightness": (_lin(0.0, 0.9), True),
    "Color": (_lin(0.0, 0.9), True),
    "Contrast": (_lin(0.0, 0.9), True),
    "Sharpness": (_lin(0.0, 0.9), True),
    "Posterize": (("posterize", 8, 4), False),
    "Solarize": (_lin(1.0, 0.0), False),
    "AutoContrast": (None, False),
    "Equalize": (None, False),
}
RA_SPACE = {"Identity": (None, False), **_AA_SPACE}
AA_FULL_SPACE = {**_AA_SPACE, "Invert": (None, False)}

AUGMIX_PARTIAL = {
    "ShearX": (_lin(0.0, 0.3), True),
    "ShearY": (_lin(0.0, 0.3), True),
    "TranslateX": (("width", 1.0 / 3.0), True),
    "TranslateY": (("height", 1.0 / 3.0), True),
    "Rotate": (_lin(0.0, 30.0), True),
    "Posterize": (("posterize", 4, 4), False),
    "Solarize": (_lin(1.0, 0.0), False),
    "AutoContrast": (None, False),
    "Equalize": (None, False),
}
AUGMIX_ALL = {
    **AUGMIX_PARTIAL,
    "Brightness": (_lin(0.0, 0.9), True),
    "Color": (_lin(0.0, 0.9), True),
    "Contrast": (_lin(0.0, 0.9), True),
    "Sharpness": (_lin(0.0, 0.9), True),
}

# AutoAugment's sub-policies: ((op, probability, magnitude bin of 10), (...)).
AA_POLICIES = {
    "imagenet": (
        (("Posterize", 0.4, 8), ("Rotate", 0.6, 9)),
        (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
        (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
        (("Posterize", 0.6, 7), ("Posterize", 0.6, 6)),
        (("Equalize", 0.4, None), ("Solarize", 0.2, 4)),
        (("Equalize", 0.4, None), ("Rotate", 0.8, 8)),
        (("Solarize", 0.6, 3), ("Equalize", 0.6, None)),
        (("Posterize", 0.8, 5), ("Equalize", 1.0, None)),
        (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)),
        (("Equalize", 0.6, None), ("Posterize", 0.4, 6)),
        (("Rotate", 0.8, 8), ("Color", 0.4, 0)),
        (("Rotate", 0.4, 9), ("Equalize", 0.6, None)),
        (("Equalize", 0.0, None), ("Equalize", 0.8, None)),
        (("Invert", 0.6, None), ("Equalize", 1.0, None)),
        (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
        (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
        (("Color", 0.8, 8), ("Solarize", 0.8, 7)),
        (("Sharpness", 0.4, 7), ("Invert", 0.6, None)),
        (("ShearX", 0.6, 5), ("Equalize", 1.0, None)),
        (("Color", 0.4, 0), ("Equalize", 0.6, None)),
        (("Equalize", 0.4, None), ("Solarize", 0.2, 4)),
        (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
        (("Invert", 0.6, None), ("Equalize", 1.0, None)),
        (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
        (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
    ),
    "cifar10": (
        (("Invert", 0.1, None), ("Contrast", 0.2, 6)),
        (("Rotate", 0.7, 2), ("TranslateX", 0.3, 9)),
        (("Sharpness", 0.8, 1), ("Sharpness", 0.9, 3)),
        (("ShearY", 0.5, 8), ("TranslateY", 0.7, 9)),
        (("AutoContrast", 0.5, None), ("Equalize", 0.9, None)),
        (("ShearY", 0.2, 7), ("Posterize", 0.3, 7)),
        (("Color", 0.4, 3), ("Brightness", 0.6, 7)),
        (("Sharpness", 0.3, 9), ("Brightness", 0.7, 9)),
        (("Equalize", 0.6, None), ("Equalize", 0.5, None)),
        (("Contrast", 0.6, 7), ("Sharpness", 0.6, 5)),
        (("Color", 0.7, 7), ("TranslateX", 0.5, 8)),
        (("Equalize", 0.3, None), ("AutoContrast", 0.4, None)),
        (("TranslateY", 0.4, 3), ("Sharpness", 0.2, 6)),
        (("Brightness", 0.9, 6), ("Color", 0.2, 8)),
        (("Solarize", 0.5, 2), ("Invert", 0.0, None)),
        (("Equalize", 0.2, None), ("AutoContrast", 0.6, None)),
        (("Equalize", 0.2, None), ("Equalize", 0.6, None)),
        (("Color", 0.9, 9), ("Equalize", 0.6, None)),
        (("AutoContrast", 0.8, None), ("Solarize", 0.2, 8)),
        (("Brightness", 0.1, 3), ("Color", 0.7, 0)),
        (("Solarize", 0.4, 5), ("AutoContrast", 0.9, None)),
        (("TranslateY", 0.9, 9), ("TranslateY", 0.7, 9)),
        (("AutoContrast", 0.9, None), ("Solarize", 0.8, 3)),
        (("Equalize", 0.8, None), ("Invert", 0.1, None)),
        (("TranslateY", 0.7, 9), ("AutoContrast", 0.9, None)),
    ),
    "svhn": (
        (("ShearX", 0.9, 4), ("Invert", 0.2, None)),
        (("ShearY", 0.9, 8), ("Invert", 0.7, None)),
        (("Equalize", 0.6, None), ("Solarize", 0.6, 6)),
        (("Invert", 0.9, None), ("Equalize", 0.6, None)),
        (("Equalize", 0.6, None), ("Rotate", 0.9, 3)),
        (("ShearX", 0.9, 4), ("AutoContrast", 0.8, None)),
        (("ShearY", 0.9, 8), ("Invert", 0.4, None)),
        (("ShearY", 0.9, 5), ("Solarize", 0.2, 6)),
        (("Invert", 0.9, None), ("AutoContrast", 0.8, None)),
        (("Equalize", 0.6, None), ("Rotate", 0.9, 3)),
        (("ShearX", 0.9, 4), ("Solarize", 0.3, 3)),
        (("ShearY", 0.8, 8), ("Invert", 0.7, None)),
        (("Equalize", 0.9, None), ("TranslateY", 0.6, 6)),
        (("Invert", 0.9, None), ("Equalize", 0.6, None)),
        (("Contrast", 0.3, 3), ("Rotate", 0.8, 4)),
        (("Invert", 0.8, None), ("TranslateY", 0.0, 2)),
        (("ShearY", 0.7, 6), ("Solarize", 0.4, 8)),
        (("Invert", 0.6, None), ("Rotate", 0.8, 4)),
        (("ShearY", 0.3, 7), ("TranslateX", 0.9, 3)),
        (("ShearX", 0.1, 6), ("Invert", 0.6, None)),
        (("Solarize", 0.7, 2), ("TranslateY", 0.6, 7)),
        (("ShearY", 0.8, 4), ("Invert", 0.8, None)),
        (("ShearX", 0.7, 9), ("TranslateY", 0.8, 3)),
        (("ShearY", 0.8, 5), ("AutoContrast", 0.7, None)),
        (("ShearX", 0.7, 2), ("Invert", 0.1, None)),
    ),
}


def magnitude_table(space: dict, num_bins: int, height: int, width: int) -> np.ndarray:
    """float64 [len(space), num_bins]: each op's magnitudes, torchvision's float32
    values (0 for the ops without one)."""
    rows = []
    for spec, _ in space.values():
        if spec is None:
            rows.append(torch.zeros(num_bins))
        elif spec[0] == _LIN:
            rows.append(torch.linspace(spec[1], spec[2], num_bins))
        elif spec[0] == "posterize":
            top, k = spec[1], spec[2]
            rows.append((top - (torch.arange(num_bins) / ((num_bins - 1) / k))).round().int())
        else:  # a translate: a fraction of the width or height
            side = width if spec[0] == "width" else height
            rows.append(torch.linspace(0.0, spec[1] * side, num_bins))
    return torch.stack([r.to(torch.float32) for r in rows]).double().numpy()


# ---------------------------------------------------------------- draws


class PolicyDraw(NamedTuple):
    """The ops drawn for a batch, on the CPU; ``S`` ops per image, applied in order.

    ``op``: int64 [B, S], the index in the policy's ``ops`` (-1: none, for
    AutoAugment's sub-op that its probability skipped and AugMix's steps past a
    chain's depth); ``magnitude``: float64 [B, S], signed, the value torchvision
    passes to the op (0 for ops without one); ``sign``: float64 [B, S], -1 or 1
    (1 for unsigned ops); ``bin``: int64 [B, S], the magnitude bin.
    """

    op: torch.Tensor
    magnitude: torch.Tensor
    sign: torch.Tensor
    bin: torch.Tensor


class AugMixDraw(NamedTuple):
    """AugMix's draws for a batch of B images with ``W`` chains of up to ``D`` ops.

    ``chains``: a :class:`PolicyDraw` with tensors [B, W * D] (chain ``i``'s step
    ``j`` at column ``i * D + j``; op -1 past the chain's depth); ``depth``: int64
    [B, W]; ``weights``: float32 [B, 1 + W]: the original image's weight ``m``
    (Beta(alpha, alpha)), then each chain's (Dirichlet(alpha) times ``1 - m``).
    """

    chains: PolicyDraw
    depth: torch.Tensor
    weights: torch.Tensor


def signed_draw(
    table: np.ndarray, op: np.ndarray, bins: np.ndarray, negative: np.ndarray
) -> PolicyDraw:
    """The draw of ops ``op`` (int, -1 = none) at ``bins`` with their signs (``negative``:
    bool, True only for signed ops), magnitudes from ``table`` [ops, bins]."""
    sign = np.where(negative, -1.0, 1.0)
    mag = np.where(op >= 0, table[np.maximum(op, 0), bins], 0.0) * sign
    return PolicyDraw(
        torch.from_numpy(op.astype(np.int64, copy=False)),
        torch.from_numpy(mag + 0.0),  # + 0.0: no -0.0
        torch.from_numpy(sign),
        torch.from_numpy(bins.astype(np.int64, copy=False)),
    )


def randint(u: np.ndarray, n: int) -> np.ndarray:
    """Uniform integers in [0, n) from uniform floats in [0, 1): numpy's and torch's
    float64 uniforms are at most 1 - 2**-53, so ``u * n`` rounds below n for any n
    up to 2**53 and needs no clamp. (numpy's ``integers`` costs several times more.)"""
    u = u * n
    return u.astype(np.int64)
