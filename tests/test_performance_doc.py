"""docs/PERFORMANCE.md answers each question with one table of today's figures: every
row names its machine, its date and the command that reproduces it (or a pointer to the
dated log, docs/BENCHMARKS.md); the history (which run, which call of which session)
lives in BENCHMARKS.md, not here. Every reference to one of its sections from the code,
the README or the docs names a section that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "PERFORMANCE.md"
MACHINES = ("H100", "H200", "2xH100", "2xH200", "CI")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
CODE = re.compile(r"`[^`\n]+`")
# a command in backticks, the design notes, a section of this page or the dated log
POINTER = re.compile(r"`[^`]+`|\*DESIGN\*|BENCHMARKS\.md|\"[^\"]+\"")
HISTORY = re.compile(
    r"\bissues?\b|\bsessions?\b|\b(?:device )?calls? \d|\brounds? \d|\bthis round\b", re.I
)
POINTER_LINE = "Where older runs are"


def _cells(line: str) -> list[str]:
    # a `|` inside a cell is written `\|`
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def tables(text: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """(the heading above it, its header cells, its rows' cells) of each table."""
    out, heading, block = [], "", []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            block.append(line)
            continue
        if block:
            out.append((heading, _cells(block[0]), [_cells(b) for b in block[2:]]))
            block = []
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
    return out


def _column(header: list[str], *names: str) -> int:
    for i, h in enumerate(header):
        if any(h.lower().startswith(n) for n in names):
            return i
    return -1


def test_every_row_of_figures_has_a_machine_a_date_and_a_command() -> None:
    found = tables(DOC.read_text(encoding="utf-8"))
    assert len(found) >= 15
    bad = []
    for heading, header, rows in found:
        if header == ["name", "what"]:  # the machines' legend
            assert {r[0] for r in rows} == set(MACHINES)
            continue
        date = _column(header, "date", "machine, date")
        machine = _column(header, "machine")
        command = _column(header, "command")
        assert min(date, machine, command) >= 0, f"{heading}: {header} lacks a column"
        for n, row in enumerate(rows):
            where = f"{heading}: {row[0]}"
            if len(row) != len(header):
                bad.append(f"{where}: {len(row)} cells, {len(header)} columns")
                continue
            if not DATE.search(row[date]):
                bad.append(f"{where}: no date")
            if not row[machine].startswith(MACHINES):
                bad.append(f"{where}: no machine")
            cmd = row[command]
            if not (POINTER.search(cmd) or (cmd == "same" and n > 0)):
                bad.append(f"{where}: no command or pointer")
    assert bad == []


def test_the_checks_catch_a_row_without_date_or_command() -> None:
    ((_, header, rows),) = tables(
        "## q\n| what | figure | machine | date | command |\n| --- | --- | --- | --- | --- |\n"
        "| a | 1 | H100 | recently | |\n"
    )
    date, command = _column(header, "date"), _column(header, "command")
    assert not DATE.search(rows[0][date])
    assert not POINTER.search(rows[0][command])


def test_no_issue_session_call_or_round_wording() -> None:
    text = DOC.read_text(encoding="utf-8")
    # the pointer to the dated log is the one paragraph that may name the history
    paragraphs = [p for p in text.split("\n\n") if not p.startswith(POINTER_LINE)]
    assert len(paragraphs) < len(text.split("\n\n")), "the pointer to BENCHMARKS.md is gone"
    found = [
        f"{m.group(0)!r} in {p[:60]!r}"
        for p in paragraphs
        for m in HISTORY.finditer(CODE.sub("", p))
    ]
    assert found == []


@pytest.mark.parametrize(
    "wording", ["issue 32", "Session 6", "device call 12", "call 4", "round 3", "the issues"]
)
def test_the_wording_check_catches(wording: str) -> None:
    assert HISTORY.search(CODE.sub("", f"measured in {wording} on the H100"))


def _slug(heading: str) -> str:
    # GitHub's anchor for a heading
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


REF = re.compile(r"PERFORMANCE\.md(?:#([\w-]+)|,?\s+(?:section\s+)?[\"']([^\"']+)[\"'])")


def test_every_section_named_from_code_and_docs_exists() -> None:
    headings = [
        line.lstrip("#").strip()
        for line in DOC.read_text(encoding="utf-8").splitlines()
        if line.startswith("#")
    ]
    plain = [h.replace("`", "") for h in headings]
    files = [REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "packer").rglob("*.py")]
    missing, seen = [], 0
    for path in files:
        # one line of prose: comment marks and line breaks out
        text = " ".join(w for w in path.read_text(encoding="utf-8").split() if w != "#")
        for m in REF.finditer(text):
            seen += 1
            anchor, name = m.groups()
            if anchor is not None:
                ok = anchor in {_slug(h) for h in headings}
            else:
                ok = any(h.startswith(name.replace("`", "")) for h in plain)
            if not ok:
                missing.append(f"{path.relative_to(REPO)}: {m.group(0)}")
    assert seen >= 20
    assert missing == []
