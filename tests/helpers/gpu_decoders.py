"""What the JPEG loader's CUDA default should be on this machine, in the order that
:func:`packer.imaging.decoders_split.best_lanes` documents, found from what runs here
(not from ``best_lanes`` itself): the CUDA tests compare the loader's ``decode_path``
with it."""

from __future__ import annotations

from packer.errors import UsageError
from packer.imaging import decoders as D


def runnable(names: tuple[str, ...] = ("torchcodec", "torchvision", "nvimgcodec")) -> list[str]:
    """Those of ``names`` (GPU decoders) that start on CUDA here, in that order."""
    out = []
    for name in names:
        try:
            D.get_decoder("cuda", prefer=name)
        except UsageError:
            continue
        out.append(name)
    return out


def default_lanes() -> list[str]:
    """The labels of the CUDA default's lanes: ``NVBATCH_LANES`` batched nvImageCodec
    decoders where one builds here, else torchcodec and torchvision where both run, else
    the first GPU decoder that runs (one lane)."""
    from packer.imaging.decoders_split import NVBATCH_LANES, nvimgcodec_batched

    try:
        nvimgcodec_batched("cuda", 1)
        return ["nvimgcodec-batched(hw)"] * NVBATCH_LANES
    except UsageError:
        pass
    names = runnable()
    if {"torchcodec", "torchvision"} <= set(names):
        return ["torchcodec", "torchvision"]
    return names[:1]
