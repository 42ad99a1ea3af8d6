"""PackLoader's arguments and its transform's output are checked, never cast; an epoch
of no batches warns."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

import packer
from conftest import cpu_loader as _loader
from packer.errors import UsageError


@pytest.mark.parametrize(
    ("transform", "match"),
    [
        (lambda x: x[:1], "keep the batch size"),
        (lambda x: x.reshape(-1), "keep the batch size"),
        (lambda x: x.to(torch.int32), "uint8 or floating point"),
        (lambda x: None, "not a Tensor"),
        (lambda x: (x, x), "not a Tensor"),
        (lambda x: x.numpy(), "not a Tensor"),
    ],
)
@pytest.mark.parametrize("resident", [False, True])
def test_transform_output_is_checked(pack6, transform, match: str, resident: bool) -> None:
    with pytest.raises(UsageError, match=rf"transform .*lambda.*{match}"):
        list(_loader(pack6, 4, transform=transform, resident=resident))


def test_transform_float_and_resize_are_allowed(pack6) -> None:
    out = list(_loader(pack6, 4, transform=lambda x: x[:, :, :4, :4].float() / 255))
    assert [tuple(x.shape) for x, _ in out] == [(4, 3, 4, 4), (2, 3, 4, 4)]
    assert all(x.dtype == torch.float32 and len(y) == len(x) for x, y in out)


@pytest.mark.parametrize(
    "kw",
    [
        dict(bs=4, drop_last=True, rank=0, world_size=4),
        dict(bs=1, even_split="trim", rank=0, world_size=8),
        dict(bs=2, indices=[]),
        dict(bs=2, indices=()),
    ],
)
def test_zero_batch_epochs_warn(pack6, kw: dict, caplog: pytest.LogCaptureFixture) -> None:
    bs = kw.pop("bs")
    with caplog.at_level(logging.WARNING, logger="packer.loading.loader"):
        ld = _loader(pack6, bs, **kw)
    assert len(ld) == 0 and list(ld) == []
    assert "0 batches" in caplog.text


def test_nonempty_epoch_does_not_warn(pack6, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="packer.loading.loader"):
        _loader(pack6, 4, drop_last=True)
    assert "0 batches" not in caplog.text


@pytest.mark.parametrize(
    ("kw", "name"),
    [
        (dict(seed="x"), "seed"),
        (dict(seed=1.9), "seed"),
        (dict(seed=2**64), "seed"),
        (dict(prefetch="4"), "prefetch"),
        (dict(prefetch=0), "prefetch"),
        (dict(num_threads=-1), "num_threads"),
        (dict(num_threads=2.0), "num_threads"),
        (dict(rank="0", world_size=2), "rank"),
        (dict(world_size=True), "world_size"),
        (dict(shuffle=1), "shuffle"),
        (dict(drop_last="yes"), "drop_last"),
        (dict(indices=[2**64]), "indices"),
        (dict(indices="abc"), "indices"),
        (dict(indices={1, 2}), "indices"),
        (dict(indices=[0.0, 1.0]), "indices"),
        (dict(indices=np.array([0, 2**63], dtype=np.uint64)), "indices"),
    ],
)
def test_bad_constructor_arguments(pack6, kw: dict, name: str) -> None:
    with pytest.raises(UsageError, match=name):
        packer.PackLoader(pack6, 2, device="cpu", **kw)


@pytest.mark.parametrize("bs", [True, 1.5, "2", 0])
def test_bad_batch_size(pack6, bs: object) -> None:
    with pytest.raises(UsageError, match="batch_size"):
        packer.PackLoader(pack6, bs, device="cpu")  # type: ignore[arg-type]


def test_numpy_ints_are_ints(pack6) -> None:
    ld = packer.PackLoader(pack6, np.int64(2), device="cpu", seed=np.int32(3))
    assert (ld.batch_size, ld.seed) == (2, 3) and type(ld.seed) is int


@pytest.mark.parametrize(
    "kw, name",
    [
        ({"canonical_ranks": 10**10}, "canonical_ranks"),
        ({"canonical_ranks": 10**8}, "canonical_ranks"),
        ({"world_size": 10**8, "rank": 0}, "world_size"),
        ({"shard_window": 10**9}, "shard_window"),
        ({"prefetch": 10**6}, "prefetch"),
        ({"num_threads": 10**6}, "num_threads"),
    ],
)
def test_size_like_arguments_are_bounded(pack6, kw: dict, name: str) -> None:
    """Issue 42.12: canonical_ranks of 10**10 was a raw 74.5 GiB MemoryError at the first
    batch; every size-like argument has a bound, refused when the loader is made."""
    with pytest.raises(UsageError, match=rf"^{name} must be at most [\d,]+ \(imgpack's bound\)"):
        packer.PackLoader(pack6, 2, device="cpu", **kw)


def test_the_rank_bound_itself_is_taken(pack6) -> None:
    loader = packer.PackLoader(pack6, 2, device="cpu", canonical_ranks=1 << 16, order="shards")
    assert loader.canonical_ranks == 1 << 16
