"""``imgpack bench``: the quick grid on the CPU, its outputs, its errors, its clocks."""

from __future__ import annotations

import json
import signal
import time
import warnings
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from conftest import cli_run as _cli
from conftest import one_error as _one_error
from conftest import start_cli as _start
from conftest import stderr_until as _stderr_until
from packer.cli import cli
from packer.compress import ffmpeg_exe
from packer.errors import FFmpegError
from packer.measure.bench import BenchConfig, count_points, to_markdown
from packer.measure.bench.plots import plot_bench
from packer.measure.bench.run import TRANSFER_ON_CPU
from packer.measure.bench.synth import make_jpeg_tree
from packer.measure.timing import median_rate, time_call

PNG = b"\x89PNG\r\n\x1a\n"


def run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, ["bench", *args])
    return r.exit_code, r.stdout, r.stderr


@pytest.mark.slow
def test_quick_cpu_measures_every_point_and_writes_plots(tmp_path: Path) -> None:
    out = tmp_path / "res"
    with warnings.catch_warnings():  # its timed passes name their epochs: no PackLoader warning
        warnings.filterwarnings("error", message="PackLoader")
        code, stdout, _ = run("--quick", "--device", "cpu", "--out", str(out), "--json", "-q")
    assert code == 0, stdout
    r = json.loads(stdout)
    assert r["device"] == "cpu" and r["quick"]
    # no transfer tables: a CPU "copy to the device" is a memcpy, not bus bandwidth
    assert r["transfer"] == [] and r["conversion"] == []
    loaders = {p["loader"] for p in r["loading"]}
    assert len(loaders) == 3 and len(r["loading"]) == 6, loaders
    assert any(name.startswith("compressed folder") for name in loaders)
    assert all(p["images_per_s"] > 0 for p in r["loading"])
    assert r["dataset"]["images"] == 64
    assert r["dataset"]["compressed_bytes"] < r["dataset"]["original_bytes"]
    assert r["training"] == []
    assert r["skipped"] == [
        {
            "section": "training",
            "what": "all",
            "reason": "training runs on CUDA only; use a machine with a GPU",
        },
        {"section": "transfer", "what": "all", "reason": TRANSFER_ON_CPU},
    ]
    names = sorted(Path(f).name for f in r["files"])
    assert names == ["loading.png", "results.json", "results.md"]
    assert (out / "loading.png").read_bytes()[:8] == PNG
    assert json.loads((out / "results.json").read_text())["loading"] == r["loading"]
    md = (out / "results.md").read_text()
    assert "## Loading" in md and "| pack on CPU (PackLoader) |" in md
    assert not list(out.glob(".*.tmp"))


def test_source_sample_of_user_images(tmp_path: Path) -> None:
    src = tmp_path / "mine"
    make_jpeg_tree(src, 40, (96, 72), classes=2, threads=2)
    (src / "class_0" / "notes.txt").write_text("not an image")
    code, stdout, _ = run(
        "--quick",
        "--device",
        "cpu",
        "--only",
        "loading",
        "--source",
        str(src),
        "--out",
        str(tmp_path / "o"),
        "--json",
        "-q",
    )
    assert code == 0, stdout
    r = json.loads(stdout)
    assert r["dataset"]["images"] == 40
    assert str(src) in r["dataset"]["kind"]
    assert r["transfer"] == [] and len(r["loading"]) == 6
    assert src.joinpath("class_0", "notes.txt").exists()  # the user's folder is untouched
    assert len(list(src.rglob("*.jpg"))) == 40


def test_markdown_says_transfer_is_not_measured_on_the_cpu(tmp_path: Path) -> None:
    code, stdout, stderr = run(
        "--quick", "--device", "cpu", "--only", "transfer", "--out", str(tmp_path / "o")
    )
    assert code == 0, stderr
    assert stdout.startswith("# imgpack bench --quick")
    assert "## Transfer" not in stdout and "## Where to convert" not in stdout
    assert f"- transfer: all: {TRANSFER_ON_CPU}" in stdout
    assert "0 points, expected to take about" in stderr


