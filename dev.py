#!/usr/bin/env python3
"""The two set-up commands: `python3 dev.py demo` and `python3 dev.py test`.

Each makes `.venv` in the repository (if it is missing or out of date) and
installs imgpack into it with the pinned versions in requirements/pins.txt,
then runs the demo on sample_data/ or the whole test suite. Standard library
only, so it runs on a machine that has nothing but Python 3.10+.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
STAMP = VENV / ".imgpack-installed"
DEMO = ROOT / "build" / "demo"


def _python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _fingerprint() -> str:
    h = hashlib.sha256()
    for name in ("pyproject.toml", "requirements/pins.txt"):
        h.update((ROOT / name).read_bytes())
    return h.hexdigest()


def _run(*args: object) -> None:
    cmd = [str(a) for a in args]
    print("+", " ".join(cmd), flush=True)
    rc = subprocess.call(cmd, cwd=ROOT)
    if rc != 0:
        sys.exit(rc)


def ensure_venv() -> Path:
    """Create .venv and install imgpack with its test extras, once per change of pins."""
    if not _python().exists():
        print(f"Creating {VENV} ...", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    want = _fingerprint()
    if not STAMP.exists() or STAMP.read_text() != want:
        print(
            "Installing imgpack and its dependencies into .venv (first run: a few minutes) ...",
            flush=True,
        )
        _run(
            _python(),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "-c",
            "requirements/pins.txt",
            "-e",
            ".[test]",
        )
        STAMP.write_text(want)
    return _python()


def demo() -> None:
    """compress -> build -> info -> verify on sample_data/, on CUDA when there is one."""
    py = ensure_venv()
    imgpack = [py, "-m", "packer"]
    _run(*imgpack, "compress", "sample_data", DEMO / "compressed", "--quality", "3", "--overwrite")
    _run(*imgpack, "build", DEMO / "compressed", DEMO / "pack", "--size", "224", "--overwrite")
    _run(*imgpack, "info", DEMO / "pack")
    _run(*imgpack, "verify", DEMO / "pack", "--device", "auto", "--batch-size", "8")
    _run(py, "-m", "packer.examples.demo_stream", DEMO / "pack")


def test(extra: list[str]) -> None:
    """Lint and format check, then the whole test suite."""
    py = ensure_venv()
    _run(py, "-m", "ruff", "check", ".")
    _run(py, "-m", "ruff", "format", "--check", ".")
    _run(py, "-m", "pytest", *extra)


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in ("demo", "test"):
        print(__doc__)
        print("usage: python3 dev.py demo | python3 dev.py test [pytest args]")
        sys.exit(2)
    if sys.argv[1] == "demo":
        demo()
    else:
        test(sys.argv[2:])


if __name__ == "__main__":
    main()
