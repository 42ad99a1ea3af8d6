"""The raw kind: uint8 rows [N, 3, H, W] of one size, and its pack class
:class:`ImagePack` (a tensordict ``@tensorclass``).

:class:`RawKind` needs no torch at import (``imgpack info`` and ``verify --no-speed``
use it on a raw pack); :class:`ImagePack` is made the first time it is asked for, so
torch and tensordict load only when a pack is opened.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from .._lazy import lazy_getattr
from ..errors import DecodeError, PackFormatError, UsageError
from ..imaging.limits import DEFAULT_MAX_PIXELS
from .hashing import digest, hash_blocks, image_bytes
from .kind import Parts, Progress, StorageKind, pack_dir
from .labels import check_label_arrays
from .layout import DATA_DIR, IMAGES_FILE, LABELS_FILE, FieldSpec, Layout

if TYPE_CHECKING:
    import torch

    from .schema import Manifest  # above the kinds: its fields are their answers


class RawKind(StorageKind):
    """uint8 rows [N, 3, H, W] of one size, C-order, in ``images.memmap``."""

    name = "raw"
    decoded = False
    gpu_build = True
    chunk_files = False
    verify_reads: ClassVar[Mapping[str, str]] = {
        "images": f"{DATA_DIR}/{IMAGES_FILE}",
        "labels": f"{DATA_DIR}/{LABELS_FILE}",
    }

    def fields(self, m: Manifest) -> tuple[FieldSpec, ...]:
        return (FieldSpec("images", IMAGES_FILE, "uint8", m.image_shape),)

    def summary(self, count: int, image_shape: Sequence[int], max_side: int | None) -> str:
        return f"{count} images of {list(image_shape)}"

    def shape_fits(self, shard: Sequence[int], whole: Sequence[int]) -> bool:
        return tuple(shard) == tuple(whole)  # every shard's rows have the set's one size

    def check_options(self, config: Any) -> None:
        if config.max_side is not None:
            raise UsageError(
                "BuildConfig.max_side bounds stored JPEGs; use it with BuildConfig.store jpeg",
                field="BuildConfig.max_side",
            )

    def row_bytes(self, shape: Sequence[int]) -> int:
        return image_bytes(shape)

    def stored_frames(
        self, data_dir: Path, count: int, image_shape: Sequence[int], resize: str
    ) -> tuple[str, list[tuple[int, int]]]:
        """Every row is the build's ``resize`` of its source to the one size."""
        return resize, [(int(image_shape[1]), int(image_shape[2]))] * count

    def cut(self, sizes: list[int], row_bytes: int, shard_size: int) -> list[tuple[int, int]]:
        """``shard_size // row_bytes`` images a shard (at least one)."""
        n = len(sizes)
        per = max(1, shard_size // max(row_bytes, 1))
        return [(a, min(a + per, n)) for a in range(0, n, per)]

    def assemble(self, data_dir: Path, parts: Parts) -> dict[str, Any]:
        """The rows file fsynced, then renamed into place, or its kept rows copied
        (:func:`compact_rows`) when images were skipped. Restartable: with the rows file
        gone (an earlier run compacted it), the compacted file is hashed again."""
        images = data_dir / IMAGES_FILE
        shas, row, block = parts.shas, parts.row_bytes, parts.block
        if parts.rows.exists():
            t = time.perf_counter()
            fd = os.open(parts.rows, os.O_RDONLY)
            try:
                os.fsync(fd)  # all rows durable before anything depends on them
            finally:
                os.close(fd)
            parts.clock["fsync_rows"] = time.perf_counter() - t
            if parts.skipped:
                shas = compact_rows(parts.rows, images, parts.keep, row, block)
                os.remove(parts.rows)
            else:
                os.replace(parts.rows, images)
        elif parts.skipped:  # compacted by an earlier run that stopped before the manifest
            size = os.path.getsize(images)
            shas = hash_blocks(images, row * block, -(-size // (row * block)))
        return {"shas": shas}

    def open(
        self,
        root: Path,
        m: Manifest,
        tensors: dict[str, torch.Tensor],
        max_pixels: int | None = None,
    ) -> Any:
        if not {"images", "labels"} <= set(tensors) <= {"images", "labels", "targets"}:
            raise PackFormatError(
                f"{root}: holds fields {sorted(tensors)} this imgpack cannot open; upgrade imgpack"
            )
        # the manifest was checked; this guards the mapping itself against a future slip
        check_label_arrays(tensors["labels"], tensors.get("targets"), where=str(root))
        pack = image_pack_class()(
            images=tensors["images"],
            labels=tensors["labels"],
            targets=tensors.get("targets"),
            batch_size=[m.count],
        )
        pack.__dict__["_imgpack_manifest"] = m
        pack.__dict__["_imgpack_path"] = root
        pack.__dict__["_imgpack_classes"] = list(m.classes)
        pack.__dict__["_imgpack_sources"] = list(m.sources)
        return pack

    def source_tensor(self, pack: Any) -> torch.Tensor:
        return pack.images

    def stored_images(self, pack: Any, rows: Sequence[int]) -> list[torch.Tensor]:
        import torch

        return list(pack.images[torch.as_tensor(rows, dtype=torch.int64)].clone())

    def verify(
        self, root: Path, m: Manifest, progress: Progress | None, threads: int
    ) -> tuple[bool, str]:
        """Each block of ``block_rows`` rows hashed (on ``threads`` threads) against the
        manifest's SHA-256; a mismatch names the block, its images and sources."""
        ck = m.checksums
        block, want, n = ck.block_rows, ck.images, m.count
        if block < 1 or len(want) != (n + block - 1) // block:
            if progress:
                progress(n)
            return False, (
                f"manifest lists {len(want)} checksums for {n} images in "
                f"blocks of {block}; the manifest is damaged"
            )

        def done(k: int) -> None:
            if progress:
                progress(min(n, (k + 1) * block) - k * block)

        got = hash_blocks(Layout(root).images, m.image_bytes * block, len(want), done, threads)
        bad: list[str] = []
        for k, (sha, expect) in enumerate(zip(got, want)):
            if sha != expect:
                lo, hi = k * block, min(n, (k + 1) * block)
                names = ", ".join(m.sources[lo : min(hi, lo + 3)])
                more = f" and {hi - lo - 3} more" if hi - lo > 3 else ""
                bad.append(f"block {k} (images {lo}-{hi - 1}: {names}{more})")
        if bad:
            return False, (
                f"checksum mismatch in {len(bad)} of {len(want)} blocks: "
                + "; ".join(bad[:5])
                + ("; ..." if len(bad) > 5 else "")
                + ". The image data changed since the build; rebuild the pack"
            )
        return True, f"{n} images, {len(want)} blocks, SHA-256 match"

    def block_hashes(self, path: Path, m: Manifest, shard: Path) -> list[str]:
        return hash_blocks(path, m.image_bytes * m.checksums.block_rows, len(m.checksums.images))

    def checked_view(self, root: Path, m: Manifest) -> Any:
        """The rows as a read-only numpy map (``.images`` [N, 3, H, W]): all that
        ``same_as_source`` reads, so ``imgpack verify --no-speed`` needs no torch.
        The files' sizes were checked against the manifest."""
        rows: np.ndarray = np.empty((0, *m.image_shape), np.uint8)
        if m.count:
            shape = (m.count, *m.image_shape)
            rows = np.memmap(Layout(root).images, np.uint8, "r", shape=shape)
        return RawRows(rows)

    def same_as_source(self, pack: Any, m: Manifest, path: str, i: int) -> bool:
        """The source re-decoded exactly as the build did gives row ``i``'s pixels
        (``pack``: an :class:`ImagePack` or a :class:`RawRows`)."""
        from ..imaging.decode import ResizeSpec, decode

        # the reader's bound on a source's pixels (reader.read_max_pixels(None), the
        # default); the pack's own figure only lowers it
        spec = ResizeSpec(m.width, m.height, m.resize, min(m.build.max_pixels, DEFAULT_MAX_PIXELS))
        try:
            return np.array_equal(decode(path, spec), np.asarray(pack.images[i]))
        except DecodeError:
            return False

    def batch(
        self, pack: Any, indices: Any, device: str | torch.device = "cpu", crop: Any = None
    ) -> torch.Tensor:
        """Rows ``indices`` uint8 [B, 3, H, W] on ``device``: gathered (a memcpy per
        row) into pinned memory for CUDA, then copied without blocking the host."""
        import torch

        if crop is not None:
            raise UsageError("a raw pack's rows have the size it was built with; no crop")
        dev = torch.device(device)
        idx = np.asarray(indices, dtype=np.intp).reshape(-1)
        src = pack.images
        out = torch.empty(
            (len(idx), *src.shape[1:]), dtype=torch.uint8, pin_memory=dev.type == "cuda"
        )
        if len(idx):
            np.take(src.numpy(), idx, 0, out.numpy(), "raise")
        return out if dev.type == "cpu" else out.to(dev, non_blocking=True)


RAW = RawKind()


@dataclass(frozen=True)
class RawRows:
    """A raw pack's rows mapped with numpy (:meth:`RawKind.checked_view`)."""

    images: np.ndarray


def compact_rows(rows: Path, out_path: Path, keep: list[int], row: int, block: int) -> list[str]:
    """Copy the kept rows of ``rows``, in order, into ``out_path``; per-block checksums.

    Restartable: the source file is untouched until the copy is complete."""
    shas: list[str] = []
    tmp = out_path.with_name(out_path.name + ".tmp")
    with open(rows, "rb") as src, open(tmp, "wb") as out:
        for b in range(0, len(keep), block):
            buf = bytearray()
            for i in keep[b : b + block]:
                src.seek(i * row)
                buf += src.read(row)
            out.write(buf)
            shas.append(digest(buf))
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, out_path)
    return shas


# the tensordict names an ImagePack's dir() keeps (the ones a user of a pack reaches for)
_TENSORDICT_NAMES = ("apply", "batch_size", "clone", "cpu", "cuda", "device", "numel", "to")


def _only_path(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    # tolerated: what would make tensordict's loader safe, or is what open_pack does anyway
    harmless = {"allow_pickle": False, "mode": "r", "device": None}
    extra = [k for k, v in kwargs.items() if harmless.get(k, object()) != v and v is not None]
    if args or extra or kwargs.get("allow_pickle") is True:
        raise UsageError(
            f"{name}(path) opens a pack as packer.load(path) does and takes no other "
            "options (a pack is read-only and never unpickled); move it with .to(device)"
        )


# The reader (packer.pack.reader) sits above the kinds: it opens a pack through its kind.
# ImagePack's class-level loaders open one as the reader does, so the reader hands its
# open_pack down here as it loads. ImagePack is handed out through the reader
# (packer.ImagePack, packer.pack.ImagePack, and tensordict by way of packer.pack.guard), so
# the slot is filled before a loader can run.
_READER: list[Any] = []


def set_reader(open_pack: Any) -> None:
    """Called once by :mod:`packer.pack.reader` with its ``open_pack``."""
    _READER[:] = [open_pack]


def _open(prefix: Any) -> Any:
    if not _READER:
        raise UsageError("open a pack with packer.load(path) (packer.pack.reader is not loaded)")
    return _READER[0](prefix)


@functools.cache
def image_pack_class() -> type:
    """The :class:`ImagePack` tensorclass, defined on first use (torch, tensordict)."""
    from tensordict import tensorclass

    @tensorclass
    class ImagePack:
        """A packed image dataset: N images of one size, with labels and optional targets.

        Fields (memory-mapped, read-only: in-place edits stay in this process's memory):
          images: Tensor[N, 3, H, W], uint8 in [0, 255], RGB.
          labels: Tensor[N], int64; class index into ``classes``, or -1 for unlabeled
            (with no ``classes``: integer labels from a table, or -1 for a flat folder).
          targets: Tensor[N, K], float32, any finite values: the ``--targets`` columns of
            a label table, in ``target_names`` order; None for a pack without targets.
        Attributes of a pack from :func:`packer.load` (not carried by slices):
          classes: list[str], class_to_idx: dict[str, int] (name -> label index),
          target_names: list[str] (``[]`` without targets), sources: list[str] (relative
          source path of each image), manifest: :class:`packer.pack.schema.Manifest`, path: Path.
        Of any pack or slice: image_shape ((3, H, W)), storage (``"raw"``), kind
        (:class:`RawKind`), ``len()``. A JPEG pack and a pack set answer the same names
        (:data:`~packer.pack.kind.PACK_ATTRIBUTES`, the :class:`~packer.pack.kind.Pack`
        protocol).

        ``ImagePack.load_memmap(path)`` and ``ImagePack.load(path)`` are
        :func:`packer.load`: tensordict's own loader would unpickle files planted in
        the pack, so the class's loaders never reach it.
        """

        images: torch.Tensor
        labels: torch.Tensor
        targets: torch.Tensor | None = None

        @property
        def classes(self) -> list[str]:
            return self._attr("_imgpack_classes")

        @property
        def class_to_idx(self) -> dict[str, int]:
            """Class name -> label index, as ``torchvision.datasets.ImageFolder.class_to_idx``."""
            return dict(self.manifest.class_to_idx)

        @property
        def target_names(self) -> list[str]:
            """Names of the ``targets`` columns, in order; ``[]`` for a pack without targets."""
            return list(self.manifest.targets)

        @property
        def sources(self) -> list[str]:
            return self._attr("_imgpack_sources")

        @property
        def manifest(self) -> Manifest:
            return self._attr("_imgpack_manifest")

        @property
        def image_shape(self) -> tuple[int, int, int]:
            """(3, H, W) of every image, as a :class:`PackSet`'s."""
            c, h, w = (int(v) for v in self.images.shape[1:])
            return (c, h, w)

        @property
        def kind(self) -> RawKind:
            """The storage kind: :class:`RawKind`."""
            return RAW

        @property
        def storage(self) -> str:
            """How images are stored: ``"raw"`` rows (a JPEG pack's is ``"jpeg"``)."""
            return RAW.name

        def __dir__(self) -> list[str]:
            own = ("images", "manifest", "load", "load_memmap", *_TENSORDICT_NAMES)
            return pack_dir(self, own)

        @property
        def path(self) -> Path:
            return self._attr("_imgpack_path")

        def _attr(self, name: str) -> Any:
            try:
                return self.__dict__[name]
            except KeyError:
                raise AttributeError(
                    "classes/class_to_idx/target_names/sources/manifest/path belong to a "
                    "whole pack from packer.load(), not a slice"
                ) from None

        # tensordict's loaders read meta.json and unpickle ``other.pickle`` (allow_pickle
        # defaults to None, which loads it with a warning). These route every class-level
        # entry to the safe reader. ``_load_memmap`` is the hook TensorDict.load_memmap
        # calls for a registered class, so ``tensordict.load_memmap(PACK)`` is covered too.
        @classmethod
        def load_memmap(cls, prefix: str | os.PathLike[str], *args: Any, **kwargs: Any) -> Any:
            """Open the pack at ``prefix`` as :func:`packer.load` does (nothing unpickled)."""
            _only_path("ImagePack.load_memmap", args, kwargs)
            return _open(prefix)

        @classmethod
        def load(cls, prefix: str | os.PathLike[str], *args: Any, **kwargs: Any) -> Any:
            """Open the pack at ``prefix`` as :func:`packer.load` does (nothing unpickled)."""
            _only_path("ImagePack.load", args, kwargs)
            return _open(prefix)

        @classmethod
        def _load_memmap(cls, prefix: Any, metadata: Any = None, *args: Any, **kwargs: Any) -> Any:
            return _open(str(prefix))

        def load_memmap_(self, *args: Any, **kwargs: Any) -> Any:
            raise UsageError(
                "load a pack with packer.load(path); loading into a pack is not offered"
            )

        def load_(self, *args: Any, **kwargs: Any) -> Any:
            raise UsageError(
                "load a pack with packer.load(path); loading into a pack is not offered"
            )

    # The pack's meta.json names this class as ``packer.pack.ImagePack`` (schema.TD_TYPE),
    # and tensordict (and pickle) find it by that name: it stays the public face of the
    # package, which hands out this one class.
    ImagePack.__module__ = "packer.pack"
    ImagePack.__qualname__ = "ImagePack"
    return ImagePack


# ImagePack is a tensorclass: torch and tensordict load only when it is asked for
__getattr__ = lazy_getattr(__name__, {"ImagePack": image_pack_class})
