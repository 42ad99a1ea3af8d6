"""Several packs and sets streamed as one: what a :class:`packer.loading.loader.PackLoader`
is given (:func:`sources`, checked alike), and ``weights=``'s draw per epoch (:class:`Mix`).
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import torch

from ..errors import UsageError
from ..pack.kinds import kind_of_pack
from ..storage.open import load
from .dataset import _apportion
from .order import _MAX_EPOCH_SIZE, _capped_arg, _rng


class Mix:
    """``weights=``: each epoch draws ``size`` images from several packs or sets in fixed
    proportions (:meth:`rows`), a pure function of (seed, epoch)."""

    def __init__(self, sizes: list[int], weights: list[float], size: int) -> None:
        self.sizes = sizes
        self.weights = weights
        self.size = size
        self.quota = _apportion(size, weights)
        self.starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.key = f"mix/{sizes}/{[round(w, 12) for w in weights]}/{size}"
        self._cache: tuple[int, int, torch.Tensor] | None = None

    def rows(self, epoch: int, seed: int) -> torch.Tensor:
        """The epoch's global rows, int64 [size], in pack order (the loader shuffles them):
        pack ``j`` gives ``quota[j]`` images, whole passes over it and then a subset drawn
        without replacement from (seed, epoch, j)."""
        if self._cache is not None and self._cache[:2] == (epoch, seed):
            return self._cache[2]
        out = []
        for j, (n, q) in enumerate(zip(self.sizes, self.quota)):
            whole, rest = divmod(q, n) if n else (0, 0)
            part = [np.tile(np.arange(n, dtype=np.int64), whole)]
            if rest:
                part.append(np.sort(_rng(seed, epoch, -1 - j).choice(n, rest, replace=False)))
            out.append(self.starts[j] + np.concatenate(part))
        rows = torch.from_numpy(np.concatenate(out).astype(np.int64))
        self._cache = (epoch, seed, rows)
        return rows


def _open_source(p: Any) -> Any:
    if isinstance(p, (str, os.PathLike)):
        return load(p)
    return p


def image_shape(src: Any) -> tuple[int, ...]:
    """A raw pack's or set's image shape (3, H, W); a set's from its index, no shard mapped."""
    shape = getattr(src, "image_shape", None)
    if shape is not None and not hasattr(src, "images"):
        return tuple(shape)
    return tuple(src.images.shape[1:])


def _describe(src: Any) -> str:
    return str(getattr(src, "path", type(src).__name__))


def sources(pack: Any, weights: Any, epoch_size: Any) -> tuple[Any, Any, Mix | None]:
    """What a loader streams: ``(pack, units, mix)``. A single pack gives no units; a
    pack set gives its shards as units; a list of packs and sets gives them end to end,
    checked alike (storage, image shape, class map, target columns), and with
    ``weights`` a :class:`Mix` drawing each epoch's images in those proportions."""
    from ..storage.packset import PackSet
    from .sets import Units

    many = isinstance(pack, (list, tuple))
    if not many and (weights is not None or epoch_size is not None):
        raise UsageError(
            "weights= and epoch_size= mix several packs: pass a list, "
            "PackLoader([pack_a, set_b], B, weights=(0.7, 0.3))"
        )
    if not many:
        pack = _open_source(pack)
        return pack, (Units([pack]) if isinstance(pack, PackSet) else None), None
    sources = [_open_source(p) for p in pack]
    if not sources:
        raise UsageError("PackLoader was given an empty list of packs")
    first = sources[0]
    for src in sources[1:]:
        for what, get in (
            ("storage", lambda s: kind_of_pack(s).name),
            (
                "image shape",
                lambda s: None if kind_of_pack(s).decoded else list(image_shape(s)),
            ),
            ("classes", lambda s: list(s.classes)),
            ("target columns", lambda s: list(getattr(s, "target_names", []))),
        ):
            if get(src) != get(first):
                raise UsageError(
                    f"packs to mix must share {what}: {_describe(first)} has {get(first)!r}, "
                    f"{_describe(src)} has {get(src)!r}"
                )
    sizes = [len(s) for s in sources]
    mix = None
    if weights is not None:
        try:
            w = [float(x) for x in weights]
        except (TypeError, ValueError):
            raise UsageError(f"weights must be numbers, one per pack, not {weights!r}") from None
        if len(w) != len(sources) or any(not x > 0 for x in w) or not all(map(math.isfinite, w)):
            raise UsageError(
                f"weights must be {len(sources)} positive numbers (one per pack), not {tuple(weights)}"
            )
        total = sum(w)
        w = [x / total for x in w]
        size = (
            sum(sizes)
            if epoch_size is None
            else _capped_arg("epoch_size", epoch_size, 1, _MAX_EPOCH_SIZE)
        )
        empty = [i for i, (n, q) in enumerate(zip(sizes, w)) if n == 0]
        if empty:
            raise UsageError(
                f"pack {_describe(sources[empty[0]])} is empty; it cannot be drawn from"
            )
        mix = Mix(sizes, w, size)
    elif epoch_size is not None:
        raise UsageError("epoch_size= goes with weights=")
    return first if len(sources) == 1 and weights is None else sources, Units(sources), mix
