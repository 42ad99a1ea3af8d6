"""interpolation= of the resizing ops (RandomResizedCrop, Resize, resized_crop): every mode
torchvision's resize takes for uint8 tensors, with its pixels; the modes torchvision
refuses (for tensors) refused here with a UsageError naming the op and the argument.

The CPU path is the reference the CUDA kernel is held to: the kernel's logic runs here
under Triton's interpreter, compiled in the CUDA tests."""

from __future__ import annotations

import pytest
import torch
from torchvision.transforms import v2
from torchvision.transforms.v2 import InterpolationMode as I
from torchvision.transforms.v2 import functional as F

import packer.transforms as T
from conftest import REPO, subprocess_env
from helpers.interpreted import run_interpreted
from packer.errors import UsageError

# (mode, antialias) torchvision's resize takes for uint8 tensors.
MODES = [
    ("nearest", True),
    ("nearest-exact", True),
    ("bilinear", True),
    ("bilinear", False),
    ("bicubic", True),
    ("bicubic", False),
    ("lanczos", True),
]
# (image h, w, output h, w): down, up, odd, one axis only, extreme aspect.
SIZES = [(64, 72, 48, 48), (40, 52, 96, 80), (64, 72, 17, 29), (37, 23, 37, 9), (30, 7, 5, 20)]


def noise(b: int, h: int, w: int, seed: int) -> torch.Tensor:
    """uint8 [b, 3, h, w] noise: every pixel an edge, the worst case for overshoot."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (b, 3, h, w), generator=g, dtype=torch.uint8)


def tv_crops(x, boxes, size, mode, aa) -> torch.Tensor:
    return torch.stack(
        [
            F.resized_crop(im, *b.tolist(), size=list(size), interpolation=I(mode), antialias=aa)
            for im, b in zip(x, boxes)
        ]
    )


def check_close(ours: torch.Tensor, ref: torch.Tensor, mode: str) -> None:
    """Nearest: equal. Bilinear: within rounding (torch rounds its width pass to bytes,
    the float path does not). Bicubic and lanczos: the same rounding and clamping of the
    width pass, so all but a few pixels equal (torch's weights are 15-bit fixed point)."""
    assert ours.shape == ref.shape and ours.dtype == torch.uint8
    d = (ours.int() - ref.int()).abs()
    if mode.startswith("nearest"):
        assert torch.equal(ours, ref)
        return
    assert d.max() <= 2, d.max()
    share = (d > 0).float().mean().item()
    assert share < (0.3 if mode == "bilinear" else 0.02), share


@pytest.mark.parametrize("mode, aa", MODES)
def test_resized_crop_equals_torchvision(mode: str, aa: bool) -> None:
    for k, (h, w, oh, ow) in enumerate(SIZES):
        x = noise(6, h, w, seed=k)
        boxes = T.RandomResizedCrop(8).sample_boxes(6, h, w, torch.Generator().manual_seed(k))
        boxes[0] = torch.tensor([0, 0, h, w])  # the whole image
        boxes[1] = torch.tensor([h - 1, w - 1, 1, 1])  # one pixel, in the corner
        ours = T.resized_crop(x, boxes, (oh, ow), interpolation=mode, antialias=aa)
        check_close(ours, tv_crops(x, boxes, (oh, ow), mode, aa), mode)


def test_the_modes_are_honoured() -> None:
    # Each mode gives its own pixels: bicubic is not bilinear renamed (and bilinear stays
    # the default, byte for byte).
    x = noise(4, 40, 52, seed=1)
    boxes = torch.tensor([[0, 0, 40, 52]] * 4)
    outs = {m: T.resized_crop(x, boxes, (30, 70), interpolation=m) for m, _ in MODES}
    assert torch.equal(T.resized_crop(x, boxes, (30, 70)), outs["bilinear"])
    names = list(outs)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert (outs[a] != outs[b]).float().mean() > 0.1, (a, b)
    bicubic_sharp = T.resized_crop(x, boxes, (15, 20), interpolation="bicubic", antialias=False)
    assert (bicubic_sharp != T.resized_crop(x, boxes, (15, 20), interpolation="bicubic")).any()


@pytest.mark.parametrize("mode, aa", MODES)
def test_random_resized_crop_module_equals_torchvision(mode: str, aa: bool) -> None:
    x = noise(5, 50, 60, seed=2)
    rrc = T.RandomResizedCrop(24, interpolation=I(mode), antialias=aa)  # the enum, too
    assert rrc.interpolation == mode
    out = rrc(x, generator=torch.Generator().manual_seed(0))
    boxes = rrc.sample_boxes(5, 50, 60, torch.Generator().manual_seed(0))
    check_close(out, tv_crops(x, boxes, (24, 24), mode, aa), mode)
    # The crop + flip of a Compose (one resample) keeps the mode.
    both = T.Compose([rrc, T.RandomHorizontalFlip()])(x, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(0)
    boxes = rrc.sample_boxes(5, 50, 60, g)
    flip = T.RandomHorizontalFlip().sample(5, g)
    ref = tv_crops(x, boxes, (24, 24), mode, aa)
    check_close(both, torch.where(flip[:, None, None, None], ref.flip(-1), ref), mode)


@pytest.mark.parametrize("mode, aa", MODES)
def test_resize_module_equals_torchvision(mode: str, aa: bool) -> None:
    x = noise(3, 37, 50, seed=3)
    for size in [24, (30, 64), 80, (37, 20)]:
        ours = T.Resize(size, mode, antialias=aa)(x)
        ref = v2.Resize(size, interpolation=I(mode), antialias=aa)(x)
        check_close(ours, ref, mode)


def test_repr_names_a_mode_other_than_the_default() -> None:
    assert "interpolation" not in repr(T.RandomResizedCrop(8))
    assert "interpolation='bicubic'" in repr(T.RandomResizedCrop(8, interpolation="bicubic"))
    r = repr(T.Resize(8, "bilinear", antialias=False))
    assert "antialias=False" in r and "interpolation" not in r


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: T.RandomResizedCrop(8, interpolation="box"), "RandomResizedCrop: interpolation"),
        (lambda: T.RandomResizedCrop(8, interpolation=I.HAMMING), "RandomResizedCrop: interp"),
        (lambda: T.Resize(8, interpolation="cubic"), "Resize: interpolation must be one of"),
        (lambda: T.Resize(8, "lanczos", antialias=False), "Resize: interpolation 'lanczos' needs"),
        (lambda: T.RandomResizedCrop(8, antialias="yes"), "RandomResizedCrop: antialias must be"),
        (
            lambda: T.resized_crop(
                torch.zeros(1, 3, 4, 4, dtype=torch.uint8),
                torch.tensor([[0, 0, 4, 4]]),
                2,
                interpolation="area",
            ),
            "resized_crop: interpolation must be one of 'nearest', 'nearest-exact', 'bilinear'",
        ),
    ],
)
def test_refused_resize_modes_name_the_op_and_argument(make, match: str) -> None:
    with pytest.raises(UsageError, match=match) as e:
        make()
    assert e.value.exit_code == 2


