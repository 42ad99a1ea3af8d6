"""Regressions for the adversarial tester's findings (issue 16's standard): each test
fails on the code before the fix and covers the class of problem, not one input."""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import torch

import packer
from conftest import cli_build as _build
from conftest import cli_run as _cli
from conftest import write_image
from packer.build.run import BuildConfig, build
from packer.errors import InputError, UsageError
from packer.pack.reader import read_class_map
from packer.sources.labels import MAX_MISSING_LISTED, apply_table, list_source_images, read_table


@pytest.fixture(scope="module")
def pack6(tmp_path_factory: pytest.TempPathFactory) -> packer.ImagePack:
    """6 images in 2 classes (cat, dog), 8x8."""
    root = tmp_path_factory.mktemp("brk")
    for c in ("cat", "dog"):
        for i in range(3):
            write_image(root / "src" / c / f"{i}.png", (20, 16), seed=i)
    build(root / "src", root / "p", BuildConfig(size=(8, 8), workers=1))
    return packer.load(root / "p")


def _loader(pack: packer.ImagePack, bs: int = 2, **kw: object) -> packer.PackLoader:
    return packer.PackLoader(pack, bs, device="cpu", shuffle=False, **kw)  # type: ignore[arg-type]


# ---- 1: a transform must keep the batch pairing (Tensor, same B, uint8/float, device)


@pytest.mark.parametrize(
    ("transform", "match"),
    [
        (lambda x: x[:1], "keep the batch size"),
        (lambda x: x.reshape(-1), "keep the batch size"),
        (lambda x: x.to(torch.int32), "uint8 or floating point"),
        (lambda x: None, "not a Tensor"),
        (lambda x: (x, x), "not a Tensor"),
        (lambda x: x.numpy(), "not a Tensor"),
    ],
)
@pytest.mark.parametrize("resident", [False, True])
def test_transform_output_is_checked(pack6, transform, match: str, resident: bool) -> None:
    with pytest.raises(UsageError, match=rf"transform .*lambda.*{match}"):
        list(_loader(pack6, 4, transform=transform, resident=resident))


def test_transform_float_and_resize_are_allowed(pack6) -> None:
    out = list(_loader(pack6, 4, transform=lambda x: x[:, :, :4, :4].float() / 255))
    assert [tuple(x.shape) for x, _ in out] == [(4, 3, 4, 4), (2, 3, 4, 4)]
    assert all(x.dtype == torch.float32 and len(y) == len(x) for x, y in out)


# ---- 5: a mid-epoch state from a loader over other rows is refused


def test_state_of_other_rows_refused_mid_epoch(pack6) -> None:
    a = _loader(pack6, indices=[0, 1, 2])
    it = iter(a)
    next(it)
    state = a.state_dict()
    assert isinstance(state["rows"], str)
    with pytest.raises(UsageError, match="streaming other rows"):
        _loader(pack6, indices=[3, 4, 5]).load_state_dict(state)
    with pytest.raises(UsageError, match="streaming other rows"):
        _loader(pack6, indices=[2, 1, 0]).load_state_dict(state)
    b = _loader(pack6, indices=[0, 1, 2])
    b.load_state_dict(state)  # the same rows: fine
    assert [y.tolist() for _, y in b] == [[pack6.labels[2].item()]]
    # at an epoch boundary only the epoch is taken: another subset may go on from there
    boundary = dict(state, batches=0, epoch=3)
    c = _loader(pack6, indices=[3, 4, 5])
    c.load_state_dict(boundary)
    assert c.epoch == 3


# ---- 7, 14: empty epochs warn; [] is an empty index set


@pytest.mark.parametrize(
    "kw",
    [
        dict(bs=4, drop_last=True, rank=0, world_size=4),
        dict(bs=1, even_split="trim", rank=0, world_size=8),
        dict(bs=2, indices=[]),
        dict(bs=2, indices=()),
    ],
)
def test_zero_batch_epochs_warn(pack6, kw: dict, caplog: pytest.LogCaptureFixture) -> None:
    bs = kw.pop("bs")
    with caplog.at_level(logging.WARNING, logger="packer.loading.loader"):
        ld = _loader(pack6, bs, **kw)
    assert len(ld) == 0 and list(ld) == []
    assert "0 batches" in caplog.text


def test_nonempty_epoch_does_not_warn(pack6, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="packer.loading.loader"):
        _loader(pack6, 4, drop_last=True)
    assert "0 batches" not in caplog.text


