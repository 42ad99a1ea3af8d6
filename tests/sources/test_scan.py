"""packer.sources.scan: classes and order as ImageFolder's, and which files are read
(regular files only, readable folders, UTF-8 names)."""

from __future__ import annotations

import errno
import faulthandler
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from torchvision.datasets import ImageFolder

import packer
from conftest import write_image
from packer.builder.run import BuildConfig, build
from packer.cli import cli
from packer.compress import CompressConfig, compress
from packer.errors import InputError
from packer.sources.scan import scan_tree


@pytest.fixture
def no_hang():
    """A hang (the old behaviour on a FIFO) ends the test run with tracebacks, not never."""
    faulthandler.dump_traceback_later(60, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def add_special_files(folder: Path) -> None:
    os.mkfifo(folder / "fifo.jpg")
    (folder / "zero.jpg").symlink_to("/dev/zero")
    (folder / "dir.png").mkdir()  # a folder named like an image is walked, not read


@pytest.mark.parametrize("workers", [1, 2])
def test_special_files_named_like_images_are_skipped_not_read(
    image_tree: Path, tmp_path: Path, workers: int, no_hang: None
) -> None:
    add_special_files(image_tree / "cat")
    r = build(image_tree, tmp_path / "p", BuildConfig(size=(8, 8), workers=workers))
    assert r.count == 13
    assert {s["path"]: s["reason"] for s in r.skipped} == {
        "cat/fifo.jpg": "not a regular file (a FIFO); only image files are read",
        "cat/zero.jpg": "not a regular file (a character device); only image files are read",
    }


def test_compress_reads_only_regular_files(image_tree: Path, tmp_path: Path, no_hang: None) -> None:
    add_special_files(image_tree / "cat")
    r = compress(image_tree, tmp_path / "out", CompressConfig(workers=2))
    assert r.written == 13
    assert {f["path"]: f["reason"] for f in r.failed} == {
        "cat/fifo.jpg": "not a regular file (a FIFO); only image files are read",
        "cat/zero.jpg": "not a regular file (a character device); only image files are read",
    }


def test_unreadable_class_folder_is_a_skip_counted_by_strict(
    image_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.scandir
    denied = str(image_tree / "dog")

    def scandir(path: object = ".") -> object:
        if os.fspath(path) == denied:  # as root, chmod cannot make a folder unreadable
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    scan = scan_tree(image_tree)
    assert scan.classes == ["cat", "dog", "zebra"]
    assert scan.skipped == [
        {"path": "dog", "reason": "cannot read this folder (Permission denied)"}
    ]
    res = CliRunner().invoke(
        cli,
        [
            "build",
            str(image_tree),
            str(tmp_path / "p"),
            "--size",
            "8",
            "--workers",
            "1",
            "--strict",
            "--json",
        ],
    )
    assert res.exit_code == 1, res.output
    out = json.loads(res.stdout)
    assert out["count"] == 9 and out["skipped"] == scan.skipped
    skips = packer.load(tmp_path / "p").manifest.skipped
    assert [{"path": k.path, "reason": k.reason} for k in skips] == scan.skipped


def test_names_that_are_not_utf8_are_skipped_with_a_reason(
    image_tree: Path, tmp_path: Path
) -> None:
    root = os.fsencode(image_tree)
    write_image(Path(os.fsdecode(root + b"/cat/bad\xff.jpg")))
    write_image(Path(os.fsdecode(root + b"/dog/\xfe/x.jpg")))
    r = build(image_tree, tmp_path / "p", BuildConfig(size=(8, 8), workers=1))
    assert r.count == 13
    assert r.skipped == [
        {"path": "cat/bad\\xff.jpg", "reason": "file name is not valid UTF-8; rename it"},
        {"path": "dog/\\xfe", "reason": "folder file name is not valid UTF-8; rename it"},
    ]
    c = compress(image_tree, tmp_path / "c", CompressConfig(workers=1))
    assert c.written == 13 and [f["path"] for f in c.failed] == ["cat/bad\\xff.jpg", "dog/\\xfe"]


def test_classes_and_order_match_imagefolder(image_tree: Path) -> None:
    (image_tree / "zebra" / "k.tiff").unlink()  # ImageFolder's extension list lacks .gif/.tif
    (image_tree / "zebra" / "j.gif").unlink()
    scan = scan_tree(image_tree)
    ref = ImageFolder(str(image_tree))
    assert scan.classes == ref.classes
    assert [(str(image_tree / e.rel), e.label) for e in scan.entries] == ref.samples


def test_flat_folder_labels_are_minus_one(tmp_path: Path) -> None:
    for i, ext in enumerate(["a.JPG", "b.png", "c.Webp"]):
        write_image(tmp_path / ext, seed=i)
    (tmp_path / "readme.md").write_text("x")
    scan = scan_tree(tmp_path)
    assert scan.classes == []
    assert [(e.rel, e.label) for e in scan.entries] == [
        ("a.JPG", -1),
        ("b.png", -1),
        ("c.Webp", -1),
    ]


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p / "missing", "no such folder"),
        (lambda p: (p / "f.txt").write_text("x") and p / "f.txt", "is a file, not a folder"),
        (lambda p: p, "no images found"),
    ],
)
def test_bad_sources(tmp_path: Path, make, message: str) -> None:
    with pytest.raises(InputError, match=message):
        scan_tree(make(tmp_path))


def test_symlink_loop_ends(tmp_path: Path) -> None:
    write_image(tmp_path / "c" / "a.jpg")
    os.symlink(tmp_path / "c", tmp_path / "c" / "loop")
    assert [e.rel for e in scan_tree(tmp_path).entries] == ["c/a.jpg"]
