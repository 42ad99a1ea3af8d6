"""``python -c CODE`` as a fork of a fresh interpreter that has imported torch and not
packer (issue 45, item 12): under Triton's CPU interpreter (``TRITON_INTERPRET=1``), for
the tests of the CUDA kernels on a machine without a GPU (:func:`run_interpreted`), and
for the tests of what ``import packer`` does in a fresh interpreter (:func:`run_fresh`).

The variable is read as a kernel module is imported (``triton.jit`` then makes an
interpreted function), so these tests ran a fresh interpreter each, which imported torch
and triton again: about 3 CPU-seconds a test (and torchvision, which packer.augment
imports: 1.6 more). Here one fresh interpreter per test process (the *zygote*), started
with the variable set, imports torch, torchvision and triton once (no kernel module and
nothing of packer: each child imports those itself, as a fresh interpreter would) and
serves the runs; each run is a fork of it (:func:`helpers.forked.run_code`: the child's
own argv, environment, folder, fds, signals and exit code, its module globals its own),
so one run's patches (``K.TILE = ...``) never reach the next.

The import tests (tensordict's loaders guarded by ``import packer`` alone, the
environment ``import packer`` leaves, the public names resolving) each started an
interpreter that imported torch and torch._dynamo (tensordict imports it): 4-5 CPU-s a
run, 2 s of it dynamo. Their zygote imports ``torch`` and ``torch._dynamo`` only (and
what dynamo imports, triton among them; not torchvision: a run that needs it imports
it, as a fresh interpreter would), nothing of packer or tensordict (it checks), started
with the run's environment (one zygote for each value of the variables that shape those
imports; the child runs with its request's whole environment): what those tests look
at, packer's and tensordict's imports and their side effects, happens in the child as
in a fresh interpreter. With ``exit``
(the tests of a process's exit), the child ends as ``python -c`` ends, not by
``os._exit``: its non-daemon threads joined, the atexit functions the zygote's imports
registered (kept, in their order) and its own, the interpreter's finalization and the
C runtime's exit.

A zygote reads one JSON request a line on its stdin and answers one a line on its
stdout; it ends when its stdin closes (this process's exit) and is recorded with
tests/processes.py, so the session's finalizer stops it whatever happens.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

_FORKED = Path(__file__).resolve().parent / "forked.py"

# what each kind of zygote imports before it serves runs
INTERPRETER_IMPORTS = ("numpy", "torch", "torchvision", "triton")
FRESH_IMPORTS = ("torch", "torch._dynamo")

# a zygote: its imports (argv[2]), then one forked run per request line ({"code", "args",
# "env", "cwd", "timeout", "exit"}) answered with [code, out, err] or ["timeout"]; with
# "exit", the child returns from run_exiting into this loop's SystemExit: the
# interpreter's own exit, not os._exit
_ZYGOTE = """
import atexit, importlib, importlib.util, json, os, subprocess, sys, tempfile
registered = []  # what the imports register with atexit, in order
register = atexit.register
def record(func, *args, **kwargs):
    registered.append((func, args, kwargs))
    return register(func, *args, **kwargs)
atexit.register = record
for name in sys.argv[2].split(","):
    importlib.import_module(name)  # imported once, inherited by every run
atexit.register = register
ours = sorted(m for m in sys.modules if m.split(".")[0] in ("packer", "tensordict"))
assert not ours, f"the zygote imported {ours}"
spec = importlib.util.spec_from_file_location("imgpack_test_forked", sys.argv[1])
forked = importlib.util.module_from_spec(spec)
spec.loader.exec_module(forked)
sys.argv = sys.argv[:1]


def run_exiting(req):
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:  # the child: runs the code, then ends as python -c CODE ends
        forked._fresh(0, out.fileno(), err.fileno(), True, ["-c", *req["args"]], "",
                      req["env"], req["cwd"])
        atexit._clear()  # what the imports registered, as a fresh interpreter has it
        for func, args, kwargs in registered:
            atexit.register(func, *args, **kwargs)
        forked._main_of(("code", req["code"]))()
        sys.exit(0)  # its exception or SystemExit, or this, ends the loop below
    code = forked._wait(pid, req["timeout"], [sys.executable, "-c", req["code"]])
    outs = []
    for f in (out, err):
        f.seek(0)
        outs.append(f.read().decode(errors="replace"))
        f.close()
    return subprocess.CompletedProcess([], code, *outs)


