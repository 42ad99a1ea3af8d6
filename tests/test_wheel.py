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


# ``python -m packer.examples.NAME --help`` for each NAME given, then ``import
# packer.examples.NAME`` of each, then ``python -m packer.examples.demo_stream PACK``, all
# in this interpreter (runpy, as -m runs a module): {"helps": {name: [exit code, what it
# printed]}, "files": {name: the imported module's __file__}, "demo": [exit code, what
# it printed]}. One interpreter importing torch, not one per example and one more for
# the demo (a fresh interpreter importing torch and tensordict costs about 5 CPU-seconds).
_HELPS = """
import contextlib, importlib, io, json, runpy, sys
pack, names, out = sys.argv[1], sys.argv[2:], {}


def run(name, args):
    buf, code = io.StringIO(), 0
    sys.argv = [name, *args]
    with contextlib.redirect_stdout(buf):
        try:
            runpy.run_module(f"packer.examples.{name}", run_name="__main__", alter_sys=True)
        except SystemExit as e:
            code = e.code or 0
    return [code, buf.getvalue()]


for name in names:
    out[name] = run(name, ["--help"])
files = {name: importlib.import_module(f"packer.examples.{name}").__file__ for name in names}
demo = run("demo_stream", [pack])
print(json.dumps({"helps": out, "files": files, "demo": demo}))
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
    # --no-build-isolation: build with this environment's setuptools, no download
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(dist), str(src)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
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


def test_wheel_ships_the_batched_decoders_c_source(
    installed: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """Issue 44: nvbatch.c travels in the wheel, and where nvImageCodec and a compiler
    are there, the installed package compiles and loads it."""
    env_dir, env = installed
    site = next((env_dir / "lib").glob("python*/site-packages"))
    src = site / "packer" / "imaging" / "nvbatch.c"
    assert src.is_file() and src.read_bytes() == (REPO / "packer/imaging/nvbatch.c").read_bytes()
    env = {**env, "XDG_CACHE_HOME": str(tmp_path)}
    code = "from packer.imaging import nvbatch; print(nvbatch.available())"
    r = _run([env_dir / "bin" / "python", "-c", code], tmp_path, env)
    assert r.returncode == 0, r.stderr
    try:
        import nvidia.nvimgcodec  # noqa: F401
    except ImportError:
        return  # the installed package says why it cannot, and that is all
    assert r.stdout.strip() == "None", r.stdout


def test_installed_cli_builds_and_verifies_outside_the_repo(
    installed: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    env_dir, env = installed
    out = tmp_path / "elsewhere"
    out.mkdir()
    r = _run([env_dir / "bin" / "python", "-c", "import packer, sys; print(packer.__file__)"],
             out, env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()).is_relative_to(env_dir), r.stdout
    imgpack = env_dir / "bin" / "imgpack"
    r = _run([imgpack, "--help"], out, env)
    assert r.returncode == 0 and "build" in r.stdout, r.stderr
    for i in range(4):
        write_image(tmp_path / "imgs" / ("a" if i % 2 else "b") / f"{i}.jpg", seed=i)
    r = _run([imgpack, "build", tmp_path / "imgs", out / "pack", "--size", "16", "--workers",
              "1", "--json"], out, env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["count"] == 4
    r = _run([imgpack, "verify", out / "pack", "--device", "cpu", "--batch-size", "2",
              "--json"], out, env)  # fmt: skip
    assert r.returncode == 0, r.stderr + r.stdout


def test_installed_examples_run_with_python_m(
    installed: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """Issue 43: the README's `python -m packer.examples.train_imagenet` works for a pip
    user (no repository): every example is in the wheel and answers --help; the demo
    streams a pack, from a folder outside the repository."""
    env_dir, env = installed
    py = env_dir / "bin" / "python"
    shipped = sorted(p.stem for p in (REPO / "packer" / "examples").glob("[!_]*.py"))
    assert {"train_imagenet", "demo_stream", "train_sets_ddp"} <= set(shipped)
    for i in range(4):
        write_image(tmp_path / "imgs" / ("a" if i % 2 else "b") / f"{i}.jpg", seed=i)
    r = _run([env_dir / "bin" / "imgpack", "build", tmp_path / "imgs", tmp_path / "pack",
              "--size", "16", "--workers", "1", "-q"], tmp_path, env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    # each example's `python -m packer.examples.NAME --help` (runpy, as -m runs it), then
    # its import, then `python -m packer.examples.demo_stream PACK`, all in one installed
    # interpreter: one import of torch, not one an example
    r = _run([py, "-c", _HELPS, tmp_path / "pack", *shipped], tmp_path, env)
    assert r.returncode == 0, r.stderr
    done = json.loads(r.stdout.splitlines()[-1])
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
