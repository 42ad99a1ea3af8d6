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
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from ..errors import PackFormatError
from .transforms import (
    CenterCrop,
    Compose,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    check_boxes,
    resized_crop,
)

# eval crop: the centre ``CROP_FRACTION`` of the shorter side, as Resize(S/0.875) +
# CenterCrop(S) (torchvision's ImageNet recipe: 224 of 256)
CROP_FRACTION = 0.875


def _rgb_mode():  # -> ImageReadMode.RGB, imported only when decoding
    from torchvision.io import ImageReadMode

    return ImageReadMode.RGB


_WARM: list[bool] = []  # import_decoders has run in this process


def import_decoders(device: torch.device) -> None:
    """Import what decoding a JPEG pack's batch imports, on the calling thread: the
    loader calls it before its threads start, so no gather or decode thread runs an
    import (an import holds the module's lock; garbage collection inside it could run
    an old loader's finalizer while other threads wait for that lock). Pillow and
    torchvision import parts of themselves on first use, so one tiny JPEG is decoded
    and cropped both CPU ways here, once per process."""
    from . import transforms

    if device.type == "cuda":
        transforms._triton()  # resize_images' kernels
    if _WARM:
        return
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (16, 16), (90, 120, 150)).save(buf, "JPEG")
    data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
    out = np.empty((3, 8, 8), np.uint8)
    decode_crop_cpu(data, -1, (16, 16), (0, 0, 16, 16), True, out)
    resize_images(decode_batch([data], sizes=[(16, 16)]), (8, 8), mode="crop")
    _WARM.append(True)


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

    The decode is the batched CPU path's (``torchvision.io.decode_jpeg``: libjpeg-turbo,
    a damaged file raises); only the box is copied out and resampled, by Pillow's
    antialiased bilinear (the triangle filter :func:`packer.transforms.resized_crop`
    uses: the same pixels within rounding, ±1-2/255). Both run in C without the GIL.
    Raises PackFormatError naming ``index``.
    """
    from PIL import Image

    from .decode import store_into

    check_frames([data], [index], [hw])
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
    CPU yes (only each box resampled: 2.5x the padded batch's crop), on CUDA no
    (nvjpeg). Splitting a CUDA batch between both was measured and dropped
    (docs/BENCHMARKS.md, "Who decodes"): the CPU threads' Python starves a training
    loop of the GIL.
    """
    return decode == "cpu" or (decode == "auto" and device.type != "cuda")


