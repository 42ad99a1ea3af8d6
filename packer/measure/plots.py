"""verify's chart, and the two helpers every chart uses (matplotlib, imported only
when a plot is asked for). The bench's charts are in :mod:`packer.measure.bench.plots`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_verify(report: Any, path: Path) -> None:
    """Bar chart of images/s: the pack vs. the source folder, device in the title."""
    plt = pyplot()
    names, rates = ["pack\n(PackLoader)"], [report.pack_images_per_s]
    if report.folder_images_per_s:
        names.append("folder\n(ImageFolder + PIL)")
        rates.append(report.folder_images_per_s)
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    bars = ax.bar(names, rates, color=["#2a7ab0", "#b0572a"][: len(rates)])
    ax.bar_label(bars, labels=[f"{r:,.0f}" for r in rates])
    ax.set_ylabel("throughput (images/s)")
    speed = f", {report.speedup:.1f}x faster" if report.speedup else ""
    ax.set_title(f"imgpack verify on {report.device}{speed}\n{time.strftime('%Y-%m-%d')}")
    save_png(plt, fig, Path(path), option="the plot")


def check_output_file(path: Path, option: str) -> None:
    """The one check of every output file imgpack renames into place (``ShowConfig.out``,
    verify's plot and trace): nothing there, or a regular file (replaced). ``option``
    names the file in a message: a config field (the error's ``field``) or a few words.
    A FIFO, a device, a socket, a folder or a symbolic link (even to a regular file) is
    refused with a UsageError, never renamed over. Run before any work, and again just
    before the rename."""
    import os
    import stat

    from ..errors import UsageError

    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return  # nothing there (a parent that is no folder is the parent check's to say)
    except OSError as e:
        raise UsageError(
            f"{path}: {option} cannot be checked ({e.strerror})", field=_field(option)
        ) from None
    if stat.S_ISREG(mode):
        return
    kind = (
        "a folder"
        if stat.S_ISDIR(mode)
        else "a symbolic link"
        if stat.S_ISLNK(mode)
        else "a FIFO"
        if stat.S_ISFIFO(mode)
        else "a device"
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
        else "a socket"
        if stat.S_ISSOCK(mode)
        else "not a regular file"
    )
    raise UsageError(
        f"{path}: {option} exists and is {kind}, not a regular file; imgpack replaces only "
        "regular files: choose another path",
        field=_field(option),
    )


def _field(option: str) -> str | None:
    """``option`` when it names a config field (``ShowConfig.out``), else None."""
    from ..errors import FIELD_RE

    return option if FIELD_RE.fullmatch(option) else None


def save_png(plt: Any, fig: Any, path: Path, layout: bool = True, option: str = "PNG") -> Path:
    """Write under a temporary name, then rename: a PNG at ``path`` is always whole.
    What is at ``path`` must be a regular file or nothing (:func:`check_output_file`)."""
    import os

    if layout:
        fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fig.savefig(tmp, format="png")
        plt.close(fig)
        check_output_file(path, option)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
