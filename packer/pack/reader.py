"""Open a pack as a tensordict ``@tensorclass``: :class:`ImagePack` and :func:`open_pack`."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import MemoryMappedTensor, tensorclass

from ..errors import InputError, PackFormatError, UsageError
from .files import check_files, check_tensordict_meta, read_manifest
from .index import is_set
from .schema import DATA_DIR, MANIFEST, Manifest
from .writer import check_data_meta

_TORCH_DTYPES = {"uint8": torch.uint8, "int64": torch.int64, "float32": torch.float32}


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
    def path(self) -> Path:
        return self._attr("_imgpack_path")

    def _attr(self, name: str) -> Any:
        try:
            return self.__dict__[name]
        except KeyError:
            raise AttributeError(
                "classes/class_to_idx/target_names/sources/manifest/path belong to a whole "
                "pack from packer.load(), not a slice"
            ) from None

    # tensordict's loaders read meta.json and unpickle ``other.pickle`` (allow_pickle
    # defaults to None, which loads it with a warning). These route every class-level
    # entry to the safe reader. ``_load_memmap`` is the hook TensorDict.load_memmap
    # calls for a registered class, so ``tensordict.load_memmap(PACK)`` is covered too.
    @classmethod
    def load_memmap(cls, prefix: str | os.PathLike[str], *args: Any, **kwargs: Any) -> ImagePack:
        """Open the pack at ``prefix`` as :func:`packer.load` does (nothing unpickled)."""
        _only_path("ImagePack.load_memmap", args, kwargs)
        return open_pack(prefix)

    @classmethod
    def load(cls, prefix: str | os.PathLike[str], *args: Any, **kwargs: Any) -> ImagePack:
        """Open the pack at ``prefix`` as :func:`packer.load` does (nothing unpickled)."""
        _only_path("ImagePack.load", args, kwargs)
        return open_pack(prefix)

    @classmethod
    def _load_memmap(cls, prefix: Any, metadata: Any = None, *args: Any, **kwargs: Any) -> Any:
        return open_pack(str(prefix))

    def load_memmap_(self, *args: Any, **kwargs: Any) -> Any:
        raise UsageError("load a pack with packer.load(path); loading into a pack is not offered")

    def load_(self, *args: Any, **kwargs: Any) -> Any:
        raise UsageError("load a pack with packer.load(path); loading into a pack is not offered")


# The pack's meta.json names this class as ``packer.pack.ImagePack`` (format.TD_TYPE),
# and tensordict finds a tensorclass by that name: it stays the public face of the
# package that defines it.
ImagePack.__module__ = "packer.pack"


def _refuse_unchecked(prefix: Any) -> None:
    """What tensordict's loaders call before reading a directory's ``meta.json``
    (:func:`_guard_tensordict`): a pack (a folder holding imgpack's manifest) whose
    ``meta.json`` is not exactly imgpack's is refused, since that file alone picks the
    class whose loader runs, and most unpickle ``other.pickle``. With imgpack's, the
    pack goes on to :meth:`ImagePack._load_memmap`, that is :func:`open_pack`. The
    ``_tensordict`` folder of a pack (which tensordict reads as a TensorDict) is loaded
    only after the pack's checks (:func:`check_files`: no pickle or other file, sizes as
    the manifest says) and with its ``meta.json`` as imgpack writes it."""
    if not isinstance(prefix, (str, os.PathLike)):
        return  # a member of a tensordict archive file, not a folder
    path = Path(prefix)
    if (path / MANIFEST).exists():
        check_tensordict_meta(path)
    elif path.name == DATA_DIR and (path.parent / MANIFEST).exists():
        m = read_manifest(path.parent)
        check_files(path.parent, m)
        check_data_meta(path.parent, m)


def _guard_tensordict() -> None:
    """Route every tensordict loader (``TensorDict.load_memmap``, ``tensordict.load_memmap``,
    ``load``, any tensorclass's ``load_memmap``) through :func:`_refuse_unchecked`: they
    all read a directory's ``meta.json`` with ``tensordict._base.serialization.
    _load_metadata`` (the tensorclass copies of the loader share that module's names).
    Installed once, when this module is imported; other folders load as before."""
    from tensordict._base import serialization

    read = serialization._load_metadata
    if getattr(read, "_imgpack_guard", False):
        return

    def _load_metadata(prefix: Any) -> Any:
        _refuse_unchecked(prefix)
        return read(prefix)

    _load_metadata._imgpack_guard = True  # type: ignore[attr-defined]
    _load_metadata._imgpack_unguarded = read  # type: ignore[attr-defined]
    serialization._load_metadata = _load_metadata


def _only_path(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    # tolerated: what would make tensordict's loader safe, or is what open_pack does anyway
    harmless = {"allow_pickle": False, "mode": "r", "device": None}
    extra = [k for k, v in kwargs.items() if harmless.get(k, object()) != v and v is not None]
    if args or extra or kwargs.get("allow_pickle") is True:
        raise UsageError(
            f"{name}(path) opens a pack as packer.load(path) does and takes no other "
            "options (a pack is read-only and never unpickled); move it with .to(device)"
        )


def open_pack(
    path: str | os.PathLike[str],
    manifest: Manifest | None = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | None = None,
) -> ImagePack:
    """Open the pack at ``path`` read-only, without running anything from it.

    ``path`` may be an object-storage URL (``s3://bucket/prefix``, gs://, az://) of a
    pack set: it opens through a local cache (:func:`packer.storage.remote.open_remote`;
    ``cache_dir``, default the user's cache folder, and ``cache_limit`` in bytes, apply
    to URLs only).

    Returns an :class:`ImagePack` (``len(pack)`` is N) whose ``images``
    (uint8 [N, 3, H, W], 0-255, RGB), ``labels`` (int64 [N]) and ``targets``
    (float32 [N, K], or None) are memory-mapped copy-on-write: reads come from the
    page cache, and in-place edits stay in this process. ``pack.classes``,
    ``pack.class_to_idx``, ``pack.target_names``, ``pack.sources`` and
    ``pack.manifest`` come from the manifest. Raises PackFormatError for a
    missing, damaged, untrusted or newer-format pack, and for labels or targets
    recorded with another dtype or shape (never cast).

    ``manifest``: one already read (and its files checked) by the caller, as
    ``verify`` does, so the pack is parsed and walked once.
    """
    if isinstance(path, str) and "://" in path:
        from ..storage.remote import open_remote  # a peer stage: object storage (issue 30)

        return open_remote(path, cache_dir, cache_limit)  # type: ignore[return-value]
    root = Path(path)
    if str(root).startswith(("s3:/", "gs:/", "az:/")) and not root.exists():
        from ..storage.url import redact  # never quote user info (issue 42.5)

        raise UsageError(
            f"{redact(str(root))}: looks like an object-storage URL folded by pathlib (its '//' became "
            "'/'); pass the URL as a str, e.g. packer.load('s3://bucket/prefix')"
        )
    if manifest is None and (root / ".imgpack-cache" / "url").is_file():
        # a set's folder in the object-storage cache (a DataLoader worker reopening a
        # PackDataset's path): open it as the set it caches, shards fetched on demand
        from ..storage.remote import reopen_cached

        return reopen_cached(root)  # type: ignore[return-value]
    if manifest is None and is_set(root) and not (root / MANIFEST).exists():
        from .packset import open_set  # a pack set (issue 29): a PackSet of its shards

        return open_set(root)  # type: ignore[return-value]
    if manifest is None:
        manifest = read_manifest(root)
        check_files(root, manifest)
    n = manifest.count
    tensors = {}
    for spec in manifest.fields:
        shape = (n if spec.rows is None else spec.rows, *spec.row_shape)
        dtype = _TORCH_DTYPES[spec.dtype]
        if shape[0] == 0:
            tensors[spec.name] = torch.empty(shape, dtype=dtype)
        else:
            tensors[spec.name] = MemoryMappedTensor.from_filename(
                root / DATA_DIR / spec.file, dtype, shape, mode="r"
            )
    from .kinds import kind_of

    return kind_of(manifest).open(root, manifest, tensors)


JPEG_MAX_SIDE = 65535  # a JPEG frame header's sides are 16-bit


def check_stored_sizes(sizes: np.ndarray, m: Manifest, root: Path) -> None:
    """A JPEG pack's stored (h, w) [N, 2], each as its build allows: 1 to ``max_side``
    (or 65535, a JPEG's most) a side, at most the build's ``max_pixels`` pixels. A
    decoder allocates what a JPEG's header says, and readers check each header against
    these before decoding, so this bounds every decode of the pack (a 2 KB file saying
    65000x65000 would ask for 12 GB). PackFormatError naming the first image outside."""
    if not len(sizes):
        return
    side = min(m.max_side or JPEG_MAX_SIDE, JPEG_MAX_SIDE)
    bad = ((sizes < 1) | (sizes > side)).any(1)
    inside = np.where(bad[:, None], 1, sizes)  # sides bounded: the product cannot overflow
    bad |= inside[:, 0] * inside[:, 1] > m.build.max_pixels
    if bad.any():
        i = int(bad.argmax())
        h, w = (int(v) for v in sizes[i])
        raise PackFormatError(
            f"{root}: image {i}: the pack gives its size as {w}x{h}, outside what its build "
            f"allows (sides 1 to {side}, at most {m.build.max_pixels:,} pixels); the pack is "
            "damaged or not from imgpack, refusing it"
        )


class JpegPack:
    """A pack of JPEG files (``imgpack build --store jpeg``), opened read-only.

    Fields (memory-mapped, read-only):
      jpeg: Tensor[total_bytes], uint8: every image's JPEG file, back to back.
      offsets, lengths: Tensor[N], int64: where image i's bytes are in ``jpeg``.
      sizes: Tensor[N, 2], int64: image i's (height, width), upright.
      labels: Tensor[N], int64; targets: Tensor[N, K] float32 or None.
    Plus ``classes``, ``class_to_idx``, ``target_names``, ``sources``, ``manifest``,
    ``path`` as :class:`ImagePack`. Stream it with
    ``PackLoader(pack, B, image_size=S)``; :meth:`decode` decodes a few images.
    The offsets are never trusted: :meth:`read` checks each one.
    """

    storage = "jpeg"

    def __init__(self, tensors: dict[str, torch.Tensor], manifest: Manifest, root: Path) -> None:
        self.jpeg = tensors["jpeg"]
        self.offsets = tensors["offsets"]
        self.lengths = tensors["lengths"]
        self.sizes = tensors["sizes"]
        self.labels = tensors["labels"]
        self.targets = tensors.get("targets")
        self.manifest = manifest
        self.path = root
        self.classes = list(manifest.classes)
        self.sources = list(manifest.sources)

    def __len__(self) -> int:
        return self.manifest.count

    @property
    def class_to_idx(self) -> dict[str, int]:
        return dict(self.manifest.class_to_idx)

    @property
    def target_names(self) -> list[str]:
        return list(self.manifest.targets)

    @property
    def images(self) -> torch.Tensor:
        raise UsageError(
            f"{self.path}: a JPEG pack stores compressed files, not an images tensor; "
            "stream it with PackLoader(pack, batch_size, image_size=S) or decode a few "
            "with pack.decode(indices)"
        )

    def read(self, indices: Any, check_ends: bool = False) -> list[torch.Tensor]:
        """The stored bytes of images ``indices`` (ints into the pack): uint8 [n_i] each,
        views of the mapped file. Raises PackFormatError naming the first image whose
        offset or length leaves the byte file, and with ``check_ends`` the first that
        does not end with a JPEG's end-of-image marker."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(idx) and (idx.min() < 0 or idx.max() >= len(self)):
            bad = int(idx[(idx < 0) | (idx >= len(self))][0])
            raise UsageError(f"image index {bad} is outside the pack of {len(self)} images")
        off = self.offsets.numpy()[idx]
        ln = self.lengths.numpy()[idx]
        total = self.jpeg.shape[0]
        bad = (off < 0) | (ln < 1) | (off > total) | (ln > total - np.clip(off, 0, total))
        if bad.any():
            k = int(bad.argmax())
            raise PackFormatError(
                f"{self.path}: image {int(idx[k])}: offset {int(off[k])} + length {int(ln[k])} "
                f"leaves the {total}-byte JPEG file; the pack is damaged, rebuild it"
            )
        # numpy slices of the mapping, then plain tensors: slicing the MemoryMappedTensor
        # subclass costs tens of microseconds per image, a batch of 256 milliseconds
        data = self._bytes()
        if check_ends and len(idx):
            # every stored JPEG ends with its EOI marker (nvjpeg decodes a truncated one
            # inside a batch without an error): two bytes per image, one gather
            end = off + ln
            bad = (ln < 4) | (data[np.maximum(end - 2, 0)] != 0xFF) | (data[end - 1] != 0xD9)
            if bad.any():
                from ..imaging.jpeg import truncated

                raise truncated(int(idx[int(bad.argmax())]))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # read-only mapping: never written
            return [torch.from_numpy(data[o : o + n]) for o, n in zip(off.tolist(), ln.tolist())]

    def _bytes(self) -> np.ndarray:
        arr = self.__dict__.get("_np")
        if arr is None:
            arr = self.jpeg.numpy() if self.jpeg.numel() else np.empty(0, np.uint8)
            self.__dict__["_np"] = arr
        return arr

    def decode(self, indices: Any, device: str | torch.device = "cpu") -> list[torch.Tensor]:
        """Decode images ``indices``: list of uint8 [3, h_i, w_i] in [0, 255] on ``device``."""
        from ..imaging.jpeg import decode_batch

        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        datas = self.read(idx, check_ends=True)  # checks the indices too
        return decode_batch(
            datas,
            device,
            indices=idx.tolist(),
            ends_checked=True,
            sizes=self.sizes.numpy()[idx],
        )


def read_class_map(source: str | os.PathLike[str]) -> list[str]:
    """The class names, in index order, of a class-map file, an existing pack or a pack
    set (``--classes FILE|PACK|SET``).

    ``source`` is a text file with one class name per line
    (:func:`packer.sources.classes.read_class_file`), or a pack directory (or its
    ``imgpack.json``) whose manifest's ``classes`` is reused. Only the manifest's JSON
    is read: nothing of the pack is unpickled or imported. Raises :class:`InputError`
    naming the file and the problem.
    """
    if isinstance(source, str) and "://" in source:
        from ..storage.remote import read_remote_class_map  # --classes s3://...

        return read_remote_class_map(source)
    path = Path(source)
    if path.is_dir() and is_set(path) and not (path / MANIFEST).exists():
        return _set_classes(path)
    if path.is_dir():
        return _pack_classes(path)
    if path.name == MANIFEST and path.exists():
        return _pack_classes(path.parent)
    from ..sources.classes import read_class_file  # the CSV/text reader, only when asked

    return read_class_file(path)


def _set_classes(root: Path) -> list[str]:
    """The class map of a pack set's index (``--classes SET``); InputError as a pack's."""
    from .index import read_index

    try:
        classes = list(read_index(root).classes)
    except PackFormatError as e:
        raise InputError(f"{e} (given as a class map)") from None
    if not classes:
        raise InputError(
            f"{root}: the set has no classes (built from a flat folder or integer labels); "
            "it cannot fix a class map"
        )
    return classes


def _pack_classes(root: Path) -> list[str]:
    from ..sources.common import control_char

    manifest = root / MANIFEST
    if not manifest.is_file():
        raise InputError(
            f"{root}: a folder but not an imgpack pack ({MANIFEST} is missing); give a pack "
            "or a text file with one class per line"
        )
    try:
        # format's reader: size-bounded, depth-guarded, the whole schema checked (class
        # names are distinct strings)
        classes = list(read_manifest(root).classes)
    except PackFormatError as e:
        raise InputError(f"{e} (given as a class map)") from None
    for i, c in enumerate(classes):
        bad = control_char(c)
        if bad is not None:
            raise InputError(
                f"{manifest}: class {i} {c!r} holds the control character {bad!r}; "
                "the pack's class map cannot be reused"
            )
    if not classes:
        raise InputError(
            f"{root}: the pack has no classes (built from a flat folder or integer labels); "
            "it cannot fix a class map"
        )
    return classes


_guard_tensordict()  # on import: see RELIABILITY.md, "Which tensordict calls are safe"
