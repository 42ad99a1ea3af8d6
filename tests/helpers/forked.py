"""Run a command in a fork of this test process rather than in a fresh interpreter
(issue 45, item 12): the suite is CPU-bound, and each fresh ``python`` that imports
torch costs 2-4 CPU-seconds; a fork of a pytest worker (torch, packer and the test
modules already imported) starts in milliseconds.

The child is a real process of its own (its own PID, file descriptors, exit code), run
as the interpreter would run the command: ``sys.argv``, the environment, the working
folder, ``sys.path[0]`` as ``python -c``/``python -m``/``python SCRIPT`` set them; its
fds 0, 1 and 2 are /dev/null (or ``input``) and two files, so what C code writes is
caught too; the signal handlers, logging, warnings filters and atexit functions of a
fresh interpreter, not the worker's (pytest's capture and its SIGINT/SIGTERM hooks).
``SystemExit`` and uncaught exceptions end it as Python ends: the code, or the
traceback on stderr and exit 1. The child never returns into pytest (``os._exit``).

Where this process holds a CUDA context, or for a command that uses object storage
(``storage=True``) where this process has used it (obstore's runtime threads are not in
a fork: packer.storage.client._check_not_forked), the command runs in a fork of the
*zygote* instead: a fork of this process made at the session's start, before any test
(:func:`start_zygote`, called by tests/conftest.py), which forks such commands on
request; where there is none, in a fresh interpreter (:func:`forkable`). What a fork cannot be, and so where tests keep
``subprocess``: start-up and import tests (what a fresh interpreter imports, its time),
tests of a variable read at import, of signals, kills and resumes of a process group,
of the installed wheel. A test that monkeypatches something would see its patch in the
child: such tests keep ``subprocess`` as well. Also: the worker computes with one torch
thread (tests/conftest.py), and so does the child.
"""

from __future__ import annotations

import atexit
import io
import logging
import os
import runpy
import select
import signal
import subprocess
import sys
import tempfile
import traceback
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

# the interpreter's own warnings filters (no -W, no PYTHONWARNINGS), in its order
_DEFAULT_FILTERS = (
    ("default", None, DeprecationWarning, "__main__", 0),
    ("ignore", None, DeprecationWarning, None, 0),
    ("ignore", None, PendingDeprecationWarning, None, 0),
    ("ignore", None, ImportWarning, None, 0),
    ("ignore", None, ResourceWarning, None, 0),
)


# the streams this process wrote to before the fork, flushed at the child's exit
_STALE: list[object] = []


def run_module(
    module: str, args: Sequence[object], *, timeout: float | None = None, **kw: object
) -> subprocess.CompletedProcess[str]:
    """``python -m MODULE ARGS`` in a fork: as ``subprocess.run(..., capture_output=True,
    text=True)`` would return it."""
    argv = [module, *map(str, args)]  # runpy sets argv[0] to the module's file
    args_ = [sys.executable, "-m", *argv]
    return Forked(("module", module), argv, args_, path0="", **kw).wait(timeout)  # type: ignore[arg-type]


def run_cli(args: Sequence[object], **kw: object) -> subprocess.CompletedProcess[str]:
    """``python -m packer ARGS`` (``imgpack ARGS``) in a fork."""
    return run_module("packer", args, **kw)


def run_script(
    script: Path | str, args: Sequence[object] = (), *, timeout: float | None = None, **kw: object
) -> subprocess.CompletedProcess[str]:
    """``python SCRIPT ARGS`` in a fork."""
    return start_script(script, args, **kw).wait(timeout)


def run_code(
    code: str, args: Sequence[object] = (), *, timeout: float | None = None, **kw: object
) -> subprocess.CompletedProcess[str]:
    """``python -c CODE ARGS`` in a fork."""
    return start_code(code, args, **kw).wait(timeout)


def start_code(code: str, args: Sequence[object] = (), **kw: object) -> Forked:
    """``python -c CODE ARGS`` started in a fork, not waited for (``.wait()``)."""
    argv = ["-c", *map(str, args)]
    args_ = [sys.executable, "-c", code, *argv[1:]]
    return Forked(("code", code), argv, args_, path0="", **kw)  # type: ignore[arg-type]


def run_forked(
    main: Callable[[], object],
    argv: list[str],
    args: list[str],
    *,
    timeout: float | None = None,
    **kw: object,
) -> subprocess.CompletedProcess[str]:
    """``main()`` in a forked child with ``sys.argv = argv``, waited for; ``args`` is
    what the returned CompletedProcess (and a TimeoutExpired) names as the command."""
    return Forked(main, argv, args, **kw).wait(timeout)  # type: ignore[arg-type]


