"""What an ``imgpack build`` of a folder pays for before and after its work (issue 45.11):
no reader of other sources or annotations and no pack-set builder in the parent, none of
Pillow's rarer plugins for the common formats, and an exit that does not trace start-up's
objects."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import subprocess_env, write_image

# ``imgpack ARGS`` through the script's main() in a fresh interpreter, then what it loaded
# and how many objects the garbage collector had frozen, to OUT
_RUN = textwrap.dedent(
    """
    import gc, json, sys
    out, args = sys.argv[1], sys.argv[2:]
    from packer.cli import main
    sys.argv = ["imgpack", *args]
    code = 0
    try:
        main()
    except SystemExit as e:
        code = e.code
    with open(out, "w") as f:
        json.dump({"code": code, "loaded": sorted(sys.modules),
                   "frozen": gc.get_freeze_count()}, f)
    """
)


def _run(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "run.json"
    subprocess.run(
        [sys.executable, "-c", _RUN, str(out), *args],
        env=subprocess_env(),
        check=True,
        capture_output=True,
        timeout=120,
    )
    return json.loads(out.read_text())


def test_a_folder_build_loads_no_other_source_or_set_code(tmp_path: Path) -> None:
    for i in range(4):
        write_image(tmp_path / "src" / f"c{i % 2}" / f"{i}.jpg", (24, 18), seed=i)
    got = _run(tmp_path, "build", str(tmp_path / "src"), str(tmp_path / "p"), "--size", "8",
               "--workers", "2", "--quiet")  # fmt: skip
    assert got["code"] == 0 and (tmp_path / "p").is_dir()
    unwanted = (
        "packer.builder.shards",
        "packer.builder.set_plan",
        "packer.builder.formats.parquet",
        "packer.builder.formats.parquet_pages",
        "packer.builder.formats.table_columns",
        "packer.builder.formats.arrow",
        "packer.builder.formats.webdataset",
        "packer.builder.formats.archive",
        "packer.builder.formats.remote",
        "packer.sources.annotations.detect",
        "packer.sources.annotations.coco",
        "packer.sources.annotations.voc",
        "packer.sources.annotations.yolo",
        "packer.sources.annotations.masks",
        "pyarrow",
        "tarfile",
    )
    assert [m for m in got["loaded"] if m in unwanted] == []
    assert "packer.builder.run" in got["loaded"]  # the probe sees what the build used


def test_the_script_freezes_start_ups_objects_before_the_exit(tmp_path: Path) -> None:
    got = _run(tmp_path, "--version")
    assert got["code"] == 0 and got["frozen"] > 1000


def test_the_annotation_names_still_import_from_the_package() -> None:
    from packer.sources.annotations import CategoryMap, read_annotations
    from packer.sources.annotations.detect import read_annotations as direct
    from packer.sources.annotations.model import CategoryMap as model_map

    assert read_annotations is direct and CategoryMap is model_map


# decodes each file named on the command line in this fresh interpreter, then prints
# whether Pillow loaded its rarer plugins (DDS is one) and every plugin
_DECODE = textwrap.dedent(
    """
    import sys
    from packer.imaging.decode import ResizeSpec, decode
    for path in sys.argv[1:]:
        assert decode(path, ResizeSpec(8, 8)).shape == (3, 8, 8)
    print("PIL.DdsImagePlugin" in sys.modules)
    """
)


def _rare_plugins_loaded(*paths: Path) -> bool:
    r = subprocess.run(
        [sys.executable, "-c", _DECODE, *map(str, paths)],
        env=subprocess_env(),
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return r.stdout.strip() == "True"


def test_common_formats_decode_without_pillows_rarer_plugins(tmp_path: Path) -> None:
    jpg = write_image(tmp_path / "a.jpg", (32, 24))
    png = write_image(tmp_path / "b.png", (32, 24))
    tif = write_image(tmp_path / "c.tif", (32, 24))
    assert not _rare_plugins_loaded(jpg, png)
    assert _rare_plugins_loaded(jpg, tif)  # a format past the common ones loads them all
