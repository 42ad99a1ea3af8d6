"""The manifest: one typed schema, validated once where it is read; every pack verifies."""

from __future__ import annotations

import json
import os
import pickle
import re
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

import packer
from conftest import cli_build as _build
from conftest import cli_run as _cli
from conftest import subprocess_env, write_image
from helpers.forked import run_script
from packer.cli import cli
from packer.errors import PackFormatError, UsageError
from packer.measure.verify import VerifyConfig, verify
from packer.pack.describe import describe
from packer.pack.files import read_manifest
from packer.pack.reader import ImagePack
from packer.pack.schema import Manifest


def edit(pack: Path, change) -> None:
    m = json.loads((pack / "imgpack.json").read_text())
    change(m)
    (pack / "imgpack.json").write_text(json.dumps(m))


def put(path: str, value: object):
    def change(m: dict) -> None:
        *outer, key = path.split(".")
        d = m
        for k in outer:
            d = d[k]
        d[key] = value

    return change


TAMPERED = [
    (put("skipped", ["a.jpg", "b.jpg"]), "field 'skipped' must hold {path, reason}"),
    (put("skipped", [{"path": 1, "reason": "x"}]), "field 'skipped' must hold"),
    (put("class_counts", 13), "field 'class_counts' must be a list of 3 counts"),
    (put("class_counts", [1, 2]), "field 'class_counts' must be a list of 3 counts"),
    (put("build.source_root", 7), "field 'build.source_root' is not a string"),
    (put("build.created", ["x"]), "field 'build.created' is not a string"),
    (put("build.max_pixels", "big"), "field 'build.max_pixels' is missing or not an integer"),
    (put("build", []), "field 'build' is missing or not an object"),
    (put("checksums.block_rows", "64"), "field 'checksums.block_rows' is missing or not an int"),
    (put("checksums.images", "abc"), "field 'checksums.images' is missing or not a list"),
    (put("checksums.images", [1, 2]), "checksums.images must be strings"),
    (put("checksums.labels", None), "field 'checksums.labels' is missing or not a string"),
    (put("checksums", "x"), "field 'checksums' is missing or not an object"),
    (put("classes", [1, 2, 3]), "class names must be strings"),
    (put("classes", ["a", "a", "b"]), "class names must be distinct"),
    (put("count", "13"), "field 'count' is missing or not an integer"),
    (put("count", True), "field 'count' is missing or not an integer"),
    (put("version", 1.0), "field 'version' is missing or not an integer"),
    (put("image_shape", [3, "24", 32]), "bad count 13 or image_shape"),
    (put("resize", "zoom"), "field 'resize' must be one of stretch, crop, pad"),
    (put("sources", "cat/a.jpg"), "field 'sources' is missing or not a list"),
    (put("source_sizes", [[1]] * 13), "field 'source_sizes' must hold [width, height]"),
    (put("targets", "x"), "targets recorded as 'x'; expected"),
    (put("targets", ["age"]), "targets recorded as ['age']"),
    (put("label_dtype", "float32"), "labels recorded as 'float32', expected 'int64'"),
    (put("label_dtype", "int32"), "labels recorded as 'int32', expected 'int64'"),
    (put("label_shape", [13, 1]), "label_shape [13, 1] does not match 13 images"),
    (put("label_shape", [12]), "label_shape [12] does not match 13 images"),
    (put("build.unlisted", -1), "field 'build.unlisted' is missing or not an integer"),
    (put("build.labels_table", 3), "field 'build.labels_table' is not a string"),
    (put("checksums.targets", "ab"), "'checksums.targets' must be given exactly when"),
    (put("storage", "webp"), "storage 'webp' is not one this imgpack reads"),
    (put("storage", "jpeg"), "field 'storage_version' is missing or not an integer"),
    (lambda m: m.clear(), "not an imgpack manifest"),
]
RAW = [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"format": "imgpack", "build": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    ("[1, 2]", "not an imgpack manifest"),
]


def _tamper(pack: Path, case) -> str:
    change, message = case
    if isinstance(change, str):
        (pack / "imgpack.json").write_text(change)
    else:
        edit(pack, change)
    return message


