"""An interrupted ``python -m packer bench`` exits 130 with its temporary folder removed,
wherever the interrupt lands and whatever signal follows it (packer/cli/output.py,
packer/cli/__init__.py, packer/_interrupts.py). Each case places its signals itself,
from inside the child (a module run with ``python -m``, as the suite runs the CLI): no
timing decides where they land."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import subprocess_env

CHILD = textwrap.dedent(
    """
    import os, shutil, signal, sys, tempfile, threading
    import packer.cli, packer.cli.output
    import packer.measure.bench.run as run

    def kill(sig):
        os.kill(os.getpid(), sig)
        for _ in range(10_000):  # bytecodes: the handler runs here
            pass

    def interrupted(cfg, work, result):  # the first interrupt, in the bench's folder
        kill(signal.SIGTERM)
        raise AssertionError("not interrupted")

    CASE = sys.argv[1]
    run.prepare_data = interrupted
    if CASE == "exec":  # it lands in a string exec (dataclasses, namedtuple at import)
        def interrupted(cfg, work, result):
            exec("import os, signal\\nos.kill(os.getpid(), signal.SIGTERM)\\n"
                 "for _ in range(10_000): pass")
            raise AssertionError("not interrupted")
        run.prepare_data = interrupted
    elif CASE == "mkdtemp":  # it lands with the folder made, its removal not set up
        real_mkdtemp = tempfile.mkdtemp
        def mkdtemp(*args, **kwargs):
            path = real_mkdtemp(*args, **kwargs)
            kill(signal.SIGTERM)
            return path
        tempfile.mkdtemp = mkdtemp
    elif CASE in ("term-after", "int-after"):  # a second one as "Interrupted" is said
        second = signal.SIGTERM if CASE == "term-after" else signal.SIGINT
        real_echo = packer.cli.output.click.echo
        def echo(message=None, *args, **kwargs):
            if "Interrupted" in str(message):
                kill(second)
            real_echo(message, *args, **kwargs)
        packer.cli.output.click.echo = echo
    elif CASE == "in-del":  # it lands in a __del__, where Python swallows exceptions
        class Doomed:
            def __del__(self):
                kill(signal.SIGTERM)
        def interrupted(cfg, work, result):
            Doomed()  # "Exception ignored in ...": the interrupt must come again
            threading.Event().wait(20)  # a signal ends the wait at once
            raise AssertionError("not interrupted")
        run.prepare_data = interrupted
    elif CASE == "int-in-cleanup":  # a second one as the folder is being removed
        real_rmtree = shutil.rmtree
        def rmtree(*args, **kwargs):
            kill(signal.SIGINT)
            real_rmtree(*args, **kwargs)
        shutil.rmtree = rmtree

    if __name__ == "__main__":
        sys.argv = ["imgpack", *sys.argv[2:]]
        packer.cli.main()
    """
)


@pytest.mark.parametrize(
    "case", ["first", "exec", "mkdtemp", "in-del", "term-after", "int-after", "int-in-cleanup"]
)
def test_an_interrupted_bench_exits_130_and_leaves_no_folder(tmp_path: Path, case: str) -> None:
    """Before: "exec" ended by SIGINT (-2: CPython's flag of an interrupt that ended a
    string exec, under -m), "mkdtemp" left the folder, "in-del" ran on (the interrupt
    swallowed: "Exception ignored"), "term-after" died by SIGTERM
    (the handler handed back), "int-after" exited 1 ("Aborted!"), "int-in-cleanup"
    left the folder (the removal cut short)."""
    (tmp_path / "child_bench.py").write_text(CHILD)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    args = ["bench", "--quick", "--device", "cpu", "--only", "loading", "--out", "b"]
    p = subprocess.run(
        [sys.executable, "-m", "child_bench", case, *args],
        cwd=tmp_path,
        env=subprocess_env(TMPDIR=str(tmp)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 130, p.stderr
    assert "Interrupted. No results written" in p.stderr and "Traceback" not in p.stderr
    assert "not interrupted" not in p.stderr
    assert list(tmp.iterdir()) == []  # the bench's temporary folder removed
    assert not (tmp_path / "b").exists()
