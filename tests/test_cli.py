from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from conftest import subprocess_env
from packer.builder.api import BuildConfig, build
from packer.builder.run import work_dir_for
from packer.cli import cli


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.mark.parametrize("command", ["bench", "build", "compress", "info", "show", "verify"])
def test_every_command_has_help_with_examples(runner: CliRunner, command: str) -> None:
    ctx = click.Context(cli)
    assert cli.list_commands(ctx) == ["bench", "build", "compress", "info", "show", "verify"]
    r = runner.invoke(cli, [command, "--help"])
    assert r.exit_code == 0
    cmd = cli.get_command(ctx, command)
    assert cmd is not None and cmd.help and "Examples:" in r.output


def test_build_json_and_info_json(runner: CliRunner, image_tree: Path, tmp_path: Path) -> None:
    dst = tmp_path / "p"
    r = runner.invoke(
        cli,
        ["build", str(image_tree), str(dst), "--size", "16x12", "--workers", "1", "--json", "-q"],
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["count"] == 13 and out["image_shape"] == [3, 12, 16]
    assert out["classes"] == ["cat", "dog", "zebra"] and out["skipped"] == []
    assert {"count", "skipped", "classes", "image_shape", "seconds"} <= out.keys()
    r = runner.invoke(cli, ["info", str(dst), "--json"])
    info = json.loads(r.stdout)
    assert info["class_counts"] == {"cat": 4, "dog": 4, "zebra": 5}
    assert info["bytes"] > 13 * 3 * 12 * 16
    assert {"count", "image_shape", "classes", "class_counts", "bytes", "skipped"} <= info.keys()


def test_build_says_where_its_class_map_came_from(
    runner: CliRunner, image_tree: Path, tmp_path: Path
) -> None:
    note = (
        f"classes: 3 inferred from the folders of {image_tree}; for a split that must match "
        "another pack's labels, pass --classes TRAIN_PACK"
    )
    args = ["build", str(image_tree), "--size", "8x6", "--workers", "1"]
    r = runner.invoke(cli, [*args, str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    assert r.stderr.strip().splitlines()[-1] == note
    r = runner.invoke(cli, [*args, str(tmp_path / "b"), "--json"])
    assert r.stderr.strip().splitlines()[-1] == note  # on stderr: stdout is the JSON alone
    assert json.loads(r.stdout)["classes_from"] == "folders"
    assert "classes:" not in runner.invoke(cli, [*args, str(tmp_path / "c"), "-q"]).stderr
    r = runner.invoke(cli, [*args, str(tmp_path / "d"), "--classes", str(tmp_path / "a")])
    assert r.exit_code == 0 and "classes:" not in r.stderr  # the map is pinned: no note
    r = runner.invoke(cli, [*args, str(tmp_path / "e"), "--classes", str(tmp_path / "a"), "--json"])
    assert json.loads(r.stdout)["classes_from"] == "classes" and "classes:" not in r.stderr
    flat = image_tree / "zebra"
    r = runner.invoke(cli, ["build", str(flat), str(tmp_path / "f"), "--size", "8x6", "--json"])
    assert json.loads(r.stdout)["classes_from"] is None and "classes:" not in r.stderr


def test_jpeg_build_summary_says_images_keep_their_sizes(
    runner: CliRunner, image_tree: Path, tmp_path: Path
) -> None:
    dst = tmp_path / "j"
    r = runner.invoke(
        cli, ["build", str(image_tree), str(dst), "--store", "jpeg", "--workers", "1"]
    )
    assert r.exit_code == 0, r.output
    assert (
        f"Packed 13 JPEG images (their own sizes, up to 100 wide x 75 high; decoded when read) "
        f"into {dst}" in r.stderr
    )
    assert "3x224x224" not in r.stderr  # --size plays no part in a JPEG pack


def test_build_help_gives_the_recipe_size_and_the_jpeg_store(runner: CliRunner) -> None:
    text = " ".join(runner.invoke(cli, ["build", "--help"]).output.split())
    assert "needs --size 256, cropped to 224 by the loader's transforms" in text
    assert "for RandomResizedCrop over the whole image, as torchvision trains" in text
    assert "--classes FIRST_PACK" in text


@pytest.mark.parametrize("command", ["compress", "build"])
@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["-q", "3"], "Error: unexpected extra argument '3'. "),
        (["--quiet", "5"], "Error: unexpected extra argument '5'. "),
        (["-q3"], "Error: no such option '-q3'. "),
    ],
)
def test_a_number_after_quiet_points_to_quality(
    runner: CliRunner, image_tree: Path, tmp_path: Path, command: str, args: list[str], line: str
) -> None:
    r = runner.invoke(cli, [command, str(image_tree), str(tmp_path / "out"), *args])
    number = line.split("'")[1].removeprefix("-q")
    assert r.exit_code == 2
    assert r.stderr.strip().splitlines()[-1] == (
        f"{line}Quality is --quality/-Q (e.g. -Q {number}); -q means --quiet."
    )
    assert not (tmp_path / "out").exists()
    r = runner.invoke(cli, [command, str(image_tree), str(tmp_path / "out"), "extra"])
    assert r.exit_code == 2  # other extra arguments keep click's own message
    last = r.stderr.strip().splitlines()[-1]
    if command == "build":  # build takes several SRC (parquet, tar shards): its own words
        assert last.startswith("Error: SRC: several paths are read as parquet, Arrow, tar")
    else:
        assert last == "Error: Got unexpected extra argument (extra)"