# ---- 11, 12: every argument and state field checked, never cast


@pytest.mark.parametrize(
    ("kw", "name"),
    [
        (dict(seed="x"), "seed"),
        (dict(seed=1.9), "seed"),
        (dict(seed=2**64), "seed"),
        (dict(prefetch="4"), "prefetch"),
        (dict(prefetch=0), "prefetch"),
        (dict(num_threads=-1), "num_threads"),
        (dict(num_threads=2.0), "num_threads"),
        (dict(rank="0", world_size=2), "rank"),
        (dict(world_size=True), "world_size"),
        (dict(shuffle=1), "shuffle"),
        (dict(drop_last="yes"), "drop_last"),
        (dict(indices=[2**64]), "indices"),
        (dict(indices="abc"), "indices"),
        (dict(indices={1, 2}), "indices"),
        (dict(indices=[0.0, 1.0]), "indices"),
        (dict(indices=np.array([0, 2**63], dtype=np.uint64)), "indices"),
    ],
)
def test_bad_constructor_arguments(pack6, kw: dict, name: str) -> None:
    with pytest.raises(UsageError, match=name):
        packer.PackLoader(pack6, 2, device="cpu", **kw)


@pytest.mark.parametrize("bs", [True, 1.5, "2", 0])
def test_bad_batch_size(pack6, bs: object) -> None:
    with pytest.raises(UsageError, match="batch_size"):
        packer.PackLoader(pack6, bs, device="cpu")  # type: ignore[arg-type]


def test_numpy_ints_are_ints(pack6) -> None:
    ld = packer.PackLoader(pack6, np.int64(2), device="cpu", seed=np.int32(3))
    assert (ld.batch_size, ld.seed) == (2, 3) and type(ld.seed) is int


@pytest.mark.parametrize(
    ("change", "name"),
    [
        (dict(epoch="x"), "epoch"),
        (dict(epoch=None), "epoch"),
        (dict(epoch=2**70), "epoch"),
        (dict(epoch=2.9), "epoch"),
        (dict(epoch=-1), "epoch"),
        (dict(batches=True), "batches"),
        (dict(batches=1.5), "batches"),
        (dict(batches="1"), "batches"),
        (dict(batches=-1), "batches"),
        (dict(version=True), "version"),
    ],
)
def test_bad_state_fields(pack6, change: dict, name: str) -> None:
    a = _loader(pack6)
    next(iter(a))
    state = dict(a.state_dict(), **change)
    with pytest.raises(UsageError, match=name):
        _loader(pack6).load_state_dict(state)


@pytest.mark.parametrize("state", [[1, 2], "abc", None])
def test_state_not_a_dict(pack6, state: object) -> None:
    with pytest.raises(UsageError, match="not a PackLoader state"):
        _loader(pack6).load_state_dict(state)  # type: ignore[arg-type]


def test_set_epoch_refuses_non_int(pack6) -> None:
    for bad in (1.5, "2", True):
        with pytest.raises(UsageError, match="epoch"):
            _loader(pack6).set_epoch(bad)  # type: ignore[arg-type]
        with pytest.raises(UsageError, match="epoch"):
            _loader(pack6).indices(bad)  # type: ignore[arg-type]


def test_dataset_indices_are_not_truncated(pack6) -> None:
    ds = packer.PackDataset(pack6)
    for bad in (0.9, True, "1"):
        with pytest.raises(TypeError, match="integer"):
            ds[bad]  # type: ignore[index]
    with pytest.raises(TypeError, match="integer"):
        ds.__getitems__([3.7])
    assert ds[np.int64(1)][1] == ds[1][1] == ds[torch.tensor(1)][1]
    with pytest.raises(UsageError, match="indices"):
        packer.class_histogram(pack6, torch.tensor([2.9, 3.9]))
    with pytest.raises(UsageError, match="seed"):
        packer.split(pack6, seed=1.5)


# ---- 6: class_histogram counts every value, whatever its size


def test_class_histogram_counts_out_of_range_and_huge_labels(pack6) -> None:
    class Fake:
        def __init__(self) -> None:
            self.classes = ["cat", "dog"]
            self.labels = torch.tensor([0, 1, 5, 2**63 - 1, -1, 5], dtype=torch.int64)

        def __len__(self) -> int:
            return 6

    hist = packer.class_histogram(Fake())  # type: ignore[arg-type]
    assert hist == {"cat": 1, "dog": 1, "5": 2, str(2**63 - 1): 1, "(unlabeled)": 1}
    assert list(hist)[:2] == ["cat", "dog"]
    assert packer.class_histogram(pack6, torch.tensor([True] * 6)) == {"cat": 3, "dog": 3}


