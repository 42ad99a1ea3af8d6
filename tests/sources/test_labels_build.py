"""Issue 15 end to end: --classes, --allow-new-classes, --labels and --targets through
build, the pack, info and verify (the parsing rules are in tests/sources/test_labels.py)."""

from __future__ import annotations

import json
import re
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import packer
import packer.builder.finalize
import packer.builder.run
from conftest import cli_build as _build
from conftest import cli_run as _cli
from conftest import subprocess_env, write_image
from packer.builder.run import BuildConfig, build
from packer.cli import cli
from packer.errors import PackFormatError, UsageError
from packer.pack.describe import describe
from packer.sources.labels import MAX_MISSING_LISTED

FILES = ("images.memmap", "labels.memmap", "targets.memmap", "meta.json")


def run(*args: object) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, [str(a) for a in args])
    return r.exit_code, r.stdout, r.stderr


def build_cli(src: Path, dst: Path, *extra: object) -> tuple[int, str, str]:
    return run("build", src, dst, "--size", "8x6", "--workers", "1", *extra)


def error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8", newline="")
    return path


def config(**kw: object) -> BuildConfig:
    return BuildConfig(size=(8, 6), workers=1, **kw)  # type: ignore[arg-type]


# ---------------------------------------------------------------- class maps


def test_val_missing_a_class_keeps_train_indices(image_tree: Path, tmp_path: Path) -> None:
    train = tmp_path / "train_pack"
    assert build_cli(image_tree, train, "-q")[0] == 0
    val = tmp_path / "val"
    write_image(val / "cat" / "v1.jpg", seed=50)
    write_image(val / "zebra" / "v2.jpg", seed=51)
    # without the map, val's zebra would be class 1 (the bug of issue 15)
    rc, _, err = build_cli(val, tmp_path / "val_plain", "-q")
    assert rc == 0, err
    assert packer.load(tmp_path / "val_plain").labels.tolist() == [0, 1]
    rc, out, err = build_cli(val, tmp_path / "val_pack", "--classes", train, "--json")
    assert rc == 0, err
    assert json.loads(out)["classes"] == ["cat", "dog", "zebra"]
    pack = packer.load(tmp_path / "val_pack")
    assert pack.class_to_idx == packer.load(train).class_to_idx == {"cat": 0, "dog": 1, "zebra": 2}
    assert dict(zip(pack.sources, pack.labels.tolist())) == {"cat/v1.jpg": 0, "zebra/v2.jpg": 2}
    assert list(pack.manifest.class_counts) == [1, 0, 1]  # dog kept, with count 0
    assert pack.manifest.class_map == str(train.resolve())
    info = json.loads(run("info", tmp_path / "val_pack", "--json")[1])
    assert info["class_to_idx"] == {"cat": 0, "dog": 1, "zebra": 2}
    assert info["class_counts"] == {"cat": 1, "dog": 0, "zebra": 1}
    assert info["targets"] is None


def test_classes_from_a_file_fix_order_and_show_in_info(image_tree: Path, tmp_path: Path) -> None:
    f = write(tmp_path / "classes.txt", "zebra\nemu\ndog\ncat\n")
    rc, _, err = build_cli(image_tree, tmp_path / "p", "--classes", f, "-q")
    assert rc == 0, err
    pack = packer.load(tmp_path / "p")
    assert pack.classes == ["zebra", "emu", "dog", "cat"]
    want = {"cat": 3, "dog": 2, "zebra": 0}
    assert {s: y for s, y in zip(pack.sources, pack.labels.tolist())} == {
        s: want[s.split("/")[0]] for s in pack.sources
    }
    assert list(pack.manifest.class_counts) == [5, 0, 4, 4]
    rc, out, _ = run("info", tmp_path / "p")
    assert rc == 0
    assert "classes   4 (index, images, name)" in out
    rows = [line.split() for line in out.splitlines() if re.match(r"\s+\d+\s+\d+\s+\w+$", line)]
    assert rows == [["0", "5", "zebra"], ["1", "0", "emu"], ["2", "4", "dog"], ["3", "4", "cat"]]


