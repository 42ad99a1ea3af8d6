"""The Google Cloud Storage and Azure servers of the storage tests, started once a
session on 127.0.0.1 (free ports) and stopped by their PIDs: Azurite (Azure's emulator,
installed into .test-servers/azurite by dev.py or here; skipped, saying why, without
node and npm) and a server of GCS's XML API (tests/helpers/emulators.py says why not
gcp-storage-emulator). The tests using them run on one xdist worker (tests/conftest.py
groups them as ``cloud``): one start of each server a session."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import processes
from helpers.emulators import AzuriteServer, GCSXMLServer, install_azurite
from packer.storage import client

BUCKET = "imgpack"
# every variable of the three clouds' settings that a developer's shell may hold: cleared
# for each test, so only the server's environment is seen
CLEARED = (
    "AZURE_STORAGE_CONNECTION_STRING",
    "AZURE_STORAGE_ACCOUNT_NAME",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_ACCESS_KEY",
    "AZURE_STORAGE_MASTER_KEY",
    "AZURE_STORAGE_SAS_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_STORAGE_TOKEN",
    "AZURE_STORAGE_ENDPOINT",
    "AZURE_ENDPOINT",
    "AZURE_STORAGE_USE_EMULATOR",
    "AZURITE_BLOB_STORAGE_URL",
    "AZURE_CLIENT_ID",
    "AZURE_CLIENT_SECRET",
    "AZURE_TENANT_ID",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GOOGLE_SERVICE_ACCOUNT",
    "GOOGLE_SERVICE_ACCOUNT_PATH",
    "GOOGLE_SERVICE_ACCOUNT_KEY",
    "GOOGLE_BEARER_TOKEN",
    "GOOGLE_BASE_URL",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
)


@dataclass
class Cloud:
    """One server as a test sees it: ``scheme``, the server, its ``secret`` (never to
    be seen in an output or a file)."""

    scheme: str
    server: AzuriteServer | GCSXMLServer
    secret: str

    def new_url(self) -> str:
        return f"{self.scheme}://{BUCKET}/sets/{uuid.uuid4().hex[:12]}"


def _started(server: AzuriteServer | GCSXMLServer) -> AzuriteServer | GCSXMLServer:
    server.start()
    assert server.proc is not None
    server.record = processes.track(server.proc.pid)  # type: ignore[union-attr]
    return server


def _stop(server: AzuriteServer | GCSXMLServer) -> None:
    server.stop()
    processes.stop(server.record)  # type: ignore[union-attr]


@pytest.fixture(scope="session")
def azurite_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzuriteServer]:
    why = install_azurite()
    if why is not None:
        pytest.skip(why)
    server = AzuriteServer(tmp_path_factory.mktemp("azurite") / "data", containers=(BUCKET,))
    _started(server)
    try:
        yield server
    finally:
        _stop(server)


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GCSXMLServer]:
    server = GCSXMLServer(tmp_path_factory.mktemp("gcs") / "data", buckets=(BUCKET,))
    _started(server)
    try:
        yield server
    finally:
        _stop(server)


def _environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, env: dict[str, str]) -> None:
    for name in CLEARED:
        monkeypatch.delenv(name, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("IMGPACK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(client.RETRY, "attempts", 3)
    monkeypatch.setattr(client.RETRY, "backoff", 0.05)


@pytest.fixture
def az(azurite_server: AzuriteServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Cloud:
    _environment(monkeypatch, tmp_path, azurite_server.env())
    return Cloud("az", azurite_server, azurite_server.key)


@pytest.fixture
def gs(gcs_server: GCSXMLServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Cloud:
    _environment(monkeypatch, tmp_path, gcs_server.env())
    return Cloud("gs", gcs_server, gcs_server.token)


@pytest.fixture(params=["gs", "az"])
def gs_or_az(request: pytest.FixtureRequest) -> Cloud:
    """Each of the two clouds in turn."""
    return request.getfixturevalue(request.param)
