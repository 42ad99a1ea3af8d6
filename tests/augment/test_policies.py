"""packer.augment.policies: torchvision's op spaces and draws, per image, in a few batched calls."""

from __future__ import annotations

import functools
import math
from collections import Counter

import numpy as np
import pytest
import torch
from torch import nn
from torchvision.transforms import v2

import packer.transforms as T
from packer.augment import functional as F
from packer.augment import warps
from packer.augment.augmix import AugMix
from packer.augment.policies import (
    AutoAugment,
    PolicyDraw,
    RandAugment,
    TrivialAugmentWide,
)

H, W = 30, 44
POLICIES = {
    "trivial": (TrivialAugmentWide, v2.TrivialAugmentWide, {}),
    "rand": (RandAugment, v2.RandAugment, {"num_ops": 2, "magnitude": 13}),
    "auto": (AutoAugment, v2.AutoAugment, {}),
    "augmix": (AugMix, v2.AugMix, {"alpha": 0.7}),
}


def photo_like(b: int, h: int = H, w: int = W, seed: int = 0) -> torch.Tensor:
    """uint8 [b, 3, h, w]: smooth shapes plus sharp speckles, each image its own contrast."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(b, 3, max(h // 6, 2), max(w // 6, 2), generator=g) * 255
    x = nn.functional.interpolate(x, size=(h, w), mode="bicubic", align_corners=False)
    noise = torch.randint(0, 256, (b, 3, h, w), generator=g).float()
    x = torch.where(torch.rand(b, 1, h, w, generator=g) < 0.05, noise, x)
    x = x * torch.rand(b, 1, 1, 1, generator=g) + 40 * torch.rand(b, 1, 1, 1, generator=g)
    return x.round().clamp(0, 255).to(torch.uint8)


# ---------------------------------------------------------------- statistics


def chi2_critical(df: int, z: float = 3.09) -> float:
    """Upper 0.001 quantile of chi-square(df), Wilson-Hilferty's approximation."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def chi2_two_sample(a: Counter, b: Counter, min_count: int = 10) -> tuple[float, float]:
    """(statistic, 0.001 critical value) of the two-sample chi-square over the categories
    of ``a`` and ``b`` (rare ones pooled)."""
    na, nb = sum(a.values()), sum(b.values())
    cats = [c for c in set(a) | set(b) if a[c] + b[c] >= min_count]
    rest = (na - sum(a[c] for c in cats), nb - sum(b[c] for c in cats))
    cells = [(a[c], b[c]) for c in cats] + ([rest] if sum(rest) else [])
    ka, kb = math.sqrt(nb / na), math.sqrt(na / nb)
    stat = sum((ka * x - kb * y) ** 2 / (x + y) for x, y in cells)
    return stat, chi2_critical(max(len(cells) - 1, 1))


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.sort(np.asarray(a, np.float64)), np.sort(np.asarray(b, np.float64))
    grid = np.concatenate([a, b])
    fa = np.searchsorted(a, grid, side="right") / len(a)
    fb = np.searchsorted(b, grid, side="right") / len(b)
    return float(np.abs(fa - fb).max())


def ks_limit(n: int, m: int) -> float:
    return 1.95 * math.sqrt((n + m) / (n * m))  # alpha = 0.001; seeds are fixed


def torchvision_draws(tv_cls: type, n: int, **kw: object) -> tuple[list, list]:
    """torchvision's own sampling, ``n`` times on a small image: per call, the
    (op, magnitude) pairs it applied in order, and (AugMix) its Dirichlet draws."""
    return _torchvision_draws(tv_cls, n, tuple(sorted(kw.items())))


@functools.lru_cache(maxsize=8)
def _torchvision_draws(tv_cls: type, n: int, kw: tuple) -> tuple[list, list]:

    class Recorder(tv_cls):
        def _apply_image_or_video_transform(self, image, transform_id, magnitude, **_):
            self.calls.append((transform_id, magnitude))
            return image

        def _sample_dirichlet(self, params):
            out = super()._sample_dirichlet(params)
            self.dirichlet.append(out)
            return out

    t = Recorder(**dict(kw))
    img = torch.zeros(3, H, W, dtype=torch.uint8)
    torch.manual_seed(0)
    calls, dirichlet = [], []
    for _ in range(n):
        t.calls, t.dirichlet = [], []
        t(img)
        calls.append(t.calls)
        dirichlet.append(t.dirichlet)
    return calls, dirichlet


