"""A small test session for tests/test_interrupt.py (run only when named): a session
fixture starts a server (a child process, recorded as the suite's servers are), one
test swallows the KeyboardInterrupt of a Ctrl-C as a command run in-process does
(CliRunner returns exit 130), and more tests follow."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import processes


@pytest.fixture(scope="session")
def server():
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    record = processes.track(proc.pid)
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait()
        processes.untrack(record)


def test_waits_for_ctrl_c_and_swallows_it(server) -> None:
    Path(os.environ["IMGPACK_TEST_SERVER_PID"]).write_text(str(server.pid))
    try:
        threading.Event().wait(60)  # until the parent's signal
    except KeyboardInterrupt:
        pass  # as packer.cli.output.handle_errors under CliRunner: the test goes on


@pytest.mark.parametrize("i", range(10))
def test_more_work(server, i: int) -> None:
    threading.Event().wait(1)
