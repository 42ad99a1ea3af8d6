"""One pack interface (issue 43.8): a raw pack, a JPEG pack and a pack set answer the
same documented attributes, and ``dir()`` lists them, not tensordict's hundreds."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

import packer
from conftest import write_image
from packer.builder.api import BuildConfig, build
from packer.pack.reader import PACK_ATTRIBUTES

RAW = BuildConfig(size=(8, 6), workers=1)


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("iface")
    for i in range(6):
        write_image(root / "src" / f"c{i % 2}" / f"{i}.png", (20, 16), seed=i)
    jpeg = replace(RAW, store="jpeg")
    for name, cfg in {
        "raw": RAW,
        "jpeg": jpeg,
        "set": replace(RAW, shard_size=2 * 144),
        "jset": replace(jpeg, shard_size=1),
    }.items():
        build(root / "src", root / name, cfg)
    return {k: packer.load(root / k) for k in ("raw", "jpeg", "set", "jset")}


@pytest.mark.parametrize("kind", ["raw", "jpeg", "set", "jset"])
def test_packs_and_sets_answer_the_same_attributes(packs: dict[str, object], kind: str) -> None:
    p, raw = packs[kind], packs["raw"]
    assert set(PACK_ATTRIBUTES) >= {
        "image_shape",
        "classes",
        "class_to_idx",
        "sources",
        "labels",
        "targets",
        "target_names",
        "path",
        "storage",
    }
    assert len(p) == 6 and p.classes == ["c0", "c1"] and p.class_to_idx == {"c0": 0, "c1": 1}
    assert p.sources == raw.sources and p.labels.equal(raw.labels)
    assert p.targets is None and p.target_names == []
    assert isinstance(p.path, Path) and p.path.name == kind
    assert p.storage == ("jpeg" if kind.startswith("j") else "raw")
    shape = p.image_shape
    assert isinstance(shape, tuple) and all(type(v) is int for v in shape)
    if kind in ("raw", "set"):
        assert shape == (3, 6, 8)  # ImagePack had no image_shape
    else:
        assert shape[0] == 3 and shape[1:] <= (16, 20)


@pytest.mark.parametrize("kind", ["raw", "jpeg", "set", "jset"])
def test_dir_lists_the_documented_attributes(packs: dict[str, object], kind: str) -> None:
    names = dir(packs[kind])
    assert set(PACK_ATTRIBUTES) <= set(names) and "__len__" in names
    public = [n for n in names if not n.startswith("_")]
    assert len(public) < 30, public  # an ImagePack's listed some 400 of tensordict's
    for n in public:
        getattr(packs[kind], n)  # every name listed is there


def test_tensordict_behaviour_is_kept(packs: dict[str, object]) -> None:
    p = packs["raw"]
    assert "images" in dir(p) and "to" in dir(p)
    part = p[1:3]
    assert part.images.shape == (2, 3, 6, 8) and part.image_shape == (3, 6, 8)
    assert p.to("cpu").images.equal(p.images) and p.batch_size == torch.Size([6])
    assert hasattr(p, "memmap_") and hasattr(p, "apply")  # unlisted, still there


@pytest.mark.parametrize("name", ["raw", "jpeg", "set", "jset"])
def test_every_pack_class_implements_the_pack_protocol(packs: dict[str, object], name: str) -> None:
    """ImagePack, JpegPack and PackSet (raw and JPEG shards) are each a ``Pack``: by
    isinstance on the runtime-checkable protocol, and by each attribute's value."""
    from packer.pack.jpeg import JpegPack
    from packer.pack.kind import Pack, StorageKind
    from packer.pack.kinds import KINDS
    from packer.pack.raw import ImagePack
    from packer.storage.packset import PackSet

    p = packs[name]
    cls = {"raw": ImagePack, "jpeg": JpegPack, "set": PackSet, "jset": PackSet}[name]
    assert type(p) is cls and isinstance(p, Pack)
    storage = "jpeg" if name.startswith("j") else "raw"
    assert isinstance(p.kind, StorageKind) and p.kind is KINDS[storage]
    assert p.kind.name == p.storage == storage
    assert p.labels.dtype == torch.int64 and p.labels.shape == (6,) and p.targets is None
    assert p.classes == ["c0", "c1"] and isinstance(p.path, Path) and len(p) == 6


def test_an_object_missing_a_pack_attribute_is_not_a_pack(packs: dict[str, object]) -> None:
    from packer.pack.kind import Pack

    class NoKind:
        labels = targets = classes = path = None

        def __len__(self) -> int:
            return 0

    class WithKind(NoKind):
        kind = None

    assert not isinstance(NoKind(), Pack) and isinstance(WithKind(), Pack)
    assert not isinstance(packs["raw"][1:3], Pack)  # a slice has no path or classes
