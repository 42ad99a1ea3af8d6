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
    save_png(plt, fig, Path(path))


def save_png(plt: Any, fig: Any, path: Path, layout: bool = True) -> Path:
    """Write under a temporary name, then rename: a PNG at ``path`` is always whole."""
    import os

    if layout:
        fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, format="png")
    plt.close(fig)
    os.replace(tmp, path)
    return path
