"""packer.augment.aug_triton: the fused CUDA kernels of the policies and MixUp, run by
Triton's CPU interpreter against the batched torch ops (CI has no GPU)."""

from __future__ import annotations

import pytest

from conftest import REPO, subprocess_env
from helpers.interpreted import run_interpreted

_CODE = r"""
import sys, torch
sys.path.insert(0, "tests/augment")
from test_policies import photo_like
import packer.augment.aug_triton as K
import packer.augment.policies as P
import packer.augment.policy_apply as PA
from packer.augment.augmix import AugMix
from packer.augment.mixing import MixUp
from packer.augment.policy_ops import PolicyDraw

K.TILE = (8, 32, 4)  # fewer programs: the interpreter runs each in Python
K.STATS_BLOCK = 128  # several blocks per channel, a ragged last one


def both(fn):
    PA._BACKEND = "torch"
    ref = fn()
    PA._BACKEND = "triton"
    return fn(), ref


# Every op of TrivialAugmentWide at its extreme and middle magnitudes, both signs.
pol = P.TrivialAugmentWide(fill=(0, 128, 255))
table = pol._table(31, (13, 21))
cases = []
for k, op in enumerate(pol.ops):
    for m in sorted({table[k, 1], table[k, -1]}):  # near zero and the largest
        for sign in (1.0, -1.0) if pol._space[op][1] else (1.0,):
            cases.append((k, m * sign + 0.0))
x = photo_like(len(cases), 13, 21, seed=1)
op = torch.tensor([[k] for k, _ in cases])
mag = torch.tensor([[m] for _, m in cases], dtype=torch.float64)
draw = PolicyDraw(op, mag, torch.sign(mag), torch.zeros_like(op))
out, ref = both(lambda: pol.apply(x, draw))
for i, (k, m) in enumerate(cases):
    d = (out[i].int() - ref[i].int()).abs()
    assert d.max() <= 1 and d.float().mean() <= 0.01, (pol.ops[k], m, d.max())

# The policies end to end: interpolations, fills, several stages, AugMix's chains. Six
# images a policy (six gray) reach every branch the twelve (sixteen) reached that the
# section above does not: the warp bilinear with and without a fill, nearest with a
# scalar fill, and on one channel the contrast table and the warp; the ops whose code
# takes no interpolation or fill (tables, saturation, sharpness) are each checked above.
K.TILE = (16, 32, 4)  # one ragged tile an image: the tiles' offsets are checked above
runs = [
    (P.TrivialAugmentWide(interpolation="bilinear", fill=[10, 200, 30]), 0),
    (P.RandAugment(num_ops=2, magnitude=13, fill=7), 2),
    (AugMix(mixture_width=2, chain_depth=2), 4),
]
for policy, seed in runs:
    x = photo_like(6, 14, 18, seed=seed)
    out, ref = both(lambda: policy(x, generator=torch.Generator().manual_seed(seed)))
    d = (out.int() - ref.int()).abs()
    assert out.dtype == torch.uint8 and out.shape == x.shape
    assert d.float().mean() < 0.05 and (d > 1).float().mean() < 0.002, (policy, d.max())
gray = photo_like(6, 14, 18)[:, :1].contiguous()
out, ref = both(lambda: P.RandAugment()(gray, generator=torch.Generator().manual_seed(1)))
assert (out.int() - ref.int()).abs().max() <= 1

# MixUp's one-pass kernel: torchvision's bits.
x = torch.randn(5, 3, 7, 9, generator=torch.Generator().manual_seed(0))
lam = float(MixUp(0.4).sample(5, torch.Generator().manual_seed(2))[0])
assert torch.equal(K.mixup(x, lam), x.roll(1, 0).mul_(1.0 - lam).add_(x.mul(lam)))
# RandomErasing's one-pass kernel: the torch path's pixels, in place or not.
import packer.augment.erasing as E
import packer.transforms as T
E._erase_kernels = lambda images: K
for value, dtype in ((0, torch.float32), ((1, 2, 3), torch.uint8), (-0.5, torch.float32)):
    x = photo_like(6, 15, 19, seed=3).to(dtype)
    tf = T.RandomErasing(0.7, value=value)
    out = tf(x, generator=torch.Generator().manual_seed(4))
    K.ERASE_TILE = (8, 16, 1)  # 15x19: 2x2 tiles, the last of each ragged
    E._erase_kernels = lambda images: None
    ref = tf(x, generator=torch.Generator().manual_seed(4))
    E._erase_kernels = lambda images: K
    assert torch.equal(out, ref) and not torch.equal(out, x)
    y = x.clone()
    T.RandomErasing(0.7, value=value, inplace=True)(y, generator=torch.Generator().manual_seed(4))
    assert torch.equal(y, ref)
print("ok")
"""


@pytest.mark.slow
@pytest.mark.xdist_group("triton-interpreter")  # one zygote (helpers.interpreted)
def test_fused_kernels_under_the_interpreter() -> None:
    pytest.importorskip("triton")
    import torch

    if torch.cuda.is_available():  # the compiled kernels run in the CUDA tests there
        pytest.skip("a GPU is present: the CUDA tests run the compiled kernels")
    r = run_interpreted(_CODE, subprocess_env(TRITON_INTERPRET="1"), cwd=REPO, timeout=300)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]
