"""Nothing outside the format's own files branches on a storage kind's name (issue 45.3):
a kind is an object whose members answer (``kind.decoded``, ``kind.cut(...)``, ...).

The scan finds every comparison of the string constants ``"jpeg"``/``"raw"`` with
anything (``==``, ``!=``, ``in``, ``not in``, ``is``, inside a tuple, list or set, and
``case "jpeg":``) in ``packer/``. At most :data:`ALLOWED` such sites may remain outside
the format's files, each with a ``# kind name:`` comment on its line or the line
above saying why."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import packer

NAMES = {"jpeg", "raw"}
FORMAT_FILES = {"pack/kind.py", "pack/kinds.py", "pack/raw.py", "pack/jpeg.py"}
ALLOWED = 3
MARK = "# kind name:"


def _names_in(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_in(e) for e in node.elts)
    return False


def name_comparisons(source: str) -> list[tuple[int, bool]]:
    """``(line, commented)`` of each comparison of a kind's name in ``source``."""
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            hit = any(_names_in(n) for n in (node.left, *node.comparators))
        elif isinstance(node, ast.MatchValue):
            hit = _names_in(node.value)
        else:
            continue
        if hit:
            here = lines[node.lineno - 1]
            above = lines[node.lineno - 2] if node.lineno > 1 else ""
            found.append((node.lineno, MARK in here or above.strip().startswith(MARK)))
    return sorted(found)


@pytest.mark.parametrize(
    "code",
    [
        'if m.storage == "jpeg": pass',
        'ok = "raw" != pack.storage',
        'ok = config.store in ("raw", "jpeg")',
        'ok = s not in ["jpeg"]',
        'ok = getattr(p, "storage", "raw") == "raw"',
        'ok = kind.name is "raw"',
        'ok = 1 < x == "jpeg"',
        'match s:\n    case "jpeg":\n        pass',
    ],
)
def test_the_scan_finds_each_spelling_of_a_name_comparison(code: str) -> None:
    assert [c for _, c in name_comparisons(code)] == [False]


def test_the_scan_leaves_other_uses_of_the_names_alone() -> None:
    code = (
        'store = "raw"\n'
        'x = getattr(p, "storage", "raw")\n'
        'Image.frombuffer("RGB", size, part, "raw", "RGB")\n'
        'ok = kind.decoded and s == "png"\n'
        "ok = kind is KINDS[name]\n"
    )
    assert name_comparisons(code) == []


def test_a_comment_marks_an_allowed_site() -> None:
    code = (
        'ok = a == "raw"  # kind name: why\n# kind name: why\nok = b == "jpeg"\nok = c == "raw"\n'
    )
    assert name_comparisons(code) == [(1, True), (3, True), (4, False)]


def test_outside_the_format_nothing_compares_a_kinds_name() -> None:
    root = Path(packer.__file__).parent
    sites, bare = [], []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in FORMAT_FILES:
            continue
        for line, commented in name_comparisons(path.read_text(encoding="utf-8")):
            sites.append(f"{rel}:{line}")
            if not commented:
                bare.append(f"{rel}:{line}")
    assert bare == [], f"branch on a kind's members, not its name (or say why: {MARK})"
    assert len(sites) <= ALLOWED, sites
