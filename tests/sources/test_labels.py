"""Class maps, label tables and label dtypes (issue 15), on tables written into tmp_path."""

from __future__ import annotations

import builtins
import json
import os
import re
import threading
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import write_image
from packer.errors import InputError, PackFormatError, UsageError
from packer.pack.parse import check_label_arrays, check_label_fields, label_fields
from packer.sources.classes import apply_class_map, resolve_classes
from packer.sources.labels import apply_table, list_source_images
from packer.sources.scan import scan_tree
from packer.sources.tables import LabelTable, read_table
from packer.storage.open import read_class_map


def write(path: Path, text: str, encoding: str = "utf-8") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding=encoding, newline="")
    return path


def fake_pack(root: Path, classes: object, fmt: str = "imgpack") -> Path:
    """A folder whose imgpack.json is a valid empty pack's manifest, with ``classes``
    and ``format`` put in as given (read_class_map reads the manifest alone)."""
    from packer.pack.schema import Checksums, Manifest

    root.mkdir(parents=True)
    m = Manifest(
        count=0,
        image_shape=(3, 2, 2),
        resize="crop",
        classes=(),
        sources=(),
        source_sizes=(),
        checksums=Checksums(block_rows=1),
    ).to_json()
    m.update(format=fmt, classes=classes)
    (root / "imgpack.json").write_text(json.dumps(m))
    return root


# ---------------------------------------------------------------- class maps


def test_class_map_from_file_strips_and_skips_blank_lines(tmp_path: Path) -> None:
    f = write(tmp_path / "classes.txt", "\ufeffzebra\n\n  cat \r\ndog\n\n")
    assert read_class_map(f) == ["zebra", "cat", "dog"]


def test_class_map_file_refuses_a_duplicate_with_both_lines(tmp_path: Path) -> None:
    f = write(tmp_path / "classes.txt", "cat\ndog\n\ncat\n")
    with pytest.raises(InputError, match=r"classes.txt: class 'cat' on line 4 repeats line 1"):
        read_class_map(f)


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("\n  \n", "no class names"),
        (b"cat\n\xff\xfe\n", "not UTF-8"),
    ],
)
def test_class_map_file_refuses_bad_content(tmp_path: Path, content: object, match: str) -> None:
    f = tmp_path / "classes.txt"
    if isinstance(content, bytes):
        f.write_bytes(content)
    else:
        write(f, str(content))
    with pytest.raises(InputError, match=match):
        read_class_map(f)


def test_class_map_missing_or_plain_folder(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"nope.txt: no such class map"):
        read_class_map(tmp_path / "nope.txt")
    (tmp_path / "folder").mkdir()
    with pytest.raises(InputError, match=r"folder: a folder but not an imgpack pack"):
        read_class_map(tmp_path / "folder")


def test_class_map_from_fake_pack(tmp_path: Path) -> None:
    p = fake_pack(tmp_path / "p", ["b", "a", "c"])
    assert read_class_map(p) == ["b", "a", "c"]


def test_class_map_from_real_pack(packed: Path) -> None:
    assert read_class_map(packed) == ["cat", "dog", "zebra"]


def test_class_map_from_a_pack_manifest_file(tmp_path: Path) -> None:
    p = fake_pack(tmp_path / "p", ["b", "a"])
    assert read_class_map(p / "imgpack.json") == ["b", "a"]
    other = write(tmp_path / "classes.json", '["b", "a"]')
    with pytest.raises(InputError, match=r"classes.json: a JSON file; give a text file"):
        read_class_map(other)


@pytest.mark.parametrize(
    ("classes", "fmt", "match"),
    [
        ("cat", "imgpack", "field 'classes' is missing or not a list"),
        (["cat", 3], "imgpack", "class names must be strings"),
        (["cat"], "other", "not an imgpack manifest"),
        ([], "imgpack", "the pack has no classes"),
        (["cat", "cat"], "imgpack", "class names must be distinct"),
    ],
)
def test_class_map_from_bad_pack(tmp_path: Path, classes: object, fmt: str, match: str) -> None:
    p = fake_pack(tmp_path / "p", classes, fmt)
    with pytest.raises(InputError, match=match):
        read_class_map(p)


def test_class_map_pack_with_broken_json(tmp_path: Path) -> None:
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "imgpack.json").write_text("{not json")
    with pytest.raises(InputError, match=r"imgpack.json is not valid JSON"):
        read_class_map(tmp_path / "p")