def our_calls(policy: object, draw: PolicyDraw) -> list:
    """Per image, the (op, magnitude) pairs ``draw`` applies, in order (skipped ops left out)."""
    ops, mags = draw.op.tolist(), draw.magnitude.tolist()
    return [
        [(policy.ops[o], m) for o, m in zip(row_o, row_m) if o >= 0]
        for row_o, row_m in zip(ops, mags)
    ]


# ---------------------------------------------------------------- op spaces and draws


@pytest.mark.parametrize("name", list(POLICIES))
def test_op_space_and_magnitudes_are_torchvisions(name: str) -> None:
    ours_cls, tv_cls, kw = POLICIES[name]
    for extra in [{}, {"all_ops": False}] if name == "augmix" else [{}]:
        ours, tv = ours_cls(**kw, **extra), tv_cls(**kw, **extra)
        space = tv._AUGMENTATION_SPACE
        if extra.get("all_ops") is False:
            space = tv._PARTIAL_AUGMENTATION_SPACE
        assert ours.ops == tuple(space)
        bins = {"trivial": 31, "rand": 31}.get(name, 10)
        table = ours._table(bins, (H, W))
        for k, (fn, signed) in enumerate(space.values()):
            ref = fn(bins, H, W)
            if ref is None:
                assert not table[k].any()
            else:
                assert np.array_equal(table[k], ref.to(torch.float32).double().numpy())
            assert ours._space[ours.ops[k]][1] == signed


@pytest.mark.parametrize("name", list(POLICIES))
def test_draws_follow_torchvisions_sampling(name: str) -> None:
    ours_cls, tv_cls, kw = POLICIES[name]
    n = 2000 if name == "augmix" else 4000  # AugMix: 9 draws an image, slower to record
    ref, _ = torchvision_draws(tv_cls, n, **kw)
    policy = ours_cls(**kw)
    draw = policy.sample(n, torch.Generator().manual_seed(1), size=(H, W))
    if name == "augmix":
        draw = draw.chains
    ours = our_calls(policy, draw)
    # Which ops, in which order (AutoAugment: its sub-policies and their probabilities).
    key = (lambda c: tuple(op for op, _ in c)) if name == "auto" else (lambda c: len(c))
    stat, crit = chi2_two_sample(Counter(map(key, ours)), Counter(map(key, ref)))
    assert stat < crit, f"op sequences: chi-square {stat:.1f} >= {crit:.1f}"
    flat_ours = [c for calls in ours for c in calls]
    flat_ref = [c for calls in ref for c in calls]
    stat, crit = chi2_two_sample(Counter(o for o, _ in flat_ours), Counter(o for o, _ in flat_ref))
    assert stat < crit, f"op choice: chi-square {stat:.1f} >= {crit:.1f}"
    # Magnitudes and signs, op by op: the same values with the same frequencies.
    space = tv_cls._AUGMENTATION_SPACE
    bins = 31 if name in ("trivial", "rand") else 10
    for op in policy.ops:
        a = [m for o, m in flat_ours if o == op]
        b = [m for o, m in flat_ref if o == op]
        if not b:  # an op of the space no sub-policy uses (AutoAugment)
            assert not a, f"{op}: drawn, but torchvision never draws it"
            continue
        stat, crit = chi2_two_sample(Counter(a), Counter(b))
        assert stat < crit, f"{op} magnitudes: chi-square {stat:.1f} >= {crit:.1f}"
        table = space[op][0](bins, H, W)
        allowed = {0.0} if table is None else {s * float(v) for v in table for s in (1, -1)}
        assert set(a) <= allowed, f"{op}: magnitudes torchvision never draws"


def test_bins_and_signs_are_uniform() -> None:
    n = 20000
    ta = TrivialAugmentWide()
    d = ta.sample(n, torch.Generator().manual_seed(0))
    assert d.op.shape == d.bin.shape == d.sign.shape == d.magnitude.shape == (n, 1)
    counts = np.bincount(d.bin.view(-1).numpy(), minlength=31)
    stat = ((counts - n / 31) ** 2 / (n / 31)).sum()
    assert stat < chi2_critical(30)
    counts = np.bincount(d.op.view(-1).numpy(), minlength=14)
    assert ((counts - n / 14) ** 2 / (n / 14)).sum() < chi2_critical(13)
    signed = torch.tensor([s for _, s in ta._space.values()])[d.op.view(-1)]
    neg = d.sign.view(-1) < 0
    assert not neg[~signed].any()
    assert abs(neg[signed].double().mean().item() - 0.5) < 0.02
    nonzero = d.magnitude.view(-1) != 0
    assert torch.equal(torch.sign(d.magnitude.view(-1))[nonzero], d.sign.view(-1)[nonzero])
    ra = RandAugment(num_ops=3, magnitude=5, num_magnitude_bins=11)
    d = ra.sample(1000, torch.Generator().manual_seed(0), size=(H, W))
    assert d.op.shape == (1000, 3) and bool((d.bin == 5).all())


