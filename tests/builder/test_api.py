"""packer.builder.api: which build a job is (one pack, a set, a set in a bucket, a Ray
cluster's) is decided in one place, and the modules below it never import it back."""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

import packer
from conftest import subprocess_env
from packer.builder import api, run
from packer.builder.api import BuildConfig, Route, route
from packer.errors import UsageError

CFG = BuildConfig(size=(8, 6), workers=1)


@pytest.mark.parametrize(
    ("src", "dst", "changes", "want"),
    [
        ("imgs", "out", {}, Route("pack", "local", False)),
        (Path("imgs"), Path("out"), {}, Route("pack", "local", False)),
        ("imgs", "out", {"shard_size": 1000}, Route("set", "local", False)),
        ("imgs", "out", {"append": True}, Route("set", "local", False)),
        ("imgs", "out", {"engine": "ray"}, Route("set", "ray", False)),
        ("imgs", "s3://b/set", {"shard_size": 1000}, Route("bucket", "local", False)),
        ("imgs", "gs://b/set", {"append": True}, Route("bucket", "local", False)),
        ("s3://b/i", "out", {"engine": "ray"}, Route("set", "ray", True)),
        ("az://b/i", "s3://b/s", {"engine": "ray"}, Route("bucket", "ray", True)),
        ("s3://b/i", "out", {}, Route("pack", "local", True)),  # refused by build()
    ],
)
def test_the_route_of_each_kind_of_job(
    src: object, dst: object, changes: dict, want: Route
) -> None:
    r = route(src, dst, replace(CFG, **changes))  # type: ignore[arg-type]
    assert r == want
    assert r.sharded == (want.target != "pack")
    assert type(r.set_engine()).__name__ == ("RayEngine" if want.engine == "ray" else "LocalEngine")


def test_the_public_entry_points_are_the_dispatcher() -> None:
    assert packer.build_pack is api.build
    assert packer.builder.build is api.build
    assert packer.BuildConfig is api.BuildConfig


@pytest.mark.parametrize("dst", ["out", "s3://bucket/set"])
def test_a_set_from_a_bucket_src_without_ray_is_refused_before_any_work(
    tmp_path: Path, dst: str
) -> None:
    # a bucket DST too: refused before the bucket is opened (no server runs here)
    out = dst if "://" in dst else str(tmp_path / dst)
    cfg = replace(CFG, shard_size=1000)
    with pytest.raises(UsageError, match=r"^SRC s3://bucket/images: a pack set from a bucket"):
        api.build("s3://bucket/images", out, cfg)
    assert not (tmp_path / "out").exists()


def test_a_bucket_src_with_a_credential_is_refused_unquoted(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as e:
        api.build("s3://KEY:hunter2@bucket/images", tmp_path / "out", CFG)
    assert "hunter2" not in str(e.value) and "credentials in the URL" in str(e.value)


@pytest.mark.parametrize("changes", [{"shard_size": 1000}, {"append": True}, {"engine": "ray"}])
def test_the_one_pack_builder_refuses_a_set(
    image_tree: Path, tmp_path: Path, changes: dict
) -> None:
    with pytest.raises(UsageError, match=r"^this builds one pack: a pack set .* packer.build_pack"):
        run.build(image_tree, tmp_path / "p", replace(CFG, **changes))
    assert not (tmp_path / "p").exists()


def test_a_listed_plan_builds_one_pack_only(image_tree: Path, tmp_path: Path) -> None:
    from packer.builder.plan import plan_labels

    plan = plan_labels(image_tree, CFG)
    with pytest.raises(UsageError, match="a listed plan builds one pack"):
        api.build(image_tree, tmp_path / "s", replace(CFG, shard_size=1000), plan=plan)
    r = api.build(image_tree, tmp_path / "p", CFG, plan=plan)
    assert r.count == len(plan.scan.entries) - len(r.skipped) and not r.shards


def test_one_packs_build_loads_no_set_module(image_tree: Path, tmp_path: Path) -> None:
    code = (
        "import sys, packer\n"
        f"packer.build_pack({str(image_tree)!r}, {str(tmp_path / 'p')!r}, "
        "packer.BuildConfig(size=(8, 6), workers=1))\n"
        "print(sorted(m for m in sys.modules if m.startswith('packer.builder.')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=subprocess_env(), capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    loaded = out.stdout.strip()
    assert "packer.builder.run" in loaded and "packer.builder.api" in loaded
    for name in ("shards", "upload", "ray_engine", "set_plan"):
        assert f"packer.builder.{name}'" not in loaded, loaded


def _build_imports() -> dict[str, set[str]]:
    """packer.builder's modules and the packer.builder modules each imports, lazy imports
    inside functions included (TYPE_CHECKING blocks excepted)."""
    root = Path(api.__file__).parent
    mods = {p.stem for p in root.glob("*.py") if p.stem != "__init__"}
    graph: dict[str, set[str]] = {}
    for m in mods:
        tree = ast.parse((root / f"{m}.py").read_text(encoding="utf-8"))
        skip = {
            id(x)
            for n in ast.walk(tree)
            if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test)
            for b in n.body
            for x in ast.walk(b)
        }
        out = set()
        for n in ast.walk(tree):
            if id(n) in skip or not isinstance(n, ast.ImportFrom):
                continue
            if n.level == 1 and n.module:
                out.add(n.module.split(".")[0])
            elif n.level == 1:
                out |= {a.name for a in n.names}
            elif (n.module or "").startswith("packer.builder."):
                out.add(n.module.split(".")[2])  # type: ignore[union-attr]
        graph[m] = out & mods
    return graph


def test_no_import_circle_in_the_build_stage_and_nothing_imports_the_dispatcher() -> None:
    graph = _build_imports()
    assert {m for m, targets in graph.items() if "api" in targets} == set()
    assert graph["api"] >= {"run"}
    # depth-first: a module reached again while on the path closes a circle
    state: dict[str, int] = {}
    circles: list[str] = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                circles.append(" -> ".join([*path[path.index(t) :], t]))
            elif t not in state:
                visit(t, [*path, t])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert circles == []
