"""The tar shard lister that reads header blocks itself (``plain_members``) lists what
tarfile lists, member for member, for the shards writers make (webdataset's PAX
headers, GNU, ustar with a name prefix, folders), and hands every other shard to
tarfile (raises NotPlain): a link, a GNU long name, a global or unknown PAX record, a bad
checksum, a member cut short, bytes after the end."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from packer.builder.formats.webdataset import NotPlain, _Shard, plain_members


def _tarfile_listing(path: Path) -> list[tuple[str, int, int, bool]]:
    with tarfile.open(path, "r:") as tf:
        return [(m.name, m.offset_data, m.size, m.isdir()) for m in tf.getmembers()]


def _plain(path: Path) -> list[tuple[str, int, int, bool]] | None:
    shard = _Shard(str(path))
    try:
        return [(m.name, m.offset_data, m.size, m.isdir()) for m in plain_members(shard)]
    except NotPlain:
        return None
    finally:
        shard.close()


def _write(path: Path, fmt: int, members: list[tuple[str, bytes | None]], **kw: object) -> Path:
    with tarfile.open(path, "w", format=fmt) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            for k, v in kw.items():
                setattr(info, k, v)
            if data is None:
                info.type = tarfile.DIRTYPE
                tf.addfile(info)
            else:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return path


MEMBERS = [
    ("d", None),
    ("d/000001.jpg", b"\xff\xd8" + b"x" * 700),
    ("d/000001.cls", b"3"),
    ("000002.png", b"p" * 1024),
    ("000002.json", b"{}"),
    ("a" * 120 + "/000003.jpg", b"y" * 5),  # a name past 100 bytes: a prefix or PAX path
    ("empty.jpg", b""),
    ("caf\u00e9/000004.jpg", b"z" * 513),  # not ASCII: a PAX path in the PAX format
]


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT])
def test_plain_listing_equals_tarfile(tmp_path: Path, fmt: int) -> None:
    members = MEMBERS if fmt == tarfile.PAX_FORMAT else MEMBERS[:-1]
    # a float mtime: PAX writes an extended header for every member (as webdataset's)
    path = _write(tmp_path / "s.tar", fmt, members, mtime=1700000000.5)
    assert _plain(path) == _tarfile_listing(path)
    assert len(_plain(path) or []) == len(members)


def test_plain_listing_equals_tarfile_for_webdataset_shards(tmp_path: Path) -> None:
    wds = pytest.importorskip("webdataset")
    with wds.TarWriter(str(tmp_path / "w.tar")) as w:
        for k in range(5):
            w.write({"__key__": f"{k:06d}", "jpg": b"\xff\xd8" + bytes(k * 300), "cls": b"1"})
    assert _plain(tmp_path / "w.tar") == _tarfile_listing(tmp_path / "w.tar")


def test_gnu_shard_with_a_long_name_goes_to_tarfile(tmp_path: Path) -> None:
    short = _write(tmp_path / "g.tar", tarfile.GNU_FORMAT, MEMBERS[:5])
    assert _plain(short) == _tarfile_listing(short)
    long = _write(tmp_path / "l.tar", tarfile.GNU_FORMAT, MEMBERS[:6])  # an 'L' header
    assert _plain(long) is None


def _link_shard(path: Path) -> Path:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        info = tarfile.TarInfo("x.jpg")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tf.addfile(info)
    return path


def test_other_shards_go_to_tarfile(tmp_path: Path) -> None:
    assert _plain(_link_shard(tmp_path / "link.tar")) is None
    good = _write(tmp_path / "ok.tar", tarfile.USTAR_FORMAT, MEMBERS[:5])
    data = good.read_bytes()
    cut = tmp_path / "cut.tar"
    cut.write_bytes(data[:1500])  # a member cut short, no end blocks
    assert _plain(cut) is None
    after = tmp_path / "after.tar"
    end = 5632  # the first of the end's zero blocks (after the last member's block)
    assert not data[end:].strip(b"\0") and data[end - 512 : end].strip(b"\0")
    after.write_bytes(data[:end] + b"junk" + data[end + 4 :])
    assert _plain(after) is None  # not zeros where the end must be
    bad = bytearray(data)
    bad[0] ^= 1  # the first header's checksum no longer holds
    (tmp_path / "bad.tar").write_bytes(bytes(bad))
    assert _plain(tmp_path / "bad.tar") is None
    g = {"comment": "global"}  # a 'g' header first
    with tarfile.open(tmp_path / "glob.tar", "w", format=tarfile.PAX_FORMAT, pax_headers=g) as tf:
        info = tarfile.TarInfo("a.jpg")
        info.size = 3
        tf.addfile(info, io.BytesIO(b"abc"))
    assert _plain(tmp_path / "glob.tar") is None
    (tmp_path / "none.tar").write_bytes(b"")
    assert _plain(tmp_path / "none.tar") is None
