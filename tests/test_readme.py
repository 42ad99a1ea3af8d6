"""Every Python block of README.md runs as written on a CPU machine (issue 43), each in a
process of its own (a fork of this one: tests/helpers/forked.py), in a folder holding
the packs the README builds before it (from sample_data/); and the README's local
object-storage commands (rclone serve s3, the four variables, the S3 build example)
work as documented.

Only the epoch counts are shrunk (``range(90)``, ``max_epochs=90``), so a block's whole
loop runs in seconds; nothing else of a block is changed."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import REPO, subprocess_env
from helpers.forked import run_cli, run_code
from packer.builder.api import BuildConfig, build

pytestmark = pytest.mark.slow

README = REPO / "README.md"
SHRINK = {"range(90)": "range(2)", "max_epochs=90": "max_epochs=1"}


def blocks(lang: str) -> list[tuple[str, str]]:
    """(the heading above it, its text) of each ```lang block of the README."""
    out, heading = [], ""
    text = README.read_text()
    for m in re.finditer(rf"^(#+ [^\n]*)$|^```{lang}\n(.*?)^```", text, re.M | re.S):
        if m.group(1):
            heading = m.group(1).lstrip("# ").strip()
        else:
            out.append((heading, m.group(2)))
    return out


def shrunk(code: str) -> str:
    for old, new in SHRINK.items():
        code = code.replace(old, new)
    return code


def free_port() -> int:
    from helpers.local_server import free_port

    return free_port()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The packs the README's commands make, from sample_data/ (36 photos, 3 classes)."""
    root = tmp_path_factory.mktemp("readme")
    src = REPO / "sample_data"
    size = BuildConfig(size=(256, 256), workers=2)
    build(src, root / "train_pack", size)
    build(
        src, root / "val_pack", BuildConfig(size=(256, 256), workers=2, classes=root / "train_pack")
    )
    build(src, root / "jpack", BuildConfig(workers=2, store="jpeg", max_side=512))
    build(src, root / "train_set", BuildConfig(size=(256, 256), workers=2, shard_size=2_000_000))
    return root


def run_python(
    code: str, cwd: Path, env: dict[str, str], storage: bool = False
) -> subprocess.CompletedProcess:
    """``python -c CODE`` in a fork of this process (no fresh import of torch);
    ``storage``: the code uses object storage (helpers.forked.forkable)."""
    return run_code(code, cwd=cwd, env=env, timeout=300, storage=storage)


def block_env(**extra: str) -> dict[str, str]:
    """A CPU machine's environment (no GPU seen), and what torchrun sets for one process."""
    return subprocess_env(
        CUDA_VISIBLE_DEVICES="",
        OMP_NUM_THREADS="2",
        LOCAL_RANK="0",
        RANK="0",
        WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        **extra,
    )


LOCAL = [(h, c) for h, c in blocks("python") if "s3://" not in c]


def test_the_readme_has_its_blocks() -> None:
    headings = [h for h, _ in blocks("python")]
    assert len(headings) >= 6 and "Train from a pack" in headings, headings
    assert any("s3://" in c for _, c in blocks("python"))


@pytest.mark.parametrize(("heading", "code"), LOCAL, ids=[h for h, _ in LOCAL])
def test_readme_python_block_runs_on_the_cpu(workdir: Path, heading: str, code: str) -> None:
    if "import lightning" in code:  # imported once here, not in each of the two forks below
        import lightning  # noqa: F401
    r = run_python(shrunk(code), workdir, block_env())
    assert r.returncode == 0, f"README block under {heading!r} failed:\n{r.stderr[-3000:]}"
    if "ckpt_path=" in code:  # run again: it resumes from the first run's last.ckpt
        assert (workdir / "checkpoints" / "last.ckpt").is_file()
        r = run_python(shrunk(code), workdir, block_env())
        assert r.returncode == 0, r.stderr[-3000:]
        assert "Restoring states from the checkpoint path" in r.stderr, r.stderr[-3000:]


def _local_s3_block() -> str:
    (code,) = [c for _, c in blocks("bash") if "rclone serve s3" in c]
    return code


def test_readme_object_storage_commands_run_against_a_local_server(tmp_path: Path) -> None:
    """The README's local S3 recipe: the bucket folder made first, `rclone serve s3` as
    given (on a free port in place of the README's), the four variables exported; then
    the README's S3 build, info, verify and the Python block, as written."""
    pytest.importorskip("obstore")
    from helpers.local_server import rclone_binary

    try:
        rclone = rclone_binary()
    except Exception as e:
        pytest.skip(str(e))
    port = str(free_port())
    env = block_env(IMGPACK_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("AWS_PROFILE", None)
    env["AWS_SHARED_CREDENTIALS_FILE"] = str(tmp_path / "none")
    env["AWS_CONFIG_FILE"] = str(tmp_path / "none")
    server = None
    try:
        for line in _local_s3_block().splitlines():
            line = line.split("  #")[0].strip().replace("8333", port)
            if not line or line.startswith("pip install"):
                continue
            words = shlex.split(line)
            if words[0] == "mkdir":
                subprocess.run(words, cwd=tmp_path, check=True)
            elif words[:3] == ["rclone", "serve", "s3"]:
                assert words[-1] == "&", line
                server = subprocess.Popen(
                    [rclone, *words[1:-1]], cwd=tmp_path, stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                )  # fmt: skip
            elif words[0] == "export":
                env.update(w.split("=", 1) for w in words[1:])
            else:
                raise AssertionError(f"a line this test does not know: {line}")
        assert server is not None
        assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_REGION"} <= (
            env.keys()
        )
        _wait_listening(int(port), server)
        for name in ("train", "val"):
            shutil.copytree(REPO / "sample_data", tmp_path / name)
        (code,) = [c for _, c in blocks("bash") if "imgpack info s3://bucket/train" in c]
        for line in code.splitlines():
            line = line.split("  #")[0].strip()
            words = shlex.split(line)
            assert words[0] == "imgpack", line
            # forked (a fresh interpreter where this process has loaded obstore)
            r = run_cli(words[1:], cwd=tmp_path, env=env, timeout=300, storage=True)
            assert r.returncode == 0, f"{line}:\n{r.stderr[-3000:]}"
        (code,) = [c for _, c in blocks("python") if "s3://" in c]
        r = run_python(code + "\nprint(len(train), len(loader))\n", tmp_path, env, storage=True)
        assert r.returncode == 0, r.stderr[-3000:]
        assert r.stdout.split()[-2:] == ["36", "1"]
    finally:
        if server is not None and server.poll() is None:
            os.kill(server.pid, signal.SIGTERM)
            server.wait(10)


def _wait_listening(port: int, proc: subprocess.Popen) -> None:
    import socket

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"rclone serve s3 did not listen on {port}")
