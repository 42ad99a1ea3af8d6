"""Builds into a bucket: one writer per set at a time (a lease object, because the test
server, like others, ignores conditional PUTs), from two machines (two cache folders)
against the real S3 server; and the destination checked before any work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import s3_server as fx
from click.testing import CliRunner
from s3_server import RAW, bucket_path, built, write_src

import packer
from conftest import subprocess_env, write_image
from helpers.local_server import S3Server
from packer.cli import cli

s3, s3_server = fx.s3, fx.s3_server  # the fixtures
OPTIONS = ["--append", "--size", "8x6", "--shard-size", "300", "--workers", "1"]  # RAW's

# an `imgpack build` whose upload steps can be held: at its first "uploaded" step (or
# "lease taken", with HOLD_AT) it touches MARK and waits for GO (a file), so two builds
# are made to overlap where the race was; it touches MARK on exit too (a build that
# stopped early uploads nothing)
DRIVER = textwrap.dedent(
    """
    import atexit, os, pathlib, sys, time
    import packer.builder.upload as up
    from packer.cli import cli
    mark, go = pathlib.Path(os.environ["MARK"]), pathlib.Path(os.environ["GO"])
    at = os.environ.get("HOLD_AT", "uploaded")
    atexit.register(mark.touch)
    held = []
    def reached(step):
        if step.startswith(at) and not held:
            held.append(step)
            mark.touch()
            end = time.monotonic() + 60
            while not go.exists():
                if time.monotonic() > end:
                    raise SystemExit("never told to go on")
                time.sleep(0.01)
    up._reached = reached
    cli(sys.argv[1:])
    """
)


def _new_week(root: Path, tag: str) -> Path:
    """Two new images per class, named apart from every other folder's."""
    for c in ("cat", "dog"):
        for i in range(2):
            write_image(root / c / f"{tag}{i}.png", (20, 16), seed=1000 + i + hash(tag) % 97)
    return root


def _start(tmp_path: Path, name: str, src: Path, url: str, go: Path, **env: str):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    mark = tmp_path / f"{name}.mark"
    full = subprocess_env(
        **{k: v for k, v in os.environ.items() if k.startswith("AWS_")},
        IMGPACK_CACHE_DIR=str(tmp_path / f"cache-{name}"),  # another machine's cache
        MARK=str(mark),
        GO=str(go),
        **env,
    )
    proc = subprocess.Popen(
        [sys.executable, str(script), "build", str(src), url, *OPTIONS, "--quiet"],
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc, mark


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None or path.exists(), proc.communicate()
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.01)


def _sources(url: str, cache: Path) -> list[str]:
    """Every image's source of the set at ``url``, every shard read whole (so each
    object the index names is there and checked)."""
    s = packer.load(url, cache_dir=cache)
    try:
        for k in range(len(s.index.shards)):
            s.shard(k)
            s.release(k)
        return sorted(s.sources)
    finally:
        s.store.close()


