"""Real servers on 127.0.0.1 for the Google Cloud Storage and Azure tests (and the
benchmark), beside :mod:`.local_server`'s S3 server. Not used by imgpack itself.

* :class:`AzuriteServer`: Microsoft's Azure Storage emulator (the ``azurite`` npm
  package, installed by :func:`install_azurite` into ``.test-servers/azurite`` of the
  repository, or the tree ``IMGPACK_AZURITE_DIR`` names, run by the node binary
  ``IMGPACK_NODE`` names or node on PATH), blob service only, with an account and a random key of its own, so every
  request's SharedKey signature is checked.
* :class:`GCSXMLServer`: ``rclone serve s3`` without keys. obstore's GCS client speaks
  GCS's XML API (``GET/PUT/HEAD/DELETE /BUCKET/KEY``, ``?list-type=2`` listings, S3-style
  multipart uploads), which is S3's wire format by Google's design, so this server is
  one obstore's ``GCSStore`` reads and writes through ``GOOGLE_BASE_URL``.
  ``gcp-storage-emulator`` (the Python GCS emulator) is not used: it answers only the
  JSON API, and obstore's requests get 501, or answers without the ETag and
  Last-Modified headers obstore requires (docs/RELIABILITY.md, "Google Cloud and Azure").

Each is started on a free port and stopped by its PID, as :class:`.local_server.S3Server`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import os
import shutil
import subprocess
from email.utils import formatdate
from pathlib import Path

from packer.errors import UsageError

from .local_server import free_port, launch, rclone_binary, stop_process

REPO = Path(__file__).resolve().parents[2]
AZURITE_VERSION = "3.35.0"
AZURITE_DIR = REPO / ".test-servers" / "azurite"
AZURE_API_VERSION = "2021-08-06"


def azurite_dir() -> Path:
    """Where azurite is installed: ``IMGPACK_AZURITE_DIR`` (a tree with
    ``node_modules/azurite``, e.g. a copy carried to a machine without npm), else the
    repository's ``.test-servers/azurite``."""
    return Path(os.environ.get("IMGPACK_AZURITE_DIR") or AZURITE_DIR)


def azurite_command() -> list[str]:
    """The command that runs Azurite's blob service: ``IMGPACK_NODE`` (a node binary)
    with azurite's ``blob/main.js`` when set, else the ``azurite-blob`` script (node
    found on PATH by its ``#!/usr/bin/env node``). UsageError naming what is missing."""
    root = azurite_dir()
    exe = root / "node_modules" / ".bin" / "azurite-blob"
    main = root / "node_modules" / "azurite" / "dist" / "src" / "blob" / "main.js"
    if not exe.is_file() and not main.is_file():
        raise UsageError(
            f"azurite is missing from {root}: python3 dev.py test installs it (npm install "
            f"--prefix {root} azurite@{AZURITE_VERSION}), or set IMGPACK_AZURITE_DIR to a "
            "tree holding node_modules/azurite"
        )
    node = os.environ.get("IMGPACK_NODE")
    if node:
        if not (os.path.isfile(node) and os.access(node, os.X_OK)):
            raise UsageError(f"IMGPACK_NODE {node}: not an executable file (a node binary)")
        return [node, str(main)]
    if shutil.which("node") is None:
        raise UsageError(
            "node is not on PATH (azurite is a node program): install node, or set "
            "IMGPACK_NODE to a node binary"
        )
    return [str(exe)]


def install_azurite(root: Path | None = None) -> str | None:
    """Install azurite (pinned) into ``root`` (default :func:`azurite_dir`) with npm
    unless it is there; None when done (or when ``IMGPACK_AZURITE_DIR`` names a tree
    that holds it, whatever its version), else why it could not be (no node or npm on
    PATH, npm failed, nothing in ``IMGPACK_AZURITE_DIR``)."""
    given = root is None and bool(os.environ.get("IMGPACK_AZURITE_DIR"))
    root = azurite_dir() if root is None else root
    exe = root / "node_modules" / ".bin" / "azurite-blob"
    stamp = root / "node_modules" / "azurite" / "package.json"
    if given:
        if not stamp.is_file():
            return f"IMGPACK_AZURITE_DIR {root}: no node_modules/azurite in it"
        if not os.environ.get("IMGPACK_NODE") and shutil.which("node") is None:
            return "node is not on PATH and IMGPACK_NODE is not set (azurite is a node program)"
        return None
    if exe.is_file() and stamp.is_file() and f'"{AZURITE_VERSION}"' in stamp.read_text():
        return None
    npm, node = shutil.which("npm"), shutil.which("node")
    if npm is None or node is None:
        return "node and npm are not on PATH (the Azure tests need azurite, an npm package)"
    root.mkdir(parents=True, exist_ok=True)
    cmd = [npm, "install", "--prefix", str(root), "--no-audit", "--no-fund", "--save-exact"]
    r = subprocess.run(
        [*cmd, f"azurite@{AZURITE_VERSION}"], capture_output=True, text=True, timeout=600
    )
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
        return f"npm install azurite@{AZURITE_VERSION} failed: {tail[0][:200]}"
    return None


