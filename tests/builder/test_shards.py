"""Pack sets (``--shard-size``, ``--append``): the same images as one pack, bytes that
depend only on the inputs and options, append that never rewrites a shard, and a build
killed anywhere resuming to the same bytes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

import packer
from conftest import beside, subprocess_env, write_image
from packer.builder.api import BuildConfig, build
from packer.builder.set_plan import cut
from packer.builder.shards import DEFAULT_SHARD_SIZE, parse_bytes
from packer.errors import InputError, UsageError
from packer.pack.index import read_index

RAW = BuildConfig(size=(8, 6), workers=1, shard_size=300)  # 144-byte rows: 2 per shard


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by relative path, with its bytes."""
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            p = Path(dirpath) / f
            out[str(p.relative_to(root))] = p.read_bytes()
    return out


def write_src(root: Path, names: dict[str, int]) -> Path:
    """``{class: count}`` images ``<class>/<i>.png`` (20x16)."""
    for c, n in names.items():
        for i in range(n):
            write_image(root / c / f"{i}.png", (20, 16), seed=i + 100 * len(c))
    return root


@pytest.fixture
def set_src(tmp_path: Path) -> Path:
    return write_src(tmp_path / "src", {"cat": 3, "dog": 3})


def test_parse_bytes() -> None:
    assert parse_bytes("256MB") == 256_000_000 == DEFAULT_SHARD_SIZE
    assert parse_bytes("1gb") == 10**9 and parse_bytes("2 KiB") == 2048
    assert parse_bytes("1.5MiB") == 1572864 and parse_bytes("300") == 300
    with pytest.raises(
        UsageError, match=r"BuildConfig.shard_size '12XB': give a size such as 256MB"
    ):
        parse_bytes("12XB")
    with pytest.raises(UsageError, match=r"BuildConfig.shard_size '-1'"):
        parse_bytes("-1")
    with pytest.raises(UsageError, match="must be at least one byte"):
        parse_bytes("0.1B")


def test_cut_is_a_fixed_count_for_raw_and_by_source_bytes_for_jpeg() -> None:
    assert cut([1] * 5, "raw", 144, 300) == [(0, 2), (2, 4), (4, 5)]
    assert cut([1] * 3, "raw", 144, 10) == [(0, 1), (1, 2), (2, 3)]  # at least one
    assert cut([], "raw", 144, 300) == []
    assert cut([100, 100, 100, 500, 10], "jpeg", 0, 250) == [(0, 2), (2, 3), (3, 4), (4, 5)]
    with pytest.raises(UsageError, match=r"BuildConfig\.shard_size must be 1 byte to 1 PB, not 0"):
        replace(RAW, shard_size=0).validate()
    with pytest.raises(
        UsageError, match=r"BuildConfig\.append adds to the set at DST and BuildConfig\.overwrite"
    ):
        replace(RAW, append=True, overwrite=True).validate()


@pytest.mark.parametrize("store", ["raw", "jpeg"])
def test_set_holds_the_same_images_as_one_pack(
    image_tree: Path, tmp_path: Path, store: str
) -> None:
    one = BuildConfig(size=(8, 6), workers=1, store=store)
    build(image_tree, tmp_path / "one", one)
    r = build(image_tree, tmp_path / "set", replace(one, shard_size=300 if store == "raw" else 900))
    pack, s = packer.load(tmp_path / "one"), packer.load(tmp_path / "set")
    assert r.shards == len(s.shards) >= 3 and r.count == len(s) == len(pack) == 13
    assert r.to_json()["shards"] == r.shards and r.classes == pack.classes
    assert s.sources == pack.sources and s.classes == pack.classes
    assert s.labels.tolist() == pack.labels.tolist()
    for i in range(len(pack)):
        k, row = (int(v) for v in s.locate(i))
        if store == "raw":
            assert s.shards[k].images[row].equal(pack.images[i]), i
        else:
            assert s.shards[k].read([row])[0].equal(pack.read([i])[0]), i
    if store == "raw":
        assert s.image_shape == (3, 6, 8)
    else:  # the largest stored image over every shard
        assert s.image_shape == pack.manifest.image_shape


def test_set_with_targets_matches_one_pack(set_src: Path, tmp_path: Path) -> None:
    table = tmp_path / "t.csv"
    rows = [f"{c}/{i}.png,{c},{i / 2},{-i}" for c in ("cat", "dog") for i in range(3)]
    table.write_text("path,label,a,b\n" + "\n".join(rows) + "\n")
    one = BuildConfig(size=(8, 6), workers=1, labels=table, targets=("a", "b"))
    build(set_src, tmp_path / "one", one)
    build(set_src, tmp_path / "set", replace(one, shard_size=300))
    pack, s = packer.load(tmp_path / "one"), packer.load(tmp_path / "set")
    assert s.target_names == ["a", "b"] and s.targets is not None
    assert s.targets.equal(pack.targets) and s.labels.equal(pack.labels)


