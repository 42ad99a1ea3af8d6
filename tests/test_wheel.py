"""The built wheel, installed non-editable into a fresh virtual environment, works on
its own: the CLI starts, builds and verifies a pack, and ``import packer`` finds the
installed copy, from a folder outside the repository."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from conftest import REPO, write_image

pytestmark = pytest.mark.slow


def _run(cmd: list[object], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


# In one installed interpreter (a fresh one importing torch and tensordict costs about 5
# CPU-seconds; one, not one a check): first the installed ``imgpack verify PACK`` (its
# console script, run as the interpreter runs a script, before anything else is
# imported, as a user's command runs), then ``python -m packer.examples.NAME --help`` for
# each NAME given (runpy, as -m runs a module), then ``import packer.examples.NAME`` of
# each, then ``python -m packer.examples.demo_stream PACK``, then
# ``nvbatch.available()``: {"helps": {name: [exit code, what it printed]}, "files": {name:
# the imported module's __file__}, "demo": [exit code, what it printed], "verify": [exit
# code, stdout, stderr], "nvbatch": [the module's __file__, what available() said]}.
_HELPS = """
import contextlib, importlib, io, json, runpy, sys
imgpack, pack, names, out = sys.argv[1], sys.argv[2], sys.argv[3:], {}


def run(name, args, script=None):
    buf, err, code = io.StringIO(), io.StringIO(), 0
    sys.argv = [script or name, *args]
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        try:
            if script:
                runpy.run_path(script, run_name="__main__")
            else:
                runpy.run_module(f"packer.examples.{name}", run_name="__main__", alter_sys=True)
        except SystemExit as e:
            code = e.code or 0
    sys.stderr.write(err.getvalue())
    return [code, buf.getvalue(), err.getvalue()]


verify = run("imgpack", ["verify", pack, "--device", "cpu", "--batch-size", "2", "--json"], imgpack)
for name in names:
    out[name] = run(name, ["--help"])[:2]
