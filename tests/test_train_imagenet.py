"""scripts/train_imagenet.py runs the standard recipe on the CPU: two tiny epochs, then resumes."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import packer
from conftest import subprocess_env
from packer.build import BuildConfig, build

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    "transform" not in inspect.signature(packer.PackLoader).parameters,
    reason="PackLoader has no transform= parameter yet (issue 12, loader side)",
)


def run(*args: str) -> str:
    env = subprocess_env(OMP_NUM_THREADS="2")
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts/train_imagenet.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_train_two_epochs_on_cpu_then_resume(tmp_path: Path) -> None:
    pack = tmp_path / "pack64"
    build(ROOT / "sample_data", pack, BuildConfig(size=(64, 64), workers=1))
    out = tmp_path / "run"
    common = [
        "--train", str(pack), "--val", str(pack), "--arch", "resnet18",
        "--batch-size", "8", "--max-steps", "2", "--crop", "48", "--val-crop", "48",
        "--res-schedule", "40:0,48:1", "--lr-schedule", "cosine", "--label-smoothing", "0.1",
        "--device", "cpu", "--workers", "1", "--out", str(out), "--log-every", "0",
    ]  # fmt: skip
    text = run(*common, "--epochs", "2")
    lines = re.findall(r"^epoch (\d) size (\d+): train loss ([\d.]+) .*top5 ([\d.]+)%", text, re.M)
    assert [(e, s) for e, s, _, _ in lines] == [("0", "40"), ("1", "48")], text
    assert all(0 < float(loss) < 20 for _, _, loss, _ in lines)
    assert all(0 <= float(t5) <= 100 for *_, t5 in lines)
    ck = torch.load(out / "last.pt", weights_only=True)
    assert ck["epoch"] == 1 and ck["arch"] == "resnet18"
    assert not list(out.glob(".*tmp*"))  # written under a temporary name, then renamed

    text = run(*common, "--epochs", "3", "--resume", str(out / "last.pt"))
    assert "resumed from" in text and "epoch 1 done" in text
    assert re.findall(r"^epoch (\d) size (\d+):", text, re.M) == [("2", "48")], text
    assert torch.load(out / "last.pt", weights_only=True)["epoch"] == 2