def start_script(script: Path | str, args: Sequence[object] = (), **kw: object) -> Forked:
    """``python SCRIPT ARGS`` started in a fork, not waited for (``.wait()``): several
    at once, as ``subprocess.Popen`` starts them."""
    argv = [str(script), *map(str, args)]
    path0 = str(Path(script).resolve().parent)
    return Forked(("script", str(script)), argv, [sys.executable, *argv], path0=path0, **kw)  # type: ignore[arg-type]


def _main_of(spec: tuple[str, str] | Callable[[], object]) -> Callable[[], object]:
    """What the child runs: ``("module", NAME)`` as ``python -m``, ``("script", PATH)`` as
    ``python PATH``, ``("code", CODE)`` as ``python -c``; a callable as it is."""
    if callable(spec):
        return spec
    kind, target = spec

    def main() -> None:
        if kind == "module":
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        elif kind == "script":
            runpy.run_path(target, run_name="__main__")
        else:
            import types

            module = types.ModuleType("__main__")
            module.__dict__["__builtins__"] = __builtins__
            sys.modules["__main__"] = module
            exec(compile(target, "<string>", "exec"), module.__dict__)

    return main


def forkable(storage: bool = False) -> bool:
    """Whether a fork of this process can do what a fresh interpreter would: not where
    it holds a CUDA context, nor, for a command that uses object storage (``storage``),
    where this process has used it (obstore's runtime threads, started at its first
    request, are not in a fork: packer.storage.client._check_not_forked refuses)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return False
    client = sys.modules.get("packer.storage.client")
    return not storage or getattr(client, "_RUNTIME_PID", None) is None


class Forked:
    """A forked child running ``main`` (a callable, or a ``(kind, target)`` that
    :func:`_main_of` makes one of), started at once; ``wait()`` gives what
    ``subprocess.run(..., capture_output=True, text=True)`` would. Where this process
    cannot be forked for it (:func:`forkable`), a ``(kind, target)`` runs in a fork of
    the zygote (:func:`start_zygote`) where there is one, else ``args`` in a fresh
    interpreter (subprocess.Popen). ``zygote``: there in any case, for a command whose
    outcome depends on state that this process's earlier tests may have set up and a
    fresh interpreter would not have (torch's profiler, initialised at its first use and
    reading its variables then), the zygote holding this process's state as the session
    started."""

    def __init__(
        self,
        main: Callable[[], object] | tuple[str, str],
        argv: list[str],
        args: list[str],
        *,
        path0: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: Path | str | None = None,
        input: str | None = None,
        storage: bool = False,
        zygote: bool = False,
    ) -> None:
        self.args = args
        self.returncode: int | None = None
        self._out = tempfile.TemporaryFile()  # noqa: SIM115 (closed in __del__)
        self._err = tempfile.TemporaryFile()  # noqa: SIM115
        self._popen: subprocess.Popen[bytes] | None = None
        self._zygote: _Zygote | None = None
        with tempfile.TemporaryFile() as stdin:
            if input is not None:
                stdin.write(input.encode())
                stdin.seek(0)
            elsewhere = zygote or not forkable(storage)
            if elsewhere and not callable(main) and _usable_zygote() is not None:
                self._zygote = _usable_zygote()
                fds = (stdin.fileno(), self._out.fileno(), self._err.fileno())
                request = {"main": main, "argv": argv, "path0": path0, "cwd": str(cwd or os.getcwd()),
                           "env": dict(os.environ if env is None else env), "devnull": input is None}  # fmt: skip
                self.pid = self._zygote.start(request, fds)  # type: ignore[union-attr]
                return
            if elsewhere:
                self._popen = subprocess.Popen(
                    args, stdin=stdin if input is not None else subprocess.DEVNULL,
                    stdout=self._out, stderr=self._err, cwd=cwd,
                    env=None if env is None else dict(env),
                )  # fmt: skip
                self.pid = self._popen.pid
                return
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:  # the child: never returns
                fds = (stdin.fileno(), self._out.fileno(), self._err.fileno())
                _child(_main_of(main), argv, path0, env, cwd, *fds, input is None)
        self.pid = pid

    def wait(self, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
        """Its exit code and outputs; past ``timeout`` it is SIGKILLed, reaped, and
        TimeoutExpired raised."""
        if self.returncode is None:
            try:
                if self._popen is not None:
                    self.returncode = self._popen.wait(timeout)
                elif self._zygote is not None:
                    self.returncode = self._zygote.wait(self.pid, timeout, self.args)
                else:
                    self.returncode = _wait(self.pid, timeout, self.args)
            except subprocess.TimeoutExpired:
                if self._popen is not None:
                    self._popen.kill()
                    self._popen.wait()
                self.returncode = -signal.SIGKILL
                raise
        outs = []
        for f in (self._out, self._err):
            f.seek(0)
            outs.append(f.read().decode(errors="replace"))
        return subprocess.CompletedProcess(self.args, self.returncode, *outs)

    def kill(self) -> None:
        """SIGKILL it, and reap it (nothing when it has ended)."""
        if self.returncode is None:
            with _suppress():
                os.kill(self.pid, signal.SIGKILL)
            self.wait()

    def __del__(self) -> None:
        self._out.close()
        self._err.close()


# ---- the zygote: a fork of this test process made at the session's start, before any
# test used object storage (tests/conftest.py calls start_zygote), that forks the
# commands this process cannot fork itself (it has used its object-store client, or
# holds a CUDA context): a fresh interpreter for them imported torch again, 3-5
# CPU-seconds each (issue 45, item 12). Requests go over a socket pair (SOCK_SEQPACKET,
# the child's three fds passed along); the zygote reports each child's PID, then its
# exit status. It ends when this process's end of the socket closes.
_ZYGOTE: _Zygote | None = None


class _Zygote:
    def __init__(self) -> None:
        import socket

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            ours.close()
            try:
                _zygote_main(theirs)
            finally:
                os._exit(0)
        theirs.close()
        self.pid, self.sock, self.owner = pid, ours, os.getpid()
        self.ended: dict[int, int] = {}  # child pid -> exit code, reported not yet waited

    def _receive(self, timeout: float | None) -> bool:
        """One report from the zygote into ``ended`` (False: none within ``timeout``)."""
        import pickle

        ready, _, _ = select.select([self.sock], [], [], timeout)
        if not ready:
            return False
        data = self.sock.recv(1 << 16)
        if not data:
            raise RuntimeError("the test zygote ended")
        what, pid, value = pickle.loads(data)
        if what == "exit":
            self.ended[pid] = value
        else:
            self._started = pid
        return True

    def start(self, request: dict[str, object], fds: tuple[int, int, int]) -> int:
        import pickle
        import socket

        self._started: int | None = None
        socket.send_fds(self.sock, [pickle.dumps(request)], list(fds))
        while self._started is None:
            self._receive(None)
        return self._started

    def wait(self, pid: int, timeout: float | None, args: list[str]) -> int:
        import time

        end = None if timeout is None else time.monotonic() + timeout
        while pid not in self.ended:
            left = None if end is None else max(0.0, end - time.monotonic())
            if not self._receive(left) and end is not None and time.monotonic() >= end:
                with _suppress():
                    os.kill(pid, signal.SIGKILL)
                while pid not in self.ended:
                    self._receive(None)
                self.ended.pop(pid)
                raise subprocess.TimeoutExpired(args, timeout or 0)
        return self.ended.pop(pid)


def start_zygote() -> None:
    """Fork this process's zygote (once): call it before any test runs."""
    global _ZYGOTE
    if _ZYGOTE is None and sys.platform.startswith("linux"):
        _ZYGOTE = _Zygote()
        import processes

        record = processes.track(_ZYGOTE.pid)

        def stop(z: _Zygote = _ZYGOTE) -> None:
            z.sock.close()  # it ends
            with _suppress():
                os.waitpid(z.pid, 0)
            processes.untrack(record)

        atexit.register(stop)


