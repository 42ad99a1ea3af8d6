"""The host's random draws of :mod:`packer.imaging`'s ops: where the numbers come from,
and torchvision's box rules as exact tables.

* :func:`host_rng`: an op's numpy generator, seeded by one draw from its
  ``torch.Generator``, so a seed gives the same draws and nothing else does.
* :func:`box_table`: the exact distribution of the box that torchvision's
  ``RandomResizedCrop.get_params`` (kind "crop") or ``RandomErasing.get_params``
  (kind "erase", with its coin) returns for one image size, as a table: a batch's
  boxes are then four uniforms per image and a lookup in an alias table, in about ten
  numpy calls instead of ten tries per image in some thirty (:func:`draw_boxes`). :func:`try_sides` draws the tries
  themselves, for what the tables leave out (per-image sizes, a fixed scale or ratio,
  large images).

Each numpy or torch call costs the host microseconds whatever its size, and the
modern recipe draws every op's parameters for every batch on the host, so the
functions here make as few calls as they can. Needs only torch and numpy (like
``resize.py`` and ``transforms.py``, beside which it imports standalone).
"""

from __future__ import annotations

import math
import threading
from typing import NamedTuple

import numpy as np
import torch

# PCG64's increment, the same for every stream (any odd number): the state is the seed.
_PCG_INC = 0xDA3E39CB94B95BDB_853C49E6748FEA9B
_HOST = threading.local()
# torchvision's tries per image before the crop falls back / the erasing gives up.
TRIES = 10
# A table of more cells than this (crops of images over about 800²) takes over a
# second to build: those draw their tries. Cells are the rounded sides a try can give.
_MAX_CELLS = 200_000


def host_rng(generator: torch.Generator | None) -> np.random.Generator:
    """The numpy generator for one op's draws, seeded by one draw from ``generator``.

    ``generator``: a CPU ``torch.Generator`` (None: torch's default one), which gives
    126 bits (one call, two values) that become the whole state of this thread's
    PCG64; so the same ``generator`` state gives the same numbers, and the numbers
    depend on nothing else. numpy draws uniforms at about a quarter of the cost of
    ``torch.rand`` (mt19937), and reseeding costs about what one torch call does: an
    op draws everything it needs from it, as many numbers as it likes. The generator
    is this thread's, valid until the next call of this function in it.
    """
    rng = getattr(_HOST, "rng", None)
    if rng is None:
        rng = _HOST.rng = np.random.Generator(np.random.PCG64(0))
        _HOST.seed = torch.empty(2, dtype=torch.int64)
    # Into a tensor kept for it: making one costs as much as the draw.
    hi, lo = _HOST.seed.random_(generator=generator).tolist()
    rng.bit_generator.state = {
        "bit_generator": "PCG64",
        "state": {"state": hi << 63 | lo, "inc": _PCG_INC},
        "has_uint32": 0,
        "uinteger": 0,
    }
    return rng


def uniform(generator: torch.Generator | None) -> float:
    """One uniform in [0, 1) (float64, a multiple of 2**-53) from ``generator``, with
    one torch call: where an op needs a single number, cheaper than :func:`host_rng`."""
    one = getattr(_HOST, "one", None)
    if one is None:
        one = _HOST.one = torch.empty((), dtype=torch.float64)
    return one.uniform_(generator=generator).item()


def try_sides(
    u_area: np.ndarray,
    u_aspect: np.ndarray,
    area: float | np.ndarray,
    scale: tuple[float, float],
    ratio: tuple[float, float],
) -> np.ndarray:
    """Tries of torchvision's box rule from uniforms ``u_area``, ``u_aspect`` (float64
    [K, N]: K tries of N images; ``area``: the image area, a float or [1, N]): float64
    [2, K, N], (round(sqrt(t / a)), round(sqrt(t * a))) for the target area t ~
    U(scale) * area and the aspect a = exp(U(log ratio)), rounded half to even as
    Python's round. The crop's (h, w); the erasing's (w, h)."""
    lo, hi = scale
    target = u_area * ((hi - lo) * area)
    target += lo * area
    lr0, lr1 = math.log(ratio[0]), math.log(ratio[1])
    aspect = u_aspect * (lr1 - lr0)
    aspect += lr0
    np.exp(aspect, out=aspect)
    sides = np.empty((2, *target.shape))
    np.divide(target, aspect, out=sides[0])
    np.multiply(target, aspect, out=sides[1])
    np.sqrt(sides, out=sides)
    np.rint(sides, out=sides)
    return sides


