"""A pool worker watched and killed without reaping it (used by
:func:`packer.builder.chunks.release_pool` and ``stop_pool``): the executor's own thread
reaps its workers, and a second reaper in this process raced it (see the class)."""

from __future__ import annotations

import os
import signal
from multiprocessing.connection import wait as mp_wait
from typing import Any


class WorkerHandle:
    """A pool worker, watched without reaping it. The executor's own thread joins
    (reaps) its workers, and any ``Process.start()`` of this process polls (reaps)
    every ended child; ``Process.is_alive()``/``join()``/``kill()`` here raced them:
    the reaper had the exit status and had not recorded it yet, so waitpid said ECHILD
    and is_alive() said "alive" (the wait spun to the bound, counted a sound worker
    killed, and the kill went to a pid that may be another process's by then; a test
    saw a killed worker "alive" after its join). So: ended = the sentinel (ready once
    the worker has exited, whoever reaps it); the kill goes through a pidfd opened at
    the release, while the worker had not ended (its sentinel not ready just after),
    so it can only ever reach this worker; the exit code is the one recorded by
    whoever reaped it, else read without reaping (``waitid(WNOWAIT)``)."""

    def __init__(self, proc: Any) -> None:
        self.proc = proc
        self.fd: int | None = None
        try:
            self.sentinel: int | None = proc.sentinel
        except (ValueError, AttributeError):  # closed: ended long ago
            self.sentinel = None
            return
        try:
            fd = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):  # gone already, or no pidfd (not Linux 5.3+)
            return
        if self.ended():  # ended before the pidfd: the pid may be another process's
            os.close(fd)
        else:
            self.fd = fd

    def ended(self) -> bool:
        if self.sentinel is None:
            return True
        try:
            return bool(mp_wait([self.sentinel], 0))
        except (OSError, ValueError):
            return True

    def exit_code(self) -> int | None:
        """The exit code (negative: the signal) of an ended worker; None while unknown
        (running, or reaped by another thread that has not recorded it yet)."""
        code = getattr(getattr(self.proc, "_popen", None), "returncode", None)
        if code is not None or self.fd is None:
            return code
        try:  # our child (fork, spawn): its status, left for the reaper
            info = os.waitid(os.P_PIDFD, self.fd, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except (AttributeError, OSError):  # a fork server's child, or reaped by now
            return None
        if info is None:
            return None
        if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
            return -info.si_status
        return info.si_status

    def died(self) -> bool:
        """Ended by a signal (a negative exit code): killed wherever it was, perhaps
        holding the task queue's lock (an exit of its own releases it)."""
        code = self.exit_code() if self.ended() else None
        return code is not None and code < 0

    def kill(self) -> bool:
        """SIGKILL this worker (never another process that took its pid); whether it
        was sent to a running worker."""
        if self.fd is not None:
            try:
                signal.pidfd_send_signal(self.fd, signal.SIGKILL)
            except ProcessLookupError:  # it ended meanwhile
                return False
            except OSError:
                pass
            else:
                return True
        if self.ended():
            return False
        try:  # no pidfd: by its pid, which is its own while its sentinel is not ready
            os.kill(self.proc.pid, signal.SIGKILL)
        except OSError:
            return False
        return True

    def close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)
