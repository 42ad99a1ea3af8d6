"""Open a pack set (:mod:`packer.pack.index`) as one dataset: :class:`PackSet`.

``packer.load(SET)`` returns a :class:`PackSet` when the folder holds a set index; a
single pack opens as before. Every shard is opened with :func:`open_pack` after its
manifest was checked against the index (SHA-256, count, bytes, class map), so opening
reads only the index and one manifest per shard, maps the data files read-only, never
unpickles and never follows a link out of the set.

Where the shards' data lives is a :class:`ShardStore`: :class:`LocalShards` (every
shard a folder of the set, all mapped) here; a store that fetches shards into a bounded
cache (object storage, :mod:`packer.storage`) gives the same interface, so the loader
asks a set for a shard (:meth:`PackSet.shard`), says which it will want next
(:meth:`PackSet.prefetch`) and lets go of it (:meth:`PackSet.release`) whatever the
store. A set's labels, targets, sources and (JPEG) stored sizes come from each shard's
small files, read when the set is opened; only the big data file of a shard
(``images.memmap`` or ``jpeg.memmap``) is ever fetched on demand.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import PackFormatError, UsageError
from ..pack.files import check_files
from ..pack.index import SetIndex, ShardEntry, read_index, read_shard_manifest, shard_root
from ..pack.jpeg import check_stored_sizes, read_max_pixels
from ..pack.kind import pack_dir
from ..pack.kinds import kind_of
from ..pack.schema import DATA_DIR, LABELS_FILE, SIZES_FILE, TARGETS_FILE, Manifest

if TYPE_CHECKING:
    from ..pack.reader import ImagePack, JpegPack

# torch and the pack reader (tensordict) are imported when a set is opened, not with this
# module: what fetches shards (packer.storage.cache, a Ray shard task's upload) imports it
# for ShardStore, and a build's processes never import torch (issue 45.11)


class ShardStore:
    """Where a set's shard data is, for :class:`PackSet`.

    ``fetch(k)``: the local folder of shard ``k``, complete (all its files, checked
    against its manifest), fetching it first if it is not here; the shard stays there
    (pinned) until ``release(k)`` is called as many times as ``fetch(k)``.
    ``prefetch(ks)``: shards wanted soon, in order (a hint; returns at once).
    ``limit``: bytes of shard data the store holds at most (None: no limit).
    ``remote``: whether shards are fetched (a local set maps every shard at once).
    ``keeps_released``: whether a released shard's files stay where ``fetch`` put them
    (nothing evicts them), so a reader may keep them mapped after letting go."""

    remote = False
    limit: int | None = None
    prefetch_depth = 0  # shards fetched ahead of need

    @property
    def keeps_released(self) -> bool:
        return not self.remote

    def on_close(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` when the store closes (a :class:`PackSet` drops the shards it
        kept mapped); held weakly when it is a bound method."""
        hooks = self.__dict__.setdefault("_close_hooks", [])
        hooks.append(weakref.WeakMethod(fn) if hasattr(fn, "__self__") else (lambda: fn))

    def _run_close_hooks(self) -> None:
        for ref in self.__dict__.pop("_close_hooks", []):
            fn = ref()
            if fn is not None:
                fn()

    def fetch(self, k: int) -> Path:
        raise NotImplementedError

    def release(self, k: int) -> None:
        """Let go of shard ``k`` (fetched once more than released before)."""

    def prefetch(self, ks: Sequence[int]) -> None:
        """Start fetching shards ``ks`` (in that order) if they are not here."""

    def close(self) -> None:
        """Stop background fetches and let go of every shard."""


class LocalShards(ShardStore):
    """A set on local disk: shard ``k`` is the folder the index names, always there."""

    def __init__(self, root: Path, index: SetIndex) -> None:
        self.root = root
        self.index = index

    def fetch(self, k: int) -> Path:
        return shard_root(self.root, self.index.shards[k])


