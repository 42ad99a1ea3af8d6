"""packer.transforms: boxes follow torchvision's distribution, pixels match its resize."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torchvision import transforms as tv
from torchvision.transforms.v2 import functional as F

import packer.transforms as T
from conftest import subprocess_env
from helpers.interpreted import run_interpreted

ROOT = Path(__file__).resolve().parents[2]


def photo_like(b: int, h: int, w: int, seed: int = 0) -> torch.Tensor:
    """uint8 [b, 3, h, w]: smooth shapes plus sharp speckles, to test both regimes."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(b, 3, max(h // 6, 2), max(w // 6, 2), generator=g) * 255
    x = nn.functional.interpolate(x, size=(h, w), mode="bicubic", align_corners=False)
    noise = torch.randint(0, 256, (b, 3, h, w), generator=g).float()
    x = torch.where(torch.rand(b, 1, h, w, generator=g) < 0.05, noise, x)
    return x.round().clamp(0, 255).to(torch.uint8)


def reference(images: torch.Tensor, boxes: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    return torch.stack(
        [
            F.resized_crop(img, *box.tolist(), size=list(size), antialias=True)
            for img, box in zip(images, boxes)
        ]
    )


def mad(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().mean().item()


def ks_statistic(a: torch.Tensor, b: torch.Tensor) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: max |ECDF_a - ECDF_b| (ties handled)."""
    a, b = a.double().sort().values, b.double().sort().values
    grid = torch.cat([a, b])
    fa = torch.searchsorted(a, grid, right=True).double() / len(a)
    fb = torch.searchsorted(b, grid, right=True).double() / len(b)
    return (fa - fb).abs().max().item()


# ---------------------------------------------------------------- boxes


@pytest.mark.parametrize(
    "hw, scale, ratio",
    [
        ((180, 240), (0.08, 1.0), (3 / 4, 4 / 3)),  # the ImageNet default
        ((40, 200), (0.5, 1.0), (3 / 4, 4 / 3)),  # many tries fail: fallback often
        ((33, 21), (0.2, 0.6), (0.5, 2.0)),
    ],
)
def test_boxes_follow_torchvision_distribution(
    hw: tuple[int, int], scale: tuple[float, float], ratio: tuple[float, float]
) -> None:
    h, w = hw
    n = 12000
    torch.manual_seed(0)
    ref = torch.tensor(
        [tv.RandomResizedCrop.get_params(torch.empty(1, h, w), scale, ratio) for _ in range(n)]
    )
    rrc = T.RandomResizedCrop(8, scale=scale, ratio=ratio)
    # One size: the rule's exact table; sizes per image: the tries themselves.
    sizes = (torch.full((n,), h), torch.full((n,), w))
    for way, (hh, ww) in {"table": (h, w), "tries": sizes}.items():
        ours = rrc.sample_boxes(n, hh, ww, torch.Generator().manual_seed(1))
        assert ours.dtype == torch.int64 and ours.shape == (n, 4)
        top, left, bh, bw = ours.unbind(1)
        assert bool(((top >= 0) & (left >= 0) & (top + bh <= h) & (left + bw <= w)).all())
        assert bool(((bh >= 1) & (bw >= 1)).all())
        # alpha = 0.001 two-sample KS threshold: 1.95 * sqrt(2 / n); seeds are fixed.
        limit = 1.95 * math.sqrt(2 / n)
        for name, f in {
            "area fraction": lambda b: b[:, 2] * b[:, 3] / (h * w),
            "log aspect": lambda b: torch.log(b[:, 3] / b[:, 2]),
            "top": lambda b: b[:, 0].double(),
            "left": lambda b: b[:, 1].double(),
        }.items():
            d = ks_statistic(f(ours.double()), f(ref.double()))
            assert d < limit, f"{way}, {name}: KS {d:.4f} >= {limit:.4f}"


def test_fallback_is_torchvisions_centre_crop() -> None:
    # Every try wants a 14x14 box in a 10x20 image: all fail, so the clamped centre crop.
    # Ratio clamped to max (wide image), to min (tall image), and kept (in range).
    for (h, w), ratio in [((10, 20), (1.0, 1.0)), ((20, 10), (1.0, 1.0)), ((10, 11), (0.5, 2))]:
        ref = tv.RandomResizedCrop.get_params(torch.empty(1, h, w), (1.0, 1.0), ratio)
        if ratio == (0.5, 2):  # tries fail only by chance here: force them all to
            ref = (0, 0, 10, 11)
            rrc = T.RandomResizedCrop(4, scale=(1.0, 1.0), ratio=(2.0, 2.0))
            rrc.ratio = ratio  # draws aspect 2 (never fits), clamps with (0.5, 2)
            assert rrc.sample_boxes(1, h, w).tolist() == [list(ref)]
            continue
        rrc = T.RandomResizedCrop(4, scale=(1.0, 1.0), ratio=ratio)
        ours = rrc.sample_boxes(3, h, w, torch.Generator().manual_seed(0))
        assert ours.tolist() == [list(ref)] * 3


def test_boxes_differ_per_image_and_follow_the_seed() -> None:
    rrc = T.RandomResizedCrop(32)
    a = rrc.sample_boxes(64, 256, 256, torch.Generator().manual_seed(5))
    b = rrc.sample_boxes(64, 256, 256, torch.Generator().manual_seed(5))
    c = rrc.sample_boxes(64, 256, 256, torch.Generator().manual_seed(6))
    assert torch.equal(a, b)
    assert len({tuple(r) for r in a.tolist()}) > 60  # different images, different boxes
    assert (a != c).any(1).float().mean() > 0.9


def test_boxes_for_a_padded_batch_stay_in_each_image() -> None:
    hs = torch.tensor([30, 64, 17, 50])
    ws = torch.tensor([64, 20, 40, 50])
    boxes = T.RandomResizedCrop(8).sample_boxes(4, hs, ws, torch.Generator().manual_seed(0))
    top, left, bh, bw = boxes.unbind(1)
    assert bool(((top + bh <= hs) & (left + bw <= ws) & (top >= 0) & (left >= 0)).all())


# ---------------------------------------------------------------- pixels


@pytest.mark.parametrize("size", [(48, 48), (96, 80), (17, 29)])  # down, up, odd
def test_resized_crop_matches_torchvision(size: tuple[int, int]) -> None:
    x = photo_like(6, 64, 72)
    boxes = T.RandomResizedCrop(8).sample_boxes(6, 64, 72, torch.Generator().manual_seed(2))
    boxes[0] = torch.tensor([0, 0, 64, 72])  # whole image
    boxes[1] = torch.tensor([63, 71, 1, 1])  # one pixel, in the corner
    out = T.resized_crop(x, boxes, size)
    assert out.dtype == torch.uint8 and out.shape == (6, 3, *size)
    ref = reference(x, boxes, size)
    for i in range(6):
        assert mad(out[i], ref[i]) <= 1.5 / 255 * 255, f"image {i}: MAD {mad(out[i], ref[i])}"
    assert mad(out, ref) < 0.5
    assert (out.int() - ref.int()).abs().max() <= 2


def test_padded_batch_equals_per_image() -> None:
    sizes = [(40, 56), (64, 30), (21, 21)]
    imgs = [photo_like(1, h, w, seed=i)[0] for i, (h, w) in enumerate(sizes)]
    padded = torch.randint(0, 256, (3, 3, 64, 56), dtype=torch.uint8)  # junk in the padding
    for i, im in enumerate(imgs):
        padded[i, :, : im.shape[1], : im.shape[2]] = im
    hs = torch.tensor([s[0] for s in sizes])
    ws = torch.tensor([s[1] for s in sizes])
    boxes = T.RandomResizedCrop(8).sample_boxes(3, hs, ws, torch.Generator().manual_seed(3))
    boxes[2] = torch.tensor([0, 0, 21, 21])  # reaches the padding's edge
    out = T.resized_crop(padded, boxes, 24)
    for i, im in enumerate(imgs):
        alone = T.resized_crop(im[None], boxes[i : i + 1], 24)[0]
        assert (out[i].int() - alone.int()).abs().max() <= 1
        assert mad(out[i], reference(im[None], boxes[i : i + 1], (24, 24))[0]) < 0.5


def test_resized_crop_rejects_boxes_outside_the_image() -> None:
    x = photo_like(2, 16, 16)
    with pytest.raises(ValueError, match="box 1"):
        T.resized_crop(x, torch.tensor([[0, 0, 16, 16], [8, 0, 9, 4]]), 8)
    with pytest.raises(ValueError, match="empty"):
        T.resized_crop(x, torch.tensor([[0, 0, 0, 16], [0, 0, 4, 4]]), 8)
    with pytest.raises(ValueError, match=r"\[2, 4\]"):
        T.resized_crop(x, torch.zeros(3, 4, dtype=torch.int64), 8)


def test_random_resized_crop_module_and_settable_size() -> None:
    x = photo_like(5, 40, 50)
    rrc = T.RandomResizedCrop(24)
    assert rrc.accepts_generator
    out = rrc(x, generator=torch.Generator().manual_seed(0))
    boxes = rrc.sample_boxes(5, 40, 50, torch.Generator().manual_seed(0))
    assert torch.equal(out, T.resized_crop(x, boxes, 24))
    rrc.size = (16, 20)  # progressive resizing
    assert rrc(x).shape == (5, 3, 16, 20)
    assert mad(out, reference(x, boxes, (24, 24))) < 0.5


def test_flip_rate_and_pixels() -> None:
    x = torch.arange(2000 * 3 * 2 * 4, dtype=torch.int64).remainder(251).to(torch.uint8)
    x = x.reshape(2000, 3, 2, 4)
    flip = T.RandomHorizontalFlip(0.3)
    out = flip(x, generator=torch.Generator().manual_seed(0))
    flipped = (out == x.flip(-1)).flatten(1).all(1)
    kept = (out == x).flatten(1).all(1)
    assert bool((flipped | kept).all())
    assert abs(flipped.float().mean().item() - 0.3) < 0.04
    assert not T.RandomHorizontalFlip(0.0)(x).ne(x).any()


def test_compose_fuses_crop_and_flip_without_changing_results() -> None:
    x = photo_like(8, 48, 48)
    fused = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip()])
    apart = T.Compose([T.RandomResizedCrop(32), nn.Identity(), T.RandomHorizontalFlip()])
    a = fused(x, generator=torch.Generator().manual_seed(9))
    b = apart(x, generator=torch.Generator().manual_seed(9))
    assert (a.int() - b.int()).abs().max() <= 1
    assert mad(a, b) < 0.01
    assert fused.accepts_generator
    with_fn = T.Compose([T.CenterCrop(40), lambda im: im.flip(-2)])  # any callable
    assert torch.equal(with_fn(x), T.CenterCrop(40)(x).flip(-2))


class _SwapMixer(nn.Module):
    """A stand-in batch mixer: reverses the batch and its labels, draws one number."""

    accepts_generator = True
    mixes_labels = True

    def forward(self, images, labels, generator=None):
        self.drawn = torch.rand(1, generator=generator)
        return images.flip(0), labels.flip(0).float()


def test_compose_passes_labels_through_mixers() -> None:
    x, labels = photo_like(4, 40, 40), torch.tensor([3, 1, 2, 0])
    crop_flip = [T.RandomResizedCrop(24), T.RandomHorizontalFlip()]
    plain = T.Compose(crop_flip)
    assert not plain.mixes_labels
    tf = T.Compose([*crop_flip, _SwapMixer(), T.CenterCrop(20)])
    assert tf.mixes_labels
    out, soft = tf(x, labels, generator=torch.Generator().manual_seed(1))
    g = torch.Generator().manual_seed(1)
    ref = plain(x, generator=g)  # the fused crop + flip draws as before the mixer
    assert torch.equal(out, T.CenterCrop(20)(ref.flip(0)))
    assert torch.equal(soft, labels.flip(0).float())
    assert torch.equal(tf[2].drawn, torch.rand(1, generator=g))  # then the mixer, same generator
    # Without mixers: labels pass through untouched; without labels, just the images.
    out2, same = plain(x, labels, generator=torch.Generator().manual_seed(1))
    assert same is labels and torch.equal(out2, ref)
    assert torch.equal(plain(x, torch.Generator().manual_seed(1)), ref)  # old positional call
    nested = T.Compose([T.Compose([T.CenterCrop(30)]), T.Compose([_SwapMixer()])])
    assert nested.mixes_labels
    assert torch.equal(nested(x, labels)[0], T.CenterCrop(30)(x).flip(0))
    with pytest.raises(ValueError, match="_SwapMixer mixes labels: call the Compose as"):
        tf(x, generator=torch.Generator())


def test_center_crop_and_resize_match_torchvision() -> None:
    x = photo_like(3, 37, 50)
    assert torch.equal(T.CenterCrop(24)(x), tv.CenterCrop(24)(x))
    assert torch.equal(T.CenterCrop((20, 31))(x), tv.CenterCrop((20, 31))(x))
    for size in [24, (30, 64), 80]:
        ours, ref = T.Resize(size)(x), tv.Resize(size, antialias=True)(x)
        assert ours.shape == ref.shape
        assert mad(ours, ref) < 0.5


def test_bad_arguments_raise_value_error() -> None:
    with pytest.raises(ValueError, match="size must be positive"):
        T.RandomResizedCrop(0)
    with pytest.raises(ValueError, match="size must be positive"):
        T.CenterCrop((0, 4))
    with pytest.raises(ValueError, match="size must be positive"):
        T.RandomResizedCrop(8).size = -1
    with pytest.raises(ValueError, match=r"scale must lie in \(0, 1\]"):
        T.RandomResizedCrop(8, scale=(0.0, 1.0))
    with pytest.raises(ValueError, match=r"scale must lie in \(0, 1\]"):
        T.RandomResizedCrop(8, scale=(0.5, 1.5))
    with pytest.raises(ValueError, match="min <= max"):
        T.RandomResizedCrop(8, scale=(0.9, 0.1))
    with pytest.raises(ValueError, match=r"ratio must be \(min, max\) with min <= max"):
        T.RandomResizedCrop(8, ratio=(2.0, 0.5))
    with pytest.raises(ValueError, match=r"p must lie in \[0, 1\]"):
        T.RandomHorizontalFlip(1.5)
    with pytest.raises(ValueError, match="must be uint8"):
        T.RandomResizedCrop(8)(torch.rand(2, 3, 16, 16))
    with pytest.raises(ValueError, match="must be a batch"):
        T.RandomHorizontalFlip()(torch.zeros(3, 16, 16, dtype=torch.uint8))
    with pytest.raises(ValueError, match="larger than"):
        T.CenterCrop(32)(torch.zeros(1, 3, 16, 16, dtype=torch.uint8))


def _load_alone(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_imports_standalone_with_torch_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The crop core (resize.py), the draws (draws.py) and the ops' base (base.py) import
    without packer, and the modules (transforms.py) with them beside them, as the four
    files copied into another project would."""
    resize = _load_alone("resize", ROOT / "packer/imaging/resize.py")
    draws = _load_alone("draws", ROOT / "packer/augment/draws.py")
    base = _load_alone("base", ROOT / "packer/augment/base.py")
    monkeypatch.setitem(sys.modules, "resize", resize)  # what transforms.py imports
    monkeypatch.setitem(sys.modules, "draws", draws)
    monkeypatch.setitem(sys.modules, "base", base)
    mod = _load_alone("transforms_alone", ROOT / "packer/augment/transforms.py")
    x = photo_like(2, 16, 16)
    assert mod.RandomResizedCrop(8)(x).shape == (2, 3, 8, 8)
    boxes = torch.tensor([[0, 0, 16, 16], [2, 3, 8, 9]])
    assert torch.equal(resize.resized_crop(x, boxes, 8), T.resized_crop(x, boxes, 8))


@pytest.mark.slow
@pytest.mark.xdist_group("triton-interpreter")  # one zygote (helpers.interpreted)
def test_triton_kernel_under_the_interpreter(tmp_path: Path) -> None:
    """The CUDA kernel's logic, run by Triton's CPU interpreter against the matmul path."""
    pytest.importorskip("triton")
    code = (
        "import torch, packer.transforms as T, packer.imaging.resample_triton as R\n"
        "R.TILE = (8, 32, 4)  # fewer programs: the interpreter runs each in Python\n"
        "g = torch.Generator().manual_seed(0)\n"
        "x = torch.randint(0, 256, (3, 3, 20, 26), generator=g, dtype=torch.uint8)\n"
        "boxes = T.RandomResizedCrop(8).sample_boxes(3, 20, 26, g)\n"
        "flip = torch.tensor([True, False, True])\n"
        "for R.KERNEL, size in [('dot', (12, 16)), ('dot', (30, 20)), ('gather', (12, 16))]:\n"
        "    a = T.resized_crop(x, boxes, size, flip=flip, backend='matmul')\n"
        "    b = T.resized_crop(x, boxes, size, flip=flip, backend='triton')\n"
        "    d = (a.int() - b.int()).abs()\n"
        "    assert d.max() <= 1 and d.float().mean() < 0.1, (R.KERNEL, size)\n"
        "print('ok')\n"
    )
    r = run_interpreted(code, subprocess_env(TRITON_INTERPRET="1"), timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]


# ---------------------------------------------------------------- CUDA


@pytest.mark.cuda
@pytest.mark.parametrize("backend", ["auto", "matmul"])
def test_cuda_matches_cpu_on_the_same_boxes(backend: str) -> None:
    x = photo_like(16, 64, 64)
    boxes = T.RandomResizedCrop(8).sample_boxes(16, 64, 64, torch.Generator().manual_seed(0))
    flip = torch.rand(16, generator=torch.Generator().manual_seed(1)) < 0.5
    for size in [(48, 48), (80, 72)]:
        cpu = T.resized_crop(x, boxes, size, flip=flip)
        gpu = T.resized_crop(x.cuda(), boxes, size, flip=flip, backend=backend)
        assert gpu.device.type == "cuda" and gpu.dtype == torch.uint8
        assert (gpu.cpu().int() - cpu.int()).abs().max() <= 1
        assert mad(gpu.cpu(), cpu) < 0.05


@pytest.mark.cuda
def test_cuda_modules_draw_the_cpu_parameters() -> None:
    x = photo_like(16, 48, 48)
    tf = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip()])
    cpu = tf(x, generator=torch.Generator().manual_seed(4))
    gpu = tf(x.cuda(), generator=torch.Generator().manual_seed(4))
    assert (gpu.cpu().int() - cpu.int()).abs().max() <= 1
    flip = T.RandomHorizontalFlip()
    g1, g2 = torch.Generator().manual_seed(2), torch.Generator().manual_seed(2)
    assert torch.equal(flip(x.cuda(), generator=g1).cpu(), flip(x, generator=g2))


