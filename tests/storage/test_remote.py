"""Pack sets in object storage against a real S3-compatible server: build, resume of a
killed upload, info/verify/load over the URL, the bounded cache and its locks, faults."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import s3_server as fx
import torch
from click.testing import CliRunner
from s3_server import JPEG, RAW, bucket_path, built, new_url, write_src

import packer
from conftest import subprocess_env
from helpers.forked import start_script
from helpers.local_server import S3Server
from packer.builder.api import BuildConfig, build
from packer.cli import cli
from packer.errors import DiskFullError, InputError, PackFormatError, StorageError, UsageError
from packer.storage import client
from packer.storage.cache import META_DIR
from packer.storage.url import parse_url

s3, s3_server = fx.s3, fx.s3_server  # the fixtures


def local_tree(root: Path) -> dict[str, bytes]:
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            p = Path(dirpath) / f
            out[str(p.relative_to(root))] = p.read_bytes()
    return out


def every_image(s: packer.storage.packset.PackSet) -> torch.Tensor:
    """Every shard's data, in order (raw rows, or a JPEG set's bytes)."""
    out = []
    for k in range(len(s.index.shards)):
        pack = s.shard(k)
        out.append((pack.images if s.storage == "raw" else pack.jpeg).clone())
        s.release(k)
    return torch.cat(out)


@pytest.mark.parametrize("config", [RAW, JPEG], ids=["raw", "jpeg"])
def test_build_to_bucket_then_load_gives_the_local_sets_images(
    s3: S3Server, tmp_path: Path, config: BuildConfig
) -> None:
    url, src = built(tmp_path, config)
    ref = tmp_path / "ref"
    build(src, ref, config)
    # the bucket holds the local set byte for byte, and no staging is left in the cache
    assert local_tree(bucket_path(s3, url)) == local_tree(ref)
    assert not list((tmp_path / "cache" / "builds").glob("*"))
    s = packer.load(url)
    local = packer.load(ref)
    assert len(s) == len(local) and s.storage == config.store
    assert torch.equal(s.labels, local.labels) and s.sources == local.sources
    assert torch.equal(every_image(s), every_image(local))
    assert s.store.downloads == len(s.index.shards)
    s.store.close()


@pytest.mark.slow
def test_killed_upload_resumes_and_skips_uploaded_shards(s3: S3Server, tmp_path: Path) -> None:
    src = write_src(tmp_path / "src", {"cat": 3, "dog": 3})
    url = new_url()
    script = tmp_path / "kill.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, signal, sys
            import packer.builder.upload as up
            from packer.builder.api import BuildConfig, build
            seen = []
            def die(step):
                seen.append(step) if step.startswith("uploaded") else None
                if len(seen) == 2:  # two shards uploaded, the third and the index not
                    os.kill(os.getpid(), signal.SIGKILL)
            up._reached = die
            build(sys.argv[1], sys.argv[2], BuildConfig(size=(8, 6), workers=1, shard_size=300))
            """
        )
    )
    env = subprocess_env(
        **{k: os.environ[k] for k in os.environ if k.startswith(("AWS_", "IMGPACK_"))}
    )
    r = subprocess.run([sys.executable, str(script), str(src), url], env=env, timeout=120)
    assert r.returncode == -9
    bucket = bucket_path(s3, url)
    assert not (bucket / "imgpack-set.json").exists()  # no index: no reader sees the set
    assert len(list(bucket.glob("*/imgpack.json"))) == 2
    with pytest.raises(PackFormatError, match=r"not a pack set \(imgpack-set.json is missing\)"):
        packer.load(url)
    result = build(src, url, RAW)
    assert result.count == 6
    assert result.extra["shards_already_there"] == 2 and result.extra["shards_uploaded"] == 1
    assert result.extra["shards_built"] == 1  # the uploaded ones were not built again
    ref = tmp_path / "ref"
    build(src, ref, RAW)
    assert local_tree(bucket) == local_tree(ref)
    with pytest.raises(InputError, match=r"a pack set already exists; pass BuildConfig\.append"):
        build(src, url, RAW)


