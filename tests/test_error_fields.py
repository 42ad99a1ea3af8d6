"""Library errors name config fields, the CLI shows flags (issue 45.8).

A Python caller of ``BuildConfig(size=(0, 0))`` reads ``BuildConfig.size 0x0 is out of
range``, and finds the field in ``e.field``; ``imgpack build --size 0`` prints ``--size
0x0 is out of range``: packer.cli.flags maps each field to its flag, in one table. A
scan of the source keeps CLI flags out of the library's strings.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import pickle
import re
from pathlib import Path

import click
import pytest

from conftest import cli_run, one_error
from helpers.source_ast import nodes
from packer.builder.config import BuildConfig
from packer.builder.dense import DenseOptions
from packer.builder.formats.options import SourceOptions
from packer.cli.flags import FLAGS, cli_message
from packer.compress import CompressConfig
from packer.errors import FIELD_RE, InputError, PackerError, UsageError
from packer.measure.bench.config import BenchConfig
from packer.measure.show import ShowConfig
from packer.measure.verify import VerifyConfig

PACKER = Path(__file__).resolve().parents[1] / "packer"

# Strings starting with "--" (a flag) left in library modules, each with its reason.
# packer/cli/ is the CLI; packer/examples/ are command-line programs of their own (each
# parses its own flags), so neither is scanned.
ALLOWED_FLAG_STRINGS: dict[tuple[str, str], str] = {
    # none: the test S3 server, which started rclone with its own flags, moved to
    # tests/helpers/ (issue 45.9)
}
# imgpack flags named inside a library string (not a `backquoted command`), with reasons
ALLOWED_FLAG_MENTIONS = {
    # the title of `imgpack bench`'s results file names the command that made them
    ("measure/bench/report.py", "--quick"): "the results' title: `imgpack bench --quick`",
}


def _library_files() -> list[Path]:
    skip = (PACKER / "cli", PACKER / "examples")
    return [p for p in sorted(PACKER.rglob("*.py")) if not p.is_relative_to(skip[0])
            and not p.is_relative_to(skip[1])]  # fmt: skip


def _docstrings(path: Path) -> set[int]:
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    out = set()
    for node in nodes(path):  # ast.walk's nodes, walked once a file (helpers.source_ast)
        body = getattr(node, "body", None) if isinstance(node, kinds) else None
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            out.add(id(body[0].value))
    return out


def _strings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of each string in ``path`` but docstrings: a plain constant, or an
    f-string with ``{}`` for each placeholder (so a flag split over parts is one text)."""
    docs = _docstrings(path)
    inside = {id(v) for n in nodes(path) if isinstance(n, ast.JoinedStr) for v in n.values}
    out = []
    for node in nodes(path):
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
            out.append((node.lineno, text))
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docs
            and id(node) not in inside
        ):
            out.append((node.lineno, node.value))
    return out


def _cli_flags() -> set[str]:
    """Every long option of every ``imgpack`` command."""
    from packer.cli import _COMMANDS, cli

    ctx = click.Context(cli)
    flags = set()
    for name in _COMMANDS:
        for p in cli.get_command(ctx, name).params:
            flags.update(o for o in (*p.opts, *p.secondary_opts) if o.startswith("--"))
    return flags - {"--help"}


def test_no_library_string_is_a_cli_flag() -> None:
    """Target of issue 45.8: at most 3 string constants starting with ``--`` in the
    library (outside packer/cli and packer/examples), each allowed with a reason."""
    found = set()
    for path in _library_files():
        rel = path.relative_to(PACKER).as_posix()
        for line, text in _strings(path):
            if re.match(r"--[a-z]", text):
                found.add((rel, text))
                assert (rel, text) in ALLOWED_FLAG_STRINGS, f"packer/{rel}:{line}: {text!r}"
    assert found == set(ALLOWED_FLAG_STRINGS) and len(found) <= 3