def test_resolve_without_map_is_imagefolder_order(image_tree: Path) -> None:
    from torchvision.datasets import ImageFolder

    (image_tree / "zebra" / "k.tiff").unlink()  # ImageFolder's extension list lacks .tif
    (image_tree / "zebra" / "j.gif").unlink()
    ref = ImageFolder(str(image_tree))
    scan = scan_tree(image_tree)
    classes, new = resolve_classes(reversed(scan.classes), None)
    assert (classes, new) == (ref.classes, [])
    relabeled = apply_class_map(scan, classes)
    ours = {e.rel: e.label for e in relabeled.entries}
    theirs = {Path(p).relative_to(image_tree).as_posix(): y for p, y in ref.samples}
    assert {k: ours[k] for k in theirs} == theirs


def test_resolve_keeps_map_order_and_empty_classes() -> None:
    assert resolve_classes(["cat"], ["zebra", "cat", "dog"]) == (["zebra", "cat", "dog"], [])


def test_resolve_new_class_is_an_error_naming_it() -> None:
    with pytest.raises(
        InputError,
        match=r"classes 'emu', 'yak' not in the class map train_pack; pass BuildConfig.allow_new_classes",
    ):
        resolve_classes(["yak", "cat", "emu"], ["cat", "dog"], map_source="train_pack")


def test_resolve_allow_new_appends_sorted() -> None:
    classes, new = resolve_classes(["yak", "cat", "emu"], ["dog", "cat"], allow_new=True)
    assert classes == ["dog", "cat", "emu", "yak"]
    assert new == ["emu", "yak"]


def test_val_missing_a_class_keeps_train_indices(image_tree: Path, tmp_path: Path) -> None:
    train = scan_tree(image_tree)
    val_root = tmp_path / "val"
    write_image(val_root / "cat" / "v1.jpg", seed=50)
    write_image(val_root / "zebra" / "v2.jpg", seed=51)
    val = scan_tree(val_root)
    # Without a map, val's zebra is class 1 while train's zebra is 2: the bug of issue 15.
    assert [e.label for e in val.entries] == [0, 1]
    classes, new = resolve_classes(val.classes, read_class_map(_class_file(tmp_path, train)))
    fixed = apply_class_map(val, classes)
    assert fixed.classes == train.classes == ["cat", "dog", "zebra"]
    assert new == []
    assert {e.rel: e.label for e in fixed.entries} == {"cat/v1.jpg": 0, "zebra/v2.jpg": 2}


def _class_file(tmp_path: Path, scan: object) -> Path:
    return write(tmp_path / "train_classes.txt", "\n".join(scan.classes) + "\n")  # type: ignore[attr-defined]


def test_apply_class_map_refuses_a_map_without_a_found_class(image_tree: Path) -> None:
    with pytest.raises(InputError, match=r"\['zebra'\] are not in the class map"):
        apply_class_map(scan_tree(image_tree), ["cat", "dog"])


def test_flat_folder_labels_stay_unlabeled(tmp_path: Path) -> None:
    write_image(tmp_path / "flat" / "a.jpg")
    scan = scan_tree(tmp_path / "flat")
    assert [e.label for e in apply_class_map(scan, ["x"]).entries] == [-1]


# ---------------------------------------------------------------- good tables


def test_csv_with_class_names(tmp_path: Path) -> None:
    t = read_table(write(tmp_path / "l.csv", "path,label\n./b/x.jpg,dog\na.jpg,cat\nc.png,dog\n"))
    assert t.paths == ["b/x.jpg", "a.jpg", "c.png"]
    assert t.classes == ["cat", "dog"]
    assert t.labels.dtype == np.int64
    assert t.labels.tolist() == [1, 0, 1]
    assert t.targets is None
    assert t.target_names == []
    assert t.lookup("./a.jpg") == 1
    assert t.lookup("b//x.jpg") == 0
    assert t.lookup("zzz.jpg") is None
    assert t.row_number(1) == 3


def test_csv_with_class_names_through_a_map(tmp_path: Path) -> None:
    f = write(tmp_path / "l.csv", "path,label\na.jpg,cat\nb.jpg,zebra\n")
    t = read_table(f, classes=["zebra", "dog", "cat"])
    assert t.classes == ["zebra", "dog", "cat"]
    assert t.labels.tolist() == [2, 0]


