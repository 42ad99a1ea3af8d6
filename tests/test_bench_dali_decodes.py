"""benchmarks/dali.py's --decodes values for the CPU lane (issue 44): "cpu-lane:K" is the
default lanes plus one CPU lane of K threads, "cpu" the CPU threads alone; on the CPU
here (the benchmark runs them on CUDA), each decoding a small pack."""

from __future__ import annotations

from pathlib import Path

import pytest

import packer
from benchmarks.dali import decode_kwargs
from packer.builder.run import BuildConfig, build
from packer.errors import UsageError
from packer.imaging.cpu_lane import CpuLane


def test_cpu_lane_and_cpu_decode_values(tmp_path: Path) -> None:
    from packer.measure.bench.synth import make_jpeg_tree

    make_jpeg_tree(tmp_path / "src", 9, (40, 30), quality=90, threads=1)
    build(tmp_path / "src", tmp_path / "pack", BuildConfig(store="jpeg", workers=1))
    kw = decode_kwargs("cpu-lane:3", "cpu")
    *default, lane = kw["decode"]
    assert [d.name for d in default] == ["cpu"]  # the default lanes on this device
    assert isinstance(lane, CpuLane) and lane.threads == 3 and lane.name == "cpu-lane(3)"
    ld = packer.PackLoader(tmp_path / "pack", 4, device="cpu", image_size=8, **kw)
    assert sum(len(y) for _, y in ld) == 9
    assert ld.decode_path.endswith("cpu-lane(3): box+scale on the CPU")
    assert decode_kwargs("cpu", "cpu") == {"decode": "cpu"}
    assert decode_kwargs("auto", "cpu") == {}
    with pytest.raises(UsageError, match="cpu_lane threads must be a whole number >= 1"):
        decode_kwargs("cpu-lane:0", "cpu")