def first_fit(ok: np.ndarray) -> np.ndarray:
    """Per column of ``ok`` (bool [K, N]), the flat index in [K, N] of its first True
    (of its first row where it has none)."""
    pick = ok.argmax(0)
    pick *= ok.shape[1]
    pick += _arange(ok.shape[1])
    return pick


def _arange(n: int) -> np.ndarray:
    """``np.arange(n)``, made once per n."""
    a = _ARANGES.get(n)
    if a is None:
        if len(_ARANGES) >= 64:  # many sizes: start over rather than grow
            _ARANGES.clear()
        a = _ARANGES[n] = np.arange(n)
    return a


_ARANGES: dict[int, np.ndarray] = {}


# ---------------------------------------------------------------- exact box tables


class BoxTable(NamedTuple):
    """A box rule's outcomes for one image size, for :func:`draw_boxes`.

    ``alias``: Walker's alias table, float64 [outcomes, 2]: outcome k is kept with
    probability ``alias[k, 0]``, else outcome ``alias[k, 1]`` is taken (so a draw is
    a uniform index and a coin: no search, whose branches cost more than the rest).
    ``rows``: per outcome its top span, left span, height, width, top base and left
    base (int16 [outcomes, 6]: one cache line per draw): the box is (floor(u * top
    span) + top base, floor(u' * left span) + left base, height, width), its corner
    uniform where the span is H - h + 1 and fixed where it is 0. Outcomes below
    ``found`` are boxes a try found; the last is the crop's fallback, the erasing's
    "not erased" (all zeros).
    """

    alias: np.ndarray
    rows: np.ndarray
    found: int