@pytest.mark.parametrize("case", TAMPERED + RAW, ids=[m for _, m in TAMPERED + RAW])
def test_tampered_field_is_a_clean_error_everywhere(packed: Path, case) -> None:
    message = _tamper(packed, case)
    with pytest.raises(PackFormatError, match=re.escape(message)) as e:
        packer.load(packed)
    assert str(e.value).startswith(str(packed))
    with pytest.raises(PackFormatError, match=re.escape(message)):
        describe(packed)
    r = CliRunner().invoke(cli, ["info", str(packed)])
    assert r.exit_code == 2 and "Traceback" not in r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {packed}") and message in lines[0]
    r = CliRunner().invoke(cli, ["verify", str(packed), "--no-speed", "-q"])
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert r.stdout.startswith("FAIL  manifest") and message in r.stdout


def test_round_trip_keeps_the_on_disk_keys(packed: Path) -> None:
    raw = json.loads((packed / "imgpack.json").read_text())
    m = read_manifest(packed)
    assert m.to_json() == raw
    assert Manifest.from_json(m.to_json()) == m
    assert m.image_shape == (3, 24, 32) and m.resize == "crop" and m.build.max_pixels == 100_000_000
    assert m.skipped == () and m.class_counts == (4, 4, 5)
    assert raw["build"]["size"] == [32, 24] and raw["build"]["resize"] == "crop"


def test_old_manifest_without_optional_fields_reads_with_defaults(packed: Path) -> None:
    def strip(m: dict) -> None:
        for key in ("class_counts", "dtype"):
            m.pop(key)
        for key in ("max_pixels", "size", "resize", "imgpack_version"):
            m["build"].pop(key)
        m["checksums"].pop("algorithm")

    edit(packed, strip)
    m = packer.load(packed).manifest
    assert m.class_counts == () and m.build.max_pixels == 100_000_000
    assert m.build.imgpack_version is None and m.checksums.algorithm == "sha256"
    assert describe(packed)["class_counts"] == {"cat": 0, "dog": 0, "zebra": 0}
    assert verify(packed, VerifyConfig(throughput=False)).ok


def test_info_json_comes_from_describe(packed: Path) -> None:
    r = CliRunner().invoke(cli, ["info", str(packed), "--json"])
    assert r.exit_code == 0
    assert json.loads(r.stdout) == json.loads(json.dumps(describe(packed)))
    assert set(json.loads(r.stdout)) == {
        "path",
        "count",
        "image_shape",
        "classes",
        "class_counts",
        "class_to_idx",
        "targets",
        "bytes",
        "build",
        "skipped",
        "format_version",
    }


def test_pack_attributes(packed: Path) -> None:
    pack = packer.load(packed)
    assert isinstance(pack.manifest, Manifest) and pack.path == packed
    assert pack.classes == ["cat", "dog", "zebra"] and len(pack.sources) == 13
    with pytest.raises(AttributeError, match="classes"):
        _ = pack[2:5].classes


def test_random_pack_of_the_scripts_verifies(tmp_path: Path) -> None:
    from packer.measure.bench.synth import make_random_pack

    path = make_random_pack(tmp_path / "r", 300, 8, classes=3)
    r = verify(path, VerifyConfig(throughput=False, use_recorded_source=False))
    assert r.ok, r.checks
    assert [c["name"] for c in r.checks] == ["manifest", "files", "images", "labels"]
    pack = packer.load(path)
    assert len(pack) == 300 and pack.labels[:4].tolist() == [0, 1, 2, 0]


