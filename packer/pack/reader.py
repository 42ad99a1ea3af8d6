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
from ..imaging.decode import DEFAULT_MAX_PIXELS
from .files import check_files, folder_kind, read_manifest
from .schema import DATA_DIR, MANIFEST, Manifest

_TORCH_DTYPES = {"uint8": torch.uint8, "int64": torch.int64, "float32": torch.float32}


# What every pack and set answers, whatever its storage (issue 43.8): ImagePack,
# JpegPack and PackSet each define these, and ``len()``; ``dir()`` of each lists them
# with the few names of its own (its data fields and methods), not every method of
# the tensordict beneath (tensordict's methods still work on an ImagePack).
PACK_ATTRIBUTES = (
    "classes",
    "class_to_idx",
    "image_shape",
    "labels",
    "path",
    "sources",
    "storage",
    "target_names",
    "targets",
)
# the tensordict names an ImagePack's dir() keeps (the ones a user of a pack reaches for)
_TENSORDICT_NAMES = ("apply", "batch_size", "clone", "cpu", "cuda", "device", "numel", "to")


def pack_dir(obj: Any, own: tuple[str, ...]) -> list[str]:
    """``dir()`` of a pack or set: :data:`PACK_ATTRIBUTES`, the names ``own`` to its
    class, and the dunder names ``object`` gives (``__len__``, ``__class__``...)."""
    return sorted({*PACK_ATTRIBUTES, *own, *(n for n in object.__dir__(obj) if n[:2] == "__")})


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
    Of any pack or slice: image_shape ((3, H, W)), storage (``"raw"``), ``len()``.
    A JPEG pack and a pack set answer the same names (:data:`PACK_ATTRIBUTES`).

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
    def storage(self) -> str:
        """How images are stored: ``"raw"`` rows (a JPEG pack's is ``"jpeg"``)."""
        return "raw"

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
    max_pixels: int | None = None,
) -> ImagePack:
    """Open the single pack at ``path`` read-only, without running anything from it.

    A pack's folder only: ``packer.load`` (:func:`packer.storage.open.load`) decides
    whether a path is a pack, a set or a URL, and calls this for a pack.

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

    ``max_pixels``: the most pixels one stored JPEG may decode to (JPEG packs and sets;
    default :data:`packer.imaging.decode.DEFAULT_MAX_PIXELS`, 100 million). The
    reader's bound: a pack's own record can lower it, never raise it. Give a pack built
    with a larger ``--max-pixels`` the same figure here.
    """
    root = Path(path)
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

    return kind_of(manifest).open(root, manifest, tensors, max_pixels=max_pixels)


JPEG_MAX_SIDE = 65535  # a JPEG frame header's sides are 16-bit


def read_max_pixels(max_pixels: int | None) -> int:
    """The most pixels a reader lets one stored image decode to: the user's
    ``max_pixels=`` (checked here), or :data:`DEFAULT_MAX_PIXELS`. Never the pack's
    own ``build.max_pixels``, which a hostile pack sets as it likes (issue 42.3); that
    figure may only lower the bound."""
    if max_pixels is None:
        return DEFAULT_MAX_PIXELS
    if isinstance(max_pixels, bool) or not isinstance(max_pixels, (int, np.integer)):
        raise UsageError(f"max_pixels must be an int, not {type(max_pixels).__name__}")
    if not 1 <= max_pixels <= JPEG_MAX_SIDE * JPEG_MAX_SIDE:
        raise UsageError(f"max_pixels must be 1 to {JPEG_MAX_SIDE**2:,}, not {max_pixels}")
    return int(max_pixels)


def check_stored_sizes(
    sizes: np.ndarray, m: Manifest, root: Path, max_pixels: int | None = None
) -> None:
    """A JPEG pack's stored (h, w) [N, 2], each inside the reader's bounds: 1 to
    ``max_side`` (or 65535, a JPEG's most) a side, at most ``max_pixels`` pixels (the
    reader's: :func:`read_max_pixels`; the build's own ``max_pixels`` only lowers it). A
    decoder allocates what a JPEG's header says, and readers check each header against
    these before decoding, so this bounds every decode of the pack (a 2 KB file saying
    65000x65000 would ask for 12 GB). PackFormatError naming the first image outside."""
    if not len(sizes):
        return
    side = min(m.max_side or JPEG_MAX_SIDE, JPEG_MAX_SIDE)
    most = min(m.build.max_pixels, read_max_pixels(max_pixels))
    bad = ((sizes < 1) | (sizes > side)).any(1)
    inside = np.where(bad[:, None], 1, sizes)  # sides bounded: the product cannot overflow
    bad |= inside[:, 0] * inside[:, 1] > most
    if bad.any():
        i = int(bad.argmax())
        h, w = (int(v) for v in sizes[i])
        mine = "" if most == m.build.max_pixels else "; pass max_pixels= to packer.load to raise"
        raise PackFormatError(
            f"{root}: image {i}: the pack gives its size as {w}x{h}, outside what this reader "
            f"allows (sides 1 to {side}, at most {most:,} pixels{mine}); the pack is "
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
    def image_shape(self) -> tuple[int, int, int]:
        """(3, H, W): the largest stored image's sides (as a JPEG set's)."""
        c, h, w = self.manifest.image_shape
        return (c, h, w)

    def __dir__(self) -> list[str]:
        own = ("jpeg", "offsets", "lengths", "sizes", "manifest", "read", "decode")
        return pack_dir(self, own)

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


def read_local_class_map(source: str | os.PathLike[str]) -> list[str]:
    """The class names, in index order, of a class-map file, an existing pack or a pack
    set on this machine (``--classes FILE|PACK|SET``; a URL is
    :func:`packer.storage.open.read_class_map`'s).

    ``source`` is a text file with one class name per line
    (:func:`packer.sources.classes.read_class_file`), or a pack directory (or its
    ``imgpack.json``) whose manifest's ``classes`` is reused. Only the manifest's JSON
    is read: nothing of the pack is unpickled or imported. Raises :class:`InputError`
    naming the file and the problem.
    """
    path = Path(source)
    if path.is_dir() and folder_kind(path) == "set":  # both files: refused there
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
