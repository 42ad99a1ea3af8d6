"""The nvImageCodec backend of :mod:`packer.imaging.decoders` (``imgpack[gpu]``).

An extra, not a core dependency: the wheels (``nvidia-nvimgcodec-cu13`` + ``nvidia-nvjpeg``,
about 29 MB) exist for Linux x86-64 with CUDA 13 only, and a CPU-only machine has no use
for them; without them a GPU still decodes (torchcodec, torchvision).

On CUDA: the NVJPG hardware engines (``HW_GPU_ONLY``) first, the CUDA decoder
(``HYBRID_CPU_GPU``) taking the rest, load-balanced by nvImageCodec; the GIL is released
while it decodes. ``GPU_ONLY`` alone has no JPEG decoder ("Could not create decoder.
Code: 7"). On the CPU (``CPU_ONLY``, libjpeg-turbo), the same code runs without a GPU:
what the CPU tests check.

Output: planar RGB (``P_RGB``), EXIF orientation not applied (a pack stores its JPEGs
upright, and its boxes and sizes are the stored frame's), fancy (smooth) chroma
upsampling as libjpeg's: the same pixels as Pillow.

ROI: ``CodeStream(b).get_sub_code_stream(region=Region(y0, x0, y1, x1))`` decodes only the
box's blocks. nvImageCodec 0.9.0 on the GPU returns None for every ROI with fancy
upsampling on; with it off (``options=":fancy_upsampling=0"``) ROI works, its pixels
0.244/255 mean from Pillow's. The first ROI batch finds out which works here
(``roi_path``): "roi" (fancy on), "roi (no fancy upsampling)", else "full+crop"; an image
whose ROI decode still returns None is decoded whole and cropped (``roi_fallbacks``).

Memory: the outputs are views (DLPack) of nvImageCodec's buffers, allocated stream-ordered
for the CUDA stream current at the call, which the decode is ordered on: use them on that
stream (or make it wait on an event), as with torch's own tensors.

Kept buffers (``reuse=True``; ``decoders_split.nvimgcodec_lanes``): an output's buffer goes back to
the decoder once the tensor it returned is gone (a finalizer on that tensor), and a later
batch decodes into it (nvImageCodec's ``images=``, grown where an image is larger)
instead of allocating afresh, which speeds the hardware engines' batch (see
docs/PERFORMANCE.md, section "Figures behind the code", row "nvImageCodec kept
buffers"). The caller
must therefore drop a returned tensor only once the work that reads it has been ordered
before the decoder's next call (a JPEG-pack loader holds each batch until its crop's
event has completed; views taken of a returned tensor must not outlive it). Buffers are taken only
where a whole batch's worth is free, and at most ``keep`` are kept.
"""

from __future__ import annotations

import collections
import os
import weakref
from collections.abc import Sequence

import numpy as np
import torch

from .decoder_base import DecoderBase, Unavailable, _import, crop_all, undecodable

BACKENDS = ("hw+hybrid", "hw", "hybrid")


class KeptBatch:
    """A batch decoded into a decoder's kept buffers on CUDA, without a tensor per image
    (:meth:`NvImageCodecDecoder.decode_kept`): ``table`` int64 [n, 3], each image's
    device address, plane height and row pitch in bytes (its planes are whole rows
    apart), what the JPEG-pack loader's crop kernel reads in place
    (:func:`packer.imaging.jpeg_crop.resize_images`); ``sizes`` int64 [n, 2], each
    image's (h, w), on the CPU. The buffers go back to the decoder once this object is
    gone: keep it until the work that reads them has been ordered before the decoder's
    next call (the loader does: each batch is held until its crop's event completes)."""

    __slots__ = ("__weakref__", "_images", "device", "sizes", "table")

    def __init__(
        self, table: np.ndarray, sizes: torch.Tensor, images: list, device: torch.device
    ) -> None:
        self.table, self.sizes, self._images, self.device = table, sizes, images, device

    def __len__(self) -> int:
        return len(self.table)

    def tensors(self) -> list[torch.Tensor]:
        """The images as uint8 [3, h_i, w_i] tensors (views of the kept buffers, valid
        while this batch is): for the crop's ways that take tensors."""
        if hasattr(self._images, "tensors"):  # nvbatch: one buffer, views made here
            return self._images.tensors()
        return [torch.as_tensor(img, device=self.device) for img in self._images]


