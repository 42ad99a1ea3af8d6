"""Building from parquet, Arrow (``save_to_disk``), WebDataset tars and zip archives
(issue 47): the same bytes as the same images as a folder, in the same order; the
columns told apart or named; broken rows skipped with their location; resume after a
kill; and hostile inputs skipped or refused in one line, never read unbounded."""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from source_data import digests, hf_dataset, in_order, tree, write_shards, write_zip

from conftest import KILL_SCRIPT, cli_build, cli_run, one_error, subprocess_env
from helpers.optional import needs
from packer.builder.api import BuildConfig, build
from packer.builder.formats.base import expand_braces
from packer.builder.formats.options import SourceOptions
from packer.builder.run import work_dir_for
from packer.errors import InputError, UsageError

pytestmark = needs("pyarrow", "datasets", "webdataset")

RAW = BuildConfig(size=(16, 12), workers=1)
MANIFEST_NAMES = ("sources",)  # what names the images: a location in the source


def build_cli(src: object, dst: Path, *extra: object) -> tuple[int, str, str]:
    """``imgpack build`` at 8x6, one worker, skips listed on stderr."""
    return cli_run("build", src, dst, "--size", "8x6", "--workers", "1", *extra)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return tree(tmp_path / "src")


def folder_pack(folder: Path, tmp_path: Path, config: BuildConfig = RAW) -> Path:
    build(folder, tmp_path / "from_folder", config)
    return tmp_path / "from_folder"


# ---------------------------------------------------------------- the same bytes


@pytest.mark.parametrize(
    "config",
    [RAW, BuildConfig(size=(16, 12), workers=2, store="jpeg", max_side=48)],
    ids=["raw-1-worker", "jpeg-2-workers"],
)
def test_parquet_equals_folder(folder: Path, tmp_path: Path, config: BuildConfig) -> None:
    ds = hf_dataset(folder)
    ds.to_parquet(str(tmp_path / "train.parquet"), batch_size=5)  # several row groups
    r = build(str(tmp_path / "train.parquet"), tmp_path / "p", config)
    assert r.classes == ["cat", "dog"] and not r.skipped and r.count == 16
    assert r.classes_from == "dataset"  # the ClassLabel's names: fixed by the data
    want = digests(folder_pack(folder, tmp_path, config), MANIFEST_NAMES)
    assert digests(tmp_path / "p", MANIFEST_NAMES) == want
    sources = json.loads((tmp_path / "p" / "imgpack.json").read_text())["sources"]
    assert sources[:2] == ["train.parquet row 0", "train.parquet row 1"]


def test_parquet_shards_by_glob_and_list_equal_folder(folder: Path, tmp_path: Path) -> None:
    ds = hf_dataset(folder)
    (tmp_path / "data").mkdir()
    for k in range(3):  # rows in order across the files
        ds.shard(3, k, contiguous=True).to_parquet(
            str(tmp_path / "data" / f"train-{k:05d}.parquet")
        )
    want = digests(folder_pack(folder, tmp_path), MANIFEST_NAMES)
    build(str(tmp_path / "data" / "train-*.parquet"), tmp_path / "glob", RAW)
    assert digests(tmp_path / "glob", MANIFEST_NAMES) == want
    files = sorted(str(p) for p in (tmp_path / "data").iterdir())
    code, _, err = cli_run(
        "build", *files, tmp_path / "cli", "--size", "16x12", "--workers", "1", "-q"
    )
    assert code == 0, err
    assert digests(tmp_path / "cli", MANIFEST_NAMES) == want


def test_saved_dataset_equals_folder(folder: Path, tmp_path: Path) -> None:
    hf_dataset(folder).save_to_disk(str(tmp_path / "saved"))
    r = build(tmp_path / "saved", tmp_path / "p", BuildConfig(size=(16, 12), workers=2))
    assert r.classes == ["cat", "dog"] and r.count == 16
    assert digests(tmp_path / "p", MANIFEST_NAMES) == digests(
        folder_pack(folder, tmp_path), MANIFEST_NAMES
    )