def test_transfer_tables_from_a_cuda_result(tmp_path: Path) -> None:
    """The transfer and conversion tables (a CUDA-only section) from a hand-made result."""
    point = {"image": "384x384", "batch": 8, "dtype": "uint8", "ms": 0.1}
    r = {
        "device": "cuda",
        "device_name": "Test GPU",
        "quick": True,
        "seconds": 1.0,
        "machine": {"cores": 4, "date": "2026-11-22", "torch": "x"},
        "grid": {"repeats": 3, "load_repeats": 3, "train_repeats": 3},
        "transfer": [
            {**point, "pinned": p, "series": f"uint8 {n}", "images_per_s": 8e4, "gb_per_s": 35.4}
            for p, n in ((True, "pinned"), (False, "pageable"))
        ],
        "conversion": [
            {**point, "to": "float16", "order": 0, "series": "x.cuda().half()"}
            | {"convert_on": "device", "images_per_s": 8e4}
        ],
        "loading": [],
        "training": [],
        "dataset": {},
        "skipped": [],
    }
    md = to_markdown(r)
    assert "| uint8 pinned | 80,000 (35.4) |" in md and "| x.cuda().half() | 0.100 |" in md
    assert [f.name for f in plot_bench(r, tmp_path)] == ["transfer.png", "conversion.png"]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (
            ["--only", "transfer,gpu"],
            "Error: --only must be some of transfer, loading, training; got gpu",
        ),
        (["--device", "tpu"], "Error: --device must be auto, cpu, cuda or cuda:N, not 'tpu'"),
        (["--source", "/no/such/dir"], "Error: /no/such/dir: --source must be a folder of images"),
    ],
)
def test_bad_options_exit_2(args: list[str], error: str) -> None:
    code, _, stderr = run("--quick", *args)
    assert code == 2
    assert stderr.strip().splitlines()[-1] == error


def test_out_must_be_a_folder(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    code, _, stderr = run("--quick", "--device", "cpu", "--out", str(f))
    assert code == 2 and f"Error: {f}: --out must be a folder" in stderr


@pytest.mark.parametrize("under", ["file/sub", "file/sub/deeper"])
def test_out_under_a_file_is_refused_before_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, under: str
) -> None:
    import packer.measure.bench

    def never(*a, **k):
        raise AssertionError("the bench ran")

    monkeypatch.setattr(packer.measure.bench, "run_bench", never)
    (tmp_path / "file").write_text("x")
    code, _, stderr = run("--quick", "--device", "cpu", "--out", str(tmp_path / under))
    assert code == 2 and "Traceback" not in stderr
    assert stderr.strip().splitlines() == [
        f"Error: {tmp_path / 'file'}: is a file, so --out {tmp_path / under} cannot be "
        "written under it"
    ]


def test_source_without_images(tmp_path: Path) -> None:
    (tmp_path / "empty" / "a").mkdir(parents=True)
    code, _, stderr = run(
        "--quick",
        "--device",
        "cpu",
        "--only",
        "loading",
        "--source",
        str(tmp_path / "empty"),
        "--out",
        str(tmp_path / "o"),
    )
    assert code == 2 and "no image" in stderr.lower(), stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests the no-CUDA message")
def test_cuda_without_gpu() -> None:
    code, _, stderr = run("--quick", "--device", "cuda")
    assert code == 2
    assert "Error: --device cuda, but torch sees no CUDA device" in stderr


