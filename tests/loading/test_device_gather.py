"""PackLoader(gather=): the GPU reading a raw pack's rows in place, or CPU threads.

On the CPU: argument checks and when the GPU way is refused. With CUDA: both ways
give the same batches bit for bit (targets, transforms, subsets, ranks, resume),
"device" says why it cannot read a pack, passes and loaders share registrations
safely, and rows of any byte length are copied whole.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from test_targets_loader import build_with_table, image_paths

import packer
from packer.builder.config import BuildConfig
from packer.builder.run import build
from packer.errors import UsageError
from packer.loading import device_gather as dg
from test_loader import RecordingTransform


@pytest.fixture
def tpack(image_tree: Path, tmp_path: Path) -> Path:
    """image_tree (13 images) at 16x12 with labels and targets a, b."""
    labels = [p.split("/")[0] for p in image_paths(image_tree)]
    return build_with_table(image_tree, tmp_path / "tpack", labels)


def test_bad_gather_values_are_refused(packed: Path) -> None:
    with pytest.raises(UsageError, match="gather must be"):
        packer.PackLoader(packed, 4, device="cpu", gather="gpu")
    with pytest.raises(UsageError, match="gather='device' has a CUDA GPU"):
        packer.PackLoader(packed, 4, device="cpu", gather="device")
    ld = packer.PackLoader(packed, 4, device="cpu", gather="cpu")  # the CPU way: fine
    assert sum(len(x) for x, _ in ld) == len(packer.load(packed))


def test_gather_is_for_raw_packs(photos: Path, tmp_path: Path) -> None:
    build(photos, tmp_path / "jp", BuildConfig(store="jpeg", workers=1))
    with pytest.raises(UsageError, match="gather= is for raw packs"):
        packer.PackLoader(tmp_path / "jp", 4, device="cpu", gather="device", image_size=16)


def test_which_packs_the_gpu_may_read_in_place(
    tpack: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pack = packer.load(tpack)
    whole = [pack.images, pack.labels, pack.targets]
    assert all(dg._whole_file(t) for t in whole)
    try:
        import triton  # noqa: F401
    except ImportError:
        pytest.skip("Triton is not installed here")
    assert dg.unavailable(whole) is None
    assert "not whole memory-mapped files" in dg.unavailable([pack.images[2:], pack.labels])
    assert "not whole memory-mapped files" in dg.unavailable([torch.zeros(4, 3), pack.labels])
    monkeypatch.setattr(dg, "ram_bytes", lambda: 1000)  # a pack over half the RAM
    assert "over 50% of this machine's" in dg.unavailable(whole)


def _batches(ld: packer.PackLoader, epochs: int = 2) -> list[list[torch.Tensor]]:
    out = []
    for _ in range(epochs):
        for batch in ld:
            out.append([t.cpu() for t in batch])
    return out


def _same(a: list[list[torch.Tensor]], b: list[list[torch.Tensor]]) -> None:
    assert len(a) == len(b) > 0
    for x, y in zip(a, b, strict=True):
        assert len(x) == len(y)
        for u, v in zip(x, y, strict=True):
            assert u.dtype == v.dtype and torch.equal(u, v)


@pytest.mark.cuda
@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"drop_last": True, "rank": 1, "world_size": 2},
        {"indices": [5, 0, 7, 7, 12, 3]},
        {"shuffle": False, "prefetch": 1},
    ],
)
def test_cuda_device_and_cpu_gather_give_the_same_batches(tpack: Path, kw: dict) -> None:
    runs = {}
    for way in ("device", "cpu"):
        ld = packer.PackLoader(tpack, 4, device="cuda", seed=5, gather=way, **kw)
        runs[way] = _batches(ld)
        assert (ld._shared.rows is not None) == (way == "device")
        ld.close()
    _same(runs["device"], runs["cpu"])
    ref = _batches(packer.PackLoader(tpack, 4, device="cpu", seed=5, **kw))
    _same(runs["device"], ref)


@pytest.mark.cuda
def test_cuda_device_gather_with_transform_and_resume(packed: Path) -> None:
    a = packer.PackLoader(
        packed, 3, device="cuda", seed=4, transform=RecordingTransform(), gather="device"
    )
    b = packer.PackLoader(packed, 3, device="cuda", seed=4, transform=RecordingTransform())
    _same(_batches(a), _batches(b))
    assert a.transform.draws == b.transform.draws
    ld = packer.PackLoader(packed, 3, device="cuda", seed=4, gather="device")
    it = iter(ld)
    next(it)
    state = ld.state_dict()
    rest = [y.cpu() for _, y in it]
    c = packer.PackLoader(packed, 3, device="cuda", seed=4, gather="device")
    c.load_state_dict(state)
    got = [y.cpu() for _, y in c]
    assert len(got) == len(rest) > 0 and all(
        torch.equal(u, v) for u, v in zip(got, rest, strict=True)
    )


@pytest.mark.cuda
def test_cuda_device_says_why_it_cannot(packed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dg, "ram_bytes", lambda: 1000)
    forced = packer.PackLoader(packed, 4, device="cuda", gather="device")
    with pytest.raises(UsageError, match=r"gather='device'.*over 50%.*gather='cpu'"):
        next(iter(forced))
    ld = packer.PackLoader(packed, 4, device="cuda", seed=1)  # the default: CPU threads
    _same(_batches(ld, 1), _batches(packer.PackLoader(packed, 4, device="cpu", seed=1), 1))
    assert ld._shared.rows is None


@pytest.mark.cuda
def test_cuda_passes_and_loaders_share_the_pack_safely(packed: Path) -> None:
    n = len(packer.load(packed))
    a = packer.PackLoader(packed, 2, device="cuda", seed=3, gather="device")
    b = packer.PackLoader(packed, 2, device="cuda", seed=3, gather="device")  # its own
    ref = _batches(packer.PackLoader(packed, 2, device="cpu", seed=3), 1)
    for (x, _), (y, _), r in zip(a, b, ref, strict=True):  # two at once
        torch.cuda._sleep(50_000)
        assert torch.equal(x.cpu(), r[0]) and torch.equal(y.cpu(), r[0])
    for (x, _), (y, _) in zip(a, a, strict=True):  # two passes of one loader
        assert x.shape == y.shape
    a.close()  # unregisters; b still reads its own
    assert sum(len(x) for x, _ in b) == n
    assert sum(len(x) for x, _ in a) == n  # registered again
    b.close()
    a.close()


@pytest.mark.cuda
@pytest.mark.parametrize("shape", [(3, 5, 7), (3, 4, 4), (1, 1, 1)])
def test_cuda_rows_of_any_length_are_copied_whole(tmp_path: Path, shape: tuple) -> None:
    from tensordict import MemoryMappedTensor

    n = 37
    data = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (n, *shape), np.uint8))
    t = MemoryMappedTensor.from_tensor(data, filename=tmp_path / "rows.memmap")
    rows = dg.DeviceRows(t)
    try:
        idx = torch.tensor([36, 0, 5, 5, 17, 2, 36], device="cuda")
        out = torch.empty((len(idx), *shape), dtype=torch.uint8, device="cuda")
        rows.gather(idx, out)
        assert torch.equal(out.cpu(), data[idx.cpu()])
        assert rows.word == (4 if np.prod(shape) % 4 == 0 else 1)
    finally:
        rows.close()
