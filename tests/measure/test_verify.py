from __future__ import annotations

import json
import shutil
import signal
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import cli_build as _build
from conftest import cli_run as _cli
from conftest import one_error as _one_error
from conftest import start_cli as _start
from conftest import stderr_until as _stderr_until
from conftest import subprocess_env, write_image
from helpers.forked import run_cli
from packer.cli import cli
from packer.errors import PackFormatError, UsageError
from packer.measure.verify import VerifyConfig, verify

NO_SPEED = VerifyConfig(throughput=False, sample=None)


def failed(report) -> dict[str, str]:
    return {c["name"]: c["detail"] for c in report.checks if not c["ok"]}


def test_good_pack_passes(packed: Path) -> None:
    r = verify(packed, NO_SPEED)
    assert r.ok and [c["name"] for c in r.checks][-1] == "sources"


def test_flipped_byte_is_found_and_located(packed: Path) -> None:
    data = packed / "_tensordict" / "images.memmap"
    b = bytearray(data.read_bytes())
    row = 3 * 24 * 32
    b[5 * row + 100] ^= 0x01  # image 5
    data.write_bytes(bytes(b))
    r = verify(packed, VerifyConfig(throughput=False, source=None, use_recorded_source=False))
    assert not r.ok
    assert "block 5 (images 5-5: dog/g.webp)" in failed(r)["images"]


def test_truncated_data_file(packed: Path) -> None:
    data = packed / "_tensordict" / "images.memmap"
    data.write_bytes(data.read_bytes()[:-10])
    r = verify(packed, NO_SPEED)
    assert "is 29,942 bytes, the manifest says 29,952" in failed(r)["files"]


def test_deleted_and_edited_sources_named(packed: Path, image_tree: Path) -> None:
    (image_tree / "cat" / "a.jpg").unlink()
    write_image(image_tree / "dog" / "e.jpg", (64, 64), seed=99)
    r = verify(packed, NO_SPEED)
    detail = failed(r)["sources"]
    assert "1 missing: cat/a.jpg" in detail and "1 changed since the build: dog/e.jpg" in detail


def test_manifest_that_disagrees_with_data(packed: Path) -> None:
    m = json.loads((packed / "imgpack.json").read_text())
    m["count"] = 12
    m["sources"] = m["sources"][:12]
    m["source_sizes"] = m["source_sizes"][:12]
    m["label_shape"] = [12]  # a consistent manifest, whose data files are the wrong size
    (packed / "imgpack.json").write_text(json.dumps(m))
    r = verify(packed, NO_SPEED)
    assert "the manifest says" in failed(r)["files"]


def test_label_out_of_range(packed: Path) -> None:
    import numpy as np

    lab = packed / "_tensordict" / "labels.memmap"
    a = np.frombuffer(lab.read_bytes(), "<i8").copy()
    a[2] = 9
    lab.write_bytes(a.tobytes())
    r = verify(packed, NO_SPEED)
    assert "checksum mismatch" in failed(r)["labels"] and "outside [-1, 2]" in failed(r)["labels"]


def test_missing_source_folder(packed: Path, image_tree: Path) -> None:
    shutil.rmtree(image_tree)
    # a folder the caller names that is not there is bad usage, before any work
    with pytest.raises(UsageError, match=r"VerifyConfig\.source must be a folder"):
        verify(packed, VerifyConfig(throughput=False, source=image_tree))


def test_a_folder_that_is_no_pack_is_bad_input_not_a_failed_check(
    packed: Path, image_tree: Path
) -> None:
    with pytest.raises(PackFormatError, match=r"imgs: not an imgpack pack \(imgpack.json is"):
        verify(image_tree, NO_SPEED)
    (packed / "imgpack.json").write_text("{not json")
    r = verify(packed, NO_SPEED)  # a pack whose manifest is damaged: a failed check
    assert not r.ok and "manifest" in failed(r)
    assert CliRunner().invoke(cli, ["verify", str(packed), "--no-speed"]).exit_code == 1


def test_throughput_passes_name_their_epochs(packed: Path, tmp_path: Path) -> None:
    """The timing crosses passes (13 images, 4 a batch) and the trace adds one: each
    names its epoch, so PackLoader's warning for a loop without set_epoch stays quiet."""
    config = VerifyConfig(
        sample=0, device="cpu", batch_size=4, batches=4, use_recorded_source=False
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="PackLoader")
        r = verify(packed, config, trace=tmp_path / "t.json")
    assert r.ok and r.pack_images_per_s > 0


def test_cli_exit_1_names_the_problem(packed: Path) -> None:
    data = packed / "_tensordict" / "images.memmap"
    b = bytearray(data.read_bytes())
    b[-1] ^= 0xFF
    data.write_bytes(bytes(b))
    r = CliRunner().invoke(cli, ["verify", str(packed), "--no-speed"])
    assert r.exit_code == 1
    assert "FAIL  images    checksum mismatch in 1 of 13 blocks: block 12" in r.output


