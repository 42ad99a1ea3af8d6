"""Several decoders for one JPEG-pack loader (``decode=[...]``, the "lanes" of
packer.loading.jpeg_pass.Decoding): each batch goes whole to whichever decoder is free,
batches still come in order, with the seed's boxes. CPU twins of the CUDA default
(torchcodec + torchvision); the CUDA check at the end is skipped without a GPU."""

from __future__ import annotations

import shutil
import sys
import threading
import types
from pathlib import Path

import pytest
import torch

import packer
from helpers.gpu_decoders import default_lanes, runnable
from packer.builder.run import BuildConfig, build
from packer.errors import PackFormatError, UsageError
from packer.imaging import decoders as D
from packer.imaging.decoders_split import best_lanes
from packer.loading.jpeg_pass import Decoding, decoding_for

CPU = torch.device("cpu")
CUDA = torch.device("cuda")


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from packer.measure.bench.synth import make_jpeg_tree

    tmp = tmp_path_factory.mktemp("lanes")
    make_jpeg_tree(tmp / "a", 20, (61, 47), quality=90, threads=1)
    make_jpeg_tree(tmp / "a" / "more", 21, (40, 52), quality=90, threads=1)
    build(tmp / "a", tmp / "pack", BuildConfig(store="jpeg", workers=1))
    return tmp / "pack"


class Counting(D.CpuDecoder):
    """The CPU decoder, counting its batches; with ``meet`` its first batch waits (at
    most 20 s) until the other decoders holding the same barrier decode theirs too."""

    def __init__(self, label: str, meet: threading.Barrier | None = None) -> None:
        super().__init__(CPU, threads=0)
        self.name, self.meet, self.batches = label, meet, 0

    def _decode(self, datas, names):
        self.batches += 1
        if self.meet is not None and self.batches == 1:
            self.meet.wait()  # BrokenBarrierError if the others never decode at once
        return super()._decode(datas, names)


def _epochs(pack: Path, decode, epochs=(0, 1), **kw) -> list[tuple[torch.Tensor, torch.Tensor]]:
    ld = packer.PackLoader(pack, 8, device="cpu", image_size=12, seed=4, decode=decode, **kw)
    out = []
    for e in epochs:
        ld.set_epoch(e)
        out += [(x, y) for x, y in ld]
    return out


