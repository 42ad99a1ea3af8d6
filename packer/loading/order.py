"""Which pack rows a pass reads, in what order, and the checks on a loader's arguments.

:func:`epoch_indices` (the epoch's shuffle and this rank's share), :func:`batch_seed`
(a transform's per-batch generator seed), the rows digest a loader state carries, and
the argument checks :class:`packer.loading.loader.PackLoader` and :class:`packer.PackDataset`
share. No threads, no device work.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np
import torch

from ..errors import UsageError

_MAX_SEED = 1 << 63  # |seed| below this and epoch below _MAX_EPOCH keep seed + epoch a
_MAX_EPOCH = 1 << 62  # valid torch seed (manual_seed takes [-2**63, 2**64))
_MAX_REPEATS = 1 << 16  # PackLoader(repeats=): copies of an image per epoch, well past any use
# Bounds of PackLoader's other size-like arguments (docs/RELIABILITY.md, "Arguments and
# outputs, round 4"): past them a loader allocates or loops without limit (canonical_ranks
# of 10**10 asked for 74.5 GiB at the first batch). Each is the largest value taken
# (:func:`_capped_arg`).
_MAX_RANKS = 1 << 16  # canonical_ranks, world_size: 65,536 ranks
_MAX_PREFETCH = 256  # prefetch: batches in flight
_MAX_THREADS = 1024  # num_threads
_MAX_WINDOW = 1 << 16  # shard_window: shards a part reads side by side
_MAX_EPOCH_SIZE = 1 << 40  # epoch_size of mixed packs: images an epoch
_STATE_VERSION = 1
_EVEN_SPLITS = ("pad", "trim")


def epoch_indices(
    n: int,
    *,
    epoch: int,
    seed: int,
    shuffle: bool,
    rank: int,
    world_size: int,
    even_split: str = "pad",
    repeats: int = 1,
) -> torch.Tensor:
    """This rank's positions in ``range(n)`` for one epoch, int64 [M].

    Same rule as ``torch.utils.data.DistributedSampler``: a permutation from
    ``seed + epoch``; with several ranks, padded by repeating its head up to a
    multiple of world_size (``even_split="pad"``) or trimmed to one
    (``"trim"``), then rank r takes every world_size-th position starting at r.
    Every rank gets the same M: ``ceil(n / world_size)`` ("pad") or
    ``n // world_size`` ("trim"); ``n`` with one rank.

    ``repeats=k`` (repeated augmentation, torchvision's ``RASampler``): each
    entry of the permutation is written k times in a row, ``[p0]*k + [p1]*k + ...``
    (this list is padded by its head, as above, when it is shorter than
    ``M * world_size``), rank r takes every world_size-th entry from r, and the
    first M of them. M stays what it is with ``repeats=1``, so an epoch streams
    ``M * world_size`` entries: the first ``(M * world_size) // k`` images of the
    permutation k times each, the next one ``(M * world_size) % k`` times, and
    the rest of the images not at all that epoch (a new permutation each epoch
    picks others). The k copies of an image sit at k consecutive entries, so with
    ``world_size >= k`` they go to k different ranks (the head padding of a tiny
    epoch aside); with fewer ranks some share a rank and a batch, where the
    transform still draws each copy its own parameters. ``RASampler`` also
    rounds ``n`` down to a multiple of 256 before dividing; this does not.
    """
    if shuffle:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        order = torch.randperm(n, generator=g)
    else:
        order = torch.arange(n)
    if world_size == 1 and repeats == 1:
        return order
    per_rank = n // world_size if even_split == "trim" else math.ceil(n / world_size)
    # entry j of the (repeated, head-padded) list is order[(j mod n*k) // k]: computed for
    # this rank's entries only, so nothing of size n*k is built
    entries = rank + world_size * torch.arange(per_rank, dtype=torch.int64)
    if n:
        entries = entries % (n * repeats)
    return order[entries // repeats]


def batch_seed(seed: int, epoch: int, rank: int, batch: int) -> int:
    """The seed of a transform's generator for one batch, in [0, 2**63).

    A hash of the four numbers, so a resumed run redraws the same parameters,
    every batch and epoch draws new ones, and ranks draw different ones.
    """
    key = f"imgpack/{int(seed)}/{int(epoch)}/{int(rank)}/{int(batch)}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


def _int_arg(name: str, value: Any, lo: int | None = None, hi: int | None = None) -> int:
    """``value`` as a Python int, or UsageError naming ``name``: never cast (a bool, a
    float, a string or a tensor is refused; numpy integer scalars are ints)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise UsageError(f"{name} must be an integer, not {type(value).__name__} {value!r}")
    v = int(value)
    if (lo is not None and v < lo) or (hi is not None and v >= hi):
        bounds = (
            f"at least {lo}" if hi is None else f"in [{lo if lo is not None else '-inf'}, {hi})"
        )
        raise UsageError(f"{name} must be {bounds}, not {v}")
    return v


def _capped_arg(name: str, value: Any, lo: int, most: int) -> int:
    """:func:`_int_arg` at least ``lo``, and at most ``most`` (one of the bounds above):
    UsageError naming ``name`` and the bound past it."""
    v = _int_arg(name, value, lo)
    if v > most:
        raise UsageError(f"{name} must be at most {most:,} (imgpack's bound), not {v:,}")
    return v


def _size_arg(name: str, value: Any) -> tuple[int, int]:
    """An image size: an int S (S x S) or a pair (height, width) of ints, each 1 to
    ``transforms.MAX_SIDE``, as (height, width); UsageError naming ``name`` for anything
    else (a float, a bool, a string, another length), never cast."""
    from ..imaging.resize import MAX_SIDE

    if isinstance(value, (tuple, list)) and len(value) == 2:
        h, w = (_int_arg(f"{name}[{i}]", v, 1, MAX_SIDE + 1) for i, v in enumerate(value))
        return h, w
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise UsageError(
            f"{name} must be an int S or a pair (height, width) of ints, not "
            f"{type(value).__name__} {value!r}"
        )
    s = _int_arg(name, value, 1, MAX_SIDE + 1)
    return s, s


def _bool_arg(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise UsageError(f"{name} must be True or False, not {type(value).__name__} {value!r}")
    return bool(value)


def _rows_digest(
    rows: torch.Tensor | None, n: int, shape: tuple[int, ...] | None, extra: str = ""
) -> str:
    """A short digest of what a loader streams: the pack's image count and shape and the
    rows it streams (``indices``, in order), so a state from another subset or pack is
    refused mid-epoch."""
    h = hashlib.blake2b(digest_size=8)
    h.update(f"imgpack-rows/{n}/{list(shape or ())}/{extra}".encode())
    h.update(b"all" if rows is None else rows.numpy().astype("<i8").tobytes())
    return h.hexdigest()


def _cut_digest(counts: list[int]) -> str:
    """A short digest of where a set's shards end (their image counts, in order): with
    ``order="shards"`` the epoch's order is a function of them, so a state saved over
    the same images cut into other shards is refused mid-epoch (issue 42.7)."""
    h = hashlib.blake2b(digest_size=8)
    h.update(f"imgpack-cut/{len(counts)}/".encode())
    h.update(np.asarray(counts, dtype="<i8").tobytes())
    return h.hexdigest()


def _dist_defaults(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is None or world_size is None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank = dist.get_rank() if rank is None else rank
            world_size = dist.get_world_size() if world_size is None else world_size
    rank = 0 if rank is None else _int_arg("rank", rank)
    world_size = 1 if world_size is None else _capped_arg("world_size", world_size, 1, _MAX_RANKS)
    if world_size < 1 or not 0 <= rank < world_size:
        raise UsageError(f"rank {rank} is outside world_size {world_size}")
    return rank, world_size


def _check_device(device: str | torch.device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise UsageError(
            f"device {device!r} is not a device; use 'cuda', 'cuda:N' or 'cpu'"
        ) from None
    if dev.type not in ("cpu", "cuda"):
        raise UsageError(
            f"PackLoader streams to 'cpu' or 'cuda' only, not {dev.type!r}; "
            "load on the CPU and move the batches yourself"
        )
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError("device is CUDA but torch sees no CUDA device; use device='cpu'")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    return dev


_INDEX_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64)


def _check_indices(indices: Any, n: int, name: str = "indices") -> torch.Tensor:
    """Rows of the pack to stream, int64 [M], from a signed-integer tensor/array/list/tuple
    or a bool mask [N]. An empty list or tuple is an empty set of rows. An unsigned dtype
    is refused: a uint8 0/1 mask (a ByteTensor, numpy's uint8) would otherwise be read
    as rows 0 and 1. ``name`` is the argument the messages name."""
    if isinstance(indices, (list, tuple)) and len(indices) == 0:
        return torch.empty(0, dtype=torch.int64)
    if not isinstance(indices, (torch.Tensor, np.ndarray, list, tuple, range)):
        raise UsageError(
            f"{name} must be a tensor, array, list or tuple of int rows or a bool mask, "
            f"not {type(indices).__name__}"
        )
    try:
        idx = torch.as_tensor(indices)
    except (TypeError, ValueError, RuntimeError, OverflowError) as e:
        raise UsageError(
            f"{name} must be int rows or a bool mask, representable as int64 ({e})"
        ) from None
    if idx.dim() != 1:
        raise UsageError(
            f"{name} must be 1-D (int rows or a bool mask), not shape {tuple(idx.shape)}"
        )
    if idx.dtype == torch.bool:
        if len(idx) != n:
            raise UsageError(
                f"a bool mask for {name} needs {n} entries (the pack's), not {len(idx)}"
            )
        return idx.nonzero().flatten()
    if idx.dtype not in _INDEX_DTYPES:
        what = str(idx.dtype).removeprefix("torch.")
        raise UsageError(
            f"{name} must be integer rows (int64 or int32) or a bool mask, not {what}: "
            f"pass a mask as bool ({name}=mask.bool(), or mask.astype(bool) in numpy), "
            "rows as integers"
        )
    idx = idx.to(torch.int64)
    if len(idx) and (int(idx.min()) < 0 or int(idx.max()) >= n):
        raise UsageError(f"{name} must lie in [0, {n}) for this pack of {n} images")
    return idx


def _check_dtypes(
    images: torch.Tensor | None, labels: torch.Tensor, targets: torch.Tensor | None, n: int
) -> None:
    """Refuse, never cast: the batch buffers are built for exactly these dtypes and shapes.
    ``images`` is None for a JPEG pack (its bytes are checked when read)."""
    got = []
    if images is not None and (
        images.dtype != torch.uint8 or images.dim() != 4 or images.shape[1] != 3
    ):
        got.append(f"images {images.dtype} {list(images.shape)}")
    if labels.dtype != torch.int64 or tuple(labels.shape) != (n,):
        got.append(f"labels {labels.dtype} {list(labels.shape)}")
    if targets is not None and (
        targets.dtype != torch.float32 or targets.dim() != 2 or len(targets) != n
    ):
        got.append(f"targets {targets.dtype} {list(targets.shape)}")
    if got:
        raise UsageError(
            f"PackLoader needs images uint8 [N, 3, H, W], labels int64 [N] and targets "
            f"float32 [N, K] or None, not {', '.join(got)}; open a pack with packer.load()"
        )


ORDERS = ("global", "shards")  # PackLoader(order=)
_DEFAULT_WINDOW = 2  # PackLoader(shard_window=): shards whose images are shuffled together


def _rng(seed: int, epoch: int, *tag: int) -> np.random.Generator:
    """A generator that is a pure function of its arguments (a hash of them: no
    interpreter hash, no state carried between epochs)."""
    key = "/".join(str(int(v)) for v in (seed, epoch, *tag))
    digest = hashlib.blake2b(f"imgpack-shards/{key}".encode(), digest_size=16).digest()
    return np.random.Generator(np.random.PCG64(int.from_bytes(digest, "little")))


def shard_sequence(
    counts: Any, *, seed: int, epoch: int, shuffle: bool, parts: int, window: int
) -> torch.Tensor:
    """The epoch's global order for ``order="shards"``: every image of the set once,
    int64 [N], arranged so that each rank reads few shards at a time.

    1. The shards, in an order drawn from (seed, epoch), are laid end to end and cut into
       ``parts`` contiguous parts of (nearly) equal image counts: part ``c`` touches about
       ``S / parts + 1`` shards. ``parts`` is the canonical rank count.
    2. Each part is read in windows of ``window`` average shards' worth of images; the
       images of a window are shuffled together (from (seed, epoch, part, window)). A
       rank so needs at most ``window + 1`` shards of a part at once.
    3. The parts are interleaved: position ``p`` of the sequence is image ``p // parts``
       of part ``p % parts`` (the last round holds only the longer parts).

    Rank ``r`` of ``W`` ranks then takes positions ``r, r + W, ...`` (as for the global
    order, :func:`epoch_indices` on this sequence): with ``W`` dividing ``parts`` it reads
    only parts ``r, r + W, ...``, so ``parts / W`` parts' shards. A pure function of
    (seed, epoch, counts, parts, window). ``shuffle=False``: shards and images in order,
    parts still interleaved.
    """
    counts = np.asarray(counts, dtype=np.int64)
    n = int(counts.sum())
    if n == 0:
        return torch.empty(0, dtype=torch.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
    shard_order = _rng(seed, epoch).permutation(len(counts)) if shuffle else np.arange(len(counts))
    seq = np.concatenate([offsets[k] + np.arange(counts[k]) for k in shard_order])
    bounds = (np.arange(parts + 1, dtype=np.int64) * n) // parts
    per_window = max(1, window * -(-n // len(counts)))
    rounds = -(-n // parts)
    grid = np.full((parts, rounds), -1, dtype=np.int64)
    for c in range(parts):
        part = seq[bounds[c] : bounds[c + 1]]
        if shuffle:
            for w, a in enumerate(range(0, len(part), per_window)):
                part[a : a + per_window] = _rng(seed, epoch, c, w).permutation(
                    part[a : a + per_window]
                )
        grid[c, : len(part)] = part
    flat = grid.T.reshape(-1)
    return torch.from_numpy(flat[flat >= 0].copy())


def window_shards(counts: Any, parts: int, window: int, world_size: int) -> int:
    """Shards one rank holds at once under ``order="shards"`` at most (before prefetch):
    each of its parts' current window spans at most ``window + 1`` shards (more where
    shards are smaller than average), and a rank reads ``ceil(parts / world_size)`` parts
    side by side (all of them where ``world_size`` does not divide ``parts``)."""
    counts = np.asarray(counts, dtype=np.int64)
    if not len(counts) or counts.sum() == 0:
        return 0
    per_window = max(1, window * -(-int(counts.sum()) // len(counts)))
    smallest = max(1, int(counts[counts > 0].min()))
    spans = min(len(counts), -(-per_window // smallest) + 1)
    mine = parts // world_size if parts % world_size == 0 else parts
    return min(len(counts), spans * max(1, mine))