def test_csv_label_not_in_map_then_allow_new(tmp_path: Path) -> None:
    f = write(tmp_path / "l.csv", "path,label\na.jpg,cat\nb.jpg,emu\nc.jpg,yak\n")
    with pytest.raises(
        InputError,
        match=r"l.csv row 3 \(header = row 1\): label 'emu' is not a class of the class map "
        r"\(nor are 1 other name\(s\)\); pass BuildConfig.allow_new_classes",
    ):
        read_table(f, classes=["dog", "cat"])
    t = read_table(f, classes=["dog", "cat"], allow_new_classes=True)
    assert t.classes == ["dog", "cat", "emu", "yak"]
    assert t.new_classes == ["emu", "yak"]
    assert t.labels.tolist() == [1, 2, 3]


def test_csv_with_integer_labels(tmp_path: Path) -> None:
    f = write(tmp_path / "l.csv", "label,path\n3,a.jpg\n0,b.jpg\n-1,c.jpg\n+2,d.jpg\n")
    t = read_table(f)
    assert t.classes == []
    assert t.labels.tolist() == [3, 0, -1, 2]
    t = read_table(f, classes=["a", "b", "c", "d"])
    assert t.classes == ["a", "b", "c", "d"]
    assert t.labels.tolist() == [3, 0, -1, 2]


def test_digit_class_names_are_names_when_the_map_has_them(tmp_path: Path) -> None:
    f = write(tmp_path / "l.csv", "path,label\na.jpg,10\nb.jpg,2\n")
    assert read_table(f, classes=["1", "10", "2"]).labels.tolist() == [1, 2]
    assert read_table(f).labels.tolist() == [10, 2]


def test_csv_with_targets_exact_float32(tmp_path: Path) -> None:
    f = write(
        tmp_path / "l.csv",
        "path,label,w,h,extra\na.jpg,cat,0.1,1e-3,x\nb.jpg,dog,-2.5, 3 ,y\nc.jpg,cat,0.2,0.3,z\n",
    )
    t = read_table(f, targets=["h", "w"])
    assert t.target_names == ["h", "w"]
    assert t.targets is not None
    assert t.targets.dtype == np.float32
    assert t.targets.shape == (3, 2)
    want = np.array([[1e-3, 0.1], [3.0, -2.5], [0.3, 0.2]], dtype=np.float32)
    assert np.array_equal(t.targets, want)
    # 0.1, 0.2 and 0.3 stay distinct: nothing went through an integer
    assert len(set(t.targets[:, 1].tolist())) == 3
    assert not t.targets.flags.writeable


def test_regression_table_without_label_column(tmp_path: Path) -> None:
    f = write(tmp_path / "l.csv", "path,score\na.jpg,0.5\nb.jpg,1.5\n")
    t = read_table(f, targets=["score"])
    assert t.labels.tolist() == [-1, -1]
    assert t.classes == []
    assert t.targets is not None and t.targets[:, 0].tolist() == [0.5, 1.5]


def test_tsv_with_bom_blank_rows_and_quoted_paths(tmp_path: Path) -> None:
    f = write(tmp_path / "l.tsv", '\ufeffpath\tlabel\n\n"a, b.jpg"\tcat\nc.jpg\tdog\n')
    t = read_table(f)
    assert t.paths == ["a, b.jpg", "c.jpg"]
    assert t.labels.tolist() == [0, 1]


def test_row_numbers_count_blank_lines_like_a_spreadsheet(tmp_path: Path) -> None:
    f = write(tmp_path / "l.csv", "path,label\na.jpg,cat\n\nb.jpg,\n")
    with pytest.raises(InputError, match=r"l.csv row 4 \(header = row 1\): empty label"):
        read_table(f)


def test_blank_rows_before_the_header_shift_the_count(tmp_path: Path) -> None:
    f = write(tmp_path / "l.csv", "\n\npath,label\na.jpg,cat\n\nb.jpg,-3\n")
    with pytest.raises(
        InputError,
        match=r"l.csv: labels mix class names \(row 4: 'cat'\) and integers \(row 6: '-3'\) \(header = row 3\)",
    ):
        read_table(f)
    t = read_table(write(tmp_path / "m.csv", "\npath,label\na.jpg,cat\n\n\nb.jpg,dog\n"))
    assert [t.row_number(0), t.row_number(1)] == [3, 6]
    m = apply_table(t, [])
    assert m.missing[1] == ("b.jpg", f"listed in {t.source} row 6 but not found under SRC")


