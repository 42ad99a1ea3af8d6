"""The pass strategy of a storage kind that decodes (JPEG packs): :class:`JpegDecode`.

Per batch: read the files (offsets and end markers checked), draw every image's box
from its stored size with the batch's generator, decode and crop, run the rest of the
transform; on CUDA a decoder thread runs ahead and the crop runs on a side stream.
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
from .order import batch_seed
from .producer import _Pass

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


class JpegDecode(_Pass):
    """A JPEG pack's pass: decoded on the device in batches, or image by image on the
    loader's threads (``decode="cpu"``)."""

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
        from ..imaging.jpeg import decode_ahead, decode_batch, resize_images, sizes_of
        from ..imaging.resize import to_device

        pack, crop, on_cpu = self.jpeg  # type: ignore[misc]
        dev = self.device
        cuda = dev.type == "cuda"
        stream = torch.cuda.Stream(dev) if cuda else None
        pool = None if cuda else self.pool
        stored = pack.sizes.numpy()

        def jobs() -> Iterator[tuple[Any, Callable[[], list[torch.Tensor]]]]:
            # the reads (offsets and end markers checked) run here, on the producer
            # thread: the decoder thread, the pipeline's slowest stage, only decodes
            # (a damaged offset raises when its batch comes, not while an earlier one waits)
            for b, idx in self.batches():
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
                if on_cpu:  # decoded on the threads from now on; the decoder thread idles
                    cpu = self._decode_on_cpu(datas, idx, sizes, boxes, flip, crop.size)
                    yield (b, idx, (sizes, boxes, flip, state, cpu)), list
                    continue
                kw = {"indices": idx.tolist(), "pool": pool, "ends_checked": True, "sizes": sizes}
                decode = functools.partial(decode_batch, datas, dev, **kw)
                yield (b, idx, (sizes, boxes, flip, state, None)), decode

        decoded = decode_ahead(jobs(), dev, stream, ahead=_DECODE_AHEAD)
        try:
            for (b, idx, meta), imgs in decoded:
                sizes, boxes, flip, state, cpu = meta
                if state is not None:
                    self.gen.set_state(state)  # type: ignore[union-attr]
                with torch.cuda.stream(stream) if cuda else contextlib.nullcontext():
                    if cpu is None:
                        got = sizes_of(imgs)
                        _check_sizes(got, sizes, idx)
                        images = resize_images(imgs, crop.size, boxes=boxes, flip=flip, sizes=got)
                    else:
                        out, futs = cpu
                        for f in futs:
                            f.result()
                        images = out.to(dev, non_blocking=True) if cuda else out
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
        futs = [self.pool.submit(run, a, min(a + step, n)) for a in range(0, n, step)]
        if self.sched is not None:
            self._inflight = [f for f in self._inflight if not f.done()] + futs
        return out, futs
