"""examples/train_sets_ddp.py over gloo on CPU processes (issue 34's CPU part): a DDP run
on 4 ranks stopped mid-epoch and resumed on 2 ranks with the same global batch trains on
every image of the set exactly once, ids checked from the pixels the ranks received."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

import packer
from conftest import subprocess_env, write_image
from helpers.forked import start_script
from packer.builder.api import BuildConfig, build

ROOT = Path(__file__).resolve().parents[2]
N = 24


def _torchrun(nproc: int, *args: str) -> dict:
    """The example on ``nproc`` ranks, each a process of its own with what torchrun
    would set (rank, world, the rendezvous on a free port); rank 0's last line. Not
    through ``torch.distributed.run`` itself: its launcher is one more interpreter
    importing torch and its rendezvous takes seconds (about half this test's time),
    and what is tested is the ranks' data, not the launcher."""
    from helpers.local_server import free_port

    rendezvous = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    procs = [  # each a fork of this process (tests/helpers/forked.py): torch imported
        start_script(
            ROOT / "examples" / "train_sets_ddp.py",
            args,
            env=subprocess_env(
                OMP_NUM_THREADS="1",
                RANK=str(rank),
                LOCAL_RANK=str(rank),
                WORLD_SIZE=str(nproc),
                LOCAL_WORLD_SIZE=str(nproc),
                **rendezvous,
            ),
        )
        for rank in range(nproc)
    ]
    outs = []
    try:
        for p in procs:
            r = p.wait(timeout=240)
            assert r.returncode == 0, r.stderr[-3000:]
            outs.append(r.stdout)
    finally:
        for p in procs:
            p.kill()
    return json.loads(outs[0].strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("order", ["shards"])
def test_ddp_stopped_on_4_ranks_and_resumed_on_2_sees_every_image_once(
    tmp_path: Path, order: str
) -> None:
    for i in range(N):
        write_image(tmp_path / "src" / f"c{i % 2}" / f"{i:02d}.png", (20, 16), seed=i)
    build(tmp_path / "src", tmp_path / "set", BuildConfig(size=(8, 6), workers=1, shard_size=432))
    assert len(packer.load(tmp_path / "set").index.shards) == 8
    common = ["--pack", str(tmp_path / "set"), "--device", "cpu", "--model", "tiny"]
    common += ["--order", order, "--state", str(tmp_path / "run"), "--check-ids"]
    first = _torchrun(4, *common, "--batch-size", "2", "--stop-after", "1")
    assert first["steps"] == 1 and first["state"]["batches"] == 1
    second = _torchrun(2, *common, "--batch-size", "4", "--resume")
    assert second["first_batch"] == 1 and second["steps"] == 2 and second["epoch"] == 0
    lines = [json.loads(x) for x in (tmp_path / "run" / "seen.jsonl").read_text().splitlines()]
    assert [(r["world"], r["batch"]) for r in lines] == [(4, 0), (2, 1), (2, 2)]
    seen = Counter(i for r in lines for ids in r["ids"] for i in ids)
    assert seen == Counter(range(N))  # none repeated, none skipped


@pytest.mark.slow
def test_one_rank_without_ddp_wrapper_sees_every_image_once(tmp_path: Path) -> None:
    """``--no-ddp`` (the benchmarks' measure of what DDP's wrapper costs) trains the
    same epoch, every image once."""
    for i in range(N):
        write_image(tmp_path / "src" / f"c{i % 2}" / f"{i:02d}.png", (20, 16), seed=i)
    build(tmp_path / "src", tmp_path / "set", BuildConfig(size=(8, 6), workers=1, shard_size=432))
    common = ["--pack", str(tmp_path / "set"), "--device", "cpu", "--model", "tiny"]
    common += ["--state", str(tmp_path / "run"), "--check-ids", "--threads", "1"]
    out = _torchrun(1, *common, "--batch-size", "8", "--no-ddp")
    assert out["steps"] == 3 and out["world_size"] == 1
    lines = [json.loads(x) for x in (tmp_path / "run" / "seen.jsonl").read_text().splitlines()]
    assert Counter(i for r in lines for ids in r["ids"] for i in ids) == Counter(range(N))
