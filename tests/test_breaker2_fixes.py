"""Regression tests for the second adversarial round (issue 16's standard): odd names,
symlinked destinations, compress nesting, signals, hostile JSON, huge sizes, bad paths."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import packer
from conftest import cli_build as _build
from conftest import cli_run as _cli
from conftest import one_error as _one_error
from conftest import subprocess_env, write_image

# ---------------------------------------------------------------- 1. odd names


@pytest.mark.parametrize("name", ["x\\y.png", "..\\..\\up.png", "c:x.png", "..x.png", "tail\\.png"])
def test_backslash_and_odd_names_build_load_info_verify(src: Path, tmp_path: Path, name: str):
    write_image(src / "cat" / name, (12, 10), seed=7)
    code, _, err = _build(src, tmp_path / "pk")
    assert code == 0, err
    pack = packer.load(tmp_path / "pk")
    assert f"cat/{name}" in pack.sources and len(pack) == 4
    code, out, err = _cli("info", tmp_path / "pk", "--json")
    assert code == 0, err
    code, out, err = _cli(
        "verify", tmp_path / "pk", "--source", src, "--sample", "all", "--no-speed", "-q"
    )
    assert code == 0, out + err
    assert "4 source images re-decoded" in out, out


@pytest.mark.parametrize(
    "bad", ["/etc/passwd", "../x.png", "cat/../../x.png", "", "a\x00b", "cat/..", 5]
)
def test_sources_that_leave_the_root_are_still_refused(bad: object) -> None:
    from packer.pack.format import _source_ok

    assert not _source_ok(bad)
    assert _source_ok("cat/x\\..\\y.png")  # one POSIX name: stays under the root


# ---------------------------------------------------------------- 2, 3. symlinked DST


def _beside(tmp_path: Path) -> set[str]:
    return {p.name for p in tmp_path.iterdir()}


def test_dst_symlink_to_an_empty_folder_is_refused_up_front(src: Path, tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    before = _beside(tmp_path)
    for _ in range(2):  # and the rerun is refused the same way, nothing wedged
        code, _, err = _build(src, tmp_path / "link")
        assert code == 2
        line = _one_error(err)
        assert "is a symbolic link; give the real folder" in line and "real" in line
        assert _beside(tmp_path) == before and not any((tmp_path / "real").iterdir())
    code, _, err = _build(src, tmp_path / "real")  # the real folder works
    assert code == 0, err
    assert len(packer.load(tmp_path / "real")) == 3


@pytest.mark.parametrize("target", ["pack", "missing"])
def test_dst_symlink_with_overwrite_is_refused_and_link_kept(
    src: Path, tmp_path: Path, target: str
) -> None:
    assert _build(src, tmp_path / "pack")[0] == 0
    (tmp_path / "lp").symlink_to(target)
    before = _beside(tmp_path)
    code, _, err = _build(src, tmp_path / "lp", "--overwrite")
    assert code == 2 and "is a symbolic link" in _one_error(err)
    assert _beside(tmp_path) == before and (tmp_path / "lp").is_symlink()
    assert len(packer.load(tmp_path / "pack")) == 3


def test_library_build_refuses_symlinked_dst(src: Path, tmp_path: Path) -> None:
    from packer.build.run import BuildConfig, build
    from packer.errors import InputError

    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    with pytest.raises(InputError, match="symbolic link"):
        build(src, tmp_path / "link", BuildConfig(size=(8, 6), workers=1))
    assert not any((tmp_path / "real").iterdir())


def test_leftover_old_pack_that_is_a_symlink_does_not_wedge_overwrite(
    src: Path, tmp_path: Path
) -> None:
    # what an older imgpack left after `--overwrite` onto a linked DST: the new pack
    # at DST and the user's link moved aside as .DST.imgpack-old
    assert _build(src, tmp_path / "rp")[0] == 0
    assert _build(src, tmp_path / "dst")[0] == 0
    (tmp_path / ".dst.imgpack-old").symlink_to("rp")
    for _ in range(2):
        code, _, err = _build(src, tmp_path / "dst", "--overwrite")
        assert code == 0, err
    assert not (tmp_path / ".dst.imgpack-old").is_symlink()
    assert len(packer.load(tmp_path / "rp")) == 3  # the link's target is untouched
    # a link left aside with no DST is put back (the swap never finished)
    (tmp_path / "gone").symlink_to("rp")
    (tmp_path / "gone").rename(tmp_path / ".gone.imgpack-old")
    from packer.build.workdir import recover_trash

    recover_trash(tmp_path / "gone")
    assert (tmp_path / "gone").is_symlink() and not (tmp_path / ".gone.imgpack-old").exists()


# ---------------------------------------------------------------- 6. deep JSON

DEEP = "[" * 100_000


def test_compress_with_a_deeply_nested_options_record_redoes_instead_of_crashing(
    src: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    assert _cli("compress", src, out, "-q")[0] == 0
    (out / ".imgpack-compress.json").write_text(DEEP)
    code, _, err = _cli("compress", src, out, "-q", "--json")
    assert code == 0 and "Traceback" not in err, err
    assert json.loads((out / ".imgpack-compress.json").read_text())["quality"] == 3


@pytest.mark.parametrize("name", ["plan.json", "journal.jsonl"])
def test_work_folder_files_nested_deeply_are_discarded(tmp_path: Path, name: str) -> None:
    from packer.build.workdir import prepare_work_dir, read_journal

    work = tmp_path / "w"
    work.mkdir()
    (work / name).write_text(DEEP + "\n")
    assert read_journal(work / "journal.jsonl") == {}
    state = prepare_work_dir(work, "fp", 16)
    assert state.done == {} and not state.assembled


def test_every_json_reader_shares_the_guard() -> None:
    # the class of problem: any json.loads on a file imgpack reads back
    import re

    root = Path(packer.__file__).parent
    for path in sorted(root.rglob("*.py")):
        mod = path.relative_to(root).as_posix()
        calls = re.findall(r"json\.loads?\(", path.read_text())
        allowed = 1 if mod == "pack/format.py" else 0  # loads_json itself
        assert len(calls) == allowed, (mod, calls)


# ---------------------------------------------------------------- 7. huge sizes


def test_transform_sizes_are_bounded_up_front() -> None:
    import torch

    from packer import transforms as T

    huge = 10**6
    for make in (
        lambda: T.RandomResizedCrop(huge),
        lambda: T.Resize(huge),
        lambda: T.CenterCrop(huge),
        lambda: T.Resize((8, T.MAX_SIDE + 1)),
        lambda: T.RandomResizedCrop(8).__setattr__("size", huge),
    ):
        with pytest.raises(ValueError, match="too large"):
            make()
    images = torch.zeros(1, 3, 4, 4, dtype=torch.uint8)
    boxes = torch.tensor([[0, 0, 4, 4]])
    with pytest.raises(ValueError, match="too large"):
        T.resized_crop(images, boxes, size=huge)
    # an int Resize whose longer side would exceed the bound (a 1x40 strip to 1000 short)
    strip = torch.zeros(1, 3, 1, 40, dtype=torch.uint8)
    with pytest.raises(ValueError, match="too large"):
        T.Resize(1000)(strip)
    assert T.Resize(T.MAX_SIDE).size == T.MAX_SIDE  # the bound itself is allowed
    assert T.resized_crop(images, boxes, size=(2, 3)).shape == (1, 3, 2, 3)


# ---------------------------------------------------------------- 8. verify --source


def test_verify_source_missing_or_a_file_is_bad_usage(src: Path, tmp_path: Path) -> None:
    assert _build(src, tmp_path / "pk")[0] == 0
    (tmp_path / "f.txt").write_text("x")
    for bad, what in ((tmp_path / "nonexist", "no such folder"), (tmp_path / "f.txt", "a file")):
        code, out, err = _cli("verify", tmp_path / "pk", "--source", bad, "--no-speed", "-q")
        assert code == 2, out + err
        line = _one_error(err)
        assert line.startswith(f"Error: {bad}: --source must be a folder") and what in line
    # the folder recorded at build time gone is not the user's mistake: no error
    src.rename(tmp_path / "moved")
    assert _cli("verify", tmp_path / "pk", "--no-speed", "-q")[0] == 0


# ---------------------------------------------------------------- 4. compress nesting


@pytest.mark.parametrize("dst_rel", ["real/out", "real", "real/deeper/out", "holder/s/out"])
def test_compress_into_a_folder_src_reaches_through_a_link_is_refused(
    tmp_path: Path, dst_rel: str
) -> None:
    for i in range(2):
        write_image(tmp_path / "real" / f"{i}.png", (12, 10), seed=i)
    (tmp_path / "holder").mkdir()
    (tmp_path / "holder" / "s").symlink_to("../real")
    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "real").rglob("*"))
    for _ in range(2):
        code, _, err = _cli("compress", tmp_path / "holder", tmp_path / dst_rel, "-q")
        assert code == 2, err
        line = _one_error(err)
        assert "through a symbolic link" in line or "inside the source" in line
    after = sorted(p.relative_to(tmp_path) for p in (tmp_path / "real").rglob("*"))
    assert after == before  # nothing written, nothing nested


def test_compress_beside_a_linked_source_still_works(tmp_path: Path) -> None:
    write_image(tmp_path / "real" / "0.png", (12, 10))
    (tmp_path / "holder").mkdir()
    (tmp_path / "holder" / "s").symlink_to("../real")
    code, _, err = _cli("compress", tmp_path / "holder", tmp_path / "out", "-q")
    assert code == 0, err
    assert [
        p.relative_to(tmp_path / "out").parts[0] for p in (tmp_path / "out").rglob("*.jpg")
    ] == ["s"]


def test_compress_quiet_prints_nothing_for_a_symlink_loop(tmp_path: Path) -> None:
    write_image(tmp_path / "src" / "a" / "0.png", (12, 10))
    (tmp_path / "src" / "a" / "loop").symlink_to("..")
    r = subprocess.run(
        [sys.executable, "-m", "packer", "compress", tmp_path / "src", tmp_path / "out", "-q"],
        capture_output=True,
        text=True,
        env=subprocess_env(),
    )
    assert r.returncode == 0 and r.stderr == "", r.stderr


# ---------------------------------------------------------------- 5. SIGTERM, --trace


def _start(args: list[object], **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "packer", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(**env),
    )


def _stderr_until(proc: subprocess.Popen[str], needle: str) -> str:
    """Read the child's stderr until a line holds ``needle`` (the child is then busy)."""
    seen = ""
    assert proc.stderr is not None
    for line in proc.stderr:
        seen += line
        if needle in line:
            return seen
    raise AssertionError(f"{needle!r} never came; stderr: {seen}")


