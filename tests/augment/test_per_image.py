"""No silent batch-wide randomness: torchvision's random ops are refused by PackLoader,
deterministic ones pass, and packer.transforms.PerImage runs one per image, seeded."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
import torchvision.transforms as T1
import torchvision.transforms.v2 as T2
from torch import nn

import packer
import packer.transforms as PT
from packer.augment.per_image import refuse_batch_wide
from packer.errors import UsageError
from packer.measure.bench.synth import make_random_pack

# (the op, what the message says it draws, its packer.transforms equivalent or None)
RANDOM = [
    (lambda T: T.RandomResizedCrop(8), "one crop box", "RandomResizedCrop"),
    (lambda T: T.RandomHorizontalFlip(), "one coin flip", "RandomHorizontalFlip"),
    (lambda T: T.ColorJitter(0.4, 0.4, 0.4), "one set of colour factors", "ColorJitter"),
    (lambda T: T.RandomErasing(), "one box", "RandomErasing"),
    (lambda T: T.TrivialAugmentWide(), "one op and magnitude", "TrivialAugmentWide"),
    (lambda T: T.RandAugment(), "ops and magnitudes", "RandAugment"),
    (lambda T: T.AutoAugment(), "one sub-policy", "AutoAugment"),
    (lambda T: T.AugMix(), "chains and mixing weights", "AugMix"),
    (lambda T: T.GaussianBlur(3), "one sigma", "GaussianBlur"),
    (lambda T: T.RandomRotation(10), "one angle", "RandomRotation"),
    (lambda T: T.RandomAffine(10), "affine parameters", "RandomAffine"),
    (lambda T: T.RandomGrayscale(), "one coin flip", "RandomGrayscale"),
    (lambda T: T.RandomApply([T.CenterCrop(4)]), "one coin flip", None),
    (lambda T: T.RandomChoice([T.CenterCrop(4)]), "one choice", None),
    (lambda T: T.RandomOrder([T.CenterCrop(4)]), "one order", None),
    (lambda T: T.RandomCrop(4), "one crop position", None),
    (lambda T: T.RandomPerspective(), "one distortion", None),
]
DETERMINISTIC = [
    lambda T: T.Normalize([0.5] * 3, [0.2] * 3),
    lambda T: T.Resize(8),
    lambda T: T.CenterCrop(8),
    lambda T: T.ConvertImageDtype(torch.float32),
    lambda T: T.Grayscale(3),
    lambda T: T.Pad(2),
]


@pytest.mark.parametrize("T", [T1, T2], ids=["v1", "v2"])
@pytest.mark.parametrize(("make", "what", "twin"), RANDOM, ids=lambda v: "" if callable(v) else v)
def test_random_torchvision_ops_are_refused_by_name(T, make, what, twin) -> None:
    op = make(T)
    name = type(op).__name__
    want = f"torchvision's {name} draws [^;]*{what}[^;]* for the whole batch here"
    use = rf"use packer\.transforms\.{twin} \(per image\)" if twin else "has no batched equivalent"
    wrap = r"wrap it: packer\.transforms\.PerImage\(t\) \(a loop over images, slow\)"
    wrapped = [T.Compose([T.CenterCrop(8), op]), PT.Compose([PT.CenterCrop(8), op])]
    if isinstance(op, nn.Module):
        wrapped.append(nn.Sequential(T2.Identity(), op))
    for t in (op, *wrapped):
        with pytest.raises(UsageError, match=f"{want}.*{use}.*{wrap}"):
            refuse_batch_wide(t)


@pytest.mark.parametrize("name", ["MixUp", "CutMix"])
def test_torchvision_mixers_point_to_packers(name: str) -> None:
    op = getattr(T2, name)(num_classes=3)
    match = rf"v2\.{name} needs the labels.*use packer\.transforms\.{name}\(alpha, num_classes\)"
    with pytest.raises(UsageError, match=match):
        refuse_batch_wide(op)
    with pytest.raises(UsageError, match=r"RandomChoice of MixUp/CutMix needs the labels"):
        refuse_batch_wide(T2.RandomChoice([T2.MixUp(num_classes=3), T2.CutMix(num_classes=3)]))


@pytest.mark.parametrize("T", [T1, T2], ids=["v1", "v2"])
def test_deterministic_torchvision_ops_pass(T) -> None:
    ops = [make(T) for make in DETERMINISTIC]
    for t in [*ops, T.Compose(ops), nn.Sequential(*[o for o in ops if isinstance(o, nn.Module)])]:
        refuse_batch_wide(t)
    refuse_batch_wide(T2.ToDtype(torch.float32, scale=True))
    refuse_batch_wide(PT.Compose([PT.RandomResizedCrop(8), T2.Normalize([0.5] * 3, [0.2] * 3)]))


def test_containers_are_looked_into_and_lambdas_named() -> None:
    inner = PT.Compose([PT.CenterCrop(8), T1.Compose([T2.Compose([T1.RandomErasing()])])])
    with pytest.raises(UsageError, match="torchvision's RandomErasing draws one box"):
        refuse_batch_wide(inner)
    with pytest.raises(UsageError, match=r"Lambda may draw random numbers.*pass its function"):
        refuse_batch_wide(PT.Compose([T1.Lambda(lambda x: x)]))
    refuse_batch_wide(lambda x: x)  # a plain function: the user's own
    refuse_batch_wide(PT.PerImage(T2.RandomErasing()))  # the escape hatch
    refuse_batch_wide(PT.Compose([PT.RandomResizedCrop(8), PT.PerImage(T1.ColorJitter(0.4))]))

    class Mine(T2.Transform):  # the user's own v2 transform: not judged
        def transform(self, inpt, params):
            return inpt

    refuse_batch_wide(Mine())

    class Erase(T2.RandomErasing):  # a subclass of a random op still draws once per call
        pass

    with pytest.raises(UsageError, match="torchvision's RandomErasing"):
        refuse_batch_wide(Erase())


def test_the_loader_refuses_before_any_work(tmp_path: Path) -> None:
    pack = make_random_pack(tmp_path / "p", 4, 8)
    with pytest.raises(UsageError, match=r"^transform: torchvision's RandomHorizontalFlip"):
        packer.PackLoader(pack, 2, device="cpu", transform=T2.RandomHorizontalFlip())
    x, _ = next(iter(packer.PackLoader(pack, 2, device="cpu", transform=T2.CenterCrop(4))))
    assert x.shape == (2, 3, 4, 4)


# ---- PerImage


def same_images(b: int = 6) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    one = torch.randint(0, 256, (1, 3, 16, 16), generator=g, dtype=torch.uint8)
    return one.repeat(b, 1, 1, 1)


@pytest.mark.parametrize(
    "op",
    [
        T2.RandomResizedCrop(8),
        T1.RandomResizedCrop(8),
        T1.RandomChoice([T1.RandomCrop(8), T1.CenterCrop(8)]),  # v1: Python's random
        T2.RandomErasing(p=1.0),
    ],
    ids=["v2-rrc", "v1-rrc", "v1-choice", "v2-erasing"],
)
def test_per_image_draws_per_image_reproducibly(op: nn.Module) -> None:
    t = PT.PerImage(op)
    x = same_images(8)
    cpu_state, py_state = torch.get_rng_state(), random.getstate()
    a = t(x, generator=torch.Generator().manual_seed(1))
    assert torch.equal(torch.get_rng_state(), cpu_state) and random.getstate() == py_state
    b = t(x, generator=torch.Generator().manual_seed(1))
    c = t(x, generator=torch.Generator().manual_seed(2))
    assert torch.equal(a, b)  # same seed, same images
    assert not torch.equal(a, c)  # another seed, other draws
    assert len({bytes(img.flatten().tolist()) for img in a}) > 1  # each image its own draw


def test_per_image_in_the_loader_is_resume_exact(tmp_path: Path) -> None:
    pack = make_random_pack(tmp_path / "p", 12, 16)
    kw = dict(device="cpu", seed=5, transform=PT.PerImage(T2.RandomResizedCrop(8)))
    want = [x for x, _ in packer.PackLoader(pack, 4, **kw)]
    a = packer.PackLoader(pack, 4, **kw)
    next(iter(a))
    b = packer.PackLoader(pack, 4, **kw)
    b.load_state_dict(a.state_dict())
    rest = [x for x, _ in b]
    assert len(rest) == 2 and all(torch.equal(u, v) for u, v in zip(rest, want[1:]))


def test_per_image_bad_use() -> None:
    with pytest.raises(ValueError, match="takes a callable"):
        PT.PerImage(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="mixes images with their labels"):
        PT.PerImage(T2.MixUp(num_classes=3))
    with pytest.raises(ValueError, match="a batch needs one"):
        PT.PerImage(T2.RandomRotation(30, expand=True))(same_images(4), torch.Generator())
    with pytest.raises(ValueError, match=r"must be a batch Tensor \[B, C, H, W\]"):
        PT.PerImage(T2.CenterCrop(2))(torch.zeros(3, 4, 4))


def test_every_named_equivalent_exists() -> None:
    from packer.augment.per_image import _OPS

    twins = [twin for _, twin in _OPS.values() if twin]
    if not hasattr(PT, "TrivialAugmentWide"):
        pytest.skip("packer.transforms' recipe ops have not landed yet (issue 33, the ops)")
    assert [t for t in twins if not hasattr(PT, t)] == []
    for make, _, twin in RANDOM:  # the table above agrees with the module's
        assert _OPS[type(make(T2)).__name__][1] == twin


def test_per_image_in_two_threads_draws_as_alone() -> None:
    """Two loaders' producer threads running PerImage at once: each batch's draws are
    the ones its seed gives alone (the global RNGs it seeds are taken one at a time)."""
    import threading

    t = PT.PerImage(T2.RandomResizedCrop(8))
    x = same_images(16)
    want = {s: t(x, generator=torch.Generator().manual_seed(s)) for s in range(40)}
    bad = []

    def run(seeds: range) -> None:
        for s in seeds:
            if not torch.equal(t(x, generator=torch.Generator().manual_seed(s)), want[s]):
                bad.append(s)

    threads = [threading.Thread(target=run, args=(range(k, 40, 2),)) for k in (0, 1)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not bad
