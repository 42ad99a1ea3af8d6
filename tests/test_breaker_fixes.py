"""Regressions for the adversarial tester's findings (issue 16's standard): each test
fails on the code before the fix and covers the class of problem, not one input."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

import packer
from conftest import write_image
from packer.build import BuildConfig, build
from packer.errors import UsageError


@pytest.fixture(scope="module")
def pack6(tmp_path_factory: pytest.TempPathFactory) -> packer.ImagePack:
    """6 images in 2 classes (cat, dog), 8x8."""
    root = tmp_path_factory.mktemp("brk")
    for c in ("cat", "dog"):
        for i in range(3):
            write_image(root / "src" / c / f"{i}.png", (20, 16), seed=i)
    build(root / "src", root / "p", BuildConfig(size=(8, 8), workers=1))
    return packer.load(root / "p")


def _loader(pack: packer.ImagePack, bs: int = 2, **kw: object) -> packer.PackLoader:
    return packer.PackLoader(pack, bs, device="cpu", shuffle=False, **kw)  # type: ignore[arg-type]


# ---- 1: a transform must keep the batch pairing (Tensor, same B, uint8/float, device)


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


# ---- 5: a mid-epoch state from a loader over other rows is refused


def test_state_of_other_rows_refused_mid_epoch(pack6) -> None:
    a = _loader(pack6, indices=[0, 1, 2])
    it = iter(a)
    next(it)
    state = a.state_dict()
    assert isinstance(state["rows"], str)
    with pytest.raises(UsageError, match="streaming other rows"):
        _loader(pack6, indices=[3, 4, 5]).load_state_dict(state)
    with pytest.raises(UsageError, match="streaming other rows"):
        _loader(pack6, indices=[2, 1, 0]).load_state_dict(state)
    b = _loader(pack6, indices=[0, 1, 2])
    b.load_state_dict(state)  # the same rows: fine
    assert [y.tolist() for _, y in b] == [[pack6.labels[2].item()]]
    # at an epoch boundary only the epoch is taken: another subset may go on from there
    boundary = dict(state, batches=0, epoch=3)
    c = _loader(pack6, indices=[3, 4, 5])
    c.load_state_dict(boundary)
    assert c.epoch == 3


# ---- 7, 14: empty epochs warn; [] is an empty index set


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
    with caplog.at_level(logging.WARNING, logger="packer.loader"):
        ld = _loader(pack6, bs, **kw)
    assert len(ld) == 0 and list(ld) == []
    assert "0 batches" in caplog.text


def test_nonempty_epoch_does_not_warn(pack6, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="packer.loader"):
        _loader(pack6, 4, drop_last=True)
    assert "0 batches" not in caplog.text


# ---- 11, 12: every argument and state field checked, never cast


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
    ("change", "name"),
    [
        (dict(epoch="x"), "epoch"),
        (dict(epoch=None), "epoch"),
        (dict(epoch=2**70), "epoch"),
        (dict(epoch=2.9), "epoch"),
        (dict(epoch=-1), "epoch"),
        (dict(batches=True), "batches"),
        (dict(batches=1.5), "batches"),
        (dict(batches="1"), "batches"),
        (dict(batches=-1), "batches"),
        (dict(version=True), "version"),
    ],
)
def test_bad_state_fields(pack6, change: dict, name: str) -> None:
    a = _loader(pack6)
    next(iter(a))
    state = dict(a.state_dict(), **change)
    with pytest.raises(UsageError, match=name):
        _loader(pack6).load_state_dict(state)


@pytest.mark.parametrize("state", [[1, 2], "abc", None])
def test_state_not_a_dict(pack6, state: object) -> None:
    with pytest.raises(UsageError, match="not a PackLoader state"):
        _loader(pack6).load_state_dict(state)  # type: ignore[arg-type]


def test_set_epoch_refuses_non_int(pack6) -> None:
    for bad in (1.5, "2", True):
        with pytest.raises(UsageError, match="epoch"):
            _loader(pack6).set_epoch(bad)  # type: ignore[arg-type]


def test_dataset_indices_are_not_truncated(pack6) -> None:
    ds = packer.PackDataset(pack6)
    for bad in (0.9, True, "1"):
        with pytest.raises(TypeError, match="integer"):
            ds[bad]  # type: ignore[index]
    with pytest.raises(TypeError, match="integer"):
        ds.__getitems__([3.7])
    assert ds[np.int64(1)][1] == ds[1][1] == ds[torch.tensor(1)][1]
    with pytest.raises(UsageError, match="indices"):
        packer.class_histogram(pack6, torch.tensor([2.9, 3.9]))
    with pytest.raises(UsageError, match="seed"):
        packer.split(pack6, seed=1.5)


# ---- 6: class_histogram counts every value, whatever its size


def test_class_histogram_counts_out_of_range_and_huge_labels(pack6) -> None:
    class Fake:
        def __init__(self) -> None:
            self.classes = ["cat", "dog"]
            self.labels = torch.tensor([0, 1, 5, 2**63 - 1, -1, 5], dtype=torch.int64)

        def __len__(self) -> int:
            return 6

    hist = packer.class_histogram(Fake())  # type: ignore[arg-type]
    assert hist == {"cat": 1, "dog": 1, "5": 2, str(2**63 - 1): 1, "(unlabeled)": 1}
    assert list(hist)[:2] == ["cat", "dog"]
    assert packer.class_histogram(pack6, torch.tensor([True] * 6)) == {"cat": 3, "dog": 3}