def test_append_to_a_bucket_set(s3: S3Server, tmp_path: Path) -> None:
    url, src = built(tmp_path, RAW)
    write_src(src, {"dog": 5})  # dog/3.png and dog/4.png are new
    r = build(src, url, replace(RAW, append=True))
    assert r.count == 8
    s = packer.load(url)
    assert len(s.index.shards) == 4 and len(s) == 8
    s.store.close()


def test_info_verify_and_classes_over_the_url_never_show_the_secret(
    s3: S3Server, tmp_path: Path
) -> None:
    url, _ = built(tmp_path, RAW)
    runner = CliRunner()
    info = runner.invoke(cli, ["info", url, "--json"])
    assert info.exit_code == 0, info.output
    out = json.loads(info.stdout)
    assert out["count"] == 6 and out["path"] == url and out["shards"]["count"] == 3
    verify = runner.invoke(cli, ["verify", url, "--no-source", "--json"])
    assert verify.exit_code == 0, verify.output
    report = json.loads(verify.stdout)
    assert report["ok"] and len(report["checks"]) == 4
    val = write_src(tmp_path / "val", {"dog": 1})
    b = runner.invoke(
        cli,
        [
            "build",
            str(val),
            str(tmp_path / "val_pack"),
            "--size",
            "8x6",
            "--classes",
            url,
            "--json",
        ],
    )
    assert b.exit_code == 0, b.output
    assert packer.load(tmp_path / "val_pack").classes == ["cat", "dog"]
    assert packer.load(tmp_path / "val_pack").labels.tolist() == [1]
    up = runner.invoke(
        cli,
        ["build", str(val), new_url(), "--size", "8x6", "--shard-size", "1KB", "--json"],
    )
    assert up.exit_code == 0, up.output
    assert json.loads(up.stdout)["path"].startswith("s3://imgpack/sets/")
    bad = runner.invoke(cli, ["info", url + "-nothing-here"])
    assert bad.exit_code == 2 and "imgpack-set.json is missing" in bad.output
    secret = s3.secret.encode()
    for text in (info.output, verify.output, b.output, up.output, bad.output):
        assert s3.secret not in text
    for root in (tmp_path / "cache", bucket_path(s3, url), tmp_path / "val_pack"):
        for path, data in local_tree(root).items():
            assert secret not in data, path


def test_cache_evicts_the_least_recently_used_shard_nobody_holds(
    s3: S3Server, tmp_path: Path
) -> None:
    url, _ = built(tmp_path, RAW, n=4)  # 4 shards of 288 data bytes
    row = 3 * 8 * 6
    s = packer.load(url, cache_limit=2 * 2 * row)  # two shards' images
    store = s.store
    held = s.shard(0)  # held all along: never evicted
    for k in (1, 2, 3, 1):
        s.shard(k)
        assert store.cached_bytes() <= 2 * 2 * row or k == 1
        s.release(k)
    names = [e.name for e in s.index.shards]
    cached = {name for _, name, _, _ in store.cached()}
    assert names[0] in cached and len(cached) == 2 and names[1] in cached  # 1 used last
    assert torch.equal(held.images, s.shard(0).images)
    log = (s.path / META_DIR / "downloads.log").read_text().split("\n")[:-1]
    assert [line.split()[1] for line in log] == [names[0], names[1], names[2], names[3], names[1]]
    s.release(0)
    s.release(0)
    store.close()
    with pytest.raises(UsageError, match="cache_limit must be a positive number of bytes"):
        packer.load(url, cache_limit=0)


