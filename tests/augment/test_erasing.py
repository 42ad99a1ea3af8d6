"""packer.augment.erasing: RandomErasing draws torchvision's boxes per image (ten tries,
vectorised) and erases uint8 or normalized float images.

Pixels: bit-identical to torchvision's ``erase`` image by image for a constant
value (mean |difference| 0), on uint8 and on normalized float32 images.
"""

from __future__ import annotations

import pytest
import torch
from torchvision import transforms as tv
from torchvision.transforms.v2 import functional as TF

import packer.transforms as T
from aug_checks import (
    assert_same_distribution,
    assert_same_rate,
    photo_like,
)

N = 2000


def _tv_draws(p: float, h: int, w: int, scale, ratio, n: int = N, seed: int = 0):
    """torchvision v1's forward, its draws only: the coin, then get_params."""
    torch.manual_seed(seed)
    img = torch.empty(3, h, w)
    out = []
    for _ in range(n):
        if torch.rand(1) < p:
            i, j, bh, bw, _ = tv.RandomErasing.get_params(img, scale, ratio, value=[0.0])
            out.append((bh < h, i, j, bh, bw))  # a fallback returns the whole image
        else:
            out.append((False, 0, 0, 0, 0))
    return torch.tensor(out)


@pytest.mark.parametrize(
    "h, w, scale, ratio",
    [
        (32, 40, (0.02, 0.33), (0.3, 3.3)),  # the reference's: a try almost always fits
        (8, 8, (0.3, 0.9), (0.3, 3.3)),  # many images use up their ten tries
        (12, 20, (0.2, 0.2), (0.5, 2.0)),  # a fixed scale: no table, the tries drawn
    ],
)
def test_boxes_follow_torchvision(h: int, w: int, scale, ratio) -> None:
    ours = T.RandomErasing(0.6, scale, ratio).sample(N, h, w, torch.Generator().manual_seed(1))
    theirs = _tv_draws(0.6, h, w, scale, ratio)
    assert_same_rate(ours.erase, theirs[:, 0].bool())
    mine, ref = ours.boxes[ours.erase], theirs[theirs[:, 0].bool(), 1:]
    for k in range(4):  # top, left, height, width of the erased boxes
        assert_same_distribution(mine[:, k].numpy(), ref[:, k].numpy())
    assert (mine[:, 0] + mine[:, 2] <= h).all() and (mine[:, 1] + mine[:, 3] <= w).all()
    assert (mine[:, 2] < h).all() and (mine[:, 3] < w).all()
    assert not ours.boxes[~ours.erase].any()


def test_an_image_without_a_fitting_try_is_left_alone() -> None:
    x = photo_like(6, 2, 2)
    tf = T.RandomErasing(1.0, scale=(0.9, 1.0))  # no box of 1x1 has that area
    assert not tf.sample(6, 2, 2).erase.any()
    assert tf(x) is x


def _reference(x: torch.Tensor, boxes: torch.Tensor, erase: torch.Tensor, value) -> torch.Tensor:
    v = torch.tensor(value, dtype=torch.float32).view(-1, 1, 1)
    return torch.stack(
        [TF.erase(img, *b.tolist(), v) if e else img for img, b, e in zip(x, boxes, erase.tolist())]
    )


@pytest.mark.parametrize("value", [0, (10, 128, 255), 7.9])
def test_uint8_pixels_match_torchvision(value) -> None:
    x = photo_like(16, 32, 40, seed=2)
    tf = T.RandomErasing(0.5, value=value)
    erase, boxes = tf.sample(16, 32, 40, torch.Generator().manual_seed(3))
    out = tf(x, generator=torch.Generator().manual_seed(3))
    assert out.dtype == torch.uint8
    assert torch.equal(out, _reference(x, boxes, erase, value))  # 7.9 truncates to 7
    assert 0 < int(erase.sum()) < 16


def test_normalized_float_pixels_match_torchvision() -> None:
    # The classification reference erases after Normalize: value 0 is the mean colour.
    x = (photo_like(16, 32, 40, seed=4).float() / 255 - 0.45) / 0.225
    tf = T.RandomErasing(0.5)
    erase, boxes = tf.sample(16, 32, 40, torch.Generator().manual_seed(5))
    out = tf(x, generator=torch.Generator().manual_seed(5))
    assert out.dtype == torch.float32
    assert torch.equal(out, _reference(x, boxes, erase, 0.0))
    half = tf(x.half(), generator=torch.Generator().manual_seed(5))
    assert half.dtype == torch.float16


def test_each_image_gets_its_own_box() -> None:
    p = T.RandomErasing(1.0).sample(64, 32, 40, torch.Generator().manual_seed(6))
    assert len({tuple(b) for b in p.boxes.tolist()}) > 50


def _boxes_mask(boxes: torch.Tensor, h: int, w: int) -> torch.Tensor:
    m = torch.zeros(len(boxes), 1, h, w, dtype=torch.bool)
    for i, (t, left, bh, bw) in enumerate(boxes.tolist()):
        m[i, :, t : t + bh, left : left + bw] = True
    return m