ZYGOTE = os.getpid()
for line in sys.stdin:
    req = json.loads(line)
    try:
        if req["exit"]:
            r = run_exiting(req)
        else:
            r = forked.run_code(req["code"], req["args"], env=req["env"], cwd=req["cwd"],
                                timeout=req["timeout"])
        answer = [r.returncode, r.stdout, r.stderr]
    except subprocess.TimeoutExpired:
        if os.getpid() != ZYGOTE:  # a run_exiting child's own: uncaught, as in python -c
            raise
        answer = ["timeout"]
    sys.stdout.write(json.dumps(answer) + "\\n")
    sys.stdout.flush()
"""

# the zygotes of this process: one under the interpreter; for run_fresh, one for each
# value of the variables that shape an interpreter's start and its imports of torch,
# dynamo and triton (a child runs with its request's whole environment: what it imports
# reads the rest; the tests' process gains variables as it runs, NCCL_NVLS_ENABLE,
# PYNVIMGCODEC_VERBOSITY, ..., which made a zygote each)
_zygotes: dict[object, subprocess.Popen[str]] = {}
_SHAPING = ("PYTHON", "TORCH", "PYTORCH", "TRITON", "OMP_", "MKL_", "LD_", "MALLOC_", "GLIBC_")


def _start(env: dict[str, str], imports: Sequence[str]) -> subprocess.Popen[str]:
    import processes

    proc = subprocess.Popen(
        [sys.executable, "-c", _ZYGOTE, str(_FORKED), ",".join(imports)],
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


def _run(
    key: object,
    imports: Sequence[str],
    code: str,
    args: Sequence[object],
    env: dict[str, str],
    cwd: Path | str | None,
    timeout: float,
    exit: bool = False,
) -> subprocess.CompletedProcess[str]:
    zygote = _zygotes.get(key)
    if zygote is None or zygote.poll() is not None:
        zygote = _zygotes[key] = _start(env, imports)
    assert zygote.stdin is not None and zygote.stdout is not None
    req = {"code": code, "args": [str(a) for a in args], "env": env,
           "cwd": str(cwd or os.getcwd()), "timeout": timeout, "exit": exit}  # fmt: skip
    zygote.stdin.write(json.dumps(req) + "\n")
    zygote.stdin.flush()
    line = zygote.stdout.readline()
    argv = [sys.executable, "-c", code, *req["args"]]
    if not line:
        del _zygotes[key]
        raise RuntimeError("the interpreter zygote ended before it answered")
    answer = json.loads(line)
    if answer == ["timeout"]:
        raise subprocess.TimeoutExpired(argv, timeout)
    return subprocess.CompletedProcess(argv, *answer)


def run_interpreted(
    code: str, env: dict[str, str], cwd: Path | str | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``python -c CODE`` with ``env`` (which sets ``TRITON_INTERPRET=1``) in ``cwd``
    (default this process's), as ``subprocess.run(..., capture_output=True, text=True,
    timeout=timeout)`` would return it; run by a fork of this process's zygote."""
    if env.get("TRITON_INTERPRET") != "1":
        raise ValueError("run_interpreted runs code under TRITON_INTERPRET=1: set it in env")
    return _run("interpreter", INTERPRETER_IMPORTS, code, (), env, cwd, timeout)


def run_fresh(
    code: str,
    args: Sequence[object] = (),
    *,
    env: dict[str, str],
    cwd: Path | str | None = None,
    timeout: float = 120,
    exit: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``python -c CODE ARGS`` with ``env`` in ``cwd``, as ``subprocess.run(...,
    capture_output=True, text=True, timeout=timeout)`` would return it; run by a fork
    of a zygote that imported torch and torch._dynamo and nothing of packer or
    tensordict, started with ``env`` (or one that differs from it only in variables
    that do not shape those imports). ``exit``: the child ends as the interpreter ends
    (its non-daemon threads joined, its atexit functions, the interpreter's finalization
    and the C runtime's exit), not by ``os._exit`` after its atexit functions, for the
    tests of what a process's exit does."""
    key = ("fresh", tuple(sorted((k, v) for k, v in env.items() if k.startswith(_SHAPING))))
    return _run(key, FRESH_IMPORTS, code, args, env, cwd, timeout, exit)