def test_no_library_message_names_an_imgpack_flag() -> None:
    """The class, not only strings that start with a flag: no library string names one
    of the CLI's flags mid-text (``give the table with --labels``), except inside a
    backquoted command (``run `imgpack build --shard-size SIZE```)."""
    flags = _cli_flags()
    assert {"--size", "--shard-size", "--append", "--out"} <= flags  # the scan sees them
    named = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
    bad, allowed = [], set()
    for path in _library_files():
        rel = path.relative_to(PACKER).as_posix()
        for line, text in _strings(path):
            outside = re.sub(r"`[^`]*`", "", text)
            for flag in named.findall(outside):
                if (rel, flag) in ALLOWED_FLAG_MENTIONS:
                    allowed.add((rel, flag))
                elif flag in flags:
                    bad.append(f"packer/{rel}:{line}: {flag} in {text!r}")
    assert bad == []
    assert allowed == set(ALLOWED_FLAG_MENTIONS)  # no stale entry


def test_the_scan_finds_a_flag_where_one_is(tmp_path: Path) -> None:
    """The scans above can fail: a flag at the start, in an f-string's part, mid-text."""
    code = '"""--doc"""\nx = "--size 0"\ny = f"--store {s} bad"\nz = "give --labels TABLE"\n'
    (tmp_path / "probe.py").write_text(code)
    texts = [t for _, t in _strings(tmp_path / "probe.py")]
    assert "--size 0" in texts and "--store {} bad" in texts and "give --labels TABLE" in texts
    assert "--doc" not in texts  # a module docstring may name a flag


def _fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_every_flag_in_the_table_is_a_field_and_a_cli_option() -> None:
    """The one table: each key is ``XConfig.field`` of a real config, each value a flag
    of the CLI; so a renamed field or flag cannot leave a message unmapped."""
    configs = {
        "BuildConfig": BuildConfig,
        "CompressConfig": CompressConfig,
        "VerifyConfig": VerifyConfig,
        "ShowConfig": ShowConfig,
        "BenchConfig": BenchConfig,
        "SourceOptions": SourceOptions,  # BuildConfig.sources: parquet/tar/zip options
        "DenseOptions": DenseOptions,  # BuildConfig.dense: boxes, masks from annotations
    }
    flags = _cli_flags()
    for name, flag in FLAGS.items():
        assert FIELD_RE.fullmatch(name), name
        cls, field = name.split(".")
        assert field in _fields(configs[cls]), name
        assert flag in flags, (name, flag)


@pytest.mark.parametrize(
    ("make", "field", "says"),
    [
        (lambda: BuildConfig(size=(0, 0)).validate(), "BuildConfig.size", r"BuildConfig\.size 0x0 is out of range"),
        (lambda: BuildConfig(dense=DenseOptions(format="tiff")).validate(), "DenseOptions.format", r"DenseOptions\.format 'tiff' is not one of"),
        (lambda: BuildConfig(max_side=5).validate(), "BuildConfig.max_side", r"use it with BuildConfig\.store jpeg"),
        (lambda: BuildConfig(shard_size=0).validate(), "BuildConfig.shard_size", r"BuildConfig\.shard_size must be"),
        (lambda: BuildConfig(labels="t.csv", targets=("path",)).validate(), "BuildConfig.targets", r"'path' is not a target"),
        (lambda: BuildConfig(append=True, overwrite=True).validate(), "BuildConfig.append", r"and BuildConfig\.overwrite replaces"),
        (lambda: CompressConfig(quality=40).validate(), "CompressConfig.quality", r"CompressConfig\.quality must be 2"),
        (lambda: VerifyConfig(batch_size=0).validate(), "VerifyConfig.batch_size", r"VerifyConfig\.batch_size must be at least 1"),
        (lambda: VerifyConfig(device="tpu").validate(), "VerifyConfig.device", r"VerifyConfig\.device must be auto"),
        (lambda: ShowConfig(Path("p"), Path("o"), draws=0).validate(), "ShowConfig.draws", r"ShowConfig\.draws must be an integer"),
        (lambda: BenchConfig(sections=("gpu",)).validate(), "BenchConfig.sections", r"BenchConfig\.sections must be some of"),
        (lambda: importlib.import_module("packer.builder.shards").parse_bytes("12XB"), "BuildConfig.shard_size", r"BuildConfig\.shard_size '12XB'"),
    ],
)  # fmt: skip
def test_a_library_error_names_the_field_not_the_flag(make, field: str, says: str) -> None:
    with pytest.raises(UsageError, match=says) as e:
        make()
    assert e.value.field == field and e.value.fields[0] == field
    assert "--" not in str(e.value)
    shown = cli_message(e.value)  # and the CLI shows the flag in its place
    assert FLAGS[field] in shown and field not in shown