@pytest.mark.cuda
def test_cuda_compose_reuses_its_pinned_tables_safely() -> None:
    # More calls than pinned slots, batch sizes changing, no sync in between: each
    # output must still use its own parameters (a reused slot never overwrites a
    # table whose copy is in flight).
    xs = [photo_like(b, 48, 48) for b in (16, 3, 40, 1, 16)]
    tf = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip()])
    g_gpu, g_cpu = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)
    outs = [tf(x.cuda(), generator=g_gpu) for _ in range(4) for x in xs]
    refs = [tf(x, generator=g_cpu) for _ in range(4) for x in xs]
    for gpu, cpu in zip(outs, refs):
        assert (gpu.cpu().int() - cpu.int()).abs().max() <= 1


@pytest.mark.cuda
def test_cuda_transforms_never_make_the_host_wait() -> None:
    x = photo_like(32, 64, 64).cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # a synchronizing call raises
    try:
        for tf in [
            T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip()]),
            T.RandomResizedCrop(80),
            T.RandomHorizontalFlip(),
            T.CenterCrop(32),
            T.Resize(40),
        ]:
            tf(x, generator=torch.Generator().manual_seed(0))
        boxes = T.RandomResizedCrop(8).sample_boxes(32, 64, 64)
        T.resized_crop(x, boxes, 48, backend="matmul")
    finally:
        torch.cuda.set_sync_debug_mode(0)


