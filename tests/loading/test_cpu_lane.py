"""A CPU lane beside the GPU lanes (packer.imaging.cpu_lane, opt-in through
packer.imaging.decoders_split.cpu_lane): batch b goes to lane b % n whatever the timing,
every image once an epoch whichever lane decoded it, batches in order, a resume gives the
same crops from the same lanes. On the CPU a fake lane (the CPU decoder, counting its
batches) stands for the GPU decoder; the CUDA twin at the end runs the real ones."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import packer
from packer.builder.run import BuildConfig, build
from packer.errors import PackFormatError, UsageError
from packer.imaging import decoders as D
from packer.imaging.cpu_lane import CpuLane
from packer.imaging.decoders_split import best_lanes, cpu_lane

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from packer.measure.bench.synth import make_jpeg_tree

    tmp = tmp_path_factory.mktemp("cpulane")
    make_jpeg_tree(tmp / "a", 20, (96, 72), quality=90, threads=1)
    make_jpeg_tree(tmp / "a" / "more", 21, (64, 80), quality=90, threads=1)
    build(tmp / "a", tmp / "pack", BuildConfig(store="jpeg", workers=1))
    return tmp / "pack"


class Fake(D.CpuDecoder):
    """Stands for a GPU decoder lane: decodes whole batches (the crop comes after), counts."""

    def __init__(self, label: str = "gpu") -> None:
        super().__init__(CPU, threads=0)
        self.name, self.batches = label, 0

    def _decode(self, datas, names):
        self.batches += 1
        return super()._decode(datas, names)


def _batches(pack: Path, decode, epochs=(0, 1), bs: int = 8, **kw):
    ld = packer.PackLoader(pack, bs, device="cpu", image_size=12, seed=3, decode=decode, **kw)
    out = []
    for e in epochs:
        ld.set_epoch(e)
        out.append([(x, y) for x, y in ld])
    return ld, out


def test_cpu_lane_takes_every_other_batch_in_order(photos: Path) -> None:
    """Batch b is lane b % 2's: the GPU lane's batches are the batched path's pixels, the
    CPU lane's the decode="cpu" path's (each box decoded and resampled on a thread)."""
    _, dev = _batches(photos, "device")
    _, cpu = _batches(photos, "cpu")
    fake, lane = Fake(), cpu_lane("cpu", 2)
    ld, got = _batches(photos, [fake, lane])
    n = len(packer.load(photos))
    for e in range(2):
        assert len(got[e]) == len(dev[e]) == -(-n // 8)
        for b, (x, y) in enumerate(got[e]):
            ref = (dev if b % 2 == 0 else cpu)[e][b]
            assert torch.equal(y, ref[1]) and torch.equal(x, ref[0]), (e, b)
        assert not all(torch.equal(a[0], c[0]) for a, c in zip(dev[e], cpu[e]))  # can fail
    assert fake.batches == 2 * 3  # batches 0, 2, 4 of each epoch
    assert ld.decode_path == "gpu: full+crop; cpu-lane(2): box+scale on the CPU"


def test_cpu_lane_every_image_once_per_epoch(photos: Path) -> None:
    """Each image once an epoch whichever lane decoded it: the lanes' rows (shuffle off,
    so row k is image k) are the pack's, and with shuffle each epoch's labels are the
    pack's labels as a multiset; the pixels of each row are its lane's path's."""
    p = packer.load(photos)
    n = len(p)
    _, got = _batches(photos, [Fake(), cpu_lane("cpu", 3)], bs=5, shuffle=False, train=False)
    _, one = _batches(photos, "cpu", bs=5, shuffle=False, train=False)
    for e in range(2):
        ys = torch.cat([y for _, y in got[e]])
        assert torch.equal(ys, p.labels[:n])
        xs = torch.cat([x for x, _ in got[e]])
        ref = torch.cat([x for x, _ in one[e]])
        assert len(xs) == n
        for b in range(1, len(got[e]), 2):  # the CPU lane's batches: exactly its rows
            assert torch.equal(got[e][b][0], one[e][b][0])
        assert (xs.int() - ref.int()).abs().float().mean() <= 1.0
    _, shuf = _batches(photos, [Fake(), cpu_lane("cpu", 2)], bs=6)
    for e in range(2):
        ys = torch.cat([y for _, y in shuf[e]])
        assert torch.equal(ys.sort().values, p.labels[:n].sort().values)


def test_cpu_lane_resume_gives_the_same_crops_and_lanes(photos: Path) -> None:
    def lanes():
        return [Fake(), cpu_lane("cpu", 2)]

    kw = dict(device="cpu", image_size=12, seed=5)
    whole = [x for x, _ in packer.PackLoader(photos, 8, decode=lanes(), **kw)]
    ld = packer.PackLoader(photos, 8, decode=lanes(), **kw)
    it = iter(ld)
    first = [next(it)[0] for _ in range(3)]  # batches 0 (gpu), 1 (cpu), 2 (gpu)
    state = ld.state_dict()
    it.close()
    again = packer.PackLoader(photos, 8, decode=lanes(), **kw)
    again.load_state_dict(state)
    rest = [x for x, _ in again]  # batch 3 must be the CPU lane's again
    assert len(first + rest) == len(whole)
    assert all(torch.equal(a, b) for a, b in zip(first + rest, whole))
    # and the lanes differ, so a resume that shifted them would show
    dev = [x for x, _ in packer.PackLoader(photos, 8, decode="device", **kw)]
    assert [torch.equal(a, b) for a, b in zip(whole, dev)] == [True, False] * 3


