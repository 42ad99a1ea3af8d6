"""What a bucket or a local folder may make imgpack do: a local folder's contents never
choose a remote to contact or a place to write (only a cache pointer this user's imgpack
signed for that folder is followed), and no object is read whole before its size is
checked against the reader's cap."""

from __future__ import annotations

import os
import resource
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import s3_server as fx
from s3_server import RAW, SilentServer, bucket_path, built

import packer
from helpers.local_server import S3Server
from packer.builder.api import build
from packer.errors import PackFormatError
from packer.storage.cache import META_DIR

s3, s3_server = fx.s3, fx.s3_server  # the fixtures


@pytest.fixture
def watched(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[SilentServer]:
    """The AWS environment pointing at a server that only counts connections."""
    server = SilentServer()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{server.port}")
    try:
        yield server
    finally:
        server.close()


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _plant(folder: Path, url: str) -> None:
    (folder / META_DIR).mkdir(exist_ok=True)
    (folder / META_DIR / "url").write_text(url + "\n")


def test_a_planted_cache_pointer_beside_a_valid_set_is_ignored(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, src = built(tmp_path, RAW)  # a real set in the bucket the pointer names
    local = tmp_path / "downloads" / "local_set"
    build(src, local, RAW)
    _plant(local, url)
    server = SilentServer()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{server.port}")
    before = _tree(tmp_path)
    s = packer.load(local)
    assert len(s) == 6 and not s.store.remote  # the local set, as it is
    assert server.connections == 0
    assert _tree(tmp_path) == before  # nothing written, in the folder or outside it


@pytest.mark.parametrize("what", ["index only", "pack", "copied cache folder"])
def test_a_planted_or_copied_pointer_contacts_nothing_and_writes_nothing(
    what: str, s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, src = built(tmp_path, RAW)
    folder = tmp_path / "untrusted"
    if what == "index only":  # a set's index, no shards: only the bucket could fill it
        build(src, tmp_path / "full", RAW)
        folder.mkdir()
        shutil.copy(tmp_path / "full" / "imgpack-set.json", folder)
        _plant(folder, url)
    elif what == "pack":
        build(src, folder, replace_shard(RAW))
        _plant(folder, url)
    else:  # a real cache folder of this user, copied elsewhere (its pointer signed there)
        s = packer.load(url, cache_dir=tmp_path / "c1")
        s.store.close()
        shutil.copytree(s.path, folder)
        for big in folder.glob("*/_tensordict/images.memmap"):
            big.unlink()  # only the bucket could fill it
    server = SilentServer()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{server.port}")
    before = _tree(tmp_path)
    try:
        opened = packer.load(folder)
    except PackFormatError as e:
        assert what != "pack"
        assert "ignored" in str(e) or "images.memmap" in str(e), str(e)
    else:
        assert what == "pack" and len(opened) == 6
    assert server.connections == 0
    assert _tree(tmp_path) == before


def replace_shard(config):  # a single pack (no shards)
    from dataclasses import replace

    return replace(config, shard_size=None)


def test_a_genuine_cache_folder_still_reopens_and_fetches(s3: S3Server, tmp_path: Path) -> None:
    """A DataLoader worker reopening a PackDataset's path: the pointer imgpack signed is
    followed, and an evicted shard is fetched from the bucket."""
    url, _ = built(tmp_path, RAW)
    s = packer.load(url)
    root = s.path
    s.store.close()
    for big in root.glob("*/_tensordict/images.memmap"):
        big.unlink()
    again = packer.load(root)
    assert again.store.remote and len(again) == 6
    assert again.shard(2).images.shape == (2, 3, 6, 8)
    again.store.close()


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@pytest.fixture
def served(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[Callable[[Path], None]], str]]:
    """``served(change)``: a set built into the session's server, copied to the folder of
    a new server, ``change(copy's folder)`` applied before that server starts (rclone
    keeps the sizes it listed: a file changed behind its back is served at its old size);
    the environment then points at the new server, which gives no ETags (it would read a
    GiB-sized sparse object whole for its MD5; a set is read without them). Returns the
    set's URL there."""
    servers: list[S3Server] = []

    def make(change: Callable[[Path], None]) -> str:
        url, _ = built(tmp_path, RAW)
        data = tmp_path / "data2"
        shutil.copytree(bucket_path(s3, url), data / url.removeprefix("s3://"))
        change(data / url.removeprefix("s3://"))
        server = S3Server(data, etag=False).start()
        servers.append(server)
        for k, v in server.env().items():
            monkeypatch.setenv(k, v)
        return url

    try:
        yield make
    finally:
        for server in servers:  # its data is the test's own: no graceful end to wait for
            server.stop(kill=True)


def _sparse(path: Path, size: int) -> None:
    path.unlink(missing_ok=True)  # a new file: rclone caches what it listed of the old
    with open(path, "wb") as f:
        f.truncate(size)


def test_a_huge_index_object_is_refused_by_its_size_unread(served) -> None:
    from packer.pack.index import MAX_INDEX_BYTES

    # just over the bound, sparse (no disk): the test server hashes what it serves for
    # its ETag, which for 2 GiB took over 10 s on a loaded machine
    size = MAX_INDEX_BYTES + (1 << 20)
    url = served(lambda d: _sparse(d / "imgpack-set.json", size))
    peak = _peak_rss()
    with pytest.raises(PackFormatError, match=rf"imgpack-set\.json: {size:,} bytes, larger"):
        packer.load(url)
    assert _peak_rss() - peak < 64 << 20


def _first_shard(d: Path) -> Path:
    return sorted(p for p in d.iterdir() if p.is_dir())[0]


@pytest.mark.parametrize("rel", ["imgpack.json", "_tensordict/labels.memmap", "meta.json"])
def test_a_huge_shard_object_is_refused_by_its_size_unread(rel: str, served) -> None:
    url = served(lambda d: _sparse(_first_shard(d) / rel, 1 << 30))
    peak = _peak_rss()
    with pytest.raises(PackFormatError, match=r"1,073,741,824 bytes, more than it can be"):
        packer.load(url)
    assert _peak_rss() - peak < 64 << 20


def test_a_data_object_longer_than_its_manifest_never_fills_the_disk(
    served, tmp_path: Path
) -> None:
    url = served(lambda d: _sparse(_first_shard(d) / "_tensordict" / "images.memmap", 1 << 30))
    s = packer.load(url)
    with pytest.raises(PackFormatError, match="more bytes than the manifest gives"):
        s.shard(0)
    s.store.close()
    cache = tmp_path / "cache"
    assert sum(p.stat().st_blocks * 512 for p in cache.rglob("*") if p.is_file()) < 16 << 20
    assert not os.listdir(s.path / META_DIR / "tmp")
