"""A local SRC with a name longer than a file system allows (255 bytes): an InputError
naming it (the CLI's one-line ``Error:``, exit 2), never the OSError ENAMETOOLONG that
Path.exists / is_dir raise for it (a folder, a file, a brace range, a glob, a name
under it, a pattern whose names fit once expanded)."""

from __future__ import annotations

from pathlib import Path

import pytest

from packer.builder.api import BuildConfig, build
from packer.builder.formats.base import source_spec
from packer.errors import InputError

LONG = "x" * 300


@pytest.mark.parametrize(
    "name",
    [LONG, f"{LONG}.tar", f"{LONG}-{{000..001}}.tar", f"{LONG}/a.parquet", "x" * 250 + "-*.tar",
     "x" * 250 + "-{000000..000001}.tar", "\U0001d400" * 70 + ".zip"],
)  # fmt: skip
def test_a_name_too_long_is_an_input_error(tmp_path: Path, name: str) -> None:
    with pytest.raises(InputError, match=r"(over the 255 a file name can have|no file matches)"):
        source_spec(str(tmp_path / name))
    with pytest.raises(InputError, match=r"over the 255|no file matches"):
        build(str(tmp_path / name), tmp_path / "out", BuildConfig(size=(8, 6), workers=1))


def test_a_brace_range_of_names_that_fit_is_read(tmp_path: Path) -> None:
    """The pattern's text is over 255 bytes; each name it names is not."""
    base = "y" * 240
    for i in range(2):
        (tmp_path / f"{base}-{i:06d}.tar").write_bytes(b"")
    spec = source_spec(str(tmp_path / f"{base}-{{000000..000001}}.tar"))
    assert spec is not None and spec.kind == "tar" and len(spec.items) == 2
