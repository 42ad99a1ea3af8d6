"""Open a pack as a tensordict ``@tensorclass``: :class:`ImagePack` and :func:`open_pack`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from tensordict import MemoryMappedTensor, tensorclass

from .format import Layout, check_files, read_manifest


@tensorclass
class ImagePack:
    """A packed image dataset: N images of one size, with labels.

    Fields (memory-mapped, read-only: in-place edits stay in this process's memory):
      images: Tensor[N, 3, H, W], uint8 in [0, 255], RGB.
      labels: Tensor[N], int64; class index into ``classes``, or -1 for unlabeled.
    Attributes of a pack from :func:`packer.load` (not carried by slices):
      classes: list[str], sources: list[str] (relative source path of each image),
      manifest: dict, path: Path.
    """

    images: torch.Tensor
    labels: torch.Tensor

    @property
    def classes(self) -> list[str]:
        return self._manifest()["classes"]

    @property
    def sources(self) -> list[str]:
        return self._manifest()["sources"]

    @property
    def manifest(self) -> dict[str, Any]:
        return self._manifest()

    @property
    def path(self) -> Path:
        return self.__dict__["_imgpack_path"]

    def _manifest(self) -> dict[str, Any]:
        try:
            return self.__dict__["_imgpack_manifest"]
        except KeyError:
            raise AttributeError(
                "classes/sources/manifest belong to a whole pack from packer.load(), not a slice"
            ) from None


def open_pack(path: str | os.PathLike[str]) -> ImagePack:
    """Open the pack at ``path`` read-only, without running anything from it.

    Returns an :class:`ImagePack` (``len(pack)`` is N) whose ``images``
    (uint8 [N, 3, H, W], 0-255, RGB) and ``labels`` (int64 [N]) are
    memory-mapped copy-on-write: reads come from the page cache, and in-place
    edits stay in this process. ``pack.classes``, ``pack.sources`` and
    ``pack.manifest`` come from the manifest. Raises PackFormatError for a
    missing, damaged, untrusted or newer-format pack.
    """
    root = Path(path)
    m = read_manifest(root)
    check_files(root, m)
    lay = Layout(root)
    n, shape = m["count"], m["image_shape"]
    if n == 0:
        images = torch.empty((0, *shape), dtype=torch.uint8)
        labels = torch.empty((0,), dtype=torch.int64)
    else:
        images = MemoryMappedTensor.from_filename(lay.images, torch.uint8, (n, *shape), mode="r")
        labels = MemoryMappedTensor.from_filename(lay.labels, torch.int64, (n,), mode="r")
    pack = ImagePack(images=images, labels=labels, batch_size=[n])
    pack.__dict__["_imgpack_manifest"] = m
    pack.__dict__["_imgpack_path"] = root
    return pack