class _Payload:
    """Unpickling this creates a marker folder: proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.makedirs, (self.marker,))


@pytest.mark.parametrize("where", ["other.pickle", "_tensordict/other.pickle"])
def test_planted_pickle_never_runs_through_any_entry(
    packed: Path, tmp_path: Path, where: str
) -> None:
    import tensordict

    marker = tmp_path / "ran"
    payload = pickle.dumps(_Payload(marker))
    pickle.loads(payload)  # the payload works: unpickling it makes the marker
    assert marker.is_dir()
    marker.rmdir()
    (packed / where).write_bytes(payload)
    entries = [
        lambda: packer.load(packed),
        lambda: ImagePack.load_memmap(packed),
        lambda: ImagePack.load(packed),
        lambda: ImagePack.load_memmap(packed, allow_pickle=False),
        lambda: tensordict.TensorDict.load_memmap(packed),
        lambda: tensordict.load_memmap(packed),
    ]
    for entry in entries:
        with pytest.raises(PackFormatError, match="a file type imgpack never writes"):
            entry()
        assert not marker.exists()


@pytest.mark.filterwarnings("ignore::FutureWarning")  # tensordict's, on unpickling
def test_a_meta_json_naming_another_class_never_runs_a_planted_pickle(
    packed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``meta.json`` alone picks the class whose loader tensordict runs, and
    NonTensorData's unpickles ``other.pickle``: imgpack's hook on tensordict's metadata
    reader refuses any folder holding an imgpack manifest whose meta.json is not
    exactly imgpack's, before that loader is chosen."""
    import tensordict
    from tensordict import NonTensorData
    from tensordict._base import serialization

    marker = tmp_path / "ran"
    (packed / "other.pickle").write_bytes(pickle.dumps(_Payload(marker)))
    (packed / "meta.json").write_text(json.dumps({"_type": str(NonTensorData)}))
    entries = [
        lambda: tensordict.load_memmap(packed),
        lambda: tensordict.load(packed),
        lambda: tensordict.TensorDict.load_memmap(packed),
        lambda: NonTensorData.load_memmap(packed),
        lambda: tensordict.TensorDict.load_memmap(packed, allow_pickle=False),
    ]
    for entry in entries:
        with pytest.raises(PackFormatError, match=r"meta\.json names type .*NonTensorData"):
            entry()
        assert not marker.exists()
    with pytest.raises(PackFormatError, match="a file type imgpack never writes"):
        packer.load(packed)
    # the same meta.json under imgpack's own type, with tensordict's class id beside it
    # (which tensordict prefers to the type): refused as well
    (packed / "meta.json").write_text(
        json.dumps({"_type": "<class 'packer.pack.ImagePack'>", "_class": "x:NonTensorData"})
    )
    with pytest.raises(PackFormatError, match=r"meta\.json names type 'x:NonTensorData'"):
        tensordict.load_memmap(packed)
    # a pack's data folder loads alone only after the pack's checks
    (packed / "other.pickle").unlink()
    (packed / "meta.json").write_text(json.dumps({"_type": "<class 'packer.pack.ImagePack'>"}))
    td = tensordict.TensorDict.load_memmap(packed / "_tensordict")  # clean: tensordict reads it
    assert td["labels"].tolist() == packer.load(packed).labels.tolist()
    (packed / "_tensordict" / "other.pickle").write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(PackFormatError, match="a file type imgpack never writes"):
        tensordict.load_memmap(packed / "_tensordict")
    (packed / "_tensordict" / "other.pickle").unlink()
    meta = json.loads((packed / "_tensordict" / "meta.json").read_text())
    for change in ({"_type": str(NonTensorData)}, {"_class": "x:NonTensorData"}, {"x": 1}):
        (packed / "_tensordict" / "meta.json").write_text(json.dumps({**meta, **change}))
        with pytest.raises(PackFormatError, match="does not describe the manifest's fields"):
            tensordict.TensorDict.load_memmap(packed / "_tensordict")
    assert not marker.exists()
    # not vacuous: without the hook, tensordict runs the payload
    (packed / "other.pickle").write_bytes(pickle.dumps(_Payload(marker)))
    (packed / "meta.json").write_text(json.dumps({"_type": str(NonTensorData)}))
    guarded = serialization._load_metadata
    monkeypatch.setattr(serialization, "_load_metadata", guarded._imgpack_unguarded)
    try:
        tensordict.load_memmap(packed)
    except Exception:
        pass
    assert marker.is_dir()


# each pack named on the command line, through each entry: one line per pack, a JSON list
# of what each entry said (one interpreter for every case: each start imports torch)
_SPECIAL_META = textwrap.dedent(
    """
    import json, sys, tensordict
    import packer.pack
    from packer.errors import PackFormatError
    for path in sys.argv[1:]:
        said = []
        for load in (packer.load, tensordict.load_memmap, tensordict.TensorDict.load_memmap):
            try:
                load(path)
            except PackFormatError as e:
                said.append("refused: " + str(e))
            else:
                said.append("opened")
        print(json.dumps(said), flush=True)
    """
)

