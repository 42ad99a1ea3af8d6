"""``python -c CODE`` under Triton's CPU interpreter (``TRITON_INTERPRET=1``), for the
tests of the CUDA kernels on a machine without a GPU (issue 45, item 12).

The variable is read as a kernel module is imported (``triton.jit`` then makes an
interpreted function), so these tests ran a fresh interpreter each, which imported torch
and triton again: about 3 CPU-seconds a test (and torchvision, which packer.augment
imports: 1.6 more). Here one fresh interpreter per test process (the *zygote*), started
with the variable set, imports torch, torchvision and triton once (no kernel module and
nothing of packer: each child imports those itself, as a fresh interpreter would) and serves the
runs; each run is a fork of it (:func:`helpers.forked.run_code`: the child's own argv,
environment, folder, fds, signals and exit code, its module globals its own), so one
run's patches (``K.TILE = ...``) never reach the next.

The zygote reads one JSON request a line on its stdin and answers one a line on its
stdout; it ends when its stdin closes (this process's exit) and is recorded with
tests/processes.py, so the session's finalizer stops it whatever happens.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
from pathlib import Path

_FORKED = Path(__file__).resolve().parent / "forked.py"

# the zygote: torch and triton imported under TRITON_INTERPRET=1, then one forked run
# per request line ({"code", "env", "cwd", "timeout"}) answered with [code, out, err] or
# ["timeout"]
_ZYGOTE = """
import importlib.util, json, subprocess, sys
import numpy, torch, torchvision, triton  # noqa: F401 (imported once, inherited by every run)
spec = importlib.util.spec_from_file_location("imgpack_test_forked", sys.argv[1])
forked = importlib.util.module_from_spec(spec)
spec.loader.exec_module(forked)
sys.argv = sys.argv[:1]
for line in sys.stdin:
    req = json.loads(line)
    try:
        r = forked.run_code(req["code"], env=req["env"], cwd=req["cwd"], timeout=req["timeout"])
        answer = [r.returncode, r.stdout, r.stderr]
    except subprocess.TimeoutExpired:
        answer = ["timeout"]
    sys.stdout.write(json.dumps(answer) + "\\n")
    sys.stdout.flush()
"""

_zygote: subprocess.Popen[str] | None = None


def _start(env: dict[str, str]) -> subprocess.Popen[str]:
    import processes

    proc = subprocess.Popen(
        [sys.executable, "-c", _ZYGOTE, str(_FORKED)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    record = processes.track(proc.pid)

    def stop() -> None:
        if proc.stdin is not None:
            proc.stdin.close()  # its loop ends
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        processes.untrack(record)

    atexit.register(stop)
    return proc


def run_interpreted(
    code: str, env: dict[str, str], cwd: Path | str | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``python -c CODE`` with ``env`` (which sets ``TRITON_INTERPRET=1``) in ``cwd``
    (default this process's), as ``subprocess.run(..., capture_output=True, text=True,
    timeout=timeout)`` would return it; run by a fork of this process's zygote."""
    global _zygote
    if env.get("TRITON_INTERPRET") != "1":
        raise ValueError("run_interpreted runs code under TRITON_INTERPRET=1: set it in env")
    if _zygote is None or _zygote.poll() is not None:
        _zygote = _start(env)
    assert _zygote.stdin is not None and _zygote.stdout is not None
    req = {"code": code, "env": env, "cwd": str(cwd or os.getcwd()), "timeout": timeout}
    _zygote.stdin.write(json.dumps(req) + "\n")
    _zygote.stdin.flush()
    line = _zygote.stdout.readline()
    args = [sys.executable, "-c", code]
    if not line:
        _zygote = None
        raise RuntimeError("the interpreter zygote ended before it answered")
    answer = json.loads(line)
    if answer == ["timeout"]:
        raise subprocess.TimeoutExpired(args, timeout)
    return subprocess.CompletedProcess(args, *answer)