def test_torchvision_refuses_what_the_resizes_refuse() -> None:
    x = noise(1, 8, 8, seed=0)[0]
    with pytest.raises((ValueError, NotImplementedError)):
        F.resize(x, [4, 4], interpolation=I.BOX)
    with pytest.raises(ValueError, match="LANCZOS requires antialias=True"):
        F.resize(x, [4, 4], interpolation=I.LANCZOS, antialias=False)


@pytest.mark.parametrize(
    "make, op",
    [
        (lambda m: T.RandomRotation(5, interpolation=m), "RandomRotation"),
        (lambda m: T.RandomAffine(5, interpolation=m), "RandomAffine"),
        (lambda m: T.TrivialAugmentWide(interpolation=m), "TrivialAugmentWide"),
        (lambda m: T.RandAugment(interpolation=m), "RandAugment"),
        (lambda m: T.AutoAugment(interpolation=m), "AutoAugment"),
        (lambda m: T.AugMix(interpolation=m), "AugMix"),
    ],
)
def test_warps_take_what_torchvisions_tensor_warps_take(make, op: str) -> None:
    # torchvision's affine, rotate and policies take nearest and bilinear for tensors and
    # refuse the rest (bicubic among them): the same here, up front, naming the op.
    for mode in ("nearest", I.BILINEAR):
        assert make(mode).interpolation == getattr(mode, "value", mode)
    for mode in ("bicubic", I.NEAREST_EXACT, "lanczos"):
        with pytest.raises(UsageError, match=f"{op}: interpolation must be one of 'nearest', "):
            make(mode)
    with pytest.raises(UsageError, match="bicubic and lanczos are for the resizes"):
        make("bicubic")
    tv = {"RandomRotation": lambda: v2.RandomRotation(5, interpolation=I.BICUBIC)}
    if op in tv:
        with pytest.raises(ValueError, match="'bicubic' is unsupported with Tensor input"):
            tv[op]()(noise(1, 8, 8, seed=0)[0])