_SPECIAL_KINDS = ("fifo", "dev-zero")
_SPECIAL_NAMES = ("meta.json", "_tensordict/meta.json", "imgpack.json")


@pytest.fixture(scope="session")
def special_meta_lines(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], list]:
    """``{(kind, name): what each entry said}``: a pack (image_tree's shape) copied once per
    case, its ``name`` replaced by a FIFO or a link to /dev/zero, all read by one child
    with a timeout (so a regression fails instead of hanging)."""
    import shutil

    from packer.builder.api import BuildConfig, build

    root = tmp_path_factory.mktemp("special-meta")
    for i, size in enumerate(((64, 48), (30, 60), (50, 50), (33, 47))):
        write_image(root / "src" / f"c{i % 2}" / f"{i}.png", size, seed=i)
    build(root / "src", root / "pack", BuildConfig(size=(32, 24), workers=1))
    cases = [(k, n) for k in _SPECIAL_KINDS for n in _SPECIAL_NAMES]
    packs = []
    for i, (kind, name) in enumerate(cases):
        pack = shutil.copytree(root / "pack", root / f"case{i}")
        (pack / name).unlink()
        if kind == "fifo":
            os.mkfifo(pack / name)
        else:
            (pack / name).symlink_to("/dev/zero")
        packs.append(str(pack))
    script = root / "load.py"
    script.write_text(_SPECIAL_META)
    # a fork of this process (tests/helpers/forked.py), killed past the timeout
    p = run_script(script, packs, env=subprocess_env(), timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stdout.splitlines()
    assert len(lines) == len(cases), p.stdout
    return {case: json.loads(line) for case, line in zip(cases, lines)}


# the six cases on one xdist worker: one child for them all, not one a worker
@pytest.mark.xdist_group("special-meta")
@pytest.mark.parametrize("kind", _SPECIAL_KINDS)
@pytest.mark.parametrize("name", _SPECIAL_NAMES)
def test_a_metadata_file_that_is_not_a_regular_file_is_refused_not_read(
    special_meta_lines: dict[tuple[str, str], list], kind: str, name: str
) -> None:
    """A FIFO would hang the reader for good, a link to /dev/zero read until memory
    runs out: each entry refuses it from the opened descriptor."""
    what = "a FIFO" if kind == "fifo" else "a character device"
    lines = special_meta_lines[kind, name]
    assert len(lines) == 3 and all(f"{name} is not a regular file ({what})" in x for x in lines)


def _sparse(path: Path, size: int, head: bytes = b"") -> None:
    path.unlink(missing_ok=True)
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)


@pytest.mark.parametrize(
    ("name", "size", "cap"),
    [
        ("meta.json", 12 << 30, "65,536"),  # a sparse 12 GB meta.json
        ("_tensordict/meta.json", 1 << 20, "65,536"),
        ("imgpack.json", (1 << 30) + 1, "1,073,741,824"),  # the reader's constant cap
    ],
)
def test_metadata_reads_are_bounded_before_reading(
    packed: Path, name: str, size: int, cap: str
) -> None:
    """Sizes checked on the opened file first: refused in no time and no memory, however
    large (the caps are the reader's constants)."""
    _sparse(packed / name, size, b'{"format": "imgpack", ')
    for load in (packer.load, lambda p: verify(p, VerifyConfig(throughput=False))):
        try:
            r = load(packed)
        except PackFormatError as e:
            msg = str(e)
        else:
            msg = " ".join(c["detail"] for c in r.checks if not c["ok"])
        assert f"{name} is {size:,} bytes, more than this pack's can be ({cap})" in msg


