"""packer.augment.draws: the seed comes from the generator, the box tables are exactly
torchvision's rules (checked against a direct simulation of them), and the alias draws
follow the tables."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import packer.transforms as T
from aug_checks import chi_square_limit
from packer.augment import draws


def test_host_rng_follows_the_generator_only() -> None:
    g = torch.Generator().manual_seed(7)
    a = draws.host_rng(g).random(5)
    again = draws.host_rng(g).random(5)
    assert not np.array_equal(a, again)  # each call takes a new seed from the generator
    assert np.array_equal(draws.host_rng(torch.Generator().manual_seed(7)).random(5), a)
    # A resumed run (the generator's state restored) redraws the same numbers.
    state = g.get_state()
    b = draws.host_rng(g).random(5)
    g.set_state(state)
    assert np.array_equal(draws.host_rng(g).random(5), b)
    # None is torch's default generator; numpy's global RNG plays no part.
    torch.manual_seed(7)
    np.random.seed(1)
    c = draws.host_rng(None).random(5)
    np.random.seed(2)
    torch.manual_seed(7)
    assert np.array_equal(draws.host_rng(None).random(5), c)
    assert np.array_equal(c, a)
    u = [draws.uniform(torch.Generator().manual_seed(s)) for s in range(200)]
    assert all(0.0 <= x < 1.0 for x in u) and len(set(u)) == 200


def simulate(kind: str, h: int, w: int, scale, ratio, p: float, n: int) -> np.ndarray:
    """torchvision's rule, ten tries per image, written out with numpy: the (height,
    width) of each image's box, (-1, -1) for the crop's fallback or no erasing."""
    rng = np.random.default_rng(0)
    t = (rng.random((n, 10)) * (scale[1] - scale[0]) + scale[0]) * h * w
    a = np.exp(rng.random((n, 10)) * math.log(ratio[1] / ratio[0]) + math.log(ratio[0]))
    big, small = np.rint(np.sqrt(t * a)), np.rint(np.sqrt(t / a))
    if kind == "crop":
        bh, bw = small, big
        fit = (bh > 0) & (bw > 0) & (bh <= h) & (bw <= w)
    else:
        bh, bw = big, small
        fit = (bh < h) & (bw < w)
    first = fit.argmax(1)
    rows = np.arange(n)
    ok = fit[rows, first] & (rng.random(n) < p)
    return np.where(ok[:, None], np.stack([bh[rows, first], bw[rows, first]], 1), -1)


def outcome_probabilities(table: draws.BoxTable) -> np.ndarray:
    """The distribution the alias table draws from."""
    n = len(table.alias)
    keep, alias = table.alias[:, 0], table.alias[:, 1].astype(np.intp)
    return (keep + np.bincount(alias, weights=1.0 - keep, minlength=n)) / n


def chi_square(counts: np.ndarray, prob: np.ndarray) -> tuple[float, int]:
    """Pearson's statistic of ``counts`` against ``prob``, outcomes expected fewer than
    five times pooled."""
    expected = prob * counts.sum()
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    return float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()), int(keep.sum()) - 1


@pytest.mark.parametrize(
    "kind, h, w, scale, ratio",
    [
        ("crop", 24, 30, (0.08, 1.0), (3 / 4, 4 / 3)),  # ImageNet's settings
        ("crop", 9, 40, (0.3, 1.0), (0.5, 2.0)),  # the fallback one time in ten
        ("erase", 20, 16, (0.02, 0.33), (0.3, 3.3)),  # the reference's
        ("erase", 8, 8, (0.0, 0.9), (0.3, 3.3)),  # empty boxes, many without a fit
    ],
)
def test_box_tables_are_the_rules_distribution(kind, h, w, scale, ratio) -> None:
    p = 0.6  # the erasing's
    table = draws.box_table(kind, h, w, scale, ratio, p)
    prob = outcome_probabilities(table)
    assert abs(prob.sum() - 1.0) < 1e-12
    rows = table.rows.astype(np.int64)
    # An outcome: its (h, w), or (-1, -1) for the last (fallback, not erased).
    key = np.where(np.arange(len(rows))[:, None] < table.found, rows[:, 2:4], -1)
    if kind == "crop":  # the fallback's box, as torchvision makes it
        assert tuple(rows[-1]) == (0, 0, *_tv_fallback(h, w, ratio))
    else:
        assert not rows[-1].any()
    sim = simulate(kind, h, w, scale, ratio, 1.0 if kind == "crop" else p, 100_000)
    code, sim_code = (k[:, 0] * 65536 + k[:, 1] for k in (key + 1, sim + 1))
    order = np.argsort(code)
    hits = order[np.minimum(np.searchsorted(code[order], sim_code), len(code) - 1)]
    assert np.array_equal(code[hits], sim_code)  # every simulated box is an outcome
    counts = np.bincount(hits, minlength=len(prob)).astype(float)
    stat, dof = chi_square(counts, prob)
    assert stat < chi_square_limit(dof), f"chi-square {stat:.1f} with {dof} dof"
    # Fewer categories, more power against a shift: the heights, the widths, and the
    # rate of the last outcome (the fallback, not erased).
    for side in (0, 1):
        where = np.unique(key[:, side], return_inverse=True)[1]
        stat, dof = chi_square(np.bincount(where, counts), np.bincount(where, prob))
        assert stat < chi_square_limit(dof), f"side {side}: chi-square {stat:.1f} ({dof} dof)"
    n, last = counts.sum(), prob[-1]
    z = (counts[-1] - n * last) / math.sqrt(n * last * (1 - last))
    assert abs(z) < 3.3, f"last outcome: {counts[-1] / n:.4f} for {last:.4f}"
    # The corners: spans H - h + 1 and W - w + 1 for a found box.
    found = rows[: table.found]
    assert (found[:, 0] == h - found[:, 2] + 1).all() and (found[:, 1] == w - found[:, 3] + 1).all()


def _tv_fallback(h: int, w: int, ratio) -> tuple[int, int, int, int]:
    tv_h, tv_w = h, w
    if w / h < min(ratio):
        tv_h = round(w / min(ratio))
    elif w / h > max(ratio):
        tv_w = round(h * max(ratio))
    return tv_h, tv_w, (h - tv_h) // 2, (w - tv_w) // 2


def test_draw_boxes_follows_the_table() -> None:
    table = draws.box_table("crop", 24, 30, (0.08, 1.0), (3 / 4, 4 / 3))
    n = 200_000
    u = np.random.default_rng(3).random((4, n))
    k, box = draws.draw_boxes(table, u)
    prob = outcome_probabilities(table)
    stat, dof = chi_square(np.bincount(k, minlength=len(prob)).astype(float), prob)
    assert stat < chi_square_limit(dof), f"chi-square {stat:.1f} with {dof} dof"
    rows = table.rows[k].astype(np.float64)
    assert np.array_equal(box[2:], rows[:, 2:4].T)
    # The corner: floor(u * span) + base, uniform over the span (H - h + 1 for a box a
    # try found, 0 for the fallback, which is centred).
    assert np.array_equal(box[0], np.floor(u[2] * rows[:, 0]) + rows[:, 4])
    assert np.array_equal(box[1], np.floor(u[3] * rows[:, 1]) + rows[:, 5])
    assert (box[:2] >= 0).all() and (box[0] + box[2] <= 24).all() and (box[1] + box[3] <= 30).all()


def test_no_table_where_the_rule_has_no_density() -> None:
    assert draws.box_table("crop", 20, 20, (0.5, 0.5), (0.5, 2.0)) is None  # fixed scale
    assert draws.box_table("erase", 20, 20, (0.1, 0.4), (2.0, 2.0)) is None  # fixed ratio
    assert draws.box_table("crop", 4000, 4000, (0.08, 1.0), (3 / 4, 4 / 3)) is None  # huge
    same = draws.box_table("crop", 24, 30, [0.08, 1.0], [3 / 4, 4 / 3])  # lists, as attributes
    assert same is draws.box_table("crop", 24, 30, (0.08, 1.0), (3 / 4, 4 / 3))
    # Then the modules draw the tries instead: still torchvision's rule, in bounds.
    boxes = T.RandomResizedCrop(8, scale=(0.5, 0.5)).sample_boxes(
        500, 20, 20, torch.Generator().manual_seed(0)
    )
    area = boxes[:, 2] * boxes[:, 3]
    assert ((area - 200).abs() <= 30).all() and (boxes[:, :2] + boxes[:, 2:] <= 20).all()