def test_class_folder_not_in_the_map_exits_2_then_allow_new(
    image_tree: Path, tmp_path: Path
) -> None:
    f = write(tmp_path / "classes.txt", "dog\ncat\n")
    rc, _, err = build_cli(image_tree, tmp_path / "p", "--classes", f)
    assert rc == 2
    assert error_line(err) == (
        f"Error: class 'zebra' not in the class map {f}; pass --allow-new-classes to append "
        "them at the end, or fix the map"
    )
    assert not (tmp_path / "p").exists()
    rc, _, err = build_cli(image_tree, tmp_path / "p", "--classes", f, "--allow-new-classes")
    assert rc == 0, err
    assert "Appended to the class map: zebra" in err
    pack = packer.load(tmp_path / "p")
    assert pack.class_to_idx == {"dog": 0, "cat": 1, "zebra": 2}
    r = build(image_tree, tmp_path / "q", config(classes=f, allow_new_classes=True))
    assert r.new_classes == ["zebra"] and r.to_json()["new_classes"] == ["zebra"]


def test_no_map_labels_equal_imagefolder(image_tree: Path, tmp_path: Path) -> None:
    from torchvision.datasets import ImageFolder

    build(image_tree, tmp_path / "p", config())
    pack = packer.load(tmp_path / "p")
    ref = ImageFolder(str(image_tree))  # its extension list lacks .tif: compare the rest
    theirs = {Path(p).relative_to(image_tree).as_posix(): y for p, y in ref.samples}
    ours = dict(zip(pack.sources, pack.labels.tolist()))
    assert len(theirs) >= 11 and {k: ours[k] for k in theirs} == theirs
    assert pack.class_to_idx == ref.class_to_idx
    assert pack.manifest.class_map is None and pack.targets is None and pack.target_names == []


# ---------------------------------------------------------------- label tables

TABLE = (
    "path,label,age,score\n"
    "zebra/i.jpg,wild,3.5,0.1\n"
    "cat/a.jpg,pet,1,0.2\n"
    "dog/nested/f.png,pet,2.25,-0.3\n"
    "gone.jpg,pet,9,9\n"
    "dog/e.jpg,pet,1e-3,1e30\n"
)


def test_csv_with_class_names(image_tree: Path, tmp_path: Path) -> None:
    t = write(tmp_path / "l.csv", TABLE)
    r = build(image_tree, tmp_path / "p", config(labels=t))
    pack = packer.load(tmp_path / "p")
    assert pack.sources == ["cat/a.jpg", "dog/e.jpg", "dog/nested/f.png", "zebra/i.jpg"]
    assert pack.classes == ["pet", "wild"] and pack.labels.tolist() == [0, 0, 0, 1]
    assert list(pack.manifest.class_counts) == [3, 1]
    assert r.ignored == 13 - 4 and pack.manifest.build.unlisted == 9
    assert pack.targets is None and "targets.memmap" not in os_listdir(tmp_path / "p")
    assert pack.manifest.build.labels_table == str(t.resolve())


def os_listdir(pack: Path) -> list[str]:
    return sorted(p.name for p in (pack / "_tensordict").iterdir())


def test_csv_with_integer_labels_verifies(image_tree: Path, tmp_path: Path) -> None:
    t = write(tmp_path / "l.csv", "path,label\ncat/a.jpg,7\ndog/e.jpg,-1\nzebra/i.jpg,0\n")
    build(image_tree, tmp_path / "p", config(labels=t))
    pack = packer.load(tmp_path / "p")
    assert pack.classes == [] and pack.labels.tolist() == [7, -1, 0]
    assert pack.labels.dtype == torch.int64
    rc, out, _ = run("verify", tmp_path / "p", "--no-speed", "--no-source")
    assert rc == 0, out
    rc, out, _ = run("info", tmp_path / "p")
    assert "classes   none (integer labels from the table; -1 = no label)" in out


def test_csv_with_names_through_a_pack_map(image_tree: Path, tmp_path: Path) -> None:
    build(image_tree, tmp_path / "train", config())
    t = write(tmp_path / "l.csv", "path,label\ncat/a.jpg,zebra\ndog/e.jpg,cat\n")
    build(image_tree, tmp_path / "p", config(labels=t, classes=tmp_path / "train"))
    pack = packer.load(tmp_path / "p")
    assert pack.classes == ["cat", "dog", "zebra"] and pack.labels.tolist() == [2, 0]
    assert list(pack.manifest.class_counts) == [1, 0, 1]


