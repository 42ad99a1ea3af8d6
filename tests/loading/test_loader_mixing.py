"""PackLoader with a label-mixing transform (``mixes_labels = True``, as
packer.transforms.MixUp/CutMix): called with the labels, yields soft labels."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image

import packer
from packer.builder import BuildConfig, build
from packer.errors import UsageError
from packer.loading.order import batch_seed
from packer.measure.bench.synth import make_random_pack

K = 5


class StandInMix:
    """MixUp with one lambda per batch, pairing each image with the one before it."""

    mixes_labels = True
    accepts_generator = True

    def __call__(
        self, images: torch.Tensor, labels: torch.Tensor, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        lam = torch.rand((), generator=generator).to(images.device)
        soft = torch.nn.functional.one_hot(labels, K).float()
        mixed = lam * images.float() + (1 - lam) * images.roll(1, 0).float()
        return mixed.round().to(torch.uint8), lam * soft + (1 - lam) * soft.roll(1, 0)


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> packer.ImagePack:
    return packer.load(make_random_pack(tmp_path_factory.mktemp("mix") / "p", 14, 8, classes=K))


@pytest.mark.parametrize("resident", [False, True])
def test_soft_labels_are_the_mixers_on_each_batch(pack: packer.ImagePack, resident: bool) -> None:
    kw = dict(device="cpu", seed=3, resident=resident)
    plain = list(packer.PackLoader(pack, 4, **kw))
    mixed = list(packer.PackLoader(pack, 4, transform=StandInMix(), **kw))
    assert len(mixed) == len(plain) == 4
    for b, ((x, y), (mx, soft)) in enumerate(zip(plain, mixed)):
        assert soft.dtype == torch.float32 and soft.shape == (len(y), K)
        assert torch.allclose(soft.sum(1), torch.ones(len(y)))
        g = torch.Generator().manual_seed(batch_seed(3, 0, 0, b))  # the loader's per-batch seed
        want_x, want_soft = StandInMix()(x, y, generator=g)
        assert torch.equal(mx, want_x) and torch.equal(soft, want_soft)


def test_mixing_is_resume_exact(pack: packer.ImagePack) -> None:
    kw = dict(device="cpu", seed=8, transform=StandInMix())
    want = list(packer.PackLoader(pack, 4, **kw))
    a = packer.PackLoader(pack, 4, **kw)
    it = iter(a)
    next(it)
    next(it)
    b = packer.PackLoader(pack, 4, **kw)
    b.load_state_dict(a.state_dict())
    rest = list(b)
    assert len(rest) == 2
    for (x, s), (wx, ws) in zip(rest, want[2:]):
        assert torch.equal(x, wx) and torch.equal(s, ws)


def test_jpeg_pack_mixes_after_the_crop(tmp_path: Path) -> None:
    for i in range(6):
        d = tmp_path / "src" / f"c{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (20 + i, 16 + 2 * i), (40 * i,) * 3).save(d / f"{i}.jpg", quality=95)
    build(tmp_path / "src", tmp_path / "jp", BuildConfig(store="jpeg", workers=1))
    jp = packer.load(tmp_path / "jp")
    kw = dict(device="cpu", image_size=8, seed=1, transform=StandInMix())
    runs = [list(packer.PackLoader(jp, 3, **kw)) for _ in range(2)]
    for (x, s), (x2, s2) in zip(*runs):
        assert x.shape == (3, 3, 8, 8) and s.shape == (3, K) and s.dtype == torch.float32
        assert torch.allclose(s.sum(1), torch.ones(3))
        assert torch.equal(x, x2) and torch.equal(s, s2)  # seeded: the same each run


class Broken(StandInMix):
    def __init__(self, what: str) -> None:
        self.what = what

    def __call__(self, images, labels, generator=None):
        x, s = super().__call__(images, labels, generator)
        return {"one": x, "int": (x, labels), "shape": (x, s[:1]), "x": (x[:1], s)}[self.what]


@pytest.mark.parametrize(
    ("what", "match"),
    [
        ("one", r"mixes labels \(mixes_labels = True\) but returned Tensor, not \(images"),
        ("int", r"returned soft labels torch\.int64 \[4\]; a label-mixing transform returns"),
        ("shape", r"returned soft labels torch\.float32 \[1, 5\]"),
        ("x", r"returned shape \[1, 3, 8, 8\] for a batch of 4"),
    ],
)
def test_a_mixer_returning_something_else_is_named(
    pack: packer.ImagePack, what: str, match: str
) -> None:
    loader = packer.PackLoader(pack, 4, device="cpu", transform=Broken(what))
    with pytest.raises(UsageError, match=f"transform .*Broken.* {match}"):
        next(iter(loader))


def test_the_real_mixers_in_a_compose(pack: packer.ImagePack, tmp_path: Path) -> None:
    import packer.transforms as T

    if not all(hasattr(T, n) for n in ("MixUp", "CutMix", "RandomChoice", "RandomErasing")):
        pytest.skip("packer.transforms' mixers have not landed yet (issue 33, the ops)")
    mix = T.RandomChoice([T.MixUp(0.2, K), T.CutMix(1.0, K)])
    tf = T.Compose([T.RandomResizedCrop(6), T.RandomErasing(p=0.5), mix])
    kw = dict(device="cpu", seed=2, transform=tf)
    want = list(packer.PackLoader(pack, 4, **kw))
    for x, soft in want:
        assert x.dtype == torch.uint8 and x.shape[1:] == (3, 6, 6)
        assert soft.dtype == torch.float32 and soft.shape == (len(x), K)
        assert torch.allclose(soft.sum(1), torch.ones(len(x)))
    a = packer.PackLoader(pack, 4, **kw)
    next(iter(a))
    b = packer.PackLoader(pack, 4, **kw)
    b.load_state_dict(a.state_dict())
    for (x, s), (wx, ws) in zip(b, want[1:]):
        assert torch.equal(x, wx) and torch.equal(s, ws)
