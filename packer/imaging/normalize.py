"""Images to normalized floats on the device: :class:`Normalize` and ImageNet's statistics."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class Normalize(nn.Module):
    """Images to normalized floats, for the front of a model.

    Input: Tensor[B, 3, H, W], uint8 in [0, 255] (scaled by 1/255 first) or
    float in [0, 1]. Output: ``(x - mean) / std`` per channel, in ``dtype``
    (default float32), same device and memory format. ``mean`` and ``std``
    are in [0, 1] units (torchvision convention); defaults: ImageNet's.
    One fused multiply-add on the device.
    """

    def __init__(
        self,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        m = torch.as_tensor(mean, dtype=torch.float64).reshape(1, -1, 1, 1)
        s = torch.as_tensor(std, dtype=torch.float64).reshape(1, -1, 1, 1)
        if m.numel() != s.numel() or bool((s <= 0).any()):
            raise ValueError("mean and std need the same length and std > 0")
        self.dtype = dtype
        self.register_buffer("scale_u8", (1 / (255 * s)).float(), persistent=False)
        self.register_buffer("scale_f", (1 / s).float(), persistent=False)
        self.register_buffer("shift", (-m / s).float(), persistent=False)
        # Host copies, for fused kernels that take them with their other parameters.
        self.host_scale_u8 = self.scale_u8.numpy().ravel().copy()
        self.host_shift = self.shift.numpy().ravel().copy()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.scale_u8 if x.dtype == torch.uint8 else self.scale_f
        y = torch.addcmul(self.shift, x.to(torch.float32), scale)
        return y if self.dtype == torch.float32 else y.to(self.dtype)