def test_shard_bytes_do_not_depend_on_workers(image_tree: Path, tmp_path: Path) -> None:
    config = replace(RAW, shard_size=5 * 144)
    build(image_tree, tmp_path / "a", config)
    build(image_tree, tmp_path / "b", replace(config, workers=2))
    a = tree(tmp_path / "a")
    assert a == tree(tmp_path / "b") and len(read_index(tmp_path / "a").shards) == 3
    # a rerun of a complete set rebuilds nothing and leaves every byte as it was
    r = build(image_tree, tmp_path / "a", replace(config, overwrite=True))
    assert r.extra["shards_built"] == 0 and r.resumed == 13 and tree(tmp_path / "a") == a


def test_append_keeps_old_shards_and_adds_the_new_images(set_src: Path, tmp_path: Path) -> None:
    dst = tmp_path / "set"
    build(set_src, dst, RAW)
    before = tree(dst)
    old = read_index(dst)
    # new images sort between old ones: they still go to new shards, after the old
    write_image(set_src / "cat" / "1b.png", (20, 16), seed=7)
    write_image(set_src / "dog" / "9.png", (20, 16), seed=8)
    write_image(set_src / "dog" / "a.png", (20, 16), seed=9)
    r = build(set_src, dst, replace(RAW, append=True))
    new = read_index(dst)
    assert new.shards[:3] == old.shards and len(new.shards) == 5 and r.shards == 5
    assert r.count == 9 and r.extra == {"shards_built": 2, "shards_kept": 0, "shards_failed": 0}
    after = tree(dst)
    for name, data in before.items():
        if name != "imgpack-set.json":
            assert after[name] == data, name
    s = packer.load(dst)
    assert len(s) == 9 and s.sources[6:] == ["cat/1b.png", "dog/9.png", "dog/a.png"]
    assert s.labels.tolist() == [0, 0, 0, 1, 1, 1, 0, 1, 1]
    one = build(set_src, tmp_path / "one", BuildConfig(size=(8, 6), workers=1))
    pack = packer.load(one.path)
    for i, src in enumerate(s.sources):
        k, row = (int(v) for v in s.locate(i))
        assert s.shards[k].images[row].equal(pack.images[pack.sources.index(src)])
    # nothing new: the set stays as it is
    again = build(set_src, dst, replace(RAW, append=True))
    assert again.count == 9 and tree(dst) == after and beside(dst) == ["one", "set", "src"]


@pytest.mark.parametrize(
    "change, error, message",
    [
        (
            {"size": (8, 8)},
            UsageError,
            r"BuildConfig.append: BuildConfig.size 8x8 differs from the set's 8x6",
        ),
        (
            {"store": "jpeg"},
            UsageError,
            r"BuildConfig.append: BuildConfig.store jpeg differs from the set's raw",
        ),
        (
            {"resize": "pad"},
            UsageError,
            r"BuildConfig.append: BuildConfig.resize pad differs from the set's crop",
        ),
        ({"max_pixels": 10**6}, UsageError, r"BuildConfig.max_pixels 1000000 differs"),
    ],
)
def test_append_with_other_options_is_refused(
    set_src: Path, tmp_path: Path, change: dict[str, object], error: type, message: str
) -> None:
    build(set_src, tmp_path / "set", RAW)
    before = tree(tmp_path / "set")
    write_image(set_src / "dog" / "new.png", (20, 16))
    with pytest.raises(error, match=message):
        build(set_src, tmp_path / "set", replace(RAW, append=True, **change))  # type: ignore[arg-type]
    assert tree(tmp_path / "set") == before


def test_append_with_another_class_map_is_refused(set_src: Path, tmp_path: Path) -> None:
    build(set_src, tmp_path / "set", RAW)
    write_image(set_src / "eel" / "0.png", (20, 16))
    with pytest.raises(InputError, match=r"SRC has classes the set does not: \['eel'\]"):
        build(set_src, tmp_path / "set", replace(RAW, append=True))
    # the set's class map given does not make room for a class it lacks either
    with_map = replace(RAW, append=True, classes=str(tmp_path / "set"))
    with pytest.raises(InputError, match=r"class 'eel' not in the class map"):
        build(set_src, tmp_path / "set", with_map)
    with pytest.raises(InputError, match=r"SRC has classes the set does not: \['eel'\]"):
        build(set_src, tmp_path / "set", replace(with_map, allow_new_classes=True))