def test_strict_build_exits_1_on_skips(runner: CliRunner, image_tree: Path, tmp_path: Path) -> None:
    (image_tree / "cat" / "broken.jpg").write_bytes(b"\xff\xd8\xff garbage")
    r = runner.invoke(
        cli, ["build", str(image_tree), str(tmp_path / "p"), "--workers", "1", "--strict", "-q"]
    )
    assert r.exit_code == 1
    assert (tmp_path / "p").is_dir()  # the pack is still written


@pytest.mark.parametrize("store", ["raw", "jpeg"])
def test_corrupt_but_decodable_jpegs_are_skipped_and_strict_fails(
    runner: CliRunner, image_tree: Path, tmp_path: Path, store: str
) -> None:
    """Files libjpeg decodes with only a warning (Pillow drops it), grey where data are
    missing: skipped with libjpeg's reason, and --strict exits 1, as other broken images."""
    from conftest import write_bomb_jpeg, write_cut_jpeg

    write_bomb_jpeg(image_tree / "cat" / "short.jpg")
    write_cut_jpeg(image_tree / "dog" / "cut.jpg")
    for strict, code in (([], 0), (["--strict"], 1)):
        dst = tmp_path / f"p{len(strict)}"
        args = ["build", str(image_tree), str(dst), "--size", "16", "--store", store]
        r = runner.invoke(cli, [*args, "--workers", "1", "--json", "-q", *strict])
        assert r.exit_code == code, r.output
        out = json.loads(r.stdout)
        assert out["count"] == 13
        reasons = {s["path"]: s["reason"] for s in out["skipped"]}
        assert set(reasons) == {"cat/short.jpg", "dog/cut.jpg"}
        assert reasons["cat/short.jpg"].startswith(
            "corrupt JPEG data: premature end of data (its 65000x1500 frame needs"
        )
        assert "premature end of data segment" in reasons["dog/cut.jpg"]


def test_info_counts_the_bytes_a_pack_takes_on_disk(
    runner: CliRunner, packed: Path, tmp_path: Path
) -> None:
    import os

    def allocated() -> int:
        return sum(
            os.lstat(os.path.join(d, f)).st_blocks * 512
            for d, _, files in os.walk(packed)
            for f in files
        )

    before = json.loads(runner.invoke(cli, ["info", str(packed), "--json"]).stdout)["bytes"]
    assert before == allocated() > 0
    with open(packed / "notes.bin", "wb") as f:
        f.truncate(8 << 30)  # 8 GiB apparent, nothing allocated
    after = json.loads(runner.invoke(cli, ["info", str(packed), "--json"]).stdout)["bytes"]
    assert after == allocated() < before + (1 << 20)