def test_plots_and_table_cover_training(tmp_path: Path) -> None:
    """The training chart and table (a CUDA-only section) from a hand-made result."""
    base = {
        "device": "cuda",
        "device_name": "Test GPU",
        "quick": False,
        "seconds": 1.0,
        "machine": {"cores": 4, "date": "2026-11-22", "torch": "x"},
        "grid": {"repeats": 3, "load_repeats": 3, "train_repeats": 3},
        "transfer": [],
        "conversion": [],
        "loading": [],
        "dataset": {},
        "skipped": [],
    }
    base["training"] = [
        {
            "loader": "batches already on the GPU (ceiling)",
            "batch": 256,
            "images_per_s": 1000.0,
            "of_ceiling": 1.0,
        },
        {
            "loader": "pack to cuda (PackLoader)",
            "batch": 256,
            "images_per_s": 990.0,
            "of_ceiling": 0.99,
        },
    ]
    files = plot_bench(base, tmp_path)
    assert [f.name for f in files] == ["training.png"]
    assert files[0].read_bytes()[:8] == PNG
    md = to_markdown(base)
    assert "| pack to cuda (PackLoader) | 990 | 99.0% |" in md


def test_point_count_matches_the_grid() -> None:
    cfg = BenchConfig(quick=True, device="cpu")
    # loading 2 batches x 3 loaders; no transfer or training on the CPU
    assert count_points(cfg, cuda=False) == 6
    # with CUDA: transfer 2x2x(6 + 4) with pinned series, a 4th loader, and training
    assert count_points(cfg, cuda=True) == 2 * 2 * (6 + 4) + 2 * 4 + 4


def test_time_call_runs_warmup_then_equal_repeats() -> None:
    calls = []
    sec = time_call(lambda: calls.append(1), torch.device("cpu"), repeats=5, target_s=0.0)
    assert sec > 0
    assert len(calls) == 2 + 5  # target 0: one call per repeat


def test_median_rate_calls_the_barrier_around_every_run() -> None:
    events = []
    rate = median_rate(
        lambda: events.append("work") or 10,
        torch.device("cpu"),
        repeats=3,
        barrier=lambda: events.append("barrier"),
    )
    assert rate > 0
    assert events == ["barrier", "work", "barrier"] * 3


@pytest.mark.cuda
def test_quick_cuda_measures_pinned_and_training(tmp_path: Path) -> None:
    code, stdout, stderr = run(
        "--quick", "--device", "cuda", "--out", str(tmp_path), "--json", "-q"
    )
    assert code == 0, stdout + stderr
    r = json.loads(stdout)
    assert {p["pinned"] for p in r["transfer"]} == {True, False}
    assert any(p["loader"].startswith("pack to cuda") for p in r["loading"])
    names = [p["loader"] for p in r["training"]]
    assert names[0].startswith("batches already on the GPU"), names
    # the compressed folder needs ffmpeg: the GPU machine's environment may lack
    # imageio-ffmpeg's binary, and the bench then says why that folder is left out
    left = [s["reason"] for s in r["skipped"] if s["what"] == "compressed folder"]
    try:
        ffmpeg_exe()
        assert len(names) == 4 and not left, (names, left)
    except FFmpegError:
        assert len(names) == 3 and "no ffmpeg binary found" in left[0], (names, left)
    assert all(p["images_per_s"] > 0 for p in r["training"])
    assert (tmp_path / "training.png").read_bytes()[:8] == PNG


def test_interrupt_exits_130_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import packer.measure.bench

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(packer.measure.bench, "run_bench", interrupted)
    code, _, stderr = run("--quick", "--device", "cpu", "--out", str(tmp_path / "o"))
    assert code == 130
    assert "Interrupted. No results written" in stderr and "resume" not in stderr
    assert not (tmp_path / "o").exists()


def test_free_memory_counts_reclaimable_cache(tmp_path: Path) -> None:
    """MemAvailable, not MemFree: a full page cache must not shrink the batch grid."""
    from packer.measure.bench.config import _free_memory

    info = tmp_path / "meminfo"
    info.write_text("MemTotal: 16000000 kB\nMemFree: 100 kB\nMemAvailable: 12000000 kB\n")
    assert _free_memory(str(info)) == 12000000 * 1024
    # no such file (not Linux): falls back to the page count, never raises
    got = _free_memory(str(tmp_path / "missing"))
    assert got is None or got > 0


