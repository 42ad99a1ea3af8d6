"""The last wave of chunks cut into parts (packer.builder.tail): the same pack, byte for
byte, as a build that decodes every chunk whole; a worker that dies in the tail costs
its chunks, not the build."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import pack_digests, subprocess_env, write_image
from packer.builder.run import TEST_DEATH_ENV, BuildConfig, build
from packer.builder.tail import MIN_PART_ROWS, PARTS, cut_tail, hash_rows, run_with_tail
from packer.pack.writer import block_rows_for

N = 256 * 7 + 40  # the fewest images whose chunks have 8 rows: the tail is cut
BLOCK = block_rows_for(N)


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tail") / "src"
    for i in range(N):
        if i == N - 3:  # a broken file in the last chunk: its skip must survive the cut
            (root / "c1").mkdir(parents=True, exist_ok=True)
            (root / "c1" / f"{i:05d}.jpg").write_bytes(b"not a jpeg")
            continue
        write_image(root / f"c{i % 2}" / f"{i:05d}.jpg", (12 + i % 5, 10), seed=i, quality=80)
    return root


def test_cut_tail_cuts_the_last_wave_only() -> None:
    chunks = [(k, k * 10, [f"{k}-{i}" for i in range(10)]) for k in range(5)]
    tasks, cut = cut_tail(chunks, workers=2)
    assert cut == {3: 2, 4: 2}  # 10 rows: as many parts as MIN_PART_ROWS allows
    assert [t for t, part in tasks if not part] == chunks[:3]
    parts = [t for t, part in tasks if part]
    assert [p[1] for p in parts] == [30, 35, 40, 45]  # each part's first row
    assert [x for p in parts for x in p[2]] == chunks[3][2] + chunks[4][2]  # every row once
    assert cut_tail(chunks, workers=5) == ([(c, False) for c in chunks], {})  # one wave
    small = [(k, k * 7, ["x"] * 7) for k in range(4)]
    assert cut_tail(small, workers=2)[1] == {}  # fewer than 2 parts of MIN_PART_ROWS
    big = [(k, k * 64, ["x"] * 64) for k in range(3)]
    assert cut_tail(big, workers=1)[1] == {2: PARTS}


def test_hash_rows_is_the_workers_hash(tmp_path: Path) -> None:
    data = bytes(range(256)) * 100
    (tmp_path / "rows").write_bytes(data)
    assert hash_rows(tmp_path / "rows", 300, 5000) == hashlib.sha256(data[300:5300]).hexdigest()
    with pytest.raises(OSError, match="ends before byte"):
        hash_rows(tmp_path / "rows", len(data) - 10, 20)


def test_a_cut_tail_builds_the_same_bytes_as_whole_chunks(tree: Path, tmp_path: Path) -> None:
    assert BLOCK >= 2 * MIN_PART_ROWS
    whole = build(tree, tmp_path / "whole", BuildConfig(size=(8, 8), workers=1))
    cut = build(tree, tmp_path / "cut", BuildConfig(size=(8, 8), workers=2))
    assert cut.extra["parent"]["tail_parts"] >= 2 * 2  # the last two chunks, cut
    assert "tail_parts" not in whole.extra["parent"]
    assert len(cut.skipped) == len(whole.skipped) == 1
    assert pack_digests(tmp_path / "cut") == pack_digests(tmp_path / "whole")


def test_a_worker_dying_in_the_tail_costs_its_chunk_not_the_build(
    tree: Path, tmp_path: Path
) -> None:
    last = -(-N // BLOCK) - 1  # a chunk of the cut wave
    # in a fresh interpreter: a fork server this process started earlier (a test run
    # with threads) would hand the workers its older environment, without the hook
    code = (
        "import sys; from packer.builder.run import BuildConfig, build; "
        "print(build(sys.argv[1], sys.argv[2], BuildConfig(size=(8, 8), workers=2)).count)"
    )
    env = {**subprocess_env(), TEST_DEATH_ENV: f"{last}:{tmp_path / 'died'}"}
    p = subprocess.run([sys.executable, "-c", code, str(tree), str(tmp_path / "p")],
                       env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert (tmp_path / "died").exists()  # a part of the last chunk killed its worker
    build(tree, tmp_path / "whole", BuildConfig(size=(8, 8), workers=1))
    assert int(p.stdout.split()[-1]) == N - 1
    assert pack_digests(tmp_path / "p") == pack_digests(tmp_path / "whole")


def test_chunks_that_arrive_together_are_journaled_with_one_fsync(tmp_path: Path) -> None:
    """Every result already in when the parent looks (here: the pool drained before the
    loop starts) is journaled as one batch: each line written, the file fsynced once,
    after the last."""
    from packer.builder.chunks import start_pool
    from packer.builder.workers import _decode_chunk
    from packer.imaging.decode import ResizeSpec

    paths = [str(write_image(tmp_path / f"{i}.jpg", (16, 12), seed=i)) for i in range(6)]
    spec = ResizeSpec(8, 8)
    rows = tmp_path / "rows"
    rows.write_bytes(bytes(len(paths) * 3 * 8 * 8))
    chunks = [(k, k, [p]) for k, p in enumerate(paths)]
    pool = start_pool(2, rows, spec)
    calls: list[tuple[int, bool]] = []
    times: dict = {"wait": 0.0, "chunks": []}
    try:
        ok = run_with_tail(
            pool, chunks, 2, rows, 3 * 8 * 8, {},
            lambda res, sync=True: calls.append((res[0], sync)),
            _decode_chunk, times, lambda: pool.shutdown(wait=True),
        )  # fmt: skip
    finally:
        pool.shutdown(wait=True)
    assert ok is True
    assert sorted(k for k, _ in calls) == list(range(6))
    assert [sync for _, sync in calls] == [False] * 5 + [True]
