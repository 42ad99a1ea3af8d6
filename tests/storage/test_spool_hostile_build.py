"""Bucket tar builds with hostile names and an interrupted listing (the spool,
:mod:`packer.builder.formats.spool`): shard keys of non-ASCII letters, a DST name with
glob characters, Ctrl-C while the shards are fetched: the pack equals the one from the
same tars on disk, and no spool is left."""

from __future__ import annotations

import os
import sys
import threading
import uuid
from pathlib import Path

import pytest
import s3_server as fx
from s3_server import BUCKET

from helpers.local_server import S3Server
from helpers.optional import needs
from packer.builder.api import BuildConfig, build
from packer.builder.formats import remote

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sources"))
from source_data import digests, tree, write_shards

pytestmark = needs("webdataset")

s3, s3_server = fx.s3, fx.s3_server  # the fixtures
CONFIG = BuildConfig(size=(16, 12), workers=2)


def _upload(files: list[Path], names: list[str]) -> str:
    from packer.storage.client import open_store
    from packer.storage.url import parse_url

    prefix = f"tars/{uuid.uuid4().hex[:10]}"
    store = open_store(parse_url(f"s3://{BUCKET}/{prefix}"))
    for f, name in zip(files, names, strict=True):
        store.put(f, name)
    return f"s3://{BUCKET}/{prefix}"


def _spools(parent: Path) -> list[str]:
    return [n for n in os.listdir(parent) if ".imgpack-spool-" in n]


def test_non_ascii_shard_keys_and_a_glob_dst_name(s3: S3Server, tmp_path: Path) -> None:
    files = write_shards(tree(tmp_path / "src", n=4), tmp_path / "shards", maxcount=4)
    long = "\U0001d400" * 60  # 240 bytes: a file name on the server, not in the spool
    names = [f"{long}-{i:06d}.tar" for i in range(len(files))]
    prefix = _upload(files, names)
    files = [f.rename(f.with_name(n)) for f, n in zip(files, names, strict=True)]
    dst = tmp_path / "out" / "p*[ack"
    seen: list[str] = []

    def started(*_: object) -> None:  # the shards spooled, by the workers' start
        for name in _spools(dst.parent):
            seen.extend(os.listdir(dst.parent / name))

    braces = f"{long}-{{000000..{len(files) - 1:06d}}}.tar"
    r = build(f"{prefix}/{braces}", dst, CONFIG, on_start=started)
    ref = build(str(tmp_path / "shards" / braces), tmp_path / "ref", CONFIG)
    assert len(seen) == len(files)
    assert r.count == ref.count and r.skipped == ref.skipped == []
    assert digests(dst) == digests(tmp_path / "ref")
    assert os.listdir(dst.parent) == [dst.name]


def test_ctrl_c_while_the_shards_are_fetched_leaves_no_spool(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = write_shards(tree(tmp_path / "src", n=4), tmp_path / "shards", maxcount=2)
    prefix = _upload(files, [f.name for f in files])
    real = remote.spool_object
    fetched: list[str] = []

    def interrupted(url: str, path: str, stamp: str, stop: object = None) -> None:
        real(url, path, stamp, stop)  # type: ignore[arg-type]
        fetched.append(path)
        if len(fetched) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(remote, "spool_object", interrupted)
    dst = tmp_path / "out" / "pack"
    with pytest.raises(KeyboardInterrupt):
        build(f"{prefix}/train-{{000000..{len(files) - 1:06d}}}.tar", dst, CONFIG)
    assert fetched and not any(os.path.exists(p) for p in fetched)
    assert not (tmp_path / "out").exists() or not _spools(tmp_path / "out")


def test_ctrl_c_ends_the_fetches_in_flight_not_after_their_shards(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shards are fetched side by side: Ctrl-C (or a shard refused) while the others
    are in flight stops them at their next piece (the pool would wait for each whole
    shard: minutes for large ones), and a fetch told to stop reads nothing more."""
    files = write_shards(tree(tmp_path / "src", n=4), tmp_path / "shards", maxcount=4)
    prefix = _upload(files, [f.name for f in files])
    real = remote.spool_object
    told: list[bool] = []
    in_flight = threading.Barrier(len(files))  # every fetch started, then Ctrl-C

    def first_interrupted(url: str, path: str, stamp: str, stop: object = None) -> None:
        in_flight.wait(30)
        if url.endswith("000000.tar"):
            raise KeyboardInterrupt
        told.append(stop.wait(30))  # type: ignore[attr-defined]  # set by the interrupt
        real(url, path, stamp, stop)  # type: ignore[arg-type]

    monkeypatch.setattr(remote, "spool_object", first_interrupted)
    dst = tmp_path / "out" / "pack"
    with pytest.raises(KeyboardInterrupt):
        build(f"{prefix}/train-{{000000..{len(files) - 1:06d}}}.tar", dst, CONFIG)
    assert told == [True] * (len(files) - 1)
    assert not (tmp_path / "out").exists() or not _spools(tmp_path / "out")
    # a fetch told to stop: SpoolStopped, nothing written
    stop = threading.Event()
    stop.set()
    with pytest.raises(remote.SpoolStopped):
        real(f"{prefix}/{files[1].name}", str(tmp_path / "copy"), "1:", stop)
    assert not (tmp_path / "copy").exists()