def test_parquet_round_trip(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    f = tmp_path / "l.parquet"
    pq.write_table(
        pa.table({"path": ["a.jpg", "b.jpg"], "label": [1, 0], "w": [0.1, 2.0]}),
        f,
    )
    t = read_table(f, targets=["w"])
    assert t.labels.tolist() == [1, 0]
    assert t.targets is not None
    assert np.array_equal(t.targets, np.array([[0.1], [2.0]], dtype=np.float32))


class _FakeColumn:
    def __init__(self, values: list) -> None:
        self.values = values

    def to_pylist(self) -> list:
        return list(self.values)


def _fake_pyarrow(monkeypatch: pytest.MonkeyPatch, data: dict[str, list], path: Path) -> None:
    """A stand-in for pyarrow.parquet exposing the calls labels.py makes (read_table,
    Table.column_names, Table.column(i).to_pylist()), with typed cells as pyarrow
    returns them; used because pyarrow is not installed here."""
    import sys
    import types

    class Table:
        @property
        def column_names(self) -> list[str]:
            return list(data)

        def column(self, i: int) -> _FakeColumn:
            return _FakeColumn(data[self.column_names[i]])

    pq = types.ModuleType("pyarrow.parquet")
    pq.read_table = lambda path: Table()  # type: ignore[attr-defined]
    pa = types.ModuleType("pyarrow")
    pa.parquet = pq  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pyarrow", pa)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", pq)
    path.write_bytes(b"PAR1")


def test_parquet_typed_cells(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_pyarrow(
        monkeypatch,
        {"path": ["a.jpg", "b.jpg"], "label": [np.int64(1), 0], "w": [0.1, 2]},
        tmp_path / "l.parquet",
    )
    t = read_table(tmp_path / "l.parquet", targets=["w"])
    assert t.labels.tolist() == [1, 0]
    assert t.targets is not None
    assert np.array_equal(t.targets, np.array([[0.1], [2.0]], dtype=np.float32))


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"path": ["a.jpg", "b.jpg"], "label": [1, 1.0]}, r"row 3 .*label 1.0 is of type float"),
        ({"path": ["a.jpg", "b.jpg"], "label": [1, True]}, r"row 3 .*label True is of type bool"),
        ({"path": ["a.jpg", None], "label": [1, 2]}, r"row 3 .*empty path"),
        ({"path": ["a.jpg", 7], "label": [1, 2]}, r"row 3 .*path 7 is of type int; paths are text"),
        ({"path": ["a.jpg"], "label": [1], "w": [None]}, r"row 2 .*target 'w' is empty"),
        ({"path": ["a.jpg"], "label": [1], "w": [False]}, r"row 2 .*target 'w' is False"),
    ],
)
def test_parquet_bad_typed_cells(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: dict, match: str
) -> None:
    _fake_pyarrow(monkeypatch, data, tmp_path / "l.parquet")
    targets = ["w"] if "w" in data else None
    with pytest.raises(InputError, match=r"l.parquet " + match):
        read_table(tmp_path / "l.parquet", targets=targets)


