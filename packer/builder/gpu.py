"""``imgpack build --device cuda``: JPEGs decoded and resized on the GPU in batches.

Called by :mod:`packer.builder.run` in place of its worker pool's decode; everything else
(plan, journal, resume, finalize, rename) is the CPU build's. Per group of chunks, in a
GPU decoder (:func:`_serve`):

    reader threads read each file once and classify it from its header bytes
    (packer.builder.gpu_read, with packer.imaging.jpeg_header.plain_jpeg_size: no Pillow)
      -> the JPEGs the GPU takes: the decode interface (packer.imaging.decoders, in the
         measured order: torchcodec, torchvision, nvImageCodec), one batch
         -> packer.imaging.jpeg.resize_images (build's --resize boxes) -> pinned host rows (reused)
      -> the rest (PNG, CMYK, 16-bit, EXIF-rotated, arithmetic, unreadable), and any
         JPEG nvjpeg refuses: the CPU workers' decode (packer.imaging.decode, as the CPU
         build), started at once, in parallel (the workers themselves start with the
         first such file: packer.builder.chunks.LazyPool; a tree of plain JPEGs starts none)
    -> each chunk's rows pwritten into rows.u8 and hashed
    -> the build's process journals each chunk's SHA-256 in order, as the CPU build does

The batched decode and resize are :mod:`packer.imaging.jpeg`'s, the JPEG-pack reader's own.
Pixels differ from the CPU path (nvjpeg vs libjpeg without ``draft()``; integer
crop boxes and torch's antialiased bilinear vs Pillow's): the tolerance is measured
by ``tests/test_build_gpu.py`` and recorded in the manifest as ``build.device``.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import os
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

import torch

from ..errors import PackerError
from ..imaging.decode import ResizeSpec
from ..pack.writer import image_bytes
from .config import GpuTuning
from .gpu_read import CpuDecode, GroupRead, group_paths, read_group, submit_cpu
from .gpu_write import HostRows, resize_to_host, write_group
from .workers import _writeback_fn

log = logging.getLogger(__name__)

_TUNED = GpuTuning()  # the knobs' measured defaults; a build passes BuildConfig._gpu


def make_decoder(device: torch.device) -> Any:
    """The build's batched JPEG decoder on ``device``: the measured order's first that
    runs here (:func:`packer.imaging.decoders_split.best_decoder`: torchcodec,
    torchvision, nvImageCodec, whose outputs may keep padded rows, which
    :func:`packer.imaging.jpeg.resize_images` reads in place). One decoder, never a
    split: a pack's bytes depend only on its inputs and options."""
    from ..imaging.decoders_split import best_decoder

    return best_decoder(device, pitched=True)


def _decode_list(
    read: Future[GroupRead], decoder: Any
) -> tuple[GroupRead, list[torch.Tensor | None]]:
    """In the decoder thread: a group's JPEGs (``read``) decoded in one batch by
    ``decoder``; per JPEG the image, or None for one that fails to decode (the CPU path
    then decides, and names the reason)."""
    r = read.result()
    imgs: list[torch.Tensor | None] = [None] * len(r.datas)
    if not r.datas:
        return r, imgs
    hw = [(h, w) for w, h in r.sizes]
    try:  # the readers' plain_jpeg_size checked these bytes: not parsed again
        imgs = list(decoder.decode(r.datas, sizes=hw, prechecked=True))
    except PackerError:
        for i, (t, s) in enumerate(zip(r.datas, hw)):
            with contextlib.suppress(PackerError):
                imgs[i] = decoder.decode([t], sizes=[s], prechecked=True)[0]
    return r, imgs