def test_augmix_weights_depths_and_chains_follow_torchvision() -> None:
    n, alpha = 2000, 0.7
    _, dirichlet = torchvision_draws(v2.AugMix, n, alpha=alpha)
    ref_m = np.array([float(d[0][0, 0]) for d in dirichlet])
    ref_w = np.array([(d[1][0] * d[0][0, 1]).tolist() for d in dirichlet])
    am = AugMix(alpha=alpha)
    draw = am.sample(n, torch.Generator().manual_seed(0), size=(H, W))
    w = draw.weights.double().numpy()
    assert draw.weights.shape == (n, 4)
    assert np.allclose(w.sum(1), 1.0, atol=1e-5)  # m + (1 - m) * Dirichlet
    lim = ks_limit(n, n)
    assert ks_statistic(w[:, 0], ref_m) < lim
    assert ks_statistic(w[:, 0], np.random.default_rng(0).beta(alpha, alpha, n)) < lim
    for i in range(3):
        assert ks_statistic(w[:, 1 + i], ref_w[:, i]) < lim
    # Depths uniform over 1..3; a chain's ops past its depth are none.
    counts = np.bincount(draw.depth.view(-1).numpy(), minlength=4)
    assert counts[0] == 0 and ((counts[1:] - 3 * n / 3) ** 2 / n).sum() < chi2_critical(2)
    op = draw.chains.op.view(n, 3, 3)
    steps = torch.arange(3)
    assert torch.equal(op >= 0, steps < draw.depth[:, :, None])
    fixed = AugMix(chain_depth=2, mixture_width=2, severity=1).sample(50, size=(H, W))
    assert fixed.chains.op.shape == (50, 4) and bool((fixed.depth == 2).all())
    assert bool((fixed.chains.op >= 0).all()) and bool((fixed.chains.bin == 0).all())
    partial = AugMix(all_ops=False).sample(2000, size=(H, W))
    names = {AugMix(all_ops=False).ops[o] for o in partial.chains.op.view(-1).tolist() if o >= 0}
    assert names == set(v2.AugMix._PARTIAL_AUGMENTATION_SPACE)


# ---------------------------------------------------------------- pixels


def torchvision_apply(tv: object, img: torch.Tensor, calls: list) -> torch.Tensor:
    for op, mag in calls:
        img = tv._apply_image_or_video_transform(
            img, op, mag, interpolation=tv.interpolation, fill=tv._fill
        )
    return img


@pytest.mark.parametrize(
    "name, interpolation, fill",
    [
        ("trivial", "nearest", None),
        ("trivial", "bilinear", [10, 200, 30]),
        ("rand", "nearest", 7),
        ("rand", "bilinear", None),
        ("auto", "nearest", None),
    ],
)
def test_pixels_match_torchvision_for_the_same_draws(
    name: str, interpolation: str, fill: object
) -> None:
    ours_cls, tv_cls, kw = POLICIES[name]
    x = photo_like(120)
    policy = ours_cls(**kw, interpolation=interpolation, fill=fill)
    tv = tv_cls(**kw, interpolation=v2.InterpolationMode(interpolation), fill=fill)
    out = policy(x, generator=torch.Generator().manual_seed(3))
    draw = policy.sample(120, torch.Generator().manual_seed(3), size=(H, W))
    assert out.dtype == torch.uint8 and out.shape == x.shape
    ref = torch.stack([torchvision_apply(tv, img, c) for img, c in zip(x, our_calls(policy, draw))])
    diff = (out.int() - ref.int()).abs()
    assert diff.float().mean() <= 0.01  # in practice: equal
    assert diff.flatten(1).float().mean(1).max() <= 1.0  # within 1/255 mean, image by image