@pytest.mark.parametrize("train", [True, False])
def test_lanes_give_one_decoders_batches_in_order(photos: Path, train: bool) -> None:
    ref = _epochs(photos, "device", train=train)
    lanes = [Counting("a"), Counting("b"), Counting("c")]
    got = _epochs(photos, lanes, train=train)
    assert len(got) == len(ref) == 2 * -(-41 // 8)
    for (a, ya), (b, yb) in zip(ref, got):
        assert torch.equal(ya, yb) and torch.equal(a, b)  # same boxes, flips, pixels
    assert sum(d.batches for d in lanes) == len(ref)  # each batch decoded once


def test_lanes_decode_batches_at_once(photos: Path) -> None:
    """Two decoders each hold their first batch until the other has one too: only
    decodes running at the same time get past it."""
    meet = threading.Barrier(2, timeout=20)
    lanes = [Counting("a", meet), Counting("b", meet)]
    ld = packer.PackLoader(photos, 8, device="cpu", image_size=12, seed=4, decode=lanes)
    assert len([x for x, _ in ld]) == len(ld)
    assert all(d.batches >= 1 for d in lanes)
    assert ld.decode_path == "a: full+crop; b: full+crop"
    assert "decode='a: full+crop; b: full+crop'" in repr(ld)


def test_lanes_say_which_ran_before_and_after(photos: Path) -> None:
    d = decoding_for([Counting("a"), Counting("b")], CPU)
    assert d.lanes == 2 and d.name == "a+b" and d.path == "a: not yet run; b: not yet run"
    assert d.for_pass(None) is None  # each batch takes whichever is free
    one = decoding_for("device", CPU)
    assert one.lanes == 1 and one.path == "cpu: not yet run"


def test_lanes_every_image_once_per_epoch(photos: Path) -> None:
    n = len(packer.load(photos))
    ld = packer.PackLoader(
        photos, 6, device="cpu", image_size=8, decode=[Counting("a"), Counting("b")]
    )
    for epoch in (0, 1):
        ld.set_epoch(epoch)
        rows = torch.cat([y for _, y in ld])
        assert len(rows) == n
    # indices: a loader over given rows decodes exactly those, in the sampler's order
    ld = packer.PackLoader(photos, 5, device="cpu", image_size=8, shuffle=False,
                           decode=[Counting("a"), Counting("b")], indices=torch.arange(n))  # fmt: skip
    ys = torch.cat([y for _, y in ld])
    assert torch.equal(ys, packer.load(photos).labels[:n])


def test_lanes_argument_errors(photos: Path) -> None:
    one = Counting("a")
    cases = [
        ([], r"decode must be 'auto', 'device' or 'cpu', not \[\]"),
        (["cpu"], r"decode must be .* a list of decoder names and objects to decode several"),
        (["torchvision", "auto"], r"decode must be"),
        ([one, one], r"decode= lists one decoder object twice; make one per lane"),
        ((one, "gpu"), r"decode must be"),
    ]
    for decode, match in cases:
        with pytest.raises(UsageError, match=match):
            packer.PackLoader(photos, 4, device="cpu", image_size=8, decode=decode)
    with pytest.raises(UsageError, match=r"decode= decodes on cuda, but the loader's device"):
        packer.PackLoader(
            photos, 4, device="cpu", image_size=8, decode=[one, D.get_decoder("cuda")]
        )


def test_lanes_name_a_damaged_image(photos: Path, tmp_path: Path) -> None:
    p = packer.load(photos)
    bad = tmp_path / "bad"
    shutil.copytree(photos, bad)
    f = bad / "_tensordict" / "jpeg.memmap"
    raw = bytearray(f.read_bytes())
    off, n = int(p.offsets[13]), int(p.lengths[13])
    raw[off + 2 : off + n - 2] = bytes(n - 4)  # SOI and EOI kept, nothing between
    f.write_bytes(bytes(raw))
    ld = packer.PackLoader(bad, 8, device="cpu", image_size=8, shuffle=False,
                           decode=[Counting("a"), Counting("b")])  # fmt: skip
    it = iter(ld)
    next(it)  # rows 0-7
    with pytest.raises(PackFormatError, match=r"image 13: its stored JPEG does not decode"):
        next(it)


def test_a_lane_is_used_by_one_batch_at_a_time() -> None:
    """Decoding.run holds a batch's decoder for it (nvImageCodec's handles and ROI probe
    are per decoder): four threads, two decoders, never two batches on one."""
    held: dict[int, int] = {}
    lock = threading.Lock()
    clash = []

    class Slow(D.CpuDecoder):
        def decode(self, datas, *, sizes=None, indices=None):
            with lock:
                held[id(self)] = held.get(id(self), 0) + 1
                clash.append(held[id(self)] > 1)
            threading.Event().wait(0.002)  # holds the lane a moment: overlaps likely
            with lock:
                held[id(self)] -= 1
            return []

    d = Decoding(Slow(CPU, threads=0), more=[Slow(CPU, threads=0)])
    box = torch.zeros(0, 4, dtype=torch.int64)

    def go(k: int) -> None:
        for b in range(20):
            d.run(d.of_batch(b + k), [], torch.zeros(0, 2, dtype=torch.int64), box, [])

    ts = [threading.Thread(target=go, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(clash) == 80 and not any(clash)


class Odd(Counting):
    """A decoder whose pixels differ from the others' (lowest bit set), as two
    libraries' may: which decoder gave a batch shows in its pixels."""

    def _decode(self, datas, names):
        return [x | 1 for x in super()._decode(datas, names)]


def test_batch_b_goes_to_decoder_b_mod_n_whatever_the_timing(photos: Path) -> None:
    """Two runs of one seed give the same pixels even where the decoders differ, and a
    loader resumed mid-epoch gives the uninterrupted one's batches: batch b is always
    decoder b % 2's."""

    def lanes():
        return [Counting("a"), Odd("b")]

    kw = dict(device="cpu", image_size=12, seed=4, decode=None)
    runs = []
    for _ in range(2):
        decs = lanes()
        kw["decode"] = decs
        ld = packer.PackLoader(photos, 8, **kw)
        runs.append([x for x, _ in ld])
        assert [d.batches for d in decs] == [3, 3]  # 6 batches: 0, 2, 4 and 1, 3, 5
    assert all(torch.equal(a, b) for a, b in zip(*runs))
    plain = [x for x, _ in packer.PackLoader(photos, 8, **{**kw, "decode": "device"})]
    same = [torch.equal(a, b) for a, b in zip(runs[0], plain)]
    assert same == [True, False] * 3  # b's pixels in batches 1, 3, 5 only
    kw["decode"] = lanes()
    ld = packer.PackLoader(photos, 8, **kw)
    it = iter(ld)
    first = [next(it)[0] for _ in range(3)]
    state = ld.state_dict()
    it.close()
    kw["decode"] = lanes()
    again = packer.PackLoader(photos, 8, **kw)
    again.load_state_dict(state)
    rest = [x for x, _ in again]
    assert all(torch.equal(a, b) for a, b in zip(first + rest, runs[0]))
    assert len(first + rest) == len(runs[0])


def test_best_lanes_takes_both_nvjpeg_libraries_where_they_run(monkeypatch) -> None:
    assert [d.name for d in best_lanes("cpu")] == ["cpu"]
    fake_tc = types.ModuleType("torchcodec.decoders")
    fake_tc.decode_jpeg = lambda datas, mode, device: [torch.zeros(3, 1, 1)] * len(datas)
    monkeypatch.setitem(sys.modules, "torchcodec", types.ModuleType("torchcodec"))
    monkeypatch.setitem(sys.modules, "torchcodec.decoders", fake_tc)
    assert [d.name for d in best_lanes(CUDA)] == ["torchcodec", "torchvision"]
    d = decoding_for("auto", CUDA)
    assert d.lanes == 2 and d.path == "torchcodec: not yet run; torchvision: not yet run"
    monkeypatch.setitem(sys.modules, "torchvision.io", None)
    assert [d.name for d in best_lanes(CUDA)] == ["torchcodec"]
    assert decoding_for("auto", CUDA).lanes == 1


@pytest.mark.cuda
def test_cuda_lanes_cover_every_image_and_match_the_cpu(photos: Path) -> None:
    """The CUDA default where torchcodec and torchvision both run, and every pair of
    decoders that runs here: every image once an epoch, batches in order, pixels the
    CPU loader's within 2/255 mean (nvjpeg's chroma upsampling and resampling)."""
    names = runnable()
    if len(names) < 2:
        pytest.skip("fewer than two GPU decoders installed")
    ref = _epochs(photos, "device")
    ways = [["torchcodec", "torchvision"]] if {"torchcodec", "torchvision"} <= set(names) else []
    ways += [[a, b] for i, a in enumerate(names) for b in names[i + 1 :] if [a, b] not in ways]
    ways += ["auto"]
    for way in ways:
        ld = packer.PackLoader(photos, 8, device="cuda", image_size=12, seed=4, decode=way)
        got = []
        for e in (0, 1):
            ld.set_epoch(e)
            got += [(x, y) for x, y in ld]
        assert len(got) == len(ref), way
        for (a, ya), (b, yb) in zip(ref, got):
            assert b.is_cuda and torch.equal(ya, yb.cpu()), way
            assert (a.int() - b.cpu().int()).abs().float().mean() <= 2.0, way
        if way == "auto":
            assert ld.decode_path == "; ".join(f"{n}: full+crop" for n in default_lanes())


def test_best_lanes_takes_the_batched_decoders_where_they_run(monkeypatch) -> None:
    """Issue 44: where the batched nvImageCodec decoders start (nvImageCodec, a C
    compiler, CUDA), they are the default lanes, NVBATCH_LANES of them; where they do not,
    nvjpeg's lanes as before (the test above)."""
    import packer.imaging.decoders_split as S

    made = []

    def fake(device, lanes, backends="hw", roi=False, hw_load=1.0, threads=0):
        made.append((str(device), lanes, backends, roi, threads))
        return [f"nvbatch-{k}" for k in range(lanes)]

    monkeypatch.setattr(S, "nvimgcodec_batched", fake)
    assert best_lanes(CUDA) == [f"nvbatch-{k}" for k in range(S.NVBATCH_LANES)]
    share = S.node_share(S.NVBATCH_LANES)  # the node's cores, not nvImageCodec's default
    assert made == [(str(CUDA), S.NVBATCH_LANES, "hw", False, share)] and share >= 1
    assert [d.name for d in best_lanes("cpu")] == ["cpu"]  # the CPU never asks for them


def test_the_batched_decoder_on_cuda_without_cuda_says_why() -> None:
    pytest.importorskip("nvidia.nvimgcodec")
    if torch.cuda.is_available():
        pytest.skip("CUDA is here")
    from packer.imaging.decoders_split import nvimgcodec_batched

    with pytest.raises(UsageError, match="torch sees no CUDA device"):
        nvimgcodec_batched("cuda")