def test_parquet_without_pyarrow_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_import = builtins.__import__

    def no_pyarrow(name: str, *args: object, **kwargs: object) -> object:
        if name == "pyarrow" or name.startswith("pyarrow."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    f = tmp_path / "l.parquet"
    f.write_bytes(b"PAR1")
    with pytest.raises(
        InputError,
        match=r"l.parquet: reading .parquet tables needs pyarrow \(pip install pyarrow\)",
    ):
        read_table(f)


# ---------------------------------------------------------------- bad tables

BAD_TABLES = [
    ("path,lbl\na.jpg,cat\n", {}, r"missing column\(s\) 'label'; it has 'path', 'lbl'"),
    ("id,label\na,cat\n", {}, r"missing column\(s\) 'path'; it has 'id', 'label'"),
    ("path,label\na.jpg,cat\n", {"targets": ["w"]}, r"missing column\(s\) 'w'"),
    ("", {}, r"empty; a label table needs a header row"),
    ("path,label\n", {}, r"no data rows"),
    ("path,label,path\na,b,c\n", {}, r"column\(s\) 'path' appear twice"),
    ("path,label\na.jpg,cat\nb.jpg,cat\n./a.jpg,dog\n", {}, r"rows 2 and 4 .* both list 'a.jpg'"),
    (
        "path,label\n/etc/passwd,cat\n",
        {},
        r"row 2 \(header = row 1\): path '/etc/passwd' is absolute",
    ),
    ("path,label\nC:/x.jpg,cat\n", {}, r"row 2 .*'C:/x.jpg' is absolute"),
    ("path,label\na.jpg,cat\ncat/../../x.jpg,cat\n", {}, r"row 3 .*contains '\.\.'"),
    ("path,label\ncat\\a.jpg,cat\n", {}, r"row 2 .*has a backslash"),
    ("path,label\n  ,cat\n", {}, r"row 2 .*empty path"),
    ("path,label\n.,cat\n", {}, r"row 2 .*names no file"),
    (
        "path,label\na.jpg,cat\nb.jpg,2\n",
        {},
        r"labels mix class names \(row 2: 'cat'\) and integers \(row 3: '2'\)",
    ),
    ("path,label\na.jpg,0\nb.jpg,-2\n", {}, r"row 3 .*label -2 is negative"),
    ("path,label\na.jpg,0\nb.jpg,3\n", {"classes": ["x", "y"]}, r"row 3 .*label 3 is out of range"),
    (
        "path,label\na.jpg,0.1\nb.jpg,0.2\n",
        {},
        r"row 2 .*label '0.1' is a number but not an integer",
    ),
    ("path,label\na.jpg,cat\nb.jpg,dog\n", {"classes": ["cat"]}, r"row 3 .*'dog' is not a class"),
    (
        "path,label,w\na.jpg,cat,1\nb.jpg,cat,abc\n",
        {"targets": ["w"]},
        r"row 3 .*'w' is 'abc', not a number",
    ),
    ("path,label,w\na.jpg,cat,\n", {"targets": ["w"]}, r"row 2 .*target 'w' is empty"),
    (
        "path,label,w\na.jpg,cat,nan\n",
        {"targets": ["w"]},
        r"row 2 .*'w' is nan; targets must be finite",
    ),
    ("path,label,w\na.jpg,cat,-inf\n", {"targets": ["w"]}, r"row 2 .*'w' is -inf"),
    ("path,label,w\na.jpg,cat,1e39\n", {"targets": ["w"]}, r"row 2 .*beyond float32's range"),
    ("path,label\na.jpg,cat\nb.jpg\n", {}, r"row 3 .*1 field\(s\), the header has 2"),
    ('path,label\n"a.jpg,cat\n', {}, r"row 2 .*cannot parse"),
]


@pytest.mark.parametrize(("text", "kwargs", "match"), BAD_TABLES)
def test_bad_table(tmp_path: Path, text: str, kwargs: dict, match: str) -> None:
    f = write(tmp_path / "bad.csv", text)
    with pytest.raises(InputError, match=r"bad.csv.*" + match):
        read_table(f, **kwargs)


def test_table_file_problems(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"l.xlsx: unknown label table type '.xlsx'"):
        read_table(tmp_path / "l.xlsx")
    with pytest.raises(InputError, match=r"none.csv: no such label table"):
        read_table(tmp_path / "none.csv")
    (tmp_path / "d.csv").mkdir()
    with pytest.raises(InputError, match=r"d.csv: not a regular file"):
        read_table(tmp_path / "d.csv")
    (tmp_path / "latin1.csv").write_bytes("path,label\nä.jpg,cät\n".encode("latin-1"))
    with pytest.raises(InputError, match=r"latin1.csv: not UTF-8"):
        read_table(tmp_path / "latin1.csv")


@pytest.mark.parametrize(
    ("targets", "match"),
    [
        (["label"], "'label' is not a target column"),
        (["w", "w"], "'w' named twice"),
        ([""], "empty"),
    ],
)
def test_bad_target_option(tmp_path: Path, targets: list[str], match: str) -> None:
    f = write(tmp_path / "l.csv", "path,label,w\na.jpg,cat,1\n")
    with pytest.raises(UsageError, match=match):
        read_table(f, targets=targets)


# ---------------------------------------------------------------- matching


def test_apply_table_keeps_found_order_and_reports(image_tree: Path, tmp_path: Path) -> None:
    (image_tree / "top.jpg").write_bytes((image_tree / "cat" / "a.jpg").read_bytes())
    f = write(
        tmp_path / "l.csv",
        "path,label,w\n"
        "zebra/i.jpg,wild,3\n"
        "cat/a.jpg,pet,1\n"
        "gone.jpg,pet,9\n"
        "top.jpg,wild,4\n"
        "CAT/b.JPG,pet,5\n"
        "cat/notes.txt,pet,6\n"
        "dog/nested/f.png,pet,2\n",
    )
    t = read_table(f, targets=["w"])
    found = list_source_images(image_tree)
    # files of a folder come before its subfolders' (os.walk order, then sorted by folder)
    assert found == ["top.jpg"] + [e.rel for e in scan_tree(image_tree).entries]
    m = apply_table(t, found, src=image_tree)
    assert [e.rel for e in m.entries] == [r for r in found if t.lookup(r) is not None]
    assert [(e.rel, e.label) for e in m.entries] == [
        ("top.jpg", 1),
        ("cat/a.jpg", 0),
        ("dog/nested/f.png", 0),
        ("zebra/i.jpg", 1),
    ]
    assert m.rows.tolist() == [3, 1, 6, 0]
    assert m.targets is not None and m.targets[:, 0].tolist() == [4.0, 1.0, 2.0, 3.0]
    assert m.ignored == len(found) - 4
    reasons = dict(m.missing)
    assert list(reasons) == ["gone.jpg", "CAT/b.JPG", "cat/notes.txt"]
    assert reasons["gone.jpg"] == f"listed in {f} row 4 but not found under SRC"
    assert "there is 'cat/b.JPG', which differs in case" in reasons["CAT/b.JPG"]
    assert "row 7 but not an image imgpack reads" in reasons["cat/notes.txt"]


def test_apply_table_matches_decomposed_unicode(tmp_path: Path) -> None:
    f = write(tmp_path / "l.csv", "path,label\ncafé/x.jpg,cat\n")
    t = read_table(f)
    nfd = unicodedata.normalize("NFD", "café/x.jpg")
    m = apply_table(t, [nfd])
    assert [(e.rel, e.label) for e in m.entries] == [(nfd, 0)]
    assert m.missing == [] and m.ignored == 0


def test_list_source_images_refuses_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"nope: no such folder"):
        list_source_images(tmp_path / "nope")