@pytest.mark.slow
def test_two_concurrent_appends_from_two_machines_never_break_the_set(
    s3: S3Server, tmp_path: Path
) -> None:
    """Both builds start together and are held at their first upload until the other
    has reached its own (or ended): without serialization both upload, and each one's
    clean-up deletes the other's shards. Now at most one goes ahead; the other stops
    with one line (exit 2) having changed nothing, and runs cleanly afterwards."""
    url, _ = built(tmp_path, RAW)
    old = _sources(url, tmp_path / "check0")
    srcs = {n: _new_week(tmp_path / f"week-{n}", n) for n in ("a", "b")}
    go_a, go_b = tmp_path / "go-a", tmp_path / "go-b"
    pa, mark_a = _start(tmp_path, "a", srcs["a"], url, go_a)
    pb, mark_b = _start(tmp_path, "b", srcs["b"], url, go_b)
    _wait_for(mark_a, pa)
    _wait_for(mark_b, pb)
    go_a.touch()
    go_b.touch()
    ra, rb = pa.communicate(timeout=300), pb.communicate(timeout=300)
    codes = {"a": pa.returncode, "b": pb.returncode}
    assert set(codes.values()) <= {0, 2}, (codes, ra, rb)
    for code, (_, err) in zip(codes.values(), (ra, rb)):
        if code == 2:
            assert "another imgpack build is writing this set" in err, err
            assert err.strip().count("\n") == 0, err
    now = _sources(url, tmp_path / "check1")  # the set opens, every shard whole
    assert list(codes.values()).count(0) <= 1  # never both: they overlapped
    assert set(old) <= set(now)
    for n, code in codes.items():
        if code == 0:
            assert {f"cat/{n}0.png", f"dog/{n}1.png"} <= set(now), (n, now)
    # the builds that were turned away run now, one after the other, and succeed
    for n, code in codes.items():
        if code == 2:
            r = subprocess.run(
                [sys.executable, "-m", "packer", "build", str(srcs[n]), url, *OPTIONS],
                env=subprocess_env(IMGPACK_CACHE_DIR=str(tmp_path / f"cache-{n}")),
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert r.returncode == 0, r.stderr
    final = _sources(url, tmp_path / "check2")
    assert len(final) == len(old) + 8 and len(set(final)) == len(final)
    assert not list((bucket_path(s3, url) / ".imgpack-lease").glob("*"))  # released


@pytest.mark.slow
def test_a_second_writer_is_turned_away_while_the_first_holds_the_lease(
    s3: S3Server, tmp_path: Path
) -> None:
    url, _ = built(tmp_path, RAW)
    bucket = bucket_path(s3, url)
    before = {p: p.read_bytes() for p in bucket.rglob("*") if p.is_file()}
    go = tmp_path / "go"
    pa, mark_a = _start(tmp_path, "a", _new_week(tmp_path / "wa", "a"), url, go, HOLD_AT="lease")
    _wait_for(mark_a, pa)  # a holds the lease, has built nothing yet
    pb, _ = _start(tmp_path, "b", _new_week(tmp_path / "wb", "b"), url, tmp_path / "go-b")
    _, err = pb.communicate(timeout=300)
    assert pb.returncode == 2, err
    assert "another imgpack build is writing this set (host " in err, err
    leases = [p for p in (bucket / ".imgpack-lease").iterdir()]
    assert len(leases) == 1 and json.loads(leases[0].read_text())["pid"] == pa.pid
    after = {p: p.read_bytes() for p in bucket.rglob("*") if p.is_file() and p not in leases}
    assert after == before  # b changed nothing
    go.touch()
    _, err = pa.communicate(timeout=300)
    assert pa.returncode == 0, err
    assert len(_sources(url, tmp_path / "check")) == 10


@pytest.mark.slow
def test_a_killed_writers_lease_on_this_machine_does_not_block_the_rerun(
    s3: S3Server, tmp_path: Path
) -> None:
    url, _ = built(tmp_path, RAW)
    src = _new_week(tmp_path / "wa", "a")
    pa, mark = _start(tmp_path, "a", src, url, tmp_path / "never", HOLD_AT="lease")
    _wait_for(mark, pa)
    pa.kill()
    pa.communicate()
    assert list((bucket_path(s3, url) / ".imgpack-lease").iterdir())  # left behind
    r = CliRunner().invoke(cli, ["build", str(src), url, *OPTIONS])
    assert r.exit_code == 0, r.output
    assert not list((bucket_path(s3, url) / ".imgpack-lease").glob("*"))  # removed


def test_building_into_a_missing_bucket_is_one_line_before_any_work(
    s3: S3Server, tmp_path: Path
) -> None:
    src = write_src(tmp_path / "src", {"cat": 2, "dog": 2})
    t0 = time.monotonic()
    r = CliRunner().invoke(cli, ["build", str(src), "s3://no-such-bucket/x", "--shard-size", "300"])
    assert r.exit_code == 2, r.output
    assert r.output == (
        "Error: s3://no-such-bucket: the bucket does not exist; create it first, or check "
        f"its name and the endpoint ({s3.endpoint})\n"
    )
    assert not (tmp_path / "cache" / "builds").exists()  # nothing built or staged
    assert time.monotonic() - t0 < 30
    r = CliRunner().invoke(cli, ["info", "s3://no-such-bucket/x"])
    assert r.exit_code == 2 and "the bucket does not exist" in r.output, r.output


def test_building_with_a_wrong_secret_is_one_line_exit_2_before_any_work(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = write_src(tmp_path / "src", {"cat": 2, "dog": 2})
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong/secret+" + "z" * 20)
    r = CliRunner().invoke(cli, ["build", str(src), "s3://imgpack/sets/w", "--shard-size", "300"])
    assert r.exit_code == 2, r.output
    assert "refused the credentials (SignatureDoesNotMatch)" in r.output
    assert r.output.count("\n") == 1 and "wrong/secret" not in r.output, r.output
    assert not (tmp_path / "cache" / "builds").exists()
