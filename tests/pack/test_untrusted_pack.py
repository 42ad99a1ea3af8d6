"""A pack from elsewhere runs no code: what it names, its data files and its JSON are
checked before anything reads them; readers share one pack."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import packer
from helpers.forked import start_code
from packer.errors import PackFormatError


def test_every_json_reader_shares_the_guard() -> None:
    # the class of problem: any json.loads on a file imgpack reads back
    import re

    root = Path(packer.__file__).parent
    for path in sorted(root.rglob("*.py")):
        mod = path.relative_to(root).as_posix()
        calls = re.findall(r"json\.loads?\(", path.read_text())
        allowed = 1 if mod == "_fs.py" else 0  # loads_json itself
        assert len(calls) == allowed, (mod, calls)


def edit_manifest(pack: Path, **changes: object) -> None:
    m = json.loads((pack / "imgpack.json").read_text())
    m.update(changes)
    (pack / "imgpack.json").write_text(json.dumps(m))


@pytest.mark.parametrize(
    "tamper, message",
    [
        (
            lambda p: (p / "meta.json").write_text('{"_type": "<class \'os.system\'>"}'),
            "meta.json names type \"<class 'os.system'>\"",
        ),
        (
            lambda p: (p / "_tensordict" / "other.pickle").write_bytes(b"cos\nsystem\n"),
            "holds _tensordict/other.pickle, a file type imgpack never writes",
        ),
        (
            lambda p: edit_manifest(
                p,
                sources=[
                    "../../etc/passwd",
                    *json.loads((p / "imgpack.json").read_text())["sources"][1:],
                ],
            ),
            "leaves the source folder",
        ),
        (lambda p: edit_manifest(p, image_shape=[3, 240, 320]), "the manifest says"),
        (lambda p: edit_manifest(p, version=99), "newer imgpack (format version 99"),
        (lambda p: (p / "imgpack.json").write_text("{not json"), "not valid JSON"),
    ],
)
def test_untrusted_pack_refused_before_anything_runs(packed: Path, tamper, message: str) -> None:
    tamper(packed)
    with pytest.raises(PackFormatError, match=message.replace("(", r"\(").replace("[", r"\[")):
        packer.load(packed)


def test_data_file_symlinked_outside_is_refused(packed: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.bin"
    data = packed / "_tensordict" / "images.memmap"
    outside.write_bytes(data.read_bytes())
    data.unlink()
    data.symlink_to(outside)
    with pytest.raises(PackFormatError, match="missing or not a regular file"):
        packer.load(packed)


def test_loading_imports_nothing_named_in_the_pack(packed: Path) -> None:
    (packed / "meta.json").write_text('{"_type": "<class \'evil_module_xyz.Payload\'>"}')
    with pytest.raises(PackFormatError):
        packer.load(packed)
    assert "evil_module_xyz" not in sys.modules


@pytest.mark.slow
def test_two_readers_share_one_pack(packed: Path) -> None:
    code = (
        "import packer,sys; p=packer.load(sys.argv[1]); "
        "print(int(p.images.sum()), p.labels.tolist()[-1])"
    )
    # two processes at once, each a fork of this one (tests/helpers/forked.py): a fresh
    # interpreter each imported torch, seconds on two cores
    outs = [start_code(code, [packed]) for _ in range(2)]
    results = [o.wait(timeout=120) for o in outs]
    assert all(r.returncode == 0 for r in results), [r.stderr[-2000:] for r in results]
    assert len({r.stdout for r in results}) == 1 and results[0].stdout.strip()
