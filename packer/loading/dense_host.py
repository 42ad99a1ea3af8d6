"""The dense pass's host half in a worker process (``DenseConfig(host="process")``).

A detector's training step is mostly Python, and the loader's producer thread shares
its GIL: the producer's host work (reading the records, drawing every image's
parameters, the geometry, moving and sanitizing the boxes, the collate's host tensors)
comes out of the step one for one (docs/PERFORMANCE.md, "Detection and segmentation fed
by packs"). With ``host="process"`` a worker process makes that half of each group
(:func:`packer.loading.dense_batched.drawn_group`) from its own view of the pack, a
group or two ahead, while the producer thread reads and decodes the images and launches
the group's kernels (:func:`packer.loading.dense_batched.group_on_device`): the same
batches as the thread makes alone.

The worker is forked (as torch's DataLoader forks its workers; where the platform
cannot fork, the thread makes the groups) and reads the pack the loader holds: its
mappings and dense columns, inherited, never the pack opened again by its path (which
may lead elsewhere by then: a pack rebuilt in its place, a relative path after a
chdir, or refuse it: a reader's bound given to ``packer.load``). It answers requests
over a pipe: pickles between this package's own processes, never read from a pack's
files. It leaves Ctrl-C (the process group's SIGINT) and every other signal the
training process handles in Python (a checkpoint on SIGTERM, a scheduler's SIGUSR1) to
the training process, whose handlers it does not run, and ends on SIGTERM; it ends when
the pipe closes; :meth:`HostWorker.close` waits a moment, then stops it. A fork that
fails is not tried again in this process (:func:`fork_failed`).
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import pickle
import signal
import sys
import threading
import time
import weakref
from typing import Any

import numpy as np
import torch

from .dense_batched import drawn_group, plan_of
from .dense_pass import DenseSetup, _pixels
from .order import batch_seed

_STOP = b""
_POLL_S = 0.1  # how often a wait for an answer looks at the pass's stop
_PARENT_S = 1.0  # how often a worker waiting for a request looks for its parent
_LOOK_S = 1.0  # the most one look of a wait for an answer counts (a longer gap: stopped)


def forkable() -> bool:
    """Whether this process may fork a worker (else the producer thread makes the
    groups): the platform forks safely (not Windows; not macOS, whose system frameworks
    do not survive a fork, and where DataLoader spawns its workers), and this is no
    daemonic process (a DataLoader's worker, a ``multiprocessing`` pool's), which may
    have no children; no fork of this process has failed (:func:`fork_failed`)."""
    return (
        "fork" in mp.get_all_start_methods()
        and sys.platform != "darwin"
        and not mp.current_process().daemon
        and not _FORK_FAILED
    )


# a fork that failed (a process limit, memory): each start that fails leaves
# multiprocessing's four pipe ends of it open, so the passes after it do not try again
_FORK_FAILED: list[str] = []


def fork_failed(e: OSError) -> None:
    """Note that a worker could not be started here: no pass of this process forks one
    (the error's text is kept, not the error, whose frames hold the pass's pack)."""
    _FORK_FAILED.append(str(e))


# one worker starts at a time: a worker forked while another's pipe is being set up
# would hold that pipe's child end open, and hide that worker's end from the producer
_STARTING = threading.Lock()


# the workers started here: a child forked with os.fork inherits multiprocessing's
# list of children, whose atexit hook would stop (SIGTERM) and fail to join them there
_WORKERS: weakref.WeakSet[Any] = weakref.WeakSet()


def _after_fork() -> None:
    """In a forked child: the start lock free (a process forked while a thread held it
    gets it free), this process's workers not the child's (its atexit leaves them be)."""
    global _STARTING
    _STARTING = threading.Lock()
    children = getattr(mp.process, "_children", None)
    if children is not None:
        children.difference_update(list(_WORKERS))
    _WORKERS.clear()


os.register_at_fork(after_in_child=_after_fork)


class HostWorker:
    """A worker process making groups' host halves from ``pack`` and its pass's
    ``setup`` (``setup.columns``: the pack's dense columns), inherited by the fork."""

    def __init__(self, pack: Any, setup: DenseSetup) -> None:
        # forked, as torch's DataLoader starts its workers: in milliseconds, with torch
        # imported, and without running the training script's ``__main__`` again (a
        # spawned interpreter would). The child never touches CUDA (a forked child
        # cannot) nor the parent's threads: it computes on the CPU, on one thread.
        ctx = mp.get_context("fork")
        with _STARTING:
            self.conn, child = ctx.Pipe()
            try:
                self.proc = ctx.Process(
                    target=_serve, args=(child, pack, setup, self.conn), daemon=True,
                    name="imgpack-dense-host",
                )  # fmt: skip
                self.proc.start()
                _WORKERS.add(self.proc)
            except BaseException:  # the fork failed: its pipe goes with it
                self.conn.close()
                raise
            finally:
                child.close()

    def submit(self, group: list[tuple[int, np.ndarray]], seeds: tuple[int, int, int]) -> None:
        """Ask for ``group``'s host half (its batches' numbers and rows, the pass's seeds)."""
        batches = [(int(b), np.asarray(idx, dtype=np.int64)) for b, idx in group]
        self.conn.send_bytes(pickle.dumps((batches, seeds), protocol=pickle.HIGHEST_PROTOCOL))

    def result(
        self, stop: threading.Event | None = None, wait: float | None = None
    ) -> tuple[str, Any]:
        """The next answer, in the order asked: ``("ok", DrawnGroup or None)`` or
        ``("error", the exception's text)``; ``("stopped", None)`` once ``stop`` is set
        (the pass's: it is not waited out). EOFError when the worker has ended;
        TimeoutError when it has not answered in ``wait`` seconds (it is then stopped: a
        worker that hangs, on a lock a thread of the training process held as it forked,
        say, would stall the pass)."""
        # the wait counts the time this process looked: a gap between two looks (this
        # process and its worker stopped: Ctrl-Z, a job suspended, then resumed) is not
        # the worker's silence
        waited, last = 0.0, time.monotonic()
        while not self.conn.poll(_POLL_S):
            if stop is not None and stop.is_set():
                return "stopped", None
            if not self.proc.is_alive() and not self.conn.poll(0):
                raise EOFError("the dense host worker ended")
            now = time.monotonic()
            waited, last = waited + min(now - last, _LOOK_S), now
            if wait is not None and waited > wait and not self.conn.poll(0):
                self.proc.kill()
                self.proc.join(1.0)  # reaped now, not a zombie for the rest of the pass
                raise TimeoutError(f"did not answer in {wait:g} s and was stopped")
        return pickle.loads(self.conn.recv_bytes())

    def close(self, wait: float = 5.0) -> None:
        """Ask the worker to end, wait ``wait`` seconds, then stop it. The answers it
        is still sending are read away meanwhile: closing this end does not unblock its
        send where another process (forked while this worker lived) holds a copy."""
        try:
            self.conn.send_bytes(_STOP)
        except (OSError, ValueError):
            pass
        deadline = time.monotonic() + wait
        while self.proc.is_alive() and time.monotonic() < deadline:
            try:
                if self.conn.poll(0.05):
                    self.conn.recv_bytes()
            except (EOFError, OSError):  # it has closed its end: it is ending
                self.proc.join(max(0.0, deadline - time.monotonic()))
                break
        self.conn.close()
        self.proc.join(max(0.0, deadline - time.monotonic()))
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(wait)


def _tensor(a: np.ndarray) -> torch.Tensor:
    """A tensor of an answer's array (the producer's side of :class:`_Pickler`)."""
    return torch.from_numpy(a if a.flags.writeable else a.copy())


class _Pickler(pickle.Pickler):
    """The worker's answers: CPU tensors as numpy arrays. torch pickles a tensor's
    storage as a ``torch.save`` archive, one ``torch.load`` each to read back: the
    producer's unpickling of a group cost about what making it there costs."""

    def reducer_override(self, obj: Any) -> Any:
        if (
            isinstance(obj, torch.Tensor)
            and obj.device.type == "cpu"
            and obj.layout == torch.strided
        ):
            try:
                return _tensor, (obj.detach().numpy(),)
            except (TypeError, RuntimeError):  # a dtype numpy lacks: torch's own way
                return NotImplemented
        return NotImplemented


def _dumps(obj: Any) -> bytes:
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def _sizes_of(pack: Any) -> Any:
    """Image ``i``'s (h, w) as the producer will hold it: a JPEG pack's stored size (its
    frame header is checked against it before decoding), a raw pack's rows' size."""
    sizes = getattr(pack, "sizes", None)
    if sizes is not None:
        table = np.asarray(sizes, dtype=np.int64).reshape(-1, 2)
        return lambda idx: [tuple(int(v) for v in table[i]) for i in idx]
    h, w = (int(v) for v in pack.images.shape[-2:])
    return lambda idx: [(h, w)] * len(idx)


def _own_signals() -> None:
    """The worker's signals, not the training process's handlers inherited by the fork
    (they would run here too: a second checkpoint writer, a job requeued twice): Ctrl-C
    and every signal handled in Python ignored (the training process takes them and
    closes the pass), SIGTERM the default and unblocked, whatever the training process
    (or the thread that forked) made of it (the worker ends: ``terminate()``, and
    multiprocessing's at exit, which waits for it)."""
    for s in signal.valid_signals():
        try:
            handled = callable(signal.getsignal(s))
        except (OSError, ValueError):
            continue
        if handled or s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_DFL if s == signal.SIGTERM else signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def _serve(conn: Any, pack: Any, setup: DenseSetup, theirs: Any = None) -> None:
    """The worker's loop: a request in, its group's host half (or the error) out. It
    ends when the pipe closes, and when the training process has gone (killed: by the
    OOM killer, a scheduler): its copy of the producer's end, inherited by the fork,
    is closed first, and its parent is looked at while it waits (a process forked from
    the training process later may hold that end too)."""
    _own_signals()
    if theirs is not None:
        theirs.close()
    parent = os.getppid()
    torch.set_num_threads(1)
    plan = plan_of(setup.op)
    sizes_of = _sizes_of(pack)
    while True:
        try:
            while not conn.poll(_PARENT_S):
                if os.getppid() != parent:
                    return
            msg = conn.recv_bytes()
        except (EOFError, OSError):
            return
        if msg == _STOP:
            return
        batches, (seed, epoch, rank) = pickle.loads(msg)
        try:
            idx = np.concatenate([i for _, i in batches])
            records = setup.columns.read(idx)
            items = [_pixels(r, setup) for r in records]
            gens = [
                (len(i), torch.Generator().manual_seed(batch_seed(seed, epoch, rank, b)))
                for b, i in batches
            ]
            made = drawn_group(sizes_of(idx), records, items, setup, gens, plan)
            data = _dumps(("ok", made))
        except Exception as e:  # the producer makes the group itself, and meets it there
            data = _dumps(("error", f"{type(e).__name__}: {e}"))
        try:
            conn.send_bytes(data)
        except (BrokenPipeError, OSError):
            return