def test_label_table_is_immutable(tmp_path: Path) -> None:
    t = read_table(write(tmp_path / "l.csv", "path,label\na.jpg,1\n"))
    assert isinstance(t, LabelTable)
    with pytest.raises(ValueError, match="read-only"):
        t.labels[0] = 5


def test_label_table_checks_its_arrays(tmp_path: Path) -> None:
    src = tmp_path / "l.csv"
    with pytest.raises(InputError, match=r"l.csv: labels are float64, expected int64"):
        LabelTable(["a.jpg"], np.zeros(1), [], None, [], src)
    with pytest.raises(ValueError, match=r"2 paths \(1 distinct\), 2 labels"):
        LabelTable(["a.jpg", "a.jpg"], np.zeros(2, np.int64), [], None, [], src)
    with pytest.raises(ValueError, match=r"1 target columns for 2 names"):
        LabelTable(
            ["a.jpg"], np.zeros(1, np.int64), [], np.zeros((1, 1), np.float32), ["w", "h"], src
        )


# ---------------------------------------------------------------- dtypes


def test_check_label_arrays_accepts_numpy_and_torch() -> None:
    assert check_label_arrays(np.zeros(4, np.int64), None) == (4, None)
    assert check_label_arrays(np.zeros(4, np.int64), np.zeros((4, 2), np.float32)) == (4, 2)
    assert check_label_arrays(torch.zeros(3, dtype=torch.int64), torch.zeros(3, 1)) == (3, 1)


