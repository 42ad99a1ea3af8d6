"""Charts (matplotlib, imported only when a plot is asked for)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_verify(report: Any, path: Path) -> None:
    """Bar chart of images/s: the pack vs. the source folder, device in the title."""
    plt = _plt()
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
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