@pytest.mark.parametrize(
    "args, line",
    [
        (
            ["build", "{tmp}/missing", "{tmp}/p"],
            "Error: {tmp}/missing: no such folder; check the path",
        ),
        (
            ["build", "{tmp}/file.txt", "{tmp}/p"],
            "Error: {tmp}/file.txt: is a file, not a folder; give the folder that holds the images",
        ),
        (["build", "{tmp}/empty", "{tmp}/p"], "Error: {tmp}/empty: no images found"),
        (
            ["build", "{src}", "{src}/inner"],
            "Error: {src}/inner: the pack would be inside its source",
        ),
        (["info", "{tmp}/nothing"], "Error: {tmp}/nothing: no such pack"),
        (
            ["compress", "{src}", "{tmp}/c", "--quality", "40"],
            "Error: --quality must be 2 (best) to 31 (worst), not 40",
        ),
        (["verify", "{tmp}/nothing"], "Error: {tmp}/nothing: no such pack; check the path"),
        (  # a folder, but no pack: nothing to verify (a damaged pack's manifest exits 1)
            ["verify", "{src}", "--no-speed"],
            "Error: {src}: not an imgpack pack (imgpack.json is missing)",
        ),
        (["verify", "{tmp}/file.txt"], "Error: {tmp}/file.txt: is a file, not a pack directory"),
    ],
)
def test_user_errors_exit_2_with_one_line(
    runner: CliRunner, image_tree: Path, tmp_path: Path, args: list[str], line: str
) -> None:
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "empty").mkdir()
    fmt = {"tmp": str(tmp_path), "src": str(image_tree)}
    r = runner.invoke(cli, [a.format(**fmt) for a in args])
    assert r.exit_code == 2
    assert r.stderr.strip().splitlines()[-1].startswith(line.format(**fmt))
    assert "Traceback" not in r.output


@pytest.mark.parametrize(
    "args", [["--size", "0"], ["--size", "abc"], ["--workers", "0"], ["--resize", "zoom"]]
)
def test_bad_option_values_exit_2(
    runner: CliRunner, image_tree: Path, tmp_path: Path, args: list[str]
) -> None:
    r = runner.invoke(cli, ["build", str(image_tree), str(tmp_path / "p"), *args])
    assert r.exit_code == 2 and "Traceback" not in r.output


def test_existing_pack_refused(runner: CliRunner, packed: Path, image_tree: Path) -> None:
    r = runner.invoke(cli, ["build", str(image_tree), str(packed)])
    assert r.exit_code == 2
    assert (
        r.stderr.strip()
        == f"Error: {packed}: a pack already exists; pass --overwrite to replace it"
    )


