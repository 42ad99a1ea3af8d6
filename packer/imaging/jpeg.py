"""Batched JPEG decode and crop/resize, on CUDA or the CPU: the one copy the JPEG-pack
reader (:class:`packer.loading.loader.PackLoader`) and the GPU build share.

Data flow::

    JPEG bytes (uint8 [n_i] each) --decode_batch--> list of uint8 [3, h_i, w_i]
        --resize_images(boxes)--> uint8 [B, 3, S, S]

* ``resize_images`` on CUDA: one Triton kernel reads each image where it lies (a table
  of addresses), no padded batch; elsewhere ``pad_batch`` (uint8 [B, 3, Hmax, Wmax]) +
  ``transforms.resized_crop``, the same result within 1/255.
* ``decode_ahead`` runs the decodes on a thread of their own, a batch or two ahead of
  the caller's crops (the loader and the GPU build both use it).
* ``decode_crop_cpu`` decodes one image and resamples only its box (Pillow), on the
  calling thread without the GIL: the loader's way on the CPU, where it beats decoding
  a batch and cropping it padded (:func:`decodes_on_cpu`).

* On CUDA the whole list goes to nvjpeg in one ``torchvision.io.decode_jpeg(list,
  device=...)`` call; if that call fails, the batch is decoded again image by
  image to name the bad one.
* On the CPU each image is decoded by ``torchvision.io.decode_jpeg`` on a thread
  pool (the op runs in C++ without the GIL), each failure caught on its own.
* Boxes are per image, in that image's own pixels: :func:`fit_boxes` gives the
  centre crop / stretch boxes (eval, and build's ``--resize crop|stretch``);
  :class:`packer.transforms.RandomResizedCrop.sample_boxes` takes per-image sizes
  for training. ``pad`` (letterbox) resizes the whole image to its fitted size,
  one batched call per distinct fitted size, then pastes it centred on black.

A JPEG that fails to decode raises :class:`PackFormatError` naming its index
(the caller's, e.g. the pack row), never crashes the process.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from ..errors import PackFormatError
from .jpeg_crop import (
    fit_boxes,
    pad_batch,
    resize_batch,
    resize_images,
    sizes_of,
)


def _rgb_mode():  # -> ImageReadMode.RGB, imported only when decoding
    from torchvision.io import ImageReadMode

    return ImageReadMode.RGB


_warmed: list[bool] = []  # import_decoders has run in this process (state, not a setting)


def import_decoders(device: torch.device) -> None:
    """Import what decoding a JPEG pack's batch imports, on the calling thread: the
    loader calls it before its threads start, so no gather or decode thread runs an
    import (an import holds the module's lock; garbage collection inside it could run
    an old loader's finalizer while other threads wait for that lock). Pillow and
    torchvision import parts of themselves on first use, so one tiny JPEG is decoded
    and cropped both CPU ways here, once per process."""
    from .resize import triton_kernels

    if device.type == "cuda":
        triton_kernels()  # resize_images' kernels
    if _warmed:
        return
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (32, 32), (90, 120, 150)).save(buf, "JPEG")
    data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
    out = np.empty((3, 8, 8), np.uint8)
    decode_crop_cpu(data, -1, (32, 32), (0, 0, 32, 32), True, out)  # at 1/2 (jpeg_scale)
    decode_crop_cpu(data, -1, (32, 32), (0, 0, 32, 32), True, out, scaled=False)
    resize_images(decode_batch([data], sizes=[(32, 32)]), (8, 8), mode="crop")
    _warmed.append(True)


def _decode_one(data: torch.Tensor, index: int, device: torch.device) -> torch.Tensor:
    from torchvision.io import decode_jpeg

    try:
        out = decode_jpeg(data, mode=_rgb_mode(), device=device)
    except (RuntimeError, ValueError) as e:
        msg = (str(e).splitlines() or [""])[0][:200]
        raise PackFormatError(
            f"image {index}: its stored JPEG does not decode ({msg}); the pack is damaged, "
            "run `imgpack verify` and rebuild it"
        ) from None
    if out.ndim != 3 or out.shape[0] != 3 or out.shape[1] < 1 or out.shape[2] < 1:
        raise PackFormatError(
            f"image {index}: its stored JPEG decodes to shape {tuple(out.shape)}, not "
            "[3, H, W]; the pack is damaged, rebuild it"
        )
    return out


# the frame headers (SOFn) of JPEG's DCT and lossless processes: not DHT (C4), JPG (C8),
# DAC (CC), which share the range
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def frame_size(data: torch.Tensor | np.ndarray | bytes) -> tuple[int, int] | None:
    """(height, width) in a JPEG's frame header (SOFn): what a decoder allocates for,
    read from the header bytes alone, before anything is decoded. None when the header
    cannot be walked plainly from SOI to a frame (a marker where a segment should start,
    a scan or the end before any frame): the caller treats such a file as damaged.

    The walk is libjpeg's: fill bytes and markers without a length are stepped over,
    every other segment by its length, and the first frame header is the one decoded
    (libjpeg refuses a second)."""
    b = memoryview(data.numpy() if isinstance(data, torch.Tensor) else data)
    n = len(b)
    if n < 4 or b[0] != 0xFF or b[1] != 0xD8:
        return None
    pos = 2
    while pos + 4 <= n:
        if b[pos] != 0xFF:
            return None
        marker = b[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # TEM, RSTn: no length
            pos += 2
            continue
        if marker in (0x00, 0xD8, 0xD9, 0xDA):  # not a segment, or no frame before it
            return None
        length = (b[pos + 2] << 8) | b[pos + 3]
        if length < 2:
            return None
        if marker in _SOF:
            if length < 8 or pos + 9 > n:
                return None
            return (b[pos + 5] << 8) | b[pos + 6], (b[pos + 7] << 8) | b[pos + 8]
        pos += 2 + length
    return None


def check_frames(
    datas: Sequence[torch.Tensor], names: Sequence[int], sizes: torch.Tensor | np.ndarray
) -> None:
    """Every JPEG's frame header against its stored (h, w) ``sizes`` [n, 2], before any is
    decoded: a decoder allocates what the header says, so a header that claims more than
    the pack records (and was range-checked on load) would let a 2 KB file ask for
    gigabytes. PackFormatError naming the first that differs or has no readable frame."""
    hw = np.asarray(sizes, dtype=np.int64).reshape(-1, 2)
    for d, i, (h, w) in zip(datas, names, hw.tolist()):
        got = frame_size(d)
        if got is None:
            raise PackFormatError(
                f"image {i}: its stored JPEG does not decode (no frame header before its "
                "image data); the pack is damaged, run `imgpack verify` and rebuild it"
            )
        if got != (h, w):
            raise size_mismatch(i, got, (h, w))  # as its header says, before decoding


def decode_batch(
    datas: Sequence[torch.Tensor],
    device: torch.device | str = "cpu",
    *,
    indices: Sequence[int] | None = None,
    pool: ThreadPoolExecutor | None = None,
    ends_checked: bool = False,
    sizes: torch.Tensor | np.ndarray | None = None,
) -> list[torch.Tensor]:
    """Decode JPEGs to RGB on ``device``.

    Args:
      datas: 1-D uint8 CPU tensors, one JPEG file's bytes each.
      device: "cpu" or a CUDA device (nvjpeg, the whole list in one call).
      indices: how errors name each image (default its position in ``datas``).
      pool: CPU threads to decode on (default: this thread).
      ends_checked: the caller checked that every file ends with its EOI marker
        (:meth:`packer.pack.JpegPack.read` does, for a whole batch at once).
      sizes: int [n, 2], each image's expected (h, w) (a pack's stored sizes, checked
        on load against its limits): every frame header must say the same before
        anything is decoded (:func:`check_frames`). A pack's readers always pass it.

    Returns:
      list of Tensor[3, h_i, w_i], uint8 in [0, 255], on ``device``.
    Raises PackFormatError naming the index of the first image that does not decode.
    """
    device = torch.device(device)
    names = list(range(len(datas))) if indices is None else [int(i) for i in indices]
    if not datas:
        return []
    if sizes is not None:
        check_frames(datas, names, sizes)
    # nvjpeg's batched decode returns a truncated file's partial image without an
    # error: every stored JPEG must end with its EOI marker (the build ensures it)
    for d, i in zip(datas, [] if ends_checked else names):
        e = d.numpy()[-2:]
        if len(d) < 4 or e[0] != 0xFF or e[1] != 0xD9:
            raise truncated(i)
    if device.type == "cuda":
        from torchvision.io import decode_jpeg

        try:
            out = decode_jpeg(list(datas), mode=_rgb_mode(), device=device)
        except (RuntimeError, ValueError):
            # nvjpeg reports a batch, not an image: find the bad one
            out = [_decode_one(d, i, device) for d, i in zip(datas, names)]
        for img, i in zip(out, names):
            if img.ndim != 3 or img.shape[0] != 3:
                raise PackFormatError(
                    f"image {i}: its stored JPEG decodes to shape {tuple(img.shape)}, not "
                    "[3, H, W]; the pack is damaged, rebuild it"
                )
        return list(out)
    if pool is None:
        return [_decode_one(d, i, device) for d, i in zip(datas, names)]
    futures = [pool.submit(_decode_one, d, i, device) for d, i in zip(datas, names)]
    return [f.result() for f in futures]


def truncated(index: int) -> PackFormatError:
    """The error for a stored JPEG without its end-of-image marker."""
    return PackFormatError(
        f"image {index}: its stored JPEG is truncated (no end-of-image marker); the "
        "pack is damaged, run `imgpack verify` and rebuild it"
    )


def size_mismatch(index: int, got_hw: Sequence[int], stored_hw: Sequence[int]) -> PackFormatError:
    """The error for a stored JPEG that decodes to another (h, w) than the pack records
    (the crop boxes are drawn from the recorded size)."""
    (h, w), (sh, sw) = (int(v) for v in got_hw), (int(v) for v in stored_hw)
    return PackFormatError(
        f"image {index}: its stored JPEG decodes to {w}x{h}, the pack says {sw}x{sh}; "
        "the pack is damaged, run `imgpack verify` and rebuild it"
    )


def decode_crop_cpu(
    data: torch.Tensor,
    index: int,
    hw: Sequence[int],
    box: Sequence[int],
    flip: bool,
    out: np.ndarray,
    *,
    scaled: bool = True,
) -> None:
    """Decode one stored JPEG on the CPU and crop/resize it into ``out``, on this thread.

    Args:
      data: uint8 [n] CPU tensor, the file's bytes (a view of the pack is fine).
      index: how an error names the image (its pack row).
      hw: its stored (height, width); a file of another size is refused, its frame
        header before anything is decoded (:func:`check_frames`).
      box: (top, left, height, width) inside the image, in its pixels.
      flip: mirror the output left-right.
      out: uint8 [3, h, w] numpy array (a row of a batch), written planar.
      scaled: where the box is at least twice the output on both sides, decode at 1/2,
        1/4 or 1/8 (JPEG's DCT scaling, Pillow's draft mode; the largest that leaves the
        box the output's size): :mod:`packer.imaging.jpeg_scale`, the same pixels within
        1/255 mean. False: always whole.

    The decode is the batched CPU path's (``torchvision.io.decode_jpeg``: libjpeg-turbo,
    a damaged file raises); only the box is copied out and resampled, by Pillow's
    antialiased bilinear (the triangle filter :func:`packer.transforms.resized_crop`
    uses: the same pixels within rounding, ±1-2/255). Both run in C without the GIL.
    Raises PackFormatError naming ``index``.
    """
    from PIL import Image

    from .decode import store_into

    check_frames([data], [index], [hw])
    if scaled:
        from .jpeg_scale import decode_crop_scaled, draft_scale

        s = draft_scale(box[2:], out.shape[1:])
        if s > 1 and decode_crop_scaled(data, index, hw, box, flip, out, s):
            return
    x = _decode_one(data, index, torch.device("cpu"))
    if tuple(x.shape[1:]) != tuple(int(v) for v in hw):
        raise size_mismatch(index, x.shape[1:], hw)
    top, left, bh, bw = (int(v) for v in box)
    hwc = x.permute(1, 2, 0)  # torchvision decodes to [h, w, 3] and returns a view
    part = hwc[top : top + bh, left : left + bw].contiguous().numpy()
    im = Image.frombuffer("RGB", (bw, bh), part, "raw", "RGB", 0, 1)
    oh, ow = out.shape[1:]
    im = im.resize((ow, oh), Image.Resampling.BILINEAR)
    if flip:
        im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    store_into(im, out)


DECODE_MODES = ("auto", "device", "cpu")


def decodes_on_cpu(decode: str, device: torch.device) -> bool:
    """Does a JPEG-pack loader with ``decode`` on ``device`` decode image by image on
    its CPU threads (:func:`decode_crop_cpu`), rather than in batches on the device?

    ``decode`` is one of :data:`DECODE_MODES` (the loader checks it). "auto": on the
    CPU yes (only each box resampled: faster than the padded batch's crop, see
    docs/PERFORMANCE.md, section "Figures behind the code", row "CPU decode of a JPEG
    pack"), on CUDA no
    (nvjpeg). Splitting a CUDA batch between both was measured and dropped
    (docs/BENCHMARKS.md, "Who decodes"): the CPU threads' Python starves a training
    loop of the GIL.
    """
    return decode == "cpu" or (decode == "auto" and device.type != "cuda")


def decode_resized(
    datas: Sequence[torch.Tensor],
    out_size: tuple[int, int],
    device: torch.device | str = "cpu",
    *,
    mode: str = "crop",
    boxes_for: object = None,
    indices: Sequence[int] | None = None,
    pool: ThreadPoolExecutor | None = None,
) -> torch.Tensor:
    """Decode a list of JPEGs and crop/resize them all to ``out_size`` on ``device``.

    ``boxes_for``: optional callable ``sizes int64 [B, 2] -> (boxes int64 [B, 4],
    flip bool [B] or None)`` drawing per-image boxes (training); else ``mode``'s
    boxes. Returns uint8 [B, 3, *out_size] on ``device``.
    """
    imgs = decode_batch(datas, device, indices=indices, pool=pool)
    if not imgs:
        return torch.empty((0, 3, *out_size), dtype=torch.uint8, device=device)
    sizes = sizes_of(imgs)
    if boxes_for is not None:
        boxes, flip = boxes_for(sizes)  # type: ignore[operator]
        return resize_images(imgs, out_size, boxes=boxes, flip=flip, sizes=sizes)
    return resize_images(imgs, out_size, mode=mode, sizes=sizes)


def decode_ahead(
    jobs: Iterable[tuple[Any, Callable[[], Any]]],
    device: torch.device,
    stream: torch.cuda.Stream | None = None,
    *,
    ahead: int = 2,
    lanes: int = 1,
    lane: Callable[[Any], int] | None = None,
) -> Iterator[tuple[Any, Any]]:
    """Run each job's decode ``fn()`` on a thread of its own, ``ahead`` jobs ahead of
    the caller; yield ``(key, fn())`` in order. ``lanes`` threads: job ``key`` runs on
    thread ``lane(key) % lanes`` (a decoder each: which one decodes a job never depends
    on timing).

    ``jobs``: ``(key, fn)`` pairs; ``fn`` reads and decodes (e.g. :func:`decode_batch`:
    nvjpeg and the CPU decoder run without the GIL, so the caller's Python, such as the
    crop of the previous batch, runs meanwhile). Pulled from ``jobs`` on the caller's
    thread, so a ``jobs`` generator may use state the caller owns.

    On CUDA, ``fn`` runs with a decode stream of its thread's own current, where nothing
    else allocates: nvjpeg writes its output on its own stream, so memory it is given must
    not be memory a pending kernel still reads. ``stream`` (the caller's, where it uses
    the decoded tensors) waits for each decode before the item is yielded, and an
    item's tensors are kept until the work the caller queued on ``stream`` by the next
    resume has run. Closing the generator waits for the jobs in flight.
    """
    cuda = device.type == "cuda"
    local = threading.local()  # each worker thread's decode stream

    def run(fn: Callable[[], Any]) -> tuple[Any, Any]:
        if not cuda:
            return fn(), None
        dstream = getattr(local, "stream", None)
        if dstream is None:
            dstream = local.stream = torch.cuda.Stream(device)
        with torch.cuda.device(device), torch.cuda.stream(dstream):
            out = fn()
            done = torch.cuda.Event()
            done.record(dstream)
            return out, done

    todo = iter(jobs)
    pools = [
        ThreadPoolExecutor(1, thread_name_prefix=f"imgpack-decode-{k}")
        for k in range(max(1, lanes))
    ]
    inflight: collections.deque[tuple[Any, Future[Any]]] = collections.deque()
    held: collections.deque[tuple[torch.cuda.Event, Any]] = collections.deque()
    try:
        while True:
            while len(inflight) < ahead:
                job = next(todo, None)
                if job is None:
                    break
                k = 0 if lane is None else lane(job[0]) % len(pools)
                inflight.append((job[0], pools[k].submit(run, job[1])))
            if not inflight:
                return
            key, fut = inflight.popleft()
            out, done = fut.result()
            if done is not None and stream is not None:
                stream.wait_event(done)
            yield key, out
            if cuda and stream is not None:
                used = torch.cuda.Event()
                used.record(stream)
                held.append((used, out))
                while held and held[0][0].query():
                    held.popleft()
            del out
    finally:
        for pool in pools:
            pool.shutdown(wait=True, cancel_futures=True)
        if stream is not None:
            stream.synchronize()  # the caller's work on the decoded images has run
        held.clear()


__all__ = [
    "DECODE_MODES",
    "check_frames",
    "decode_ahead",
    "decode_batch",
    "decode_crop_cpu",
    "decode_resized",
    "decodes_on_cpu",
    "fit_boxes",
    "frame_size",
    "pad_batch",
    "resize_batch",
    "resize_images",
    "size_mismatch",
    "sizes_of",
]
