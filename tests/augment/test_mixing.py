"""packer.augment.mixing: MixUp/CutMix draw torchvision's lam and boxes, mix its way."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torchvision.transforms import v2

import packer.transforms as T
from packer.augment.mixing import CutMix, MixUp, RandomChoice, sample_beta


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: max |ECDF_a - ECDF_b|."""
    a, b = np.sort(a), np.sort(b)
    grid = np.concatenate([a, b])
    fa = np.searchsorted(a, grid, side="right") / len(a)
    fb = np.searchsorted(b, grid, side="right") / len(b)
    return float(np.abs(fa - fb).max())


def ks_limit(n: int, m: int) -> float:
    return 1.95 * math.sqrt((n + m) / (n * m))  # alpha = 0.001; seeds are fixed


def batch(b: int = 6, h: int = 10, w: int = 12, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (b, 3, h, w), generator=g, dtype=torch.uint8)


# ---------------------------------------------------------------- draws


@pytest.mark.parametrize("alpha", [0.2, 1.0, 3.0])
def test_beta_draws_follow_numpys_beta(alpha: float) -> None:
    n = 20000
    ours = sample_beta(alpha, n, torch.Generator().manual_seed(0)).double().numpy()
    ref = np.random.default_rng(1).beta(alpha, alpha, n)
    assert ks_statistic(ours, ref) < ks_limit(n, n)
    lam = MixUp(alpha, 3, mode="elem").sample(n, torch.Generator().manual_seed(2))
    assert lam.shape == (n,)
    assert ks_statistic(lam.double().numpy(), ref) < ks_limit(n, n)
    assert MixUp(alpha, 3).sample(n).shape == (1,)  # batch mode: one lam


def test_batch_mode_draws_torchvisions_lam_and_box() -> None:
    for seed in range(20):
        torch.manual_seed(seed)
        tv_lam = float(v2.MixUp(alpha=0.4, num_classes=3)._dist.sample(()))
        ours = MixUp(0.4, 3).sample(8, torch.Generator().manual_seed(seed))
        assert float(ours[0]) == tv_lam
        torch.manual_seed(seed)
        params = v2.CutMix(alpha=1.0, num_classes=3).make_params([torch.zeros(2, 3, 37, 51)])
        draw = CutMix(1.0, 3).sample(2, 37, 51, torch.Generator().manual_seed(seed))
        assert tuple(draw.boxes[0].tolist()) == params["box"]
        assert float(draw.lam_adjusted[0]) == params["lam_adjusted"]


def test_elem_cutmix_boxes_follow_torchvisions_rule() -> None:
    n, h, w = 20000, 37, 51
    draw = CutMix(1.0, 3, mode="elem").sample(n, h, w, torch.Generator().manual_seed(0))
    x1, y1, x2, y2 = draw.boxes.unbind(1)
    # The rule given the lam: half sides int(0.5 sqrt(1 - lam) * side), clamped at the edges.
    r = 0.5 * torch.sqrt(1.0 - draw.lam.double())
    rw, rh = (r * w).long(), (r * h).long()
    assert bool(((x2 - x1 <= 2 * rw) & (y2 - y1 <= 2 * rh)).all())
    assert bool(((x1 >= 0) & (y1 >= 0) & (x2 <= w) & (y2 <= h)).all())
    free = (x1 > 0) & (x2 < w) & (y1 > 0) & (y2 < h)
    assert bool(((x2 - x1)[free] == 2 * rw[free]).all())
    area = ((x2 - x1) * (y2 - y1)).double()
    assert torch.allclose(draw.lam_adjusted, 1.0 - area / (h * w))
    # Distributions against torchvision's own draws (its default generator).
    torch.manual_seed(1)
    tv = v2.CutMix(alpha=1.0, num_classes=3)
    ref = [tv.make_params([torch.zeros(1, 3, h, w)]) for _ in range(4000)]
    ref_box = np.array([p["box"] for p in ref], dtype=np.float64)
    ref_lam = np.array([p["lam_adjusted"] for p in ref])
    ours_box = draw.boxes.double().numpy()
    lim = ks_limit(n, len(ref))
    assert ks_statistic(draw.lam_adjusted.numpy(), ref_lam) < lim
    for k, name in enumerate(["x1", "y1", "x2", "y2"]):
        d = ks_statistic(ours_box[:, k], ref_box[:, k])
        assert d < lim, f"{name}: KS {d:.4f}"


# ---------------------------------------------------------------- pixels and labels


