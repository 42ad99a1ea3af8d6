"""The charts of ``imgpack bench``: one PNG per experiment (matplotlib, imported only
when a plot is asked for)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..plots import pyplot, save_png


def _batch_axis(ax: Any, points: list[dict[str, Any]]) -> None:
    from matplotlib.ticker import NullLocator

    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({p["batch"] for p in points}))
    ax.set_xticklabels([str(b) for b in sorted({p["batch"] for p in points})])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("batch size (images)")


def _title(ax: Any, what: str, r: dict[str, Any]) -> None:
    ax.set_title(
        f"{what}\n{r['device_name']} ({r['device']}), {r['machine']['cores']} cores, "
        f"{r['machine']['date']}",
        fontsize=9,
    )


def _series(points: list[dict[str, Any]], x: str, y: str, **where: Any) -> dict[str, tuple]:
    out: dict[str, tuple[list[Any], list[Any]]] = {}
    for p in points:
        if all(p[k] == v for k, v in where.items()):
            xs, ys = out.setdefault(p["series"] if "series" in p else p["loader"], ([], []))
            xs.append(p[x])
            ys.append(p[y])
    return out


def plot_bench(r: dict[str, Any], out: Path) -> list[Path]:
    """One PNG per experiment of an ``imgpack bench`` result (its ``to_json()``); returns the paths."""
    plt = pyplot()
    written = []
    images = sorted(
        {p["image"] for p in r["transfer"] + r["conversion"]},
        key=lambda s: int(s.split("x")[0]) * int(s.split("x")[1]),
    )
    for key, what, ylab, y in (
        ("transfer", "host -> device copy of one batch", "images/s", "images_per_s"),
        (
            "conversion",
            "uint8 batch -> float on the device: where to convert",
            "ms per batch",
            "ms",
        ),
    ):
        if not r[key]:
            continue
        fig, axes = plt.subplots(
            1, len(images), figsize=(4.2 * len(images), 4), dpi=110, squeeze=False
        )
        # one colour per dtype; dashed: pageable memory, or converted on the host
        dashed = {
            p["series"] for p in r[key] if p.get("pinned") is False or p.get("convert_on") == "host"
        }
        colour = {"uint8": "#2a7ab0", "float16": "#b0572a", "float32": "#4a9a4a"}
        dtype_of = {p["series"]: p.get("dtype", p.get("to")) for p in r[key]}
        for ax, image in zip(axes[0], images):
            for name, (xs, ys) in _series(r[key], "batch", y, image=image).items():
                ax.plot(
                    xs,
                    ys,
                    marker="o",
                    label=name,
                    color=colour.get(dtype_of[name]),
                    linestyle="--" if name in dashed else "-",
                )
            _batch_axis(ax, r[key])
            ax.set_yscale("log")
            ax.set_ylabel(ylab)
            ax.grid(True, which="both", alpha=0.3)
            ax.set_title(f"{image} images", fontsize=9)
        m = r["machine"]
        fig.suptitle(
            f"{what}: {r['device_name']} ({r['device']}), {m['cores']} cores, {m['date']}",
            fontsize=10,
        )
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)), fontsize=8)
        fig.tight_layout(rect=(0, 0.09, 1, 1))
        written.append(save_png(plt, fig, out / f"{key}.png", layout=False))
    if r["loading"]:
        fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
        for name, (xs, ys) in _series(r["loading"], "batch", "images_per_s").items():
            ax.plot(xs, ys, marker="o", label=name)
        _batch_axis(ax, r["loading"])
        ax.set_yscale("log")
        ax.set_ylabel("images/s delivered, normalized, on the device")
        ax.grid(True, which="both", alpha=0.3)
        side = r["dataset"]["pack_image"][1]
        _title(ax, f"loading {r['dataset']['images']} images as {side}x{side} batches", r)
        ax.legend(fontsize=7)
        written.append(save_png(plt, fig, out / "loading.png"))
    if r["training"]:
        fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
        names = [p["loader"].replace(" (", "\n(") for p in r["training"]]
        rates = [p["images_per_s"] for p in r["training"]]
        bars = ax.barh(names[::-1], rates[::-1], color="#2a7ab0")
        ax.bar_label(
            bars,
            labels=[
                f"{v:,.0f} ({p['of_ceiling']:.0%})"
                for v, p in zip(rates[::-1], r["training"][::-1])
            ],
            fontsize=8,
        )
        ax.set_xlabel("training images/s (ResNet-18, bf16 autocast)")
        ax.tick_params(axis="y", labelsize=7)
        ax.set_xlim(0, max(rates) * 1.3)
        _title(ax, f"training, batch {r['training'][0]['batch']}", r)
        written.append(save_png(plt, fig, out / "training.png"))
    return written