def test_kernel_choice_by_scale() -> None:
    pytest.importorskip("triton")
    from packer.imaging import resample_triton as R

    assert R.fits((256 / 224, 256 / 224))  # RandomResizedCrop 256² -> 224²
    assert R.fits((1024 / 224, 768 / 224))  # Resize of a large photo
    assert not R.fits((4000 / 64, 1.0))  # tiny thumbnails of huge images: dense route


def test_transform_sizes_are_bounded_up_front() -> None:
    import torch

    from packer import transforms as T

    huge = 10**6
    for make in (
        lambda: T.RandomResizedCrop(huge),
        lambda: T.Resize(huge),
        lambda: T.CenterCrop(huge),
        lambda: T.Resize((8, T.MAX_SIDE + 1)),
        lambda: T.RandomResizedCrop(8).__setattr__("size", huge),
    ):
        with pytest.raises(ValueError, match="too large"):
            make()
    images = torch.zeros(1, 3, 4, 4, dtype=torch.uint8)
    boxes = torch.tensor([[0, 0, 4, 4]])
    with pytest.raises(ValueError, match="too large"):
        T.resized_crop(images, boxes, size=huge)
    # an int Resize whose longer side would exceed the bound (a 1x40 strip to 1000 short)
    strip = torch.zeros(1, 3, 1, 40, dtype=torch.uint8)
    with pytest.raises(ValueError, match="too large"):
        T.Resize(1000)(strip)
    assert T.Resize(T.MAX_SIDE).size == T.MAX_SIDE  # the bound itself is allowed
    assert T.resized_crop(images, boxes, size=(2, 3)).shape == (1, 3, 2, 3)