files = {name: importlib.import_module(f"packer.examples.{name}").__file__ for name in names}
demo = run("demo_stream", [pack])[:2]
from packer.imaging import nvbatch
nv = [nvbatch.__file__, nvbatch.available()]
print(json.dumps({"helps": out, "files": files, "demo": demo, "verify": verify, "nvbatch": nv}))
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    tmp = tmp_path_factory.mktemp("wheel")
    dist = tmp / "dist"
    # from a copy of the sources alone: setuptools builds in the tree's build/, where a
    # file since removed (a moved module) would still be picked up
    src = tmp / "src"
    top = {".git", ".venv", "build", "dist", "out", ".test-servers", ".pytest_cache", ".ruff_cache"}

    def skip(folder: str, names: list[str]) -> set[str]:
        at_top = Path(folder) == REPO  # the repository's own build/ and caches, not packer's
        return {n for n in names if (at_top and (n in top or n.startswith(".whl")))
                or n == "__pycache__" or n.endswith(".egg-info")}  # fmt: skip

    shutil.copytree(REPO, src, ignore=skip, symlinks=True)
    # the build backend pyproject.toml names, through its PEP 517 hook (what `pip wheel
    # --no-build-isolation` calls, less pip's own start: 0.8 CPU-s, was 1.9), with this
    # environment's setuptools: no download
    hook = (
        "import importlib, sys, tomllib\n"
        "name = tomllib.load(open('pyproject.toml', 'rb'))['build-system']['build-backend']\n"
        "print(importlib.import_module(name).build_wheel(sys.argv[1]))\n"
    )
    r = subprocess.run([sys.executable, "-c", hook, str(dist)], cwd=src, capture_output=True,
                       text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    (wheel,) = dist.glob("imgpack-*.whl")
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    # The fresh environment sees this one's dependencies (torch, ...) through a plain
    # path line, which adds the folder to sys.path after its own site-packages and runs
    # none of the .pth files there (so the editable install of the repository stays out).
    site = next((env_dir / "lib").glob("python*/site-packages"))
    deps = [p for p in sys.path if p.endswith("site-packages")]
    (site / "_deps.pth").write_text("\n".join(deps) + "\n")
    r = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index",
         "--ignore-installed",  # the dependencies path holds the repository's editable install
         "-q", str(wheel)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env_dir, env


def test_wheel_holds_every_package(installed: tuple[Path, dict[str, str]]) -> None:
    env_dir, _ = installed
    site = next((env_dir / "lib").glob("python*/site-packages"))
    ours = {p.parent.relative_to(site).as_posix() for p in (site / "packer").rglob("__init__.py")}
    want = {p.parent.relative_to(REPO).as_posix() for p in (REPO / "packer").rglob("__init__.py")}
    assert ours == want
    # the test S3 server is a test rig (tests/helpers), not part of the product (issue 45.9)
    for rig in ("local_server*", "emulators*"):
        assert not list((site / "packer").rglob(rig)), f"a test rig ships in the wheel: {rig}"


@pytest.fixture(scope="module")
def checked(
    installed: tuple[Path, dict[str, str]], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, subprocess.CompletedProcess, subprocess.CompletedProcess, dict]:
    """From a folder outside the repository: the installed ``imgpack build`` of four
    images, then :data:`_HELPS` on its pack in one installed interpreter; (the folder,
    the build, the interpreter's run, what it printed)."""
    env_dir, env = installed
    tmp = tmp_path_factory.mktemp("checked")
    out = tmp / "elsewhere"
    out.mkdir()
    for i in range(4):
        write_image(tmp / "imgs" / ("a" if i % 2 else "b") / f"{i}.jpg", seed=i)
    imgpack = env_dir / "bin" / "imgpack"
    built = _run([imgpack, "build", tmp / "imgs", out / "pack", "--size", "16", "--workers",
                  "1", "--json"], out, env)  # fmt: skip
    assert built.returncode == 0, built.stderr
    shipped = sorted(p.stem for p in (REPO / "packer" / "examples").glob("[!_]*.py"))
    env = {**env, "XDG_CACHE_HOME": str(tmp / "cache")}  # nvbatch's compile cache
    r = _run([env_dir / "bin" / "python", "-c", _HELPS, imgpack, out / "pack", *shipped], out, env)
    assert r.returncode == 0, r.stderr
    return out, built, r, json.loads(r.stdout.splitlines()[-1])


def test_wheel_ships_the_batched_decoders_c_source(
    installed: tuple[Path, dict[str, str]], checked: tuple[Path, object, object, dict]
) -> None:
    """Issue 44: nvbatch.c travels in the wheel, and where nvImageCodec and a compiler
    are there, the installed package compiles and loads it."""
    env_dir, _ = installed
    site = next((env_dir / "lib").glob("python*/site-packages"))
    src = site / "packer" / "imaging" / "nvbatch.c"
    assert src.is_file() and src.read_bytes() == (REPO / "packer/imaging/nvbatch.c").read_bytes()
    # the installed package's nvbatch answered (in :data:`_HELPS`'s interpreter)
    module, why = checked[3]["nvbatch"]
    assert Path(module).is_relative_to(site), module
    try:
        import nvidia.nvimgcodec  # noqa: F401
    except ImportError:
        assert isinstance(why, str) and why, why  # it says why it cannot, and that is all
        return
    assert why is None, why


def test_installed_cli_builds_and_verifies_outside_the_repo(
    installed: tuple[Path, dict[str, str]], checked: tuple[Path, object, object, dict]
) -> None:
    env_dir, env = installed
    out, built, _, done = checked
    r = _run([env_dir / "bin" / "python", "-c", "import packer, sys; print(packer.__file__)"],
             out, env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()).is_relative_to(env_dir), r.stdout
    imgpack = env_dir / "bin" / "imgpack"
    r = _run([imgpack, "--help"], out, env)
    assert r.returncode == 0 and "build" in r.stdout, r.stderr
    # the installed `imgpack build --json` (its own process) and `imgpack verify --json`
    assert json.loads(built.stdout)["count"] == 4
    code, stdout, stderr = done["verify"]
    assert code == 0, stderr + stdout
    assert json.loads(stdout), stdout


def test_installed_examples_run_with_python_m(
    installed: tuple[Path, dict[str, str]], checked: tuple[Path, object, object, dict]
) -> None:
    """Issue 43: the README's `python -m packer.examples.train_imagenet` works for a pip
    user (no repository): every example is in the wheel and answers --help; the demo
    streams a pack, from a folder outside the repository."""
    env_dir, _ = installed
    shipped = sorted(p.stem for p in (REPO / "packer" / "examples").glob("[!_]*.py"))
    assert {"train_imagenet", "demo_stream", "train_sets_ddp"} <= set(shipped)
    # each example's `python -m packer.examples.NAME --help` (runpy, as -m runs it), then
    # its import, then `python -m packer.examples.demo_stream PACK`, all in one installed
    # interpreter (the fixture's): one import of torch, not one an example
    _, _, r, done = checked
    helps = {}
    for name, (code, out) in done["helps"].items():
        assert code == 0 and "usage:" in out, (name, code, out, r.stderr)
        helps[name] = out
    assert sorted(helps) == shipped
    # every example imported from the installed copy
    printed = [done["files"][n] for n in shipped]
    assert len(printed) == len(shipped), r.stdout
    assert all(f.startswith(f"{env_dir}") for f in printed), r.stdout
    assert "--val-resize-size" in helps["train_imagenet"]
    assert "--train-crop-size" in helps["train_imagenet"]
    # the demo streamed the pack
    code, out = done["demo"]
    assert code == 0 and "epoch 1:" in out, (code, out, r.stderr)