def test_mixup_batch_mode_equals_torchvision_on_float_images() -> None:
    x = batch().float() / 255
    labels = torch.tensor([0, 1, 2, 3, 4, 0])
    torch.manual_seed(7)
    ref_x, ref_y = v2.MixUp(alpha=0.5, num_classes=5)(x, labels)
    out_x, out_y = MixUp(0.5, 5)(x, labels, generator=torch.Generator().manual_seed(7))
    assert torch.equal(out_x, ref_x) and torch.equal(out_y, ref_y)
    assert out_y.dtype == torch.float32 and out_y.shape == (6, 5)
    assert torch.allclose(out_y.sum(1), torch.ones(6))


def test_cutmix_batch_mode_equals_torchvision() -> None:
    x = batch(h=31, w=40)
    labels = torch.tensor([0, 1, 2, 3, 4, 0])
    for seed in range(5):
        torch.manual_seed(seed)
        ref_x, ref_y = v2.CutMix(alpha=1.0, num_classes=5)(x.float(), labels)
        g = torch.Generator().manual_seed(seed)
        out_x, out_y = CutMix(1.0, 5)(x, labels, generator=g)
        assert out_x.dtype == torch.uint8  # uint8 stays uint8, exactly (pixels are copied)
        assert torch.equal(out_x.float(), ref_x) and torch.equal(out_y, ref_y)
        assert torch.allclose(out_y.sum(1), torch.ones(6))


def test_mixup_uint8_rounds_the_float_mix() -> None:
    x = batch()
    labels = torch.arange(6) % 3
    out, _ = MixUp(1.0, 3)(x, labels, generator=torch.Generator().manual_seed(3))
    lam = float(MixUp(1.0, 3).sample(6, torch.Generator().manual_seed(3))[0])
    ref = (x.float() * lam + x.roll(1, 0).float() * (1 - lam)).round()
    assert out.dtype == torch.uint8
    assert (out.float() - ref).abs().max() <= 1  # rounding of a value at .5 may differ
    assert (out.float() - ref).abs().mean() < 0.01


def test_elem_mode_mixes_each_pair_with_its_own_lam() -> None:
    x = batch(b=8).float()
    labels = torch.arange(8) % 4
    lam = MixUp(1.0, 4, mode="elem").sample(8, torch.Generator().manual_seed(0))
    assert len(set(lam.tolist())) == 8
    out_x, out_y = MixUp(1.0, 4, mode="elem")(x, labels, generator=torch.Generator().manual_seed(0))
    for i in range(8):  # each image: torchvision's formula with that image's lam
        pair = torch.stack([x[i - 1], x[i]])
        ref = pair.roll(1, 0).mul_(1.0 - float(lam[i])).add_(pair.mul(float(lam[i])))[1]
        assert torch.allclose(out_x[i], ref, atol=1e-4)
        soft = torch.nn.functional.one_hot(labels, 4).float()
        ref_y = soft[i - 1] * (1 - float(lam[i])) + soft[i] * float(lam[i])
        assert torch.allclose(out_y[i], ref_y, atol=1e-6)
    draw = CutMix(1.0, 4, mode="elem").sample(8, 10, 12, torch.Generator().manual_seed(1))
    out_c, out_cy = CutMix(1.0, 4, mode="elem")(
        x, labels, generator=torch.Generator().manual_seed(1)
    )
    for i in range(8):
        x1, y1, x2, y2 = draw.boxes[i].tolist()
        ref = x[i].clone()
        ref[:, y1:y2, x1:x2] = x[i - 1][:, y1:y2, x1:x2]
        assert torch.equal(out_c[i], ref)
        lam_i = float(draw.lam_adjusted[i])
        soft = torch.nn.functional.one_hot(labels, 4).float()
        assert torch.allclose(out_cy[i], soft[i - 1] * (1 - lam_i) + soft[i] * lam_i)


def test_soft_labels_in_and_chained_mixers_sum_to_one() -> None:
    x = batch(b=5)
    soft = torch.softmax(torch.randn(5, 7, generator=torch.Generator().manual_seed(0)), 1)
    g = torch.Generator().manual_seed(4)
    x1, y1 = MixUp(0.8, 7)(x, soft, generator=g)
    _, y2 = CutMix(1.0, None, mode="elem")(x1, y1, generator=g)  # num_classes from the labels
    assert y2.shape == (5, 7) and torch.allclose(y2.sum(1), torch.ones(5))
    torch.manual_seed(9)
    _, ref = v2.MixUp(alpha=0.8, num_classes=7)(x.float(), soft)
    _, ours = MixUp(0.8, 7)(x, soft, generator=torch.Generator().manual_seed(9))
    assert torch.equal(ours, ref)


def test_same_seed_same_batch() -> None:
    x = batch(b=16, h=20, w=20)
    labels = torch.arange(16) % 5
    for mixer in [MixUp(1.0, 5, mode="elem"), CutMix(1.0, 5, mode="elem"), CutMix(1.0, 5)]:
        a = mixer(x, labels, generator=torch.Generator().manual_seed(1))
        b = mixer(x, labels, generator=torch.Generator().manual_seed(1))
        c = mixer(x, labels, generator=torch.Generator().manual_seed(2))
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        assert not torch.equal(a[1], c[1])


