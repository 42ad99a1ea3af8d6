"""RandomResizedCrop fused with the JPEG decode: only each crop box is decoded.

    crop = RoiResizedCrop(get_decoder("cuda"), 224)
    batch = crop(datas, sizes, generator)   # uint8 [B, 3, 224, 224] on the decoder's device

1. Boxes are drawn on the host from the stored sizes, with torchvision's box distribution
   unchanged (:meth:`packer.transforms.RandomResizedCrop.sample_boxes`), then the flips
   (:meth:`RandomHorizontalFlip.sample`): the same draws, in the same order, as the
   JPEG-pack loader's crop (:class:`packer.loading.crop.JpegCrop`).
2. The decoder decodes only the boxes (:meth:`JpegDecoder.decode_rois`), where it can.
3. The crops are resized in one batched call (:func:`packer.imaging.jpeg.resize_images`,
   each box the whole crop), the flip folded in.

A decoder without ROI (or whose ROI does not work on this version) decodes whole and the
same boxes are resized from the whole images: the same pixels, within 1/255 mean.
``path`` says which way ran: "roi", "roi (no fancy upsampling)" or "full+crop".
"""

from __future__ import annotations

import numpy as np
import torch

from ..augment.transforms import RandomHorizontalFlip, RandomResizedCrop
from ..imaging.decoders import JpegDecoder
from ..imaging.jpeg import resize_images
from ..imaging.resize import Size


class RoiResizedCrop:
    """Decode + RandomResizedCrop(``size``, ``scale``, ``ratio``) + horizontal flip with
    probability ``flip_p`` (0: none), for a batch of JPEG files."""

    def __init__(
        self,
        decoder: JpegDecoder,
        size: Size,
        *,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        flip_p: float = 0.5,
    ) -> None:
        self.decoder = decoder
        self.rrc = RandomResizedCrop(size, scale=scale, ratio=ratio)
        self.flip = RandomHorizontalFlip(flip_p) if flip_p > 0 else None

    @property
    def size(self) -> tuple[int, int]:
        return self.rrc.size

    @property
    def path(self) -> str:
        """How the last batch was decoded: the boxes only, or whole then cropped."""
        return self.decoder.roi_path

    def __repr__(self) -> str:
        return (
            f"RoiResizedCrop(size={self.size}, scale={self.rrc.scale}, ratio={self.rrc.ratio}, "
            f"flip={self.flip.p if self.flip else 0}, decoder={self.decoder.name!r}, "
            f"path={self.path!r})"
        )

    def boxes(
        self, sizes: torch.Tensor | np.ndarray, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``sizes`` int [B, 2] (h, w) -> boxes int64 [B, 4] (top, left, height, width),
        flip bool [B] or None, on the CPU; drawn as the JPEG-pack loader draws them."""
        hw = torch.as_tensor(np.asarray(sizes, dtype=np.int64)).reshape(-1, 2)
        b = len(hw)
        boxes = self.rrc.sample_boxes(b, hw[:, 0], hw[:, 1], generator)
        flip = self.flip.sample(b, generator) if self.flip is not None else None
        return boxes, flip

    def __call__(
        self,
        datas: list[torch.Tensor],
        sizes: torch.Tensor | np.ndarray,
        generator: torch.Generator | None = None,
        *,
        indices: list[int] | None = None,
    ) -> torch.Tensor:
        """``datas``: JPEG files (uint8 [n_i] CPU tensors); ``sizes``: their stored (h, w)
        int [B, 2]. Returns uint8 [B, 3, *size] in [0, 255] on the decoder's device."""
        boxes, flip = self.boxes(sizes, generator)
        return self.apply(datas, sizes, boxes, flip, indices=indices)

    def apply(
        self,
        datas: list[torch.Tensor],
        sizes: torch.Tensor | np.ndarray,
        boxes: torch.Tensor,
        flip: torch.Tensor | None = None,
        *,
        indices: list[int] | None = None,
    ) -> torch.Tensor:
        """The crop for given ``boxes`` int64 [B, 4] and ``flip`` bool [B] (or None)."""
        dec = self.decoder
        hw = torch.as_tensor(np.asarray(sizes, dtype=np.int64)).reshape(-1, 2)
        if not datas:
            return torch.empty((0, 3, *self.size), dtype=torch.uint8, device=dec.device)
        boxes = boxes.to(torch.int64).cpu()
        if dec.supports_roi and dec.roi_path != "full+crop":
            # a first batch finds out whether ROI works here; if not, the decoder already
            # cut these crops from whole decodes, and later batches go the whole way below
            crops = dec.decode_rois(datas, boxes, sizes=hw, indices=indices)
            whole = torch.zeros_like(boxes)
            whole[:, 2:] = boxes[:, 2:]
            return resize_images(crops, self.size, boxes=whole, flip=flip, sizes=boxes[:, 2:])
        imgs = dec.decode(datas, sizes=hw, indices=indices)
        return resize_images(imgs, self.size, boxes=boxes, flip=flip, sizes=hw)


__all__ = ["RoiResizedCrop"]
