"""The storage-kind interface and the :class:`Pack` protocol every pack class implements.

A storage kind is how a pack's images are stored; each is one class, in its own file
with its pack class (:mod:`~packer.pack.raw`, :mod:`~packer.pack.jpeg`), registered in
:mod:`~packer.pack.kinds`. A kind answers, for the manifests of its ``storage`` name:

* the format: ``fields(m)`` (its data files under ``_tensordict/``; labels and targets
  are every kind's and come after, ``Manifest.fields``), ``manifest_json(m)`` (the
  manifest fields it owns), ``describe(m)`` (what ``imgpack info`` adds for it),
  ``summary(count, shape, max_side)`` (a report's phrase for its images),
  ``shape_fits(shard, whole)`` (a shard's recorded shape against its set's);
* the build: ``check_options(config)``, ``gpu_build`` (the batched GPU path can make
  it), ``chunk_files`` (the workers write a file per chunk, joined by ``assemble``),
  ``row_bytes(shape)`` (a preallocated row's bytes, 0 for none), ``fingerprint(config)``
  (the options that name its chunks), ``cut(sizes, row_bytes, shard_size)`` (a set's
  shards), ``assemble(data_dir, parts)`` and ``stamp(m, written)``;
* reading: ``open(root, m, tensors)`` (the mapped files wrapped as a pack object),
  ``source_tensor(pack)``, ``stored_images(pack, rows)``, ``batch(pack, indices,
  device, crop)`` (one uint8 [B, 3, h, w] batch on a device);
* checking: ``verify(root, m, progress, threads)`` (``(ok, detail)``),
  ``same_as_source(pack, m, path, i)``, ``checked_view(root, m)``, ``block_hashes``
  (a downloaded data file's SHA-256 per block), ``check_index(shard, m)`` (its index
  files, if any), ``verify_reads`` (the data file each of verify's checks reads).

``decoded`` tells readers whether the kind's images have one stored size (raw rows) or
are decoded to a size the reader picks (``image_size=``); a decoded kind's manifest
records its layout version, byte count, ``max_side``, quality and the checksum of its
index files. No torch at import.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from .layout import DATA_DIR, FieldSpec

if TYPE_CHECKING:
    import torch

    from .schema import Manifest  # above the kinds: its fields are their answers

Progress = Callable[[int], None]


# What every pack and set answers, whatever its storage (issue 43.8): ImagePack,
# JpegPack and PackSet each define these, and ``len()``; ``dir()`` of each lists them
# with the few names of its own (its data fields and methods), not every method of
# the tensordict beneath (tensordict's methods still work on an ImagePack).
PACK_ATTRIBUTES = (
    "classes",
    "class_to_idx",
    "image_shape",
    "kind",
    "labels",
    "path",
    "sources",
    "storage",
    "target_names",
    "targets",
)


def pack_dir(obj: Any, own: tuple[str, ...]) -> list[str]:
    """``dir()`` of a pack or set: :data:`PACK_ATTRIBUTES`, the names ``own`` to its
    class, and the dunder names ``object`` gives (``__len__``, ``__class__``...)."""
    return sorted({*PACK_ATTRIBUTES, *own, *(n for n in object.__dir__(obj) if n[:2] == "__")})


@runtime_checkable
class Pack(Protocol):
    """What every pack object answers (:class:`~packer.pack.raw.ImagePack`,
    :class:`~packer.pack.jpeg.JpegPack`, :class:`~packer.storage.packset.PackSet`): its
    storage ``kind``, ``labels`` (int64 [N]), ``targets`` (float32 [N, K] or None),
    ``classes``, ``path`` and ``len()``. The rest of :data:`PACK_ATTRIBUTES` too."""

    @property
    def kind(self) -> StorageKind: ...

    @property
    def labels(self) -> torch.Tensor: ...

    @property
    def targets(self) -> torch.Tensor | None: ...

    @property
    def classes(self) -> list[str]: ...

    @property
    def path(self) -> Path: ...

    def __len__(self) -> int: ...


@dataclass
class Parts:
    """What a build hands its kind to assemble, in the work folder.

    ``rows``: the data file the workers wrote (raw: the rows, preallocated; JPEG: only a
    marker that the chunk files are not yet joined). ``chunk_file(k)``: chunk ``k``'s
    file (JPEG). ``done``: the journal's records by chunk. ``keep``: the kept images,
    ``skipped`` whether any was skipped. ``block``: images per checksum block."""

    rows: Path
    chunk_file: Callable[[int], Path]
    chunk_dir: Path
    done: Mapping[int, Mapping[str, Any]]
    keep: list[int]
    skipped: bool
    block: int
    row_bytes: int
    shas: list[str]
    clock: dict[str, float] = field(default_factory=dict)  # seconds per step, by name


class StorageKind:
    """One way of storing images; see the module's docstring for the interface."""

    name: ClassVar[str]
    decoded: ClassVar[bool]  # images decoded to a size the reader picks (no fixed row)
    gpu_build: ClassVar[bool]  # the batched GPU path (--device cuda) can build it
    chunk_files: ClassVar[bool]  # workers write a file per chunk, joined by assemble
    # the data file of a shard that each of verify's checks reads, by check name
    verify_reads: ClassVar[Mapping[str, str]]
    # how a semantic mask is stored beside this kind's images (packer.pack.dense):
    # "rows": uint8 [N, H, W] of the images' one size, or "png" bytes per image
    semantic_store: ClassVar[str] = "rows"

    def __repr__(self) -> str:
        return f"<storage kind {self.name!r}>"

    # -- the format ---------------------------------------------------------------
    def fields(self, m: Manifest) -> tuple[FieldSpec, ...]:
        raise NotImplementedError

    def manifest_json(self, m: Manifest) -> dict[str, Any]:
        """The manifest's top-level fields this kind owns (none by default)."""
        return {}

    def describe(self, m: Manifest) -> dict[str, Any]:
        """What ``imgpack info --json`` adds for this kind (nothing by default)."""
        return {}

    def summary(self, count: int, image_shape: Sequence[int], max_side: int | None) -> str:
        """A report's phrase for a pack's images: ``36 images of [3, 224, 224]``."""
        raise NotImplementedError

    def shape_fits(self, shard: Sequence[int], whole: Sequence[int]) -> bool:
        """Whether a shard's recorded ``image_shape`` fits its set's."""
        raise NotImplementedError

    # -- the build ----------------------------------------------------------------
    def check_options(self, config: Any) -> None:
        """UsageError for build options (a ``BuildConfig``) this kind cannot honour."""

    def row_bytes(self, shape: Sequence[int]) -> int:
        """Bytes of one preallocated row of ``shape`` (0: the kind has none)."""
        return 0

    def fingerprint(self, config: Any) -> list[Any] | None:
        """The build options that name this kind's chunks, or None (no bytes added, so
        raw builds keep their fingerprint)."""
        return None

    def stored_frames(
        self, data_dir: Path, count: int, image_shape: Sequence[int], resize: str
    ) -> tuple[str, list[tuple[int, int]]]:
        """How each of the ``count`` assembled images in ``data_dir`` was made from its
        source: the resize mode (``crop``, ``stretch``, ``pad`` as
        :class:`~packer.imaging.decode.ResizeSpec` fits) and each stored image's (h, w).
        The build moves dense targets by it (:mod:`packer.builder.dense`)."""
        raise NotImplementedError

    def cut(self, sizes: list[int], row_bytes: int, shard_size: int) -> list[tuple[int, int]]:
        """``[start, end)`` of each shard of a set over inputs of ``sizes`` bytes."""
        raise NotImplementedError

    def assemble(self, data_dir: Path, parts: Parts) -> dict[str, Any]:
        """Write the data files from the workers' output; returns at least ``shas``."""
        raise NotImplementedError

    def stamp(self, m: Manifest, written: Mapping[str, Any]) -> Manifest:
        """``m`` with the fields this kind owns set from what :meth:`assemble` wrote."""
        return m

    # -- reading ------------------------------------------------------------------
    def open(
        self,
        root: Path,
        m: Manifest,
        tensors: dict[str, torch.Tensor],
        max_pixels: int | None = None,
    ) -> Any:
        """The pack object over ``tensors``; ``max_pixels``: the reader's bound on a
        stored image (kinds that decode; see ``jpeg.check_stored_sizes``)."""
        raise NotImplementedError

    def source_tensor(self, pack: Any) -> torch.Tensor:
        """The mapped tensor a loader reads images from."""
        raise NotImplementedError

    def stored_images(self, pack: Any, rows: Sequence[int]) -> list[torch.Tensor]:
        """Images ``rows`` of ``pack`` as stored, uint8 [3, h, w] each, on the CPU."""
        raise NotImplementedError

    def batch(
        self, pack: Any, indices: Any, device: str | torch.device = "cpu", crop: Any = None
    ) -> torch.Tensor:
        raise NotImplementedError

    # -- checking -----------------------------------------------------------------
    def verify(
        self, root: Path, m: Manifest, progress: Progress | None, threads: int
    ) -> tuple[bool, str]:
        raise NotImplementedError

    def same_as_source(self, pack: Any, m: Manifest, path: str, i: int) -> bool:
        raise NotImplementedError

    def checked_view(self, root: Path, m: Manifest) -> Any:
        """What the integrity checks of ``verify`` read of a pack whose files
        :func:`~packer.pack.files.check_files` passed (``same_as_source``,
        ``check_decodes``): the pack itself, opened with its kind's checks."""
        return self.open(root, m, map_fields(root, m))

    def block_hashes(self, path: Path, m: Manifest, shard: Path) -> list[str]:
        """SHA-256 of each checksum block of the data file ``path`` of the shard at
        ``shard`` (its size already checked against the manifest)."""
        raise NotImplementedError

    def check_index(self, shard: Path, m: Manifest) -> str | None:
        """What is wrong with the index files in ``shard`` (none by default)."""
        return None


def map_fields(root: Path, m: Manifest) -> dict[str, torch.Tensor]:
    """The pack's fields (``m.fields``) at ``root``, memory-mapped read-only with the
    shapes and dtypes the manifest gives (an empty field is an empty tensor): what
    :meth:`StorageKind.open` wraps. ``m`` and the files were checked by the caller
    (:func:`~packer.pack.files.check_files`). Imports torch and tensordict."""
    import torch
    from tensordict import MemoryMappedTensor

    dtypes = {"uint8": torch.uint8, "int64": torch.int64, "float32": torch.float32}
    tensors = {}
    for spec in m.fields:
        shape = (m.count if spec.rows is None else spec.rows, *spec.row_shape)
        dtype = dtypes[spec.dtype]
        if shape[0] == 0:
            tensors[spec.name] = torch.empty(shape, dtype=dtype)
        else:
            tensors[spec.name] = MemoryMappedTensor.from_filename(
                root / DATA_DIR / spec.file, dtype, shape, mode="r"
            )
    return tensors