# ---------------------------------------------------------------- RandomChoice and Compose


def test_random_choice_picks_by_p_and_follows_the_seed() -> None:
    rc = RandomChoice([MixUp(0.2, 3), CutMix(1.0, 3)], p=[1, 3])
    assert rc.mixes_labels and rc.accepts_generator and rc.p == [0.25, 0.75]
    g = torch.Generator().manual_seed(0)
    picks = np.array([rc.sample(g) for _ in range(4000)])
    assert abs(picks.mean() - 0.75) < 0.03
    x, labels = batch(), torch.arange(6) % 3
    a = rc(x, labels, generator=torch.Generator().manual_seed(5))
    g = torch.Generator().manual_seed(5)
    k = rc.sample(g)
    b = rc.transforms[k](x, labels, generator=g)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_random_choice_never_picks_a_zero_probability() -> None:
    mixers = [MixUp(0.2, 3), CutMix(1.0, 3), MixUp(1.0, 3), CutMix(0.5, 3)]
    g = torch.Generator().manual_seed(1)
    for p, allowed in [([0, 1, 0, 3], {1, 3}), ([2, 0, 0, 0], {0}), ([0, 0, 0, 1], {3})]:
        rc = RandomChoice(mixers, p=p)
        picks = np.array([rc.sample(g) for _ in range(4000)])
        assert set(picks.tolist()) == allowed
        if allowed == {1, 3}:
            assert abs((picks == 3).mean() - 0.75) < 0.03


def test_compose_passes_labels_through_a_mixer() -> None:
    x, labels = batch(b=4, h=16, w=16), torch.tensor([0, 1, 2, 1])
    tf = T.Compose([T.CenterCrop(12), T.RandomChoice([T.MixUp(1.0, 3), T.CutMix(1.0, 3)])])
    assert tf.mixes_labels
    out, soft = tf(x, labels, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(0)
    ref, ref_soft = tf[1](T.CenterCrop(12)(x), labels, generator=g)
    assert torch.equal(out, ref) and torch.equal(soft, ref_soft)
    with pytest.raises(ValueError, match="mixes labels: call the Compose as"):
        tf(x, generator=torch.Generator())


def test_bad_arguments_raise_value_error() -> None:
    x = batch(b=4)
    with pytest.raises(ValueError, match="alpha must be a positive number"):
        MixUp(0.0, 3)
    with pytest.raises(ValueError, match="mode must be 'batch' or 'elem'"):
        CutMix(1.0, 3, mode="pair")
    with pytest.raises(ValueError, match="num_classes must be a positive int"):
        MixUp(1.0, 0)
    with pytest.raises(ValueError, match="class-index labels need num_classes"):
        MixUp(1.0)(x, torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="3 labels for a batch of 4 images"):
        MixUp(1.0, 3)(x, torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="soft labels have 5 classes, num_classes is 3"):
        CutMix(1.0, 3)(x, torch.zeros(4, 5))
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\), not 3"):
        CutMix(1.0, 3, mode="elem")(x, torch.tensor([0, 1, 2, 3]))
    with pytest.raises(ValueError, match="1-D labels must be integer"):
        MixUp(1.0, 3)(x, torch.zeros(4))
    with pytest.raises(ValueError, match="images must be a batch"):
        MixUp(1.0, 3)(x[0], torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="RandomChoice takes mixers"):
        RandomChoice([MixUp(1.0, 3), T.RandomHorizontalFlip()])
    with pytest.raises(ValueError, match="p has 1 probabilities for 2 transforms"):
        RandomChoice([MixUp(1.0, 3), CutMix(1.0, 3)], p=[1.0])


# ---------------------------------------------------------------- CUDA


@pytest.mark.cuda
def test_cuda_mixers_match_the_cpu() -> None:
    x, labels = batch(b=16, h=20, w=24), torch.arange(16) % 5
    for mixer in [
        MixUp(0.5, 5),
        MixUp(0.5, 5, mode="elem"),
        CutMix(1.0, 5),
        CutMix(1.0, 5, mode="elem"),
        RandomChoice([MixUp(0.2, 5), CutMix(1.0, 5)]),
    ]:
        for seed in range(3):
            cpu = mixer(x, labels, generator=torch.Generator().manual_seed(seed))
            gpu = mixer(x.cuda(), labels.cuda(), generator=torch.Generator().manual_seed(seed))
            assert gpu[0].device.type == "cuda" and gpu[1].device.type == "cuda"
            assert (gpu[0].cpu().int() - cpu[0].int()).abs().max() <= 1
            assert torch.allclose(gpu[1].cpu(), cpu[1], atol=1e-6)