def test_csv_with_targets_exact_in_the_pack(image_tree: Path, tmp_path: Path) -> None:
    t = write(tmp_path / "l.csv", TABLE)
    (image_tree / "dog" / "e.jpg").write_bytes(b"broken")  # a listed file that fails to decode
    rc, out, err = build_cli(
        image_tree, tmp_path / "p", "--labels", t, "--targets", "score, age", "--json"
    )
    assert rc == 0, err
    res = json.loads(out)
    assert res["targets"] == ["score", "age"] and res["ignored"] == 9
    assert {s["path"]: s["reason"] for s in res["skipped"]}.keys() == {"gone.jpg", "dog/e.jpg"}
    reasons = {s["path"]: s["reason"] for s in res["skipped"]}
    assert reasons["gone.jpg"] == f"listed in {t} row 5 but not found under SRC"
    pack = packer.load(tmp_path / "p")
    assert pack.sources == ["cat/a.jpg", "dog/nested/f.png", "zebra/i.jpg"]
    # the kept rows' values, in pack order, exactly as float32 reads them from the text
    want = np.array([[0.2, 1], [-0.3, 2.25], [0.1, 3.5]], dtype=np.float64).astype(np.float32)
    assert pack.targets.dtype == torch.float32 and pack.targets.shape == (3, 2)
    assert np.array_equal(pack.targets.numpy(), want)
    assert pack.target_names == ["score", "age"]
    assert torch.equal(pack[1:].targets, pack.targets[1:])
    raw = np.fromfile(tmp_path / "p" / "_tensordict" / "targets.memmap", dtype="<f4")
    assert np.array_equal(raw.reshape(3, 2), want)
    m = json.loads((tmp_path / "p" / "imgpack.json").read_text())
    assert m["targets"] == {"names": ["score", "age"], "dtype": "float32", "shape": [3, 2]}
    assert m["label_dtype"] == "int64" and m["label_shape"] == [3]
    info = describe(tmp_path / "p")
    assert info["targets"] == m["targets"]
    rc, out, _ = run("info", tmp_path / "p")
    assert "targets   float32 [3, 2]: score, age" in out


def test_tensordict_reads_a_pack_with_targets(image_tree: Path, tmp_path: Path) -> None:
    from tensordict import TensorDict

    t = write(tmp_path / "l.csv", TABLE)
    build(image_tree, tmp_path / "p", config(labels=t, targets=("age",)))
    meta = json.loads((tmp_path / "p" / "_tensordict" / "meta.json").read_text())
    assert meta["targets"]["dtype"] == "torch.float32" and meta["targets"]["shape"] == [4, 1]
    td = TensorDict.load_memmap(tmp_path / "p" / "_tensordict")
    pack = packer.load(tmp_path / "p")
    assert torch.equal(td["targets"], pack.targets) and torch.equal(td["labels"], pack.labels)


def test_flat_folder_with_a_table(tmp_path: Path) -> None:
    for i in range(3):
        write_image(tmp_path / "flat" / f"{i}.png", seed=i)
    t = write(tmp_path / "l.tsv", "path\tlabel\n2.png\tb\n0.png\ta\n")
    r = build(tmp_path / "flat", tmp_path / "p", config(labels=t))
    pack = packer.load(tmp_path / "p")
    assert pack.sources == ["0.png", "2.png"] and pack.labels.tolist() == [0, 1]
    assert r.ignored == 1 and r.skipped == []


