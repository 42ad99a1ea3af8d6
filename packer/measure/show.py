"""``imgpack show``: a contact sheet of a pack, optionally with augmented draws.

K images per class (the first K in pack order, or K at random with a seed), each
row a class, straight from the pack (raw or JPEG, decoded on the CPU). With an
augmentation (``--augment``, ``--random-erase``, ``--mixup-alpha``,
``--cutmix-alpha``), each image gets a row of its own: the image as stored, then
``draws`` augmented versions, as torchvision's docs plot its transforms. The ops
are ``packer.transforms``' own, looked up by name when asked for; a mixer's draws
are captioned with their two heaviest classes. matplotlib comes with the ``plot``
extra.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import UsageError
from ..loading.order import batch_seed
from ..pack.kinds import kind_of_pack

# --augment NAME -> (packer.transforms class, its arguments)
AUGMENTS: dict[str, tuple[str, tuple[Any, ...]]] = {
    "ta_wide": ("TrivialAugmentWide", ()),
    "ra": ("RandAugment", ()),
    "imagenet": ("AutoAugment", ("imagenet",)),
    "augmix": ("AugMix", ()),
}
_CELL_IN = 1.4  # inches per image on the sheet
_DPI = 100
# Bounds of the sheet (docs/RELIABILITY.md, "Arguments and outputs, round 4"): 3,000
# draws took 58 s and 1.8 GB for a PNG 420,280 pixels wide.
MAX_DRAWS = 32  # augmented versions per image
MAX_PER_CLASS = 100  # images of each class
MAX_CLASSES = 1000  # classes (rows) on the sheet
MAX_CELLS = 4096  # images on the sheet in all (stored and drawn): at most ~580 MP
MAX_SEED = (1 << 63) - 1  # ShowConfig.seed: 0 to this
MAX_ALPHA = 1000.0  # ShowConfig.mixup_alpha, .cutmix_alpha (the mixers' own bound)
_F = "ShowConfig."  # how messages name a field (the CLI shows its flag: packer.cli.flags)


@dataclass(frozen=True)
class ShowConfig:
    pack: Path
    out: Path
    per_class: int = 4  # images of each class
    max_classes: int = 20  # the first this many classes (a sheet of 1000 rows helps nobody)
    augment: str | None = None  # a key of AUGMENTS
    random_erase: float = 0.0  # RandomErasing's p
    mixup_alpha: float = 0.0  # 0: no MixUp
    cutmix_alpha: float = 0.0  # 0: no CutMix
    draws: int = 4  # augmented versions per image
    seed: int | None = None  # None: the first images of each class; else a seeded choice
    size: int = 224  # JPEG packs: the centre square the draws are made from, resized to this
    # private: the bound on images per sheet (tests pass a small one instead of patching)
    _max_cells: int = field(default=MAX_CELLS, repr=False)

    @property
    def augmented(self) -> bool:
        return bool(self.augment or self.random_erase or self.mixup_alpha or self.cutmix_alpha)

    def validate(self) -> None:
        f = _F
        for name, lo, hi in (
            ("per_class", 1, MAX_PER_CLASS),
            ("max_classes", 1, MAX_CLASSES),
            ("draws", 1, MAX_DRAWS),
            ("size", 8, 1024),
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise UsageError(
                    f"{f}{name} must be an integer in [{lo}, {hi}], not {v!r}", field=f"{f}{name}"
                )
        seed = self.seed
        if seed is not None and (
            isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED
        ):
            raise UsageError(
                f"{f}seed must be an integer in [0, 2**63 - 1], not {seed!r}", field=f"{f}seed"
            )
        from .show_dense import DENSE_AUGMENTS

        if self.augment is not None and self.augment not in (*AUGMENTS, *DENSE_AUGMENTS):
            raise UsageError(
                f"{f}augment must be one of {', '.join(AUGMENTS)} (images), or "
                f"{', '.join(DENSE_AUGMENTS)} (images with their boxes and masks), "
                f"not {self.augment!r}",
                field=f"{f}augment",
            )
        if not 0.0 <= self.random_erase <= 1.0:
            raise UsageError(
                f"{f}random_erase must lie in [0, 1], not {self.random_erase}",
                field=f"{f}random_erase",
            )
        for name in ("mixup_alpha", "cutmix_alpha"):
            v = getattr(self, name)
            if not (v >= 0.0 and v <= MAX_ALPHA):  # NaN and infinities too
                raise UsageError(
                    f"{f}{name} must be 0 (off) or positive, at most {MAX_ALPHA:g}, not {v}",
                    field=f"{f}{name}",
                )


@dataclass(frozen=True)
class ShowResult:
    path: Path
    images: int  # pack images on the sheet
    indices: tuple[int, ...]  # their pack rows, in sheet order
    classes: tuple[str, ...]  # the rows' classes, in order (one per class, or per image)
    rows: int
    columns: int
    draws: int  # augmented versions per image (0: none)
    augment: tuple[str, ...]  # the ops, e.g. "RandomErasing(p=0.5, ...)"
    width: int  # the PNG's pixels
    height: int

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "images": self.images,
            "indices": list(self.indices),
            "classes": list(self.classes),
            "rows": self.rows,
            "columns": self.columns,
            "draws": self.draws,
            "augment": list(self.augment),
            "width": self.width,
            "height": self.height,
        }


def _pyplot() -> Any:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("imgpack show needs matplotlib: pip install 'imgpack[plot]'") from None
    from .plots import pyplot

    return pyplot()


def _op(name: str, args: tuple[Any, ...], what: str, **kw: Any) -> Any:
    """``packer.transforms.<name>(*args, **kw)``, looked up now: a missing op is a clear
    error, not an ImportError when this module loads."""
    from .. import transforms  # the public names, looked up by the user's op name

    cls = getattr(transforms, name, None)
    if cls is None:
        raise UsageError(
            f"{what} needs packer.transforms.{name}, which this imgpack does not have; "
            "install a newer imgpack",
            field=what.split(" ")[0],
        )
    return cls(*args, **kw)


def _groups(labels: np.ndarray, classes: list[str], cfg: ShowConfig) -> list[tuple[str, list[int]]]:
    """(class name, its rows on the sheet) for the first ``max_classes`` classes that have
    images: class folders by index, else label values, then the unlabeled (-1)."""
    values = list(range(len(classes))) if classes else sorted(set(labels.tolist()) - {-1})
    if (labels == -1).any():
        values.append(-1)
    out = []
    rng = None if cfg.seed is None else np.random.default_rng(cfg.seed)
    for v in values:
        rows = np.flatnonzero(labels == v)
        if not len(rows):
            continue
        if rng is None:
            rows = rows[: cfg.per_class]
        else:
            rows = np.sort(rng.choice(rows, min(cfg.per_class, len(rows)), replace=False))
        name = "(unlabeled)" if v == -1 else classes[v] if classes else str(v)
        out.append((name, rows.tolist()))
        if len(out) == cfg.max_classes:
            break
    return out


def _load(pack: Any, rows: list[int]) -> list[torch.Tensor]:
    """uint8 [3, h, w] per row, as stored (a JPEG pack's decoded on the CPU); a pack
    set's rows from their shards, each held only while it is read."""
    if hasattr(pack, "locate"):  # a PackSet: rows of the whole set
        shards, local = pack.locate(rows)
        out = []
        for k, r in zip(shards.tolist(), local.tolist()):
            shard = pack.shard(k)
            try:
                out += _load(shard, [r])
            finally:
                pack.release(k)
        return out
    return kind_of_pack(pack).stored_images(pack, rows)


def _square(images: list[torch.Tensor], size: int) -> torch.Tensor:
    """Each image's centre square, resized to ``size``: one uint8 [n, 3, size, size] batch."""
    from ..imaging.resize import resized_crop

    out = []
    for img in images:
        h, w = img.shape[-2:]
        s = min(h, w)
        box = torch.tensor([[(h - s) // 2, (w - s) // 2, s, s]], dtype=torch.int64)
        out.append(resized_crop(img[None].contiguous(), box, size))
    return torch.cat(out)


def _ops(cfg: ShowConfig, num_classes: int) -> tuple[Any, Any]:
    """(per-image augmentation or None, batch mixer or None), from packer.transforms."""
    per_image = []
    if cfg.augment:
        name, args = AUGMENTS[cfg.augment]
        per_image.append(_op(name, args, f"{_F}augment {cfg.augment}"))
    if cfg.random_erase:
        per_image.append(_op("RandomErasing", (), f"{_F}random_erase", p=cfg.random_erase))
    mixers = []
    if cfg.mixup_alpha:
        mixers.append(
            _op("MixUp", (), f"{_F}mixup_alpha", alpha=cfg.mixup_alpha, num_classes=num_classes)
        )
    if cfg.cutmix_alpha:
        mixers.append(
            _op("CutMix", (), f"{_F}cutmix_alpha", alpha=cfg.cutmix_alpha, num_classes=num_classes)
        )
    aug = None
    if per_image:
        from ..augment.compose import Compose

        aug = per_image[0] if len(per_image) == 1 else Compose(per_image)
    mix = None
    if len(mixers) == 1:
        mix = mixers[0]
    elif mixers:
        mix = _op("RandomChoice", (mixers,), f"{_F}mixup_alpha with {_F}cutmix_alpha")
    return aug, mix


def _describe(op: Any) -> str:
    """One line for an op: its name and settings, a container's elements inside."""
    from torch import nn

    if not isinstance(op, nn.Module):
        return repr(op)
    kids = [m for k in op.children() for m in (k if isinstance(k, nn.ModuleList) else [k])]
    inner = ", ".join(_describe(m) for m in kids) if kids else op.extra_repr()
    return f"{type(op).__name__}({' '.join(inner.split())})"


def _caption(soft: torch.Tensor, names: list[str]) -> str:
    w, i = soft.float().topk(min(2, len(soft)))
    return " / ".join(f"{names[int(j)]} {float(v):.2f}" for v, j in zip(w, i) if v > 0.005)


def show_pack(cfg: ShowConfig) -> ShowResult:
    """Draw ``cfg.pack``'s contact sheet into ``cfg.out`` (PNG, written under a temporary
    name, then renamed). Raises UsageError without matplotlib, or for an op this
    imgpack lacks; PackFormatError for a missing or damaged pack."""
    from ..storage.open import load
    from .plots import check_output_file

    cfg.validate()
    check_output_file(Path(cfg.out), f"{_F}out")
    plt = _pyplot()
    pack = load(cfg.pack)
    from ..pack.dense import dense_of
    from .show_dense import check_dense_config, show_dense

    cols = dense_of(pack)
    check_dense_config(cfg, cols is not None)
    if cols is not None:  # boxes, masks, keypoints drawn on each image
        return ShowResult(path=Path(cfg.out), **show_dense(cfg, pack, cols, _load, _figure, plt))
    classes = list(pack.classes)
    labels = pack.labels.numpy()
    groups = _groups(labels, classes, cfg)
    if not groups:
        raise UsageError(f"{cfg.pack}: the pack holds no images; nothing to show")
    rows = [r for _, rs in groups for r in rs]
    cells = len(rows) * (1 + cfg.draws) if cfg.augmented else len(rows)
    if cells > cfg._max_cells:
        raise UsageError(
            f"the sheet would hold {cells:,} images, more than {cfg._max_cells:,}: lower "
            f"{_F}draws, {_F}per_class or {_F}max_classes"
        )
    stored = _load(pack, rows)
    names = classes or [str(v) for v in range(int(labels.max()) + 1)]
    draws: list[torch.Tensor] = []
    softs: list[torch.Tensor] = []
    ops: tuple[str, ...] = ()
    if cfg.augmented:
        y = torch.as_tensor(labels[rows], dtype=torch.int64)
        if (cfg.mixup_alpha or cfg.cutmix_alpha) and bool((y < 0).any()):
            raise UsageError(
                f"{cfg.pack}: {_F}mixup_alpha and {_F}cutmix_alpha mix labels, and "
                f"{int((y < 0).sum())} of the images shown have none (-1)"
            )
        aug, mix = _ops(cfg, len(names))
        ops = tuple(_describe(o) for o in (aug, mix) if o is not None)
        # a decoded kind's images each have their own size: squares of one size
        base = _square(stored, cfg.size) if kind_of_pack(pack).decoded else torch.stack(stored)
        for d in range(cfg.draws):
            # each draw one batch of every image shown: each image draws its own parameters
            g = torch.Generator().manual_seed(batch_seed(cfg.seed or 0, 0, 0, d))
            x = base if aug is None else aug(base, generator=g)
            if mix is not None:
                x, soft = mix(x, y, generator=g)
                softs.append(soft)
            draws.append(x)
    fig_rows, cols, width, height = _draw(plt, cfg, groups, stored, draws, softs, names)
    return ShowResult(
        path=Path(cfg.out),
        images=len(rows),
        indices=tuple(rows),
        classes=tuple(name for name, rs in groups for _ in (rs if draws else [0])),
        rows=fig_rows,
        columns=cols,
        draws=len(draws),
        augment=ops,
        width=width,
        height=height,
    )


Cell = tuple[np.ndarray, str] | None  # an HWC (or HW) uint8 image and its caption


def _hwc(img: torch.Tensor) -> np.ndarray:
    x = img.detach().cpu()
    if x.dtype != torch.uint8:
        x = x.float().clamp(0, 255).round().to(torch.uint8)
    x = x.permute(1, 2, 0).numpy()
    return x[..., 0] if x.shape[-1] == 1 else x


def _draw(
    plt: Any,
    cfg: ShowConfig,
    groups: list[tuple[str, list[int]]],
    stored: list[torch.Tensor],
    draws: list[torch.Tensor],
    softs: list[torch.Tensor],
    names: list[str],
) -> tuple[int, int, int, int]:
    """The sheet: a row per class (K images), or with draws a row per image (stored,
    then its draws). Returns (rows, columns, width, height in pixels)."""
    if draws:
        cells: list[list[Cell]] = []
        row_names = [name for name, rs in groups for _ in rs]
        for i, img in enumerate(stored):
            row: list[Cell] = [(_hwc(img), "")]
            for d, x in enumerate(draws):
                row.append((_hwc(x[i]), _caption(softs[d][i], names) if softs else ""))
            cells.append(row)
        heads = ["as stored", *(f"draw {d + 1}" for d in range(len(draws)))]
    else:
        ncols = max(len(rs) for _, rs in groups)
        it = iter(stored)
        cells = [
            [(_hwc(next(it)), "") if j < len(rs) else None for j in range(ncols)]
            for _, rs in groups
        ]
        row_names = [name for name, _ in groups]
        heads = []
    return _figure(plt, cfg, cells, row_names, heads)


def _figure(
    plt: Any, cfg: ShowConfig, cells: list[list[Cell]], row_names: list[str], heads: list[str]
) -> tuple[int, int, int, int]:
    """Lay ``cells`` (rows of images, None: an empty cell) out as one PNG at ``cfg.out``,
    each row named, each column headed by ``heads`` (if any). Returns (rows, columns,
    width, height in pixels)."""
    from .plots import save_png

    nrows, ncols = len(cells), max(len(r) for r in cells)
    fig_w, fig_h = ncols * _CELL_IN + 1.4, nrows * _CELL_IN + 0.5
    fig, axes = plt.subplots(nrows, ncols, figsize=(fig_w, fig_h), dpi=_DPI, squeeze=False)
    for r in range(nrows):
        for c in range(ncols):
            ax = axes[r][c]
            ax.set_xticks([])
            ax.set_yticks([])
            cell = cells[r][c] if c < len(cells[r]) else None
            if cell is None:
                ax.axis("off")
                continue
            ax.imshow(cell[0], cmap="gray" if cell[0].ndim == 2 else None)
            if cell[1]:
                ax.set_xlabel(cell[1], fontsize=6)
            if r == 0 and heads:
                ax.set_title(heads[c], fontsize=8)
        axes[r][0].set_ylabel(row_names[r], fontsize=8, rotation=0, ha="right", va="center")
    save_png(plt, fig, Path(cfg.out), option=f"{_F}out")
    from PIL import Image

    with Image.open(cfg.out) as im:
        width, height = im.size
    return nrows, ncols, width, height
