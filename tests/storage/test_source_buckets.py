"""Buckets as build sources with the local engine (issue 47.4): a prefix of images, of
WebDataset shards (a brace range), of parquet files or a zip, read in place through
the storage client from the repository's S3 test server; the pack equals the one built
from the same files on disk."""

from __future__ import annotations

import os
import sys
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
import s3_server as fx
from s3_server import BUCKET

from helpers.local_server import S3Server
from helpers.optional import needs
from packer.builder.api import BuildConfig, build
from packer.errors import UsageError

sys.path.insert(0, str(Path(__file__).parents[1] / "sources"))
from source_data import digests, hf_dataset, tree, write_shards, write_zip

pytestmark = needs("pyarrow", "datasets", "webdataset")

s3, s3_server = fx.s3, fx.s3_server  # the fixtures
CONFIG = BuildConfig(size=(16, 12), workers=2)


def _upload(server: S3Server, local: Path, prefix: str) -> str:
    """``local`` (a file or a folder) put under ``prefix`` of the test bucket through the
    S3 API; the ``s3://`` URL of the prefix."""
    from packer.storage.client import open_store
    from packer.storage.url import parse_url

    url = f"s3://{BUCKET}/{prefix}"
    store = open_store(parse_url(url))
    files = sorted(p for p in local.rglob("*") if p.is_file()) if local.is_dir() else [local]
    for f in files:
        store.put(f, str(f.relative_to(local)) if local.is_dir() else f.name)
    return url


@pytest.mark.parametrize("kind", ["images", "tar", "parquet", "zip"])
def test_bucket_source_equals_local(s3: S3Server, tmp_path: Path, kind: str) -> None:
    folder = tree(tmp_path / "src")
    prefix = f"sources/{uuid.uuid4().hex[:10]}"
    if kind == "images":
        local: object = folder
        url = _upload(s3, folder, prefix)
        drop: tuple[str, ...] = ()  # the keys are the folder's paths
    elif kind == "tar":
        write_shards(folder, tmp_path / "shards", maxcount=5)
        local = str(tmp_path / "shards" / "train-{000000..000003}.tar")
        url = _upload(s3, tmp_path / "shards", prefix) + "/train-{000000..000003}.tar"
        drop = ()
    elif kind == "parquet":
        hf_dataset(folder).to_parquet(str(tmp_path / "train.parquet"), batch_size=5)
        local = str(tmp_path / "train.parquet")
        url = _upload(s3, tmp_path / "train.parquet", prefix)  # the prefix holding it
        drop = ()
    else:
        local = str(write_zip(folder, tmp_path / "imgs.zip"))
        url = _upload(s3, tmp_path / "imgs.zip", prefix) + "/imgs.zip"
        drop = ()
    r = build(url, tmp_path / "from_bucket", CONFIG)
    assert r.count == 16 and not r.skipped
    build(local, tmp_path / "from_disk", CONFIG)  # type: ignore[arg-type]
    assert digests(tmp_path / "from_bucket", drop) == digests(tmp_path / "from_disk", drop)


def test_bucket_image_over_the_cap_is_skipped_unread(s3: S3Server, tmp_path: Path) -> None:
    folder = tree(tmp_path / "src", n=1)
    (folder / "cat" / "big.png").write_bytes(b"\x89PNG" + b"\0" * 300_000)
    url = _upload(s3, folder, f"sources/{uuid.uuid4().hex[:10]}")
    from packer.builder.formats.options import SourceOptions

    config = BuildConfig(size=(8, 6), workers=1, sources=SourceOptions(max_image_bytes=100_000))
    r = build(url, tmp_path / "p", config)
    assert r.count == 4
    assert r.skipped == [
        {
            "path": "cat/big.png",
            "reason": "300,004 bytes, over the per-image limit of 100,000; not read",
        }
    ]


def test_bucket_source_refuses_a_bucket_destination(s3: S3Server, tmp_path: Path) -> None:
    url = _upload(s3, tree(tmp_path / "src", n=1), f"sources/{uuid.uuid4().hex[:10]}")
    with pytest.raises(UsageError, match="here, one pack is built to a local folder"):
        build(url, f"s3://{BUCKET}/out/{uuid.uuid4().hex[:8]}", BuildConfig(size=(8, 6)))


def test_bucket_images_labelled_by_a_table_in_the_bucket(s3: S3Server, tmp_path: Path) -> None:
    folder = tree(tmp_path / "src", n=2)
    table = "path,label\ncat/0.png,cat\ndog/j1.jpg,dog\ncat/j0.jpg,dog\n"
    (folder / "labels.csv").write_text(table)
    url = _upload(s3, folder, f"sources/{uuid.uuid4().hex[:10]}")
    config = BuildConfig(size=(8, 6), workers=1, labels=Path("labels.csv"))
    r = build(url, tmp_path / "p", config)
    (tmp_path / "labels.csv").write_text(table)
    want = build(folder, tmp_path / "want", replace(config, labels=tmp_path / "labels.csv"))
    assert r.count == want.count == 3 and r.classes == want.classes == ["cat", "dog"]
    assert (tmp_path / "p" / "_tensordict" / "images.memmap").read_bytes() == (
        tmp_path / "want" / "_tensordict" / "images.memmap"
    ).read_bytes()
    assert (tmp_path / "p" / "_tensordict" / "labels.memmap").read_bytes() == (
        tmp_path / "want" / "_tensordict" / "labels.memmap"
    ).read_bytes()


def _nothing() -> None:
    """A forkserver child's task."""


def test_workers_see_the_environment_of_now_not_of_an_older_fork_server(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fork server started before the credentials were set (an earlier build of this
    process, say) would start workers without them: bucket readers are spawned."""
    import multiprocessing as mp

    url = _upload(s3, tree(tmp_path / "src", n=2), f"sources/{uuid.uuid4().hex[:10]}")
    saved = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    with monkeypatch.context() as m:
        for k in saved:
            m.delenv(k)
        p = mp.get_context("forkserver").Process(target=_nothing)  # the server starts now
        p.start()
        p.join()
    r = build(url, tmp_path / "p", BuildConfig(size=(8, 6), workers=2))
    assert r.count == 8 and not r.skipped
