"""The cut tail (packer.builder.tail) against a parent killed (SIGKILL) just after it
journaled a cut chunk: the rerun resumes to the same pack, byte for byte, as a build in
one process (no tail), every image and skip counted once; broken images in several parts
of the cut chunks are skipped as in that build."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import pack_digests, subprocess_env, write_image
from packer.builder.run import BuildConfig, build
from packer.pack.writer import block_rows_for

N = 256 * 7 + 40  # chunks of 8 rows: the last wave is cut
BLOCK = block_rows_for(N)
# broken files in different parts of the last chunks (parts of 4 rows), and earlier
BAD = {5, N - 1, N - 3, N - 6, N - BLOCK - 2, N - BLOCK - 7, N - 2 * BLOCK - 1}

KILL_AFTER_A_CUT_CHUNK = r"""
import os, signal, sys
from packer.builder import tail
from packer.builder.run import BuildConfig, build
journal = tail._journal
def journal_then_die(ready, record):
    journal(ready, record)
    if any(r[4] is None for r in ready):  # a cut chunk (no worker times) is journaled
        os.kill(os.getpid(), signal.SIGKILL)
tail._journal = journal_then_die
build(sys.argv[1], sys.argv[2], BuildConfig(size=(8, 8), workers=3))
"""


def test_a_parent_killed_in_the_tail_resumes_to_the_same_pack(tmp_path: Path) -> None:
    src = tmp_path / "src"
    for i in range(N):
        p = src / f"c{i % 2}" / f"{i:05d}.jpg"
        if i in BAD:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(b"not a jpeg")
            continue
        write_image(p, (12 + i % 5, 10 + i % 3), seed=i, quality=80)
    p = subprocess.run([sys.executable, "-c", KILL_AFTER_A_CUT_CHUNK, str(src), str(tmp_path / "k")],
                       env=subprocess_env(), capture_output=True, text=True, timeout=120)  # fmt: skip
    assert p.returncode == -9, p.stderr[-2000:]  # killed in the tail, not finished
    assert not (tmp_path / "k").exists()
    resumed = build(src, tmp_path / "k", BuildConfig(size=(8, 8), workers=3))
    one = build(src, tmp_path / "one", BuildConfig(size=(8, 8), workers=1))
    assert "tail_parts" not in one.extra["parent"]
    assert resumed.count == one.count == N - len(BAD)
    assert resumed.skipped == one.skipped and len(one.skipped) == len(BAD)
    assert pack_digests(tmp_path / "k") == pack_digests(tmp_path / "one")
