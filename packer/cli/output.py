"""What every ``imgpack`` command ends with: library errors and interrupts turned into
an ``Error:`` line or a note and an exit code, the progress bar, and the result printed
(``--json`` on stdout, a summary and the skipped inputs on stderr)."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import click

from ..errors import PackerError
from .flags import cli_message

EXIT_OK, EXIT_PROBLEM, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

# when a command's code was loaded (its module imports this one first): the start of a
# build's timeline as the command sees it (packer.builder.timeline's clock)
LOADED_AT = time.perf_counter()


def emit_json(obj: Any) -> None:
    click.echo(json.dumps(obj, ensure_ascii=False))


# What Ctrl-C (or SIGTERM) leaves, per command: only build and compress keep work to resume.
_RESUME = "The work done so far is kept: run the same command again to resume."
INTERRUPTED = {
    "build": _RESUME,
    "compress": _RESUME,
    "verify": "Nothing was changed (verify only reads the pack); no report was written.",
    "bench": "No results written (the temporary images are removed).",
    "info": "Nothing was changed.",
    "show": "Nothing was changed; no sheet was written.",
}


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn library errors into ``Error: ...`` with their exit code; keep bugs' tracebacks.
    The fields a library message names are shown as their flags (:mod:`packer.cli.flags`).

    An interrupt (Ctrl-C, or SIGTERM under :func:`sigterm_as_interrupt`) exits 130
    with what it left for this command (:data:`INTERRUPTED`), whatever arrives after it:
    one interrupt per run (:func:`_interrupt_once`), and a process that ends by it
    ignores SIGINT and SIGTERM from then on (:func:`packer.cli.main`).
    """
    left = INTERRUPTED.get(fn.__name__, "Nothing was changed.")

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with _interrupt_once(signal.SIGINT):
                return fn(*args, **kwargs)
        except PackerError as e:
            click.echo(f"Error: {cli_message(e)}", err=True)
            sys.exit(e.exit_code)
        except KeyboardInterrupt:
            click.echo(f"\nInterrupted. {left}", err=True)
            sys.exit(EXIT_INTERRUPTED)

    return wrapper


