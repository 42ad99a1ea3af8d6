"""The DataLoader road and subsets: :class:`PackDataset`, :func:`split`, :func:`class_histogram`.

:class:`PackDataset` is a map-style ``torch.utils.data.Dataset`` over a pack,
for per-sample Python transforms in DataLoader worker processes (and
torchdata's ``StatefulDataLoader``). It pickles as the pack's path and opens
the memory map lazily in each process. :func:`split` cuts a pack into
disjoint index tensors for ``PackLoader(indices=...)`` or
``torch.utils.data.Subset``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.utils.data

from ..errors import UsageError
from ..pack.reader import ImagePack
from ..storage.open import load
from .order import _check_indices, _int_arg


def _pack_path(pack: ImagePack | str | os.PathLike[str]) -> Path:
    if isinstance(pack, (str, os.PathLike)):
        return Path(pack)
    try:
        return Path(pack.path)
    except (AttributeError, KeyError):
        raise UsageError(
            "PackDataset needs a whole pack from packer.load() or a pack's path, not a slice"
        ) from None


class PackDataset(torch.utils.data.Dataset):
    """A pack as a map-style Dataset: ``ds[i] -> (image, label)``, or
    ``(image, label, target)`` when the pack has targets.

    Args:
      pack: an :class:`ImagePack` from :func:`packer.load`, or a pack's path.
      transform: optional callable on one image (Tensor[3, H, W], uint8 in
        [0, 255], CPU), e.g. a torchvision v2 transform; runs per sample in
        the process that reads it (a DataLoader worker).

    Items: ``image`` Tensor[3, H, W] uint8 in [0, 255] (or what ``transform``
    returns), ``label`` an int (class index, -1 unlabeled) and, only for a pack
    built with ``--targets``, ``target`` Tensor[K] float32 (the row of
    ``pack.targets``, columns in ``pack.target_names`` order; the default
    collate stacks them to [B, K]). ``__getitems__`` fetches a batch of
    indices with one gather.

    Pickling carries the path, never the mapped arrays: each worker opens the
    pack itself (no unpickling of pack files, as :func:`packer.load`). Use
    :class:`packer.PackLoader` unless you need per-sample CPU transforms or a
    DataLoader-only feature: it streams whole batches to the GPU with no
    worker processes and no per-sample Python.
    """

    def __init__(
        self,
        pack: ImagePack | str | os.PathLike[str],
        transform: Callable[[torch.Tensor], Any] | None = None,
    ) -> None:
        self.path = _pack_path(pack)
        self.transform = transform
        self._pack: ImagePack | None = None if isinstance(pack, (str, os.PathLike)) else pack
        self._pid = os.getpid()
        self._len = len(self._open())

    def _open(self) -> ImagePack:
        if self._pack is None or self._pid != os.getpid():
            self._pack = load(self.path)
            self._pid = os.getpid()
        return self._pack

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_pack"] = None  # the worker maps the files itself
        return state

    def __len__(self) -> int:
        return self._len

    @property
    def classes(self) -> list[str]:
        return self._open().classes

    def __getitem__(self, i: int) -> tuple[Any, ...]:
        pack = self._open()
        i = _index(i, "index")
        if not -self._len <= i < self._len:
            raise IndexError(f"index {i} is outside a pack of {self._len} images")
        image = torch.from_numpy(_images(pack, np.array([i % self._len]))[0])
        label = int(pack.labels[i])
        image = image if self.transform is None else self.transform(image)
        if pack.targets is None:
            return image, label
        return image, label, pack.targets[i].clone()

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[Any, ...]]:
        """Samples for ``indices`` (a list, as DataLoader's fetcher passes), one gather."""
        pack = self._open()
        idx = np.asarray([_index(i, "__getitems__ index") for i in indices], dtype=np.intp)
        if len(idx) and (idx.min() < -self._len or idx.max() >= self._len):
            raise IndexError(f"an index is outside a pack of {self._len} images")
        images = torch.from_numpy(_images(pack, idx % max(1, self._len))).unbind(0)
        labels = np.take(pack.labels.numpy(), idx).tolist()
        if self.transform is not None:
            images = tuple(self.transform(x) for x in images)
        if pack.targets is None:
            return list(zip(images, labels))
        targets = torch.from_numpy(np.take(pack.targets.numpy(), idx, axis=0)).unbind(0)
        return list(zip(images, labels, targets))


def _images(pack: Any, idx: np.ndarray) -> np.ndarray:
    """Images ``idx`` (non-negative) of a pack or a pack set, copied into own memory
    (the maps are read-only and shared), uint8 [n, 3, H, W]."""
    from ..storage.packset import PackSet

    if not isinstance(pack, PackSet):
        return np.take(pack.images.numpy(), idx, axis=0)
    if pack.kind.decoded:
        raise UsageError(
            f"{pack.path}: PackDataset reads raw images; stream a JPEG set with "
            "PackLoader(set, batch_size, image_size=S)"
        )
    out = np.empty((len(idx), *pack.image_shape), dtype=np.uint8)
    shard, row = pack.locate(idx)
    for k in np.unique(shard).tolist():
        sel = np.flatnonzero(shard == k)
        try:
            out[sel] = np.take(pack.shard(k).images.numpy(), row[sel], axis=0)
        finally:
            pack.release(k)
    return out


def _index(i: Any, name: str) -> int:
    """A row index as an int; a float, bool or string is refused, never truncated."""
    if isinstance(i, torch.Tensor) and i.dim() == 0 and not i.is_floating_point():
        i = i.item()
    if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
        raise TypeError(f"PackDataset {name} must be an integer, not {type(i).__name__} {i!r}")
    return int(i)


def _apportion(total: int, fractions: Sequence[float]) -> list[int]:
    """Integer counts summing to ``total``, closest to ``fractions`` (largest remainder)."""
    raw = [f * total for f in fractions]
    counts = [math.floor(r) for r in raw]
    order = sorted(range(len(raw)), key=lambda k: (counts[k] - raw[k], k))
    for k in order[: total - sum(counts)]:
        counts[k] += 1
    return counts


def split(
    pack: ImagePack | str | os.PathLike[str],
    fractions: Sequence[float] = (0.9, 0.1),
    seed: int = 0,
    stratify: bool = True,
) -> tuple[torch.Tensor, ...]:
    """Cut a pack into disjoint parts: one int64 index tensor [M_k] (ascending) per fraction.

    Deterministic for a seed; together the parts hold every row once. Part
    sizes are the fractions of N rounded to integers that sum to N. With
    ``stratify`` the strata are the distinct label values, whether or not the
    pack names them: class indices, integer labels from a table (``classes ==
    []``), and -1 (unlabeled) as a stratum of its own. Each stratum is cut in
    the same proportions: its count in part k is within one image per part of
    ``fractions[k]`` times its size. ``fractions`` are numbers (floats, ints, numpy
    numbers); strings and bools are refused (UsageError), never converted. Targets play
    no part. Feed a part to
    ``PackLoader(indices=)`` or ``torch.utils.data.Subset(PackDataset(pack), part)``.
    """
    if isinstance(pack, (str, os.PathLike)):
        pack = load(pack)
    if not isinstance(fractions, (Sequence, np.ndarray, torch.Tensor)) or isinstance(
        fractions, str
    ):
        raise UsageError(f"fractions must be a sequence of floats, not {fractions!r}")
    # numbers only: float("0.5") would take a string, float(True) a bool
    odd = next((f for f in fractions if isinstance(f, (str, bytes, bool, np.bool_))), None)
    if odd is not None:
        raise UsageError(
            f"fractions must be numbers, not {type(odd).__name__} {odd!r}: "
            "pass floats, e.g. (0.9, 0.1)"
        )
    try:
        fr = [float(f) for f in fractions]
    except (TypeError, ValueError):
        raise UsageError(f"fractions must be numbers, not {tuple(fractions)}") from None
    if not fr or any(not f > 0 for f in fr) or abs(sum(fr) - 1) > 1e-6:
        raise UsageError(f"fractions must be positive and sum to 1, not {tuple(fractions)}")
    n = len(pack)
    g = torch.Generator()
    g.manual_seed(_int_arg("seed", seed, -(1 << 63), 1 << 63))
    targets = _apportion(n, fr)
    parts: list[list[torch.Tensor]] = [[] for _ in fr]
    if not stratify:
        perm = torch.randperm(n, generator=g)
        for k, (a, b) in enumerate(zip([0, *np.cumsum(targets)[:-1]], np.cumsum(targets))):
            parts[k].append(perm[int(a) : int(b)])
    else:
        labels = torch.as_tensor(np.asarray(pack.labels.numpy()), dtype=torch.int64)
        leftovers = []
        have = [0] * len(fr)
        for c in torch.unique(labels).tolist():  # label values, ascending: deterministic
            rows = (labels == c).nonzero().flatten()
            rows = rows[torch.randperm(len(rows), generator=g)]
            base = [math.floor(f * len(rows)) for f in fr]
            start = 0
            for k, m in enumerate(base):
                parts[k].append(rows[start : start + m])
                have[k] += m
                start += m
            leftovers.append(rows[start:])
        # each class leaves fewer rows than parts; hand them out so part sizes hit targets
        rest = torch.cat(leftovers) if leftovers else torch.empty(0, dtype=torch.int64)
        rest = rest[torch.randperm(len(rest), generator=g)]
        start = 0
        for k in range(len(fr)):
            m = targets[k] - have[k]
            parts[k].append(rest[start : start + m])
            start += m
    return tuple(
        torch.sort(torch.cat(p) if p else torch.empty(0, dtype=torch.int64)).values for p in parts
    )


def class_histogram(
    pack: ImagePack | str | os.PathLike[str], indices: torch.Tensor | None = None
) -> dict[str, int]:
    """Images per label among ``indices`` (default all): signed-integer rows
    (tensor/array/list, int64 or int32) or a bool mask [N]; an unsigned dtype, such as
    a uint8 0/1 mask, is refused (UsageError naming ``indices``), never read as rows.

    Keys: every class name, in class order (count 0 included); a label value
    the pack does not name (integer labels from a table, ``classes == []``)
    as its decimal string (``"7"``), ascending, only when present; unlabeled
    images (label -1) under ``"(unlabeled)"``, last, only when present.
    """
    if isinstance(pack, (str, os.PathLike)):
        pack = load(pack)
    labels = torch.as_tensor(np.asarray(pack.labels.numpy()), dtype=torch.int64)
    if indices is not None:
        labels = labels[_check_indices(indices, len(labels))]
    classes = pack.classes
    hist = dict.fromkeys(classes, 0)
    # Counting the distinct values, not bincount up to the largest: a label of 2**63-1
    # (a hand-edited manifest) must be counted, not allocate or overflow.
    values, counts = torch.unique(labels, return_counts=True)
    unlabeled = 0
    for value, count in zip(values.tolist(), counts.tolist()):
        if value < 0:
            unlabeled += count
        elif value < len(classes):
            hist[classes[value]] = count
        else:
            hist[str(value)] = count
    if unlabeled:
        hist["(unlabeled)"] = unlabeled
    return hist