def test_ctrl_c_says_how_to_resume(
    runner: CliRunner, image_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import packer.builder.api

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(packer.builder.api, "build", interrupted)
    r = runner.invoke(cli, ["build", str(image_tree), str(tmp_path / "p")])
    assert r.exit_code == 130 and "run the same command again to resume" in r.stderr


def test_verify_cli_ok_and_json(runner: CliRunner, packed: Path) -> None:
    r = runner.invoke(
        cli,
        ["verify", str(packed), "--device", "cpu", "--batch-size", "4", "--batches", "2", "--json"],
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["ok"] is True and out["pack_images_per_s"] > 0
    assert out["folder_images_per_s"] > 0 and out["speedup"] > 0
    assert [c["name"] for c in out["checks"]] == [
        "manifest",
        "files",
        "images",
        "labels",
        "sources",
    ]


@pytest.mark.parametrize(
    "option, path, line",
    [
        ("--plot", "{tmp}/missing/v.png", "Error: {tmp}/missing: no such folder for --plot"),
        ("--plot", "{tmp}", "Error: {tmp}: --plot must be a file name, and this is a folder"),
        ("--plot", "{tmp}/file.txt/v.png", "Error: {tmp}/file.txt: is a file, so --plot"),
        ("--trace", "{tmp}/missing/t.json", "Error: {tmp}/missing: no such folder for --trace"),
    ],
)
def test_verify_output_paths_refused_before_the_work(
    runner: CliRunner,
    packed: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    option: str,
    path: str,
    line: str,
) -> None:
    import packer.measure.verify

    def never(*a, **k):
        raise AssertionError("verify ran")

    monkeypatch.setattr(packer.measure.verify, "verify", never)
    (tmp_path / "file.txt").write_text("x")
    fmt = {"tmp": str(tmp_path)}
    r = runner.invoke(cli, ["verify", str(packed), option, path.format(**fmt)])
    assert r.exit_code == 2 and "Traceback" not in r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(line.format(**fmt))


def test_verify_shows_progress_on_stderr_only(runner: CliRunner, packed: Path) -> None:
    r = runner.invoke(cli, ["verify", str(packed), "--no-speed", "--json"])
    assert r.exit_code == 0
    assert json.loads(r.stdout)["ok"] is True
    assert "verify" in r.stderr and "26/26" in r.stderr
    r = runner.invoke(cli, ["verify", str(packed), "--no-speed", "--json", "-q"])
    assert r.stderr == ""


ENV = subprocess_env()


SIGTERM_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    import packer.cli, packer.cli.output
    def update(self, n=1):
        os.killpg(0, signal.SIGTERM)  # as a scheduler stops a job: the whole group
    packer.cli.output.Bar.update = update
    if __name__ == "__main__":
        packer.cli.cli(sys.argv[1:])
""")


@pytest.mark.parametrize("command", ["build", "compress"])
def test_sigterm_is_like_ctrl_c(image_tree: Path, tmp_path: Path, command: str) -> None:
    script = tmp_path / "term.py"
    script.write_text(SIGTERM_SCRIPT)
    dst = tmp_path / "dst"
    args = [command, str(image_tree), str(dst), "--workers", "2"]
    if command == "build":
        args += ["--size", "8"]
    with open(tmp_path / "log.txt", "w") as log:
        p = subprocess.run(
            [sys.executable, str(script), *args],
            stdout=log,
            stderr=log,
            env=ENV,
            timeout=60,
            start_new_session=True,
        )
    err = (tmp_path / "log.txt").read_text()
    assert p.returncode == 130, err
    assert "run the same command again to resume" in err
    assert "Traceback" not in err and "BrokenPipeError" not in err
    if command == "build":
        assert work_dir_for(dst).exists() and not dst.exists()
        assert build(image_tree, dst, BuildConfig(size=(8, 8), workers=1)).resumed >= 1


def test_sigterm_handler_is_restored(image_tree: Path, tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    CliRunner().invoke(cli, ["build", str(image_tree), str(tmp_path / "p"), "--workers", "1"])
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_bucket_src_keeps_its_url_and_a_set_needs_the_ray_engine(
    runner: CliRunner, tmp_path: Path
) -> None:
    # one pack from a bucket is built here (issue 47: tests/storage/test_source_buckets.py)
    r = runner.invoke(
        cli, ["build", "s3://bucket/images/", str(tmp_path / "out"), "--shard-size", "1MB"]
    )
    assert r.exit_code == 2, r.output
    assert (
        "SRC s3://bucket/images/: a pack set from a bucket of images is built with --engine ray"
        in r.output
    )


@pytest.mark.parametrize(
    "value, match",
    [
        ("9" * 400, "too many digits for a size"),
        ("9" * 60 + "TB", "must be at most 1 PB"),
        ("2000TB", "must be at most 1 PB"),
        ("1e308", "give a size such as 256MB"),
    ],
)
def test_shard_size_too_large_for_a_float_is_one_error_line(
    image_tree: Path, tmp_path: Path, value: str, match: str
) -> None:
    """Issue 42.14: --shard-size with a number too large for a float was an OverflowError."""
    from conftest import cli_build, one_error

    code, _, err = cli_build(image_tree, tmp_path / "set", "--shard-size", value)
    assert code == 2 and match in one_error(err)
    assert not (tmp_path / "set").exists()


@pytest.mark.parametrize("value", [str(10**25), str(2**40)])
def test_verify_batch_size_is_bounded(packed: Path, value: str) -> None:
    from conftest import cli_run, one_error

    code, out, err = cli_run("verify", packed, "--batch-size", value, "--no-source")
    assert code == 2 and "--batch-size must be at most 65,536" in one_error(err)
    assert "checks" not in out and "throughput" not in out
