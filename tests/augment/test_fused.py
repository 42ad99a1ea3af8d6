"""packer.augment.fused: the recipe's ops in a Compose as a few kernels, with the draws
and pixels of the ops run one by one (matching here; the kernels under Triton's
interpreter; on CUDA against the op-by-op path)."""

from __future__ import annotations

import pytest
import torch

import packer
import packer.transforms as T
from aug_checks import photo_like
from conftest import REPO, subprocess_env
from helpers.interpreted import run_interpreted
from packer.augment import fused, policy_apply


def _recipe(size: int = 24, classes: int = 5, policy: object = None, **erase: object) -> T.Compose:
    policy = T.TrivialAugmentWide() if policy is None else policy
    mix = T.RandomChoice([T.MixUp(0.2, classes), T.CutMix(1.0, classes)])
    return T.Compose(
        [
            T.RandomResizedCrop(size),
            T.RandomHorizontalFlip(),
            policy,
            packer.Normalize(),
            T.RandomErasing(**{"p": 0.5, **erase}),
            mix,
        ]
    )


def _swap(images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return images.flip(0), labels.flip(0)


_swap.mixes_labels = True  # type: ignore[attr-defined]


def test_the_recipe_is_one_run() -> None:
    mods = list(_recipe())
    plan = fused.match(mods, 0)
    assert plan is not None and plan.end == 6
    assert plan.crop is mods[0] and plan.policy is mods[2] and plan.mixer is mods[5]
    assert fused.match(mods, 4) is None  # erasing alone: nothing to fuse


def test_what_the_run_leaves_to_the_ops() -> None:
    # AugMix, noise erasing and per-image mixers stay op by op; the run stops before them.
    mods = list(_recipe(policy=T.AugMix()))
    assert fused.match(mods, 0) is None  # the crop alone: its own one launch already
    assert fused.match(mods, 3).end == 6  # Normalize, erasing, mixer
    mods = list(_recipe(value="random"))
    assert fused.match(mods, 0).end == 4  # crop, flip, policy, Normalize
    mods = [packer.Normalize(), T.RandomErasing(), T.MixUp(0.2, 5, mode="elem")]
    assert fused.match(mods, 0).end == 2
    assert fused.match([T.RandomResizedCrop(8), T.RandomHorizontalFlip()], 0) is None
    plain = T.RandomChoice([T.MixUp(0.2, 5), _swap])  # a callable mixer: op by op
    assert fused.match([packer.Normalize(), plain], 0).end == 1
    mixed_k = T.RandomChoice([T.MixUp(0.2, 5), T.CutMix(1.0, 6)])
    assert fused.match([packer.Normalize(), mixed_k], 0).end == 1
    fused.ENABLED = False
    try:
        assert fused.match(list(_recipe()), 0) is None
    finally:
        fused.ENABLED = True


def test_which_batches_take_it() -> None:
    plan = fused.match(list(_recipe()), 0)
    x = photo_like(4, 32, 32)
    labels = torch.tensor([0, 1, 2, 3])
    assert not plan.applies(x, labels)  # a CPU batch: op by op
    fused.DEVICES, policy_apply._BACKEND = "any", "triton"
    try:
        assert plan.applies(x, labels)
        assert not plan.applies(x, None)  # the mixer needs labels: the op path raises
        assert not plan.applies(x, torch.rand(4, 5))  # soft labels
        assert not plan.applies(x.float(), labels)
        assert not plan.applies(x[:, :2], labels)
    finally:
        fused.DEVICES, policy_apply._BACKEND = "cuda", "auto"


def test_op_by_op_on_the_cpu_as_before() -> None:
    # A CPU batch never takes the fused path: the same result with it off.
    tf = _recipe()
    x = photo_like(4, 32, 32)
    labels = torch.tensor([0, 1, 2, 3])
    a = tf(x, labels, generator=torch.Generator().manual_seed(3))
    fused.ENABLED = False
    try:
        b = tf(x, labels, generator=torch.Generator().manual_seed(3))
    finally:
        fused.ENABLED = True
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("policy", ["ta", "ra", "aa"])
def test_policy_table_holds_the_policys_own_draw(policy: str) -> None:
    # The fused table is looked up by index; it must hold the rows of the ops, bins and
    # signs that the policy's sample draws from the same generator state.
    pol = {"ta": T.TrivialAugmentWide(), "ra": T.RandAugment(), "aa": T.AutoAugment()}[policy]
    g, g2 = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    table, live, lut = fused._policy_table(pol, 300, 3, 20, 24, g)
    kind = table[..., 0]
    op, bins, negative = pol._draw(300, g2)
    assert torch.equal(g.get_state(), g2.get_state())  # the same draws, the same count
    rows = pol._rows(20, 24, 3)[op, bins, negative.astype(int)]  # [B, S, 12]
    assert table.shape == (op.shape[1], 300, policy_apply.NCOL)
    assert (table == rows.transpose(1, 0, 2)).all()
    assert (live == (kind != 0).any(1)).all() and (lut == (kind == 1).any(1)).all()
    draw = pol.sample(300, torch.Generator().manual_seed(4), size=(20, 24))
    assert (draw.op.numpy() == op).all() and (draw.bin.numpy() == bins).all()
    assert ((draw.sign.numpy() < 0) == negative).all()


_CODE = r"""
import sys, torch
sys.path.insert(0, "tests")
from aug_checks import photo_like
import packer, packer.transforms as T
import packer.augment.aug_triton as K
import packer.augment.fused as FU
import packer.augment.policy_apply as PA
import packer.augment.tail_triton as KT

K.TILE = (8, 32, 4)  # fewer programs: the interpreter runs each in Python
K.STATS_BLOCK = 128
KT.TAIL_TILE = (4, 16, 1)
FU.DEVICES = "any"
PA._BACKEND = "triton"  # the op-by-op policy runs the same kernels


def both(tf, x, labels, seed):
    g = torch.Generator().manual_seed(seed)
    new = tf(x, labels, generator=g)
    FU.ENABLED = False
    g2 = torch.Generator().manual_seed(seed)
    ref = tf(x, labels, generator=g2)
    FU.ENABLED = True
    assert torch.equal(g.get_state(), g2.get_state())  # the same draws, the same count
    return new, ref


x = photo_like(5, 12, 14, seed=3)
labels = torch.tensor([0, 3, 1, 4, 3])
runs = [(T.TrivialAugmentWide(), T.MixUp(0.2, 5)), (T.RandAugment(fill=9), T.CutMix(1.0, 5))]
for seed, (policy, mixer) in enumerate(runs):
    # Without the crop (whose CPU path resamples otherwise): the pixels up to the
    # rounding of the normalization (one multiply-add here, two in the interpreter).
    tf = T.Compose([policy, packer.Normalize(), T.RandomErasing(0.7), mixer])
    (a, la), (b, lb) = both(tf, x, labels, seed)
    assert a.dtype == torch.float32 and torch.equal(la, lb), (policy, mixer)
    assert (a - b).abs().max() < 1e-5 and not torch.equal(a, packer.Normalize()(x))
# The whole recipe: the same draws and labels; the crop's pixels as its kernel makes them.
mix = T.RandomChoice([T.MixUp(0.2, 5), T.CutMix(1.0, 5)])
tf = T.Compose([T.RandomResizedCrop(10), T.RandomHorizontalFlip(), T.TrivialAugmentWide(),
                packer.Normalize(), T.RandomErasing(0.5), mix])
(a, la), (b, lb) = both(tf, x, labels, 7)
assert a.shape == (5, 3, 10, 10) and torch.equal(la, lb)
assert (a - b).abs().mean() < 0.05
print("ok")
"""


@pytest.mark.xdist_group("triton-interpreter")  # one zygote (helpers.interpreted)
def test_fused_kernels_under_the_interpreter() -> None:
    pytest.importorskip("triton")
    if torch.cuda.is_available():  # the compiled kernels run in the CUDA test there
        pytest.skip("a GPU is present: the CUDA tests run the compiled kernels")
    r = run_interpreted(_CODE, subprocess_env(TRITON_INTERPRET="1"), cwd=REPO, timeout=300)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]


