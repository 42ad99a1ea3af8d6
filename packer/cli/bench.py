"""``imgpack bench``: measure what imgpack is built on, on this machine."""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from pathlib import Path

import click

from ..measure.bench import SECTIONS
from .options import check_output, device_option, json_option, quiet_option, workers_option
from .output import emit_json, handle_errors, run_with_bar, sigterm_as_interrupt


@click.command()
@device_option("auto (CUDA if present), cpu, cuda, cuda:N.")
@click.option(
    "--quick",
    is_flag=True,
    help="A reduced grid: well under a minute on a CPU (for a first look, and CI).",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="Folder for the plots, results.md and results.json [default: ./imgpack-bench-DATE-TIME].",
)
@click.option(
    "--source",
    type=click.Path(path_type=Path),
    default=None,
    help="Measure loading on an even sample of your own images instead of synthetic ones.",
)
@click.option(
    "--only",
    default=",".join(SECTIONS),
    show_default=True,
    help="Comma-separated experiments to run.",
)
@workers_option(
    "DataLoader workers and build/compress processes [default: min(16, cores); 2 with --quick]."
)
@json_option("Print one JSON object with every point.")
@quiet_option()
@handle_errors
@sigterm_as_interrupt
def bench(
    device: str,
    quick: bool,
    out: Path | None,
    source: Path | None,
    only: str,
    workers: int | None,
    as_json: bool,
    quiet: bool,
) -> None:
    """Measure, on this machine, what imgpack is built on; write plots and tables.

    \b
    1. transfer  uint8 vs float16 vs float32 batches to the device, pinned vs
                 pageable memory, x.cuda().half() vs x.half().cuda(), over
                 batch sizes 8-256 and images of 384x384, 640x480, 1280x960.
                 CUDA only (on the CPU a copy crosses no bus).
    2. loading   the JPEG folder (ImageFolder + Pillow), the same folder after
                 `imgpack compress`, the pack on the CPU, the pack streamed to
                 the device: images/s over batch sizes.
    3. training  ResNet-18 (bf16 autocast) fed by each loader, against
                 batches already on the GPU. CUDA only.

    Synthetic photo-like JPEGs are made in a temporary folder (removed at the
    end), or an even sample of --source. Medians of repeats after warm-up,
    with the device synchronized before every clock read. The full grid says
    how long it expects to take before it starts.

    \b
    Examples:
      imgpack bench --quick                       # a first look, under a minute
      imgpack bench --device cuda --out bench/    # the full grid, with plots
      imgpack bench --only loading --source ~/data/train --json > loading.json
    """
    from ..measure.bench import (
        BenchConfig,
        count_points,
        estimate_seconds,
        run_bench,
        to_markdown,
        write_results,
    )
    from ..measure.timing import resolve_device

    sections = tuple(s.strip() for s in only.split(",") if s.strip())
    config = BenchConfig(
        device=device, quick=quick, source=source, workers=workers, sections=sections
    )
    config.validate()
    if out is None:
        out = Path(time.strftime("imgpack-bench-%Y%m%d-%H%M%S"))
    check_output(out, "--out", folder=True)
    from ..measure.bench.report import check_out_folder

    check_out_folder(out, "--out")
    # the one place the name becomes a torch.device; the library takes it as it is
    config = dataclasses.replace(config, device=resolve_device(device, "BenchConfig.device"))
    if not quiet:
        cuda = config.device.type == "cuda"
        est = estimate_seconds(config, os.cpu_count() or 1, cuda)
        took = f"{est / 60:.0f} min" if est > 90 else f"{est:.0f} s"
        click.echo(
            f"imgpack bench{' --quick' if quick else ''} on {config.device}: "
            f"{count_points(config, cuda)} points, expected to take about {took}",
            err=True,
        )
    # an interrupt ends in handle_errors: no partial results, a bench is rerun, not resumed
    result = run_with_bar("bench", quiet, as_json, functools.partial(run_bench, config), unit="pt")
    r = result.to_json()
    files = [str(p) for p in write_results(r, out)]
    if as_json:
        emit_json({**r, "files": files})
    else:
        click.echo(to_markdown(r))
        if not quiet:
            click.echo(f"Wrote {', '.join(files)}", err=True)