def _usable_zygote() -> _Zygote | None:
    z = _ZYGOTE
    if z is None or z.owner != os.getpid():  # a fork of the owner: not its zygote
        return None
    try:
        done, _ = os.waitpid(z.pid, os.WNOHANG)
    except ChildProcessError:
        return None
    return None if done else z


def _zygote_main(sock: object) -> None:
    """The zygote's loop: fork a child per request, report its PID and later its exit."""
    import pickle
    import socket

    assert isinstance(sock, socket.socket)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the session's Ctrl-C is its owner's
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    children: dict[int, int] = {}  # pidfd -> pid
    while True:
        ready, _, _ = select.select([sock, *children], [], [])
        for fd in ready:
            if fd is sock:
                data, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
                if not data:
                    return  # the test process closed its end
                request = pickle.loads(data)
                pid = os.fork()
                if pid == 0:
                    sock.close()
                    for pidfd in children:
                        os.close(pidfd)
                    _child(_main_of(request["main"]), request["argv"], request["path0"],
                           request["env"], request["cwd"], *fds, request["devnull"])  # fmt: skip
                for f in fds:
                    os.close(f)
                children[os.pidfd_open(pid)] = pid
                sock.send(pickle.dumps(("started", pid, None)))
            else:
                pid = children.pop(fd)
                os.close(fd)
                _, status = os.waitpid(pid, 0)
                sock.send(pickle.dumps(("exit", pid, os.waitstatus_to_exitcode(status))))