def test_append_of_a_folder_lacking_a_class_says_to_give_the_sets_classes(
    set_src: Path, tmp_path: Path
) -> None:
    """Issue 43: README's --append of a new folder that lacks one of the set's classes
    (a week of new dog photos) says what to add, and that works, labelled as the set."""
    from conftest import cli_build, one_error

    dst = tmp_path / "set"
    build(set_src, dst, RAW)
    before = tree(dst)
    new = write_src(tmp_path / "new_week", {"dog": 2})
    (new / "dog" / "0.png").rename(new / "dog" / "n0.png")
    (new / "dog" / "1.png").rename(new / "dog" / "n1.png")
    with pytest.raises(
        InputError, match=rf"SRC lacks the set's classes \['cat'\].*BuildConfig.classes {dst}"
    ):
        build(new, dst, replace(RAW, append=True))
    assert tree(dst) == before
    code, _, err = cli_build(new, dst, "--append")
    assert code == 2 and f"add --classes {dst} to label SRC" in one_error(err)
    r = build(new, dst, replace(RAW, append=True, classes=str(dst)))
    assert r.count == 8
    s = packer.load(dst)
    assert s.classes == ["cat", "dog"]
    assert [int(s.labels[s.sources.index(f"dog/n{i}.png")]) for i in range(2)] == [1, 1]


def test_destinations_a_set_build_refuses(set_src: Path, tmp_path: Path) -> None:
    with pytest.raises(
        UsageError, match=r"BuildConfig.append: .* holds no pack set; build one first"
    ):
        build(set_src, tmp_path / "none", replace(RAW, append=True))
    build(set_src, tmp_path / "set", RAW)
    with pytest.raises(InputError, match=r"a pack set already exists; pass BuildConfig\.append"):
        build(set_src, tmp_path / "set", RAW)
    build(set_src, tmp_path / "one", BuildConfig(size=(8, 6), workers=1))
    with pytest.raises(
        InputError, match=r"holds a single pack; BuildConfig\.shard_size writes a pack set"
    ):
        build(set_src, tmp_path / "one", RAW)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(InputError, match=r"is not a pack set .*'notes\.txt'"):
        build(set_src, tmp_path / "mine", RAW)
    with pytest.raises(InputError, match="the set would be inside its source"):
        build(set_src, set_src / "set", RAW)


def test_a_shard_of_broken_images_is_skipped_and_not_retried(set_src: Path, tmp_path: Path) -> None:
    for i in range(2):
        (set_src / "cat" / f"{i}.png").write_bytes(b"not a png")
    r = build(set_src, tmp_path / "set", RAW)
    assert r.count == 4 and r.shards == 2 and r.extra["shards_failed"] == 1
    index = read_index(tmp_path / "set")
    assert [s.path for s in index.skipped] == ["cat/0.png", "cat/1.png"]
    assert "no image of its shard could be used" in index.skipped[0].reason
    r = build(set_src, tmp_path / "set", replace(RAW, append=True))
    assert r.count == 4 and r.extra["shards_built"] == 0


def _build_until(src: Path, dst: Path, point: str, append: bool) -> None:
    """In a forked child: the set build, SIGKILLed by itself at ``point`` ("progress k":
    after the k-th decoded chunk, else a step of packer.builder.shards._reached)."""
    import signal

    import packer.builder.shards as shards

    def die(step: str) -> None:
        if step == point:
            os.kill(os.getpid(), signal.SIGKILL)

    seen = [0]

    def progress(n: int) -> None:
        seen[0] += 1
        die(f"progress {seen[0]}")

    shards._reached = die  # the child's own copy of the module
    build(src, dst, replace(RAW, append=append), progress=progress)


def _killed(src: Path, dst: Path, point: str, append: bool) -> None:
    """kill -9 of a build at ``point``, in a child forked from this process (no
    interpreter start: torch is already imported)."""
    import multiprocessing as mp

    child = mp.get_context("fork").Process(target=_build_until, args=(src, dst, point, append))
    child.start()
    child.join(60)
    assert child.exitcode == -9, f"the build was not killed at {point!r} ({child.exitcode})"