def _warm_up(device: torch.device, spec: ResizeSpec) -> Any:
    """On a thread of its own while the workers read the first groups: the CUDA context,
    the decoder (returned) and the crop kernel (loaded, or compiled for an image 1.5x the
    output, the typical scale), which take seconds in a fresh process."""
    from torchvision.io import encode_jpeg

    from ..imaging.jpeg import resize_images

    h, w = spec.height, spec.width
    data = encode_jpeg(torch.zeros((3, h * 3 // 2, w * 3 // 2), dtype=torch.uint8))
    with torch.cuda.device(device):
        decoder = make_decoder(device)
        imgs = decoder.decode([data, data])
        resize_images(imgs, (h, w), mode=spec.mode)
        torch.cuda.synchronize(device)
    return decoder


def _serve(
    take_item: Callable[[bool], Any],
    put: Callable[[tuple[Any, ...]], None],
    rows_path: str,
    spec: ResizeSpec,
    device: torch.device,
    cpu_decode: CpuDecode,
    stop: threading.Event | None = None,
    decoder: Any = None,
    tuning: GpuTuning = _TUNED,
) -> None:
    """One GPU decoder's pipeline, in a decoder process (CUDA) or on a thread of the
    build's process (the CPU stand-in of the tests).

    ``take_item(block)`` gives the next group, ``(g, group)``, or None at the end
    (``block`` False: raises queue.Empty where none has arrived yet). Each
    group's rows go into ``rows_path``; ``put(("done", g, results))`` then reports its
    chunks' results (as the CPU workers' ``_decode_chunk``), from a writer thread,
    groups in any order. An error is ``put(("error", exc))`` and ends the pipeline.
    ``cpu_decode(paths)`` starts the CPU build's decode of what the GPU does not take
    and returns its getter. ``stop`` set: end early (the build failed).

    Stages, each on threads of its own (the counts are ``tuning``'s): ``readers`` threads read and classify a
    group's files (:func:`~packer.builder.gpu_read.read_group`); a decoder thread decodes a group's JPEGs in
    one nvjpeg batch (:func:`packer.imaging.jpeg.decode_ahead`, the JPEG-pack reader's own), 3
    groups ahead; this thread crops/resizes a group in one kernel
    (:func:`packer.imaging.jpeg.resize_images`) and starts its copy into a pinned buffer
    (``2 * writers + 2``, reused); ``writers`` threads wait for the copy and the CPU
    decodes, then pwrite and hash each chunk. ``decoder``: the batched JPEG decoder
    (:func:`make_decoder`; default: the CPU decoder, on ``device``).
    """
    from ..imaging.jpeg import decode_ahead

    row = image_bytes(spec.shape)
    cuda = device.type == "cuda"
    if decoder is None:
        from ..imaging.decoders import get_decoder

        decoder = get_decoder(device, prefer="cpu" if not cuda else None, threads=0)
    writeback = _writeback_fn()
    failed = threading.Event()
    try:
        stream = torch.cuda.Stream(device) if cuda else None
        fd = os.open(rows_path, os.O_WRONLY)
    except BaseException as e:
        put(("error", e))
        return

    def finish(g: int, written: Future[list[tuple[Any, ...]]]) -> None:
        if written.cancelled():
            return
        e = written.exception()
        if e is not None:
            failed.set()
            put(("error", e))
        else:
            put(("done", g, written.result()))

    t = tuning
    host_rows = HostRows(row, pinned=cuda, most=2 * t.writers + 2, least=t.group_images)
    readers = ThreadPoolExecutor(t.readers, thread_name_prefix="imgpack-read")
    writers = ThreadPoolExecutor(t.writers, thread_name_prefix="imgpack-write")

    def ended() -> bool:
        return failed.is_set() or (stop is not None and stop.is_set())

    items = _read_ahead(take_item, readers, spec, decoder, cpu_decode, ended, t.read_ahead)
    decoded = decode_ahead(items, device, stream, ahead=t.decode_ahead)
    try:
        for (g, group), (read, imgs) in decoded:
            ok = [i for i, x in zip(read.gpu, imgs) if x is not None]
            retry = [i for i, x in zip(read.gpu, imgs) if x is None]
            host = copied = buf = None
            if ok:
                host, copied, buf = resize_to_host(imgs, spec, stream, host_rows)
            del imgs
            cpu = [(read.cpu, read.decoded)]
            if retry:  # JPEGs nvjpeg refused: the CPU build's decode, which names why
                paths = group_paths(group)
                cpu.append((retry, cpu_decode([paths[i] for i in retry])))
            at = {i: j for j, i in enumerate(ok)}
            release = host_rows.releaser(buf)
            written = writers.submit(
                write_group,
                fd, row, group, at, dict(zip(read.gpu, read.sizes)), host, copied, cpu,
                writeback, release,
            )  # fmt: skip
            written.add_done_callback(functools.partial(finish, g))
            if failed.is_set():
                break
        writers.shutdown(wait=True)  # every group written and reported
    except BaseException as e:
        failed.set()
        put(("error", e))
    finally:
        decoded.close()
        readers.shutdown(wait=True, cancel_futures=True)
        writers.shutdown(wait=True, cancel_futures=True)
        os.close(fd)


def _read_ahead(
    take_item: Callable[[bool], Any],
    readers: ThreadPoolExecutor,
    spec: ResizeSpec,
    decoder: Any,
    cpu_decode: CpuDecode,
    ended: Callable[[], bool],
    ahead: int,
) -> Iterator[tuple[Any, Callable[[], Any]]]:
    """The groups as the decoder takes them, each read ``ahead`` groups
    ahead (as many as have arrived): the reads and the CPU decodes they start run
    beside the GPU's work."""
    reads: collections.deque[tuple[Any, Future[GroupRead]]] = collections.deque()
    more = True
    while not ended():
        while more and len(reads) < ahead:
            try:
                item = take_item(not reads)  # wait only when nothing is read
            except queue.Empty:
                break
            if item is None:
                more = False
                break
            g, group = item
            read = readers.submit(read_group, group_paths(group), spec.max_pixels, cpu_decode)
            reads.append(((g, group), read))
        if not reads:
            return
        key, read = reads.popleft()
        yield key, functools.partial(_decode_list, read, decoder)


class _Decoder:
    """The build's GPU decoder: :func:`_serve` on a thread of this process. It takes
    groups from ``send``; its messages arrive on one queue, ``self.box``: ("done", g,
    results), ("error", exc), ("end",). (Decoder processes beside it were no faster
    once started, and slow to start: docs/PERFORMANCE.md, section "Figures behind the
    code", row "GPU build's decoder processes".)"""

    def __init__(
        self,
        rows_path: str,
        spec: ResizeSpec,
        device: torch.device,
        pool: ProcessPoolExecutor | None,
        tuning: GpuTuning,
    ) -> None:
        self.box: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self.stop = threading.Event()
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()

        def cpu_decode(paths: list[str]) -> Callable[[], list[tuple[bytes | None, Any]]]:
            return submit_cpu(pool, paths, spec)

        def run() -> None:
            decoder = None
            if device.type == "cuda":
                try:
                    decoder = _warm_up(device, spec)
                except BaseException as e:
                    self.box.put(("error", e))
                    return
            _serve(
                self._inbox.get, self.box.put, rows_path, spec, device, cpu_decode, self.stop,
                decoder, tuning,
            )  # fmt: skip
            self.box.put(("end",))

        self._thread = threading.Thread(target=run, name="imgpack-decoder", daemon=True)
        self._thread.start()

    def send(self, item: Any) -> None:
        self._inbox.put(item)

    def close(self, abort: bool) -> None:
        """End the decoder: after the work sent (``abort`` False), or now."""
        if abort:
            self.stop.set()
        self.send(None)  # (a second None, after the one that ended the work, is never read)
        self._thread.join()


def decode_chunks_batched(
    chunks: list[tuple[int, int, list[str]]],
    spec: ResizeSpec,
    rows_path: str,
    device: torch.device,
    pool: ProcessPoolExecutor | None,
    record: Callable[..., None],
    after_submit: Callable[[], None] = lambda: None,
    tuning: GpuTuning = _TUNED,
) -> None:
    """Decode ``chunks`` (chunk, first row, paths) into ``rows_path`` on ``device``,
    calling ``record((chunk, skips, sizes, sha, None), sync=...)`` per chunk in order,
    from one journal thread, as the CPU workers' ``_decode_chunk`` results are recorded
    (None: no worker time split; ``sync`` False for all but the last chunk of a group:
    one journal fsync per group). ``after_submit()`` runs once the first groups are
    sent, before the first record (the build writes its plan there, while the decoders
    read). ``pool``: the CPU workers, for what the GPU does not take (None: in this
    process).

    This thread only hands work along, so no stage waits for another:

    * the groups go to the GPU decoder (:class:`_Decoder`, a thread running
      :func:`_serve`: read and classify, nvjpeg decode, one crop kernel, pinned copy,
      the CPU workers' decode of the rest, pwrite + SHA-256), at most ``tuning.in_flight``
      groups ahead;
    * a journal thread records the finished groups' chunks in chunk order (one fsync
      per group), so this thread never waits on the disk.
    """
    per = max(1, tuning.group_images // max(1, len(chunks[0][2]))) if chunks else 1
    groups = [chunks[i : i + per] for i in range(0, len(chunks), per)]
    if not groups:
        return
    decoder = _Decoder(rows_path, spec, device, pool, tuning)
    journaler = ThreadPoolExecutor(1, thread_name_prefix="imgpack-journal")
    journaled: collections.deque[Future[None]] = collections.deque()
    done: dict[int, list[tuple[Any, ...]]] = {}
    state = {"next": 0, "sent": 0, "torn": False}
    ok = False

    def journal(recs: list[tuple[Any, ...]]) -> None:
        """In the journal thread, group after group in order: one fsync per group. After
        a failed record, none: a line after a torn one would not be read."""
        if state["torn"]:
            return
        try:
            for j, rec in enumerate(recs):
                record(rec, sync=j == len(recs) - 1)
        except BaseException:
            state["torn"] = True
            raise

    def check(block: bool) -> None:
        """Raise the journal's error here; bound the groups waiting for it."""
        while journaled and (block or journaled[0].done() or len(journaled) > 2 * tuning.writers):
            journaled.popleft().result()

    def take(msg: tuple[Any, ...]) -> None:
        """A finished group: journal it and the ones after it, in chunk order."""
        done[msg[1]] = msg[2]
        while state["next"] in done:
            journaled.append(journaler.submit(journal, done.pop(state["next"])))
            state["next"] += 1

    def handle(msg: tuple[Any, ...]) -> None:
        if msg[0] == "error":
            raise msg[1]
        if msg[0] == "done":
            take(msg)
        check(block=False)

    def pending() -> int:
        return state["sent"] - state["next"] - len(done)

    try:
        for g, group in enumerate(groups):
            while pending() >= tuning.in_flight:
                handle(decoder.box.get())
            decoder.send((g, group))
            state["sent"] += 1
            if g == 0:
                after_submit()
            with contextlib.suppress(queue.Empty):
                while True:
                    handle(decoder.box.get_nowait())
        decoder.send(None)  # no more: it finishes what it holds
        while state["next"] < len(groups):
            handle(decoder.box.get())
        check(block=True)
        ok = True
    finally:
        decoder.close(abort=not ok)  # waits for the writes in flight
        if not ok:  # keep what was written: journal the finished groups still in order
            with contextlib.suppress(queue.Empty):
                while True:
                    msg = decoder.box.get_nowait()
                    if msg[0] == "done":
                        take(msg)
        journaler.shutdown(wait=True)
