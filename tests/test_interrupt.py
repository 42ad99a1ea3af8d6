"""Ctrl-C stops the test suite within seconds, and no server or cluster a test session
starts outlives it, however it ends (issue 43): SIGINT to pytest, SIGINT to dev.py's
`python3 dev.py test` runner, SIGKILL (the next session stops what was left)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import processes
from conftest import _GROUPS_ENV, REPO, subprocess_env

HELPER = REPO / "tests" / "interrupt_session.py"
PYTEST = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q"]


def _session_env(**extra: str) -> dict[str, str]:
    """The environment of a session started from a shell: not the variables that make
    this process a pytest-xdist worker (the helper session took them for its own: it
    imported torch and forked a zygote, as a worker does, 2-4 s a session)."""
    env = subprocess_env(**extra)
    for k in [k for k in env if k.startswith("PYTEST_XDIST_") or k == _GROUPS_ENV]:
        del env[k]
    return env


def _start(cmd: list[str], pid_file: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=_session_env(IMGPACK_TEST_SERVER_PID=str(pid_file)),
    )  # fmt: skip


def _server_pid(proc: subprocess.Popen[str], pid_file: Path) -> int:
    """The helper session's server PID, once its first test waits for the signal."""
    deadline = time.monotonic() + 120
    while not pid_file.exists() or not pid_file.read_text():
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "the helper session never started"
        time.sleep(0.05)
    return int(pid_file.read_text())


def _alive(pid: int) -> bool:
    return processes.start_time(pid) is not None


@pytest.mark.slow
@pytest.mark.parametrize("runner", ["pytest", "dev.py"])
def test_ctrl_c_stops_the_session_and_its_server(tmp_path: Path, runner: str) -> None:
    pid_file = tmp_path / "server.pid"
    if runner == "pytest":
        cmd = [*PYTEST, str(HELPER)]
    else:  # dev.py's runner, as `python3 dev.py test` runs pytest
        code = f"import dev; dev._run(*{[*PYTEST, str(HELPER)]!r})"
        cmd = [sys.executable, "-c", code]
    proc = _start(cmd, pid_file)
    try:
        server = _server_pid(proc, pid_file)
        assert _alive(server)
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        out, _ = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out
    assert took < 10, f"{took:.1f} s to stop:\n{out}"
    assert "test_more_work" not in out or "10 passed" not in out
    assert "interrupted" in out, out
    assert not _alive(server), out


@pytest.mark.slow
def test_a_killed_session_leaves_nothing_after_the_next(tmp_path: Path) -> None:
    pid_file = tmp_path / "server.pid"
    proc = _start([*PYTEST, str(HELPER)], pid_file)
    try:
        server = _server_pid(proc, pid_file)
        proc.kill()  # no finalizer runs
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _alive(server)  # left running, recorded
    # the next session (here: one that collects nothing) stops it as it starts
    r = subprocess.run(
        [*PYTEST, str(HELPER), "-k", "no_such_test"], cwd=REPO, env=_session_env(),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 5, r.stdout + r.stderr  # no tests ran
    deadline = time.monotonic() + 10
    while _alive(server) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(server)
