"""The JPEG-pack loader's crop: :class:`JpegCrop` (each image's box, in its own pixels,
an optional flip, and what runs after) and :func:`crop_for`, which builds it from the
loader's ``transform``, ``image_size`` and ``train``. Boxes are drawn by the augment
stage's crop ops; the pixels come from :func:`packer.imaging.jpeg_crop.resize_images`."""

from __future__ import annotations

import torch

from ..augment.compose import Compose
from ..augment.transforms import CenterCrop, RandomHorizontalFlip, RandomResizedCrop, Resize
from ..imaging.jpeg_crop import fit_boxes

# eval crop: the centre ``CROP_FRACTION`` of the shorter side, as Resize(S/0.875) +
# CenterCrop(S) (torchvision's ImageNet recipe: 224 of 256)
CROP_FRACTION = 0.875


class JpegCrop:
    """How a JPEG pack's variable-size images become one uint8 [B, 3, h, w] batch: the
    per-image boxes (in each image's own pixels), an optional flip, and what runs after.

    Built by :func:`crop_for` from the loader's ``transform``, ``image_size``, ``train``.
    """

    def __init__(
        self,
        size: tuple[int, int],
        rrc: RandomResizedCrop | None = None,
        flip: RandomHorizontalFlip | None = None,
        center: tuple[int, int] | None = None,
        whole: bool = False,
        rest: object = None,
    ) -> None:
        self.size = size
        self.rrc, self.flip, self.center, self.whole, self.rest = rrc, flip, center, whole, rest

    @property
    def random(self) -> bool:
        return self.rrc is not None or self.flip is not None or _accepts(self.rest)

    def boxes(
        self, sizes: torch.Tensor, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``sizes`` int64 [B, 2] (h, w) -> boxes int64 [B, 4], flip bool [B] or None.
        Random draws in the order the same transforms would draw them on a batch."""
        b = len(sizes)
        if self.rrc is not None:
            boxes = self.rrc.sample_boxes(b, sizes[:, 0], sizes[:, 1], generator)
        elif self.whole:
            boxes = fit_boxes(sizes, self.size, "stretch")
        elif self.center is not None:
            ch, cw = self.center
            small = (sizes[:, 0] < ch) | (sizes[:, 1] < cw)
            if bool(small.any()):
                i = int(small.int().argmax())
                h, w = sizes[i].tolist()
                raise ValueError(f"CenterCrop{self.center} is larger than a {h}x{w} image")
            top = torch.round((sizes[:, 0] - ch) / 2.0).to(torch.int64)
            left = torch.round((sizes[:, 1] - cw) / 2.0).to(torch.int64)
            boxes = torch.stack([top, left, torch.full_like(top, ch), torch.full_like(top, cw)], 1)
        else:
            boxes = fit_boxes(sizes, self.size, "crop", CROP_FRACTION)
        flip = self.flip.sample(b, generator) if self.flip is not None else None
        return boxes, flip

    def after(self, images: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        if self.rest is None:
            return images
        if generator is not None and _accepts(self.rest):
            return self.rest(images, generator=generator)  # type: ignore[operator]
        return self.rest(images)  # type: ignore[operator]


def _accepts(t: object) -> bool:
    return bool(getattr(t, "accepts_generator", False))


def crop_for(transform: object, image_size: int | tuple[int, int] | None, train: bool) -> JpegCrop:
    """The :class:`JpegCrop` of a JPEG-pack loader.

    * ``transform`` None: ``train`` -> RandomResizedCrop(image_size) + flip; else the
      centre crop (:data:`CROP_FRACTION` of the shorter side, resized to image_size).
    * a :class:`RandomResizedCrop`, :class:`CenterCrop` or :class:`Resize` with a
      (h, w) size, or a :class:`Compose` starting with one (a RandomResizedCrop may be
      followed by a RandomHorizontalFlip): its boxes are drawn per image, relative to
      each image's own size; the rest of the Compose runs on the cropped batch.
    * any other callable: runs on the batch after the default crop.
    """
    first, second, rest = transform, None, None
    if isinstance(transform, Compose):
        mods = list(transform)
        first = mods[0] if mods else None
        k = 1
        if (
            isinstance(first, RandomResizedCrop)
            and len(mods) > 1
            and isinstance(mods[1], RandomHorizontalFlip)
        ):
            second, k = mods[1], 2
        tail = mods[k:]
        rest = Compose(tail) if tail else None
        if not isinstance(first, (RandomResizedCrop, CenterCrop, Resize)):
            first, second, rest = None, None, transform
    elif transform is not None and not isinstance(
        transform, (RandomResizedCrop, CenterCrop, Resize)
    ):
        first, rest = None, transform
    if isinstance(first, RandomResizedCrop):
        return JpegCrop(first.size, rrc=first, flip=second, rest=rest)
    if isinstance(first, CenterCrop):
        return JpegCrop(first.size, center=first.size, rest=rest)
    if isinstance(first, Resize):
        if isinstance(first.size, int):
            raise ValueError(
                "Resize(int) keeps each image's aspect, so a JPEG pack's batch would have "
                "many sizes; give Resize((height, width)) or a crop"
            )
        return JpegCrop(first.size, whole=True, rest=rest)
    if image_size is None:
        raise ValueError(
            "a JPEG pack needs an output size: PackLoader(pack, B, image_size=S), or a "
            "transform starting with RandomResizedCrop/CenterCrop/Resize((h, w))"
        )
    size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    if train:
        return JpegCrop(size, rrc=RandomResizedCrop(size), flip=RandomHorizontalFlip(), rest=rest)
    return JpegCrop(size, rest=rest)