@pytest.mark.parametrize("name", ["trivial", "rand", "auto"])
def test_every_op_at_its_extremes_matches_torchvision(name: str) -> None:
    ours_cls, tv_cls, kw = POLICIES[name]
    policy, tv = ours_cls(**kw, fill=(0, 128, 255)), tv_cls(**kw, fill=(0, 128, 255))
    bins = 31 if name != "auto" else 10
    table = policy._table(bins, (H, W))
    cases = []
    for k, op in enumerate(policy.ops):
        for m in sorted({table[k, 0], table[k, 1], table[k, -1], table[k, bins // 2]}):
            for sign in (1.0, -1.0) if policy._space[op][1] else (1.0,):
                cases.append((k, m * sign + 0.0))
    x = photo_like(len(cases), seed=1)
    op = torch.tensor([[k] for k, _ in cases])
    mag = torch.tensor([[m] for _, m in cases], dtype=torch.float64)
    out = policy.apply(x, PolicyDraw(op, mag, torch.sign(mag), torch.zeros_like(op)))
    for i, (k, m) in enumerate(cases):
        ref = torchvision_apply(tv, x[i], [(policy.ops[k], m)])
        d = (out[i].int() - ref.int()).abs()
        assert d.float().mean() <= 1.0 and (d > 1).float().mean() < 0.01, (policy.ops[k], m)


def test_augmix_pixels_match_torchvision_for_the_same_draws() -> None:
    x = photo_like(60)
    am = AugMix(fill=[0, 128, 255])
    tv = v2.AugMix(fill=[0, 128, 255])
    draw = am.sample(60, torch.Generator().manual_seed(0), size=(H, W))
    out = am(x, generator=torch.Generator().manual_seed(0))
    calls = our_calls(am, draw.chains)
    ops = draw.chains.op.view(60, 3, 3)
    worst = 0.0
    for i in range(60):
        w = draw.weights[i]
        mix = w[0] * x[i]  # torchvision's mix, with these draws
        start = 0
        for c in range(3):
            depth = int((ops[i, c] >= 0).sum())
            aug = torchvision_apply(tv, x[i], calls[i][start : start + depth])
            start += depth
            mix.add_(w[1 + c] * aug)
        diff = (out[i].int() - mix.to(torch.uint8).int()).abs()
        worst = max(worst, diff.float().mean().item())
    assert worst <= 0.05  # in practice: equal


# ---------------------------------------------------------------- batching and seeds

_COUNTED = (
    "warp",
    "adjust_brightness",
    "adjust_saturation",
    "adjust_contrast",
    "adjust_sharpness",
    "posterize",
    "solarize",
    "autocontrast",
    "equalize",
    "invert",
)


@pytest.mark.parametrize("name", ["trivial", "rand", "auto"])
def test_a_batch_costs_one_call_per_op_present(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, int]] = []
    for fn in _COUNTED:
        module = warps if fn == "warp" else F
        orig = getattr(module, fn)

        def counted(img, *a, _orig=orig, _fn=fn, **kw):
            calls.append((_fn, img.shape[0]))
            return _orig(img, *a, **kw)

        monkeypatch.setattr(module, fn, counted)
    ours_cls, _, kw = POLICIES[name]
    policy = ours_cls(**kw)
    b = 256
    x = photo_like(b, 16, 16)
    out = policy(x, generator=torch.Generator().manual_seed(0))
    draw = policy.sample(b, torch.Generator().manual_seed(0), size=(16, 16))
    assert len({tuple(r) for r in draw.op.tolist()}) > 10  # images draw different ops
    # One call per batched op present in each stage (the five warps are one affine call).
    fam = policy._plan.family[draw.op.numpy()]
    expected = sum(len(set(fam[:, k].tolist()) - {0}) for k in range(fam.shape[1]))
    assert len(calls) == expected <= 10 * fam.shape[1]  # a handful of calls, not ~B
    changed = sum(n for _, n in calls)
    ident = policy.ops.index("Identity") if "Identity" in policy.ops else -1
    applied = int(((draw.op >= 0) & (draw.op != ident)).sum())
    assert changed == applied  # each image goes to exactly the op it drew
    assert out.shape == x.shape


@pytest.mark.parametrize("name", list(POLICIES))
def test_fused_table_rows_looked_up_equal_the_computed_ones(name: str) -> None:
    from packer.augment.policy_apply import fused_table

    ours_cls, _, kw = POLICIES[name]
    policy = ours_cls(**kw, fill=3)
    for c, h, w in ((3, H, W), (1, 17, 23)):
        draw = policy.sample(300, torch.Generator().manual_seed(5), size=(h, w))
        chains = draw.chains if name == "augmix" else draw
        op, mag = chains.op.numpy(), chains.magnitude.numpy()
        table, live, lut = fused_table(policy._plan, op, mag, h, w, c)
        neg = (chains.sign.numpy() < 0).astype(np.int64)
        rows = policy._rows(h, w, c)[op, chains.bin.numpy(), neg]
        assert np.array_equal(rows.transpose(1, 0, 2), table)
        assert live.any() and lut.any()


def test_same_seed_same_batch_and_per_image_ops() -> None:
    x = photo_like(64)
    for policy in [TrivialAugmentWide(), RandAugment(), AutoAugment("svhn"), AugMix()]:
        a = policy(x, generator=torch.Generator().manual_seed(1))
        b = policy(x, generator=torch.Generator().manual_seed(1))
        c = policy(x, generator=torch.Generator().manual_seed(2))
        assert torch.equal(a, b)
        assert not torch.equal(a, c)
        assert not torch.equal(x, a)  # the input is left as it was, and some image changed
    assert torch.equal(x, photo_like(64))
    ident = TrivialAugmentWide()
    op = torch.zeros(4, 1, dtype=torch.int64)  # Identity everywhere: a copy
    out = ident.apply(x[:4], PolicyDraw(op, torch.zeros(4, 1, dtype=torch.float64), op, op))
    assert torch.equal(out, x[:4]) and out.data_ptr() != x.data_ptr()


def test_compose_with_a_policy_and_a_mixer() -> None:
    x, labels = photo_like(8, 40, 40), torch.arange(8) % 4
    tf = T.Compose(
        [T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.TrivialAugmentWide(), T.MixUp(0.2, 4)]
    )
    out, soft = tf(x, labels, generator=torch.Generator().manual_seed(0))
    assert out.shape == (8, 3, 24, 24) and out.dtype == torch.uint8
    assert soft.shape == (8, 4) and torch.allclose(soft.sum(1), torch.ones(8))
    again = tf(x, labels, generator=torch.Generator().manual_seed(0))
    assert torch.equal(out, again[0]) and torch.equal(soft, again[1])


def test_bad_arguments_raise_value_error() -> None:
    with pytest.raises(ValueError, match="num_magnitude_bins must be an int >= 2"):
        TrivialAugmentWide(num_magnitude_bins=1)
    with pytest.raises(ValueError, match=r"magnitude must be an int bin in \[0, 31\)"):
        RandAugment(magnitude=31)
    with pytest.raises(ValueError, match="num_ops must be a non-negative int"):
        RandAugment(num_ops=-1)
    with pytest.raises(ValueError, match="policy must be 'imagenet', 'cifar10' or 'svhn'"):
        AutoAugment("coco")
    with pytest.raises(ValueError, match=r"severity must be an int in \[1, 10\]"):
        AugMix(severity=0)
    with pytest.raises(ValueError, match="alpha must be a positive number"):
        AugMix(alpha=0)
    with pytest.raises(ValueError, match="fill must be None, a number or one number"):
        RandAugment(fill="white")
    with pytest.raises(ValueError, match=r"needs size=\(height, width\)"):
        RandAugment().sample(4)
    with pytest.raises(ValueError, match="must be uint8"):
        TrivialAugmentWide()(torch.rand(2, 3, 8, 8))
    assert AutoAugment(v2.AutoAugmentPolicy.CIFAR10).policy == "cifar10"
    assert RandAugment(interpolation=v2.InterpolationMode.BILINEAR).interpolation == "bilinear"


# ---------------------------------------------------------------- CUDA


@pytest.mark.cuda
@pytest.mark.parametrize("name", list(POLICIES))
def test_cuda_matches_the_cpu(name: str) -> None:
    ours_cls, _, kw = POLICIES[name]
    policy = ours_cls(**kw)
    x = photo_like(64)
    cpu = policy(x, generator=torch.Generator().manual_seed(0))
    gpu = policy(x.cuda(), generator=torch.Generator().manual_seed(0))
    assert gpu.device.type == "cuda"
    d = (gpu.cpu().int() - cpu.int()).abs()
    assert d.float().mean() < 0.05 and (d > 1).float().mean() < 0.001


@pytest.mark.cuda
def test_cuda_policies_never_make_the_host_wait() -> None:
    x = photo_like(64).cuda()
    labels = (torch.arange(64) % 5).cuda()
    tfs = [POLICIES[n][0](**POLICIES[n][2]) for n in POLICIES]
    mix = T.Compose([T.RandomChoice([T.MixUp(0.2, 5), T.CutMix(1.0, 5, mode="elem")])])
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for tf in tfs:
            tf(x, generator=torch.Generator().manual_seed(0))
        for seed in range(4):
            mix(x, labels, generator=torch.Generator().manual_seed(seed))
    finally:
        torch.cuda.set_sync_debug_mode(0)