def _wait(pid: int, timeout: float | None, args: list[str]) -> int:
    """The child's exit code as subprocess gives it (-N when signal N ended it); past
    ``timeout`` it is SIGKILLed, reaped and TimeoutExpired raised."""
    fd = os.pidfd_open(pid)
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise subprocess.TimeoutExpired(args, timeout or 0)
    finally:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _child(
    main: Callable[[], object],
    argv: list[str],
    path0: str | None,
    env: Mapping[str, str] | None,
    cwd: Path | str | None,
    stdin: int,
    stdout: int,
    stderr: int,
    devnull: bool,
) -> None:
    code = 1
    try:
        code = _fresh(stdin, stdout, stderr, devnull, argv, path0, env, cwd)
        torch = sys.modules.get("torch")
        if torch is not None:  # GNU OpenMP's pool is not in a fork: a parallel region
            torch.set_num_threads(1)  # of this process's threads would wait on it forever
        if code == 0:
            code = _run(main)
    except BaseException:  # the child never returns into pytest
        with _suppress():
            traceback.print_exc()
    finally:
        with _suppress():
            sys.stdout.flush()
        with _suppress():
            sys.stderr.flush()
        for stream in _STALE:
            with _suppress():
                stream.flush()  # type: ignore[attr-defined]
        os._exit(code)


def _fresh(
    stdin: int,
    stdout: int,
    stderr: int,
    devnull: bool,
    argv: list[str],
    path0: str | None,
    env: Mapping[str, str] | None,
    cwd: Path | str | None,
) -> int:
    """The process as a fresh interpreter has it: fds, sys streams, signals, logging,
    warnings, atexit, environment, folder, argv and sys.path[0]."""
    if devnull:
        stdin = os.open(os.devnull, os.O_RDONLY)
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
    # what this process wrote to before (pytest's capture files): a module imported
    # here earlier may hold them (a logging handler made at import): its writes go to
    # this child's files too, not into the test's captured output
    old = {"out": (sys.stdout, sys.__stdout__), "err": (sys.stderr, sys.__stderr__)}
    for key, fd in (("out", stdout), ("err", stderr)):
        for stream in old[key]:
            _STALE.append(stream)
            with _suppress():
                if stream.fileno() > 2:
                    os.dup2(fd, stream.fileno())
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.FileIO(1, "w", closefd=False))
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), errors="backslashreplace", line_buffering=True
    )
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for logger in loggers:
        for handler in getattr(logger, "handlers", ()):
            if type(handler) is logging.StreamHandler:
                for key, new in (("out", sys.stdout), ("err", sys.stderr)):
                    if any(handler.stream is o for o in old[key]):
                        with _suppress():
                            handler.setStream(new)  # type: ignore[arg-type]
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGALRM, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    signal.alarm(0)
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    logging.disable(logging.NOTSET)
    warnings.filters[:] = list(_DEFAULT_FILTERS)
    warnings.showwarning = warnings._showwarning_orig  # type: ignore[attr-defined]
    warnings._showwarnmsg_impl = _showwarnmsg_impl  # type: ignore[attr-defined]
    warnings.onceregistry.clear()  # type: ignore[attr-defined]
    warnings._filters_mutated()  # type: ignore[attr-defined]
    atexit._clear()
    forkserver = sys.modules.get("multiprocessing.forkserver")
    if forkserver is not None:  # this process's fork server is not the child's to use
        server = forkserver._forkserver  # type: ignore[attr-defined]
        server._forkserver_address = server._forkserver_alive_fd = None
        server._forkserver_pid = None
    if "multiprocessing.util" in sys.modules:  # registered at its import, as it would be
        atexit.register(sys.modules["multiprocessing.util"]._exit_function)
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    if cwd is not None:
        os.chdir(cwd)
    sys.argv = list(argv)
    if path0 is not None:
        sys.path.insert(0, path0)
    return 0


def _showwarnmsg_impl(msg: warnings.WarningMessage) -> None:
    """The warnings module's own (pytest's catch_warnings replaces it with a list's
    append): the warning's text on stderr."""
    file = msg.file if msg.file is not None else sys.stderr
    if file is not None:
        with _suppress():
            file.write(warnings._formatwarnmsg(msg))  # type: ignore[attr-defined]


def _run(main: Callable[[], object]) -> int:
    """``main()``, then the interpreter's exit: non-daemon threads joined, atexit run;
    the exit code as Python gives it."""
    try:
        main()
        code = 0
    except SystemExit as e:
        code = _exit_code(e.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # as Python: ended by SIGINT
        os.kill(os.getpid(), signal.SIGINT)
        code = 130
    except BaseException:
        sys.__excepthook__(*sys.exc_info())
        code = 1
    import threading

    with _suppress():
        threading._shutdown()  # type: ignore[attr-defined]
    with _suppress():
        atexit._run_exitfuncs()
    return code


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    with _suppress():
        print(code, file=sys.stderr)
    return 1


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return True
