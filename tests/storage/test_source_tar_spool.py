"""A bucket's WebDataset tars spooled by the build (issue 47, the S3 tars figure): each
shard fetched whole once, by the listing, into a spool beside DST, listed and read by the
workers there: the server sends the shards' bytes once in all (before: once to list, once
more to build); the output and every skip equal the build from the same tars on disk;
the spool is bounded by ``SourceOptions.spool_bytes`` (past it, ranged reads) and removed
at the end, on failure, and (a killed build's) by the next build. Bytes counted on the
wire by a proxy in front of the repository's S3 test server."""

from __future__ import annotations

import io
import os
import sys
import tarfile
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
from packer.builder.formats.remote import spool_object
from packer.errors import InputError, UsageError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sources"))
from source_data import digests, tree, write_shards

pytestmark = needs("webdataset")

s3, s3_server = fx.s3, fx.s3_server  # the fixtures
CONFIG = BuildConfig(size=(16, 12), workers=3)


def _upload(files: list[Path], n: int) -> str:
    from packer.storage.client import open_store
    from packer.storage.url import parse_url

    prefix = f"tars/{uuid.uuid4().hex[:10]}"
    store = open_store(parse_url(f"s3://{BUCKET}/{prefix}"))
    for f in files:
        store.put(f, f.name)
    return f"s3://{BUCKET}/{prefix}/train-{{000000..{n - 1:06d}}}.tar"


def _shards(tmp_path: Path) -> tuple[str, str, list[int]]:
    """32 images as 4 shards of 8 samples, on disk and in the bucket: the local brace
    pattern, the bucket's, and each shard's bytes."""
    files = write_shards(tree(tmp_path / "src", n=8), tmp_path / "shards", maxcount=8)
    assert len(files) == 4
    local = str(tmp_path / "shards" / "train-{000000..000003}.tar")
    return local, _upload(files, 4), [f.stat().st_size for f in files]


def _spools(parent: Path) -> list[str]:
    return sorted(n for n in os.listdir(parent) if ".imgpack-spool-" in n)


def _counted(
    url: str, dst: Path, config: BuildConfig, s3: S3Server, mp: pytest.MonkeyPatch
) -> tuple[object, int, int, list[str]]:
    """A build of ``url`` through the proxy: (result, bytes sent while listing, while
    building, the spool files beside DST when the workers started)."""
    proxy = CountingProxy(s3.port)
    listed: list[int] = []
    seen: list[str] = []

    def started(*_: object) -> None:
        listed.append(proxy.down)
        for name in _spools(dst.parent):
            seen.extend(os.listdir(dst.parent / name))

    try:
        mp.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        r = build(url, dst, config, on_start=started)
        built = proxy.down - listed[0]
    finally:
        proxy.stop()
    return r, listed[0], built, seen


