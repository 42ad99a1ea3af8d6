"""The ``imgpack`` command: parse options, call the library, format the result.

Exit codes: 0 success; 1 the work ran but found a problem (verify failed,
inputs were skipped under --strict, no input was usable, a worker died);
2 bad usage or input the command cannot start on (also an unwritable
destination); 130 interrupted (Ctrl-C or SIGTERM), with the work done so far kept.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ._version import __version__
from .errors import PackerError, UsageError
from .measure.bench import SECTIONS

EXIT_OK, EXIT_PROBLEM, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def _emit_json(obj: Any) -> None:
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

    An interrupt (Ctrl-C, or SIGTERM under :func:`sigterm_as_interrupt`) exits 130
    with what it left for this command (:data:`INTERRUPTED`).
    """
    left = INTERRUPTED.get(fn.__name__, "Nothing was changed.")

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except PackerError as e:
            click.echo(f"Error: {e}", err=True)
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


class _Bar:
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

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _run_with_bar(
    desc: str, quiet: bool, as_json: bool, run: Callable[..., Any], unit: str = "img"
) -> Any:
    """Run a library call that reports ``on_start``/``progress``, drawing a tqdm bar on stderr."""
    _setup_logging(quiet or as_json)
    bar = _Bar(desc, unit, quiet)
    try:
        return run(progress=bar.update, on_start=bar.start)
    finally:
        bar.close()


def _setup_logging(quiet: bool) -> None:
    logging.basicConfig(
        level=logging.WARNING if quiet else logging.INFO, format="%(message)s", stream=sys.stderr
    )


def _human_bytes(n: float) -> str:
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
        _emit_json(result.to_json())
    elif not quiet:
        _print_skips(skipped)
        click.echo(summary, err=True)
    if strict and skipped:
        sys.exit(EXIT_PROBLEM)


# Options shared by several commands, declared once (sqlite-utils' manner).


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
            return super().parse_args(ctx, args)
        except click.UsageError:
            found = _number_after_quiet(given)
            if found is None:
                raise
            what, number = found
            raise click.UsageError(
                f"{what}. Quality is --quality/-Q (e.g. -Q {number}); -q means --quiet.", ctx
            ) from None


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


