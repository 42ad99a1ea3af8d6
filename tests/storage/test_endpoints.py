"""The edges of object storage: what a URL or AWS_ENDPOINT_URL may hold (a credential is
never echoed, a malformed endpoint is one line), and a server that accepts connections
and never answers (bounded tries, a total deadline, Ctrl-C honoured at once)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import s3_server as fx
from click.testing import CliRunner
from s3_server import RAW, SilentServer, write_src

import packer
from conftest import subprocess_env
from helpers.local_server import S3Server
from packer.builder.api import build
from packer.cli import cli
from packer.errors import PackerError, StorageError, UsageError
from packer.storage import client
from packer.storage.url import parse_url

s3, s3_server = fx.s3, fx.s3_server  # the fixtures

SECRETS = [
    "wJalr/XUtnFEMI/K7MDENG",  # an AWS-like secret with '/'
    "ab/cd@ef",
    "x:y/z",
    "ab%2Fcd",
    "a@b",
    "/leading",
    "trailing/",
    "a?b/c",
    "a#b/c",
    "sp ace/x",
]


def _urls(secret: str) -> list[str]:
    return [
        f"s3://AKIDEXAMPLE:{secret}@imgpack/sets/x",
        f"s3://AKIDEXAMPLE:{secret}@imgpack",
        f"gs://AKIDEXAMPLE:{secret}@bucket/p",
        f"S3://AKIDEXAMPLE:{secret}@imgpack/p",  # not a scheme imgpack knows: still unquoted
        f"s3://{secret}@imgpack/sets/x",
    ]


@pytest.mark.parametrize("secret", SECRETS)
def test_a_credential_in_a_url_is_refused_and_never_echoed(
    secret: str, s3: S3Server, tmp_path: Path
) -> None:
    src = write_src(tmp_path / "src", {"cat": 1})
    for url in _urls(secret):
        with pytest.raises(PackerError) as e:
            parse_url(url)
        assert secret not in str(e.value) and "AKIDEXAMPLE" not in str(e.value), str(e.value)
        with pytest.raises(PackerError) as e:
            packer.load(url)
        assert secret not in str(e.value), str(e.value)
        if url.startswith(("s3:", "gs:")):
            with pytest.raises(PackerError) as e:
                packer.load(Path(url))  # pathlib folds '//'
            assert secret not in str(e.value), str(e.value)
        for args in (
            ["info", url],
            ["verify", url],
            ["build", str(src), url, "--shard-size", "300"],
            ["build", url, str(tmp_path / "dst"), "--shard-size", "300"],
            ["build", str(src), str(tmp_path / "dst2"), "--classes", url],
        ):
            r = CliRunner().invoke(cli, args)
            assert r.exit_code == 2, (args, r.output)
            assert r.output.startswith("Error:") and r.output.count("\n") == 1, r.output
            assert secret not in r.output and "Traceback" not in r.output, r.output


@pytest.mark.parametrize("secret", SECRETS)
def test_a_credential_in_the_endpoint_is_never_echoed(
    secret: str, s3: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client.RETRY, "attempts", 1)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://key:{secret}@example.com:9000")
    r = CliRunner().invoke(cli, ["info", "s3://imgpack/sets/x"])
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
    assert secret not in r.output and "plain http is allowed only" in r.output, r.output


MALFORMED = [
    "http://[::1",  # an unclosed IPv6 bracket: urlsplit raises
    "http://[::1]:99999",
    "http://127.0.0.1:99999",  # a port out of range: obstore panics
    "http://127.0.0.1:0",
    "http://127.0.0.1:-1",
    "http://127.0.0.1:port",
    "not a url",
    "127.0.0.1:9000",
    "ftp://127.0.0.1:21",
    "http://",
    "http://exa mple.com",
    "http://127.0.0.1:9000?x=1",
    "http://[zz]:9000",
]


@pytest.mark.parametrize("endpoint", MALFORMED)
def test_a_malformed_endpoint_is_one_line_exit_2(
    endpoint: str, s3: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    for args in (
        ["info", "s3://imgpack/sets/x"],
        ["build", str(write_src(tmp_path / "src", {"cat": 1})), "s3://imgpack/sets/y"],
    ):
        r = CliRunner().invoke(cli, [*args, "--shard-size", "300"] if "build" in args else args)
        assert r.exit_code == 2, (endpoint, r.output, r.exception)
        assert r.output.startswith("Error: AWS_ENDPOINT_URL"), r.output
        assert r.output.count("\n") == 1, r.output
    with pytest.raises(UsageError, match="AWS_ENDPOINT_URL"):
        packer.load("s3://imgpack/sets/x")


def test_a_sound_endpoint_with_a_path_or_ipv6_is_accepted() -> None:
    assert client.parse_endpoint("http://[::1]:9000") == ("http://[::1]:9000", [])
    assert client.parse_endpoint("HTTPS://s3.example.com/") == ("https://s3.example.com/", [])
    assert client.parse_endpoint("http://k:s/e@cret@127.0.0.1:9") == (
        "http://127.0.0.1:9",
        ["k:s/e@cret", "s/e@cret"],
    )


@pytest.fixture
def silent(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[SilentServer]:
    server = SilentServer()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{server.port}")
    try:
        yield server
    finally:
        server.close()


def test_a_server_that_never_answers_times_out_per_try(
    silent: SilentServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client.RETRY, "attempts", 2)
    monkeypatch.setattr(client.RETRY, "first_byte_timeout", 0.5)
    t0 = time.monotonic()
    with pytest.raises(
        StorageError,
        match=r"imgpack-set\.json: could not read it after 2 tries in \d+ s \(no data in 0\.5 s\)",
    ):
        packer.load("s3://imgpack/sets/x")
    assert time.monotonic() - t0 < 5
    assert silent.accepted.is_set()


def test_the_total_deadline_stops_the_tries(
    silent: SilentServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client.RETRY, "attempts", 100)
    monkeypatch.setattr(client.RETRY, "first_byte_timeout", 0.3)
    monkeypatch.setattr(client.RETRY, "deadline", 1.0)
    t0 = time.monotonic()
    with pytest.raises(StorageError, match=r"could not read it after [2-4] tries"):
        packer.load("s3://imgpack/sets/x")
    assert time.monotonic() - t0 < 3


def test_the_default_bounds_of_a_hung_server() -> None:
    """What `imgpack info` costs at most against a server that never answers, with the
    defaults: every try bounded by the first-byte timeout, no try after the deadline."""
    r = client.Retry()
    assert r.first_byte_timeout <= 10 and r.idle_timeout <= 30 and r.deadline <= 60
    worst, t = 0.0, 0.0
    for attempt in range(r.attempts):
        if attempt:
            delay = min(r.max_backoff, r.backoff * 2 ** (attempt - 1))
            if t + delay > r.deadline:
                break
            t += delay
        t += r.first_byte_timeout
        worst = t
    assert worst <= 60


def test_ctrl_c_against_a_server_that_never_answers_exits_at_once(
    silent: SilentServer, tmp_path: Path
) -> None:
    """`imgpack info s3://...` with the default timeouts: SIGINT once the request is in
    flight is honoured (the interrupt note) within two seconds, and the process exits 130
    (its interpreter's teardown on this shared machine takes a few seconds more)."""
    env = subprocess_env(
        **{k: v for k, v in os.environ.items() if k.startswith(("AWS_", "IMGPACK_"))}
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "packer", "info", "s3://imgpack/sets/x"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[tuple[float, str]] = []

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append((time.monotonic(), line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert silent.accepted.wait(120), "imgpack never connected"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        reader.join(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = "".join(line for _, line in lines)
    assert proc.returncode == 130, text
    noted = [t for t, line in lines if line.startswith("Interrupted.")]
    assert noted and noted[0] - t0 < 2.0, (noted, t0, text)
    assert "Traceback" not in text


def test_build_into_a_silent_server_fails_before_any_work(
    silent: SilentServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(client.RETRY, "attempts", 1)
    monkeypatch.setattr(client.RETRY, "first_byte_timeout", 0.5)
    src = write_src(tmp_path / "src", {"cat": 2})
    with pytest.raises(StorageError, match="could not upload it after 1 try"):
        build(src, "s3://imgpack/sets/y", RAW)
    assert not (tmp_path / "cache" / "builds").exists()  # nothing built