@pytest.mark.cuda
@pytest.mark.parametrize("policy", ["ta", "ra", "aa"])
def test_fused_equals_op_by_op_on_cuda(policy: str) -> None:
    pol = {"ta": T.TrivialAugmentWide(), "ra": T.RandAugment(), "aa": T.AutoAugment()}[policy]
    tf = _recipe(56, 7, policy=pol).cuda()  # Normalize's buffers, for the op-by-op path
    x = photo_like(32, 64, 72, seed=1).cuda()
    labels = torch.randint(0, 7, (32,), generator=torch.Generator().manual_seed(0)).cuda()
    for seed in range(6):  # both mixers drawn
        g, g2 = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        a, la = tf(x, labels, generator=g)
        fused.ENABLED = False
        try:
            b, lb = tf(x, labels, generator=g2)
        finally:
            fused.ENABLED = True
        assert torch.equal(g.get_state(), g2.get_state())
        assert a.shape == (32, 3, 56, 56) and a.dtype == torch.float32
        assert torch.equal(la, lb)
        assert (a - b).abs().max().item() < 1e-5, seed


def test_a_recipe_moves_to_a_device() -> None:
    # Module.to walks the modules through their _apply: a policy must not shadow it.
    tf = _recipe(policy=T.AugMix()).to("cpu", torch.float32)
    assert _recipe().to("cpu")[3].shift.dtype == torch.float32 and len(tf) == 6