def draw_boxes(table: BoxTable, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Outcomes of ``table`` for uniforms ``u`` (float64 [4, B]): their indices (intp
    [B]) and boxes (float64 [4, B]: top, left, height, width)."""
    k = u[0] * len(table.alias)
    k = k.astype(np.intp)
    slot = table.alias.take(k, 0)
    k = np.where(u[1] < slot[:, 0], k, slot[:, 1].astype(np.intp))
    # Rows of float64 [B] from here: numpy's loops are fast on those only.
    box = np.array(table.rows.take(k, 0).T, dtype=np.float64, order="C")
    np.multiply(box[:2], u[2:], out=box[:2])
    np.floor(box[:2], out=box[:2])
    box[:2] += box[4:]
    return k, box[:4]


def box_table(
    kind: str,
    height: int,
    width: int,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    p: float = 1.0,
) -> BoxTable | None:
    """The exact table (:class:`BoxTable`) of torchvision's box for ``height`` x
    ``width`` images, made once per arguments; None where there is none (a fixed
    scale or ratio: no density; too many cells: see ``_MAX_CELLS``).

    kind "crop": ``RandomResizedCrop.get_params``: the first of ten tries with 0 < h
    <= H and 0 < w <= W, else the whole image with its aspect clamped into ``ratio``,
    centred. kind "erase": with probability ``p``, ``RandomErasing.get_params``'s
    first try with h < H and w < W (none: not erased); then no box (zeros).

    Why exact: with t ~ U(T0, T1) and log a ~ U(log r0, log r1), (x, y) = (sqrt(t *
    a), sqrt(t / a)) is uniform on R = {T0 <= x y <= T1, r0 <= x / y <= r1} (the map
    has Jacobian 2), so a try's rounded sides are (i, j) with probability the area of
    [i - 1/2, i + 1/2] x [j - 1/2, j + 1/2] within R times the density, which
    :func:`_area` integrates in closed form. The first fitting of ten tries is a
    fitting cell with probability P(cell) / P(fit) * (1 - (1 - P(fit))**10).
    """
    key = (kind, height, width, tuple(scale), tuple(ratio), p)  # a list set as an attribute
    table = _TABLES.get(key)
    if table is None and key not in _TABLES:
        if len(_TABLES) >= 16:  # many image sizes: start over rather than grow
            _TABLES.clear()
        table = _TABLES[key] = _build(*key)
    return table


_TABLES: dict[tuple, BoxTable | None] = {}


def _build(
    kind: str, height: int, width: int, scale: tuple, ratio: tuple, p: float
) -> BoxTable | None:
    (lo, hi), (r0, r1) = scale, ratio
    if not (lo < hi and r0 < r1):
        return None
    area = float(height * width)
    t0, t1 = lo * area, hi * area
    # The crop: x = w = sqrt(t a) in [1, W], y = h in [1, H]. The erasing: x = h =
    # sqrt(t a) in [0, H - 1], y = w in [0, W - 1].
    if kind == "crop":
        x_lim, y_lim, smallest = width, height, 1
    else:
        x_lim, y_lim, smallest = height - 1, width - 1, 0
    xs = _cell_range(math.sqrt(t0 * r0), math.sqrt(t1 * r1), smallest, x_lim)
    ys = _cell_range(math.sqrt(t0 / r1), math.sqrt(t1 / r0), smallest, y_lim)
    if len(xs) * len(ys) > 5 * _MAX_CELLS or max(height, width) >= 2**15 - 1:  # int16 rows
        return None
    x, y = (v.ravel() for v in np.meshgrid(xs, ys))
    a0, a1 = np.maximum(x - 0.5, 0.0), x + 0.5
    b0, b1 = np.maximum(y - 0.5, 0.0), y + 0.5
    near = (a1 * b1 > t0) & (a0 * b0 < t1) & (a1 > r0 * b0) & (a0 < r1 * b1)
    if near.sum() > _MAX_CELLS:
        return None
    x, y, a0, a1, b0, b1 = (v[near] for v in (x, y, a0, a1, b0, b1))
    density = 2.0 / ((t1 - t0) * math.log(r1 / r0))
    prob = np.concatenate(
        [
            _area(a0[s], a1[s], b0[s], b1[s], t0, t1, r0, r1)
            for s in (slice(k, k + 50_000) for k in range(0, len(x), 50_000))
        ]
        or [np.zeros(0)]
    )
    prob *= density
    keep = prob > 0
    x, y, prob = x[keep], y[keep], prob[keep]
    fit = float(prob.sum())
    miss = (1.0 - min(fit, 1.0)) ** TRIES  # no try fits
    prob *= (1.0 - miss) / fit if fit > 0 else 0.0
    h, w = (y, x) if kind == "crop" else (x, y)
    rows = np.zeros((len(prob) + 1, 6), dtype=np.int16)
    rows[:-1, 0] = height - h + 1
    rows[:-1, 1] = width - w + 1
    rows[:-1, 2], rows[:-1, 3] = h, w
    if kind == "crop":  # the fallback: the last outcome
        ch, cw = _centre(height, width, ratio)
        rows[-1] = 0, 0, ch, cw, (height - ch) // 2, (width - cw) // 2
        last = miss
    else:  # not erased (no box): the last outcome
        prob *= p
        last = 1.0 - p * (1.0 - miss)
    return BoxTable(_alias(np.append(prob, max(last, 0.0))), rows, len(prob))


def _alias(prob: np.ndarray) -> np.ndarray:
    """Walker's alias table (Vose's construction) of the distribution ``prob``."""
    n = len(prob)
    q = (prob * (n / prob.sum())).tolist()
    keep, alias = [1.0] * n, list(range(n))
    small = [i for i, v in enumerate(q) if v < 1.0]
    large = [i for i, v in enumerate(q) if v >= 1.0]
    while small and large:
        s, big = small.pop(), large[-1]
        keep[s], alias[s] = q[s], big
        q[big] = (q[big] + q[s]) - 1.0
        if q[big] < 1.0:
            small.append(large.pop())
    # What is left differs from 1 by rounding only: kept.
    return np.array([keep, alias], dtype=np.float64).T.copy()


def _cell_range(lo: float, hi: float, smallest: int, largest: int) -> np.ndarray:
    """The integers that round(v) can be for v in [lo, hi] (and a few more), within
    [smallest, largest]."""
    return np.arange(max(smallest, math.floor(lo)), min(largest, math.ceil(hi)) + 1.0)


def _centre(height: int, width: int, ratio: tuple[float, float]) -> tuple[int, int]:
    """torchvision's fallback crop's (h, w): the whole image, its aspect clamped into
    ``ratio`` (it is centred)."""
    in_ratio = width / height
    if in_ratio < min(ratio):
        return round(width / min(ratio)), width
    if in_ratio > max(ratio):
        return height, round(height * max(ratio))
    return height, width


def _area(
    a0: np.ndarray,
    a1: np.ndarray,
    b0: np.ndarray,
    b1: np.ndarray,
    t0: float,
    t1: float,
    r0: float,
    r1: float,
) -> np.ndarray:
    """Area of {(x, y) in [a0, a1] x [b0, b1]: t0 <= x y <= t1, r0 <= x / y <= r1}, per
    rectangle (float64 [N] each).

    At each x the y's form [max(b0, t0 / x, x / r1), min(b1, t1 / x, x / r0)]; between
    the points where two of those six curves meet, each bound is one curve, whose
    integral is closed: c (q - p), t log(q / p), (q² - p²) / 2r.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        meets = [
            t0 / b0, t1 / b0, b0 * r0, b0 * r1,
            t0 / b1, t1 / b1, b1 * r0, b1 * r1,
        ]  # fmt: skip
        scalars = [math.sqrt(t0 * r0), math.sqrt(t0 * r1), math.sqrt(t1 * r0), math.sqrt(t1 * r1)]
        pts = np.stack([a0, a1, *meets, *(np.full_like(a0, s) for s in scalars)], 1)
        pts = np.clip(np.nan_to_num(pts, nan=0.0), a0[:, None], a1[:, None])
        pts.sort(1)
        p, q = pts[:, :-1], pts[:, 1:]
        m = 0.5 * (p + q)
        lower = np.stack([np.broadcast_to(b0[:, None], m.shape), t0 / m, m / r1])
        upper = np.stack([np.broadcast_to(b1[:, None], m.shape), t1 / m, m / r0])
        il, iu = lower.argmax(0)[None], upper.argmin(0)[None]
        gap = np.take_along_axis(upper, iu, 0)[0] - np.take_along_axis(lower, il, 0)[0]
        log_qp, sq = np.log(q / p), (q * q - p * p) * 0.5

        def integrals(c: np.ndarray, t: float, r: float) -> np.ndarray:
            return np.stack([c[:, None] * (q - p), t * log_qp if t else 0 * q, sq / r])

        inside = np.take_along_axis(integrals(b1, t1, r0), iu, 0)[0]
        inside -= np.take_along_axis(integrals(b0, t0, r1), il, 0)[0]
        return np.where((gap > 0) & (q > p), inside, 0.0).sum(1)


def size_column(height: int, width: int) -> np.ndarray:
    """float64 [2, 1, 1]: (height, width), made once per size."""
    col = _COLUMNS.get((height, width))
    if col is None:
        if len(_COLUMNS) >= 64:  # many image sizes: start over rather than grow
            _COLUMNS.clear()
        col = _COLUMNS[(height, width)] = np.array([height, width], dtype=np.float64)[:, None, None]
    return col


_COLUMNS: dict[tuple[int, int], np.ndarray] = {}
