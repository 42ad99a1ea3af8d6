"""The suite's source scans (import layering and circles, library strings, kind names,
CUDA skips, ...) each parsed every module of the package, and several walked each tree
again per test: about 20 CPU-seconds a run (issue 45, item 12). :func:`parse` and
:func:`nodes` parse a file once per test process and keep its tree and the list of its
nodes in ``ast.walk`` order, keyed by the file's path and text (a file a test rewrites
is parsed again). The trees are shared: a scan reads them, never
changes them."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path


@cache
def _parsed(path: str, text: str) -> tuple[ast.Module, tuple[ast.AST, ...]]:
    tree = ast.parse(text, path)
    return tree, tuple(ast.walk(tree))


def _key(path: Path | str) -> tuple[str, str]:
    return str(path), Path(path).read_text(encoding="utf-8")


def parse(path: Path | str) -> ast.Module:
    """``ast.parse`` of the file at ``path`` (UTF-8), parsed once while it is unchanged."""
    return _parsed(*_key(path))[0]


def nodes(path: Path | str) -> tuple[ast.AST, ...]:
    """``tuple(ast.walk(parse(path)))``, walked once while the file is unchanged."""
    return _parsed(*_key(path))[1]
