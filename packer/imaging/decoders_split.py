"""Which JPEG decoders the JPEG-pack loader and the GPU build take on CUDA, by
measurement: :func:`best_decoder`, :func:`best_lanes` (several at once, a batch each),
:func:`nvimgcodec_lanes` (nvImageCodec's engines into kept buffers, opt-in).

A decoder that split one batch between nvImageCodec's engines and nvjpeg's CUDA decoder
(``SplitDecoder``) won in one lease and lost in another (see docs/PERFORMANCE.md,
section "Figures behind the code", row "SplitDecoder") and was removed (issue 45):
lanes, a whole batch to each decoder, replaced it.
"""

from __future__ import annotations

import torch

from ..errors import UsageError
from .decoder_base import DecoderBase

# the order the loader and the GPU build try decoders in on CUDA, by measurement: nvjpeg's
# batched decode (torchcodec, torchvision) fed ResNet-50 best and streamed fastest;
# nvImageCodec comes last (by name it is always there). See docs/PERFORMANCE.md, section
# "Figures behind the code", row "decoder order"
MEASURED_ORDER = ("torchcodec", "torchvision", "nvimgcodec")


def best_decoder(device: torch.device | str, **opts: object) -> DecoderBase:
    """The JPEG-pack loader's and the GPU build's decoder on ``device``: on CUDA the
    first of :data:`MEASURED_ORDER` that starts here, quietly (``passed_over`` says why
    the others did not); on the CPU the CPU decoder. ``opts`` go to nvImageCodec
    (``pitched``)."""
    from .decoders import get_decoder

    device = torch.device(device)
    if device.type != "cuda":
        return get_decoder(device)
    passed: list[str] = []
    for name in MEASURED_ORDER:
        try:
            dec = get_decoder(device, prefer=name, **(opts if name == "nvimgcodec" else {}))
        except UsageError as e:
            passed.append(f"{name}: {str(e)[:160]}")
            continue
        dec.passed_over = tuple(passed)
        return dec
    return get_decoder(device, **opts)  # raises, saying how to install one


# decoders with an nvjpeg instance each (each library keeps one decoder behind a lock):
# two of them decode two batches at once, faster than one alone; nvImageCodec beside
# nvjpeg gained little and fed ResNet-50 worse (see docs/PERFORMANCE.md, section "Figures
# behind the code", row "decoder lanes")
MEASURED_LANES = ("torchcodec", "torchvision")


# the batched nvImageCodec decoders (nvbatch: the hardware engines, one C call a batch, no
# Python per image) outran DALI's file pipeline and nvjpeg's two lanes, two lanes best
# with a model beside them (docs/PERFORMANCE.md, "JPEG packs beside DALI", the batched
# decoder, one C call a batch): the default wherever they run
NVBATCH_LANES = 2