def test_the_cli_shows_flags_where_the_library_names_fields(
    image_tree: Path, tmp_path: Path
) -> None:
    code, _, err = cli_run("build", image_tree, tmp_path / "p", "--size", "0")
    assert code == 2
    assert one_error(err).startswith("Error: --size 0x0 is out of range")
    code, _, err = cli_run("build", image_tree, tmp_path / "p", "--max-side", "5")
    assert code == 2
    assert one_error(err) == "Error: --max-side bounds stored JPEGs; use it with --store jpeg"
    code, _, err = cli_run("build", image_tree, tmp_path / "p", "--shard-size", "12XB")
    assert code == 2 and one_error(err).startswith("Error: --shard-size '12XB': give a size")


def test_cli_message_maps_only_the_fields_the_error_carries() -> None:
    """No text parsing in the CLI: the fields come from the error. A field without a flag
    (set from Python only) stays as it is; a longer field is not cut by a shorter one."""
    e = UsageError("BuildConfig.max_side bounds stored JPEGs; use it with BuildConfig.store jpeg",
                   field="BuildConfig.max_side")  # fmt: skip
    assert e.fields == ("BuildConfig.max_side", "BuildConfig.store")
    assert cli_message(e) == "--max-side bounds stored JPEGs; use it with --store jpeg"
    e = UsageError("ShowConfig.size must be 8 to 1024", field="ShowConfig.size")
    assert cli_message(e) == "ShowConfig.size must be 8 to 1024"  # no flag sets it
    e = InputError("a plain message about BuildConfig")  # names no field
    assert e.field is None and e.fields == () and cli_message(e) == str(e)


def test_the_field_survives_a_process_boundary() -> None:
    """Build workers and Ray tasks send errors back pickled: the field comes along."""
    e = pickle.loads(pickle.dumps(UsageError("BuildConfig.size 0x0", field="BuildConfig.size")))
    assert type(e) is UsageError and e.field == "BuildConfig.size"
    assert e.fields == ("BuildConfig.size",) and isinstance(e, PackerError)


def test_no_test_patches_a_module_constant() -> None:
    """Tuning knobs are private fields a test passes (``BuildConfig(_gpu=GpuTuning(
    group_images=4))``, ``ShowConfig(_max_cells=20)``), not module globals it patches:
    no ``monkeypatch.setattr(module, "CONSTANT", ...)`` in the suite."""
    tests = Path(__file__).resolve().parent
    found = []
    for path in sorted(tests.rglob("*.py")):
        for node in nodes(path):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "setattr"
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and re.fullmatch(r"_?[A-Z][A-Z0-9_]*", str(node.args[1].value))
            ):
                found.append(f"{path.relative_to(tests)}:{node.lineno}")
    assert found == []


def test_the_gpu_knobs_are_a_private_field_of_the_config() -> None:
    from packer.builder.config import GpuTuning

    cfg = BuildConfig(_gpu=GpuTuning(group_images=4))
    assert cfg._gpu.group_images == 4 and BuildConfig()._gpu == GpuTuning()
    assert "_gpu" not in repr(cfg)  # not an option a user sets
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg._gpu.group_images = 8  # type: ignore[misc]