def test_random_value_is_normal_noise_on_float_images() -> None:
    x = torch.zeros(32, 3, 32, 40) + 5.0
    tf = T.RandomErasing(0.5, value="random")
    boxes = tf.sample(32, 32, 40, torch.Generator().manual_seed(7)).boxes
    out = tf(x, generator=torch.Generator().manual_seed(7))
    inside = _boxes_mask(boxes, 32, 40).expand_as(x)
    noise = out[inside]
    assert torch.equal(out[~inside], x[~inside])
    assert noise.numel() > 5000
    assert abs(noise.mean().item()) < 0.05 and abs(noise.std().item() - 1) < 0.05
    again = tf(x, generator=torch.Generator().manual_seed(7))
    assert torch.equal(out, again)  # the noise is seeded from the generator


def test_random_value_is_uniform_bytes_on_uint8_images() -> None:
    x = torch.full((32, 3, 32, 40), 100, dtype=torch.uint8)
    tf = T.RandomErasing(0.5, value="random")
    boxes = tf.sample(32, 32, 40, torch.Generator().manual_seed(8)).boxes
    out = tf(x, generator=torch.Generator().manual_seed(8))
    inside = _boxes_mask(boxes, 32, 40).expand_as(x)
    noise = out[inside].double()
    assert torch.equal(out[~inside], x[~inside])
    assert noise.min() < 5 and noise.max() > 250 and abs(noise.mean().item() - 127.5) < 3


def test_inplace_writes_into_the_input_and_the_default_does_not() -> None:
    x = photo_like(8, 32, 40, seed=9)
    keep = x.clone()
    out = T.RandomErasing(1.0)(x, generator=torch.Generator().manual_seed(10))
    assert torch.equal(x, keep) and not torch.equal(out, keep)
    ret = T.RandomErasing(1.0, inplace=True)(x, generator=torch.Generator().manual_seed(10))
    assert ret is x and torch.equal(x, out)
    y = photo_like(8, 32, 40, seed=9)
    part = T.RandomErasing(0.5, inplace=True)
    expected = T.RandomErasing(0.5)(y, generator=torch.Generator().manual_seed(11))
    assert part(y, generator=torch.Generator().manual_seed(11)) is y and torch.equal(y, expected)


def test_p_zero_returns_the_input() -> None:
    x = photo_like(4, 8, 8)
    assert T.RandomErasing(0.0)(x) is x


def test_composes_after_the_crop() -> None:
    x = photo_like(8, 48, 48)
    tf = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.RandomErasing(0.5)])
    a = tf(x, generator=torch.Generator().manual_seed(12))
    b = tf(x, generator=torch.Generator().manual_seed(12))
    assert a.shape == (8, 3, 32, 32) and torch.equal(a, b)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: T.RandomErasing(1.2), r"p must be a probability in \[0, 1\]"),
        (lambda: T.RandomErasing(scale=(0.5, 0.2)), r"scale must be \(min, max\) within"),
        (lambda: T.RandomErasing(scale=(0.1, 1.5)), r"scale must be \(min, max\) within"),
        (lambda: T.RandomErasing(ratio=(0.0, 1.0)), "ratio must be"),
        (lambda: T.RandomErasing(value="noise"), "value must be a number, numbers or 'random'"),
        (lambda: T.RandomErasing(value=[]), "value must be a number, numbers or 'random'"),
    ],
)
def test_bad_arguments_raise(make, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()


def test_bad_images_raise() -> None:
    with pytest.raises(ValueError, match="value has 2 numbers for 3-channel images"):
        T.RandomErasing(value=(1, 2))(photo_like(2, 8, 8))
    with pytest.raises(ValueError, match="uint8 or floating"):
        T.RandomErasing()(torch.zeros(2, 3, 8, 8, dtype=torch.int16))
    with pytest.raises(ValueError, match=r"batch \[B, C, H, W\]"):
        T.RandomErasing()(torch.zeros(3, 8, 8, dtype=torch.uint8))


# ---------------------------------------------------------------- CUDA


@pytest.mark.cuda
def test_cuda_erases_the_cpu_boxes() -> None:
    x = photo_like(16, 32, 40)
    for value in (0, (1, 2, 3)):
        tf = T.RandomErasing(0.5, value=value)
        cpu = tf(x, generator=torch.Generator().manual_seed(13))
        gpu = tf(x.cuda(), generator=torch.Generator().manual_seed(13))
        assert torch.equal(gpu.cpu(), cpu)
    tf = T.RandomErasing(0.5, value="random")
    _, boxes = tf.sample(16, 32, 40, torch.Generator().manual_seed(14))
    gpu = tf(x.cuda(), generator=torch.Generator().manual_seed(14)).cpu()
    inside = _boxes_mask(boxes, 32, 40).expand_as(x)
    assert torch.equal(gpu[~inside], x[~inside])  # the same boxes; the noise is the device's


@pytest.mark.cuda
def test_cuda_erasing_never_makes_the_host_wait() -> None:
    x = photo_like(16, 32, 40).cuda()
    xf = x.float()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for value in (0, (1, 2, 3), "random"):
            T.RandomErasing(0.5, value=value)(x, generator=torch.Generator().manual_seed(0))
            T.RandomErasing(0.5, value=value)(xf, generator=torch.Generator().manual_seed(0))
        T.RandomErasing(0.5, inplace=True)(x, generator=torch.Generator().manual_seed(0))
    finally:
        torch.cuda.set_sync_debug_mode(0)