def node_share(lanes: int, cores: int | None = None, cpu_count: int | None = None) -> int:
    """nvImageCodec CPU threads for each of this process's ``lanes`` batched decoders:
    the cores this process may run on, shared between the node's ranks
    (``LOCAL_WORLD_SIZE``, torchrun's; 1 without it) and the lanes, at least 1. Where
    the process is already bound to fewer cores than the machine has (a launcher's
    binding: ``cores`` < ``cpu_count``), those cores are its share and are not divided
    again. Left to itself, nvImageCodec starts a thread per core in every decoder, so
    the ranks of a node would oversubscribe its cores by ranks x lanes."""
    import os

    from .._fs import default_workers

    cores = default_workers() if cores is None else cores
    cpu_count = (os.cpu_count() or cores) if cpu_count is None else cpu_count
    ranks = 1
    if cores >= cpu_count:
        try:
            ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
        except ValueError:
            ranks = 1
    return max(1, cores // (ranks * max(1, lanes)))


# Photos larger than this (median pixels) get nvjpeg's CUDA decoder beside the engines:
# below it the engines alone outrun DALI's mixed decoder and feed ResNet-50 several times
# over, and the CUDA decoder would only take SMs from the model; above it the engines
# bind (docs/PERFORMANCE.md, "JPEG packs beside DALI", the rows of pooled allocations).
ENGINES_ALONE_PIXELS = 1_000_000
# the engines' share of a batch above it (DALI's hw_decoder_load), by the same rows:
# 0.8 on 2 MP photos, 0.65 on 12 MP (where 0.8 starves the CUDA decoder's half and 0.5
# the engines')
LARGE_PIXELS = 4_000_000


def engine_share(pixels: float) -> float:
    """The hardware engines' share of each batch for photos of ``pixels`` (the pack's
    median): 1.0 (the engines alone) up to :data:`ENGINES_ALONE_PIXELS`, 0.8 up to
    :data:`LARGE_PIXELS`, 0.65 above, nvjpeg's CUDA decoder taking the rest."""
    if pixels <= ENGINES_ALONE_PIXELS:
        return 1.0
    return 0.8 if pixels <= LARGE_PIXELS else 0.65


def lane_tuning(batch: int, max_hw: tuple[int, int], pixels: float) -> dict[str, object]:
    """:func:`nvimgcodec_batched`'s keywords for a pack whose largest image is
    ``max_hw`` and median ``pixels``, read in batches of ``batch``: the engines' pool
    sized for such batches up front, and the CUDA decoder beside the engines where the
    photos are large (:func:`engine_share`)."""
    share = engine_share(pixels)
    out: dict[str, object] = {"preallocate": (max(1, batch), *(max(1, int(x)) for x in max_hw))}
    if share < 1.0:
        out.update(backends="hw+hybrid", hw_load=share)
    return out


def best_lanes(
    device: torch.device | str, tuning: dict[str, object] | None = None, **opts: object
) -> list[DecoderBase]:
    """The JPEG-pack loader's decoders on ``device``: on CUDA :data:`NVBATCH_LANES`
    batched nvImageCodec decoders where they run (:func:`nvimgcodec_batched`, with
    ``tuning``: :func:`lane_tuning`'s keywords for the pack), else every
    one of :data:`MEASURED_LANES` that starts here (a batch each at once), else
    :func:`best_decoder`'s one; on the CPU the CPU decoder."""
    from .decoders import get_decoder

    device = torch.device(device)
    if device.type == "cuda":
        try:  # one C call a batch: where it runs, it wins (see NVBATCH_LANES)
            threads = node_share(NVBATCH_LANES)
            return nvimgcodec_batched(device, NVBATCH_LANES, threads=threads, **(tuning or {}))
        except UsageError:
            pass
        lanes = []
        for name in MEASURED_LANES:
            try:
                lanes.append(get_decoder(device, prefer=name))
            except UsageError:
                continue
        if len(lanes) > 1:
            return lanes
    return [best_decoder(device, **opts)]


# nvImageCodec lanes: the hardware engines decode whole images into kept buffers (reuse),
# several decoders at once (a batch each). Fast bare, they lose most of it through the
# decoder interface (header checks, a DLPack tensor and a finalizer per image, under the
# GIL), and the loader fed by them fell below its default (see docs/PERFORMANCE.md,
# section "Figures behind the code", row "nvImageCodec lanes"). So the loader does not
# use them by itself: pass
# ``decode=nvimgcodec_lanes(device)`` to try them. Where the engines are missing, the
# CUDA decoder alone.
NVIMGCODEC_LANES = 4
NVIMGCODEC_BACKENDS = ("hw", "hw+hybrid", "hybrid")


def nvimgcodec_lanes(device: torch.device | str, lanes: int = NVIMGCODEC_LANES) -> list:
    """nvImageCodec decoders for a JPEG-pack loader's ``decode=`` on ``device``: ``lanes``
    decoders on the first of :data:`NVIMGCODEC_BACKENDS` that starts here, each decoding
    whole images into kept buffers (``reuse``) with pitched outputs; the loader crops
    them. On the CPU one decoder. Raises UsageError (how to install) where nvImageCodec cannot run."""
    from .decoders import Unavailable, get_decoder

    device = torch.device(device)
    if device.type != "cuda":
        return [get_decoder(device, prefer="nvimgcodec", reuse=True, roi=False)]
    why = ""
    for backends in NVIMGCODEC_BACKENDS:
        opts = {"backends": backends, "pitched": True, "reuse": True, "roi": False}
        try:
            first = get_decoder(device, prefer="nvimgcodec", **opts)
        except UsageError as e:
            why = str(e)
            continue
        more = [get_decoder(device, prefer="nvimgcodec", **opts) for _ in range(lanes - 1)]
        return [first, *more]
    raise UsageError(why or str(Unavailable("nvImageCodec")))


def nvimgcodec_batched(
    device: torch.device | str,
    lanes: int = 2,
    backends: str = "hw",
    roi: bool = False,
    hw_load: float = 1.0,
    threads: int = 0,
    **tuning: object,
) -> list:
    """Batched nvImageCodec decoders (:class:`~packer.imaging.nvbatch.NvBatchDecoder`: one
    C call a batch, no Python per image) for a JPEG-pack loader's ``decode=``: ``lanes``
    of them on CUDA (a batch each at once), one on the CPU. UsageError saying why where
    they cannot run here (no nvImageCodec, no C compiler). ``roi``: each decodes only the
    crop boxes the loader draws. ``hw_load``, ``threads``: as
    :class:`~packer.imaging.nvbatch.NvBatchDecoder`'s (with ``backends="hw+hybrid"``);
    ``tuning``: its other keywords (``pools``, ``pre_init``, ``preallocate``, ``options``)."""
    from .decoders import Unavailable
    from .nvbatch import NvBatchDecoder

    device = torch.device(device)
    try:
        if device.type != "cuda":
            return [NvBatchDecoder(device, roi=roi)]
        opts = {"backends": backends, "roi": roi, "hw_load": hw_load, "threads": threads}
        opts.update(tuning)
        return [NvBatchDecoder(device, **opts) for _ in range(max(1, lanes))]
    except Unavailable as e:
        raise UsageError(f"{e}; install imgpack[gpu] and a C compiler (cc)") from None


def cpu_lane(device: torch.device | str, threads: int) -> DecoderBase:
    """One CPU lane for a JPEG-pack loader's ``decode=`` list on ``device``
    (:class:`~packer.imaging.cpu_lane.CpuLane`): its batches decoded and cropped on
    ``threads`` CPU threads of its own (only each box, at a reduced DCT scale where the
    box is much larger than the output), into pinned memory copied to the GPU. Opt-in:
    ``decode=[*best_lanes(device), cpu_lane(device, 8)]``; not in the default until the
    GPU machine's measurement says so (``benchmarks/dali.py --decodes cpu-lane:K``)."""
    from .cpu_lane import CpuLane

    return CpuLane(device, threads)


__all__ = [
    "ENGINES_ALONE_PIXELS",
    "LARGE_PIXELS",
    "MEASURED_LANES",
    "MEASURED_ORDER",
    "NVBATCH_LANES",
    "NVIMGCODEC_LANES",
    "best_decoder",
    "best_lanes",
    "cpu_lane",
    "engine_share",
    "lane_tuning",
    "nvimgcodec_batched",
    "nvimgcodec_lanes",
]
