"""A build's phases on one clock (packer.builder.timeline), and the end of a build that
does not wait for its workers' exit before finalizing (packer.builder.chunks.release_pool)."""

from __future__ import annotations

import json
import multiprocessing as mp
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import packer.builder.run as pb
from conftest import subprocess_env
from packer.builder.chunks import release_pool
from packer.builder.run import BuildConfig, build
from packer.builder.timeline import TIMELINE_ENV, Timeline, cli_timeline

# the phases of a CPU build on the pool, in the order they must end
_POOL_PHASES = [
    "pool_spawned",
    "scanned",
    "locked",
    "prepared",
    "first_task_started",
    "first_chunk_journaled",
    "last_task_ended",
    "decoded",
    "rows_fsynced",
    "data_assembled",
    "manifest_written",
    "moved",
    "pool_joined",
    "unlocked",
]


def _nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def test_a_pool_builds_timeline_holds_every_phase_in_order(
    image_tree: Path, tmp_path: Path
) -> None:
    t = time.perf_counter()
    r = build(image_tree, tmp_path / "p", BuildConfig(size=(32, 32), workers=2))
    tl = r.extra["timeline"]
    assert set(tl) == set(_POOL_PHASES)
    assert list(tl.values()) == sorted(tl.values())  # in clock order
    # the workers' chunks run between the plan and the end of the decode; the parent's
    # journal of the first may come after the last has ended: two chains
    for chain in (_POOL_PHASES[:5] + _POOL_PHASES[6:], _POOL_PHASES[4:6] + _POOL_PHASES[7:]):
        assert [tl[k] for k in chain] == sorted(tl[k] for k in chain), chain
    assert tl["pool_spawned"] >= 0
    assert tl["unlocked"] <= round(r.seconds, 4)  # the call's time covers its last phase
    # one clock for every process: the call's reading lies between the caller's
    assert t <= r.extra["t0_monotonic"] <= time.perf_counter()


def test_a_one_worker_build_marks_the_phases_it_has(image_tree: Path, tmp_path: Path) -> None:
    r = build(image_tree, tmp_path / "p", BuildConfig(size=(32, 32), workers=1))
    tl = r.extra["timeline"]
    assert {"scanned", "first_chunk_journaled", "decoded", "manifest_written", "moved"} <= set(tl)
    assert tl["scanned"] <= tl["decoded"] <= tl["manifest_written"] <= tl["moved"]


def test_timeline_keeps_a_phases_first_mark_and_orders_by_clock() -> None:
    tl = Timeline(10.0)
    tl.mark("b", 12.0)
    tl.mark("a", 11.0)
    tl.mark("b", 13.0)  # a retried step does not move its phase
    assert tl.as_dict() == {"a": 1.0, "b": 2.0}
    got = cli_timeline({"cli_loaded": 9.5}, {"t0_monotonic": 10.0, "timeline": tl.as_dict()})
    assert got["monotonic"] == {"cli_loaded": 9.5, "a": 11.0, "b": 12.0}


def test_the_cli_writes_its_timeline_only_when_asked(image_tree: Path, tmp_path: Path) -> None:
    """``IMGPACK_BUILD_TIMELINE=FILE``: the command's readings and the library's phases on
    the clock of the process that launched it, from the command's load to the build's
    return; unset, nothing is written."""
    out = tmp_path / "timeline.json"
    args = [sys.executable, "-m", "packer", "build", str(image_tree), "--size", "16",
            "--workers", "2", "--quiet"]  # fmt: skip
    t = time.perf_counter()
    subprocess.run(
        [*args, str(tmp_path / "a")],
        env=subprocess_env(**{TIMELINE_ENV: str(out)}),
        check=True,
        capture_output=True,
        timeout=120,
    )
    done = time.perf_counter()
    got = json.loads(out.read_text())
    phases = got["monotonic"]
    assert list(phases)[:3] == ["cli_loaded", "cli_command", "build_called"]
    assert list(phases)[-1] == "build_returned"
    assert set(_POOL_PHASES) <= set(phases)
    assert t < phases["cli_loaded"] and phases["build_returned"] < done
    assert got["extra"]["worker"]["decode"] > 0
    out.unlink()
    subprocess.run(
        [*args, str(tmp_path / "b")],
        env={k: v for k, v in subprocess_env().items() if k != TIMELINE_ENV},
        check=True,
        capture_output=True,
        timeout=120,
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "imgs"]  # no timeline


def test_release_pool_returns_while_a_worker_runs_and_its_wait_bounds_it() -> None:
    pool = ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"))
    pool.submit(_nap, 0.0).result(timeout=60)  # started
    pool.submit(_nap, 600.0)  # busy far past the bound
    (proc,) = pool._processes.values()  # type: ignore[attr-defined]
    wait = release_pool(pool, timeout=1.0)
    assert proc.is_alive()  # released, not waited for
    wait()
    assert not proc.is_alive() and proc.exitcode != 0  # killed at the bound


def test_the_workers_exit_is_waited_for_after_the_pack_is_in_place(
    image_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The build tells its workers to exit when the last chunk is in, finalizes, and
    only then waits for them: their exit overlaps the fsync, manifest and rename."""
    events: list[str] = []
    real_release, real_finalize = pb.release_pool, pb._finalize

    def release(pool: Any, *args: Any) -> Any:
        events.append("released")
        wait = real_release(pool, *args)

        def waited() -> None:
            events.append("waited")
            wait()

        return waited

    def finalize(*args: Any, **kwargs: Any) -> Any:
        events.append("finalize")
        result = real_finalize(*args, **kwargs)
        events.append("in place")
        return result

    monkeypatch.setattr(pb, "release_pool", release)
    monkeypatch.setattr(pb, "_finalize", finalize)
    r = build(image_tree, tmp_path / "p", BuildConfig(size=(32, 32), workers=2))
    assert events == ["released", "finalize", "in place", "waited"]
    assert r.count > 0 and (tmp_path / "p").is_dir()


def test_the_workers_are_waited_for_when_finalizing_fails(
    image_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    waited: list[bool] = []
    real_release = pb.release_pool

    def release(pool: Any, *args: Any) -> Any:
        procs = list(pool._processes.values())  # the executor forgets them at shutdown
        wait = real_release(pool, *args)

        def waited_for() -> None:
            wait()
            waited.append(all(not p.is_alive() for p in procs))

        return waited_for

    def finalize(*args: Any, **kwargs: Any) -> Any:
        raise OSError("disk gone")

    monkeypatch.setattr(pb, "release_pool", release)
    monkeypatch.setattr(pb, "_finalize", finalize)
    with pytest.raises(OSError, match="disk gone"):
        build(image_tree, tmp_path / "p", BuildConfig(size=(32, 32), workers=2))
    assert waited == [True]
