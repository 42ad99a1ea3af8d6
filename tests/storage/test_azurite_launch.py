"""Azurite started from a node binary and an azurite tree named by the environment
(``IMGPACK_NODE``, ``IMGPACK_AZURITE_DIR``): what a machine without npm (the GPU
machine of the benchmarks) carries, with node not on PATH."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from helpers.emulators import AzuriteServer, azurite_command, azurite_dir, install_azurite
from packer.errors import UsageError


def _node() -> str:
    node = os.environ.get("IMGPACK_NODE") or shutil.which("node")
    if node is None:
        pytest.skip("no node binary here")
    return os.path.realpath(node)


def _azurite_tree(monkeypatch: pytest.MonkeyPatch) -> Path:
    why = install_azurite()  # IMGPACK_AZURITE_DIR when set, else the repository's
    if why is not None:
        pytest.skip(why)
    root = azurite_dir()
    monkeypatch.setenv("IMGPACK_AZURITE_DIR", str(root))
    return root


def test_azurite_runs_from_the_named_node_and_tree_without_node_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = _node()
    root = _azurite_tree(monkeypatch)
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no node, no npm
    monkeypatch.setenv("IMGPACK_NODE", node)
    assert azurite_command() == [
        node, str(root / "node_modules" / "azurite" / "dist" / "src" / "blob" / "main.js")
    ]  # fmt: skip
    assert install_azurite() is None  # the tests' fixture takes it as it is
    server = AzuriteServer(tmp_path / "data", containers=("imgpack",)).start()
    try:
        for k, v in server.env().items():
            monkeypatch.setenv(k, v)
        from packer.storage.client import open_store
        from packer.storage.url import parse_url

        store = open_store(parse_url("az://imgpack/p"))
        store.put(b"hello", "x.bin")
        assert store.get("x.bin", max_bytes=100) == b"hello"
    finally:
        server.stop()


def test_without_node_the_launcher_names_imgpack_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _azurite_tree(monkeypatch)
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("IMGPACK_NODE", raising=False)
    with pytest.raises(UsageError, match=r"node is not on PATH.*IMGPACK_NODE"):
        azurite_command()
    assert "IMGPACK_NODE" in (install_azurite() or "")
    (tmp_path / "node").write_text("not a binary")
    monkeypatch.setenv("IMGPACK_NODE", str(tmp_path / "node"))
    with pytest.raises(UsageError, match=r"IMGPACK_NODE .*node: not an executable file"):
        azurite_command()


def test_an_azurite_dir_without_azurite_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IMGPACK_AZURITE_DIR", str(tmp_path))
    assert install_azurite() == f"IMGPACK_AZURITE_DIR {tmp_path}: no node_modules/azurite in it"
    with pytest.raises(UsageError, match=f"azurite is missing from {tmp_path}"):
        azurite_command()
