"""``imgpack compress``: recompress a folder of images to smaller JPEGs."""

from __future__ import annotations

import functools
from pathlib import Path

import click

from .options import QualityHint, json_option, quiet_option, workers_option
from .output import handle_errors, human_bytes, report, run_with_bar, sigterm_as_interrupt


@click.command(cls=QualityHint)
@click.argument("src", type=click.Path(path_type=Path))
@click.argument("dst", type=click.Path(path_type=Path))
@click.option(
    "-Q",
    "--quality",
    type=int,
    default=3,
    show_default=True,
    help="ffmpeg -q:v: 2 (best, largest) to 31 (worst, smallest).",
)
@click.option(
    "--max-side",
    type=int,
    default=None,
    help="Shrink images whose longer side exceeds PX to PX (aspect kept, never enlarged).",
)
@workers_option("ffmpeg processes at once [default: all cores].")
@click.option("--overwrite", is_flag=True, help="Redo every output, even those already done.")
@click.option("--strict", is_flag=True, help="Exit 1 if any image was skipped.")
@json_option()
@click.option(
    "--max-pixels",
    type=click.IntRange(1),
    default=100_000_000,
    show_default=True,
    help="Skip images larger than this (decompression-bomb guard).",
)
@quiet_option("No progress bar or summary.")
@handle_errors
@sigterm_as_interrupt
def compress(
    src: Path,
    dst: Path,
    quality: int,
    max_side: int | None,
    workers: int | None,
    max_pixels: int,
    overwrite: bool,
    strict: bool,
    as_json: bool,
    quiet: bool,
) -> None:
    """Recompress every image under SRC to JPEG in DST, keeping the folder structure.

    Each image becomes DST/<same path>.jpg at ffmpeg quality -q:v Q, upright
    (EXIF orientation applied) and RGB. Outputs already in DST made with the same
    options are already done and kept, so an interrupted run resumes (outputs
    made with another -Q or --max-side are redone); a corrupt input is skipped
    and listed. The
    ffmpeg binary comes with the imageio-ffmpeg wheel (IMGPACK_FFMPEG overrides).

    \b
    Examples:
      imgpack compress photos/ small/                      # -q:v 3, the default
      imgpack compress photos/ small/ -Q 5 --max-side 1024
      imgpack compress photos/ small/ --json > report.json
    """
    from ..compress import CompressConfig
    from ..compress import compress as compress_tree

    config = CompressConfig(
        quality=quality,
        max_side=max_side,
        workers=workers,
        overwrite=overwrite,
        max_pixels=max_pixels,
    )
    result = run_with_bar(
        "compress", quiet, as_json, functools.partial(compress_tree, src, dst, config)
    )
    ratio = result.bytes_in / result.bytes_out if result.bytes_out else 0.0
    summary = (
        f"Wrote {result.written}, {result.already_done} already done, "
        f"{len(result.skipped_inputs)} skipped (bad input); {human_bytes(result.bytes_in)} -> "
        f"{human_bytes(result.bytes_out)} ({ratio:.1f}x smaller) in {result.seconds:.1f} s"
    )
    skipped = result.skipped_inputs
    report(result, summary, skipped=skipped, as_json=as_json, quiet=quiet, strict=strict)