def _small_field(path: Path, dtype: str, count: int, row: tuple[int, ...], where: str) -> Any:
    """A shard's small field file (labels, targets, JPEG sizes) read whole: an array
    [count, *row], after checking the file is regular and of the size the manifest gives."""
    want = count * int(np.prod(row, dtype=np.int64)) * np.dtype(dtype).itemsize
    try:
        if path.is_symlink() or not path.is_file():
            raise PackFormatError(f"{where}: {DATA_DIR}/{path.name} is missing or not a file")
        size = path.stat().st_size
    except OSError as e:
        raise PackFormatError(f"{where}: {DATA_DIR}/{path.name} cannot be read ({e})") from None
    if size != want:
        raise PackFormatError(
            f"{where}: {DATA_DIR}/{path.name} is {size:,} bytes, the manifest says {want:,}; "
            "the shard is damaged"
        )
    return np.fromfile(
        path, dtype=np.dtype(dtype).newbyteorder("<"), count=want // np.dtype(dtype).itemsize
    ).reshape(count, *row)


class PackSet:
    """A pack set opened read-only: its shards in order, seen as one dataset.

    Attributes:
      labels: Tensor[N], int64, every shard's labels concatenated in shard order
        (class index into ``classes``, or -1 for unlabeled).
      targets: Tensor[N, K], float32, likewise; None for a set without targets.
      offsets: np.ndarray[S + 1], int64: image ``i`` of the set is row
        ``i - offsets[k]`` of shard ``k`` where ``offsets[k] <= i < offsets[k + 1]``.
      manifests: each shard's :class:`Manifest` (checked against the index).
      store: the :class:`ShardStore` holding the shards' data.
      classes, class_to_idx, target_names, sources (relative source path of each image,
      in order), image_shape ((3, H, W); for JPEG storage the largest stored image),
      storage ("raw" or "jpeg"), kind (its :class:`StorageKind`), index (:class:`SetIndex`), path.
      shards: the shard packs (:class:`ImagePack` or :class:`JpegPack`), opened on
        first use; for a store that fetches (object storage) this fetches every shard.
    """

    def __init__(
        self,
        root: Path,
        index: SetIndex,
        manifests: Sequence[Manifest],
        store: ShardStore | None = None,
        opened: Sequence[ImagePack | JpegPack] | None = None,
        max_pixels: int | None = None,
    ) -> None:
        self.path = root
        self.max_pixels = read_max_pixels(max_pixels)  # the reader's bound (open_pack's)
        self.index = index
        self.kind = kind_of(index.storage)  # checked by the index's parser
        self.manifests = list(manifests)
        self.store = store if store is not None else LocalShards(root, index)
        self._open: dict[int, ImagePack | JpegPack] = dict(enumerate(opened or ()))
        self._pins: dict[int, int] = {}
        self._pins_lock = threading.Lock()
        if self.store.remote:
            self.store.on_close(self._drop_mappings)
        counts = np.array([s.count for s in index.shards], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        labels, targets, sizes = [], [], []
        k_targets = len(index.targets)
        for entry, m in zip(index.shards, self.manifests):
            data = root / entry.name / DATA_DIR
            where = f"{root}: shard {entry.name!r}"
            lab = _small_field(data / LABELS_FILE, "int64", m.count, (), where)
            labels.append(lab)
            if k_targets:
                targets.append(
                    _small_field(data / TARGETS_FILE, "float32", m.count, (k_targets,), where)
                )
            if self.kind.decoded:  # each image its own size: the sizes, bounded
                hw = _small_field(data / SIZES_FILE, "int64", m.count, (2,), where)
                check_stored_sizes(hw, m, root / entry.name, self.max_pixels)
                sizes.append(hw)
        import torch

        from ..pack.parse import check_label_arrays

        self.labels = torch.from_numpy(np.concatenate(labels) if labels else np.empty(0, np.int64))
        self.targets = torch.from_numpy(np.concatenate(targets)) if k_targets and targets else None
        if k_targets and self.targets is None:
            self.targets = torch.empty((0, k_targets), dtype=torch.float32)
        check_label_arrays(self.labels, self.targets, where=str(root))
        self.sizes = (
            torch.from_numpy(np.concatenate(sizes) if sizes else np.empty((0, 2), np.int64))
            if self.kind.decoded
            else None
        )
        self.sources = [src for m in self.manifests for src in m.sources]

    def __len__(self) -> int:
        return self.index.count

    def __dir__(self) -> list[str]:
        own = ("shards", "shard", "release", "prefetch", "locate", "entry", "index")
        return pack_dir(self, (*own, "manifests", "offsets", "sizes", "store", "max_pixels"))

    def __repr__(self) -> str:
        where = " (fetched into a cache)" if self.store.remote else ""
        return (
            f"PackSet({str(self.path)!r}, {len(self)} images of {list(self.image_shape)}, "
            f"{len(self.index.shards)} shards{where}, storage={self.storage!r})"
        )

    @property
    def classes(self) -> list[str]:
        return list(self.index.classes)

    @property
    def class_to_idx(self) -> dict[str, int]:
        """Class name -> label index, as ``torchvision.datasets.ImageFolder.class_to_idx``."""
        return self.index.class_to_idx

    @property
    def target_names(self) -> list[str]:
        return list(self.index.targets)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return self.index.image_shape

    @property
    def storage(self) -> str:
        return self.index.storage

    @property
    def shards(self) -> list[ImagePack | JpegPack]:
        """Every shard, opened (fetched first where the store fetches)."""
        return [self.shard(k) for k in range(len(self.index.shards))]

    def shard(self, k: int) -> ImagePack | JpegPack:
        """Shard ``k`` opened: its folder from the store (fetched if needed, and pinned
        until :meth:`release`), checked and mapped once."""
        path = self.store.fetch(k)
        with self._pins_lock:  # loaders' threads hold shards of one set side by side
            self._pins[k] = self._pins.get(k, 0) + 1
        pack = self._open.get(k)
        if pack is None:
            from ..pack.reader import open_pack

            try:
                check_files(path, self.manifests[k])
                pack = open_pack(path, self.manifests[k], max_pixels=self.max_pixels)
            except BaseException:
                self.release(k)
                raise
            self._open[k] = pack
        return pack

    def release(self, k: int) -> None:
        """Let go of shard ``k`` (one :meth:`shard` call); a fetched shard may be evicted
        once nothing holds it, so its mapping is dropped with the last hold."""
        with self._pins_lock:
            left = self._pins.get(k, 0) - 1
            if left < 0:
                return
            self._pins[k] = left
        if left == 0 and not self.store.keeps_released:
            self._open.pop(k, None)  # its files may be evicted: drop the mapping
        self.store.release(k)

    def prefetch(self, ks: Sequence[int]) -> None:
        self.store.prefetch(ks)

    def _drop_mappings(self) -> None:
        """The store closed: the shards it fetched are let go, their mappings too."""
        with self._pins_lock:
            self._pins.clear()
        self._open.clear()

    def entry(self, k: int) -> ShardEntry:
        return self.index.shards[k]

    def locate(self, indices: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(shard, row)`` of each global image index: two int64 arrays shaped as
        ``indices``. UsageError for an index outside ``[0, len(self))``."""
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
            bad = int(idx[(idx < 0) | (idx >= len(self))].flat[0])
            raise UsageError(f"image index {bad} is outside the set of {len(self)} images")
        shard = np.searchsorted(self.offsets, idx, side="right") - 1
        return shard, idx - self.offsets[shard]


def open_set(path: str | os.PathLike[str], max_pixels: int | None = None) -> PackSet:
    """Open the pack set at ``path``: the index, then each shard checked against it and
    mapped. Raises PackFormatError naming the shard for a missing, changed or foreign
    one, and naming the field for a bad index. ``max_pixels``: as :func:`open_pack`'s."""
    from ..pack.reader import open_pack

    root = Path(path)
    index = read_index(root)
    manifests: list[Manifest] = []
    opened: list[ImagePack | JpegPack] = []
    for entry in index.shards:
        m = read_shard_manifest(root, entry, index)
        shard = shard_root(root, entry)
        check_files(shard, m)
        manifests.append(m)
        opened.append(open_pack(shard, m, max_pixels=max_pixels))
    return PackSet(root, index, manifests, LocalShards(root, index), opened, max_pixels)
