"""PackLoader under torch.distributed (gloo, CPU): ranks from the process group."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _worker(rank: int, world: int, pack: str, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    import packer

    p = packer.load(pack)
    loader = packer.PackLoader(p, 2, device="cpu", seed=7)  # rank/world from the group
    seen = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        batches = 0
        ids = []
        for x, _ in loader:
            flat = p.images.reshape(len(p), -1)
            ids += [int((flat == r.reshape(1, -1)).all(1).nonzero()[0]) for r in x]
            batches += 1
        seen.append((batches, ids))
    torch.save(seen, f"{out}/rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_split_every_epoch(packed: Path, tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    world = 2
    # forked ranks (torch already imported here), not spawned fresh interpreters
    mp.start_processes(
        _worker,
        args=(world, str(packed), port, str(tmp_path)),
        nprocs=world,
        join=True,
        start_method="fork",
    )
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    for epoch in range(2):
        counts = [results[r][epoch][0] for r in range(world)]
        ids = [results[r][epoch][1] for r in range(world)]
        assert counts[0] == counts[1] == 4  # 13 images -> 7 per rank -> 4 batches of 2
        union = ids[0] + ids[1]
        assert set(union) == set(range(13))
        assert len(union) - 13 == 1  # only the documented padding repeats
    assert results[0][0][1] != results[0][1][1]  # set_epoch reshuffles
