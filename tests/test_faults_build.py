"""Faults and bad inputs in build and compress (issue 16): hangs, a wedged resume,
lost or extra images, tracebacks where an ``Error:`` line belongs."""

from __future__ import annotations

import errno
import faulthandler
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

import packer
import packer.build.finalize
import packer.build.run
from conftest import subprocess_env, write_image
from packer.build.run import BuildConfig, build, work_dir_for
from packer.cli import cli
from packer.compress import CompressConfig, compress, output_names
from packer.errors import InputError, NoUsableImagesError
from packer.imaging.decode import ResizeSpec, load_resized, open_image
from packer.sources.scan import scan_tree, walk_images

PACK_FILES = (
    "_tensordict/images.memmap",
    "_tensordict/labels.memmap",
    "_tensordict/meta.json",
    "meta.json",
)
ENV = subprocess_env()


def assert_same_pack(a: Path, b: Path) -> None:
    for f in PACK_FILES:
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    ma, mb = (json.loads((p / "imgpack.json").read_text()) for p in (a, b))
    for m in (ma, mb):
        del m["build"]["created"]
    assert ma == mb


def beside(dst: Path) -> list[str]:
    return sorted(os.listdir(dst.parent))


# ------------------------------------------------------------- 1. temp files


KILL_AT_RENAME = textwrap.dedent("""
    import os, signal, sys
    from packer.compress import CompressConfig, compress
    real_replace = os.replace
    def replace(a, b, **kw):
        if os.path.basename(a).startswith(".imgpack-tmp-") and b.name != ".imgpack-compress.json":
            os.kill(os.getpid(), signal.SIGKILL)  # after the fsync, before the rename
        real_replace(a, b, **kw)
    os.replace = replace
    compress(sys.argv[1], sys.argv[2], CompressConfig(workers=1))
""")


def test_compress_killed_before_rename_leaves_nothing_that_becomes_an_image(
    image_tree: Path, tmp_path: Path
) -> None:
    out = tmp_path / "small"
    script = tmp_path / "kill.py"
    script.write_text(KILL_AT_RENAME)
    p = subprocess.run(
        [sys.executable, str(script), str(image_tree), str(out)], env=ENV, timeout=60
    )
    assert p.returncode == -9
    left = [f for f in out.rglob(".imgpack-tmp-*")]
    assert len(left) == 1  # what a dead run leaves
    # scan never takes it (or a build's work folders, or any imgpack name) for an image
    (out / "cat" / ".p.imgpack-partial").mkdir()
    write_image(out / "cat" / ".p.imgpack-partial" / "x.jpg")
    write_image(out / "cat" / ".imgpack-old.jpg")
    assert not [p for p in walk_images(out) if "imgpack" in p]
    r = compress(image_tree, out, CompressConfig(workers=1))
    assert r.written + r.skipped == 13 and r.failed == []
    assert not list(out.rglob(".imgpack-tmp-*"))  # the rerun cleaned up
    assert build(out, tmp_path / "pack", BuildConfig(size=(8, 8), workers=1)).count == 13


# ------------------------------------------------------------- 2. dead worker


DEAD_WORKER = textwrap.dedent("""
    import sys
    from packer.build.run import BuildConfig, build
    from packer.errors import PackerError
    if __name__ == "__main__":
        try:
            build(sys.argv[1], sys.argv[2], BuildConfig(size=(8, 8), workers=2))
        except PackerError as e:
            print(f"Error: {e}", file=sys.stderr)
            sys.exit(e.exit_code)
""")
DIES_AT = 75  # of 150 chunks (2 images each): earlier ones journaled, later ones pending


@pytest.fixture
def flat300(tmp_path: Path) -> Path:
    src = tmp_path / "flat"
    src.mkdir()
    for i in range(300):  # 150 chunks (block_rows_for(300) == 2)
        Image.new("L", (4, 4), i % 256).save(src / f"{i:03d}.png")
    return src