@pytest.mark.parametrize(
    ("text", "extra", "message"),
    [
        (
            "path,lbl\ncat/a.jpg,x\n",
            [],
            r"l.csv row 1 \(the header\): missing column\(s\) 'label'; it has 'path', 'lbl'",
        ),
        (
            "path,label\ncat/a.jpg,x\ndog/e.jpg,y\ncat/a.jpg,z\n",
            [],
            r"l.csv: rows 2 and 4 \(header = row 1\) both list 'cat/a.jpg'",
        ),
        (
            "path,label\ncat/a.jpg,cat\n\ndog/e.jpg,wolf\n",
            ["--classes", "{map}"],
            r"l.csv row 4 \(header = row 1\): label 'wolf' is not a class of the class map",
        ),
        (
            "path,label,age\ncat/a.jpg,x,1\ndog/e.jpg,y,old\n",
            ["--targets", "age"],
            r"l.csv row 3 \(header = row 1\): target 'age' is 'old', not a number",
        ),
        (
            "path,label\ncat/a.jpg,x\n../secret.jpg,y\n",
            [],
            r"l.csv row 3 \(header = row 1\): path '../secret.jpg' contains '..'",
        ),
        (
            "path,label\n/etc/a.jpg,y\n",
            [],
            r"l.csv row 2 \(header = row 1\): path '/etc/a.jpg' is absolute",
        ),
        (
            "path,label\ncat/a.jpg,0.5\n",
            [],
            r"l.csv row 2 \(header = row 1\): label '0.5' is a number but not an integer",
        ),
        (
            "path,label,age\ncat/a.jpg,x,1\n",
            ["--targets", "age,height"],
            r"l.csv row 1 \(the header\): missing column\(s\) 'height'",
        ),
    ],
)
def test_bad_tables_exit_2_with_the_row(
    image_tree: Path, tmp_path: Path, text: str, extra: list[str], message: str
) -> None:
    t = write(tmp_path / "l.csv", text)
    m = write(tmp_path / "classes.txt", "cat\ndog\n")
    args = [a.replace("{map}", str(m)) for a in extra]
    rc, _, err = build_cli(image_tree, tmp_path / "p", "--labels", t, *args)
    assert rc == 2
    line = error_line(err)
    assert line.startswith(f"Error: {t}") and re.search(message, line), line
    assert not (tmp_path / "p").exists()