@pytest.mark.slow
def test_two_processes_share_one_cache_and_download_each_shard_once(
    s3: S3Server, tmp_path: Path
) -> None:
    url, _ = built(tmp_path, RAW, n=4)
    script = tmp_path / "read.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys, packer
            s = packer.load(sys.argv[1])
            total = 0
            for k in range(len(s.index.shards)):
                total += int(s.shard(k).images.sum())
                s.release(k)
            print(total)
            """
        )
    )
    env = subprocess_env(
        **{k: os.environ[k] for k in os.environ if k.startswith(("AWS_", "IMGPACK_"))}
    )
    # two processes at once: forks (of the session's zygote, where this one has used
    # object storage), each its own process, its own client and the one cache
    procs = [start_script(script, [url], env=env, storage=True) for _ in range(2)]
    done = [p.wait(120) for p in procs]
    assert [r.returncode for r in done] == [0, 0], [r.stderr for r in done]
    outs = [r.stdout for r in done]
    assert outs[0] == outs[1] and int(outs[0]) > 0
    s = packer.load(url)
    log = (s.path / META_DIR / "downloads.log").read_text().split("\n")[:-1]
    shards = sorted(line.split()[1] for line in log)
    assert shards == sorted(e.name for e in s.index.shards)  # each once, by either process
    s.store.close()


def test_a_killed_runs_leftovers_do_not_break_the_next(s3: S3Server, tmp_path: Path) -> None:
    url, _ = built(tmp_path, RAW)
    s = packer.load(url, cache_limit=10_000)
    name, other = s.index.shards[0].name, s.index.shards[1].name
    part = s.path / META_DIR / "tmp" / f"{name}.99999.0.part"
    part.write_bytes(b"half a download")
    (s.path / META_DIR / f"{name}.fetch").write_bytes(b"")  # a lock file, nobody's lock
    stale = s.path / META_DIR / f"{other}.reserved"  # a killed download's reservation
    stale.write_text(str(10**9))
    assert s.shard(0).images.shape == (2, 3, 6, 8)
    assert not part.exists() and not stale.exists()
    assert s.store.cached_bytes() == 288  # the stale reservation did not evict or refuse
    s.release(0)
    s.store.close()


def test_a_shard_another_reader_holds_is_not_evicted(s3: S3Server, tmp_path: Path) -> None:
    """Two opens of the set share the cache as two processes do (each its own flocks)."""
    url, _ = built(tmp_path, RAW, n=4)
    a = packer.load(url)
    b = packer.load(url, cache_limit=2 * 288)
    names = [e.name for e in a.index.shards]
    a.shard(0)  # held by the other reader
    for k in (1, 2, 3):
        b.shard(k)
        b.release(k)
    # shard 0 (the oldest) stays: each fetch of b evicted the shard b had used before
    assert {n for _, n, _, _ in b.store.cached()} == {names[0], names[3]}
    a.release(0)
    # a reader without a limit keeps what it let go of mapped, and with it the lock:
    # deleting the file would free no disk while it is mapped
    b.shard(1)
    b.release(1)
    assert names[0] in {n for _, n, _, _ in b.store.cached()}
    a.store.close()
    b.shard(2)  # evicts shard 0 now that nobody holds it
    b.release(2)
    assert names[0] not in {n for _, n, _, _ in b.store.cached()}
    assert b.store.cached_bytes() <= 2 * 288
    b.store.close()


def _corrupt(s3: S3Server, url: str, truncate: bool) -> None:
    bucket = bucket_path(s3, url)
    big = sorted(bucket.glob("*/_tensordict/images.memmap"))[0]
    data = bytearray(big.read_bytes())
    if truncate:
        del data[-10:]
    else:
        data[5] ^= 0xFF
    big.write_bytes(bytes(data))


@pytest.mark.parametrize("truncate", [False, True], ids=["flipped", "truncated"])
def test_a_damaged_object_is_fetched_twice_then_refused(
    s3: S3Server, tmp_path: Path, truncate: bool
) -> None:
    url, _ = built(tmp_path, RAW)
    _corrupt(s3, url, truncate)
    s = packer.load(url)
    what = "truncated" if truncate else r"checksum mismatch in 1 of \d+ blocks"
    with pytest.raises(PackFormatError, match=rf"images.memmap: .*{what}.*twice; .* damaged"):
        s.shard(0)
    assert not list((s.path / META_DIR / "tmp").iterdir())  # nothing partial left
    assert not (s.path / s.index.shards[0].name / "_tensordict" / "images.memmap").exists()
    s.store.close()
    r = CliRunner().invoke(cli, ["verify", url, "--no-source"])
    assert r.exit_code == 1 and r.output.count("FAIL  shard") == 1, r.output
    assert "twice; the object in the bucket is damaged" in r.output


def test_a_missing_object_is_named(s3: S3Server, tmp_path: Path) -> None:
    url, _ = built(tmp_path, RAW)
    s = packer.load(url)
    name = s.index.shards[2].name
    bucket = client.open_store(parse_url(url))
    bucket.delete(name, "_tensordict", "images.memmap")  # through the server, as S3 does
    with pytest.raises(
        PackFormatError, match=rf"{url}/{name}/_tensordict/images\.memmap is missing"
    ):
        s.shard(2)
    s.store.close()
    bucket.delete(name, "_tensordict", "labels.memmap")
    with pytest.raises(PackFormatError, match=r"labels\.memmap is missing from the bucket"):
        packer.load(url, cache_dir=tmp_path / "c2")


def test_a_damaged_manifest_is_refused(s3: S3Server, tmp_path: Path) -> None:
    url, _ = built(tmp_path, RAW)
    manifest = sorted(bucket_path(s3, url).glob("*/imgpack.json"))[1]
    manifest.write_bytes(manifest.read_bytes().replace(b'"count"', b'"count" '))
    with pytest.raises(
        PackFormatError, match=r"imgpack\.json: does not match the SHA-256 the index"
    ):
        packer.load(url, cache_dir=tmp_path / "c2")


def test_wrong_secret_is_one_clear_line(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = built(tmp_path, RAW)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-" + "x" * 20)
    with pytest.raises(
        StorageError, match=r"refused the credentials \(SignatureDoesNotMatch\)"
    ) as e:
        packer.load(url)
    assert "\n" not in str(e.value) and "not-the-secret" not in str(e.value)
    r = CliRunner().invoke(cli, ["info", url])
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output  # bad input (issue 43.1)
    assert "not-the-secret" not in r.output


def test_unreachable_server_retries_then_names_the_object(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from helpers.local_server import free_port

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nobody listens
    with pytest.raises(
        StorageError,
        match=r"^s3://imgpack/sets/x/imgpack-set\.json: could not read it after 3 tries",
    ):
        packer.load(f"s3://{'imgpack'}/sets/x")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://example.com:9000")
    with pytest.raises(UsageError, match="plain http is allowed only for a server on this machine"):
        packer.load("s3://imgpack/sets/x")


def test_a_password_in_the_endpoint_is_never_shown(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """AWS_ENDPOINT_URL=http://user:password@host: the password is a credential (a URL's
    own user info is refused for the same reason); errors name the endpoint without it."""
    from helpers.local_server import free_port

    word = "endpoint-password-" + "y" * 12
    for endpoint, error, what in (
        (f"http://key:{word}@example.com:9000", UsageError, "plain http is allowed only"),
        (f"http://key:{word}@127.0.0.1:{free_port()}", StorageError, "could not read it"),
    ):
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        with pytest.raises(error, match=what) as e:
            packer.load("s3://imgpack/sets/x", cache_dir=tmp_path / "c")
        assert word not in str(e.value)
        assert endpoint.rpartition("@")[2] in str(e.value)


def test_server_killed_mid_epoch_is_retried_after_its_restart(s3: S3Server, tmp_path: Path) -> None:
    url, _ = built(tmp_path, RAW)
    s = packer.load(url)
    first = s.shard(0).images.clone()
    s.release(0)
    s3.stop(kill=True)
    restarted = []

    def restart(attempt: int, where: str) -> None:
        if not restarted:
            restarted.append(where)
            s3.start()

    s.store.client.retry = client.Retry(attempts=3, backoff=0.05, on_retry=restart)
    assert s.shard(1).images.shape == (2, 3, 6, 8)  # fetched once the server was back
    assert restarted and restarted[0].endswith("_tensordict/images.memmap")
    assert torch.equal(s.shard(0).images, first)  # cached: no request
    s.store.close()


def test_parse_url() -> None:
    u = parse_url("s3://bucket/a/b/")
    assert (u.scheme, u.bucket, u.prefix) == ("s3", "bucket", "a/b") and str(u) == "s3://bucket/a/b"
    assert u.key("x", "y") == "a/b/x/y" and parse_url("gs://b").key("i") == "i"
    with pytest.raises(UsageError, match="credentials in the URL are refused"):
        parse_url("s3://AKID:secret@bucket/p")
    with pytest.raises(UsageError, match=r"ftp:// is not a storage imgpack reads"):
        parse_url("ftp://bucket/p")
    with pytest.raises(UsageError, match=r"'\.' and '\.\.' are not allowed"):
        parse_url("s3://bucket/a/../b")
    assert parse_url("s3://b/p").cache_key(None) != parse_url("s3://b/p").cache_key("http://x")
    with pytest.raises(UsageError, match=r"folded by pathlib .* pass the URL as a str"):
        packer.load(Path("s3://bucket/prefix"))


def test_missing_obstore_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "obstore", None)
    with pytest.raises(UsageError, match=r"pip install 'imgpack\[cloud\]'"):
        client.open_store(parse_url("s3://b/p"))
    assert np is not None


def test_threads_fetching_one_shard_share_one_download(s3: S3Server, tmp_path: Path) -> None:
    import threading

    url, _ = built(tmp_path, RAW)
    s = packer.load(url)
    barrier = threading.Barrier(4)
    seen = []

    def one() -> None:
        barrier.wait()
        seen.append(s.shard(1).images.sum().item())

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(seen) == 4 and len(set(seen)) == 1
    assert s.store.downloads == 1
    for _ in range(4):
        s.release(1)
    assert s.store._pins[1] == 0
    s.store.close()


def test_full_cache_disk_is_a_clear_error_and_the_cache_stays_usable(
    s3: S3Server, tmp_path: Path
) -> None:
    url, _ = built(tmp_path, replace(RAW, size=(64, 64), shard_size=3 * 64 * 64 * 2), n=1)
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mnt)], capture_output=True
    )
    if r.returncode:
        pytest.skip("a full disk is made with a small tmpfs: needs mount (root)")
    try:
        s = packer.load(url, cache_dir=mnt)
        st = os.statvfs(mnt)
        filler = mnt / "filler"
        filler.write_bytes(b"\0" * (st.f_bavail * st.f_frsize - 8192))  # 8 KiB left, 24 KiB wanted
        with pytest.raises(
            DiskFullError, match=r"the disk is full while fetching s3://.*images\.memmap"
        ):
            s.shard(0)
        assert not list((s.path / META_DIR / "tmp").iterdir())  # nothing partial left
        filler.unlink()
        assert s.shard(0).images.shape == (2, 3, 64, 64)  # the same cache goes on
        s.release(0)
        s.store.close()
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_credentials_and_endpoint_from_the_aws_files(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = built(tmp_path, RAW)
    creds, config = tmp_path / "credentials", tmp_path / "config"
    creds.write_text(
        f"[default]\naws_access_key_id = wrong\naws_secret_access_key = wrong\n\n"
        f"[bench]\naws_access_key_id = {s3.key}\naws_secret_access_key = {s3.secret}\n"
    )
    config.write_text(
        f"[default]\nendpoint_url = {s3.endpoint}\n\n"
        f"[profile bench]\nregion = us-east-1\nendpoint_url = {s3.endpoint}\n"
    )
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_REGION"):
        monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_PROFILE", "bench")
    s = packer.load(url)
    assert len(s) == 6
    s.store.close()
    monkeypatch.setenv("AWS_PROFILE", "default")  # the default profile's keys are wrong
    with pytest.raises(StorageError, match="refused the credentials") as e:
        packer.load(url)
    assert s3.secret not in str(e.value)


def test_server_killed_mid_download_is_retried_after_its_restart(
    s3: S3Server, tmp_path: Path
) -> None:
    big = replace(RAW, size=(512, 512), shard_size=40 * 3 * 512 * 512)  # one shard, 25 MB
    url, _ = built(tmp_path, big, n=16)
    s = packer.load(url)
    s.store.client.chunk = 256 << 10  # pieces of 256 KiB: the kill lands mid-download
    killed: list[int] = []
    restarted: list[str] = []

    def kill(n: int) -> None:  # after the first 256 KiB arrived: the rest is in flight
        if not killed:
            killed.append(n)
            s3.stop(kill=True)

    def restart(attempt: int, where: str) -> None:
        if not restarted:
            restarted.append(where)
            s3.start()

    s.store.on_download = kill
    s.store.client.retry = client.Retry(attempts=3, backoff=0.05, on_retry=restart)
    assert s.shard(0).images.shape == (32, 3, 512, 512)
    assert killed and restarted and restarted[0].endswith("_tensordict/images.memmap")
    assert s.store.downloads == 1 and not list((s.path / META_DIR / "tmp").iterdir())
    s.release(0)
    s.store.close()
