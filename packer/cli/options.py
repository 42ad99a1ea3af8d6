"""Options shared by several ``imgpack`` commands, declared once as decorators
(sqlite-utils' manner), and the checks of their values made before any work."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ..errors import UsageError


def json_option(help: str = "Print one JSON object on stdout.") -> Callable[[Any], Any]:
    return click.option("--json", "as_json", is_flag=True, help=help)


def quiet_option(help: str = "No progress bar or log lines.") -> Callable[[Any], Any]:
    return click.option("-q", "--quiet", is_flag=True, help=help)


def workers_option(help: str) -> Callable[[Any], Any]:
    return click.option("--workers", type=click.IntRange(1, 1024), default=None, help=help)


def device_option(
    help: str = "Where to run: auto (CUDA if present), cpu, cuda, cuda:N.",
    default: str = "auto",
) -> Callable[[Any], Any]:
    """``--device`` as given; the library turns it into a ``torch.device`` once
    (``timing.resolve_device``) and passes that on."""
    return click.option("--device", default=default, show_default=True, help=help)


class QualityHint(click.Command):
    """A command with both ``-q`` (--quiet) and ``-Q`` (--quality). ``-q 3`` meant as a
    quality leaves click's bare "unexpected extra argument (3)" (``-q3``: "No such option
    '-3'"); this says which letter is which, still a usage error (exit 2)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        given = list(args)  # click's parser consumes the list it is handed
        try:
            rest = super().parse_args(ctx, args)
        except click.UsageError:
            found = _number_after_quiet(given)
            if found is None:
                raise
            what, number = found
            raise click.UsageError(
                f"{what}. Quality is --quality/-Q (e.g. -Q {number}); -q means --quiet.", ctx
            ) from None
        # a command taking several SRC (build) reads the number as its DST, the DST as a SRC
        found = _number_after_quiet(given)
        if found is not None and str(ctx.params.get("dst")) == found[1]:
            what, number = found
            raise click.UsageError(
                f"{what}. Quality is --quality/-Q (e.g. -Q {number}); -q means --quiet.", ctx
            )
        return rest


def _number_after_quiet(args: list[str]) -> tuple[str, str] | None:
    """(what went wrong, the number) for a number right after ``-q``/``--quiet``, or
    glued on (``-q3``); None when there is none."""
    for i, arg in enumerate(args):
        if arg == "--":
            return None
        if arg in ("-q", "--quiet") and i + 1 < len(args) and args[i + 1].isdigit():
            return f"unexpected extra argument '{args[i + 1]}'", args[i + 1]
        if arg.startswith("-q") and arg[2:].isdigit():
            return f"no such option '{arg}'", arg[2:]
    return None


def check_output(path: Path, option: str, folder: bool = False) -> None:
    """Refuse, before any work, an output path that could not be written at the end."""
    if folder:
        if path.exists() and not path.is_dir():
            raise UsageError(f"{path}: {option} must be a folder, and this is a file")
        parent = path
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
    else:
        if path.is_dir():
            raise UsageError(f"{path}: {option} must be a file name, and this is a folder")
        from ..measure.plots import check_output_file  # the one check of an output file

        check_output_file(path, option)
        parent = path.parent
        if not parent.exists():
            raise UsageError(f"{parent}: no such folder for {option}; create it first")
    if not parent.is_dir():
        raise UsageError(f"{parent}: is a file, so {option} {path} cannot be written under it")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{parent}: not writable, so {option} {path} cannot be written")
