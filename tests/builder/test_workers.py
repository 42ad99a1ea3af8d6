"""The build's decode worker pool: a worker that dies is retried once, then a clear
error, and the rerun resumes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from PIL import Image

import packer
import packer.builder.run
from conftest import assert_same_pack, subprocess_env
from packer.builder.run import BuildConfig, build

ENV = subprocess_env()


DEAD_WORKER = textwrap.dedent("""
    import sys
    from packer.builder.run import BuildConfig, build
    from packer.errors import PackerError
    if __name__ == "__main__":
        try:
            build(sys.argv[1], sys.argv[2], BuildConfig(size=(8, 8), workers=2))
        except PackerError as e:
            print(f"Error: {e}", file=sys.stderr)
            sys.exit(e.exit_code)
""")


DIES_AT = 75  # of 150 chunks (2 images each): earlier ones journaled, later ones pending


@pytest.fixture
def flat300(tmp_path: Path) -> Path:
    src = tmp_path / "flat"
    src.mkdir()
    for i in range(300):  # 150 chunks (block_rows_for(300) == 2)
        Image.new("L", (4, 4), i % 256).save(src / f"{i:03d}.png")
    return src


def run_dead_worker(tmp_path: Path, src: Path, dst: Path, when: str) -> tuple[int, str]:
    """Build in a subprocess whose pool worker SIGKILLs itself as it starts chunk
    DIES_AT (packer.builder.run's test hook): ``once`` (then the retry pool gets through) or
    ``always`` (the retry pool's worker dies too). The kill lands while that chunk is
    unfinished, however fast the other worker runs: no race with the machine's load."""
    script = tmp_path / "dead.py"
    script.write_text(DEAD_WORKER)
    marker = tmp_path / "died-once"
    hook = f"{DIES_AT}:{marker}" if when == "once" else str(DIES_AT)
    with open(tmp_path / "log.txt", "w") as log:  # not a pipe: see test_build_resume
        p = subprocess.run(
            [sys.executable, str(script), str(src), str(dst)],
            stdout=log,
            stderr=log,
            env={**ENV, packer.builder.run.TEST_DEATH_ENV: hook},
            timeout=60,  # the old pool waited here forever
        )
    assert marker.exists() == (when == "once")
    return p.returncode, (tmp_path / "log.txt").read_text()


def test_one_dead_worker_is_survived(flat300: Path, tmp_path: Path) -> None:
    rc, err = run_dead_worker(tmp_path, flat300, tmp_path / "pack", "once")
    assert rc == 0, err
    assert "a decode worker died; retrying" in err
    build(flat300, tmp_path / "ref", BuildConfig(size=(8, 8), workers=1))
    assert_same_pack(tmp_path / "pack", tmp_path / "ref")


def test_workers_dying_again_end_the_build_clearly_and_rerun_resumes(
    flat300: Path, tmp_path: Path
) -> None:
    src, dst = flat300, tmp_path / "pack"
    rc, err = run_dead_worker(tmp_path, src, dst, "always")
    assert rc == 1, err
    assert "Error: a decode worker died twice" in err and "run the same command again" in err
    assert "Traceback" not in err
    assert not dst.exists()
    r = build(src, dst, BuildConfig(size=(8, 8), workers=2))
    assert r.count == 300 and r.resumed >= 1
    build(src, tmp_path / "ref", BuildConfig(size=(8, 8), workers=1))
    assert_same_pack(dst, tmp_path / "ref")


def _die() -> None:
    os._exit(1)


def test_a_pool_that_breaks_while_chunks_are_submitted_is_a_dead_worker_not_a_traceback() -> None:
    """``submit`` itself raises BrokenProcessPool once the pool knows a worker died (seen
    in CI: the retry pool's worker died before all its chunks were queued)."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    from packer.builder.chunks import _run_chunks
    from packer.builder.workers import _decode_chunk

    pool = ProcessPoolExecutor(1, mp_context=mp.get_context("fork"))
    with pytest.raises(BrokenProcessPool):
        pool.submit(_die).result()
    wrote_plan, recorded = [], []
    times: dict = {"wait": 0.0}
    ok = _run_chunks(
        pool,
        [(0, 0, ["a.jpg"]), (1, 1, ["b.jpg"])],
        {},
        recorded.append,
        _decode_chunk,
        times,
        lambda: wrote_plan.append(True),
    )
    pool.shutdown(wait=True)
    assert ok is False and recorded == [] and wrote_plan == [True]
