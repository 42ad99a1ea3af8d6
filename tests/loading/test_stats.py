"""PackLoader.stats() (issue 44.3): the arithmetic of packer.loading.stats with a fake
clock, its thread safety, the loader's stats on the CPU (raw and JPEG packs), the
one warning that names the slowest stage, stats=False, and verify's --json."""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from pathlib import Path

import pytest
import torch

import packer
from conftest import cli_run
from packer.builder.run import BuildConfig, build
from packer.errors import UsageError
from packer.imaging import decoders as D
from packer.loading.stats import (
    AUGMENT,
    CROP,
    DECODE,
    READ,
    LoaderStats,
    Stats,
    StatsConfig,
)

CPU = torch.device("cpu")
MS = 1e-3


class FakeClock:
    """Seconds that move only when a test moves them."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _pass(st: Stats, clock: FakeClock, waits: list[float], step: float, images: int = 8) -> None:
    """A consumer's pass: per batch it waits ``waits[i]``, then computes ``step``."""
    prev = None
    for w in waits:
        start = clock.t
        clock.t += w
        st.consumed(start, clock.t, prev, images)
        prev = clock.t
        clock.t += step


def test_wait_percentiles_total_share_and_reset() -> None:
    clock = FakeClock()
    st = Stats(StatsConfig(clock=clock, warn_share=None))
    waits = [i * MS for i in range(1, 101)]  # 1..100 ms
    _pass(st, clock, waits, step=5 * MS)
    s = st.snapshot()
    assert (s.batches, s.images) == (100, 800)
    assert s.wait_s == pytest.approx(5.050)
    # wall: the first batch's interval is its wait; each later one adds the 5 ms step
    assert s.wall_s == pytest.approx(5.050 + 99 * 0.005)
    assert s.wait_share == pytest.approx(5.050 / 5.545)
    assert s.wait_p50_s == pytest.approx(50.5 * MS)  # linear interpolation
    assert s.wait_p99_s == pytest.approx(99.01 * MS)
    # reset: a new window
    again = st.snapshot()
    assert (again.batches, again.images, again.wall_s, again.wait_s) == (0, 0, 0.0, 0.0)
    assert again.wait_share == 0.0 and again.wait_p99_s == 0.0
    _pass(st, clock, [2 * MS, 4 * MS], step=1.0)
    s = st.snapshot(reset=False)
    assert (s.batches, s.wait_s) == (2, pytest.approx(6 * MS))
    assert s.wall_s == pytest.approx(2 * MS + 1.0 + 4 * MS)
    assert st.snapshot().batches == 2  # reset=False kept the window


def test_time_between_passes_is_not_wall_time() -> None:
    clock = FakeClock()
    st = Stats(StatsConfig(clock=clock, warn_share=None))
    _pass(st, clock, [1.0, 1.0], step=1.0)
    clock.t += 1000.0  # validation, say: no pass runs
    _pass(st, clock, [1.0, 1.0], step=1.0)
    s = st.snapshot()
    assert s.wall_s == pytest.approx(6.0)  # 1 + (1 + 1) per pass
    assert s.wait_share == pytest.approx(4 / 6)


def test_stage_totals_means_and_slowest_per_worker() -> None:
    clock = FakeClock()
    st = Stats(StatsConfig(clock=clock, warn_share=None))
    for _ in range(4):
        bt = st.batch()
        clock.t += 2.0
        bt.lap(READ)
        clock.t += 7.0  # a wait: no stage's
        bt.mark()
        clock.t += 1.0
        bt.lap(CROP)
        bt.add(DECODE, 6.0)  # a decode thread's own measure
        clock.t += 0.5
        bt.lap(AUGMENT)
        st.produced(bt, lane=0)
    s = st.snapshot(reset=False)
    assert s.produced == 4 and s.batches == 0  # produced, none consumed yet
    assert s.stage_s == {"read": 8.0, "decode": 24.0, "crop": 4.0, "augment": 2.0, "copy": 0.0}
    assert s.stage_batch_s["read"] == 2.0 and s.stage_batch_s["decode"] == 6.0
    assert s.slowest_stage == "decode"
    st.set_workers(decode=4)  # 6 s a batch over 4 threads: 1.5 s, below read's 2 s
    s = st.snapshot(decode_path=("x: roi", "y: full+crop"))
    assert s.stage_workers["decode"] == 4 and s.slowest_stage == "read"
    assert s.decode_path == ("x: roi", "y: full+crop") and s.lane_batches == (4, 0)
    assert st.snapshot().slowest_stage is None  # nothing timed in the new window