# ---- labels and build (items 3, 4, 8, 9, 13, 15, 16, 17, 18)


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8", newline="")
    return path


def _returns_within(fn, seconds: float = 10.0) -> BaseException | None:
    """Run ``fn`` in a daemon thread; the exception it raised, failing if it blocks."""
    out: list[BaseException | None] = []

    def go() -> None:
        try:
            fn()
            out.append(None)
        except BaseException as e:
            out.append(e)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(seconds)
    assert out, "blocked reading a non-regular file"
    return out[0]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifo_class_map_and_table_are_refused_not_read(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "classes")
    os.mkfifo(tmp_path / "t.csv")
    os.symlink(tmp_path / "t.csv", tmp_path / "link.csv")
    for fn, name in (
        (lambda: read_class_map(tmp_path / "classes"), "classes"),
        (lambda: read_table(tmp_path / "t.csv"), "t.csv"),
        (lambda: read_table(tmp_path / "link.csv"), "link.csv"),
    ):
        e = _returns_within(fn)
        assert isinstance(e, InputError) and str(e).endswith(f"{name}: not a regular file"), e


def test_deep_manifest_as_class_map_is_refused(tmp_path: Path) -> None:
    deep = tmp_path / "deep"
    _write(deep / "imgpack.json", '{"format":"imgpack","x":' + "[" * 100000 + "]" * 100000 + "}")
    with pytest.raises(InputError, match="nested too deeply"):
        read_class_map(deep)


def test_unicode_forms_never_label_two_files(tmp_path: Path) -> None:
    nfc, nfd = (
        unicodedata.normalize("NFC", "a/café.jpg"),
        unicodedata.normalize("NFD", "a/café.jpg"),
    )
    t = read_table(_write(tmp_path / "t.csv", f"path,label\n{nfc},red\n"))
    # both files exist (distinct on Linux): the row labels the one it writes exactly
    m = apply_table(t, sorted([nfc, nfd]))
    assert [e.rel for e in m.entries] == [nfc] and m.ignored == 1
    # only the other form on disk: folded, as before
    assert [e.rel for e in apply_table(t, [nfd]).entries] == [nfd]
    t4 = read_table(_write(tmp_path / "t4.csv", "path,label\nd/\u1e69.jpg,red\n"))  # ṩ
    forms = ["d/s\u0323\u0307.jpg", "d/s\u0307\u0323.jpg"]  # both fold to ṩ, neither exact
    with pytest.raises(InputError, match=r"t4.csv row 2: .*matches .* and .* Unicode forms"):
        apply_table(t4, forms)
    # two rows in different forms reaching one file
    t5 = read_table(_write(tmp_path / "t5.csv", f"path,label\n{nfc},red\n{nfd},blue\n"))
    with pytest.raises(InputError, match="rows 2 and 3 both name"):
        apply_table(t5, [nfd])


def test_folder_row_is_called_a_folder(src: Path, tmp_path: Path) -> None:
    (src / "dog" / "dir.jpg").mkdir()
    t = read_table(_write(tmp_path / "t.csv", "path,label\ndog/dir.jpg/,dog\ncat/0.png,cat\n"))
    m = apply_table(t, list_source_images(src), src=src)
    assert dict(m.missing)["dog/dir.jpg"].endswith("is a folder, not an image")


@pytest.mark.parametrize(
    ("table", "match"),
    [
        ('path,label\ncat/0.png,"ca\nt"\n', r"row 2 .*control character '\\n'"),
        ("path,label\ncat/0.png,ca\x1bt\n", r"row 2 .*control character '\\x1b'"),
        ("path,label\ncat/0.png,cat\ncat/1.png,d\u2028g\n", r"row 3 .*control character"),
    ],
)
def test_control_characters_in_table_labels(tmp_path: Path, table: str, match: str) -> None:
    with pytest.raises(InputError, match=match):
        read_table(_write(tmp_path / "t.csv", table))


@pytest.mark.parametrize("text", ["cat\ndo\x07g\n", "cat\nd\x1cog\n", "cat\nd\u2028og\n"])
def test_control_characters_in_class_map(tmp_path: Path, text: str) -> None:
    with pytest.raises(InputError, match=r"classes.txt line 2: .*control character"):
        read_class_map(_write(tmp_path / "classes.txt", text))