@pytest.mark.parametrize(
    ("labels", "targets", "match"),
    [
        (np.zeros(4, np.int32), None, r"labels are int32, expected int64"),
        (
            np.zeros(4, np.float64),
            None,
            r"labels are float64, expected int64.*float values belong in targets",
        ),
        (torch.zeros(4, dtype=torch.int32), None, r"labels are int32, expected int64"),
        (np.zeros((4, 1), np.int64), None, r"labels have shape \[4, 1\], expected \[N\]"),
        (np.zeros(4, np.int64), np.zeros((4, 2), np.float64), r"targets are float64"),
        (np.zeros(4, np.int64), torch.zeros(4, 2, dtype=torch.float16), r"targets are float16"),
        (np.zeros(4, np.int64), np.zeros(4, np.float32), r"targets have shape \[4\]"),
        (
            np.zeros(4, np.int64),
            np.zeros((3, 2), np.float32),
            r"targets have shape \[3, 2\], expected \[4, K\]",
        ),
    ],
)
def test_check_label_arrays_refuses_other_dtypes(
    labels: object, targets: object, match: str
) -> None:
    with pytest.raises(PackFormatError, match="mypack: " + match):
        check_label_arrays(labels, targets, where="mypack")


def test_label_fields_round_trip() -> None:
    labels = np.zeros(5, np.int64)
    targets = np.zeros((5, 2), np.float32)
    fields = label_fields(labels, targets, ["w", "h"])
    assert fields == {
        "label_dtype": "int64",
        "label_shape": [5],
        "targets": {"names": ["w", "h"], "dtype": "float32", "shape": [5, 2]},
    }
    assert check_label_fields(json.loads(json.dumps(fields)), 5, "p") == ["w", "h"]
    assert check_label_fields(label_fields(labels, None, []), 5, "p") is None
    # manifests written before these fields existed: int64 [N], no targets
    assert check_label_fields({}, 5, "p") is None


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"label_dtype": "float32"}, r"labels recorded as 'float32'"),
        ({"label_shape": [4]}, r"label_shape \[4\] does not match 5"),
        ({"targets": {"names": ["w"], "dtype": "float64", "shape": [5, 1]}}, "targets recorded"),
        ({"targets": {"names": ["w"], "dtype": "float32", "shape": [5, 2]}}, "targets recorded"),
        ({"targets": {"names": [1], "dtype": "float32", "shape": [5, 1]}}, "targets recorded"),
        ({"targets": [1]}, "targets recorded"),
    ],
)
def test_check_label_fields_refuses(fields: dict, match: str) -> None:
    with pytest.raises(PackFormatError, match="p: " + match):
        check_label_fields(fields, 5, "p")


def test_label_fields_names_must_match_columns() -> None:
    with pytest.raises(InputError, match="1 target names for 2 target columns"):
        label_fields(np.zeros(2, np.int64), np.zeros((2, 2), np.float32), ["w"])


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8", newline="")
    return path


def _returns_within(fn, seconds: float = 10.0) -> BaseException | None:
    """Run ``fn`` in a daemon thread; the exception it raised, failing if it blocks."""
    out: list[BaseException | None] = []

    def go() -> None:
        try:
            fn()
            out.append(None)
        except BaseException as e:
            out.append(e)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(seconds)
    assert out, "blocked reading a non-regular file"
    return out[0]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifo_class_map_and_table_are_refused_not_read(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "classes")
    os.mkfifo(tmp_path / "t.csv")
    os.symlink(tmp_path / "t.csv", tmp_path / "link.csv")
    for fn, name in (
        (lambda: read_class_map(tmp_path / "classes"), "classes"),
        (lambda: read_table(tmp_path / "t.csv"), "t.csv"),
        (lambda: read_table(tmp_path / "link.csv"), "link.csv"),
    ):
        e = _returns_within(fn)
        assert isinstance(e, InputError) and str(e).endswith(f"{name}: not a regular file"), e


def test_deep_manifest_as_class_map_is_refused(tmp_path: Path) -> None:
    deep = tmp_path / "deep"
    _write(deep / "imgpack.json", '{"format":"imgpack","x":' + "[" * 100000 + "]" * 100000 + "}")
    with pytest.raises(InputError, match="nested too deeply"):
        read_class_map(deep)