def _parse_size(ctx: click.Context, param: click.Parameter, value: str) -> tuple[int, int]:
    from .imaging.decode import parse_size

    try:
        return parse_size(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
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


@cli.command(cls=QualityHint)
@click.argument("src", type=click.Path(path_type=Path))
@click.argument("dst", type=click.Path(path_type=Path))
@click.option(
    "--size",
    default="224",
    show_default=True,
    callback=_parse_size,
    help="Output size: S for S×S, or WxH (width x height), in pixels. torchvision's "
    "ImageNet recipe (RandomResizedCrop(224) to train, Resize(256) + CenterCrop(224) to "
    "validate) needs --size 256, cropped to 224 by the loader's transforms; 224 suits "
    "models fed the stored images as they are.",
)
@click.option(
    "--resize",
    type=click.Choice(["crop", "stretch", "pad"]),
    default="crop",
    show_default=True,
    help="crop: scale the shorter side, take the centre. stretch: ignore aspect. "
    "pad: scale the longer side, letterbox with black.",
)
@workers_option("Decoding processes [default: all cores].")
@click.option(
    "--max-pixels",
    type=click.IntRange(1),
    default=100_000_000,
    show_default=True,
    help="Skip images larger than this (decompression-bomb guard).",
)
@click.option("--overwrite", is_flag=True, help="Replace an existing pack at DST.")
@click.option("--strict", is_flag=True, help="Exit 1 if any image was skipped.")
@json_option()
@quiet_option()
@click.option(
    "--classes",
    "class_map",
    type=click.Path(path_type=Path),
    default=None,
    help="Fix the class -> index map: a text file (one class name per line, in index "
    "order) or an existing pack, whose map is reused.",
)
@click.option(
    "--allow-new-classes",
    is_flag=True,
    help="Append classes missing from the --classes map at the end instead of refusing them.",
)
@click.option(
    "--labels",
    "labels_table",
    type=click.Path(path_type=Path),
    default=None,
    help="Labels from a table (.csv, .tsv, .parquet) with a 'path' column (relative to "
    "SRC) and a 'label' column (class names or integers), instead of class folders.",
)
@click.option(
    "--targets",
    default=None,
    help="Comma-separated numeric columns of the --labels table, stored as a float32 "
    "targets [N, K] field.",
)
@click.option(
    "--store",
    type=click.Choice(["raw", "jpeg"]),
    default="raw",
    show_default=True,
    help="raw: decoded uint8 rows of --size (a crop keeps only the centre). jpeg: each "
    "image's JPEG file (whole image, decoded and cropped in batches when read; --size is "
    "then unused): for RandomResizedCrop over the whole image, as torchvision trains.",
)
@click.option(
    "--quality",
    "-Q",
    type=click.IntRange(2, 31),
    default=3,
    show_default=True,
    help="--store jpeg: quality of re-encoded inputs (non-JPEG, CMYK, EXIF-rotated, "
    "over --max-side), compress's scale: 2 best .. 31 worst (Pillow quality 100-3*Q).",
)
@click.option(
    "--max-side",
    type=click.IntRange(1),
    default=None,
    help="--store jpeg: longest stored side in pixels; larger images are scaled down "
    "and re-encoded.",
)
@device_option(
    "cpu: decode in worker processes (bit-exact, the default). cuda: JPEGs decoded and "
    "resized on the GPU in batches, other inputs on the CPU workers (pixels within the "
    "tolerance in docs). auto: cuda when present.",
    default="cpu",
)
@handle_errors
@sigterm_as_interrupt
def build(
    src: Path,
    dst: Path,
    size: tuple[int, int],
    resize: str,
    workers: int | None,
    max_pixels: int,
    overwrite: bool,
    strict: bool,
    as_json: bool,
    quiet: bool,
    class_map: Path | None,
    allow_new_classes: bool,
    labels_table: Path | None,
    targets: str | None,
    store: str,
    quality: int,
    max_side: int | None,
    device: str,
) -> None:
    """Decode and resize every image under SRC into a pack at DST.

    SRC is an ImageFolder tree (one subfolder per class; labels are the sorted
    folder indices, as torchvision's ImageFolder assigns them) or a flat folder
    of images (labels -1). --classes fixes the indices instead, so a val split
    missing a class keeps train's: build every split after the first with
    --classes FIRST_PACK. --labels takes the labels from a table; its
    rows whose file is missing are skipped, images it does not list are ignored.
    Images that cannot be decoded are skipped and listed.
    An interrupted build resumes when the same command is run again.

    \b
    Examples:
      imgpack build ./imgs ./tensors
      imgpack build ./train ./train_pack --size 256      # RandomResizedCrop(224) later
      imgpack build ./train ./train_jpeg --store jpeg    # crops over the whole image
      imgpack build ./imgs ./tensors --size 320x240 --resize pad --workers 8
      imgpack build ./imgs ./tensors --overwrite --json > build.json
      imgpack build ./val ./val_pack --classes ./train_pack
      imgpack build ./imgs ./tensors --labels labels.csv --targets age,score
      imgpack build ./small ./jpeg_pack --store jpeg --max-side 512
      imgpack build ./small ./tensors --device cuda
    """
    from .build.run import BuildConfig
    from .build.run import build as build_pack
    from .build.workdir import refuse_symlink_destination

    refuse_symlink_destination(dst)  # before the scan; build() checks again under its lock
    config = BuildConfig(
        size=size,
        resize=resize,
        workers=workers,
        overwrite=overwrite,
        max_pixels=max_pixels,
        classes=class_map,
        allow_new_classes=allow_new_classes,
        labels=labels_table,
        targets=tuple(c.strip() for c in targets.split(",")) if targets is not None else (),
        store=store,
        quality=quality,
        max_side=max_side,
        device=device,
    )
    result = _run_with_bar("build", quiet, as_json, functools.partial(build_pack, src, dst, config))
    if result.storage == "jpeg":  # each image keeps its own size: say the largest
        h, w = result.image_shape[1:]
        what = f"JPEG images (their own sizes, up to {w} wide x {h} high; decoded when read)"
    else:
        what = f"images of {'x'.join(map(str, result.image_shape))}"
    summary = (
        f"Packed {result.count} {what} into {dst} in {result.seconds:.1f} s"
        + (f" ({len(result.skipped)} skipped, bad input)" if result.skipped else "")
        + (f" ({result.ignored} not in {labels_table}: ignored)" if labels_table else "")
        + (f" (resumed: {result.resumed} already done)" if result.resumed else "")
    )
    if result.new_classes:
        summary += f"\nAppended to the class map: {', '.join(result.new_classes)}"
    inferred = {"folders": f"the folders of {src}", "labels": f"the label names in {labels_table}"}
    if result.classes_from in inferred and not quiet:
        # labels are indices into a map sorted from what this SRC holds: a split missing
        # a class shifts the rest, so say where the map came from and how to pin it
        note = (
            f"classes: {len(result.classes)} inferred from {inferred[result.classes_from]}; "
            "for a split that must match another pack's labels, pass --classes TRAIN_PACK"
        )
        if as_json:
            click.echo(note, err=True)  # stdout holds the JSON alone
        else:
            summary += f"\n{note}"
    report(result, summary, skipped=result.skipped, as_json=as_json, quiet=quiet, strict=strict)


def _parse_fractions(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in text.split(","))
    except ValueError:
        raise UsageError(
            f"--split {text!r}: give fractions separated by commas that sum to 1, e.g. 0.9,0.1"
        ) from None


@cli.command()
@click.argument("pack", type=click.Path(path_type=Path))
@click.option(
    "--split",
    "split_text",
    metavar="F1,F2,...",
    help="Also show the class histogram of each part of packer.split(PACK, fractions, "
    "seed) (stratified by label), e.g. 0.9,0.1.",
)
@click.option("--seed", type=int, default=None, help="Seed of --split (default 0).")
@json_option()
@handle_errors
def info(pack: Path, split_text: str | None, seed: int | None, as_json: bool) -> None:
    """Show what a pack holds: count, shape, class map, targets, size on disk, build options.

    With --split, also each part's size and class histogram, as packer.split
    cuts it (the same seed gives the same parts in Python).

    \b
    Examples:
      imgpack info ./tensors
      imgpack info ./tensors --json | jq .class_counts
      imgpack info ./tensors --split 0.9,0.1 --seed 1
    """
    from .pack.format import describe

    if seed is not None and split_text is None:
        raise UsageError("--seed is the seed of --split; give --split too, e.g. --split 0.9,0.1")
    fractions = _parse_fractions(split_text) if split_text is not None else None
    out = describe(pack)
    splits = None
    if fractions is not None:
        from .loading.dataset import class_histogram, split
        from .pack.reader import open_pack

        try:
            opened = open_pack(pack)  # once: the split and every histogram read it
            parts = split(opened, fractions, seed=seed or 0, stratify=True)
        except UsageError as e:
            raise UsageError(f"--split {split_text}: {e}") from None
        splits = [
            {"fraction": f, "count": len(part), "class_counts": class_histogram(opened, part)}
            for f, part in zip(fractions, parts)
        ]
    if as_json:
        if splits is not None:
            out["splits"] = splits
        _emit_json(out)
        return
    c, h, w = out["image_shape"]
    b = out["build"]
    click.echo(f"pack      {pack}")
    if out.get("storage") == "jpeg":
        click.echo(f"images    {out['count']} JPEG files, up to {h}x{w} (decoded when read)")
    else:
        click.echo(f"images    {out['count']} x {c}x{h}x{w} uint8 ({b['resize']})")
    click.echo(f"on disk   {_human_bytes(out['bytes'])}")
    if b.get("labels_table"):
        click.echo(
            f"labels    from {b['labels_table']} ({b.get('unlisted', 0)} images under the "
            "source had no row: ignored)"
        )
    if out["classes"]:
        click.echo(f"classes   {len(out['classes'])} (index, images, name)")
        for name, idx in out["class_to_idx"].items():
            click.echo(f"  {idx:>4}  {out['class_counts'][name]:>8}  {name}")
    elif b.get("labels_table"):
        click.echo("classes   none (integer labels from the table; -1 = no label)")
    else:
        click.echo("classes   none (flat folder; labels are -1)")
    t = out["targets"]
    if t:
        click.echo(f"targets   {t['dtype']} {t['shape']}: {', '.join(t['names'])}")
    click.echo(
        f"built     from {b.get('source_root')} at {b.get('created')} "
        f"(imgpack {b.get('imgpack_version')}, format {out['format_version']})"
    )
    click.echo(f"skipped   {len(out['skipped'])}")
    for s in out["skipped"][:20]:
        click.echo(f"  {s['path']}: {s['reason']}")
    if splits is not None:
        click.echo(f"split     {split_text} (seed {seed or 0}, stratified by label)")
        for k, part in enumerate(splits, 1):
            click.echo(f"  part {k}  {part['fraction']:g}: {part['count']} images (images, label)")
            for name, count in part["class_counts"].items():
                click.echo(f"    {count:>8}  {name}")


@cli.command(cls=QualityHint)
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
    from .compress import CompressConfig
    from .compress import compress as compress_tree

    config = CompressConfig(
        quality=quality,
        max_side=max_side,
        workers=workers,
        overwrite=overwrite,
        max_pixels=max_pixels,
    )
    result = _run_with_bar(
        "compress", quiet, as_json, functools.partial(compress_tree, src, dst, config)
    )
    ratio = result.bytes_in / result.bytes_out if result.bytes_out else 0.0
    summary = (
        f"Wrote {result.written}, {result.already_done} already done, "
        f"{len(result.skipped_inputs)} skipped (bad input); {_human_bytes(result.bytes_in)} -> "
        f"{_human_bytes(result.bytes_out)} ({ratio:.1f}x smaller) in {result.seconds:.1f} s"
    )
    skipped = result.skipped_inputs
    report(result, summary, skipped=skipped, as_json=as_json, quiet=quiet, strict=strict)


def _check_output(path: Path, option: str, folder: bool = False) -> None:
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
        parent = path.parent
        if not parent.exists():
            raise UsageError(f"{parent}: no such folder for {option}; create it first")
    if not parent.is_dir():
        raise UsageError(f"{parent}: is a file, so {option} {path} cannot be written under it")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{parent}: not writable, so {option} {path} cannot be written")


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


@cli.command()
@click.argument("pack", type=click.Path(path_type=Path))
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
    pack: Path,
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
    """
    from .measure.verify import VerifyConfig
    from .measure.verify import verify as verify_pack

    if plot is not None:
        _check_output(plot, "--plot")
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError("--plot needs matplotlib: pip install 'imgpack[plot]'") from None
    if trace is not None:
        _check_output(trace, "--trace")
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
    report = _run_with_bar(
        "verify", quiet, as_json, functools.partial(verify_pack, pack, config, trace=trace)
    )
    if plot is not None and report.pack_images_per_s:
        from .measure.plots import plot_verify

        plot_verify(report, plot)
    if as_json:
        _emit_json(report.to_json())
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
        click.echo("\nOK" if report.ok else "\nFAILED", err=not report.ok)
    sys.exit(EXIT_OK if report.ok else EXIT_PROBLEM)


@cli.command()
@click.argument("pack", type=click.Path(path_type=Path))
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    required=True,
    help="The PNG to write (written whole: a temporary name, then renamed).",
)
@click.option("--per-class", type=click.IntRange(1), default=4, show_default=True)
@click.option(
    "--max-classes",
    type=click.IntRange(1),
    default=20,
    show_default=True,
    help="Show the first N classes only.",
)
@click.option(
    "--augment",
    type=click.Choice(["ta_wide", "ra", "imagenet", "augmix"]),
    default=None,
    help="Show draws of TrivialAugmentWide, RandAugment, AutoAugment('imagenet') or AugMix.",
)
@click.option(
    "--random-erase",
    type=click.FloatRange(0, 1),
    default=0.0,
    help="Show draws of RandomErasing(p=P).",
)
@click.option(
    "--mixup-alpha", type=click.FloatRange(0), default=0.0, help="Show MixUp(alpha=A) draws."
)
@click.option(
    "--cutmix-alpha", type=click.FloatRange(0), default=0.0, help="Show CutMix(alpha=A) draws."
)
@click.option(
    "--draws", type=click.IntRange(1), default=4, show_default=True, help="Draws per image."
)
@click.option(
    "--seed",
    type=int,
    default=None,
    help="Pick each class's images at random with this seed (and seed the draws) "
    "[default: the first of each class, draws seeded by 0].",
)
@json_option()
@handle_errors
def show(
    pack: Path,
    out: Path,
    per_class: int,
    max_classes: int,
    augment: str | None,
    random_erase: float,
    mixup_alpha: float,
    cutmix_alpha: float,
    draws: int,
    seed: int | None,
    as_json: bool,
) -> None:
    """Draw a contact sheet of PACK: --per-class images of each class, with class names.

    Raw and JPEG packs, on the CPU. With --augment, --random-erase, --mixup-alpha or
    --cutmix-alpha, each image is shown as stored next to --draws augmented versions
    (packer.transforms' ops, each image its own draw; a mixer's draws are captioned
    with their two heaviest classes). Needs matplotlib: pip install 'imgpack[plot]'.

    \b
    Examples:
      imgpack show train256/ --out grid.png
      imgpack show train256/ --out ta.png --per-class 1 --augment ta_wide --random-erase 0.25
      imgpack show train256/ --out mix.png --mixup-alpha 0.2 --cutmix-alpha 1.0 --seed 3
    """
    from .measure.show import ShowConfig, show_pack

    _check_output(out, "--out")
    config = ShowConfig(
        pack=pack,
        out=out,
        per_class=per_class,
        max_classes=max_classes,
        augment=augment,
        random_erase=random_erase,
        mixup_alpha=mixup_alpha,
        cutmix_alpha=cutmix_alpha,
        draws=draws,
        seed=seed,
    )
    result = show_pack(config)
    if as_json:
        _emit_json(result.to_json())
    else:
        what = f", {result.draws} draws each" if result.draws else ""
        classes = len(dict.fromkeys(result.classes))
        click.echo(
            f"Wrote {out}: {result.images} images of {classes} classes{what} "
            f"({result.width}x{result.height} px)"
        )


@cli.command()
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
    from .measure.bench import (
        BenchConfig,
        count_points,
        estimate_seconds,
        run_bench,
        to_markdown,
        write_results,
    )
    from .measure.timing import resolve_device

    sections = tuple(s.strip() for s in only.split(",") if s.strip())
    config = BenchConfig(
        device=device, quick=quick, source=source, workers=workers, sections=sections
    )
    config.validate()
    if out is None:
        out = Path(time.strftime("imgpack-bench-%Y%m%d-%H%M%S"))
    _check_output(out, "--out", folder=True)
    from .measure.bench.report import check_out_folder

    check_out_folder(out)
    # the one place the name becomes a torch.device; the library takes it as it is
    config = dataclasses.replace(config, device=resolve_device(device))
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
    result = _run_with_bar("bench", quiet, as_json, functools.partial(run_bench, config), unit="pt")
    r = result.to_json()
    files = [str(p) for p in write_results(r, out)]
    if as_json:
        _emit_json({**r, "files": files})
    else:
        click.echo(to_markdown(r))
        if not quiet:
            click.echo(f"Wrote {', '.join(files)}", err=True)


def main() -> None:
    cli(prog_name="imgpack")
