"""The public names of ``packer``: each one resolves in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys

import pytest

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
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        packer.nope  # noqa: B018


def test_no_module_imports_upward() -> None:
    """Arrows run down: no module imports the package ``__init__`` (``from . import x``,
    ``import packer``) or the CLI; only ``cli.py`` and ``__main__.py`` sit on top."""
    import ast
    from pathlib import Path

    root = Path(packer.__file__).parent
    bad = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in ("__init__.py", "__main__.py", "cli.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                names = {a.name for a in node.names}
                pkg = path.parent if node.level == 1 else path.parent.parent
                # from . import x: fine when x is a submodule, upward when x is the package's
                missing = {n for n in names if not (pkg / f"{n}.py").exists()}
                if node.level and not node.module and missing:
                    bad.append(f"{rel}: from {'.' * node.level} import {', '.join(missing)}")
                elif (node.module or "").split(".")[-1] == "cli" or node.module == "packer":
                    bad.append(f"{rel}: from {node.module} import ...")
            elif isinstance(node, ast.Import):
                bad += [
                    f"{rel}: import {a.name}"
                    for a in node.names
                    if a.name in ("packer", "packer.cli")
                ]
    assert bad == []