def test_plot_is_written(packed: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "v.png"
    r = CliRunner().invoke(
        cli,
        [
            "verify",
            str(packed),
            "--device",
            "cpu",
            "--batch-size",
            "4",
            "--batches",
            "1",
            "--plot",
            str(png),
        ],
    )
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_folder_baseline_times_only_the_packed_images(image_tree: Path, tmp_path: Path) -> None:
    from packer.builder.run import BuildConfig, build

    (image_tree / "cat" / "empty.jpg").write_bytes(b"")
    (image_tree / "dog" / "trunc.jpg").write_bytes(
        (image_tree / "cat" / "a.jpg").read_bytes()[:200]
    )
    (image_tree / "zebra" / "text.png").write_text("not a png")
    pack = tmp_path / "p"
    assert len(build(image_tree, pack, BuildConfig(size=(16, 16), workers=1)).skipped) == 3
    (image_tree / "zebra" / "i.jpg").unlink()  # and one source gone since the build
    # every batch of 4 from 13 files: the broken ones would be met within an epoch
    cfg = VerifyConfig(device="cpu", batch_size=4, batches=4, repeats=1, workers=0, sample=0)
    r = verify(pack, cfg)
    assert r.folder_images_per_s and r.folder_images_per_s > 0
    assert r.folder_left_out == 4 and r.folder_skipped == 3
    assert r.to_json()["folder_left_out"] == 4


def test_cli_verify_says_what_the_baseline_left_out(image_tree: Path, tmp_path: Path) -> None:
    from packer.builder.run import BuildConfig, build

    (image_tree / "cat" / "empty.jpg").write_bytes(b"")
    build(image_tree, tmp_path / "p", BuildConfig(size=(16, 16), workers=1))
    r = CliRunner().invoke(
        cli, ["verify", str(tmp_path / "p"), "--device", "cpu", "--batch-size", "4", "-q"]
    )
    assert r.exit_code == 0, r.output
    assert "left out 1 the build skipped, 0 missing" in r.stdout


def test_parallel_checks_report_progress_and_find_the_same(packed: Path) -> None:
    data = packed / "_tensordict" / "images.memmap"
    b = bytearray(data.read_bytes())
    b[3 * 3 * 24 * 32] ^= 0xFF  # image 3
    data.write_bytes(bytes(b))
    seen: list[int] = []
    started: list[tuple[int, int]] = []
    r = verify(packed, NO_SPEED, progress=seen.append, on_start=lambda t, d: started.append((t, d)))
    assert started == [(13 + 13, 0)] and sum(seen) == 26
    assert failed(r)["images"].startswith("checksum mismatch in 1 of 13 blocks: block 3 ")
    assert "1 changed since the build: cat/d.jpeg" in failed(r)["sources"]


def test_source_broken_since_the_build_leaves_the_baseline_untimed(
    packed: Path, image_tree: Path
) -> None:
    (image_tree / "zebra" / "i.jpg").write_bytes(b"garbage")  # outside the sample of 0
    cfg = VerifyConfig(device="cpu", batch_size=4, batches=4, repeats=1, workers=0, sample=0)
    r = verify(packed, cfg)
    assert r.ok and r.pack_images_per_s and r.pack_images_per_s > 0
    assert r.folder_images_per_s is None and r.folder_left_out == 0


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


@pytest.mark.slow
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


@pytest.mark.slow
def test_verify_trace_on_cpu_is_quiet(src: Path, tmp_path: Path) -> None:
    """No line on stderr from the profiler's C++ side (kineto) on a CPU-only trace: the
    command sets its log level before the profiler's first use. In a fork of the
    zygote (tests/helpers/forked.py; no fresh import of torch), whose profiler was never
    used, as a fresh interpreter's: this process's tests may have used it already."""
    assert _build(src, tmp_path / "pk")[0] == 0
    env = {k: v for k, v in subprocess_env().items() if k != "KINETO_LOG_LEVEL"}
    args = ["verify", tmp_path / "pk", "--device", "cpu", "--no-source", "--batches", "1",
            "-q", "--json", "--trace", tmp_path / "t.json"]  # fmt: skip
    r = run_cli(args, env=env, zygote=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stderr == "" and json.loads((tmp_path / "t.json").read_text())


def _point_sources(pack: Path, root: str, sources: dict[int, str]) -> None:
    m = json.loads((pack / "imgpack.json").read_text())
    m["build"]["source_root"] = root
    for i, rel in sources.items():
        m["sources"][i] = rel
    (pack / "imgpack.json").write_text(json.dumps(m))


@pytest.mark.parametrize("store", ["raw", "jpeg"])
def test_a_hostile_manifest_never_makes_verify_read_outside_the_source_images(
    image_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store: str
) -> None:
    """``build.source_root`` set to ``/`` and sources such as ``proc/self/environ``: only
    regular image files under the source folder are read (links not followed out of
    it, no device, FIFO or /proc file), and the others are named in the report."""
    import os

    import packer.imaging.decode
    from packer.builder import BuildConfig, build

    pack = tmp_path / "p"
    build(image_tree, pack, BuildConfig(size=(16, 16), workers=1, store=store))
    opened: list[str] = []
    real_open = packer.imaging.decode.open_regular

    def spy(path):
        opened.append(str(path))
        return real_open(path)

    monkeypatch.setattr(packer.imaging.decode, "open_regular", spy)
    as_built = (pack / "imgpack.json").read_text()
    _point_sources(pack, "/", {0: "proc/self/environ", 1: "dev/zero", 2: "etc/passwd"})
    r = verify(pack, NO_SPEED)
    detail = failed(r)["sources"]
    assert "3 not read, not regular image files: proc/self/environ (not an image file name)" in (
        detail
    )
    assert not any(p.startswith(("/proc", "/dev", "/etc")) for p in opened), opened
    # under a real source folder: a FIFO and a device link named like images, a link
    # leading out of the folder (its target a copy of the image: not followed all the same)
    cfg = VerifyConfig(source=image_tree, throughput=False, sample=None)
    outside = tmp_path / "elsewhere.jpg"
    shutil.copy(image_tree / "cat" / "a.jpg", outside)
    (image_tree / "cat" / "a.jpg").unlink()
    (image_tree / "cat" / "a.jpg").symlink_to(outside)
    (image_tree / "dog" / "e.jpg").unlink()
    os.mkfifo(image_tree / "dog" / "e.jpg")
    (image_tree / "zebra" / "i.jpg").unlink()
    (image_tree / "zebra" / "i.jpg").symlink_to("/dev/zero")
    opened.clear()
    (pack / "imgpack.json").write_text(as_built)
    r = verify(pack, cfg)
    detail = failed(r)["sources"]
    assert "1 not read, not regular image files: dog/e.jpg (not a regular file (a FIFO))" in (
        detail
    )
    out = "2 not checked, a link leading outside the source folder: cat/a.jpg, zebra/i.jpg"
    assert out in detail
    assert "missing" not in detail and "changed" not in detail
    assert len(opened) == 10 and not any(
        p.endswith(("e.jpg", "i.jpg", "elsewhere.jpg", "/a.jpg")) for p in opened
    ), opened


def test_links_inside_the_source_folder_are_followed(packed: Path, image_tree: Path) -> None:
    real = image_tree / "cat" / "a.jpg"
    moved = image_tree / "cat" / "kept" / "a.jpg"
    moved.parent.mkdir()
    real.rename(moved)
    real.symlink_to(moved)
    r = verify(packed, NO_SPEED)
    assert r.ok, failed(r)


def _flip_last_byte(pack: Path) -> None:
    data = pack / "_tensordict" / "images.memmap"
    b = bytearray(data.read_bytes())
    b[-1] ^= 0xFF
    data.write_bytes(bytes(b))


@pytest.mark.parametrize(
    ("device", "gpus", "says"),
    [
        ("cuda", 0, "VerifyConfig.device cuda, but torch sees no CUDA device"),
        ("cuda:0", 0, "VerifyConfig.device cuda:0, but torch sees no CUDA device"),
        (
            "cuda:3",
            1,
            r"VerifyConfig.device cuda:3, but torch sees 1 CUDA device \(cuda:0 to cuda:0\)",
        ),
    ],
)
def test_a_device_this_process_lacks_is_refused_before_the_integrity_pass(
    packed: Path, monkeypatch: pytest.MonkeyPatch, device: str, gpus: int, says: str
) -> None:
    """Issue 43: the device is checked first (exit 2, one line), not after every block
    was hashed; a damaged pack shows it (the integrity pass would end in a FAIL, exit 1,
    and never reach the device)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    _flip_last_byte(packed)
    started: list[int] = []
    with pytest.raises(UsageError, match=says):
        verify(packed, VerifyConfig(device=device), on_start=lambda total, done: started.append(1))
    assert started == []
    code, out, err = _cli("verify", packed, "--device", device)
    assert code == 2 and out == ""
    assert _one_error(err).startswith(f"Error: --device {device}")


def test_no_speed_needs_no_device(packed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--no-speed streams nothing, so the device it names is not used nor refused."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert verify(packed, VerifyConfig(device="cuda", throughput=False)).ok


def test_a_jpeg_pack_is_described_as_stored_jpegs(image_tree: Path, tmp_path: Path) -> None:
    """Issue 43: the first line of verify on a JPEG pack says what it holds (stored
    JPEGs of their own sizes, decoded when read), not a raw pack's fixed shape."""
    from packer.builder.run import BuildConfig, build

    pack = tmp_path / "jp"
    build(image_tree, pack, BuildConfig(workers=1, store="jpeg", max_side=64))
    first = verify(pack, NO_SPEED).checks[0]
    assert first["name"] == "manifest"
    assert "images of [" not in first["detail"]
    assert first["detail"] == (
        "format 1, 13 stored JPEGs (each its own size, up to 64 wide x 64 high, "
        "max side 64), decoded when read"
    )
    code, out, _ = _cli("verify", pack, "--no-speed", "-q")
    assert code == 0 and out.splitlines()[0].endswith("decoded when read")
