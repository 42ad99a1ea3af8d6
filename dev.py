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
import shutil
import signal
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


# after Ctrl-C, how long the command may take to stop (pytest: the test running, then the
# session's finalizers, which stop its servers) before it is sent SIGTERM, then SIGKILL
STOP_GRACE_S = 30.0


def _run(*args: object, env: dict[str, str] | None = None) -> None:
    """Run a command; Ctrl-C (or SIGTERM) stops it and exits 130.

    The command leads a session of its own, so a Ctrl-C at the terminal reaches this
    process only, which passes one SIGINT on to the command's whole process group and
    waits for it to end (pytest then stops after the test running, and its finalizers
    stop the servers it started); SIGTERM and SIGKILL follow after STOP_GRACE_S. (Before,
    subprocess.call answered Ctrl-C by SIGKILLing the command at once: no finalizer
    ran, and a test session's Ray cluster was left running.)"""
    cmd = [str(a) for a in args]
    print("+", " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True, env=env)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        rc = proc.wait()
    except KeyboardInterrupt:
        _stop(proc)
        sys.exit(130)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if rc != 0:
        sys.exit(rc)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT to the command's process group, then SIGTERM and SIGKILL if it lingers
    (a second Ctrl-C moves on to the next)."""
    steps = ((signal.SIGINT, STOP_GRACE_S), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0))
    for sig, wait in steps:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            print(
                f"\n{cmd_name(proc)}: still running after {sig.name}", file=sys.stderr, flush=True
            )
        except KeyboardInterrupt:
            continue


def cmd_name(proc: subprocess.Popen[bytes]) -> str:
    return " ".join(map(str, proc.args[:3])) if isinstance(proc.args, list) else str(proc.args)


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


# the suite's options: one worker per core (pytest-xdist; the tests that share the
# session's Ray cluster go to one worker together: --dist loadgroup), the 20 slowest
# tests printed at the end
PYTEST = ["-n", "auto", "--dist", "loadgroup", "--durations=20"]
# --quick: the tests marked slow (subprocess installs, the README's commands) and ray (the
# two-node cluster) left out
QUICK = ["-m", "not slow and not ray"]


def pytest_args(extra: list[str]) -> list[str]:
    """pytest's arguments for ``python3 dev.py test [--quick] [pytest args]``."""
    quick = "--quick" in extra
    rest = [a for a in extra if a != "--quick"]
    return [*PYTEST, *(QUICK if quick else []), *rest]


# the Azure tests' server: Azurite (an npm package), pinned, installed into an ignored
# folder of the repository; tests/helpers/emulators.py starts it
AZURITE = ROOT / ".test-servers" / "azurite"
AZURITE_VERSION = "3.35.0"  # as tests/helpers/emulators.AZURITE_VERSION


def ensure_azurite() -> None:
    """Install azurite into .test-servers/azurite with npm, once per version. Without node
    and npm, say so: the Azure tests then skip, naming why."""
    exe = AZURITE / "node_modules" / ".bin" / "azurite-blob"
    stamp = AZURITE / "node_modules" / "azurite" / "package.json"
    if exe.is_file() and stamp.is_file() and f'"{AZURITE_VERSION}"' in stamp.read_text():
        return
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        print("node and npm are not on PATH: the Azure tests (Azurite) will skip", flush=True)
        return
    print(f"Installing azurite {AZURITE_VERSION} into {AZURITE} (npm) ...", flush=True)
    AZURITE.mkdir(parents=True, exist_ok=True)
    _run(npm, "install", "--prefix", AZURITE, "--no-audit", "--no-fund", "--save-exact",
         f"azurite@{AZURITE_VERSION}")  # fmt: skip


# The suite's interpreters (one per xdist worker, and the children tests start) each
# compiled the package from source and each worker rewrote the test modules' asserts
# again where PYTHONDONTWRITEBYTECODE is set (about 8 CPU-seconds a worker, a second a
# child importing the package): the suite lets Python keep its bytecode in the
# repository's __pycache__ folders (ignored by git), compiled once before it starts.
BYTECODE_DIRS = ("packer", "tests", "benchmarks", "examples")


def suite_env() -> dict[str, str]:
    """This environment for the suite's pytest: bytecode cached (PYTHONDONTWRITEBYTECODE
    left out)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def test(extra: list[str]) -> None:
    """Lint and format check, then the whole test suite (``--quick``: less slow and ray)."""
    py = ensure_venv()
    ensure_azurite()
    _run(py, "-m", "ruff", "check", ".")
    _run(py, "-m", "ruff", "format", "--check", ".")
    _run(py, "-m", "compileall", "-q", *BYTECODE_DIRS)
    _run(py, "-m", "pytest", *pytest_args(extra), env=suite_env())


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in ("demo", "test"):
        print(__doc__)
        print("usage: python3 dev.py demo | python3 dev.py test [--quick] [pytest args]")
        sys.exit(2)
    if sys.argv[1] == "demo":
        demo()
    else:
        test(sys.argv[2:])


if __name__ == "__main__":
    main()