def test_sigterm_during_bench_removes_its_temporary_folder(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = _start(
        ["bench", "--quick", "--device", "cpu", "--only", "loading", "--out", tmp_path / "b"],
        TMPDIR=str(tmp),
    )
    # signal once the temporary images folder exists (the bench is making them)
    _stderr_until(proc, "points, expected to take")
    while not any(p.name.startswith("imgpack-bench-") for p in tmp.iterdir()):
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.01)  # polling for the folder, not timing a race
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Interrupted. No results written" in err and "Traceback" not in err
    assert [p.name for p in tmp.iterdir() if p.name.startswith("imgpack-bench-")] == []
    assert not (tmp_path / "b").exists()


def test_bench_source_reports_broken_inputs_by_the_users_names(src: Path, tmp_path: Path):
    (src / "cat" / "broken.jpg").write_bytes(b"not a jpeg")
    (src / "dog" / "empty.png").write_bytes(b"")
    code, out, err = _cli(
        "bench",
        "--quick",
        "--device",
        "cpu",
        "--only",
        "loading",
        "--workers",
        "1",
        "--source",
        src,
        "--out",
        tmp_path / "b",
        "--json",
        "-q",
    )
    assert code == 0, err
    r = json.loads(out)
    assert r["dataset"]["images"] == 3  # usable images only
    assert sorted(s["path"] for s in r["dataset"]["skipped_inputs"]) == [
        "cat/broken.jpg",
        "dog/empty.png",
    ]
    assert {s["what"] for s in r["skipped"]} >= {"input cat/broken.jpg", "input dog/empty.png"}
    assert "imgpack-bench-" not in out and "/i0000" not in out


def test_bench_source_all_broken_names_the_users_folder(tmp_path: Path) -> None:
    (tmp_path / "bad" / "a").mkdir(parents=True)
    (tmp_path / "bad" / "a" / "x.jpg").write_bytes(b"junk")
    code, _, err = _cli(
        "bench",
        "--quick",
        "--device",
        "cpu",
        "--only",
        "loading",
        "--workers",
        "1",
        "--source",
        tmp_path / "bad",
        "--out",
        tmp_path / "b",
        "-q",
    )
    line = _one_error(err)
    assert code in (1, 2) and line.startswith(f"Error: {tmp_path / 'bad'}:")
    assert "a/x.jpg" in line and "imgpack-bench-" not in line and "i000000" not in line
    assert not (tmp_path / "b").exists()


def test_bench_out_with_the_users_files_is_refused_and_a_previous_run_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses

    import packer.measure.bench
    from packer.measure.bench import BenchConfig, BenchResult

    ran: list[int] = []

    def tiny_run(*args: object, **kwargs: object) -> BenchResult:  # what is measured is moot
        ran.append(1)
        machine = {"cores": 1, "torch": "x", "python": "x", "cpu": "x", "date": "x"}
        grid = {**dataclasses.asdict(BenchConfig(quick=True).grid), "workers": 1}
        return BenchResult(device="cpu", device_name="CPU", quick=True, machine=machine, grid=grid)

    monkeypatch.setattr(packer.measure.bench, "run_bench", tiny_run)
    out = tmp_path / "b"
    out.mkdir()
    (out / "results.md").write_text("mine")  # a bench name, but beside a foreign file
    (out / "notes.txt").write_text("mine")
    args = ("bench", "--quick", "--device", "cpu", "--only", "transfer", "-q", "--out", out)
    code, _, err = _cli(*args)
    assert code == 2 and "notes.txt" in _one_error(err) and "--out" in err
    assert (out / "results.md").read_text() == "mine"
    (out / "notes.txt").unlink()
    (out / "sub").mkdir()
    assert _cli(*args)[0] == 2  # a folder is not a bench output either
    (out / "sub").rmdir()
    code, _, err = _cli(*args)  # only a previous run's names: replaced
    assert code == 0, err
    assert (out / "results.md").read_text() != "mine" and (out / "results.json").is_file()
    assert _cli(*args)[0] == 0  # and rerun into its own results
    assert len(ran) == 2  # the refusals came before any work
