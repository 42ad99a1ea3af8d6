"""A bench result (``BenchResult.to_json()``) as Markdown tables, and the files of a run:
plots, ``results.md``, ``results.json``, each written whole or not at all."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


# Every name write_results can leave in --out (the plots, the tables, their temporary names)
OUTPUTS = frozenset(
    [f"{k}.png" for k in ("transfer", "conversion", "loading", "training")]
    + ["results.md", "results.json", ".results.md.tmp", "results.json.tmp"]
)


def check_out_folder(out: Path, option: str = "the results folder") -> None:
    """Refuse, before any work, an ``out`` folder holding anything but a previous
    bench's results: those are replaced, a user's own ``results.md`` never is.
    ``option`` names the folder in a message (the CLI passes its flag)."""
    from ...errors import UsageError

    if not out.is_dir():
        return
    try:
        foreign = sorted(e.name for e in os.scandir(out) if e.name not in OUTPUTS)
    except OSError as e:
        raise UsageError(f"{out}: {option} cannot be read ({e.strerror})") from None
    if foreign:
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise UsageError(
            f"{out}: {option} holds files that are not a previous bench's results ({shown}); "
            "choose a new or empty folder"
        )


def write_results(r: dict[str, Any], out: Path) -> list[Path]:
    """Write the plots, ``results.md`` and ``results.json`` of a result (its
    ``to_json()``) into the folder ``out`` (made if needed), each file whole or absent."""
    from ..._fs import write_atomic
    from ...pack.files import write_json_atomic
    from .plots import plot_bench

    out.mkdir(parents=True, exist_ok=True)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        log.warning("no plots: matplotlib is not installed (pip install 'imgpack[plot]')")
        files = []
    else:
        files = plot_bench(r, out)
    md = out / "results.md"
    write_atomic(md, (to_markdown(r) + "\n").encode("utf-8"), tmp=out / ".results.md.tmp")
    write_json_atomic(out / "results.json", r, indent=1)
    return [*files, md, out / "results.json"]


def _pivot(
    points: list[dict[str, Any]], row: str, col: str, val: str, fmt: Callable[[Any], str]
) -> list[str]:
    rows = list(dict.fromkeys(p[row] for p in points))
    cols = list(dict.fromkeys(p[col] for p in points))
    cell = {(p[row], p[col]): p[val] for p in points}
    lines = [f"| {row} | " + " | ".join(str(c) for c in cols) + " |", "|---|" + "---:|" * len(cols)]
    for r in rows:
        lines.append(
            f"| {r} | "
            + " | ".join(fmt(cell[r, c]) if (r, c) in cell else "-" for c in cols)
            + " |"
        )
    return lines


def to_markdown(r: dict[str, Any]) -> str:
    """The result (``BenchResult.to_json()``) as Markdown tables."""
    m = r["machine"]
    out = [
        f"# imgpack bench{' --quick' if r['quick'] else ''}",
        "",
        f"{r['device_name']} ({r['device']}), {m['cores']} cores, torch {m['torch']}, "
        f"{m['date']}; {r['seconds']:.0f} s. Medians of repeats after warm-up (transfer "
        f"{r['grid']['repeats']}, loading {r['grid']['load_repeats']}, training "
        f"{r['grid']['train_repeats']}), device synchronized before each clock read.",
        "",
    ]
    for image in dict.fromkeys(p["image"] for p in r["transfer"]):
        pts = [
            dict(p, cell=f"{p['images_per_s']:,.0f} ({p['gb_per_s']:.1f})")
            for p in r["transfer"]
            if p["image"] == image
        ]
        out += [f"## Transfer, {image} images: images/s (GB/s) by batch size", ""]
        out += _pivot(pts, "series", "batch", "cell", str)
        out.append("")
    for image in dict.fromkeys(p["image"] for p in r["conversion"]):
        pts = [p for p in r["conversion"] if p["image"] == image]
        out += [f"## Where to convert, {image} uint8 -> float: ms per batch", ""]
        out += _pivot(pts, "series", "batch", "ms", lambda v: f"{v:.3f}")
        out.append("")
    if r["loading"]:
        d = r["dataset"]
        sizes = [f"original {d['original_bytes'] / d['images'] / 1e3:,.0f} KB/image"]
        if "compressed_bytes" in d:
            sizes.append(
                f"compressed (-q:v {d['compress_quality']}) "
                f"{d['compressed_bytes'] / d['images'] / 1e3:,.0f} KB/image"
            )
        sizes.append(f"pack {d['pack_bytes'] / d['images'] / 1e3:,.0f} KB/image")
        out += [
            "## Loading: images/s on the device, normalized, by batch size",
            "",
            f"{d['images']} images, {d['kind']}; " + ", ".join(sizes) + ".",
            "",
        ]
        out += _pivot(r["loading"], "loader", "batch", "images_per_s", lambda v: f"{v:,.0f}")
        out.append("")
    if r["training"]:
        out += [
            f"## Training: ResNet-18, bf16 autocast, batch {r['training'][0]['batch']}",
            "",
            "| fed by | images/s | of the ceiling |",
            "|---|---:|---:|",
        ]
        out += [
            f"| {p['loader']} | {p['images_per_s']:,.0f} | {p['of_ceiling']:.1%} |"
            for p in r["training"]
        ]
        out.append("")
    if r["skipped"]:
        out += ["## Not measured", ""]
        out += [f"- {s['section']}: {s['what']}: {s['reason']}" for s in r["skipped"]]
        out.append("")
    return "\n".join(out)
