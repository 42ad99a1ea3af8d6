"""``imgpack verify``: check a pack's integrity and measure how fast it streams."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import click

from ..errors import UsageError
from .options import check_output, device_option, json_option, quiet_option
from .output import (
    EXIT_OK,
    EXIT_PROBLEM,
    emit_json,
    handle_errors,
    run_with_bar,
    sigterm_as_interrupt,
)


def _parse_sample(ctx: click.Context, param: click.Parameter, value: str) -> int | None:
    if value.lower() == "all":
        return None
    try:
        n = int(value)
    except ValueError:
        raise click.BadParameter(f"must be a number or 'all', not {value!r}") from None
    if n < 0:
        raise click.BadParameter("must be 0 or more")
    return n


@click.command()
@click.argument("pack", type=click.Path())  # a str: an s3:// URL keeps its "//"
@click.option(
    "--source",
    type=click.Path(path_type=Path),
    default=None,
    help="Original image folder [default: the one recorded at build time, if present].",
)
@click.option("--no-source", is_flag=True, help="Skip the source checks and the folder baseline.")
@click.option(
    "--sample",
    default="64",
    show_default=True,
    callback=_parse_sample,
    help="Source images to re-decode and compare, or 'all'.",
)
@device_option("Where to stream: auto (CUDA if present), cpu, cuda, cuda:N.")
@click.option("--batch-size", type=click.IntRange(1), default=64, show_default=True)
@click.option(
    "--batches",
    type=click.IntRange(1),
    default=20,
    show_default=True,
    help="Timed batches per repeat (3 repeats, median).",
)
@click.option("--no-speed", is_flag=True, help="Integrity checks only.")
@click.option(
    "--plot",
    type=click.Path(path_type=Path),
    default=None,
    help="Write a PNG bar chart of the throughput comparison.",
)
@click.option(
    "--trace",
    type=click.Path(path_type=Path),
    default=None,
    help="Write a torch.profiler Chrome trace of a few streamed batches.",
)
@json_option()
@quiet_option()
@handle_errors
@sigterm_as_interrupt
def verify(
    pack: str,
    source: Path | None,
    no_source: bool,
    sample: int | None,
    device: str,
    batch_size: int,
    batches: int,
    no_speed: bool,
    plot: Path | None,
    trace: Path | None,
    as_json: bool,
    quiet: bool,
) -> None:
    """Check that PACK is intact and measure how fast it streams.

    Integrity: manifest, data file sizes, SHA-256 of every block of images,
    labels, and a sample of source images re-decoded and compared pixel for
    pixel. Throughput: the pack through PackLoader vs. the source folder through
    ImageFolder + DataLoader, to the same device, in the same run.
    Exit 0 when every check passes, 1 when one fails, 2 on bad usage.

    \b
    Examples:
      imgpack verify ./tensors                      # uses the recorded source folder
      imgpack verify ./tensors --device cuda --batch-size 256 --plot speed.png
      imgpack verify ./tensors --no-speed --sample all --json
      imgpack verify s3://bucket/train              # downloads and checks every shard
    """
    from ..measure.verify import VerifyConfig
    from ..measure.verify_pack import verify_pack

    if plot is not None:
        check_output(plot, "--plot")
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError("--plot needs matplotlib: pip install 'imgpack[plot]'") from None
    if trace is not None:
        check_output(trace, "--trace")
    config = VerifyConfig(
        source=source,
        use_recorded_source=not no_source,
        sample=sample,
        device=device,
        batch_size=batch_size,
        batches=batches,
        throughput=not no_speed,
    )
    config.validate()
    run = functools.partial(verify_pack, pack, config, trace=trace)
    report = run_with_bar("verify", quiet, as_json, run)
    if plot is not None and report.pack_images_per_s:
        from ..measure.plots import plot_verify

        plot_verify(report, plot)
    if as_json:
        emit_json(report.to_json())
    else:
        for c in report.checks:
            click.echo(f"{'ok  ' if c['ok'] else 'FAIL'}  {c['name']:<9} {c['detail']}")
        j = report.to_json()
        if report.pack_images_per_s:
            click.echo(f"\nthroughput on {report.device}, batch {batch_size}:")
            click.echo(f"  {'loader':<28}{'images/s':>12}{'MB/s':>10}")
            click.echo(
                f"  {'pack (PackLoader)':<28}{j['pack_images_per_s']:>12,.0f}"
                f"{j['pack_mb_per_s']:>10,.0f}"
            )
            if report.folder_images_per_s:
                click.echo(
                    f"  {'folder (ImageFolder+PIL)':<28}{j['folder_images_per_s']:>12,.0f}"
                    f"{j['folder_mb_per_s']:>10,.0f}"
                )
                click.echo(f"  speedup {report.speedup:.1f}x")
            if report.folder_left_out:
                missing = report.folder_left_out - report.folder_skipped
                click.echo(
                    f"  the folder timed the pack's images only: left out "
                    f"{report.folder_skipped} the build skipped, {missing} missing"
                )
            if report.loader_stats is not None:
                from ..loading.stats import LoaderStats

                click.echo(
                    "\nPackLoader.stats() of the timed batches (a loop that only normalizes them):"
                )
                for line in LoaderStats.from_dict(report.loader_stats).summary():
                    click.echo(f"  {line}")
        click.echo("\nOK" if report.ok else "\nFAILED", err=not report.ok)
    sys.exit(EXIT_OK if report.ok else EXIT_PROBLEM)
