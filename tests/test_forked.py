"""tests/helpers/forked.py: a command run in a fork of the test process answers as
``subprocess.run([sys.executable, ...], capture_output=True, text=True)`` does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import subprocess_env
from helpers.forked import run_cli, run_code, run_script, start_script

CASES = {
    "exit 0": "print('out'); import sys; print('err', file=sys.stderr)",
    "exit 3": "import sys; sys.exit(3)",
    "exit text": "import sys; sys.exit('bye')",
    "raises": "raise ValueError('boom')",
    "C-level writes": "import os; os.write(1, b'fd1'); os.write(2, b'fd2')",
    "argv": "import sys; print(sys.argv)",
    "env and cwd": "import os; print(os.environ['FORKED_X'], os.getcwd())",
    "logging warning": "import logging; logging.getLogger('x').warning('careful')",
    "user warning": "import warnings; warnings.warn('w1')",
    "stdin empty": "import sys; print(repr(sys.stdin.read()))",
    "atexit": "import atexit; atexit.register(print, 'bye')",
    "sigint": "import os, signal; os.kill(os.getpid(), signal.SIGINT)",
}


@pytest.mark.parametrize("code", CASES.values(), ids=CASES.keys())
def test_a_forked_command_answers_as_a_fresh_interpreter(tmp_path: Path, code: str) -> None:
    env = subprocess_env(FORKED_X="seen")
    want = subprocess.run(
        [sys.executable, "-c", code, "a b", "c"], env=env, cwd=tmp_path,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    got = run_code(code, ["a b", "c"], env=env, cwd=tmp_path, timeout=60)
    assert (got.returncode, got.stdout) == (want.returncode, want.stdout)
    # a traceback's file names differ (<string> lines alike): compare its last line
    assert got.stderr.strip().splitlines()[-1:] == want.stderr.strip().splitlines()[-1:]
    assert got.args[:2] == [sys.executable, "-c"]


def test_the_child_never_returns_into_the_test(tmp_path: Path) -> None:
    marker = tmp_path / "m"
    r = run_code(f"open({str(marker)!r}, 'w').write(str(__import__('os').getpid()))")
    assert r.returncode == 0, r.stderr
    assert int(marker.read_text()) != os.getpid()


def test_input_and_timeout(tmp_path: Path) -> None:
    r = run_code("import sys; print(sys.stdin.read().upper())", input="abc")
    assert r.stdout == "ABC\n"
    with pytest.raises(subprocess.TimeoutExpired, match=r"timed out after 0\.2 seconds"):
        run_code("import time; time.sleep(30)", timeout=0.2)


def test_a_script_and_the_cli(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text("import sys\nprint(sys.argv[1:], sys.path[0])\nsys.exit(4)\n")
    r = run_script(script, ["x"])
    assert (r.returncode, r.stdout) == (4, f"['x'] {tmp_path}\n")
    r = run_cli(["info", tmp_path / "missing"])
    assert r.returncode == 2 and r.stderr.startswith("Error:"), r.stderr
    assert "Traceback" not in r.stderr


def test_started_children_run_at_once_and_can_be_killed(tmp_path: Path) -> None:
    """start_script: two children at once (each waits for the other's file), as
    subprocess.Popen; kill() ends one still running, reaped (-9)."""
    script = tmp_path / "s.py"
    script.write_text(
        "import os, sys, time\n"
        "open(sys.argv[1], 'w').close()\n"
        "while not os.path.exists(sys.argv[2]):\n"
        "    time.sleep(0.01)\n"
        "print(os.environ['WHO'])\n"
    )
    a, b = tmp_path / "a", tmp_path / "b"
    pa = start_script(script, [a, b], env=subprocess_env(WHO="A"))
    pb = start_script(script, [b, a], env=subprocess_env(WHO="B"))
    ra, rb = pa.wait(timeout=60), pb.wait(timeout=60)
    assert (ra.returncode, ra.stdout, rb.returncode, rb.stdout) == (0, "A\n", 0, "B\n")
    stuck = start_script(script, [tmp_path / "c", tmp_path / "never"])
    stuck.kill()
    assert stuck.wait().returncode == -9


def test_a_handler_made_here_before_writes_to_the_childs_stderr(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A module imported by this process before the fork made its logging handler on
    the sys.stderr of then (pytest's capture, as lightning's): the child's records go to
    the child's stderr, as in a fresh interpreter, not into this test's output."""
    import logging

    logger = logging.getLogger("forked-test-handler")
    handler = logging.StreamHandler()  # on sys.stderr as it is now
    logger.addHandler(handler)
    logger.propagate = False
    try:
        r = run_code("import logging; logging.getLogger('forked-test-handler').error('said')")
    finally:
        logger.removeHandler(handler)
    assert r.returncode == 0 and r.stderr == "said\n", r
    assert "said" not in capfd.readouterr().err


_AFTER_STORAGE = """
import sys, types
sys.path[:0] = sys.argv[1:]
from helpers.forked import run_code
from packer.storage import client
sys.modules["forked_marker"] = types.ModuleType("forked_marker")
code = "import sys; print('forked_marker' in sys.modules)"
print(run_code(code, storage=True).stdout.strip())
client._check_not_forked("test")  # what the client does at its first request
print(run_code(code, storage=True).stdout.strip())
print(run_code(code).stdout.strip())  # a command that uses no object storage: forked
"""


def test_where_object_storage_was_used_the_command_runs_in_a_fresh_interpreter() -> None:
    """A fork of a process that used object storage could not use its client: a
    command that uses it then runs in a fresh interpreter (this process's modules not
    there); before that, and a command that does not use it, in a fork (they are)."""
    tests = str(Path(__file__).resolve().parent)
    r = subprocess.run(
        [sys.executable, "-c", _AFTER_STORAGE, tests], env=subprocess_env(),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "False", "True"], r.stdout


_PROBE = """
import os, sys, triton
import packer
@triton.jit
def kernel(x):
    pass
packer._probe_runs = getattr(packer, "_probe_runs", 0) + 1  # a module global, set here
print(type(kernel).__name__, os.environ["TRITON_INTERPRET"], os.getcwd(), sys.argv)
print(packer._probe_runs, os.getppid())
sys.stderr.write("err")
sys.exit(3)
"""


@pytest.mark.xdist_group("triton-interpreter")  # the zygote the kernel tests use
def test_interpreted_runs_are_forks_of_one_interpreter_each_on_its_own(tmp_path: Path) -> None:
    """tests/helpers/interpreted.py: ``python -c CODE`` under TRITON_INTERPRET=1 answers
    as subprocess.run does (exit code, stdout, stderr, folder, argv), the kernels are
    the interpreter's, and each run is a child of one zygote that sees none of another
    run's changes."""
    pytest.importorskip("triton")
    from helpers.interpreted import run_interpreted

    env = subprocess_env(TRITON_INTERPRET="1")
    a, b = (run_interpreted(_PROBE, env, cwd=tmp_path) for _ in range(2))
    for r in (a, b):
        assert (r.returncode, r.stderr) == (3, "err"), r.stderr
        first, second = r.stdout.splitlines()
        assert first == f"InterpretedFunction 1 {tmp_path} ['-c']"
        assert second.split()[0] == "1"  # not 2: the first run's global stayed in it
    parents = {r.stdout.split()[-1] for r in (a, b)}
    assert len(parents) == 1 and parents != {str(os.getpid())}  # one zygote, not this
    with pytest.raises(subprocess.TimeoutExpired):
        run_interpreted("import time; time.sleep(60)", env, timeout=0.5)
    assert run_interpreted("print('after')", env).stdout == "after\n"
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        run_interpreted("pass", subprocess_env())


_ZYGOTE = """
import os, sys, types
sys.path[:0] = sys.argv[1:]
sys.modules["before"] = types.ModuleType("before")
import helpers.forked as F
F.start_zygote()
sys.modules["after"] = types.ModuleType("after")
from packer.storage import client
client._check_not_forked("test")  # this process has used its client now
code = ("import os, sys; from packer.storage import client; client._check_not_forked('x'); "
        "print('before' in sys.modules, 'after' in sys.modules, os.getppid(), "
        "os.environ['Z'], os.getcwd(), sys.stdin.read()); sys.exit(5)")
r = F.run_code(code, storage=True, env={**os.environ, "Z": "z"}, cwd="/", input="in")
print(r.returncode, r.stdout.strip(), F._ZYGOTE.pid, os.getpid())
try:
    F.run_code("import time; time.sleep(30)", storage=True, timeout=0.3)
except Exception as e:
    print(type(e).__name__)
print(F.run_code("import sys; print(sys.argv[1:])", ["a"], storage=True).stdout.strip())
"""


def test_where_object_storage_was_used_the_command_is_forked_from_the_zygote() -> None:
    """With a zygote forked at the session's start (tests/conftest.py), a command that
    uses object storage, where this process has used it, runs as a fork of the zygote:
    the modules of then (not those this process imported since), a client of its own,
    its own environment, folder, stdin, exit code, timeout."""
    tests = str(Path(__file__).resolve().parent)
    r = subprocess.run(
        [sys.executable, "-c", _ZYGOTE, tests], env=subprocess_env(),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    first, timeout, argv = r.stdout.splitlines()
    code, before, after, parent, z, cwd, stdin, zygote, owner = first.split()
    assert (code, before, after, z, cwd, stdin) == ("5", "True", "False", "z", "/", "in")
    assert parent == zygote != owner  # the zygote's child, not this process's
    assert (timeout, argv) == ("TimeoutExpired", "['a']")


_EXITS = """
import atexit, sys, threading, time
class Last:
    def __del__(self):
        sys.stdout.write("finalized\\n")  # the interpreter's finalization clears this module
keep = Last()
atexit.register(lambda: sys.stdout.write("atexit\\n"))
threading.Thread(target=lambda: (time.sleep(0.2), sys.stdout.write("joined\\n"))).start()
print("packer" in sys.modules, "torch" in sys.modules, sys.argv)
if sys.argv[1] == "fail":
    raise ValueError("uncaught")
"""


@pytest.mark.xdist_group("fresh-interpreter")  # the zygote the import and exit tests use
def test_fresh_runs_are_forks_that_end_as_the_interpreter_ends(tmp_path: Path) -> None:
    """tests/helpers/interpreted.run_fresh: a fork of an interpreter that has imported
    torch and not packer; with ``exit``, the child ends as ``python -c`` ends (threads
    joined, atexit, the finalization that clears the modules: a module global's
    __del__ runs), its exit code and traceback as Python gives them; without, as
    helpers.forked ends (os._exit after atexit: no finalization)."""
    from helpers.interpreted import run_fresh

    env = subprocess_env()
    r = run_fresh(_EXITS, ["fall-off"], env=env, cwd=tmp_path, exit=True)
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    assert r.stdout.splitlines() == [
        "False True ['-c', 'fall-off']", "joined", "atexit", "finalized"
    ]  # fmt: skip
    r = run_fresh(_EXITS, ["fail"], env=env, exit=True)  # (a SystemExit: the exit tests')
    assert r.returncode == 1 and "ValueError: uncaught" in r.stderr, r.stderr
    assert r.stdout.splitlines()[-1] == "finalized", r.stdout
    r = run_fresh(_EXITS, ["fall-off"], env=env)
    assert r.returncode == 0 and r.stdout.splitlines()[1:] == ["joined", "atexit"], r.stdout
    # the zygote's loop catches its own runs' timeouts: never the child's own exception
    timeout = "import subprocess\nraise subprocess.TimeoutExpired(['x'], 1)"
    r = run_fresh(timeout, env=env, exit=True)
    assert r.returncode == 1 and "TimeoutExpired" in r.stderr, (r.returncode, r.stdout)


def test_a_forked_command_starts_its_own_fork_server(tmp_path: Path) -> None:
    """This process has a multiprocessing fork server running (a build's workers start
    from one where threads run): a forked command, as a fresh interpreter, starts its
    own (it inherited the server's pid, not its child: os.waitpid refused it)."""
    import multiprocessing as mp

    ctx = mp.get_context("forkserver")
    here = ctx.Process(target=int)
    here.start()
    here.join()
    assert here.exitcode == 0
    code = (
        "import multiprocessing as mp\n"
        "p = mp.get_context('forkserver').Process(target=int)\n"
        "p.start(); p.join(); print('exit', p.exitcode)\n"
    )
    r = run_code(code, cwd=tmp_path)
    assert (r.returncode, r.stdout.strip()) == (0, "exit 0"), r.stderr[-2000:]


def test_a_forked_command_computes_after_this_process_ran_openmp_threads(
    tmp_path: Path,
) -> None:
    """This process ran a parallel region on two OpenMP threads (a plain, non-xdist
    pytest run does, on every core): GNU OpenMP's pool is not in a fork, and the
    child's first parallel region waited on it forever. The child computes on one."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.zeros(4_000_000).fill_(1.0).sum()
        code = "import torch; print(int(torch.zeros(4_000_000).fill_(3.0).sum()))"
        r = run_code(code, cwd=tmp_path, timeout=60)
    finally:
        torch.set_num_threads(threads)
    assert (r.returncode, r.stdout.strip()) == (0, "12000000"), r.stderr[-2000:]
