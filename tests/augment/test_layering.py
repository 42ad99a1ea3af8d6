"""The augment stage's imports run one way: no module of packer/augment/ sits on an import
circle, lazy imports inside functions included (the base, draws and params at the bottom,
the ops on them, fused above the ops, Compose on top), and the codec below never imports it."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import packer
from helpers.source_ast import nodes

ROOT = Path(packer.__file__).parent


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    """packer's modules -> the packer modules each imports anywhere in its file (the
    ``TYPE_CHECKING`` blocks aside; a package's ``__init__`` importing its children aside).
    Made once while the files are unchanged (three tests read it), a copy each call."""
    files = tuple(sorted((str(p), p.read_text(encoding="utf-8")) for p in ROOT.rglob("*.py")))
    return {m: set(targets) for m, targets in _graph_of(files).items()}


@functools.cache
def _graph_of(files: tuple[tuple[str, str], ...]) -> dict[str, set[str]]:
    paths = {_module(Path(p)): Path(p) for p, _ in files}
    graph: dict[str, set[str]] = {m: set() for m in paths}
    for mod, path in paths.items():
        is_pkg = path.name == "__init__.py"
        skip = {
            id(n)
            for node in nodes(path)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for n in ast.walk(node)
        }
        for node in nodes(path):
            if id(node) in skip:
                continue
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = base[: len(base) - node.level + 1]
                    src = ".".join(base + ([node.module] if node.module else []))
                else:
                    src = node.module or ""
                targets = [
                    f"{src}.{a.name}" if f"{src}.{a.name}" in paths else src for a in node.names
                ]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in paths:
                    t = t.rpartition(".")[0]
                if t and t != mod and not (is_pkg and t.startswith(mod + ".")):
                    graph[mod].add(t)
    return graph


def _reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = set(), list(graph[start])
    while todo:
        m = todo.pop()
        if m == goal:
            return True
        if m not in seen:
            seen.add(m)
            todo.extend(graph[m])
    return False


def test_no_augment_module_is_on_an_import_circle() -> None:
    graph = _graph()
    augment = sorted(m for m in graph if m.startswith("packer.augment"))
    assert "packer.augment.compose" in augment and "packer.augment.fused" in augment
    circles = [m for m in augment if _reaches(graph, m, m)]
    assert circles == []


def test_the_imports_that_made_the_circle_now_run_one_way() -> None:
    """Compose reaches the fused recipe, which reaches the ops; no op reaches Compose."""
    graph = _graph()
    assert _reaches(graph, "packer.augment.compose", "packer.augment.fused")
    assert _reaches(graph, "packer.augment.fused", "packer.augment.policies")
    for op in ("transforms", "policies", "erasing", "augmix", "fused", "color", "geometry"):
        assert not _reaches(graph, f"packer.augment.{op}", "packer.augment.compose"), op


def test_the_codec_does_not_import_augment() -> None:
    graph = _graph()
    up = {
        (m, t)
        for m in graph
        if m.startswith("packer.imaging")
        for t in graph[m]
        if t.startswith(("packer.augment", "packer.transforms"))
    }
    assert up == set()
