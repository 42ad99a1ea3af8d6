"""The public names of ``packer``: each one resolves in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys

import pytest

import packer
from conftest import subprocess_env
from helpers.interpreted import run_fresh
from helpers.source_ast import nodes, parse


@pytest.mark.xdist_group("fresh-interpreter")  # one zygote (helpers.interpreted.run_fresh)
def test_every_public_name_resolves_in_a_fresh_interpreter() -> None:
    """In a fork of an interpreter that has imported torch and nothing of packer
    (tests/helpers/interpreted.py): the names import torch, 4.8 CPU-s a fresh one."""
    code = (
        "import packer, types\n"
        "for name in packer.__all__:\n"
        "    assert getattr(packer, name) is not None, name\n"
        "assert isinstance(packer.builder.api, types.ModuleType)\n"
        "assert callable(packer.build_pack) and packer.build_pack is packer.builder.api.build\n"
        "assert issubclass(packer.InputError, packer.PackerError)\n"
        "assert 'configure_cuda_queues' in packer.__all__ and callable(packer.configure_cuda_queues)\n"
    )
    r = run_fresh(code, env=subprocess_env())
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
        if rel in ("__init__.py", "__main__.py", "cli.py") or rel.startswith("examples/"):
            continue  # the examples are programs on top: they use packer as a user does
        for node in nodes(path):
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


# The stages of the data path, lowest first: a module may import its own stage and the
# stages below it, never one above (lazy imports inside functions count too).
_STAGE_RANK = {
    "errors": 0,
    "_version": 0,
    "_lazy": 0,  # the one lazy module __getattr__ (standard library only)
    "_interrupts": 0,  # steps an interrupt must not split (standard library only)
    "_fs": 0.5,  # the ground floor: file and process helpers, on errors alone
    "sources": 1,
    "imaging": 2,  # the codec: decoders, the resize core, normalize
    "augment": 2.5,  # the augmentation ops, classes over kernels, on imaging's resize
    "transforms": 2.75,  # the public face of augment's ops, on top of it
    "pack": 3,
    "storage": 3.5,  # where the data is: sets, URLs, the cache; on the format (issue 45.4)
    "builder": 4,
    "loading": 4,
    "compress": 5,
    "measure": 6,
    "cli": 9,
    "__main__": 9,
    "__init__": 9,
    "examples": 10,  # programs shipped in the wheel (python -m packer.examples.NAME), on top
}
_PEERS = {
    frozenset({"cli", "__main__"}),
}


def _imports_of(path, module: str, is_pkg: bool):
    import ast

    for node in nodes(path):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = module.split(".") if is_pkg else module.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
            yield from [target] if node.module else (f"{target}.{a.name}" for a in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("packer."):
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.startswith("packer."))


def test_stages_import_only_downward() -> None:
    from pathlib import Path

    root = Path(packer.__file__).parent
    bad = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        is_pkg = parts[-1] == "__init__"
        module = ".".join(parts[:-1] if is_pkg else parts)
        mine = parts[1] if len(parts) > 1 else "__init__"
        for target in _imports_of(path, module, is_pkg):
            theirs = target.split(".")[1] if "." in target else "__init__"
            if theirs == mine or frozenset({mine, theirs}) in _PEERS:
                continue
            assert mine in _STAGE_RANK and theirs in _STAGE_RANK, (module, target)
            if _STAGE_RANK[theirs] >= _STAGE_RANK[mine]:
                bad.append(f"{module} imports {target}")
    assert not bad, "\n".join(bad)


def test_one_lazy_getattr_serves_every_package() -> None:
    """Issue 45: the lazy module ``__getattr__`` is written once (``packer._lazy``); every
    package that hands out names lazily uses it, and no module defines its own."""
    import ast
    from pathlib import Path

    from packer import _lazy

    root = Path(packer.__file__).parent
    own = []
    for path in sorted(root.rglob("*.py")):
        tree = parse(path)
        if any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in tree.body):
            own.append(path.relative_to(root).as_posix())
    assert own == [], own  # _lazy.py makes its __getattr__ inside lazy_getattr
    import importlib

    names = ("packer", "packer.pack", "packer.storage", "packer.builder", "packer.pack.raw")
    for module in map(importlib.import_module, names):
        assert module.__getattr__.__module__ == _lazy.__name__, module.__name__
        with pytest.raises(
            AttributeError, match=f"module '{module.__name__}' has no attribute 'nope'"
        ):
            module.nope  # noqa: B018


def test_lazy_getattr_resolves_and_keeps_a_name(tmp_path, monkeypatch) -> None:
    """A name's module is imported once, when the name is first asked for; the value is
    kept in the module's globals; a submodule is a module; a missing dependency of a
    submodule is raised as itself, not as "no attribute"."""
    pkg = tmp_path / "lazypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from packer._lazy import lazy_getattr\n"
        "__getattr__ = lazy_getattr(__name__, {'x': '.child', 'y': '.child:x', 'z': lambda: 7,"
        " 'path': 'os.path:join'}, ('child', 'broken', 'gone'))\n"
    )
    (pkg / "child.py").write_text("x = object()\n")
    (pkg / "broken.py").write_text("import no_such_dependency_here\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib
    import os
    import sys

    lazypkg = importlib.import_module("lazypkg")
    assert "lazypkg.child" not in sys.modules
    assert lazypkg.x is lazypkg.y is sys.modules["lazypkg.child"].x
    assert "x" in vars(lazypkg) and lazypkg.z == 7 and lazypkg.path is os.path.join
    assert lazypkg.child is sys.modules["lazypkg.child"]
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_here"):
        lazypkg.broken  # noqa: B018
    with pytest.raises(AttributeError, match="module 'lazypkg' has no attribute 'gone'"):
        lazypkg.gone  # noqa: B018
    for name in [m for m in sys.modules if m.split(".")[0] == "lazypkg"]:
        del sys.modules[name]


def test_the_test_s3_server_is_not_in_the_product() -> None:
    """Issue 45.9: the S3 server of the tests lives in tests/helpers, not in packer/ (so
    not in the wheel); nothing in packer/ names it."""
    import importlib.util
    from pathlib import Path

    root = Path(packer.__file__).parent
    assert not list(root.rglob("local_server*"))
    assert importlib.util.find_spec("packer.storage.local_server") is None
    named = [p for p in root.rglob("*.py") if "local_server" in p.read_text(encoding="utf-8")]
    assert named == []
    from helpers.local_server import S3Server  # where the tests and benchmarks find it

    assert S3Server.__module__ == "helpers.local_server"
