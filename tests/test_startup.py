"""Start-up: a command pays for what it uses (issue 45.11). ``imgpack info``,
``compress``, ``verify --no-speed`` on a raw pack and every ``--help`` run without
importing torch; a CPU build's parent and worker processes never import it; the build's
worker pool boots while the tree is scanned."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import packer.builder.run
from conftest import subprocess_env, write_image
from packer.builder.api import BuildConfig, build
from packer.errors import InputError, NoUsableImagesError

# runs ``imgpack ARGS`` in a fresh interpreter (click's main, as the ``imgpack`` script),
# then writes what it loaded to OUT
_RUN_CLI = textwrap.dedent(
    """
    import json, sys
    out, args = sys.argv[1], sys.argv[2:]
    from packer.cli import main
    sys.argv = ["imgpack", *args]
    code = 0
    try:
        main()
    except SystemExit as e:
        code = e.code
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "tensordict", "packer"))
    with open(out, "w") as f:
        json.dump({"code": code, "loaded": loaded}, f)
    """
)


def _loaded_by(tmp_path: Path, *args: object) -> tuple[Any, list[str]]:
    """``imgpack ARGS`` in a fresh interpreter: its exit code and the torch, tensordict
    and packer modules it had imported when it returned."""
    out = tmp_path / "loaded.json"
    subprocess.run(
        [sys.executable, "-c", _RUN_CLI, str(out), *map(str, args)],
        env=subprocess_env(),
        check=True,
        capture_output=True,
        timeout=120,
    )
    got = json.loads(out.read_text())
    return got["code"], got["loaded"]


def _torch(loaded: list[str]) -> list[str]:
    return [m for m in loaded if m.split(".")[0] in ("torch", "tensordict")]


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A class-folder tree of 8 JPEGs, a raw pack of it (its source recorded, so
    ``verify`` re-decodes a sample), and a pack set of it."""
    root = tmp_path_factory.mktemp("startup")
    for i in range(8):
        write_image(root / "src" / f"c{i % 2}" / f"{i}.jpg", (24, 18), seed=i)
    build(root / "src", root / "pack", BuildConfig(size=(8, 6), workers=1))
    build(root / "src", root / "set", BuildConfig(size=(8, 6), workers=1, shard_size=600))
    return root


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        *(
            [command, "--help"]
            for command in ("build", "compress", "info", "verify", "show", "bench")
        ),
        ["info", "{root}/pack"],
        ["info", "{root}/pack", "--json"],
        ["info", "{root}/set"],
        ["verify", "--no-speed", "{root}/pack"],  # the sources re-decoded too
        ["verify", "--no-speed", "--no-source", "{root}/pack", "--json"],
        ["compress", "{root}/src", "{tmp}/small", "-q"],
    ],
    ids=lambda a: " ".join(a).replace("{root}/", "").replace("{tmp}/", ""),
)
def test_commands_that_need_no_tensors_never_import_torch(
    tree: Path, tmp_path: Path, args: list[str]
) -> None:
    code, loaded = _loaded_by(tmp_path, *(a.format(root=tree, tmp=tmp_path) for a in args))
    assert code == 0
    assert _torch(loaded) == []


def test_compress_loads_no_build_code(tree: Path, tmp_path: Path) -> None:
    code, loaded = _loaded_by(tmp_path, "compress", tree / "src", tmp_path / "small", "-q")
    assert code == 0 and (tmp_path / "small" / "c0" / "0.jpg").is_file()
    assert [m for m in loaded if m.startswith("packer.builder")] == []


def test_a_command_imports_its_own_module_only(tree: Path, tmp_path: Path) -> None:
    code, loaded = _loaded_by(tmp_path, "info", tree / "pack")
    assert code == 0
    commands = {m for m in loaded if m.startswith("packer.cli.")} - {
        "packer.cli.options",
        "packer.cli.output",
        "packer.cli.flags",  # the one table of fields to flags every command's errors use
    }
    assert commands == {"packer.cli.info"}
    assert [m for m in loaded if m.startswith("packer.measure")] == []


def test_verify_with_speed_still_streams_through_torch(tree: Path, tmp_path: Path) -> None:
    """The control: the probe sees torch where a command does need it."""
    code, loaded = _loaded_by(
        tmp_path, "verify", tree / "pack", "--device", "cpu", "--no-source", "--batches", "1"
    )
    assert code == 0
    assert "torch" in loaded


# a stand-in ``torch`` first on the path: whichever process imports it (the build's
# parent, its fork server, a worker) leaves its pid in the file IMGPACK_TEST_TORCH_SEEN
# and gets an ImportError
_FAKE_TORCH = textwrap.dedent(
    """
    import os
    with open(os.environ["IMGPACK_TEST_TORCH_SEEN"], "a") as f:
        f.write(f"{os.getpid()}\\n")
    raise ImportError("torch is not to be imported here")
    """
)