_CODE = r"""
import torch, packer, packer.transforms as T
import packer.imaging.resample_triton as R
import packer.augment.fused as FU
R.TILE = (4, 16, 1)  # fewer programs: the interpreter runs each in Python
g = torch.Generator().manual_seed(0)
x = torch.randint(0, 256, (2, 3, 14, 18), generator=g, dtype=torch.uint8)
boxes = torch.tensor([[0, 0, 14, 18], [2, 3, 9, 12]])
flip = torch.tensor([True, False])
modes = [("nearest", True), ("nearest-exact", True), ("bilinear", False), ("bicubic", True),
         ("bicubic", False), ("lanczos", True)]
def close(a, b, mode):
    d = (a.int() - b.int()).abs()
    if mode.startswith("nearest"):
        assert torch.equal(a, b), mode
    else:  # float16 weights in the kernel; a byte of the width pass may round apart
        assert d.max() <= 2 and d.float().mean() < 0.1, (mode, d.max())
for mode, aa in modes:
    for size in [(9, 16), (20, 11)]:  # down and up
        a = T.resized_crop(x, boxes, size, flip=flip, backend="matmul", interpolation=mode, antialias=aa)
        b = T.resized_crop(x, boxes, size, flip=flip, backend="triton", interpolation=mode, antialias=aa)
        close(a, b, mode)
R.KERNEL = "gather"  # the other kernel, on a small box (its taps are unrolled)
small = torch.tensor([[3, 2, 4, 5]])
for mode, aa in [("nearest", True), ("bicubic", False)]:
    a = T.resized_crop(x[:1], small, (6, 8), backend="matmul", interpolation=mode, antialias=aa)
    b = T.resized_crop(x[:1], small, (6, 8), backend="triton", interpolation=mode, antialias=aa)
    close(a, b, mode)
R.KERNEL = "dot"
# The fused recipe's crop takes the mode to its kernel.
FU.DEVICES = "any"
tf = T.Compose([T.RandomResizedCrop(10, interpolation="bicubic"), T.RandomHorizontalFlip(),
                packer.Normalize()])
fused = tf(x, generator=torch.Generator().manual_seed(1))
FU.ENABLED = False
ref = tf(x, generator=torch.Generator().manual_seed(1))
FU.ENABLED = True
assert (fused - ref).abs().max() < 0.05, (fused - ref).abs().max()
bilinear = T.Compose([T.RandomResizedCrop(10), T.RandomHorizontalFlip(), packer.Normalize()])
assert (bilinear(x, generator=torch.Generator().manual_seed(1)) - fused).abs().max() > 0.1
print("ok")
"""


@pytest.mark.slow
@pytest.mark.xdist_group("triton-interpreter")  # one zygote (helpers.interpreted)
def test_kernel_modes_under_the_interpreter() -> None:
    """Each mode of the CUDA kernel (FILT), run by Triton's CPU interpreter, against the
    CPU path; and the fused recipe's crop with a mode."""
    pytest.importorskip("triton")
    r = run_interpreted(_CODE, subprocess_env(TRITON_INTERPRET="1"), cwd=REPO, timeout=300)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]


@pytest.mark.cuda
@pytest.mark.parametrize("mode, aa", MODES)
@pytest.mark.parametrize("backend", ["auto", "matmul"])
def test_cuda_kernel_equals_the_cpu_path(mode: str, aa: bool, backend: str) -> None:
    x = noise(16, 64, 64, seed=4)
    boxes = T.RandomResizedCrop(8).sample_boxes(16, 64, 64, torch.Generator().manual_seed(0))
    flip = torch.rand(16, generator=torch.Generator().manual_seed(1)) < 0.5
    for size in [(48, 48), (80, 72), (9, 13)]:
        kw = {"flip": flip, "interpolation": mode, "antialias": aa}
        cpu = T.resized_crop(x, boxes, size, **kw)
        gpu = T.resized_crop(x.cuda(), boxes, size, backend=backend, **kw).cpu()
        d = (gpu.int() - cpu.int()).abs()
        if mode.startswith("nearest"):
            assert torch.equal(gpu, cpu)
        else:
            # the matmul backend's bicubic/lanczos keep the horizontal pass in float where
            # the CPU path rounds it to bytes: more pixels 1 off (mean 0.088-0.094 on an
            # H200, 2026-11-29), never more than 2
            mean = 0.15 if backend == "matmul" and mode in ("bicubic", "lanczos") else 0.05
            assert d.max() <= 2 and d.float().mean() < mean, (size, d.max(), d.float().mean())
    rrc = T.Compose(
        [T.RandomResizedCrop(40, interpolation=mode, antialias=aa), T.RandomHorizontalFlip()]
    )
    cpu = rrc(x, generator=torch.Generator().manual_seed(2))
    gpu = rrc(x.cuda(), generator=torch.Generator().manual_seed(2)).cpu()
    assert (gpu.int() - cpu.int()).abs().max() <= (0 if mode.startswith("nearest") else 2)
