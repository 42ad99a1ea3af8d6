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


def test_each_kind_answers_the_builds_questions() -> None:
    """The members that replaced the build's branches on ``store``."""
    from packer.builder.config import BuildConfig

    raw, jpeg = KINDS["raw"], KINDS["jpeg"]
    assert (raw.decoded, raw.gpu_build, raw.chunk_files) == (False, True, False)
    assert (jpeg.decoded, jpeg.gpu_build, jpeg.chunk_files) == (True, False, True)
    assert raw.row_bytes((3, 4, 5)) == 60 and jpeg.row_bytes((3, 4, 5)) == 0
    cfg = BuildConfig(store="jpeg", quality=5, max_side=64)
    assert cfg.kind is jpeg and jpeg.fingerprint(cfg) == ["jpeg", 5, 64]
    assert raw.fingerprint(BuildConfig()) is None  # raw builds keep their fingerprint
    assert raw.cut([1] * 5, 144, 300) == [(0, 2), (2, 4), (4, 5)]
    assert jpeg.cut([100, 100, 100, 500, 10], 0, 250) == [(0, 2), (2, 3), (3, 4), (4, 5)]
    assert raw.shape_fits((3, 4, 5), (3, 4, 5)) and not raw.shape_fits((3, 4, 4), (3, 4, 5))
    assert jpeg.shape_fits((3, 4, 4), (3, 4, 5)) and not jpeg.shape_fits((3, 5, 4), (3, 4, 5))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"max_side": 64},
            "BuildConfig.max_side bounds stored JPEGs; use it with BuildConfig.store jpeg",
        ),
        (
            {"store": "jpeg", "device": "cuda"},
            "BuildConfig.device cuda decodes and resizes raw packs",
        ),
        (
            {"store": "jpeg", "device": "cuda:1"},
            "BuildConfig.device cuda:1 decodes and resizes raw packs",
        ),
        ({"store": "jpeg", "max_side": 0}, "BuildConfig.max_side must be 1 to 65536"),
        (
            {"store": "jpeg", "device": "gpu"},
            "BuildConfig.device must be cpu, cuda, cuda:N or auto",
        ),
    ],
)
def test_a_kind_refuses_the_build_options_it_cannot_honour(
    options: dict[str, object], message: str
) -> None:
    from packer.builder.config import BuildConfig

    with pytest.raises(UsageError, match=message):
        BuildConfig(**options).validate()  # type: ignore[arg-type]
    BuildConfig(store="jpeg", device="auto", max_side=64).validate()  # both honoured


def test_a_raw_manifest_writes_no_storage_fields() -> None:
    m = Manifest(1, (3, 2, 2), "crop", (), ("a.png",), ((2, 2),), Checksums(1, ("x",), "y"))
    out = m.to_json()
    assert "storage" not in out and "index" not in out["checksums"]
    assert KINDS["raw"].manifest_json(m) == {} and KINDS["raw"].describe(m) == {}
