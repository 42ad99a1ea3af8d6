"""The storage-kind registry (``packer.pack.kinds``): lookup by name, a clear error for
an unknown one, and the format's modules importing without Pillow or torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from packer.errors import UsageError
from packer.pack.jpeg import JpegKind
from packer.pack.kind import StorageKind
from packer.pack.kinds import KINDS, UnknownKindError, kind_of
from packer.pack.raw import RawKind
from packer.pack.schema import STORAGE_KINDS, Checksums, Manifest


def test_the_registry_holds_one_kind_per_storage_name() -> None:
    assert tuple(KINDS) == STORAGE_KINDS == ("raw", "jpeg")
    assert isinstance(KINDS["raw"], RawKind) and isinstance(KINDS["jpeg"], JpegKind)
    for name, kind in KINDS.items():
        assert isinstance(kind, StorageKind) and kind.name == name
        assert kind_of(name) is kind


def test_a_manifest_names_its_kind() -> None:
    m = Manifest(1, (3, 2, 2), "crop", (), ("a.png",), ((2, 2),), Checksums(1, ("x",), "y"))
    assert kind_of(m) is KINDS["raw"]


@pytest.mark.parametrize("name", ["png", "", "RAW", "jpeg ", None, 3])
def test_an_unknown_kind_is_a_clear_usage_error(name: object) -> None:
    with pytest.raises(UnknownKindError, match=r"is not one this imgpack knows \(raw, jpeg\)"):
        kind_of(name)  # type: ignore[arg-type]
    with pytest.raises(UsageError) as e:
        kind_of(name)  # type: ignore[arg-type]
    assert e.value.exit_code == 2 and isinstance(e.value, KeyError)
    assert str(e.value).startswith(f"storage kind {name!r} ")  # not KeyError's quoting


@pytest.mark.parametrize(
    "module",
    ["packer.pack.schema", "packer.pack.kind", "packer.pack.kinds", "packer.pack.parse"],
)
def test_the_format_imports_without_pillow_or_torch(module: str) -> None:
    """A manifest's constants and the kinds load in a fresh interpreter without Pillow
    (``import packer.pack.schema`` once loaded it for one constant) or torch."""
    code = (
        f"import sys, {module}\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('PIL', 'torch', 'tensordict'))\n"
        "print(bad)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_image_pack_resolves_to_one_class_everywhere() -> None:
    import packer
    import packer.pack
    from packer.pack import raw, reader

    assert packer.ImagePack is packer.pack.ImagePack is raw.ImagePack is reader.ImagePack
    assert raw.image_pack_class() is raw.ImagePack
    assert packer.ImagePack.__module__ == "packer.pack"
    assert packer.ImagePack.__qualname__ == "ImagePack"
    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        raw.Nope  # noqa: B018
