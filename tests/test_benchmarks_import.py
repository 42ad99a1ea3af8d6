"""Every module of ``benchmarks/`` imports as part of the package (``python -m
benchmarks.NAME``), so a broken import fails here rather than on the GPU machine."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODULES = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if p.stem != "__init__")
# extras a benchmark may need that the test machine may lack: a missing one skips it
OPTIONAL = ("nvidia.dali", "ray", "triton", "nvidia.nvimgcodec", "torchcodec", "torchvision")


def test_every_benchmark_file_is_listed() -> None:
    assert "_common" in MODULES and "run" in MODULES and len(MODULES) >= 20
    assert not (ROOT / "benchmarks" / "_out.py").exists()  # merged into _common


@pytest.mark.parametrize("name", MODULES)
def test_a_benchmark_module_imports(name: str) -> None:
    try:
        module = importlib.import_module(f"benchmarks.{name}")
    except ImportError as e:
        missing = e.name or ""
        if missing.startswith(OPTIONAL):
            pytest.skip(f"benchmarks.{name} needs {missing}, not installed here")
        raise
    assert module.__name__ == f"benchmarks.{name}"
    if name != "_common":
        assert callable(getattr(module, "main", None)) or name == "remote_train", name


def test_no_benchmark_edits_sys_path_to_find_another() -> None:
    bad = [
        p.name
        for p in (ROOT / "benchmarks").glob("*.py")
        for line in p.read_text(encoding="utf-8").splitlines()
        if "sys.path.insert" in line and "sys.argv" not in line  # loader_ab's child: --old
    ]
    assert bad == []