@pytest.mark.parametrize(
    "label", ["99999999999999999999", "9223372036854775808", str(2**31), "+2147483648"]
)
def test_integer_labels_are_bounded(tmp_path: Path, label: str) -> None:
    with pytest.raises(InputError, match=rf"t.csv row 3 .*label {re.escape(label)} out of range"):
        read_table(_write(tmp_path / "t.csv", f"path,label\na.jpg,0\nb.jpg,{label}\n"))
    ok = read_table(_write(tmp_path / "ok.csv", f"path,label\na.jpg,-1\nb.jpg,{2**31 - 1}\n"))
    assert ok.labels.tolist() == [-1, 2**31 - 1]


@pytest.mark.parametrize("label", ["inf", "-inf", "nan", "NaN", "Infinity", "+INF"])
def test_nonfinite_labels_are_not_class_names(tmp_path: Path, label: str) -> None:
    with pytest.raises(InputError, match="is a number but not an integer"):
        read_table(_write(tmp_path / "t.csv", f"path,label\na.jpg,cat\nb.jpg,{label}\n"))


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("1_000", "not a number .*plain decimal"),
        ("0x10", "not a number"),
        ("1e-50", "float32 stores as 0"),
        ("-1e-46", "float32 stores as 0"),
        ("nan", "must be finite"),
        ("-Infinity", "must be finite"),
    ],
)
def test_target_number_syntax(tmp_path: Path, value: str, match: str) -> None:
    f = _write(tmp_path / "t.csv", f"path,label,w\na.jpg,cat,1\nb.jpg,cat,{value}\n")
    with pytest.raises(InputError, match=rf"row 3 .*{match}"):
        read_table(f, targets=["w"])


def test_target_plain_forms_still_read(tmp_path: Path) -> None:
    f = _write(
        tmp_path / "t.csv", "path,label,w\na,c,1000\nb,c,-2.5e-3\nc,c,.5\nd,c,0\ne,c,1e-40\n"
    )
    assert read_table(f, targets=["w"]).targets[:, 0].tolist() == pytest.approx(
        [1000, -2.5e-3, 0.5, 0, 1e-40], rel=1e-3
    )


def test_missing_rows_make_no_classes(src: Path, tmp_path: Path) -> None:
    # 'ant' and 'bee' sort before cat/dog; only missing rows carry them
    table = "path,label\nant/0.png,ant\ncat/0.png,cat\nbee/1.png,bee\ndog/0.png,dog\n"
    code, _, err = _build(src, tmp_path / "p", "--labels", _write(tmp_path / "t.csv", table))
    assert code == 0, err
    p = packer.load(tmp_path / "p")
    assert p.classes == ["cat", "dog"] and p.labels.tolist() == [0, 1]
    assert packer.class_histogram(p) == {"cat": 1, "dog": 1}


def test_missing_rows_with_a_map_keep_the_map_and_only_found_new_classes(
    src: Path, tmp_path: Path
) -> None:
    cmap = _write(tmp_path / "c.txt", "dog\ncat\n")
    table = "path,label\ncat/0.png,cat\nzzz/1.png,ant\ndog/0.png,emu\n"
    code, _, err = _build(
        src,
        tmp_path / "p",
        "--labels",
        _write(tmp_path / "t.csv", table),
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
    f = _write(tmp_path / "t.csv", "path,label\ncat/0.png,cat\n" + rows)
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
    f = _write(tmp_path / "t.csv", "path,label,w\ncat/0.png,cat,1\ndog/0.png,dog,2\n")
    code, out, _ = _build(src, tmp_path / "q", "--labels", f, "--targets", "w", "--json")
    assert code == 0 and json.loads(out)["targets"] == ["w"]


def test_unicode_forms_build_end_to_end(tmp_path: Path) -> None:
    nfc, nfd = (unicodedata.normalize(f, "a/café.png") for f in ("NFC", "NFD"))
    write_image(tmp_path / "src" / nfc, (12, 10), seed=1)
    write_image(tmp_path / "src" / nfd, (12, 10), seed=2)
    f = _write(tmp_path / "t.csv", f"path,label\n{nfc},red\n")
    code, out, err = _build(tmp_path / "src", tmp_path / "p", "--labels", f, "--json")
    assert code == 0, err
    assert json.loads(out)["count"] == 1 and json.loads(out)["ignored"] == 1
    assert list(packer.load(tmp_path / "p").sources) == [nfc]