ROI_PATHS = ("roi", "roi (no fancy upsampling)", "full+crop")


def import_nvimgcodec():  # -> the nvidia.nvimgcodec module
    """nvImageCodec, its start-up notes about optional codecs (JPEG 2000, TIFF) it did not
    find silenced unless the user set ``PYNVIMGCODEC_VERBOSITY``."""
    os.environ.setdefault("PYNVIMGCODEC_VERBOSITY", "0")
    try:
        return _import("nvidia.nvimgcodec")
    except ImportError as e:
        raise Unavailable(f"nvImageCodec is not installed ({e})") from None


class NvImageCodecDecoder(DecoderBase):
    """nvImageCodec's batched decoder. ``backends`` (CUDA): "hw+hybrid" (default), "hw"
    (the engines alone) or "hybrid" (the CUDA decoder alone). ``pitched``: outputs keep
    the decoder's padded rows where it pads them (strides of whole rows, what
    :func:`packer.imaging.jpeg.resize_images` reads in place) instead of a contiguous
    copy each: the JPEG-pack loader's way."""

    name = "nvimgcodec"
    supports_roi = True

    def __init__(
        self,
        device: torch.device | str,
        *,
        backends: str = "hw+hybrid",
        pitched: bool = False,
        reuse: bool = False,
        roi: bool = True,
        keep: int = 4096,
        check_tail: bool | None = None,
    ) -> None:
        super().__init__(device, check_tail=check_tail)
        self.pitched = bool(pitched)
        self.reuse = bool(reuse)
        self.supports_roi = bool(roi)
        self._keep = int(keep)
        self._free: collections.deque = collections.deque()  # buffers whose tensor is gone
        self.reused = 0  # images decoded into a kept buffer
        if backends not in BACKENDS:
            raise ValueError(f"backends must be one of {BACKENDS}, not {backends!r}")
        nv = self._nv = import_nvimgcodec()
        if self.device.type == "cuda":
            hw = nv.Backend(
                nv.HW_GPU_ONLY, load_hint=1.0, load_hint_policy=nv.ADAPTIVE_MINIMIZE_IDLE_TIME
            )
            hybrid = nv.Backend(nv.HYBRID_CPU_GPU)
            self._backends = {"hw": [hw], "hybrid": [hybrid], "hw+hybrid": [hw, hybrid]}[backends]
            index = self.device.index
            self._device_id = torch.cuda.current_device() if index is None else index
        else:
            self._backends = [nv.Backend(nv.CPU_ONLY)]
            self._device_id = nv.NVIMGCODEC_DEVICE_CPU_ONLY
        self.backends = backends if self.device.type == "cuda" else "cpu"
        self._full = self._make("")  # RuntimeError when none of them can run here
        self._roi = None  # the decoder ROI works with, once probed
        self._roi_path: str | None = None
        self.roi_fallbacks = 0  # images whose ROI decode returned None, decoded whole
        self._params = nv.DecodeParams(
            apply_exif_orientation=False, color_spec=nv.SRGB, sample_format=nv.P_RGB
        )

    def _make(self, options: str):
        try:
            return self._nv.Decoder(
                device_id=self._device_id, backends=self._backends, options=options
            )
        except RuntimeError as e:
            raise Unavailable(f"nvImageCodec cannot decode JPEG here ({e})") from None

    @property
    def coarse_regions(self) -> bool:
        """Whether its regions come without smooth chroma upsampling (about 1.2/255 mean
        from Pillow's pixels): on the GPU until a probe finds otherwise, where nvImageCodec
        0.9.0 decodes no region with it on. The JPEG-pack loader then decodes a box alone
        only where the resize shrinks it 2x (:func:`packer.loading.jpeg_pass.regions_pay`)."""
        if self._roi_path is None:
            return self.device.type == "cuda"
        return self._roi_path == ROI_PATHS[1]

    @property
    def roi_path(self) -> str:
        if not self.supports_roi:
            return "full+crop"
        return self._roi_path or "roi (not yet probed)"

    def __repr__(self) -> str:
        more = ", reuse=True" if self.reuse else ""
        return super().__repr__()[:-1] + f", backends={self.backends!r}{more})"

    # ------------------------------------------------------------ decoding

    def _streams(self, datas: Sequence[torch.Tensor], names: Sequence[int]) -> list:
        out = []
        for d, i in zip(datas, names):
            try:
                out.append(self._nv.CodeStream(d.numpy()))
            except (RuntimeError, ValueError) as e:
                raise undecodable(i, str(e)) from None
        return out

    def _run(self, decoder, streams: list, images: list | None = None) -> list:
        kw = {}
        if self.device.type == "cuda":
            kw["cuda_stream"] = torch.cuda.current_stream(self.device).cuda_stream
        if images is not None:
            kw["images"] = images
        return decoder.decode(streams, params=self._params, **kw)

    def _take(self, n: int) -> list | None:
        """``n`` kept buffers to decode into, or None where fewer are free."""
        free = self._free
        if len(free) < n:
            return None
        try:
            return [free.popleft() for _ in range(n)]
        except IndexError:  # taken meanwhile by another thread: decode afresh
            return None

    def _give_back(self, img) -> None:
        if len(self._free) < self._keep:
            self._free.append(img)

    def _tensor(self, img) -> torch.Tensor:
        if self.device.type == "cuda":
            t = torch.from_dlpack(img)
        else:
            t = torch.from_numpy(np.array(img.cpu()))
        if t.is_contiguous():
            return t
        s0, s1, s2 = t.stride()
        if self.pitched and s2 == 1 and s1 >= t.shape[2] and s0 % s1 == 0:
            return t  # padded rows, planes of whole rows: resize_images reads it in place
        return t.contiguous()

    def _decode(self, datas: list[torch.Tensor], names: list[int]) -> list[torch.Tensor]:
        streams = self._streams(datas, names)
        into = self._take(len(streams)) if self.reuse else None
        imgs = self._run(self._full, streams, into)
        if into is not None:
            self.reused += len(into)
        out = []
        for img, i in zip(imgs, names):
            if img is None:
                raise undecodable(i, "nvImageCodec returned no image")
            t = self._tensor(img)
            if self.reuse:
                weakref.finalize(t, self._give_back, img)
            out.append(t)
        return out

    @property
    def kept(self) -> bool:
        """Whether :meth:`decode_kept` is this decoder's way: kept buffers, whole images,
        on CUDA."""
        return self.reuse and not self.supports_roi and self.device.type == "cuda"

    def decode_kept(
        self, datas: Sequence[torch.Tensor], sizes: torch.Tensor | np.ndarray, names: Sequence[int]
    ) -> KeptBatch:
        """Each JPEG whole into kept buffers: a :class:`KeptBatch` (addresses, no tensor
        per image). The per-image Python of :meth:`decode` (a DLPack tensor, a finalizer,
        the header walks) held the GIL for about 40 us an image, so four decoders ran no
        faster than one (docs/PERFORMANCE.md, "JPEG packs beside DALI"). Here each file's
        frame size comes from nvImageCodec's own header parse and must be ``sizes`` (the
        pack's, range-checked on load) before anything is decoded, so a file cannot ask
        for more memory than its pack records; the caller has checked the end markers
        (``JpegPack.read(check_ends=True)``). A file cut short and closed again decodes
        grey here, as in every CUDA decode without ``check_tail``: ``imgpack verify``'s
        checksums find it."""
        names = [int(i) for i in names]
        hw = np.asarray(sizes, dtype=np.int64).reshape(-1, 2)
        if len(hw) != len(datas) or len(names) != len(datas):
            raise ValueError(f"{len(hw)} sizes and {len(names)} names for {len(datas)} images")
        streams = self._streams(datas, names)
        got = np.array([(c.height, c.width) for c in streams], dtype=np.int64).reshape(-1, 2)
        bad = (got != hw).any(1)
        if bad.any():
            from .jpeg import size_mismatch

            j = int(bad.argmax())
            raise size_mismatch(names[j], got[j].tolist(), hw[j].tolist())
        into = self._take(len(streams))
        imgs = self._run(self._full, streams, into)
        if into is not None:
            self.reused += len(into)
        table = np.empty((len(imgs), 3), dtype=np.int64)
        for k, (img, i) in enumerate(zip(imgs, names)):
            if img is None:
                raise undecodable(i, "nvImageCodec returned no image")
            cai = img.__cuda_array_interface__
            shape, strides = tuple(cai["shape"]), cai.get("strides")
            h, w = hw[k].tolist()
            s0, s1, s2 = strides if strides is not None else (h * w, w, 1)
            if shape != (3, h, w) or s2 != 1 or s1 < w or s0 % s1 or s0 < s1 * h:
                raise undecodable(i, f"it decodes to shape {shape} strides {strides}")
            table[k] = cai["data"][0], s0 // s1, s1
        batch = KeptBatch(table, torch.from_numpy(hw), imgs, self.device)
        weakref.finalize(batch, self._give_back_all, imgs)
        return batch

    def _give_back_all(self, imgs: list) -> None:
        for img in imgs:
            self._give_back(img)

    def _decode_rois(
        self, datas: list[torch.Tensor], boxes: np.ndarray, names: list[int], hw: np.ndarray
    ) -> list[torch.Tensor]:
        if self._roi_path == "full+crop":
            return super()._decode_rois(datas, boxes, names, hw)
        streams = self._streams(datas, names)
        region = self._nv.Region
        subs = [
            s.get_sub_code_stream(region=region(t, l, t + h, l + w))
            for s, (t, l, h, w) in zip(streams, boxes.tolist())  # noqa: E741
        ]
        if self._roi_path is None:
            imgs = self._probe(subs)
            if imgs is None:
                return super()._decode_rois(datas, boxes, names, hw)
        else:
            imgs = self._run(self._roi, subs)
        missing = [k for k, img in enumerate(imgs) if img is None]
        if missing:  # decoded whole and cropped: a broken file raises there, by its name
            self.roi_fallbacks += len(missing)
            whole = self._decode([datas[k] for k in missing], [names[k] for k in missing])
            self._check_shapes(whole, [names[k] for k in missing], hw[missing])
            for k, crop in zip(missing, crop_all(whole, boxes[missing])):
                imgs[k] = crop
        return [x if isinstance(x, torch.Tensor) else self._tensor(x) for x in imgs]

    def _probe(self, subs: list) -> list | None:
        """The first ROI batch: fancy upsampling on, else off, else None (full+crop).
        Sets ``roi_path``; an all-None batch means the way does not work here."""
        imgs = self._run(self._full, subs)
        if any(x is not None for x in imgs):
            self._roi, self._roi_path = self._full, ROI_PATHS[0]
            return imgs
        plain = self._make(":fancy_upsampling=0")
        imgs = self._run(plain, subs)
        if any(x is not None for x in imgs):
            self._roi, self._roi_path = plain, ROI_PATHS[1]
            return imgs
        self._roi_path = ROI_PATHS[2]
        return None