_BUILD = textwrap.dedent(
    """
    import json, sys
    from packer.builder.api import BuildConfig, build
    r = build(sys.argv[1], sys.argv[2], BuildConfig(size=(8, 6), workers=2))
    print(json.dumps({"count": r.count, "processes": r.extra.get("processes_used")}))
    """
)


def _fake_torch_env(tmp_path: Path, **extra: str) -> tuple[dict[str, str], Path]:
    shim = tmp_path / "shim"
    (shim / "torch").mkdir(parents=True)
    (shim / "torch" / "__init__.py").write_text(_FAKE_TORCH)
    seen = tmp_path / "torch-seen"
    env = subprocess_env(IMGPACK_TEST_TORCH_SEEN=str(seen), **extra)
    env["PYTHONPATH"] = f"{shim}:{env['PYTHONPATH']}"
    return env, seen


def test_the_fake_torch_sees_an_import(tmp_path: Path) -> None:
    """The control of the build test below: the stand-in records a real import."""
    env, seen = _fake_torch_env(tmp_path)
    r = subprocess.run(
        [sys.executable, "-c", "import packer.pack.reader"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0 and "torch is not to be imported here" in r.stderr
    assert seen.read_text().split() != []


@pytest.mark.parametrize("start", ["fork", "forkserver"])
def test_a_cpu_build_and_its_workers_never_import_torch(
    tree: Path, tmp_path: Path, start: str
) -> None:
    env, seen = _fake_torch_env(tmp_path, IMGPACK_BUILD_START=start)
    r = subprocess.run(
        [sys.executable, "-c", _BUILD, str(tree / "src"), str(tmp_path / "p")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["count"] == 8 and out["processes"] >= 1  # chunks decoded by pool workers
    assert not seen.exists(), f"processes that imported torch: {seen.read_text().split()}"
    same = (tree / "pack" / "_tensordict" / "images.memmap").read_bytes()
    assert (tmp_path / "p" / "_tensordict" / "images.memmap").read_bytes() == same


def test_a_shard_task_and_a_sets_upload_import_no_torch(tmp_path: Path) -> None:
    """What a Ray shard task imports (packer.builder.ray_engine: the shard's build and its
    upload) and what fetches a set's shards (packer.storage.cache, .remote) load no torch:
    the pack set's reader imports it when a set is opened (each of a cluster's workers
    imported it, 2-3 CPU-seconds, before its first shard)."""
    env, seen = _fake_torch_env(tmp_path)
    code = "import packer.builder.ray_engine, packer.builder.upload, packer.storage.remote"
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert not seen.exists(), f"processes that imported torch: {seen.read_text().split()}"


def _watch_scan(monkeypatch: pytest.MonkeyPatch, fail: Exception | None = None) -> list[int]:
    """``plan_labels`` (the scan) wrapped to note how many worker processes are up as
    it starts; with ``fail``, the scan raises it."""
    alive: list[int] = []
    scan = packer.builder.run.plan_labels

    def watched(*args: Any, **kwargs: Any) -> Any:
        alive.append(len(multiprocessing.active_children()))
        if fail is not None:
            raise fail
        return scan(*args, **kwargs)

    monkeypatch.setattr(packer.builder.run, "plan_labels", watched)
    return alive


def test_the_pool_boots_while_the_tree_is_scanned(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    alive = _watch_scan(monkeypatch)
    r = build(tree / "src", tmp_path / "p", BuildConfig(size=(8, 6), workers=2))
    assert alive == [2] and r.count == 8
    assert multiprocessing.active_children() == []


def test_one_worker_starts_no_pool_before_the_scan(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    alive = _watch_scan(monkeypatch)
    build(tree / "src", tmp_path / "p", BuildConfig(size=(8, 6), workers=1))
    assert alive == [0]


@pytest.mark.parametrize(
    "fail", [NoUsableImagesError("no images"), InputError("bad table"), KeyboardInterrupt()]
)
def test_a_scan_that_fails_stops_the_early_pool(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail: BaseException
) -> None:
    alive = _watch_scan(monkeypatch, fail)  # type: ignore[arg-type]
    with pytest.raises(type(fail)):
        build(tree / "src", tmp_path / "p", BuildConfig(size=(8, 6), workers=2))
    assert alive == [2]
    assert multiprocessing.active_children() == []
    assert not (tmp_path / "p").exists()


def test_a_refused_destination_after_the_scan_stops_the_early_pool(
    tree: Path, tmp_path: Path
) -> None:
    dst = tmp_path / "p"
    dst.mkdir()
    (dst / "keep.txt").write_text("mine")
    with pytest.raises(InputError, match="exists and is not an imgpack pack"):
        build(tree / "src", dst, BuildConfig(size=(8, 6), workers=2))
    assert multiprocessing.active_children() == []
    assert (dst / "keep.txt").read_text() == "mine"