def test_table_naming_no_image_is_an_error(image_tree: Path, tmp_path: Path) -> None:
    t = write(tmp_path / "l.csv", "path,label\nimgs/cat/a.jpg,x\n")
    rc, _, err = build_cli(image_tree, tmp_path / "p", "--labels", t)
    assert rc == 2
    assert error_line(err) == (
        f"Error: {t}: none of its 1 rows names an image under {image_tree} "
        "(first: 'imgs/cat/a.jpg'); paths are relative to SRC, check SRC and the table"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--targets", "age"], "Error: --targets names columns of a label table; give the"),
        (["--allow-new-classes"], "Error: --allow-new-classes extends a fixed class map; give"),
        (["--labels", "{t}", "--targets", "age,,x"], "Error: --targets: empty or padded"),
        (["--labels", "{t}", "--targets", "label"], "Error: --targets: 'label' is not a target"),
        (["--labels", "{tmp}/l.xlsx"], "Error: {tmp}/l.xlsx: unknown label table type '.xlsx'"),
        (["--classes", "{tmp}/nope.txt"], "Error: {tmp}/nope.txt: no such class map"),
    ],
)
def test_bad_label_options_exit_2(
    image_tree: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    t = write(tmp_path / "l.csv", TABLE)
    fmt = {"t": str(t), "tmp": str(tmp_path)}
    rc, _, err = build_cli(image_tree, tmp_path / "p", *[a.format(**fmt) for a in args])
    assert rc == 2
    assert error_line(err).startswith(message.format(**fmt)), err


def test_config_takes_paths_as_str_and_columns_as_a_list(tmp_path: Path) -> None:
    c = BuildConfig(classes="c.txt", labels="l.csv", targets=["a", "b"])  # type: ignore[arg-type]
    assert c.classes == Path("c.txt") and c.labels == Path("l.csv") and c.targets == ("a", "b")
    with pytest.raises(UsageError, match="named twice"):
        BuildConfig(labels=Path("l.csv"), targets=("a", "a")).validate()


def test_human_summary_counts_ignored_images(image_tree: Path, tmp_path: Path) -> None:
    t = write(tmp_path / "l.csv", TABLE)
    rc, _, err = build_cli(image_tree, tmp_path / "p", "--labels", t)
    assert rc == 0, err
    assert "  skipped gone.jpg: listed in" in err
    assert re.search(
        rf"Packed 4 images .* \(1 skipped, bad input\) \(9 not in {re.escape(str(t))}: ignored\)",
        err,
    )
    rc, out, _ = run("info", tmp_path / "p")
    assert f"labels    from {t.resolve()} (9 images under the source had no row: ignored)" in out


# ---------------------------------------------------------------- resume, verify, load


def _same_pack(a: Path, b: Path) -> None:
    for f in FILES:
        pa, pb = a / "_tensordict" / f, b / "_tensordict" / f
        assert pa.is_file() == pb.is_file() and (
            not pa.is_file() or pa.read_bytes() == pb.read_bytes()
        ), f
    ma, mb = (json.loads((p / "imgpack.json").read_text()) for p in (a, b))
    for m in (ma, mb):
        del m["build"]["created"]
    assert ma == mb


def test_resume_after_interrupt_with_a_table_is_byte_identical(
    tmp_path: Path,
) -> None:
    src = tmp_path / "flat"
    rows = ["path,label,w"]
    for i in range(300):  # 300 images, 2 per chunk: the interrupt leaves most undone
        write_image(src / f"{i:03d}.png", (6, 5), seed=i)
        rows.append(f"{i:03d}.png,{'ab'[i % 2]},{i / 7}")
    t = write(tmp_path / "l.csv", "\n".join(rows) + "\n")
    cfg = config(labels=t, targets=("w",))
    build(src, tmp_path / "ref", cfg)

    def interrupt(n: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build(src, tmp_path / "p", cfg, progress=interrupt)
    r = build(src, tmp_path / "p", cfg)
    assert r.resumed >= 1 and r.count == 300
    _same_pack(tmp_path / "p", tmp_path / "ref")
    pack = packer.load(tmp_path / "p")
    want = (np.arange(300, dtype=np.float64) / 7).astype(np.float32)
    assert np.array_equal(pack.targets[:, 0].numpy(), want)


def test_changed_table_does_not_resume_an_old_run(tmp_path: Path) -> None:
    src = tmp_path / "flat"
    for i in range(4):
        write_image(src / f"{i}.png", (6, 5), seed=i)
    t = write(tmp_path / "l.csv", "path,label,w\n0.png,a,1\n1.png,a,2\n2.png,b,3\n3.png,b,4\n")

    def interrupt(n: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build(src, tmp_path / "p", config(labels=t, targets=("w",)), progress=interrupt)
    write(tmp_path / "l.csv", "path,label,w\n0.png,a,1\n1.png,a,2\n2.png,b,3\n3.png,b,5\n")
    r = build(src, tmp_path / "p", config(labels=t, targets=("w",)))
    assert r.resumed == 0
    assert packer.load(tmp_path / "p").targets[:, 0].tolist() == [1, 2, 3, 5]


def test_pack_with_targets_verifies_and_a_tampered_target_fails(
    image_tree: Path, tmp_path: Path
) -> None:
    t = write(tmp_path / "l.csv", TABLE)
    build(image_tree, tmp_path / "p", config(labels=t, targets=("age", "score")))
    rc, out, _ = run("verify", tmp_path / "p", "--no-speed")
    assert rc == 0, out
    assert "targets ['age', 'score'] match" in out
    f = tmp_path / "p" / "_tensordict" / "targets.memmap"
    a = np.fromfile(f, dtype="<f4")
    a[0] += 1
    f.write_bytes(a.tobytes())
    rc, out, _ = run("verify", tmp_path / "p", "--no-speed")
    assert rc == 1 and "targets checksum mismatch" in out


def _edit(pack: Path, change) -> None:
    m = json.loads((pack / "imgpack.json").read_text())
    change(m)
    (pack / "imgpack.json").write_text(json.dumps(m))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda m: m.update(label_dtype="float32"),
            "labels recorded as 'float32', expected 'int64'",
        ),
        (lambda m: m.update(label_dtype="int32"), "labels recorded as 'int32', expected 'int64'"),
        (lambda m: m["targets"].update(dtype="float64"), "targets recorded as"),
        (lambda m: m["targets"].update(dtype="int64"), "targets recorded as"),
        (lambda m: m["targets"].update(shape=[4, 1]), "targets recorded as"),
        (lambda m: m["targets"].update(names=["age", "age"]), "targets recorded as"),
        (lambda m: m.pop("targets"), "'checksums.targets' must be given exactly when"),
        (
            lambda m: [m.pop("targets"), m["checksums"].pop("targets")],
            "unexpected file _tensordict/targets.memmap",
        ),
        (lambda m: m["checksums"].pop("targets"), "'checksums.targets' is missing or not a"),
    ],
)
def test_tampered_label_records_are_refused_on_load(
    image_tree: Path, tmp_path: Path, change, message: str
) -> None:
    t = write(tmp_path / "l.csv", TABLE)
    p = tmp_path / "p"
    build(image_tree, p, config(labels=t, targets=("age", "score")))
    _edit(p, change)
    with pytest.raises(PackFormatError, match=re.escape(message)) as e:
        packer.load(p)
    assert str(e.value).startswith(str(p))
    if "unexpected file" not in message:  # info reads the manifest, not the data files
        rc, _, err = run("info", p)
        assert rc == 2 and message in error_line(err)