def test_percentiles_from_a_bounded_sample() -> None:
    clock = FakeClock()
    st = Stats(StatsConfig(clock=clock, warn_share=None, sample=64))
    waits = [(i % 1000) * MS for i in range(5000)]
    _pass(st, clock, waits, step=0.0)
    assert len(st._win.waits) == 64  # memory does not grow with the batches
    s = st.snapshot()
    assert s.batches == 5000 and s.wait_s == pytest.approx(sum(waits))  # exact sums
    assert 0.2 < s.wait_p50_s < 0.8  # a uniform sample of 0..999 ms
    assert s.wait_p99_s <= 0.999


def test_several_producer_and_consumer_threads_lose_nothing() -> None:
    st = Stats(StatsConfig(warn_share=None))
    n, k = 2000, 6
    go = threading.Barrier(2 * k)

    def producer() -> None:
        go.wait()
        for _ in range(n):
            bt = st.batch()
            bt.add(READ, 0.5)
            bt.add(DECODE, 0.25)
            st.produced(bt, lane=1)

    def consumer() -> None:
        go.wait()
        prev = None
        for i in range(n):
            st.consumed(float(i), i + 0.25, prev, 3)
            prev = i + 0.25

    threads = [threading.Thread(target=f) for f in (producer, consumer) for _ in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s = st.snapshot(decode_path=("a", "b"))
    assert s.produced == n * k and s.lane_batches == (0, n * k)
    assert s.stage_s["read"] == 0.5 * n * k and s.stage_s["decode"] == 0.25 * n * k
    assert (s.batches, s.images) == (n * k, 3 * n * k)
    assert s.wait_s == 0.25 * n * k and s.wall_s == pytest.approx(k * (0.25 + (n - 1)))


# ---- the warning


def _judged(share_wait: float, passes: int = 1, window: int = 20) -> Stats:
    clock = FakeClock()
    st = Stats(StatsConfig(clock=clock, warn_share=0.05, warn_window=window))
    for _ in range(passes):
        for _ in range(window + 1):
            bt = st.batch()
            bt.add(READ, 0.001)
            bt.add(DECODE, 0.02)
            st.produced(bt, lane=0)
        _pass(st, clock, [share_wait] * (window + 1), step=1.0 - share_wait)
    return st


def test_warning_fires_once_and_names_the_slowest_stage(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="packer"):
        _judged(0.10, passes=5)
    got = [r.getMessage() for r in caplog.records if "waited for batches" in r.getMessage()]
    assert len(got) == 1, got
    assert "10.0%" in got[0] and "slowest stage is decode" in got[0] and "20 batches" in got[0]
    assert caplog.records[0].name.startswith("packer.")


def test_no_warning_below_the_threshold(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="packer"):
        _judged(0.04, passes=5)
    assert "waited for batches" not in caplog.text


def test_a_pass_first_batch_alone_never_warns(caplog: pytest.LogCaptureFixture) -> None:
    """The first batch of a pass waits for the pipeline to fill: not starvation."""
    clock = FakeClock()
    st = Stats(StatsConfig(clock=clock, warn_share=0.05, warn_window=5))
    with caplog.at_level(logging.WARNING, logger="packer"):
        for _ in range(10):
            _pass(st, clock, [30.0, 0.0, 0.0], step=1.0)  # 30 s first waits, 20 later batches
    assert "waited for batches" not in caplog.text
    assert st.snapshot().wait_share > 0.5  # the stats themselves count them


def test_the_loader_warns_once_naming_a_slow_transform(
    pack6: packer.ImagePack, caplog: pytest.LogCaptureFixture
) -> None:
    def slow(images: torch.Tensor) -> torch.Tensor:
        time.sleep(0.01)  # a deliberately slow augmentation; the loop waits for it
        return images

    cfg = StatsConfig(warn_window=4)
    ld = packer.PackLoader(pack6, 1, device="cpu", transform=slow, stats=cfg)
    with caplog.at_level(logging.WARNING, logger="packer"):
        for e in range(3):
            ld.set_epoch(e)
            assert len([x for x, _ in ld]) == 6
    got = [r.getMessage() for r in caplog.records if "waited for batches" in r.getMessage()]
    assert len(got) == 1 and "slowest stage is augment" in got[0], got
    s = ld.stats()
    assert s.slowest_stage == "augment" and s.stage_batch_s["augment"] >= 0.01


# ---- the loader


def test_raw_pack_stats_count_what_was_consumed(pack6: packer.ImagePack) -> None:
    ld = packer.PackLoader(pack6, 2, device="cpu", shuffle=False)
    it = iter(ld)
    first = [next(it) for _ in range(2)]
    s = ld.stats()
    assert (s.batches, s.images) == (2, sum(len(x) for x, _ in first))
    assert 0.0 < s.wait_s <= s.wall_s and 0.0 < s.wait_share <= 1.0
    assert s.wait_p50_s <= s.wait_p99_s <= s.wait_s
    rest = list(it)
    s = ld.stats()
    assert (s.batches, s.images) == (len(rest), 6 - 4)  # since the previous call
    assert ld.stats().batches == 0
    ld.set_epoch(1)
    assert sum(len(x) for x, _ in ld) == 6
    s = ld.stats()
    assert (s.batches, s.images, s.produced) == (3, 6, 3)
    assert s.stage_s["read"] > 0 and s.stage_s["decode"] == s.stage_s["crop"] == 0.0
    assert s.decode_path is None and s.lane_batches is None
    assert s.slowest_stage in ("read", "augment")
    assert json.loads(json.dumps(s.as_dict())) == s.as_dict()
    assert LoaderStats.from_dict(s.as_dict()) == s


def test_stats_off_record_nothing_and_say_so(pack6: packer.ImagePack) -> None:
    ld = packer.PackLoader(pack6, 2, device="cpu", stats=False)
    assert sum(len(x) for x, _ in ld) == 6
    with pytest.raises(UsageError, match=r"keeps no stats \(made with stats=False\)"):
        ld.stats()
    with pytest.raises(UsageError, match="stats must be True, False or a StatsConfig"):
        packer.PackLoader(pack6, 2, device="cpu", stats="on")
    with pytest.raises(UsageError, match=r"StatsConfig.warn_share must be in \[0, 1\]"):
        packer.PackLoader(pack6, 2, device="cpu", stats=StatsConfig(warn_share=5))
    with pytest.raises(UsageError, match=r"StatsConfig.warn_window must be an int >= 1"):
        packer.PackLoader(pack6, 2, device="cpu", stats=StatsConfig(warn_window=0))


def test_stats_on_read_the_config_clock_off_has_none(pack6: packer.ImagePack) -> None:
    """stats=False costs nothing: not a clock read, on any thread (the loader's own
    clock is the config's: with stats on the same loop reads it)."""
    calls = []

    def clock() -> float:
        calls.append(1)
        return time.perf_counter()

    on = packer.PackLoader(pack6, 2, device="cpu", stats=StatsConfig(clock=clock))
    assert sum(len(x) for x, _ in on) == 6 and calls
    from packer.loading.stats import NoStats

    off = packer.PackLoader(pack6, 2, device="cpu", stats=False)
    assert isinstance(off._stats, NoStats) and off._stats.clock is None
    assert sum(len(x) for x, _ in off) == 6


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from packer.measure.bench.synth import make_jpeg_tree

    tmp = tmp_path_factory.mktemp("stats")
    make_jpeg_tree(tmp / "a", 21, (61, 47), quality=90, threads=1)
    build(tmp / "a", tmp / "pack", BuildConfig(store="jpeg", workers=1))
    return tmp / "pack"


def test_jpeg_pack_on_cpu_threads_times_the_decode(jpegs: Path) -> None:
    ld = packer.PackLoader(jpegs, 4, device="cpu", image_size=12, decode="cpu")
    assert sum(len(x) for x, _ in ld) == 21
    s = ld.stats()
    assert (s.batches, s.images, s.produced) == (6, 21, 6)
    assert s.stage_s["decode"] > 0 and s.stage_s["read"] > 0
    assert s.stage_workers["decode"] == ld.num_threads
    assert s.decode_path == ("cpu threads: decode + crop per image",)
    assert s.lane_batches == (6,)


def test_jpeg_lanes_each_say_their_path_and_batches(jpegs: Path) -> None:
    lanes = [D.CpuDecoder(CPU, threads=0) for _ in range(2)]
    for name, d in zip("ab", lanes, strict=True):
        d.name = name
    ld = packer.PackLoader(jpegs, 4, device="cpu", image_size=12, decode=lanes)
    before = ld.stats()
    assert before.decode_path == ("a: not yet run", "b: not yet run")
    assert before.lane_batches == (0, 0)
    assert sum(len(x) for x, _ in ld) == 21
    s = ld.stats()
    assert s.lane_batches == (3, 3)  # batch b on lane b % 2
    assert s.decode_path == tuple(ld._decoding.paths) and len(s.decode_path) == 2
    assert all(p.split(": ")[1] != "not yet run" for p in s.decode_path)
    assert s.stage_workers["decode"] == 2
    assert s.stage_s["decode"] > 0 and s.stage_s["crop"] > 0
    assert math.isclose(s.stage_batch_s["decode"], s.stage_s["decode"] / 6)


def test_verify_json_carries_the_loader_stats(packed: Path) -> None:
    code, out, _ = cli_run(
        "verify", packed, "--device", "cpu", "--batch-size", "4", "--batches", "3",
        "--no-source", "--json",
    )  # fmt: skip
    assert code == 0, out
    st = json.loads(out)["stats"]
    assert st["batches"] == 3 * 3 and 9 <= st["images"] <= 36  # the timed batches only
    assert 0 <= st["wait_share"] <= 1 and st["stage_s"]["read"] > 0
    code, out, _ = cli_run(
        "verify", packed, "--device", "cpu", "--batch-size", "4", "--batches", "3", "--no-source"
    )
    assert code == 0 and "PackLoader.stats() of the timed batches" in out
    assert "the consumer waited" in out and "slowest: " in out


# ---- CUDA: the pinned path and the decoders' lanes (skipped without a GPU)


@pytest.mark.cuda
@pytest.mark.parametrize("way", [{}, {"gather": "device"}, {"resident": True}])
def test_cuda_raw_pack_stats(pack6: packer.ImagePack, way: dict) -> None:
    ld = packer.PackLoader(pack6, 2, device="cuda", **way)
    assert sum(len(x) for x, _ in ld) == 6
    s = ld.stats()
    assert (s.batches, s.images, s.produced) == (3, 6, 3)
    assert 0 < s.wait_s <= s.wall_s and s.stage_s["read"] > 0
    if not way:  # pinned slots: the host queues each copy (and waits for a slot's)
        assert s.stage_s["copy"] > 0 and s.stage_workers["read"] == ld.num_threads


@pytest.mark.cuda
def test_cuda_jpeg_lanes_say_their_path(jpegs: Path) -> None:
    ld = packer.PackLoader(jpegs, 4, device="cuda", image_size=12)
    assert sum(len(x) for x, _ in ld) == 21
    s = ld.stats()
    lanes = ld._decoding.lanes
    assert len(s.decode_path) == lanes and sum(s.lane_batches) == 6
    assert s.lane_batches == tuple(len(range(k, 6, lanes)) for k in range(lanes))
    assert all("not yet run" not in p for p in s.decode_path[: min(lanes, 6)])
    assert s.stage_s["decode"] > 0 and s.stage_s["crop"] > 0 and s.stage_workers["decode"] == lanes
