"""Figures live in docs/PERFORMANCE.md, not in the product's docstrings and comments
(issue 45.9): a measured rate, speed-up or machine quoted in ``packer/`` goes stale
where nobody re-measures it. The code points to a row of the section "Figures behind
the code" instead."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import packer

ROOT = Path(packer.__file__).parent
# a rate, a speed-up or slow-down, a GPU model: what a figure taken on one machine reads like
FIGURE = re.compile(
    r"\d[\d.,]*k? img/s|\bH[1-2]00\b|\b\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?x (?:faster|slower)\b"
    r"|\b\d+(?:\.\d+)?-\d+(?:\.\d+)?x\b|\b\d+(?:\.\d+)? (?:ms|µs) (?:a|per|for)\b"
)


def _prose(path: Path) -> list[tuple[int, str]]:
    """The comments and plain string literals (docstrings, help texts) of ``path``;
    f-strings (what the program prints) are left out."""
    out = []
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline)
    for tok in tokens:
        if tok.type == tokenize.COMMENT or (
            tok.type == tokenize.STRING and not tok.string.lstrip("rRbB").startswith(("f", "F"))
        ):
            out.append((tok.start[0], tok.string))
    return out


def test_no_figure_is_quoted_in_the_products_prose() -> None:
    found = [
        f"{path.relative_to(ROOT.parent)}:{line}: {m.group(0)!r}"
        for path in sorted(ROOT.rglob("*.py"))
        for line, text in _prose(path)
        for m in FIGURE.finditer(text)
    ]
    assert found == []


def test_the_rows_the_code_points_to_exist() -> None:
    doc = (ROOT.parent / "docs" / "PERFORMANCE.md").read_text(encoding="utf-8")
    section = doc.split("\n## Figures behind the code\n", 1)[1]
    rows = {line.split("|")[1].strip() for line in section.splitlines() if line.startswith("| ")}
    pointer = re.compile(r'"Figures behind the code",? rows? ("[^"]+"(?: and "[^"]+")*)')
    pointed = set()
    for path in ROOT.rglob("*.py"):
        # one line of prose: comment marks and line breaks out
        text = " ".join(w for w in path.read_text(encoding="utf-8").split() if w != "#")
        for m in pointer.finditer(text):
            pointed |= set(re.findall(r'"([^"]+)"', m.group(1)))
    assert len(pointed) >= 15
    assert pointed - rows == set()