def test_targets_file_of_the_wrong_size_is_refused(image_tree: Path, tmp_path: Path) -> None:
    t = write(tmp_path / "l.csv", TABLE)
    p = tmp_path / "p"
    build(image_tree, p, config(labels=t, targets=("age", "score")))
    f = p / "_tensordict" / "targets.memmap"
    f.write_bytes(f.read_bytes()[:-4])
    with pytest.raises(PackFormatError, match=r"targets.memmap is 28 bytes, the manifest says 32"):
        packer.load(p)


def test_class_to_idx_and_target_names_belong_to_the_whole_pack(packed: Path) -> None:
    pack = packer.load(packed)
    assert pack.class_to_idx == {"cat": 0, "dog": 1, "zebra": 2}
    assert pack.target_names == [] and pack.targets is None and pack[1:3].targets is None
    with pytest.raises(AttributeError, match="class_to_idx"):
        _ = pack[1:3].class_to_idx


KILL_AFTER_FIRST_CHUNK = """
import os, signal, sys
from pathlib import Path
from packer.builder.run import BuildConfig, build

def progress(n):
    os.kill(os.getpid(), signal.SIGKILL)  # the journal line of one chunk is on disk

build(sys.argv[1], sys.argv[2], BuildConfig(size=(8, 6), workers=1, labels=Path(sys.argv[3]),
      targets=("w",)), progress=progress)
"""


def test_killed_build_with_a_table_resumes_byte_identical(tmp_path: Path) -> None:
    import subprocess
    import sys

    src = tmp_path / "flat"
    rows = ["path,label,w"]
    for i in range(40):
        write_image(src / f"{i:02d}.png", (6, 5), seed=i)
        rows.append(f"{i:02d}.png,{'ab'[i % 2]},{i / 3}")
    t = write(tmp_path / "l.csv", "\n".join(rows) + "\n")
    script = write(tmp_path / "kill.py", KILL_AFTER_FIRST_CHUNK)
    env = subprocess_env()
    p = subprocess.run(
        [sys.executable, str(script), str(src), str(tmp_path / "p"), str(t)], env=env, timeout=60
    )
    assert p.returncode == -9 and not (tmp_path / "p").exists()
    cfg = config(labels=t, targets=("w",))
    r = build(src, tmp_path / "p", cfg)
    assert r.resumed >= 1 and r.count == 40
    build(src, tmp_path / "ref", cfg)
    _same_pack(tmp_path / "p", tmp_path / "ref")