def sigterm_as_interrupt(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Treat SIGTERM (``kill``, a job scheduler, a container stop) like Ctrl-C while
    ``fn`` runs: the work so far is kept, exit 130, and workers stay quiet."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _interrupt_once(signal.SIGTERM):
            return fn(*args, **kwargs)

    return wrapper


# Set by packer.cli.main, the process's entry: a command ended by an interrupt ends the
# process (exit 130), so its signals stay ignored (not handed back) once it is caught.
process_entry = False
# One interrupt per command run, shared by the SIGINT and SIGTERM handlers: the first
# raises KeyboardInterrupt; later ones are ignored while it unwinds (the temporary
# folders removed, the workers stopped), so a second signal neither cuts a cleanup short
# nor ends the process other than by exit 130 (before, one arriving after the SIGTERM
# handler was handed back killed it, and a second Ctrl-C ended it by SIGINT). One that
# Python swallowed (raised in a __del__) is delivered again (_unraisable).
_run: dict[str, Any] = {"active": False, "interrupted": False, "lost": False, "exc": None}
_run_lock = threading.Lock()  # "active" and "lost" against the thread delivering again
_guards = 0
_unraisable_before: list[Any] = []
_AGAIN_S = 0.05  # how often a swallowed interrupt is delivered again until one is raised


def _interrupt(signum: int, frame: Any) -> None:
    if _run["interrupted"] or not _run["active"]:
        return  # the interrupt of this run is unwinding: let its cleanups finish
    _run.update(interrupted=True, lost=False, sig=signum, exc=KeyboardInterrupt())
    raise _run["exc"]


def _unraisable(unraisable: Any) -> None:
    """The run's interrupt raised where Python swallows exceptions (a ``__del__``, a
    weakref callback: "Exception ignored in ...") is delivered again, from a thread,
    until one is raised at an ordinary step of the main thread (before, the command ran
    on to exit 0, and with one interrupt per run no later signal would have stopped
    it)."""
    if unraisable.exc_value is None or unraisable.exc_value is not _run["exc"]:
        _unraisable_before[-1](unraisable)  # not ours: as Python reports it
        return
    with _run_lock:  # ours: not reported (it is not lost), delivered again
        _run["lost"] = True
        if _run.get("again") is None or not _run["again"].is_alive():
            _run["again"] = threading.Thread(target=_deliver_again, daemon=True)
            _run["again"].start()
    _run["interrupted"] = False  # last: no step of this hook can raise it now


def _deliver_again() -> None:
    while True:
        with _run_lock:
            if not (_run["active"] and _run["lost"]):
                return
            os.kill(os.getpid(), _run["sig"])
        time.sleep(_AGAIN_S)


@contextlib.contextmanager
def _interrupt_once(sig: signal.Signals) -> Iterator[None]:
    """While the block runs (main thread), ``sig`` raises KeyboardInterrupt unless an
    interrupt of this run already has (:func:`_interrupt`, :func:`_unraisable`). On the
    way out the previous handler is back, except when the run was interrupted in the
    process's entry: then ``sig`` stays ignored until the process has exited 130."""
    global _guards
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return
    if _guards == 0:  # a new run (in-process callers run several)
        _run.update(active=True, interrupted=False, lost=False, exc=None)
        _unraisable_before.append(sys.unraisablehook)
        sys.unraisablehook = _unraisable
    previous = signal.signal(sig, _interrupt)
    _guards += 1
    ending = False
    try:
        yield
    except KeyboardInterrupt:
        ending = process_entry
        raise
    finally:
        _guards -= 1
        if _guards == 0:
            with _run_lock:  # nothing is delivered again from here on
                _run["active"] = False
            sys.unraisablehook = _unraisable_before.pop()
        # (signal.signal runs a pending handler first: ours, which ignores it now)
        signal.signal(sig, signal.SIG_IGN if ending else previous)


class Bar:
    """A tqdm bar on stderr, or nothing with --quiet / --json without a terminal."""

    def __init__(self, desc: str, unit: str, quiet: bool) -> None:
        self.bar = None
        self.desc, self.unit, self.quiet = desc, unit, quiet

    def start(self, total: int, done: int = 0) -> None:
        if not self.quiet:
            from tqdm import tqdm

            self.bar = tqdm(
                total=total,
                initial=done,
                desc=self.desc,
                unit=self.unit,
                file=sys.stderr,
                dynamic_ncols=True,
                smoothing=0.1,
            )

    def update(self, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def shards(self, done: int, total: int) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(f"shards {done}/{total}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_with_bar(
    desc: str,
    quiet: bool,
    as_json: bool,
    run: Callable[..., Any],
    unit: str = "img",
    shards: bool = False,
) -> Any:
    """Run a library call that reports ``on_start``/``progress``, drawing a tqdm bar on stderr
    (``shards``: and ``on_shard(done, total)``, shown beside it)."""
    _setup_logging(quiet or as_json)
    bar = Bar(desc, unit, quiet)
    more = {"on_shard": bar.shards} if shards else {}
    try:
        return run(progress=bar.update, on_start=bar.start, **more)
    finally:
        bar.close()


def _setup_logging(quiet: bool) -> None:
    logging.basicConfig(
        level=logging.WARNING if quiet else logging.INFO, format="%(message)s", stream=sys.stderr
    )


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def _print_skips(skipped: list[dict[str, str]], limit: int = 20) -> None:
    for s in skipped[:limit]:
        click.echo(f"  skipped {s['path']}: {s['reason']}", err=True)
    if len(skipped) > limit:
        click.echo(
            f"  ... and {len(skipped) - limit} more (see --json or `imgpack info`)", err=True
        )


def report(
    result: Any,
    summary: str,
    *,
    skipped: list[dict[str, str]],
    as_json: bool,
    quiet: bool,
    strict: bool = False,
) -> None:
    """The end of a run, the same for every command: ``--json`` prints the result's
    ``to_json()`` on stdout; otherwise the skipped inputs ("skipped PATH: reason")
    and ``summary`` go to stderr (nothing with --quiet). ``--strict`` exits 1 when
    an input was skipped."""
    if as_json:
        emit_json(result.to_json())
    elif not quiet:
        _print_skips(skipped)
        click.echo(summary, err=True)
    if strict and skipped:
        sys.exit(EXIT_PROBLEM)
