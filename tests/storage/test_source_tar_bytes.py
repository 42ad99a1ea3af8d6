"""WebDataset tars read from a bucket in place (no spool: ``spool_bytes=0``; the spool is
tests/storage/test_source_tar_spool.py): each shard's bytes cross the network about once
while the workers build (not once per worker), whatever the server answers a ranged
read with; the output equals the build from the same tars on disk; a killed build
resumes byte-identical. The bytes are counted on the wire by a proxy between the
client and the repository's S3 test server (``rclone serve s3``, which answers a ranged
read with status 200 and a Content-Range)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
import s3_server as fx
from s3_server import BUCKET

from helpers.counting_proxy import CountingProxy
from helpers.local_server import S3Server
from helpers.optional import needs
from packer.builder.api import BuildConfig, build
from packer.builder.formats.options import SourceOptions
from packer.builder.run import work_dir_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sources"))
from source_data import digests, tree, write_shards

pytestmark = needs("webdataset")

s3, s3_server = fx.s3, fx.s3_server  # the fixtures
CONFIG = BuildConfig(size=(16, 12), workers=3)


def _shards(s3: S3Server, tmp_path: Path) -> tuple[str, str, int]:
    """32 images as 4 shards of 8 samples, on disk and in the bucket: the local brace
    pattern, the bucket's, and the shards' total bytes."""
    from packer.storage.client import open_store
    from packer.storage.url import parse_url

    folder = tree(tmp_path / "src", n=8)
    files = write_shards(folder, tmp_path / "shards", maxcount=8)
    assert len(files) == 4
    prefix = f"tars/{uuid.uuid4().hex[:10]}"
    store = open_store(parse_url(f"s3://{BUCKET}/{prefix}"))
    for f in files:
        store.put(f, f.name)
    local = str(tmp_path / "shards" / "train-{000000..000003}.tar")
    url = f"s3://{BUCKET}/{prefix}/train-{{000000..000003}}.tar"
    return local, url, sum(f.stat().st_size for f in files)


def test_bucket_tars_cross_the_network_once_while_workers_build(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local, url, total = _shards(s3, tmp_path)
    # a read-ahead far smaller than a shard, as 4 MiB is next to real shards: a label
    # read after its shard's headers were all read would fetch the shard again
    config = replace(CONFIG, sources=SourceOptions(_read_ahead=8192, spool_bytes=0))
    proxy = CountingProxy(s3.port)
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        listed: list[int] = []
        r = build(
            url, tmp_path / "from_bucket", config, on_start=lambda *_: listed.append(proxy.down)
        )
        fetched = proxy.down - listed[0]
    finally:
        proxy.stop()
    assert r.count == 32 and not r.skipped
    # 32 chunks of one image on 3 workers: each worker fetching each shard whole was
    # ~3x; the members' bytes once, plus each request's headers (~1 KB), is ~1x
    assert fetched <= 1.05 * total + 32 * 1024, (fetched, total)
    assert listed[0] <= 1.05 * total + 64 * 1024, (listed[0], total)  # the listing: once
    build(local, tmp_path / "from_disk", CONFIG)
    assert digests(tmp_path / "from_bucket") == digests(tmp_path / "from_disk")


KILL_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    from packer.builder.api import BuildConfig, build
    seen = 0
    def progress(n):
        global seen
        seen += 1
        if seen == 5:
            os.kill(os.getpid(), signal.SIGKILL)
    if __name__ == "__main__":  # worker processes import this module
        build(sys.argv[1], sys.argv[2], BuildConfig(size=(16, 12), workers=3), progress=progress)
""")


def test_killed_bucket_tar_build_resumes_byte_identical(s3: S3Server, tmp_path: Path) -> None:
    local, url, _ = _shards(s3, tmp_path)
    ref = tmp_path / "ref"
    build(local, ref, CONFIG)
    dst = tmp_path / "out" / "pack"
    dst.parent.mkdir()
    (tmp_path / "kill.py").write_text(KILL_SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    p = subprocess.run(
        [sys.executable, str(tmp_path / "kill.py"), url, str(dst)],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    assert not dst.exists() and (work_dir_for(dst) / "journal.jsonl").exists()
    r = build(url, dst, CONFIG)
    assert r.resumed >= 5 and r.count == 32
    assert digests(dst) == digests(ref)
    assert sorted(os.listdir(dst.parent)) == ["pack"]  # nothing left beside it
