"""The S3-compatible server of the storage tests (``rclone serve s3`` on 127.0.0.1,
signatures checked), its client environment, and small sets built into it."""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import processes
from conftest import write_image
from helpers.local_server import S3Server
from packer.builder.api import BuildConfig, build
from packer.storage import client

BUCKET = "imgpack"
RAW = BuildConfig(size=(8, 6), workers=1, shard_size=300)  # 144-byte rows: 2 per shard
JPEG = BuildConfig(size=(8, 6), workers=1, shard_size=2500, store="jpeg")


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = S3Server(tmp_path_factory.mktemp("s3") / "data", buckets=(BUCKET,))
    start, records = server.start, []

    def start_recorded(*args: object, **kwargs: object) -> S3Server:
        # each start (tests restart a server they killed) recorded: stopped however the
        # session ends (tests/processes.py)
        started = start(*args, **kwargs)  # type: ignore[arg-type]
        assert server.proc is not None
        records.append(processes.track(server.proc.pid))
        return started

    server.start = start_recorded  # type: ignore[method-assign]
    server.start()
    try:
        yield server
    finally:
        server.stop()
        for record in records:
            processes.stop(record)


@pytest.fixture
def s3(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> S3Server:
    """The server, started if a test killed it, with this process's AWS environment
    pointing at it, a cache of the test's own and quick retries."""
    if s3_server.proc is None or s3_server.proc.poll() is not None:
        s3_server.start()
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("IMGPACK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(client.RETRY, "attempts", 3)
    monkeypatch.setattr(client.RETRY, "backoff", 0.05)
    return s3_server


def new_url() -> str:
    return f"s3://{BUCKET}/sets/{uuid.uuid4().hex[:12]}"


def write_src(root: Path, names: dict[str, int], fmt: str = "PNG") -> Path:
    """``{class: count}`` images ``<class>/<i>.<fmt>`` (20x16)."""
    ext = "png" if fmt == "PNG" else "jpg"
    for c, n in names.items():
        for i in range(n):
            write_image(root / c / f"{i}.{ext}", (20, 16), seed=i + 100 * len(c), fmt=fmt)
    return root


def built(tmp_path: Path, config: BuildConfig = RAW, n: int = 3) -> tuple[str, Path]:
    """A set of ``2 * n`` images built into a new URL; (url, source folder)."""
    fmt = "JPEG" if config.store == "jpeg" else "PNG"
    src = write_src(tmp_path / "src", {"cat": n, "dog": n}, fmt)
    url = new_url()
    build(src, url, config)
    return url, src


def bucket_path(server: S3Server, url: str) -> Path:
    """Where the server keeps the objects under ``url``."""
    return server.data / url.removeprefix("s3://")


class SilentServer:
    """A real TCP server on 127.0.0.1 that accepts every connection and never sends a
    byte (a hung endpoint): ``connections`` counts them, :attr:`accepted` is set at the
    first. Point the AWS environment at it to see whether, and how long, imgpack waits."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.accepted = threading.Event()
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._run, daemon=True).start()

    @property
    def connections(self) -> int:
        return len(self.conns)

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            self.accepted.set()

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()