@pytest.mark.parametrize("step", ["data", "labels", "manifest", "assembled"])
def test_crash_in_finalize_with_targets_resumes_to_the_same_pack(
    image_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    t = write(tmp_path / "l.csv", TABLE)
    (image_tree / "dog" / "e.jpg").write_bytes(b"broken")  # compaction subsets the targets
    cfg = config(labels=t, targets=("age", "score"))
    build(image_tree, tmp_path / "ref", cfg)

    def crash(name: str) -> None:
        if name == step:
            raise RuntimeError(f"crash after {name}")

    monkeypatch.setattr(packer.builder.finalize, "_reached", crash)
    with pytest.raises(RuntimeError, match="crash after"):
        build(image_tree, tmp_path / "p", cfg)
    monkeypatch.undo()
    r = build(image_tree, tmp_path / "p", cfg)
    assert r.count == 3 and r.ignored == 9 and r.targets == ["age", "score"]
    _same_pack(tmp_path / "p", tmp_path / "ref")


def test_missing_rows_make_no_classes(src: Path, tmp_path: Path) -> None:
    # 'ant' and 'bee' sort before cat/dog; only missing rows carry them
    table = "path,label\nant/0.png,ant\ncat/0.png,cat\nbee/1.png,bee\ndog/0.png,dog\n"
    code, _, err = _build(src, tmp_path / "p", "--labels", write(tmp_path / "t.csv", table))
    assert code == 0, err
    p = packer.load(tmp_path / "p")
    assert p.classes == ["cat", "dog"] and p.labels.tolist() == [0, 1]
    assert packer.class_histogram(p) == {"cat": 1, "dog": 1}


def test_missing_rows_with_a_map_keep_the_map_and_only_found_new_classes(
    src: Path, tmp_path: Path
) -> None:
    cmap = write(tmp_path / "c.txt", "dog\ncat\n")
    table = "path,label\ncat/0.png,cat\nzzz/1.png,ant\ndog/0.png,emu\n"
    code, _, err = _build(
        src,
        tmp_path / "p",
        "--labels",
        write(tmp_path / "t.csv", table),
        "--classes",
        cmap,
        "--allow-new-classes",
    )
    assert code == 0, err
    p = packer.load(tmp_path / "p")
    assert p.classes == ["dog", "cat", "emu"] and p.labels.tolist() == [1, 2]


def test_many_missing_rows_are_capped_in_the_manifest(src: Path, tmp_path: Path) -> None:
    n = MAX_MISSING_LISTED + 500
    rows = "".join(f"gone/{i}.png,c{i % 7}\n" for i in range(n))
    f = write(tmp_path / "t.csv", "path,label\ncat/0.png,cat\n" + rows)
    code, out, err = _build(src, tmp_path / "p", "--labels", f, "--json")
    assert code == 0, err
    res = json.loads(out)
    assert res["classes"] == ["cat"]
    assert len(res["skipped"]) == MAX_MISSING_LISTED + 1
    assert f"and 500 more rows that name no image under SRC ({n} in all" in json.dumps(res)
    m = json.loads((tmp_path / "p" / "imgpack.json").read_text())
    assert len(m["skipped"]) == MAX_MISSING_LISTED + 1 and m["build"]["missing_rows"] == n
    packer.load(tmp_path / "p")  # the manifest still reads


def test_targets_key_agrees_between_build_and_info(src: Path, tmp_path: Path) -> None:
    code, out, _ = _build(src, tmp_path / "p", "--json")
    assert code == 0 and "targets" in json.loads(out) and json.loads(out)["targets"] is None
    code, info, _ = _cli("info", tmp_path / "p", "--json")
    assert code == 0 and json.loads(info)["targets"] is None
    f = write(tmp_path / "t.csv", "path,label,w\ncat/0.png,cat,1\ndog/0.png,dog,2\n")
    code, out, _ = _build(src, tmp_path / "q", "--labels", f, "--targets", "w", "--json")
    assert code == 0 and json.loads(out)["targets"] == ["w"]


def test_unicode_forms_build_end_to_end(tmp_path: Path) -> None:
    nfc, nfd = (unicodedata.normalize(f, "a/café.png") for f in ("NFC", "NFD"))
    write_image(tmp_path / "src" / nfc, (12, 10), seed=1)
    write_image(tmp_path / "src" / nfd, (12, 10), seed=2)
    f = write(tmp_path / "t.csv", f"path,label\n{nfc},red\n")
    code, out, err = _build(tmp_path / "src", tmp_path / "p", "--labels", f, "--json")
    assert code == 0, err
    assert json.loads(out)["count"] == 1 and json.loads(out)["ignored"] == 1
    assert list(packer.load(tmp_path / "p").sources) == [nfc]