def test_bucket_tars_cross_the_network_once_in_all(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local, url, sizes = _shards(tmp_path)
    total = sum(sizes)
    r, listed, built, seen = _counted(url, tmp_path / "out" / "pack", CONFIG, s3, monkeypatch)
    assert r.count == 32 and not r.skipped  # type: ignore[attr-defined]
    assert len(seen) == 4  # every shard spooled while the workers ran
    # the listing fetched each shard once (plus each request's headers); the workers
    # read nothing from the server (before: ~1x more, by ranged reads)
    assert listed <= 1.02 * total + 16 * 1024, (listed, total)
    assert built <= 4 * 1024, (built, total)
    assert listed + built <= 1.05 * total, (listed, built, total)
    assert os.listdir(tmp_path / "out") == ["pack"]  # the spool removed at the end
    build(local, tmp_path / "from_disk", CONFIG)
    assert digests(tmp_path / "out" / "pack") == digests(tmp_path / "from_disk")


def test_the_spool_is_bounded_and_past_it_shards_are_read_in_place(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local, url, sizes = _shards(tmp_path)
    # room for the first two shards: the last two are read by ranged reads
    config = replace(CONFIG, sources=SourceOptions(spool_bytes=sizes[0] + sizes[1] + 1))
    r, _, built, seen = _counted(url, tmp_path / "out" / "pack", config, s3, monkeypatch)
    assert r.count == 32  # type: ignore[attr-defined]
    assert [n.split("-", 1)[0] for n in sorted(seen)] == ["000000", "000001"]
    # the two read in place by the workers (their images: most of their bytes)
    assert built >= 0.5 * (sizes[2] + sizes[3])
    assert built <= 1.05 * (sizes[2] + sizes[3]) + 32 * 1024
    assert os.listdir(tmp_path / "out") == ["pack"]
    build(local, tmp_path / "from_disk", CONFIG)
    assert digests(tmp_path / "out" / "pack") == digests(tmp_path / "from_disk")
    # none at all: the shards read in place, as before the spool (another prefix: the
    # client of the first, cached in this process, talks to the first proxy)
    again = _upload(sorted((tmp_path / "shards").glob("*.tar")), 4)
    _, _, built0, seen0 = _counted(
        again,
        tmp_path / "none" / "pack",
        replace(CONFIG, sources=SourceOptions(spool_bytes=0)),
        s3,
        monkeypatch,
    )
    assert not seen0 and built0 >= 0.5 * sum(sizes)
    assert digests(tmp_path / "none" / "pack") == digests(tmp_path / "from_disk")


def _png(i: int) -> bytes:
    from PIL import Image

    b = io.BytesIO()
    Image.new("RGB", (20 + i, 10), (i * 40, 10, 200)).save(b, "PNG")
    return b.getvalue()


def _hostile_shard(path: Path, cut: str) -> Path:
    """A shard with a traversal member, a link member, a repeated name, and its last
    member cut short (in its data, or in its header)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:

        def add(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE) -> None:
            info = tarfile.TarInfo(name)
            info.type = kind
            info.linkname = "000000.png" if kind != tarfile.REGTYPE else ""
            info.size = len(data) if kind == tarfile.REGTYPE else 0
            tf.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)

        add("000000.png", _png(0))
        add("../x.png", _png(1))
        add("000001.png", kind=tarfile.SYMTYPE)
        add("000002.png", _png(2))
        add("000000.png", _png(3))
        add("000003.png", _png(4))
    data = path.read_bytes()
    with tarfile.open(path) as tf:
        last = tf.getmembers()[-1]
    path.write_bytes(data[: last.offset_data + 50 if cut == "data" else last.offset + 100])
    return path


@pytest.mark.parametrize("cut", ["data", "header"])
def test_a_hostile_shard_gives_the_same_skips_as_on_disk(
    s3: S3Server, tmp_path: Path, cut: str
) -> None:
    shard = _hostile_shard(tmp_path / "shards" / "train-000000.tar", cut)
    good = write_shards(tree(tmp_path / "src", n=2), tmp_path / "good", maxcount=4)[0]
    second = good.rename(tmp_path / "shards" / "train-000001.tar")
    url = _upload([shard, second], 2)
    local = str(tmp_path / "shards" / "train-{000000..000001}.tar")
    ref = build(local, tmp_path / "from_disk", CONFIG)
    assert ref.skipped and any("cut short" in s["reason"] or "unreadable" in s["reason"]
                               for s in ref.skipped)  # fmt: skip
    for spool in (None, 0):
        config = replace(CONFIG, sources=SourceOptions(spool_bytes=spool))
        r = build(url, tmp_path / f"from_bucket_{spool}", config)
        assert r.skipped == ref.skipped
        assert digests(tmp_path / f"from_bucket_{spool}") == digests(tmp_path / "from_disk")
    assert not _spools(tmp_path)


def test_a_build_decoding_in_this_process_lets_go_of_its_spool(
    s3: S3Server, tmp_path: Path
) -> None:
    """One worker: the build decodes here, through this process's open shards; the
    spool's files are closed with it (else their disk stays taken until the process ends)."""
    local, url, _ = _shards(tmp_path)
    r = build(url, tmp_path / "pack", replace(CONFIG, workers=1))
    assert r.count == 32 and not _spools(tmp_path)
    held = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{fd}")]  # fmt: skip
    assert not [h for h in held if ".imgpack-spool-" in h], held
    build(local, tmp_path / "from_disk", replace(CONFIG, workers=1))
    assert digests(tmp_path / "pack") == digests(tmp_path / "from_disk")


def test_a_failed_build_removes_its_spool_and_a_killed_ones_is_removed_next(
    s3: S3Server, tmp_path: Path
) -> None:
    _, url, _ = _shards(tmp_path)
    dst = tmp_path / "out" / "pack"
    dst.parent.mkdir()
    stale = dst.parent / ".pack.imgpack-spool-deadbeef"  # a killed build's: nobody holds it
    stale.mkdir()
    (stale / "000000-train-000000.tar").write_bytes(b"x" * 100)

    def boom(*_: object) -> None:
        assert _spools(dst.parent) and stale.name not in _spools(dst.parent)
        raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        build(url, dst, CONFIG, on_start=boom)
    assert not _spools(dst.parent)


def test_an_object_changed_since_it_was_listed_is_refused(s3: S3Server, tmp_path: Path) -> None:
    _, url, sizes = _shards(tmp_path)
    one = url.replace("{000000..000003}", "000000")
    with pytest.raises(InputError, match="changed since it was listed"):
        spool_object(one, str(tmp_path / "copy"), f"{sizes[0] - 1}:")  # listed smaller
    with pytest.raises(InputError, match="changed since it was listed"):
        spool_object(one, str(tmp_path / "copy"), f"{sizes[0] + 1}:")  # listed larger
    spool_object(one, str(tmp_path / "copy"), f"{sizes[0]}:")
    assert (tmp_path / "copy").stat().st_size == sizes[0]


def test_spool_bytes_is_checked() -> None:
    with pytest.raises(UsageError, match=r"SourceOptions\.spool_bytes must be 0"):
        SourceOptions(spool_bytes=-1).validate()