def run_dead_worker(tmp_path: Path, src: Path, dst: Path, when: str) -> tuple[int, str]:
    """Build in a subprocess whose pool worker SIGKILLs itself as it starts chunk
    DIES_AT (packer.build.run's test hook): ``once`` (then the retry pool gets through) or
    ``always`` (the retry pool's worker dies too). The kill lands while that chunk is
    unfinished, however fast the other worker runs: no race with the machine's load."""
    script = tmp_path / "dead.py"
    script.write_text(DEAD_WORKER)
    marker = tmp_path / "died-once"
    hook = f"{DIES_AT}:{marker}" if when == "once" else str(DIES_AT)
    with open(tmp_path / "log.txt", "w") as log:  # not a pipe: see test_untrusted_faults
        p = subprocess.run(
            [sys.executable, str(script), str(src), str(dst)],
            stdout=log,
            stderr=log,
            env={**ENV, packer.build.run.TEST_DEATH_ENV: hook},
            timeout=60,  # the old pool waited here forever
        )
    assert marker.exists() == (when == "once")
    return p.returncode, (tmp_path / "log.txt").read_text()


def test_one_dead_worker_is_survived(flat300: Path, tmp_path: Path) -> None:
    rc, err = run_dead_worker(tmp_path, flat300, tmp_path / "pack", "once")
    assert rc == 0, err
    assert "a decode worker died; retrying" in err
    build(flat300, tmp_path / "ref", BuildConfig(size=(8, 8), workers=1))
    assert_same_pack(tmp_path / "pack", tmp_path / "ref")


def test_workers_dying_again_end_the_build_clearly_and_rerun_resumes(
    flat300: Path, tmp_path: Path
) -> None:
    src, dst = flat300, tmp_path / "pack"
    rc, err = run_dead_worker(tmp_path, src, dst, "always")
    assert rc == 1, err
    assert "Error: a decode worker died twice" in err and "run the same command again" in err
    assert "Traceback" not in err
    assert not dst.exists()
    r = build(src, dst, BuildConfig(size=(8, 8), workers=2))
    assert r.count == 300 and r.resumed >= 1
    build(src, tmp_path / "ref", BuildConfig(size=(8, 8), workers=1))
    assert_same_pack(dst, tmp_path / "ref")


# ------------------------------------------------------------- 3. special files