@pytest.mark.parametrize(
    "point", ["progress 1", "progress 4", "shard 0", "shard 1", "index", "committed"]
)
def test_killed_set_build_resumes_byte_identical(set_src: Path, tmp_path: Path, point: str) -> None:
    build(set_src, tmp_path / "ref", RAW)
    dst = tmp_path / "out" / "set"
    dst.parent.mkdir()
    _killed(set_src, dst, point, append=False)
    assert (dst / "imgpack-set.json").exists() == (point == "committed")  # the commit point
    r = build(set_src, dst, replace(RAW, overwrite=point == "committed"))
    assert r.count == 6
    assert tree(dst) == tree(tmp_path / "ref")
    assert beside(dst) == ["set"]  # no lock or work folder left


@pytest.mark.parametrize("point", ["progress 1", "shard 0", "index"])
def test_killed_append_resumes_byte_identical(set_src: Path, tmp_path: Path, point: str) -> None:
    dst = tmp_path / "out" / "set"
    build(set_src, tmp_path / "ref", RAW)
    build(set_src, dst, RAW)
    old = tree(dst)
    for i in range(3):
        write_image(set_src / "dog" / f"new{i}.png", (20, 16), seed=40 + i)
    build(set_src, tmp_path / "ref", replace(RAW, append=True))
    _killed(set_src, dst, point, append=True)
    assert tree(dst)["imgpack-set.json"] == old["imgpack-set.json"]  # not yet committed
    packer.load(dst)  # the old set still opens whole
    build(set_src, dst, replace(RAW, append=True))
    assert tree(dst) == tree(tmp_path / "ref")
    assert len(packer.load(dst)) == 9 and beside(dst) == ["set"]


KILL_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    from packer.builder.api import BuildConfig, build
    seen = 0
    def progress(n):
        global seen
        seen += 1
        if seen == 3:
            os.kill(os.getpid(), signal.SIGKILL)
    if __name__ == "__main__":  # worker processes import this module
        build(sys.argv[1], sys.argv[2], BuildConfig(size=(8, 6), workers=2, shard_size=720),
              progress=progress)
""")


@pytest.mark.slow  # an interpreter of its own (torch imported) and a worker pool
def test_killed_set_build_with_a_worker_pool_resumes(image_tree: Path, tmp_path: Path) -> None:
    """The whole command killed in its own interpreter, decode workers and all."""
    config = BuildConfig(size=(8, 6), workers=1, shard_size=720)
    build(image_tree, tmp_path / "ref", config)
    dst = tmp_path / "out" / "set"
    dst.parent.mkdir()
    (tmp_path / "kill.py").write_text(KILL_SCRIPT)
    # output to a file, not a pipe (see test_build_resume: a tracker may outlive the kill)
    with open(tmp_path / "log.txt", "w") as log:
        p = subprocess.run(
            [sys.executable, str(tmp_path / "kill.py"), str(image_tree), str(dst)],
            stdout=log,
            stderr=log,
            timeout=120,
            env=subprocess_env(),
        )
    assert p.returncode == -9, (tmp_path / "log.txt").read_text()
    assert not (dst / "imgpack-set.json").exists()
    build(image_tree, dst, replace(config, workers=2))
    assert tree(dst) == tree(tmp_path / "ref") and beside(dst) == ["set"]


def test_cli_builds_appends_describes_and_verifies_a_set(tmp_path: Path) -> None:
    """The command line over pack sets: build --shard-size, info and verify (exit 0, the
    shards named), --append of new images, and --append with other options refused
    with one line naming the option (exit 2)."""
    from conftest import cli_build, cli_run, one_error, write_image

    src = tmp_path / "src"
    for i in range(6):
        write_image(src / ("a" if i % 2 else "b") / f"{i}.jpg", seed=i)
    code, out, err = cli_build(src, tmp_path / "set", "--shard-size", "400B", "--json")
    assert code == 0, err
    assert json.loads(out)["shards"] == 3  # 8x6x3 = 144 bytes a row: 2 rows a shard
    code, out, err = cli_run("info", tmp_path / "set", "--json")
    assert code == 0 and json.loads(out)["shards"]["count"] == 3, err
    code, out, err = cli_run("verify", tmp_path / "set", "--no-speed")
    assert code == 0 and out.count("ok    shard ") == 3, out + err
    write_image(src / "a" / "new.jpg", seed=9)
    code, out, err = cli_build(src, tmp_path / "set", "--append", "--json")
    assert code == 0 and json.loads(out)["count"] == 7, err
    code, _, err = cli_build(src, tmp_path / "set", "--append", "--resize", "pad")
    assert code == 2 and "--resize" in one_error(err)
    code, _, err = cli_build(src, tmp_path / "set2", "--shard-size", "12 parsecs")
    assert code == 2 and "--shard-size" in one_error(err)
