"""The pass strategy of a storage kind that decodes (JPEG packs): :class:`JpegDecode`,
and who decodes its batches: :class:`Decoding` (:func:`decoding_for`).

Per batch: read the files (offsets and end markers checked), draw every image's box
from its stored size with the batch's generator, decode and crop, run the rest of the
transform; on CUDA decoder threads run ahead and the crop runs on a side stream.

In batches, the decode goes through :mod:`packer.imaging.decoders`: on CUDA
torchcodec and torchvision at once where both run (each keeps one nvjpeg decoder
behind a lock; two decode two batches at once:
:func:`packer.imaging.decoders_split.best_lanes`), else the first that runs here in
the measured order (torchcodec, torchvision, nvImageCodec; nvjpeg's batched decode fed
ResNet-50 best), or the one ``decode=`` names (nvImageCodec: its hardware engines with
its CUDA decoder taking the rest, GIL released, ROI), or a decoder object
(``get_decoder(...)``), or a list of those (the
lanes: batch b goes whole to decoder b % n, in a thread and CUDA stream of its own;
batches still come in order). A decoder that can
decode a region decodes only each image's box (the ROI-fused crop of
:mod:`packer.loading.roi_crop`); the crops are then resized in one batched call. One
that cannot (or whose ROI does not work on this version: its first batch finds out)
decodes whole and the boxes are cut in that same call. ``Decoding.path`` says which ran.

:class:`Decoding` and :func:`decoding_for` live in :mod:`packer.loading.decoding`
(importable from here too); this module runs the pass.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import numpy as np
import torch

from ..errors import PackerError, PackFormatError
from .batch_transform import _check_transformed, _mix
from .decoding import DECODE_NAMES, Decoding, decoding_for, lane_tuning_for, regions_pay
from .order import batch_seed
from .producer import _Pass
from .stats import AUGMENT, COPY, CROP, DECODE, READ, timed, timed_call

# what other modules import from here (who decodes: .decoding)
__all__ = [
    "DECODE_NAMES",
    "Decoding",
    "JpegDecode",
    "decoding_for",
    "lane_tuning_for",
    "regions_pay",
]

_DECODE_AHEAD = 2  # batches read and decoded ahead of the one being cropped
_CPU_TASK = 4  # images a CPU decode task takes at most


def _stored_sizes(stored: np.ndarray, idx: np.ndarray, path: object) -> np.ndarray:
    """The pack's (h, w) [n, 2] of images ``idx``; PackFormatError naming the first
    that is not a positive size (the boxes are drawn from these before decoding)."""
    hw = stored[idx]
    bad = (hw < 1).any(1)
    if bad.any():
        j = int(bad.argmax())
        raise PackFormatError(
            f"{path}: image {int(idx[j])}: the pack gives its size as {hw[j, 1]}x{hw[j, 0]}; "
            "the pack is damaged, rebuild it"
        )
    return hw


def _check_sizes(got: torch.Tensor, stored: torch.Tensor, idx: np.ndarray) -> None:
    """Decoded (h, w) [g, 2] against the pack's stored sizes: the boxes were drawn from
    those, so a mismatch is a damaged pack, named by its first image."""
    if not torch.equal(got, stored):
        from ..imaging.jpeg import size_mismatch

        j = int((got != stored).any(1).int().argmax())
        raise size_mismatch(int(idx[j]), got[j].tolist(), stored[j].tolist())


def _raise(e: BaseException) -> None:
    raise e


def _batch_of(key: tuple[Any, ...]) -> int:
    return int(key[0])


def _lanes(cfg: Any) -> int:
    """Batches a pass decodes at once: one per decoder (one on the CPU)."""
    decoding = getattr(cfg, "decoding", None)
    return 1 if decoding is None or getattr(cfg, "on_cpu", False) else decoding.lanes


class JpegDecode(_Pass):
    """A JPEG pack's pass: decoded on the device in batches (its :class:`Decoding`), or
    image by image on the loader's threads (``decode="cpu"``)."""

    @classmethod
    def read_window(cls, cfg: Any) -> int:
        # the batch being cropped, ``_DECODE_AHEAD`` decoding (one more per further
        # decoder), and the next one's read
        return _DECODE_AHEAD + _lanes(cfg) + 1

    def __init__(self, cfg: Any, *, decoder: Any = None, **kw: Any) -> None:
        super().__init__(cfg, **kw)
        self.decoding: Decoding | None = cfg.decoding
        self.decoder = decoder

    @classmethod
    def prepare(cls, cfg: Any, shared: Any) -> dict[str, Any]:
        if cfg.on_cpu or cfg.decoding is None:
            return {}
        return {"decoder": cfg.decoding.for_pass(shared.thread_pool(cfg.num_threads))}

    def run(self) -> None:
        """JPEG packs: per batch, read the files (offsets and end markers checked), draw
        every image's box from its stored size, decode and crop the batch, run the rest
        of the transform.

        On the device (``on_cpu`` False) the batch is decoded in one call and cropped in
        one batched call; the decodes run ``_DECODE_AHEAD`` batches ahead on a thread of
        their own (:func:`packer.imaging.jpeg.decode_ahead`) while this thread reads the next
        batches' bytes and crops each batch, in batch order, on a side stream; the batch
        carries a ready event, as the raw path's batches do. With ``on_cpu`` each image
        is decoded and its box resampled on the loader's threads as soon as its batch is
        read (:func:`packer.imaging.jpeg.decode_crop_cpu`), into a new buffer (pinned, then
        copied, when the batch goes to CUDA). Either way the boxes, and the generator
        state the rest of the transform continues from, depend on the seed alone.
        """
        from ..imaging.jpeg import decode_ahead, resize_images, sizes_of
        from ..imaging.resize import to_device

        pack, crop, on_cpu = self.jpeg  # type: ignore[misc]
        dev = self.device
        cuda = dev.type == "cuda"
        stream = torch.cuda.Stream(dev) if cuda else None
        stored = pack.sizes.numpy()
        decoding, decoder = self.decoding, self.decoder
        lanes = 1 if on_cpu or decoding is None else decoding.lanes
        st = self.stats
        clock = st.clock  # None: stats off
        st.set_workers(decode=self.num_threads if on_cpu else lanes)

        def jobs() -> Iterator[tuple[Any, Callable[[], list[torch.Tensor]]]]:
            # the reads (offsets and end markers checked) run here, on the producer
            # thread: the decoder thread, the pipeline's slowest stage, only decodes
            # (a damaged offset raises when its batch comes, not while an earlier one waits)
            for b, idx in self.batches():
                bt = st.batch()
                try:
                    datas = pack.read(idx, check_ends=True)
                    sizes = torch.from_numpy(_stored_sizes(stored, idx, pack.path))
                    if self.gen is not None:
                        self.gen.manual_seed(batch_seed(*self.seeds, b))
                    boxes, flip = crop.boxes(sizes, self.gen)
                except (PackerError, ValueError) as e:
                    yield (b, idx, None), functools.partial(_raise, e)
                    continue
                state = None if self.gen is None else self.gen.get_state()
                bt.lap(READ)
                if on_cpu:  # decoded on the threads from now on; the decoder thread idles
                    cpu = self._decode_on_cpu(datas, idx, sizes, boxes, flip, crop.size)
                    yield (b, idx, (sizes, boxes, flip, state, cpu, bt)), list
                    continue
                dec = decoder if decoder is not None else decoding.of_batch(b)  # type: ignore[union-attr]
                decode = functools.partial(
                    decoding.run,  # type: ignore[union-attr]
                    dec, datas, sizes, boxes, idx.tolist(), flip, crop.size,
                )  # fmt: skip
                if clock is not None:  # on the decode thread: (result, its seconds)
                    decode = functools.partial(timed_call, clock, decode)
                yield (b, idx, (sizes, boxes, flip, state, None, bt)), decode

        decoded = decode_ahead(
            jobs(), dev, stream, ahead=_DECODE_AHEAD + lanes - 1, lanes=lanes, lane=_batch_of
        )
        try:
            for (b, idx, meta), imgs in decoded:
                sizes, boxes, flip, state, cpu, bt = meta
                bt.mark()  # the wait for the decode is no stage's time
                if state is not None:
                    self.gen.set_state(state)  # type: ignore[union-attr]
                with torch.cuda.stream(stream) if cuda else contextlib.nullcontext():
                    if cpu is None:
                        if clock is not None:
                            imgs, took = imgs
                            bt.add(DECODE, took)
                        cropped, imgs = imgs
                    if cpu is None and cropped is None:  # a CPU lane's batch, pinned
                        images = imgs.to(dev, non_blocking=True) if cuda else imgs
                        bt.lap(COPY)
                    elif cpu is None:
                        # an image decoded as its box alone is resized whole; one decoded
                        # whole, from its box
                        cut = torch.tensor(cropped, dtype=torch.bool).reshape(-1, 1)
                        got = imgs.sizes if hasattr(imgs, "table") else sizes_of(imgs)
                        _check_sizes(got, torch.where(cut, boxes[:, 2:], sizes), idx)
                        from_box = boxes.clone()
                        from_box[cut.flatten(), :2] = 0
                        images = resize_images(
                            imgs, crop.size, boxes=from_box, flip=flip, sizes=got
                        )
                        bt.lap(CROP)
                    else:
                        out, futs = cpu
                        for f in futs:
                            bt.add(DECODE, f.result())  # decoded and cropped on a thread
                        bt.mark()
                        images = out.to(dev, non_blocking=True) if cuda else out
                        bt.lap(COPY)
                    del imgs
                    self.read_done(b)  # decoded: the batch's bytes are no longer read
                    labels = torch.from_numpy(np.take(self.labels, idx, 0))
                    targets = None
                    if self.targets is not None:
                        targets = torch.from_numpy(np.take(self.targets, idx, 0))
                    if cuda:
                        labels = to_device(labels, dev)
                        if targets is not None:
                            targets = to_device(targets, dev)
                    bt.lap(COPY)
                    if getattr(crop.rest, "mixes_labels", False):
                        images, labels = _mix(crop.rest, images, labels, self.gen)
                    else:
                        out = crop.after(images, self.gen)
                        images = (
                            out if crop.rest is None else _check_transformed(crop.rest, images, out)
                        )
                    ready = None
                    if cuda:
                        ready = torch.cuda.Event()
                        ready.record(stream)
                    bt.lap(AUGMENT)
                st.produced(bt, b % lanes)
                if not self.put((images, labels, targets, ready)):
                    return
        finally:
            decoded.close()

    def _decode_on_cpu(
        self,
        datas: list[torch.Tensor],
        idx: np.ndarray,
        sizes: torch.Tensor,
        boxes: torch.Tensor,
        flip: torch.Tensor | None,
        size: tuple[int, int],
    ) -> tuple[torch.Tensor, list[Future[Any]]]:
        """Start decoding a batch image by image on the CPU threads into one new
        uint8 [n, 3, *size] buffer (pinned when the batch goes to CUDA)."""
        from ..imaging.jpeg import decode_crop_cpu

        n = len(idx)
        out = torch.empty((n, 3, *size), dtype=torch.uint8, pin_memory=self.device.type == "cuda")
        o, hw, bx = out.numpy(), sizes.numpy(), boxes.numpy()
        fl = np.zeros(n, bool) if flip is None else flip.numpy()

        def run(a: int, z: int) -> None:
            for j in range(a, z):
                decode_crop_cpu(datas[j], int(idx[j]), hw[j], bx[j], bool(fl[j]), o[j])

        # a few images a task: one submit per image would cost more GIL than it spares
        step = max(1, min(_CPU_TASK, -(-n // self.num_threads)))
        clock = self.stats.clock
        if clock is None:
            futs = [self.pool.submit(run, a, min(a + step, n)) for a in range(0, n, step)]
        else:  # each task's result: the seconds it took
            futs = [
                self.pool.submit(timed, clock, run, a, min(a + step, n)) for a in range(0, n, step)
            ]
        if self.sched is not None:
            self._inflight = [f for f in self._inflight if not f.done()] + futs
        return out, futs