@pytest.fixture
def no_hang():
    """A hang (the old behaviour on a FIFO) ends the test run with tracebacks, not never."""
    faulthandler.dump_traceback_later(60, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def add_special_files(folder: Path) -> None:
    os.mkfifo(folder / "fifo.jpg")
    (folder / "zero.jpg").symlink_to("/dev/zero")
    (folder / "dir.png").mkdir()  # a folder named like an image is walked, not read


@pytest.mark.parametrize("workers", [1, 2])
def test_special_files_named_like_images_are_skipped_not_read(
    image_tree: Path, tmp_path: Path, workers: int, no_hang: None
) -> None:
    add_special_files(image_tree / "cat")
    r = build(image_tree, tmp_path / "p", BuildConfig(size=(8, 8), workers=workers))
    assert r.count == 13
    assert {s["path"]: s["reason"] for s in r.skipped} == {
        "cat/fifo.jpg": "not a regular file (a FIFO); only image files are read",
        "cat/zero.jpg": "not a regular file (a character device); only image files are read",
    }


def test_compress_reads_only_regular_files(image_tree: Path, tmp_path: Path, no_hang: None) -> None:
    add_special_files(image_tree / "cat")
    r = compress(image_tree, tmp_path / "out", CompressConfig(workers=2))
    assert r.written == 13
    assert {f["path"]: f["reason"] for f in r.failed} == {
        "cat/fifo.jpg": "not a regular file (a FIFO); only image files are read",
        "cat/zero.jpg": "not a regular file (a character device); only image files are read",
    }


# ------------------------------------------------------------- 4. finalize crashes


STEPS = ["data", "labels", "manifest", "assembled", "journal.jsonl", "plan.json", "aside", "moved"]


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("with_skips", [True, False])
def test_crash_at_every_finalize_step_resumes_to_the_same_pack(
    image_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str, with_skips: bool
) -> None:
    if with_skips:  # compaction is a step of its own
        (image_tree / "dog" / "broken.jpg").write_bytes(b"not a jpeg")
    config = BuildConfig(size=(8, 6), workers=1, overwrite=True)
    build(image_tree, tmp_path / "ref", config)
    dst = tmp_path / "out" / "pack"
    build(image_tree, dst, BuildConfig(size=(4, 4), workers=1))  # an old pack to replace

    def crash(name: str) -> None:
        if name == step:
            raise RuntimeError(f"crash after {name}")

    monkeypatch.setattr(packer.build.finalize, "_reached", crash)
    with pytest.raises(RuntimeError, match="crash after"):
        build(image_tree, dst, config)
    monkeypatch.undo()
    r = build(image_tree, dst, config)
    assert r.count == 13
    assert_same_pack(dst, tmp_path / "ref")
    assert beside(dst) == ["pack"]  # no work folder, old pack or lock left


# ------------------------------------------------------------- 5. output names


def test_colliding_output_names_lose_nothing(tmp_path: Path) -> None:
    src = tmp_path / "src"
    for i, name in enumerate(["x.png", "x.jpg", "x.png.jpg", "x.JPG", "x.jpeg"]):
        write_image(src / name, seed=i)
    r = compress(src, tmp_path / "out", CompressConfig(workers=2))
    assert r.written == 5 and r.failed == []
    assert len(list((tmp_path / "out").glob("*.jpg"))) == 5


names = st.lists(
    st.builds(
        lambda d, stem, ext: f"{d}{stem}{ext}",
        st.sampled_from(["", "a/", "a.jpg/", "b/c/", "x.png/"]),
        st.sampled_from(["x", "x.png", "x.jpg", "X", "x.png~2", "a", "x.png.jpg"]),
        st.sampled_from([".jpg", ".png", ".JPG", ".jpeg", ".gif"]),
    ),
    unique=True,
    max_size=12,
)


@given(names, st.randoms())
@settings(max_examples=300, deadline=None)
def test_output_names_are_one_to_one(rels: list[str], rnd) -> None:
    out = output_names(rels)
    assert sorted(out) == sorted(rels)
    assert len(set(out.values())) == len(rels)  # injective
    folders = {"/".join(r.split("/")[: i + 1]) for r in rels for i in range(r.count("/"))}
    for rel, name in out.items():
        assert name.endswith(".jpg") and name not in folders
        assert name.rpartition("/")[0] == rel.rpartition("/")[0]  # same folder
    shuffled = list(rels)
    rnd.shuffle(shuffled)
    assert output_names(shuffled) == out  # a rerun maps them the same way


# ------------------------------------------------------------- 10. unreadable folder


def test_unreadable_class_folder_is_a_skip_counted_by_strict(
    image_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.scandir
    denied = str(image_tree / "dog")

    def scandir(path: object = ".") -> object:
        if os.fspath(path) == denied:  # as root, chmod cannot make a folder unreadable
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    scan = scan_tree(image_tree)
    assert scan.classes == ["cat", "dog", "zebra"]
    assert scan.skipped == [
        {"path": "dog", "reason": "cannot read this folder (Permission denied)"}
    ]
    res = CliRunner().invoke(
        cli,
        [
            "build",
            str(image_tree),
            str(tmp_path / "p"),
            "--size",
            "8",
            "--workers",
            "1",
            "--strict",
            "--json",
        ],
    )
    assert res.exit_code == 1, res.output
    out = json.loads(res.stdout)
    assert out["count"] == 9 and out["skipped"] == scan.skipped
    skips = packer.load(tmp_path / "p").manifest.skipped
    assert [{"path": k.path, "reason": k.reason} for k in skips] == scan.skipped


# ------------------------------------------------------------- 11. --max-pixels


@pytest.fixture
def big_png(tmp_path: Path) -> Path:
    """10000x9000 = 90 Mpx, above Pillow's own 89.5 Mpx warning, yet a tiny file."""
    path = tmp_path / "big" / "big.png"
    path.parent.mkdir()
    Image.new("1", (10000, 9000), 1).save(path)
    return path


def test_max_pixels_is_the_only_limit(big_png: Path, tmp_path: Path) -> None:
    im, size = load_resized(str(big_png), ResizeSpec(8, 8))  # default limit: 100 M
    assert size == (10000, 9000) and np.asarray(im).min() == 255
    r = build(big_png.parent, tmp_path / "p", BuildConfig(size=(8, 8), workers=1))
    assert r.count == 1 and r.skipped == []
    with pytest.raises(NoUsableImagesError, match="above the limit of 1,000,000"):
        build(big_png.parent, tmp_path / "q", BuildConfig(size=(8, 8), max_pixels=1_000_000))
    # above twice Pillow's limit, where Pillow raises instead of warning: the header opens
    huge = tmp_path / "huge.png"
    Image.new("1", (20000, 10000)).save(huge)
    with open(huge, "rb") as f, open_image(f) as h:
        assert h.size == (20000, 10000)
    r = compress(big_png.parent, tmp_path / "c", CompressConfig(max_pixels=1000))
    assert r.failed[0]["reason"].startswith("image is 10000x9000 = 90,000,000 pixels, above")


# ------------------------------------------------------------- 12. nothing usable


def test_all_images_broken_is_an_error_and_writes_nothing(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jpg").write_bytes(b"")
    (src / "b.png").write_bytes(b"garbage")
    dst = tmp_path / "out" / "pack"
    res = CliRunner().invoke(cli, ["build", str(src), str(dst), "--workers", "1", "-q"])
    assert res.exit_code == 1
    assert res.stderr.startswith(f"Error: {src}: none of its 2 images could be used (first: a.jpg")
    assert "no pack was written" in res.stderr
    assert beside(dst) == []


# ------------------------------------------------------------- 15. non-UTF-8 names


def test_names_that_are_not_utf8_are_skipped_with_a_reason(
    image_tree: Path, tmp_path: Path
) -> None:
    root = os.fsencode(image_tree)
    write_image(Path(os.fsdecode(root + b"/cat/bad\xff.jpg")))
    write_image(Path(os.fsdecode(root + b"/dog/\xfe/x.jpg")))
    r = build(image_tree, tmp_path / "p", BuildConfig(size=(8, 8), workers=1))
    assert r.count == 13
    assert r.skipped == [
        {"path": "cat/bad\\xff.jpg", "reason": "file name is not valid UTF-8; rename it"},
        {"path": "dog/\\xfe", "reason": "folder file name is not valid UTF-8; rename it"},
    ]
    c = compress(image_tree, tmp_path / "c", CompressConfig(workers=1))
    assert c.written == 13 and [f["path"] for f in c.failed] == ["cat/bad\\xff.jpg", "dog/\\xfe"]


# ------------------------------------------------------------- 16. unwritable DST


@pytest.mark.parametrize("command", ["build", "compress"])
@pytest.mark.parametrize(
    "error", [(errno.EROFS, "Read-only file system"), (errno.EACCES, "Permission denied")]
)
def test_unwritable_destination_is_one_error_line_exit_2(
    image_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str, error
) -> None:
    real_mkdir = Path.mkdir
    out = tmp_path / "ro"

    def mkdir(self: Path, *a: object, **kw: object) -> None:
        if self.is_relative_to(out) and self != out:  # the first write in the read-only folder
            raise OSError(error[0], error[1], str(self))
        real_mkdir(self, *a, **kw)

    out.mkdir()
    monkeypatch.setattr(Path, "mkdir", mkdir)
    res = CliRunner().invoke(cli, [command, str(image_tree), str(out / "dst"), "-q"])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {out}/")
    assert f"cannot write there ({error[1]})" in lines[0]


def test_unwritable_output_file_stops_compress_with_one_line(
    image_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import packer.compress as pc

    def no_write(path: Path, data: bytes) -> None:
        raise pc.WriteError(OSError(errno.EROFS, "Read-only file system", str(path)))

    out = tmp_path / "out"
    out.mkdir()
    (out / ".imgpack-compress.json").write_text('{"quality": 3, "max_side": null}')
    monkeypatch.setattr(pc, "_write_atomic", no_write)
    res = CliRunner().invoke(cli, ["compress", str(image_tree), str(out), "-q"])
    assert res.exit_code == 2 and res.stderr.startswith(f"Error: {out}/")


# ------------------------------------------------------------- also: lock, options, SIGTERM


def test_build_leaves_nothing_beside_dst(image_tree: Path, tmp_path: Path) -> None:
    dst = tmp_path / "out" / "pack"
    build(image_tree, dst, BuildConfig(size=(8, 8), workers=1))
    assert beside(dst) == ["pack"]
    with pytest.raises(InputError):
        build(image_tree, dst, BuildConfig(size=(8, 8), workers=1))  # refused: a pack exists
    assert beside(dst) == ["pack"]


def test_dst_dot_in_an_empty_folder(
    image_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    here = tmp_path / "empty"
    here.mkdir()
    monkeypatch.chdir(here)
    build(image_tree, ".", BuildConfig(size=(8, 8), workers=1))
    assert packer.load(here).images.shape == (13, 3, 8, 8)
    assert sorted(os.listdir(tmp_path)) == ["empty", "imgs"]


def test_compress_rerun_with_other_options_redoes_outputs(
    photos_small: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    q3 = compress(photos_small, out, CompressConfig(quality=3))
    assert q3.written == 3
    q25 = compress(photos_small, out, CompressConfig(quality=25))
    assert q25.written == 3 and q25.bytes_out < q3.bytes_out
    assert compress(photos_small, out, CompressConfig(quality=25)).skipped == 3
    assert compress(photos_small, out, CompressConfig(quality=25, max_side=16)).written == 3
    # the options record is not an image to build
    assert build(out, tmp_path / "p", BuildConfig(size=(8, 8), workers=1)).count == 3


@pytest.fixture
def photos_small(tmp_path: Path) -> Path:
    root = tmp_path / "photos"
    for i in range(3):
        write_image(root / f"{i}.png", (64, 48), seed=i)
    return root


SIGTERM_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    import packer.cli
    def update(self, n=1):
        os.killpg(0, signal.SIGTERM)  # as a scheduler stops a job: the whole group
    packer.cli._Bar.update = update
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


def _die() -> None:
    os._exit(1)


def test_a_pool_that_breaks_while_chunks_are_submitted_is_a_dead_worker_not_a_traceback() -> None:
    """``submit`` itself raises BrokenProcessPool once the pool knows a worker died (seen
    in CI: the retry pool's worker died before all its chunks were queued)."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    from packer.build import run as build_mod

    pool = ProcessPoolExecutor(1, mp_context=mp.get_context("fork"))
    with pytest.raises(BrokenProcessPool):
        pool.submit(_die).result()
    wrote_plan, recorded = [], []
    times: dict = {"wait": 0.0}
    ok = build_mod._run_chunks(
        pool,
        [(0, 0, ["a.jpg"]), (1, 1, ["b.jpg"])],
        {},
        recorded.append,
        build_mod._decode_chunk,
        times,
        lambda: wrote_plan.append(True),
    )
    pool.shutdown(wait=True)
    assert ok is False and recorded == [] and wrote_plan == [True]