def test_unicode_forms_never_label_two_files(tmp_path: Path) -> None:
    nfc, nfd = (
        unicodedata.normalize("NFC", "a/café.jpg"),
        unicodedata.normalize("NFD", "a/café.jpg"),
    )
    t = read_table(_write(tmp_path / "t.csv", f"path,label\n{nfc},red\n"))
    # both files exist (distinct on Linux): the row labels the one it writes exactly
    m = apply_table(t, sorted([nfc, nfd]))
    assert [e.rel for e in m.entries] == [nfc] and m.ignored == 1
    # only the other form on disk: folded, as before
    assert [e.rel for e in apply_table(t, [nfd]).entries] == [nfd]
    t4 = read_table(_write(tmp_path / "t4.csv", "path,label\nd/\u1e69.jpg,red\n"))  # ṩ
    forms = ["d/s\u0323\u0307.jpg", "d/s\u0307\u0323.jpg"]  # both fold to ṩ, neither exact
    with pytest.raises(InputError, match=r"t4.csv row 2: .*matches .* and .* Unicode forms"):
        apply_table(t4, forms)
    # two rows in different forms reaching one file
    t5 = read_table(_write(tmp_path / "t5.csv", f"path,label\n{nfc},red\n{nfd},blue\n"))
    with pytest.raises(InputError, match="rows 2 and 3 both name"):
        apply_table(t5, [nfd])


def test_folder_row_is_called_a_folder(src: Path, tmp_path: Path) -> None:
    (src / "dog" / "dir.jpg").mkdir()
    t = read_table(_write(tmp_path / "t.csv", "path,label\ndog/dir.jpg/,dog\ncat/0.png,cat\n"))
    m = apply_table(t, list_source_images(src), src=src)
    assert dict(m.missing)["dog/dir.jpg"].endswith("is a folder, not an image")


@pytest.mark.parametrize(
    ("table", "match"),
    [
        ('path,label\ncat/0.png,"ca\nt"\n', r"row 2 .*control character '\\n'"),
        ("path,label\ncat/0.png,ca\x1bt\n", r"row 2 .*control character '\\x1b'"),
        ("path,label\ncat/0.png,cat\ncat/1.png,d\u2028g\n", r"row 3 .*control character"),
    ],
)
def test_control_characters_in_table_labels(tmp_path: Path, table: str, match: str) -> None:
    with pytest.raises(InputError, match=match):
        read_table(_write(tmp_path / "t.csv", table))


@pytest.mark.parametrize("text", ["cat\ndo\x07g\n", "cat\nd\x1cog\n", "cat\nd\u2028og\n"])
def test_control_characters_in_class_map(tmp_path: Path, text: str) -> None:
    with pytest.raises(InputError, match=r"classes.txt line 2: .*control character"):
        read_class_map(_write(tmp_path / "classes.txt", text))


@pytest.mark.parametrize(
    "label", ["99999999999999999999", "9223372036854775808", str(2**31), "+2147483648"]
)
def test_integer_labels_are_bounded(tmp_path: Path, label: str) -> None:
    with pytest.raises(InputError, match=rf"t.csv row 3 .*label {re.escape(label)} out of range"):
        read_table(_write(tmp_path / "t.csv", f"path,label\na.jpg,0\nb.jpg,{label}\n"))
    ok = read_table(_write(tmp_path / "ok.csv", f"path,label\na.jpg,-1\nb.jpg,{2**31 - 1}\n"))
    assert ok.labels.tolist() == [-1, 2**31 - 1]


@pytest.mark.parametrize("label", ["inf", "-inf", "nan", "NaN", "Infinity", "+INF"])
def test_nonfinite_labels_are_not_class_names(tmp_path: Path, label: str) -> None:
    with pytest.raises(InputError, match="is a number but not an integer"):
        read_table(_write(tmp_path / "t.csv", f"path,label\na.jpg,cat\nb.jpg,{label}\n"))


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("1_000", "not a number .*plain decimal"),
        ("0x10", "not a number"),
        ("1e-50", "float32 stores as 0"),
        ("-1e-46", "float32 stores as 0"),
        ("nan", "must be finite"),
        ("-Infinity", "must be finite"),
    ],
)
def test_target_number_syntax(tmp_path: Path, value: str, match: str) -> None:
    f = _write(tmp_path / "t.csv", f"path,label,w\na.jpg,cat,1\nb.jpg,cat,{value}\n")
    with pytest.raises(InputError, match=rf"row 3 .*{match}"):
        read_table(f, targets=["w"])


def test_target_plain_forms_still_read(tmp_path: Path) -> None:
    f = _write(
        tmp_path / "t.csv", "path,label,w\na,c,1000\nb,c,-2.5e-3\nc,c,.5\nd,c,0\ne,c,1e-40\n"
    )
    assert read_table(f, targets=["w"]).targets[:, 0].tolist() == pytest.approx(
        [1000, -2.5e-3, 0.5, 0, 1e-40], rel=1e-3
    )