def test_arrow_files_named_alone_equal_folder(folder: Path, tmp_path: Path) -> None:
    hf_dataset(folder).save_to_disk(str(tmp_path / "saved"), num_shards=2)
    files = sorted(str(p) for p in (tmp_path / "saved").glob("*.arrow"))
    code, _, err = cli_run("build", *files, tmp_path / "p", "--size", "16x12", "--workers", "1")
    assert code == 0, err
    assert digests(tmp_path / "p", MANIFEST_NAMES) == digests(
        folder_pack(folder, tmp_path), MANIFEST_NAMES
    )


def test_webdataset_shards_equal_folder(folder: Path, tmp_path: Path) -> None:
    write_shards(folder, tmp_path / "shards", maxcount=3)  # 6 shards
    (tmp_path / "classes.txt").write_text("cat\ndog\n")
    config = BuildConfig(size=(16, 12), workers=2, classes=tmp_path / "classes.txt")
    r = build(str(tmp_path / "shards" / "train-{000000..000005}.tar"), tmp_path / "p", config)
    assert r.count == 16 and not r.skipped
    want = folder_pack(folder, tmp_path, config)
    assert digests(tmp_path / "p", MANIFEST_NAMES) == digests(want, MANIFEST_NAMES)
    first = json.loads((tmp_path / "p" / "imgpack.json").read_text())["sources"][0]
    assert first == "train-000000.tar member 000000.png"


def test_webdataset_label_from_json_field(folder: Path, tmp_path: Path) -> None:
    write_shards(folder, tmp_path / "shards", maxcount=8, label="species")
    code, _, err = cli_build(
        tmp_path / "shards" / "train-{000000..000001}.tar",
        tmp_path / "p",
        "--label-field",
        "species",
    )
    assert code == 0, err
    m = json.loads((tmp_path / "p" / "imgpack.json").read_text())
    assert m["classes"] == ["cat", "dog"] and m["class_counts"] == [8, 8]


@pytest.mark.parametrize("layout", ["tree", "flat", "table"])
def test_zip_equals_folder(folder: Path, tmp_path: Path, layout: str) -> None:
    src = folder
    if layout == "flat":
        src = tmp_path / "flat"
        for rel, data, _, _ in in_order(folder):
            (src / rel.replace("/", "_")).parent.mkdir(parents=True, exist_ok=True)
            (src / rel.replace("/", "_")).write_bytes(data)
    archive = write_zip(src, tmp_path / "imgs.zip") if layout != "flat" else tmp_path / "imgs.zip"
    if layout == "flat":
        with zipfile.ZipFile(archive, "w") as z:
            for p in sorted(src.iterdir()):
                z.writestr(p.name, p.read_bytes())
    config = RAW
    if layout == "table":
        table = "path,label\n" + "".join(f"{r},{c}\n" for r, _, _, c in in_order(folder))
        with zipfile.ZipFile(archive, "a") as z:
            z.writestr("labels.csv", table)
        (tmp_path / "labels.csv").write_text(table)
        want = tmp_path / "want"
        build(folder, want, BuildConfig(size=(16, 12), workers=1, labels=tmp_path / "labels.csv"))
        config = BuildConfig(size=(16, 12), workers=1, labels=Path("labels.csv"))
    else:
        want = folder_pack(src, tmp_path)
    build(str(archive), tmp_path / "p", config)
    # a zip's images keep their paths: the manifest is the folder's, sources and all
    a, b = digests(tmp_path / "p"), digests(want)
    if layout == "table":  # the table's own path differs; everything else is the same
        a.pop("imgpack.json"), b.pop("imgpack.json")
        ma, mb = (json.loads((d / "imgpack.json").read_text()) for d in (tmp_path / "p", want))
        assert ma["build"].pop("labels_table") == str(archive / "labels.csv")
        for m in (ma, mb):
            m["build"].pop("labels_table", None), m["build"].pop("created")
            m["build"].pop("source_root")
        assert ma == mb
    assert a == b


