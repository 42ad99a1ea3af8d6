"""packer.imaging.cuda_queues: ``import packer`` leaves the process environment alone;
``packer.configure_cuda_queues()`` asks CUDA for 32 hardware queues unless the user chose
or CUDA had started, and a JPEG loader on CUDA says where it has fewer."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from conftest import subprocess_env
from helpers.interpreted import run_fresh
from packer.imaging import cuda_queues as cq

SHOW = (
    "import os, packer; from packer.imaging import cuda_queues as q; "
    "n = packer.configure_cuda_queues(); "
    "print(os.environ.get(q.VAR), q.queues(), q.advice() is None, n)"
)


def _child(code: str, **env: str) -> list[str]:
    e = subprocess_env(**env)
    if cq.VAR not in env:
        e.pop(cq.VAR, None)
    r = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True,
                       timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.split()


@pytest.mark.xdist_group("fresh-interpreter")  # one zygote (helpers.interpreted.run_fresh)
def test_import_packer_leaves_the_environment_alone():
    """Issue 45.8: ``import packer`` sets nothing in os.environ (it used to set the
    variable as a side effect); the public names resolve without setting it either. In
    a fork of an interpreter that has imported torch and nothing of packer (the public
    names import torch: 5.7 CPU-s a fresh interpreter)."""
    code = (
        "import os, packer; from packer.imaging import cuda_queues as q; "
        "before = q.VAR in os.environ; [getattr(packer, n) for n in packer.__all__]; "
        "print(before, q.VAR in os.environ, q.queues())"
    )
    env = subprocess_env()
    env.pop(cq.VAR, None)
    r = run_fresh(code, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["False", "False", "None"]


def test_configure_sets_32_where_unset():
    assert _child(SHOW) == ["32", "32", "True", "32"]


def test_the_users_value_stands_and_a_low_one_is_named():
    assert _child(SHOW, CUDA_DEVICE_MAX_CONNECTIONS="4") == ["4", "4", "False", "4"]
    code = (
        "import packer; from packer.imaging import cuda_queues as q; "
        "packer.configure_cuda_queues(); print(q.advice())"
    )
    line = " ".join(_child(code, CUDA_DEVICE_MAX_CONNECTIONS="4"))
    assert (
        "CUDA_DEVICE_MAX_CONNECTIONS=4" in line and "export CUDA_DEVICE_MAX_CONNECTIONS=32" in line
    )
    assert "packer.configure_cuda_queues() before the first CUDA call" in line
    assert _child(SHOW, CUDA_DEVICE_MAX_CONNECTIONS="24") == ["24", "24", "True", "24"]


@pytest.fixture
def seen(monkeypatch):
    monkeypatch.setattr(cq, "_seen", {})
    return cq._seen


def test_cuda_started_before_import_means_the_default_8(seen, monkeypatch, caplog):
    monkeypatch.setattr(cq, "_cuda_started", lambda: True)
    monkeypatch.delenv(cq.VAR, raising=False)
    cq.claim()
    assert cq.VAR not in __import__("os").environ  # too late to matter: not set
    assert cq.queues() == 8
    assert "CUDA started before packer.configure_cuda_queues()" in (cq.advice() or "")
    with caplog.at_level(logging.WARNING, logger="packer"):
        cq.warn_once()
        cq.warn_once()
    assert sum("hardware queues" in r.getMessage() for r in caplog.records) == 1


def test_unknown_before_claim_and_unparsable_values_say_nothing(seen, monkeypatch):
    assert cq.queues() is None and cq.advice() is None
    monkeypatch.setattr(cq, "_cuda_started", lambda: False)
    monkeypatch.setenv(cq.VAR, "many")
    cq.claim()
    assert cq.queues() is None and cq.advice() is None


@pytest.mark.cuda
def test_a_jpeg_loader_on_cuda_asks_for_the_queues_or_says_it_is_too_late(tmp_path):
    """The loader makes packer.configure_cuda_queues()'s call itself: in time when it is
    created before any CUDA call (32 queues), too late after one (nothing set, one
    warning naming the call to make)."""
    from PIL import Image

    from packer.builder.run import BuildConfig, build

    for i in range(4):
        (tmp_path / "src" / "a").mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (24, 20), (9 * i,) * 3).save(tmp_path / "src" / "a" / f"{i}.jpg")
    build(tmp_path / "src", tmp_path / "pack", BuildConfig(store="jpeg", workers=1))
    make = f"packer.PackLoader({str(tmp_path / 'pack')!r}, 4, device='cuda', image_size=16)"
    first = f"import os, packer; ld = {make}; print(os.environ.get('{cq.VAR}'))"
    assert _child(first) == ["32"]
    late = (
        "import logging, os, torch, packer; logging.basicConfig(level=logging.WARNING); "
        f"torch.zeros(1, device='cuda'); ld = {make}; print(os.environ.get('{cq.VAR}'), "
        "str(ld.decode_path).startswith('cpu'))"
    )
    e = subprocess_env()
    e.pop(cq.VAR, None)
    r = subprocess.run([sys.executable, "-c", late], env=e, capture_output=True, text=True,
                       timeout=120)  # fmt: skip
    assert r.returncode == 0 and r.stdout.split()[0] == "None", r.stderr[-2000:]
    on_threads = r.stdout.split()[1] == "True"  # no GPU decoder here: no queues to share
    warned = "packer.configure_cuda_queues() before the first CUDA call" in r.stderr
    assert warned != on_threads, r.stderr[-2000:]
