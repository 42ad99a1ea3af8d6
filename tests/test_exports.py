"""The public names of ``packer``: each one resolves in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys

import packer


def test_every_public_name_resolves_in_a_fresh_interpreter() -> None:
    code = (
        "import packer, types\n"
        "for name in packer.__all__:\n"
        "    assert getattr(packer, name) is not None, name\n"
        "assert isinstance(packer.build, types.ModuleType)\n"
        "assert callable(packer.build_pack) and packer.build_pack is packer.build.build\n"
        "assert issubclass(packer.InputError, packer.PackerError)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_submodules_are_modules_before_any_import() -> None:
    r = subprocess.run(
        [sys.executable, "-c", "import packer, types; print(type(packer.compress).__name__)"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0 and r.stdout.strip() == "module", r.stderr


def test_unknown_name_is_an_attribute_error() -> None:
    import pytest

    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        packer.nope  # noqa: B018