@pytest.mark.parametrize("kind", ["saved", "parquet", "zip", "tar"])
def test_verify_passes_on_a_pack_from_a_source(folder: Path, tmp_path: Path, kind: str) -> None:
    if kind == "saved":
        hf_dataset(folder).save_to_disk(str(tmp_path / "src"))
        src: object = tmp_path / "src"
    elif kind == "parquet":
        hf_dataset(folder).to_parquet(str(tmp_path / "t.parquet"))
        src = tmp_path / "t.parquet"
    elif kind == "zip":
        src = write_zip(folder, tmp_path / "imgs.zip")
    else:
        src = write_shards(folder, tmp_path / "shards", maxcount=100)[0]
    code, _, err = build_cli(src, tmp_path / "p", "-q")
    assert code == 0, err
    code, out, err = cli_run("verify", tmp_path / "p", "--no-speed")
    assert code == 0, out + err


# ---------------------------------------------------------------- columns


def test_ambiguous_columns_are_listed_and_named(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    good = io.BytesIO()
    from PIL import Image

    Image.new("RGB", (20, 10), (200, 10, 10)).save(good, "PNG")
    t = pa.table(
        {
            "img_a": pa.array([good.getvalue()] * 3, pa.binary()),
            "img_b": pa.array([b"x"] * 3, pa.binary()),
            "label": pa.array(["x", "y", "x"]),
            "cls": pa.array([0, 1, 0]),
        }
    )
    pq.write_table(t, tmp_path / "t.parquet")
    code, _, err = cli_build(tmp_path / "t.parquet", tmp_path / "p")
    assert code == 2
    line = one_error(err)
    assert "cannot tell which column holds the images" in line
    assert "img_a (binary), img_b (binary), label (string), cls (int64)" in line
    assert "--image-column" in line
    code, _, err = cli_build(tmp_path / "t.parquet", tmp_path / "p", "--image-column", "img_a")
    assert code == 2 and "which column holds the labels" in one_error(err)
    code, out, err = cli_run(
        "build", tmp_path / "t.parquet", tmp_path / "p", "--size", "8x6", "--workers", "1",
        "--image-column", "img_a", "--label-column", "label",
    )  # fmt: skip
    assert code == 0, err
    assert f"classes: 2 inferred from the label names in {tmp_path / 't.parquet'}" in out + err
    m = json.loads((tmp_path / "p" / "imgpack.json").read_text())
    assert m["classes"] == ["x", "y"] and m["class_counts"] == [2, 1]


def test_missing_pyarrow_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "t.parquet").write_bytes(b"PAR1")
    for name in [m for m in sys.modules if m == "pyarrow" or m.startswith("pyarrow.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow raises ImportError
    code, _, err = cli_build(tmp_path / "t.parquet", tmp_path / "p")
    assert code == 2
    assert "pip install 'imgpack[sources]'" in one_error(err)


# ---------------------------------------------------------------- broken rows, strict


def test_broken_and_null_rows_are_skipped_with_their_location(folder: Path, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = in_order(folder)
    images = [{"bytes": b, "path": r} for r, b, _, _ in rows]
    images[3] = {"bytes": rows[3][1][: len(rows[3][1]) // 3], "path": "cut"}  # a cut PNG
    images[5] = None
    t = pa.table(
        {
            "image": pa.array(images, pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
            "label": pa.array([lab for _, _, lab, _ in rows]),
        }
    )
    pq.write_table(t, tmp_path / "train-00003.parquet", row_group_size=4)
    code, _, err = build_cli(tmp_path / "train-00003.parquet", tmp_path / "p")
    assert code == 0, err
    assert "skipped train-00003.parquet row 3: " in err
    assert "skipped train-00003.parquet row 5: no image (the cell is null)" in err
    code, _, err = build_cli(tmp_path / "train-00003.parquet", tmp_path / "q", "--strict")
    assert code == 1


def test_broken_tar_member_named_by_shard_and_member(folder: Path, tmp_path: Path) -> None:
    write_shards(folder, tmp_path / "shards", maxcount=100)
    shard = tmp_path / "shards" / "train-000000.tar"
    with tarfile.open(shard, "a") as tf:
        info = tarfile.TarInfo("000123.jpg")
        info.size = 10
        tf.addfile(info, io.BytesIO(b"not a jpeg"))
    code, _, err = build_cli(shard, tmp_path / "p")
    assert code == 0, err
    assert "skipped train-000000.tar member 000123.jpg: " in err


def test_a_classlabel_index_outside_its_names_is_skipped(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from source_data import image_features

    schema = image_features(["cat", "dog"]).arrow_schema
    rows = {"image": [{"bytes": _png(), "path": None}] * 3, "label": [0, 7, 1]}
    pq.write_table(pa.table(rows, schema=schema), tmp_path / "t.parquet")
    code, _, err = build_cli(tmp_path / "t.parquet", tmp_path / "p")
    assert code == 0, err
    assert "skipped t.parquet row 1: label 7 is not a class of the 2 named" in err
    m = json.loads((tmp_path / "p" / "imgpack.json").read_text())
    assert m["classes"] == ["cat", "dog"] and m["class_counts"] == [1, 1]


def test_a_source_rewritten_between_builds_of_one_process_is_read_anew(
    folder: Path, tmp_path: Path
) -> None:
    """A worker keeps its open files between chunks; a file changed since (another
    size or mtime) is opened again, never read through the old handle."""
    import datasets as hf

    src = str(tmp_path / "t.parquet")
    ds = hf_dataset(folder)
    ds.to_parquet(src)
    build(src, tmp_path / "a", RAW)
    hf.concatenate_datasets([ds.select(range(12, 16)), ds.select(range(4))]).to_parquet(src)
    build(src, tmp_path / "b", RAW)
    rows_a = (tmp_path / "a" / "_tensordict" / "images.memmap").read_bytes()
    rows_b = (tmp_path / "b" / "_tensordict" / "images.memmap").read_bytes()
    quarter = len(rows_a) // 4
    assert rows_b == rows_a[3 * quarter :] + rows_a[:quarter]


# ---------------------------------------------------------------- resume


@pytest.mark.parametrize("kind", ["parquet", "tar", "zip"])
def test_killed_source_build_resumes_byte_identical(
    folder: Path, tmp_path: Path, kind: str
) -> None:
    if kind == "parquet":
        hf_dataset(folder).to_parquet(str(tmp_path / "t.parquet"), batch_size=3)
        src = str(tmp_path / "t.parquet")
    elif kind == "tar":
        write_shards(folder, tmp_path / "shards", maxcount=5)
        src = str(tmp_path / "shards" / "train-{000000..000003}.tar")
    else:
        src = str(write_zip(folder, tmp_path / "imgs.zip"))
    ref = tmp_path / "ref"
    build(src, ref, BuildConfig(size=(24, 24), workers=1))
    dst = tmp_path / "out" / "pack"
    dst.parent.mkdir()
    (tmp_path / "kill.py").write_text(KILL_SCRIPT)
    with open(tmp_path / "log.txt", "w") as log:
        p = subprocess.run(
            [sys.executable, str(tmp_path / "kill.py"), src, str(dst), "5", "2"],
            stdout=log, stderr=log, timeout=120, env=subprocess_env(),
        )  # fmt: skip
    assert p.returncode == -9, (tmp_path / "log.txt").read_text()
    assert not dst.exists()
    journal = (work_dir_for(dst) / "journal.jsonl").read_text().splitlines()
    assert 5 <= len(journal) <= 16  # chunks that arrived together: journaled, then reported
    r = build(src, dst, BuildConfig(size=(24, 24), workers=1))
    assert r.resumed == len(journal)  # one image a chunk for 16 images
    assert digests(dst) == digests(ref)


def test_changed_source_starts_over(folder: Path, tmp_path: Path) -> None:
    hf_dataset(folder).to_parquet(str(tmp_path / "t.parquet"))
    from packer.builder.formats.base import source_plan
    from packer.builder.plan import plan_fingerprint

    a = plan_fingerprint(source_plan(str(tmp_path / "t.parquet"), tmp_path / "p", RAW), RAW)
    hf_dataset(folder).select(range(15)).to_parquet(str(tmp_path / "t.parquet"))
    b = plan_fingerprint(source_plan(str(tmp_path / "t.parquet"), tmp_path / "p", RAW), RAW)
    assert a != b


# ---------------------------------------------------------------- hostile inputs


def _png(size: tuple[int, int] = (20, 10)) -> bytes:
    from PIL import Image

    b = io.BytesIO()
    Image.new("RGB", size, (10, 200, 10)).save(b, "PNG")
    return b.getvalue()


def test_huge_parquet_cell_is_never_read(tmp_path: Path) -> None:
    """A cell over --max-image-bytes: its page is larger than the cap, so the row group
    is skipped from its page headers alone; a cell a little over the cap (in a page
    within it) is read and refused by its length."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    good = _png()
    huge = good + os.urandom(3 << 20)  # 3 MiB: a page of its own
    cells = [good, good, huge, good, good, good]
    t = pa.table({"image": pa.array(cells, pa.binary())})
    pq.write_table(t, tmp_path / "t.parquet", row_group_size=3, use_dictionary=False)
    code, _, err = build_cli(tmp_path / "t.parquet", tmp_path / "p", "--max-image-bytes", "1MiB")
    assert code == 0, err
    assert "skipped t.parquet row 0: row group 0 stores its images in a page of" in err
    assert "over the per-image limit of 1,048,576; not read" in err
    m = json.loads((tmp_path / "p" / "imgpack.json").read_text())
    assert m["count"] == 3 and m["sources"][0] == "t.parquet row 3"
    # the bound is the reader's option, not the file's say: 4 MiB lets it through
    code, _, err = build_cli(tmp_path / "t.parquet", tmp_path / "q", "--max-image-bytes", "4MiB")
    assert code == 0 and "skipped" not in err, err
    assert json.loads((tmp_path / "q" / "imgpack.json").read_text())["count"] == 6


def test_parquet_page_walk_matches_pyarrow(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from packer.builder.formats.parquet import _chunk_span, largest_page

    cells = [os.urandom(n) for n in (1000, 2 << 20, 5000)]
    pq.write_table(pa.table({"b": pa.array(cells, pa.binary())}), tmp_path / "t.parquet")
    md = pq.ParquetFile(tmp_path / "t.parquet").metadata
    start, end = _chunk_span(md.row_group(0).column(0))
    data = (tmp_path / "t.parquet").read_bytes()
    big = largest_page(lambda off, n: data[off : off + n], start, end)
    assert 2 << 20 <= big < (2 << 20) + 100_000
    with pytest.raises(ValueError, match="page header"):
        largest_page(lambda off, n: b"\x15" * min(n, 3), start, end)


def test_parquet_footer_past_the_end_is_one_line(tmp_path: Path, folder: Path) -> None:
    hf_dataset(folder).to_parquet(str(tmp_path / "t.parquet"))
    data = bytearray((tmp_path / "t.parquet").read_bytes())
    data[-8:-4] = struct.pack("<I", 0x7FFFFFF0)  # the footer's length: past the start
    (tmp_path / "t.parquet").write_bytes(bytes(data))
    code, _, err = cli_build(tmp_path / "t.parquet", tmp_path / "p")
    assert code == 2
    assert "t.parquet: not a parquet file pyarrow can read" in one_error(err)


def test_parquet_row_group_past_the_end_is_skipped(tmp_path: Path) -> None:
    """A file cut inside its data, its footer put back: the row groups whose bytes are
    gone are skipped by their footer offsets, never read."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    def noisy(i: int) -> bytes:  # 8 kB of PNG: a row group is far larger than the footer
        b = io.BytesIO()
        Image.frombytes("RGB", (48, 48), os.urandom(48 * 48 * 3)).save(b, "PNG")
        return b.getvalue()

    t = pa.table({"image": pa.array([noisy(i) for i in range(6)], pa.binary())})
    pq.write_table(t, tmp_path / "t.parquet", row_group_size=2)
    data = (tmp_path / "t.parquet").read_bytes()
    (footer_len,) = struct.unpack("<I", data[-8:-4])
    footer = data[-8 - footer_len :]
    md = pq.ParquetFile(tmp_path / "t.parquet").metadata
    cut = md.row_group(1).column(0).data_page_offset + 10
    (tmp_path / "t.parquet").write_bytes(data[:cut] + footer)
    code, _, err = build_cli(tmp_path / "t.parquet", tmp_path / "p")
    assert code == 0, err
    # row group 1 now ends inside the footer: read, and refused by pyarrow's own checks
    assert "skipped t.parquet row 2: row group 1 cannot be read (" in err
    assert "skipped t.parquet row 4: row group 2: its column 'image' lies past the end" in err
    assert "rows 4 to 5 skipped" in err
    assert json.loads((tmp_path / "p" / "imgpack.json").read_text())["count"] == 2


def _tar_with(tmp_path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    path = tmp_path / "shard-000000.tar"
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tf:
        for info, data in members:
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _member(
    name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, target: str = ""
) -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    return info, data if kind == tarfile.REGTYPE else None


def test_tar_traversal_and_link_members_are_skipped(tmp_path: Path) -> None:
    png = _png()
    shard = _tar_with(
        tmp_path,
        [
            _member("000000.png", png),
            _member("../x.jpg", png),
            _member("/etc/y.jpg", png),
            _member("000002.jpg", kind=tarfile.SYMTYPE, target="/etc/passwd"),
            _member("000003.jpg", kind=tarfile.LNKTYPE, target="000000.png"),
            _member("000004.png", png),
            _member("000000.png", _png((30, 20))),  # its name again, another sample
        ],
    )
    code, _, err = build_cli(shard, tmp_path / "p")
    assert code == 0, err
    assert (
        "skipped shard-000000.tar member ../x.jpg: a member name leading outside the shard (path traversal '..'); not read"
        in err
    )
    assert "member /etc/y.jpg: a member name leading outside the shard (absolute path)" in err
    assert "member 000002.jpg: a link member, not an image; not read" in err
    assert "member 000003.jpg: a link member" in err
    assert "member 000000.png: a second member of the same name in this shard" in err
    m = json.loads((tmp_path / "p" / "imgpack.json").read_text())
    assert m["sources"] == [
        "shard-000000.tar member 000000.png",
        "shard-000000.tar member 000004.png",
    ]
    assert not (tmp_path / "x.jpg").exists() and not (tmp_path.parent / "x.jpg").exists()


@pytest.mark.parametrize("where", ["data", "header"])
def test_truncated_shard_keeps_what_came_before(tmp_path: Path, where: str) -> None:
    pngs = [_png((20 + i, 10)) for i in range(4)]
    shard = _tar_with(tmp_path, [_member(f"{i:06d}.png", p) for i, p in enumerate(pngs)])
    data = shard.read_bytes()
    with tarfile.open(shard) as tf:
        last = tf.getmembers()[-1]
    cut = last.offset_data + 50 if where == "data" else last.offset + 100
    shard.write_bytes(data[:cut])
    code, _, err = build_cli(shard, tmp_path / "p")
    assert code == 0, err
    if where == "data":
        assert (
            "skipped shard-000000.tar member 000003.png: cut short: the shard ends at byte" in err
        )
    else:
        assert "skipped shard-000000.tar: unreadable after member 000002.png" in err
    assert json.loads((tmp_path / "p" / "imgpack.json").read_text())["count"] == 3


def test_not_a_tar_is_skipped_and_no_images_is_exit_2(tmp_path: Path) -> None:
    (tmp_path / "a.tar").write_bytes(os.urandom(3000))
    code, _, err = cli_build(tmp_path / "a.tar", tmp_path / "p")
    assert code == 2
    assert "no images found" in one_error(err) and "not a tar file" in err


def _zip_bomb(path: Path, declared: int) -> Path:
    """A zip whose one member inflates to 20 MB of zeros but declares ``declared``."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("a/ok.png", _png())
        z.writestr("a/bomb.png", b"\0" * (20 << 20))
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("a/bomb.png")
    data[info.header_offset + 22 : info.header_offset + 26] = struct.pack("<I", declared)
    cd = data.rfind(b"PK\x01\x02")  # the last central directory entry: the bomb's
    data[cd + 24 : cd + 28] = struct.pack("<I", declared)
    path.write_bytes(bytes(data))
    return path


def test_zip_bomb_is_bounded_by_declared_and_actual_size(tmp_path: Path) -> None:
    bomb = _zip_bomb(tmp_path / "lies.zip", 1000)  # declares 1000 bytes, inflates to 20 MB
    code, _, err = build_cli(bomb, tmp_path / "p")
    assert code == 0, err
    assert "skipped a/bomb.png: cannot be read from the archive (Bad CRC-32" in err
    honest = tmp_path / "big.zip"
    with zipfile.ZipFile(honest, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("ok.png", _png())
        z.writestr("bomb.png", b"\0" * (20 << 20))
    code, _, err = build_cli(honest, tmp_path / "q", "--max-image-bytes", "1MiB")
    assert code == 0, err
    assert "skipped bomb.png: 20,971,520 bytes, over the per-image limit of 1,048,576" in err


def test_zip_symlink_and_traversal_members_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "z.zip"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("ok.png", _png())
        z.writestr("../evil.png", _png())
        link = zipfile.ZipInfo("link.png")
        link.external_attr = 0o120777 << 16
        z.writestr(link, "/etc/passwd")
    code, _, err = build_cli(path, tmp_path / "p")
    assert code == 0, err
    assert (
        "skipped ../evil.png: a member name leading outside the archive (path traversal '..'); not read"
        in err
    )
    assert "skipped link.png: a symbolic link member; not read" in err
    assert json.loads((tmp_path / "p" / "imgpack.json").read_text())["sources"] == ["ok.png"]


def test_not_a_zip_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "a.zip").write_bytes(b"PK\x05\x06" + os.urandom(100))
    code, _, err = cli_build(tmp_path / "a.zip", tmp_path / "p")
    assert code == 2 and "a.zip: not a zip archive zipfile can read" in one_error(err)


# ---------------------------------------------------------------- what SRC is


def test_brace_ranges() -> None:
    assert expand_braces("s-{08..11}.tar") == ["s-08.tar", "s-09.tar", "s-10.tar", "s-11.tar"]
    assert expand_braces("{1..2}-{0..1}") == ["1-0", "1-1", "2-0", "2-1"]
    with pytest.raises(UsageError, match="runs backwards"):
        expand_braces("s-{3..1}.tar")


def test_sources_refuse_what_they_do_not_take(folder: Path, tmp_path: Path) -> None:
    src = str(write_zip(folder, tmp_path / "imgs.zip"))
    with pytest.raises(
        UsageError,
        match=r"BuildConfig\.shard_size, BuildConfig\.append and BuildConfig\.engine ray take",
    ):
        build(src, tmp_path / "p", BuildConfig(size=(8, 8), shard_size=1 << 20))
    with pytest.raises(UsageError, match=r"SourceOptions\.label_column"):
        hf_dataset(folder).to_parquet(str(tmp_path / "t.parquet"))
        build(str(tmp_path / "t.parquet"), tmp_path / "p", BuildConfig(labels=tmp_path / "x.csv"))
    with pytest.raises(InputError, match="contains the source"):
        build(src, tmp_path, BuildConfig(size=(8, 8), overwrite=True))
    with pytest.raises(UsageError, match="max_image_bytes"):
        build(src, tmp_path / "q", BuildConfig(sources=SourceOptions(max_image_bytes=0)))
    with pytest.raises(InputError, match="no file matches"):
        build(str(tmp_path / "nothing-*.parquet"), tmp_path / "q", RAW)


def test_tar_member_name_not_utf8_is_skipped_and_printable(tmp_path: Path) -> None:
    png = _png()
    shard = tmp_path / "shard-000000.tar"
    with tarfile.open(shard, "w", format=tarfile.GNU_FORMAT) as tf:
        for name in ("000000.png", "00\udcff01.png"):  # a raw 0xff byte in the name
            info = tarfile.TarInfo(name)
            info.size = len(png)
            tf.addfile(info, io.BytesIO(png))
    code, out, err = build_cli(shard, tmp_path / "p", "--json")
    assert code == 0, err
    skipped = json.loads(out)["skipped"]
    assert skipped == [
        {
            "path": "shard-000000.tar member 00\\xff01.png",
            "reason": "a member name that is not valid UTF-8; not read",
        }
    ]


def test_truncated_arrow_file_keeps_the_rows_before(folder: Path, tmp_path: Path) -> None:
    import datasets
    from source_data import image_features

    rows = in_order(folder)
    ds = datasets.Dataset.from_dict(
        {"image": [{"bytes": b, "path": r} for r, b, _, _ in rows], "label": [x[2] for x in rows]},
        features=image_features(["cat", "dog"]),
    )
    ds.save_to_disk(str(tmp_path / "saved"), num_shards=2)
    second = tmp_path / "saved" / "data-00001-of-00002.arrow"
    data = second.read_bytes()
    second.write_bytes(data[: int(len(data) * 0.75)])
    code, _, err = build_cli(tmp_path / "saved", tmp_path / "p")
    assert code == 0, err
    assert "skipped data-00001-of-00002.arrow row 0: unreadable from here on (" in err
    assert json.loads((tmp_path / "p" / "imgpack.json").read_text())["count"] == 8


def test_a_dataset_dict_names_its_splits(folder: Path, tmp_path: Path) -> None:
    import datasets

    ds = hf_dataset(folder)
    datasets.DatasetDict({"train": ds, "test": ds.select(range(4))}).save_to_disk(
        str(tmp_path / "dd")
    )
    code, _, err = cli_build(tmp_path / "dd", tmp_path / "p")
    assert code == 2
    assert "a datasets DatasetDict (splits: test, train); give one split's folder" in one_error(err)
    code, _, err = cli_build(tmp_path / "dd" / "test", tmp_path / "p")
    assert code == 0, err


def test_a_huge_pax_header_is_refused_unread(tmp_path: Path) -> None:
    """tarfile reads an extended header whole; one claiming 5 MB (it could claim GBs)
    ends the shard's listing before it is read."""
    png = _png()
    shard = tmp_path / "shard-000000.tar"
    with tarfile.open(shard, "w", format=tarfile.PAX_FORMAT) as tf:
        for i, pax in enumerate(({}, {"comment": "x" * (5 << 20)})):
            info = tarfile.TarInfo(f"{i:06d}.png")
            info.size = len(png)
            info.pax_headers = pax
            tf.addfile(info, io.BytesIO(png))
    code, _, err = build_cli(shard, tmp_path / "p")
    assert code == 0, err
    assert "skipped shard-000000.tar: unreadable after member 000000.png (a member header of" in err
    assert "over 1,048,576); the rest of the shard is skipped" in err
    assert json.loads((tmp_path / "p" / "imgpack.json").read_text())["count"] == 1