def test_cpu_lane_names_a_damaged_image(photos: Path, tmp_path: Path) -> None:
    p = packer.load(photos)
    bad = tmp_path / "bad"
    shutil.copytree(photos, bad)
    f = bad / "_tensordict" / "jpeg.memmap"
    raw = bytearray(f.read_bytes())
    off, n = int(p.offsets[11]), int(p.lengths[11])
    raw[off + n // 2 : off + n // 2 + 2] = b"\xff\xc4"  # a table marker inside the scan
    f.write_bytes(bytes(raw))
    ld = packer.PackLoader(bad, 8, device="cpu", image_size=12, shuffle=False,
                           decode=[Fake(), cpu_lane("cpu", 2)])  # fmt: skip
    it = iter(ld)
    next(it)  # rows 0-7, the fake GPU lane
    with pytest.raises(PackFormatError, match=r"image 11: its stored JPEG does not decode"):
        next(it)  # rows 8-15, the CPU lane


def test_cpu_lane_as_a_plain_decoder_and_its_arguments(photos: Path) -> None:
    p = packer.load(photos)
    idx = np.arange(6)
    datas, sizes = p.read(idx, check_ends=True), p.sizes[idx]
    lane = cpu_lane("cpu", 2)
    assert isinstance(lane, CpuLane) and isinstance(lane, D.JpegDecoder)
    whole = lane.decode(datas, sizes=sizes)
    ref = D.CpuDecoder(CPU, threads=0).decode(datas, sizes=sizes)
    assert all(torch.equal(a, b) for a, b in zip(whole, ref))
    boxes = torch.tensor([[0, 0, int(h), int(w)] for h, w in sizes.tolist()])
    out = lane.decode_resized(datas, sizes, boxes, None, (10, 14), idx.tolist())
    assert out.shape == (6, 3, 10, 14) and out.dtype == torch.uint8
    with pytest.raises(ValueError, match=r"6 images, 6 sizes, 5 boxes"):
        lane.decode_resized(datas, sizes, boxes[:5], None, (10, 14), idx.tolist())
    lane.close()
    for bad in (0, -1, 2.5, True, "4"):
        with pytest.raises(UsageError, match=r"cpu_lane threads must be a whole number >= 1"):
            cpu_lane("cpu", bad)


@pytest.mark.cuda
def test_cuda_lanes_with_a_cpu_lane_cover_every_image_and_match_the_cpu(photos: Path) -> None:
    """The default GPU lanes plus one CPU lane on CUDA: batches in order, every image once
    an epoch, the CPU lane's batches the CPU loader's exactly, the GPU lanes' within
    1/255 mean after the resize."""
    gpu = best_lanes("cuda")
    decs = [*gpu, cpu_lane("cuda", 2)]
    k = len(decs)
    # 32 px from a 56-63 px centre box: the CPU path decodes whole (no DCT scale), so
    # the GPU lanes' difference is the decoders' and resamplers' alone
    ld = packer.PackLoader(photos, 8, device="cuda", image_size=32, seed=3, shuffle=False,
                           train=False, decode=decs)  # fmt: skip
    ref = packer.PackLoader(photos, 8, device="cpu", image_size=32, seed=3, shuffle=False,
                            train=False, decode="cpu")  # fmt: skip
    p = packer.load(photos)
    for epoch in (0, 1):
        ld.set_epoch(epoch)
        ref.set_epoch(epoch)
        got, want = list(ld), list(ref)
        assert torch.equal(torch.cat([y.cpu() for _, y in got]), p.labels[: len(p)])
        for b, ((x, _), (r, _)) in enumerate(zip(got, want)):
            x = x.cpu()
            if b % k == k - 1:
                assert torch.equal(x, r), b
            else:
                assert (x.int() - r.int()).abs().float().mean() <= 1.0, b
    assert ld.decode_path.endswith("cpu-lane(2): box+scale on the CPU")


def test_cpu_lane_stats_count_its_batches_and_say_its_path(photos: Path) -> None:
    """stats(): the CPU lane's batches under its own lane, its path named, its decode
    (decode + crop on its threads) timed as the decode stage, no crop stage of its own."""
    ld = packer.PackLoader(photos, 8, device="cpu", image_size=12, decode=[cpu_lane("cpu", 2)])
    assert sum(len(x) for x, _ in ld) == len(packer.load(photos))
    s = ld.stats()
    assert s.lane_batches == (6,)
    assert s.decode_path == ("cpu-lane(2): box+scale on the CPU",)
    assert s.stage_s["decode"] > 0 and s.stage_s["crop"] == 0
    two = packer.PackLoader(photos, 8, device="cpu", image_size=12,
                            decode=[Fake(), cpu_lane("cpu", 2)])  # fmt: skip
    list(two)
    s = two.stats()
    assert s.lane_batches == (3, 3) and s.stage_s["crop"] > 0  # the fake lane's crops
