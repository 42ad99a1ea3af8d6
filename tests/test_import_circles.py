"""No import circles in packer/ (issue 45): every module's imports, lazy ones inside
functions included, form a graph without cycles. ``TYPE_CHECKING`` blocks are not
imports at run time, and a package's ``__init__`` importing its own children is the
package's face, not a circle. Shared pieces move down (constants and small helpers into
a module that imports none of its siblings; a registry the modules above fill); a
dispatcher sits on top of the readers it dispatches to."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import packer
from helpers.source_ast import nodes, parse

ROOT = Path(packer.__file__).parent


def _name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_lines(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {n.lineno for b in node.body for n in ast.walk(b) if hasattr(n, "lineno")}
    return skip


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules of the package under ``root`` it imports, anywhere in the
    file (module level or inside a function), resolved to the deepest existing module."""
    mods = {_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        tree = parse(path)
        is_pkg = path.name == "__init__.py"
        skip = _type_checking_lines(tree)
        for node in nodes(path):
            if getattr(node, "lineno", None) in skip:
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = m.split(".") if is_pkg else m.split(".")[:-1]
                    base = base[: len(base) - node.level + 1]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                targets = [
                    f"{mod}.{a.name}" if f"{mod}.{a.name}" in mods else mod for a in node.names
                ]
            else:
                continue
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != m and not (is_pkg and t.startswith(m + ".")):
                    graph[m].add(t)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_circles_lazy_imports_included() -> None:
    found = circles(import_graph(ROOT))
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for rel, text in {"__init__.py": "", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.mark.parametrize(
    "files",
    [
        # a lazy import inside a function closes the circle
        {"a.py": "from . import b\n", "b.py": "def f():\n    from .a import x\n"},
        # three modules, absolute imports, one of them a method's
        {
            "a.py": "import pkg.b\n",
            "b.py": "from pkg.c import y\n",
            "c.py": "class K:\n    def m(self):\n        import pkg.a\n",
        },
        # a subpackage's module reaching up through ``..``
        {
            "sub/__init__.py": "",
            "sub/x.py": "from ..top import t\n",
            "top.py": "from .sub.x import y\n",
        },
    ],
)
def test_the_check_finds_a_circle(tmp_path: Path, files: dict[str, str]) -> None:
    assert circles(import_graph(_tree(tmp_path, files)))


@pytest.mark.parametrize(
    "files",
    [
        # a package's __init__ importing its children, the children importing each other down
        {"__init__.py": "from .a import x\n", "a.py": "from .b import y\n", "b.py": ""},
        # an import under TYPE_CHECKING is not one at run time
        {
            "a.py": "from . import b\n",
            "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import x\n",
        },
    ],
)
def test_the_check_lets_layers_through(tmp_path: Path, files: dict[str, str]) -> None:
    assert circles(import_graph(_tree(tmp_path, files))) == []