def test_sigterm_during_verify_is_like_ctrl_c_and_leaves_no_trace(
    src: Path, tmp_path: Path
) -> None:
    assert _build(src, tmp_path / "pk")[0] == 0
    trace = tmp_path / "t.json"
    # enough timed batches that the run is still timing when the signal comes
    proc = _start(
        [
            "verify",
            tmp_path / "pk",
            "--device",
            "cpu",
            "--no-source",
            "--batches",
            10**6,
            "--trace",
            trace,
        ]
    )
    seen = _stderr_until(proc, "timing the pack")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    err = seen + err
    assert proc.returncode == 130, err
    assert "Interrupted. Nothing was changed" in err and "resume" not in err
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pk", "src"]


def test_trace_is_written_whole_or_not_at_all(tmp_path: Path) -> None:
    from packer.measure.verify import _export_trace

    class Prof:
        def __init__(self, fail: bool) -> None:
            self.fail = fail

        def export_chrome_trace(self, path: str) -> None:
            Path(path).write_text('{"traceEvents": [')  # half written
            if self.fail:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _export_trace(Prof(True), tmp_path / "t.json")
    assert list(tmp_path.iterdir()) == []
    _export_trace(Prof(False), tmp_path / "t.json.gz")  # the name keeps its suffix
    assert [p.name for p in tmp_path.iterdir()] == ["t.json.gz"]


def test_verify_trace_on_cpu_is_quiet(src: Path, tmp_path: Path) -> None:
    assert _build(src, tmp_path / "pk")[0] == 0
    env = {k: v for k, v in subprocess_env().items() if k != "KINETO_LOG_LEVEL"}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "packer",
            "verify",
            tmp_path / "pk",
            "--device",
            "cpu",
            "--no-source",
            "--batches",
            "1",
            "-q",
            "--json",
            "--trace",
            tmp_path / "t.json",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert r.stderr == "" and json.loads((tmp_path / "t.json").read_text())


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


# ---------------------------------------------------------------- 9. bench --source


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


# ---------------------------------------------------------------- 10. bench --out


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