def pad_batch(images: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack variable-size images into one zero-padded batch.

    ``images``: Tensor[3, h_i, w_i] uint8, all on one device. Returns the batch
    uint8 [B, 3, Hmax, Wmax] (image i in its top-left corner, zeros elsewhere) and
    the sizes int64 [B, 2] (h_i, w_i) on the CPU.
    """
    sizes = torch.tensor([[int(x.shape[1]), int(x.shape[2])] for x in images], dtype=torch.int64)
    if not len(images):
        return torch.empty((0, 3, 1, 1), dtype=torch.uint8), sizes.reshape(0, 2)
    hmax, wmax = (int(v) for v in sizes.max(0).values)
    out = images[0].new_zeros((len(images), 3, hmax, wmax))
    for i, x in enumerate(images):
        out[i, :, : x.shape[1], : x.shape[2]] = x
    return out, sizes


def fit_boxes(
    sizes: torch.Tensor | np.ndarray,
    out_size: tuple[int, int],
    mode: str = "crop",
    fraction: float = 1.0,
) -> torch.Tensor:
    """Per-image boxes int64 [B, 4] (top, left, height, width) inside each image.

    ``sizes``: int [B, 2] (h, w) per image. ``out_size``: (height, width) the box is
    resized to. ``mode``: "crop" = the centred box with the output's aspect, the
    largest that fits, scaled by ``fraction`` (1.0: build's ``--resize crop``;
    :data:`CROP_FRACTION`: the eval centre crop); "stretch" = the whole image.
    """
    s = np.asarray(sizes, dtype=np.int64).reshape(-1, 2)
    h, w = s[:, 0].astype(np.float64), s[:, 1].astype(np.float64)
    oh, ow = out_size
    if mode == "stretch":
        z = np.zeros(len(s), dtype=np.int64)
        return torch.from_numpy(np.stack([z, z, s[:, 0], s[:, 1]], 1))
    if mode != "crop":
        raise ValueError(f"fit_boxes: mode must be 'crop' or 'stretch', not {mode!r}")
    scale = np.maximum(ow / w, oh / h)
    bw = np.clip(np.round(np.minimum(w, ow / scale) * fraction), 1, w).astype(np.int64)
    bh = np.clip(np.round(np.minimum(h, oh / scale) * fraction), 1, h).astype(np.int64)
    top = (s[:, 0] - bh) // 2
    left = (s[:, 1] - bw) // 2
    return torch.from_numpy(np.stack([top, left, bh, bw], 1))


def _pad_fit(hw: tuple[int, int], out_size: tuple[int, int]) -> tuple[int, int]:
    """(h, w) of an image letterboxed into ``out_size``: the CPU build's own rule."""
    from .decode import ResizeSpec, _scaled_size

    w, h = _scaled_size(hw[1], hw[0], ResizeSpec(out_size[1], out_size[0], "pad"))
    return h, w


def resize_batch(
    images: torch.Tensor,
    sizes: torch.Tensor,
    out_size: tuple[int, int],
    *,
    boxes: torch.Tensor | None = None,
    mode: str = "crop",
    flip: torch.Tensor | None = None,
) -> torch.Tensor:
    """Crop/resize a padded batch to ``out_size`` in batched calls.

    ``images``: uint8 [B, 3, Hmax, Wmax] from :func:`pad_batch`; ``sizes`` int64 [B, 2]
    (h, w) of each image's valid region. ``boxes``: int64 [B, 4] inside each image
    (e.g. RandomResizedCrop.sample_boxes); else ``mode`` "crop"/"stretch" boxes of
    :func:`fit_boxes`, or "pad" (whole image fitted inside, centred on black: one
    batched call per distinct fitted size). Returns uint8 [B, 3, *out_size].
    """
    if boxes is not None or mode != "pad":
        if boxes is None:
            boxes = fit_boxes(sizes, out_size, mode)
        return resized_crop(images, boxes, out_size, flip=flip)
    b = images.shape[0]
    out = images.new_zeros((b, 3, *out_size))
    fits = [_pad_fit((int(h), int(w)), out_size) for h, w in sizes.tolist()]
    groups: dict[tuple[int, int], list[int]] = {}
    for i, f in enumerate(fits):
        groups.setdefault(f, []).append(i)
    oh, ow = out_size
    for (nh, nw), rows in groups.items():
        idx = torch.tensor(rows, dtype=torch.int64)
        sub = images.index_select(0, idx.to(images.device))
        whole = torch.zeros((len(rows), 4), dtype=torch.int64)
        whole[:, 2:] = sizes[idx]
        part = resized_crop(sub, whole, (nh, nw))
        top, left = (oh - nh) // 2, (ow - nw) // 2
        out[idx.to(out.device), :, top : top + nh, left : left + nw] = part
    if flip is not None:
        mask = flip.to(out.device, non_blocking=True)[:, None, None, None]
        out = torch.where(mask, out.flip(-1), out)
    return out


def sizes_of(images: Sequence[torch.Tensor]) -> torch.Tensor:
    """int64 [B, 2] (h, w) of images uint8 [3, h_i, w_i], on the CPU."""
    return torch.tensor([x.shape[1:] for x in images], dtype=torch.int64).reshape(-1, 2)


def resize_images(
    images: Sequence[torch.Tensor],
    out_size: tuple[int, int],
    *,
    boxes: torch.Tensor | None = None,
    mode: str = "crop",
    flip: torch.Tensor | None = None,
    sizes: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`resize_batch` of a list of images of different sizes, uint8 [3, h_i, w_i].

    On CUDA with Triton (``mode`` "crop"/"stretch" or ``boxes``) one kernel reads every
    image where it lies, through a table of addresses: no padded batch is made or
    copied. Otherwise (the CPU, "pad") the images are padded first. Same result either
    way (the kernels' rounding: at most 1/255 apart). ``sizes``: their (h, w), if known.
    """
    if sizes is None:
        sizes = sizes_of(images)
    n = len(images)
    dev = images[0].device if n else torch.device("cpu")
    if boxes is None and mode != "pad":
        boxes = fit_boxes(sizes, out_size, mode)
    if boxes is None or not n:
        return resize_batch(*pad_batch(images), out_size, mode=mode, flip=flip)
    s = sizes.numpy()
    bn = boxes.to(torch.int64).numpy()
    check_boxes(bn, s)  # against each image, not the padded batch
    _, _, bh, bw = bn.T
    oh, ow = out_size
    scale = (float(bh.max()) / oh, float(bw.max()) / ow)
    kernels = _ragged_kernels(dev)
    if kernels is not None and kernels.fits(scale):
        table = np.empty((n, 8), dtype=np.int64)
        for i, x in enumerate(images):
            if not x.is_contiguous() or x.shape[0] != 3 or x.device != dev:
                raise ValueError(f"image {i} must be a contiguous uint8 [3, H, W] on {dev}")
            table[i, 0] = x.data_ptr()
        table[:, 1:5] = bn
        table[:, 5] = 0 if flip is None else flip.reshape(n).cpu().numpy()
        table[:, 6:] = s
        t = torch.from_numpy(table).pin_memory().to(dev, non_blocking=True)
        return kernels.resample_ragged(t, 3, oh, ow, scale, dev)
    return resize_batch(*pad_batch(images), out_size, boxes=boxes, flip=flip)


def _ragged_kernels(device: torch.device):  # -> module | None
    from .transforms import _triton

    return _triton() if device.type == "cuda" else None


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
) -> Iterator[tuple[Any, Any]]:
    """Run each job's decode ``fn()`` on a thread of its own, ``ahead`` jobs ahead of
    the caller; yield ``(key, fn())`` in order.

    ``jobs``: ``(key, fn)`` pairs; ``fn`` reads and decodes (e.g. :func:`decode_batch`:
    nvjpeg and the CPU decoder run without the GIL, so the caller's Python, such as the
    crop of the previous batch, runs meanwhile). Pulled from ``jobs`` on the caller's
    thread, so a ``jobs`` generator may use state the caller owns.

    On CUDA, ``fn`` runs with a decode stream of its own current, where nothing else
    allocates: nvjpeg writes its output on its own stream, so memory it is given must
    not be memory a pending kernel still reads. ``stream`` (the caller's, where it uses
    the decoded tensors) waits for each decode before the item is yielded, and an
    item's tensors are kept until the work the caller queued on ``stream`` by the next
    resume has run. Closing the generator waits for the jobs in flight.
    """
    cuda = device.type == "cuda"
    dstream = torch.cuda.Stream(device) if cuda else None

    def run(fn: Callable[[], Any]) -> tuple[Any, Any]:
        if not cuda:
            return fn(), None
        with torch.cuda.device(device), torch.cuda.stream(dstream):
            out = fn()
            done = torch.cuda.Event()
            done.record(dstream)
            return out, done

    todo = iter(jobs)
    pool = ThreadPoolExecutor(1, thread_name_prefix="imgpack-decode")
    inflight: collections.deque[tuple[Any, Future[Any]]] = collections.deque()
    held: collections.deque[tuple[torch.cuda.Event, Any]] = collections.deque()
    try:
        while True:
            while len(inflight) < ahead:
                job = next(todo, None)
                if job is None:
                    break
                inflight.append((job[0], pool.submit(run, job[1])))
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
        pool.shutdown(wait=True, cancel_futures=True)
        if stream is not None:
            stream.synchronize()  # the caller's work on the decoded images has run
        held.clear()


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


__all__ = [
    "CROP_FRACTION",
    "DECODE_MODES",
    "JpegCrop",
    "check_frames",
    "crop_for",
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
