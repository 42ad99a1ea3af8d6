"""What every ``imgpack`` command ends with: library errors and interrupts turned into
an ``Error:`` line or a note and an exit code, the progress bar, and the result printed
(``--json`` on stdout, a summary and the skipped inputs on stderr)."""

from __future__ import annotations

import functools
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
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
    with what it left for this command (:data:`INTERRUPTED`).
    """
    left = INTERRUPTED.get(fn.__name__, "Nothing was changed.")

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
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
        if threading.current_thread() is not threading.main_thread():
            return fn(*args, **kwargs)  # signal handlers can only be set from the main thread

        def interrupt(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt

        previous = signal.signal(signal.SIGTERM, interrupt)
        try:
            return fn(*args, **kwargs)
        finally:
            signal.signal(signal.SIGTERM, previous)

    return wrapper


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