class _Process:
    """A server process on :attr:`port`, started by :meth:`_launch`, stopped by its PID."""

    name = "server"
    port: int
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def _launch(self, cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> None:
        self.proc = launch(cmd, self.log, self.port, timeout, self.name, env)

    def stop(self, kill: bool = False) -> None:
        """Stop the server by its PID (SIGKILL with ``kill``)."""
        stop_process(self.proc, kill)
        self.proc = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class AzuriteServer(_Process):
    """Azurite's blob service over ``data`` at :attr:`endpoint`, account :attr:`account`
    with the key :attr:`key` (base64), the ``containers`` created at each start."""

    name = "azurite"

    def __init__(self, data: Path, containers: tuple[str, ...] = ("imgpack",)) -> None:
        self.data = Path(data)
        self.containers = containers
        self.account = "imgpacktest"
        self.key = base64.b64encode(os.urandom(32)).decode()
        self.port = free_port()
        self.log = self.data.parent / f"azurite-{self.port}.log"

    @property
    def blob_endpoint(self) -> str:
        """The account's blob URL (Azurite's are path-style)."""
        return f"{self.endpoint}/{self.account}"

    def env(self) -> dict[str, str]:
        """The Azure environment a client of this server needs."""
        return {
            "AZURE_STORAGE_ACCOUNT_NAME": self.account,
            "AZURE_STORAGE_ACCOUNT_KEY": self.key,
            "AZURE_STORAGE_ENDPOINT": self.blob_endpoint,
        }

    def start(self, timeout: float = 30.0) -> AzuriteServer:
        self.data.mkdir(parents=True, exist_ok=True)
        cmd = [
            *azurite_command(),
            "--blobHost",
            "127.0.0.1",
            "--blobPort",
            str(self.port),
            "--location",
            str(self.data),
            "--silent",
            "--skipApiVersionCheck",
            "--disableTelemetry",
        ]
        env = {**os.environ, "AZURITE_ACCOUNTS": f"{self.account}:{self.key}"}
        self._launch(cmd, timeout, env)
        for c in self.containers:
            self.create_container(c)
        return self

    def create_container(self, name: str) -> None:
        """PUT the container (SharedKey-signed); an existing one is kept."""
        date = formatdate(usegmt=True)
        path = f"/{self.account}/{name}"
        headers = f"x-ms-date:{date}\nx-ms-version:{AZURE_API_VERSION}\n"
        # verb, then 11 empty standard headers (Content-Length 0 is signed as empty)
        signed = "PUT\n" + "\n" * 11 + headers + f"/{self.account}{path}\nrestype:container"
        mac = hmac.new(base64.b64decode(self.key), signed.encode(), hashlib.sha256)
        auth = f"SharedKey {self.account}:{base64.b64encode(mac.digest()).decode()}"
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request(
                "PUT",
                path + "?restype=container",
                headers={
                    "x-ms-date": date,
                    "x-ms-version": AZURE_API_VERSION,
                    "Authorization": auth,
                    "Content-Length": "0",
                },
            )
            r = conn.getresponse()
            body = r.read()
        finally:
            conn.close()
        if r.status not in (201, 409):  # 409: it exists
            raise RuntimeError(f"azurite: creating {name}: {r.status} {body[:200]!r}")

    def __enter__(self) -> AzuriteServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class GCSXMLServer(_Process):
    """``rclone serve s3`` over ``data`` (one folder per bucket), without keys: a server
    of GCS's XML API for obstore's ``GCSStore`` (see the module docstring)."""

    name = "rclone serve s3 (GCS XML API)"

    def __init__(self, data: Path, buckets: tuple[str, ...] = ("imgpack",)) -> None:
        self.data = Path(data)
        self.buckets = buckets
        self.token = "imgpack-test-token-" + os.urandom(6).hex()
        self.port = free_port()
        self.log = self.data.parent / f"gcs-{self.port}.log"

    def env(self) -> dict[str, str]:
        """The Google environment a client of this server needs (a static token, which
        this server takes without checking: the tests' GCS credentials go unverified)."""
        return {"GOOGLE_BASE_URL": self.endpoint, "GOOGLE_BEARER_TOKEN": self.token}

    def start(self, timeout: float = 20.0) -> GCSXMLServer:
        for b in self.buckets:
            (self.data / b).mkdir(parents=True, exist_ok=True)
        cmd = [
            rclone_binary(),
            "serve",
            "s3",
            "--addr",
            f"127.0.0.1:{self.port}",
            "--config",
            os.devnull,
            str(self.data),
        ]
        self._launch(cmd, timeout)
        return self

    def __enter__(self) -> GCSXMLServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
