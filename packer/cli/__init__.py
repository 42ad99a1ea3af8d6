"""The ``imgpack`` command: parse options, call the library, format the result.

Exit codes: 0 success; 1 the work ran but found a problem (verify failed,
inputs were skipped under --strict, no input was usable, a worker died);
2 bad usage or input the command cannot start on (also an unwritable
destination); 130 interrupted (Ctrl-C or SIGTERM), with the work done so far kept.

The commands live one per module (``build``, ``compress``, ``verify``, ``info``,
``show``, ``bench``); the shared options are :mod:`packer.cli.options`'s and the
error, progress and result printing :mod:`packer.cli.output`'s. A command's module is
imported when the command runs (or ``--help`` lists it), so a command pays only for
what it uses: ``imgpack info`` never loads the benchmark's or the build's code.
"""

from __future__ import annotations

import gc
import importlib

import click

from .._version import __version__

# each command's name is its module's under packer.cli, which defines it by that name
_COMMANDS = ("build", "info", "compress", "verify", "show", "bench")


class _LazyGroup(click.Group):
    """A group whose commands are imported by name when first asked for (click's
    "lazily loading subcommands" pattern)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*_COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in _COMMANDS and cmd_name not in self.commands:
            module = importlib.import_module(f"{__name__}.{cmd_name}")
            self.add_command(getattr(module, cmd_name))
        return self.commands.get(cmd_name)


@click.group(
    cls=_LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, prog_name="imgpack")
def cli() -> None:
    """Pack an image dataset into memory-mapped uint8 tensors and stream it to the GPU.

    \b
    A typical run:
      imgpack compress photos/ small/ --quality 3    # multi-MB photos -> ~200 KB JPEGs
      imgpack build small/ tensors/ --size 224       # decode + resize once, in parallel
      imgpack info tensors/
      imgpack verify tensors/ --device cuda          # integrity + speed vs. the folder

    In Python: packer.load("tensors/"), packer.PackLoader(pack, 256, device="cuda").
    Exit codes: 0 ok, 1 the work found a problem, 2 bad usage or input, 130 interrupted.
    """


def main() -> None:
    """The ``imgpack`` script. The process ends when the command does: what start-up
    built is frozen out of the garbage collector's last pass (``gc.freeze``), so the exit
    does not trace every object of the imported libraries (about 20 ms of a build's).

    Interrupted (exit 130), it exits 130 whatever the timing: SIGINT and SIGTERM stay
    ignored from the interrupt on (:func:`packer.cli.output.handle_errors`), and
    CPython's note of an interrupt it thinks nobody caught is cleared (below)."""
    from . import output

    output.process_entry = True
    try:
        cli(prog_name="imgpack")
    except SystemExit as e:
        if e.code == output.EXIT_INTERRUPTED:
            # A KeyboardInterrupt that ends a string exec/eval (dataclasses, namedtuple
            # and typing make their methods so, at import: the interrupt often lands in
            # one) sets a process-wide flag that handle_errors catching it does not
            # clear; under `python -m packer` the interpreter then ends by SIGINT after
            # the exit (return code -2, not 130). The next string exec clears it, and
            # no interrupt can set it again: its signals are ignored now.
            exec("pass")  # a constant: clears the flag (see above)
        raise
    finally:
        gc.freeze()
