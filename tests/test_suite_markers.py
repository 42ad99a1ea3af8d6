"""The suite's markers (issue 45): `cuda` is the one spelling of "needs a CUDA device", so
that `pytest -m cuda` selects every CUDA-only test; tests/conftest.py turns it into a
skip where torch sees no CUDA device. `python3 dev.py test --quick` deselects `slow`
and `ray`, and `python3 dev.py test` runs everything."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest
import torch

from conftest import CUDA_SKIP_REASON, REPO
from helpers.source_ast import nodes

TESTS = REPO / "tests"


def _src(node: ast.AST) -> str:
    return ast.unparse(node)


def _is_call_to(node: ast.AST, *names: str) -> bool:
    """``node`` calls ``pytest.NAME`` or ``pytest.mark.NAME`` (or a bare ``NAME``)."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    return name in names


def _needs_cuda(cond: ast.AST) -> bool:
    """A condition true where there is no CUDA device: ``not ...cuda...``, a device
    count compared low, or a string condition saying either."""
    if isinstance(cond, ast.Constant) and isinstance(cond.value, str):
        try:
            cond = ast.parse(cond.value, mode="eval").body
        except SyntaxError:
            return "cuda" in cond.value
    text = _src(cond).lower()
    if "cuda" not in text and "device_count" not in text:
        return False
    if isinstance(cond, ast.UnaryOp) and isinstance(cond.op, ast.Not):
        return True
    if isinstance(cond, ast.BoolOp):
        return any(_needs_cuda(v) for v in cond.values)
    return "device_count" in text  # device_count() < 1, == 0, ...


def other_cuda_skips(path: Path, root: Path = REPO) -> list[str]:
    """Each way ``path`` skips a test for want of CUDA other than the ``cuda`` marker:
    a skipif on it (a module-level alias such as ``needs_cuda = pytest.mark.skipif(...)``
    included), ``pytest.skip`` under an ``if`` on it, ``pytest.importorskip`` of a CUDA
    module."""
    found = []
    rel = path.relative_to(root)  # once a file, not once a node
    for node in nodes(path):
        if isinstance(node, ast.Call) and (
            (_is_call_to(node, "skipif") and node.args and _needs_cuda(node.args[0]))
            or (_is_call_to(node, "importorskip") and "cuda" in _src(node).lower())
        ):
            found.append(f"{rel}:{node.lineno}: {_src(node)}")
        elif isinstance(node, ast.If) and _needs_cuda(node.test):
            body = ast.Module(body=node.body, type_ignores=[])
            if any(_is_call_to(n, "skip", "xfail") for n in ast.walk(body)):
                found.append(f"{rel}:{node.lineno}: if {_src(node.test)}: pytest.skip(...)")
    return found


def test_cuda_is_spelled_once_in_the_suite() -> None:
    """No test file skips for want of CUDA but through the ``cuda`` marker (a skipif,
    an inline ``pytest.skip`` or an ``importorskip`` would hide the test from
    ``pytest -m cuda``)."""
    files = sorted(set(TESTS.rglob("*.py")) - {TESTS / "conftest.py"})  # the marker's skip
    assert len(files) > 50
    found = [hit for f in files for hit in other_cuda_skips(f)]
    assert not found, "mark these tests @pytest.mark.cuda instead:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "code",
    [
        'needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="x")',
        '@pytest.mark.skipif(not torch.cuda.is_available(), reason="x")\ndef test_a(): ...',
        "cuda = pytest.mark.skipif(torch.cuda.device_count() < 2, reason='x')",
        "pm = pytest.mark.skipif('not torch.cuda.is_available()', reason='x')",
        "def test_a():\n    if not torch.cuda.is_available():\n        pytest.skip('x')",
        "def test_a():\n    if sys.platform == 'linux' and not torch.cuda.is_available():\n"
        "        pytest.skip('x')",
        "def test_a():\n    pytest.importorskip('pycuda')",
        "p = pytest.param('cuda', marks=pytest.mark.skipif(not HAS_CUDA, reason='x'))",
    ],
)
def test_the_scan_finds_each_other_spelling(tmp_path: Path, code: str) -> None:
    found = _scan_text(tmp_path, code)
    assert len(found) == 1, (code, found)


@pytest.mark.parametrize(
    "code",
    [
        "@pytest.mark.cuda\ndef test_a(): ...",
        '@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-CUDA error")\ndef test_a(): ...',
        "def test_a():\n    if torch.cuda.is_available():\n        pytest.skip('a GPU is here')",
        "def test_a():\n    pytest.importorskip('triton')",
        "@pytest.mark.skipif(not hasattr(os, 'mkfifo'), reason='FIFOs')\ndef test_a(): ...",
    ],
)
def test_the_scan_leaves_the_marker_and_other_skips(tmp_path: Path, code: str) -> None:
    assert _scan_text(tmp_path, code) == []


def _scan_text(tmp_path: Path, code: str) -> list[str]:
    path = tmp_path / "probe.py"
    path.write_text(code + "\n")
    return other_cuda_skips(path, root=tmp_path)


@pytest.mark.cuda
def test_a_cuda_marked_test_runs_only_where_torch_sees_cuda() -> None:
    """Skipped by tests/conftest.py without a CUDA device; were it not, it would fail."""
    assert torch.cuda.is_available()


def test_conftest_skips_the_cuda_marked_tests_of_this_session(
    request: pytest.FixtureRequest,
) -> None:
    """Every collected test marked ``cuda`` carries the conftest's skip exactly where
    there is no CUDA device (this file's own marked test at least)."""
    marked = [i for i in request.session.items if i.get_closest_marker("cuda")]
    assert marked
    for item in marked:
        skips = [m for m in item.iter_markers("skip") if m.kwargs.get("reason") == CUDA_SKIP_REASON]
        assert bool(skips) == (not torch.cuda.is_available()), item.nodeid


def test_markers_are_registered_and_quick_deselects_slow_and_ray() -> None:
    """dev.py's ``--quick`` turns into ``-m "not slow and not ray"`` (before any other
    pytest argument); without it the whole suite runs, in parallel where xdist is."""
    spec = importlib.util.spec_from_file_location("dev", REPO / "dev.py")
    assert spec and spec.loader
    dev = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dev)
    quick = dev.pytest_args(["--quick", "-q", "tests/pack"])
    assert quick[quick.index("-m") + 1] == "not slow and not ray"
    assert "--quick" not in quick and quick[-2:] == ["-q", "tests/pack"]
    full = dev.pytest_args(["-q"])
    assert "-m" not in full and "--durations=20" in full and full[-1] == "-q"
    text = (REPO / "pyproject.toml").read_text()
    for name in ("cuda", "slow", "ray"):
        assert f'"{name}: ' in text, name