def test_the_manifest_cap_is_the_readers_not_the_packs(packed: Path) -> None:
    """Issue 42.3: the cap followed the labels file's apparent size, so a sparse 32 MB
    labels.memmap lifted it to 2 GiB and a sparse 1.9 GB manifest was read whole (4.3 GB
    of RSS) before it was refused. Now the cap is the reader's constant, and a manifest
    that does not start as a JSON object is refused at its first chunk."""
    import resource

    from packer.pack.files import manifest_limit
    from packer.pack.schema import MAX_MANIFEST_BYTES

    _sparse(packed / "_tensordict" / "labels.memmap", 32 << 20)
    assert manifest_limit(packed) == MAX_MANIFEST_BYTES == 1 << 30
    size = (1 << 30) - 1  # under the cap: sparse zeros, refused at the first chunk
    _sparse(packed / "imgpack.json", size)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for load in (packer.load, lambda p: verify(p, VerifyConfig(throughput=False))):
        try:
            r = load(packed)
        except PackFormatError as e:
            msg = str(e)
        else:
            msg = " ".join(c["detail"] for c in r.checks if not c["ok"])
        assert "imgpack.json does not start as JSON (it starts with b'\\x00')" in msg
    grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before  # KiB on Linux
    assert grew < 512 << 10, f"reading the refused manifest took {grew} KiB more"


def test_real_manifests_are_well_inside_the_cap(tmp_path: Path) -> None:
    from packer.measure.bench.synth import make_random_pack
    from packer.pack.schema import MAX_MANIFEST_BYTES

    path = make_random_pack(tmp_path / "r", 1000, 4)
    size = (path / "imgpack.json").stat().st_size
    assert size < 200 * 1000 < MAX_MANIFEST_BYTES // 5000  # ten million images fit
    assert len(packer.load(path)) == 1000


def test_class_loaders_open_a_clean_pack_like_packer_load(packed: Path) -> None:
    a, b = packer.load(packed), ImagePack.load_memmap(packed)
    assert isinstance(b, ImagePack) and b.classes == a.classes
    assert (a.images == b.images).all() and (a.labels == b.labels).all()
    with pytest.raises(UsageError, match="takes no other options"):
        ImagePack.load_memmap(packed, allow_pickle=True)
    with pytest.raises(UsageError, match="loading into a pack is not offered"):
        a.load_memmap_(packed)


def test_optional_fields_round_trip_and_stay_off_disk_when_unset(packed: Path) -> None:
    from dataclasses import replace

    m = read_manifest(packed)
    j = m.to_json()
    assert not {"storage", "targets", "class_map"} & set(j)
    assert (j["label_dtype"], j["label_shape"]) == ("int64", [13])  # recorded for every pack
    grown = replace(
        m,
        targets=("age", "score"),
        class_map="classes.txt",
        checksums=replace(m.checksums, targets="00"),
    )
    j = grown.to_json()
    assert j["targets"] == {"names": ["age", "score"], "dtype": "float32", "shape": [13, 2]}
    assert j["class_map"] == "classes.txt" and j["checksums"]["targets"] == "00"
    assert Manifest.from_json(j) == grown
    spec = {f.name: f for f in grown.fields}["targets"]
    assert (spec.dtype, spec.row_shape, spec.row_bytes) == ("float32", (2,), 8)
    # a pack that says it has targets needs the file, at the size the manifest gives
    (packed / "imgpack.json").write_text(json.dumps(j))
    with pytest.raises(PackFormatError, match=r"targets\.memmap is missing"):
        packer.load(packed)


@pytest.mark.parametrize("name", ["x\\y.png", "..\\..\\up.png", "c:x.png", "..x.png", "tail\\.png"])
def test_backslash_and_odd_names_build_load_info_verify(src: Path, tmp_path: Path, name: str):
    write_image(src / "cat" / name, (12, 10), seed=7)
    code, _, err = _build(src, tmp_path / "pk")
    assert code == 0, err
    pack = packer.load(tmp_path / "pk")
    assert f"cat/{name}" in pack.sources and len(pack) == 4
    code, out, err = _cli("info", tmp_path / "pk", "--json")
    assert code == 0, err
    code, out, err = _cli(
        "verify", tmp_path / "pk", "--source", src, "--sample", "all", "--no-speed", "-q"
    )
    assert code == 0, out + err
    assert "4 source images re-decoded" in out, out


@pytest.mark.parametrize(
    "bad", ["/etc/passwd", "../x.png", "cat/../../x.png", "", "a\x00b", "cat/..", 5]
)
def test_sources_that_leave_the_root_are_still_refused(bad: object) -> None:
    from packer.pack.parse import _source_ok

    assert not _source_ok(bad)
    assert _source_ok("cat/x\\..\\y.png")  # one POSIX name: stays under the root
