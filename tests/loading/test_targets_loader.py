"""Issue 15, the loader side: a pack's float32 targets [N, K] through PackLoader (CPU,
resident, subsets, ranks, resume, CUDA), PackDataset, split/class_histogram with integer
labels and -1, ``imgpack info --split`` and verify's ``--trace`` on such a pack."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch.utils.data import DataLoader

import packer
from packer.cli import cli
from packer.errors import UsageError


def image_paths(root: Path) -> list[str]:
    return sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and p.suffix != ".txt"
    )


def build_with_table(src: Path, dst: Path, labels: list[str], targets: bool = True) -> Path:
    """A pack of every image under ``src`` with these labels (one per sorted path) and,
    with ``targets``, two target columns whose values differ on every row."""
    paths = image_paths(src)
    assert len(paths) == len(labels)
    head = "path,label,a,b" if targets else "path,label"
    rows = [head]
    for i, (p, lab) in enumerate(zip(paths, labels)):
        rows.append(f"{p},{lab},{i * 0.25 - 1},{100 + i / 3}" if targets else f"{p},{lab}")
    table = dst.parent / f"{dst.name}.csv"
    table.write_text("\n".join(rows) + "\n", encoding="utf-8")
    cfg = packer.BuildConfig(
        size=(16, 12), labels=table, targets=("a", "b") if targets else (), workers=1
    )
    packer.build_pack(src, dst, cfg)
    return dst


@pytest.fixture
def tpack(image_tree: Path, tmp_path: Path) -> Path:
    """image_tree (13 images) at 16x12 with class-name labels and targets a, b."""
    labels = [p.split("/")[0] for p in image_paths(image_tree)]
    return build_with_table(image_tree, tmp_path / "tpack", labels)


def ids_of(pack: packer.ImagePack, images: torch.Tensor) -> list[int]:
    """Which pack rows a batch holds (rows are distinct in the fixtures)."""
    flat = pack.images.reshape(len(pack), -1)
    return [int((flat == x.reshape(1, -1).cpu()).all(1).nonzero()[0]) for x in images]


def check_batch(pack: packer.ImagePack, batch: tuple[torch.Tensor, ...]) -> list[int]:
    """The batch is a 3-tuple whose labels and targets are its images' rows; returns them."""
    assert len(batch) == 3
    x, y, t = batch
    rows = ids_of(pack, x)
    assert t.dtype == torch.float32 and t.shape == (len(x), 2) and y.dtype == torch.int64
    assert torch.equal(t.cpu(), pack.targets[rows]) and torch.equal(y.cpu(), pack.labels[rows])
    return rows


def test_the_pack_has_distinct_targets(tpack: Path) -> None:
    pack = packer.load(tpack)
    assert len(pack) == 13 and pack.target_names == ["a", "b"]
    assert pack.targets.dtype == torch.float32 and len(torch.unique(pack.targets[:, 0])) == 13


@pytest.mark.parametrize("resident", [False, True])
def test_cpu_batches_carry_their_rows_targets(tpack: Path, resident: bool) -> None:
    pack = packer.load(tpack)
    loader = packer.PackLoader(pack, 4, device="cpu", seed=5, resident=resident)
    for _epoch in range(2):
        batches = list(loader)
        assert [len(b[0]) for b in batches] == [4, 4, 4, 1]
        seen = [r for b in batches for r in check_batch(pack, b)]
        assert sorted(seen) == list(range(13))
        assert seen == loader.indices(loader.epoch - 1).tolist()


def test_a_pack_without_targets_still_yields_pairs(packed: Path) -> None:
    for resident in (False, True):
        batch = next(iter(packer.PackLoader(packed, 4, device="cpu", resident=resident)))
        assert len(batch) == 2


@pytest.mark.parametrize("resident", [False, True])
def test_indices_subset_and_rank_split(tpack: Path, resident: bool) -> None:
    pack = packer.load(tpack)
    subset = torch.tensor([12, 0, 7, 3, 3, 9, 5])
    got = []
    for rank in (0, 1):
        ld = packer.PackLoader(
            pack, 2, device="cpu", indices=subset, rank=rank, world_size=2, resident=resident
        )
        rows = [r for b in ld for r in check_batch(pack, b)]
        assert rows == ld.indices(0).tolist()
        got += rows
    # padded to 8 by repeating the head of the permutation; every subset row is there
    assert len(got) == 8 and set(got) == set(subset.tolist())


def test_state_dict_resume_gives_identical_triples(tpack: Path) -> None:
    ref = list(packer.PackLoader(tpack, 3, device="cpu", seed=4))
    a = packer.PackLoader(tpack, 3, device="cpu", seed=4)
    it = iter(a)
    head = [next(it) for _ in range(2)]
    b = packer.PackLoader(tpack, 3, device="cpu", seed=4)
    b.load_state_dict(a.state_dict())
    got = head + list(b)
    assert len(got) == len(ref) == 5
    for g, r in zip(got, ref):
        assert len(g) == 3 and all(torch.equal(u, v) for u, v in zip(g, r))


def test_transform_leaves_targets_alone(tpack: Path) -> None:
    pack = packer.load(tpack)
    ld = packer.PackLoader(pack, 5, device="cpu", shuffle=False, transform=lambda x: x.flip(-1))
    x, _, t = next(iter(ld))
    assert torch.equal(x, pack.images[:5].flip(-1)) and torch.equal(t, pack.targets[:5])


def test_wrong_dtypes_are_refused_not_cast(tpack: Path) -> None:
    pack = packer.load(tpack)
    n = len(pack)
    for kw, what in (
        ({"targets": pack.targets[:].double()}, "targets torch.float64"),
        ({"labels": pack.labels[:].int()}, "labels torch.int32"),
        ({"targets": pack.targets[:, 0].clone()}, "targets torch.float32 \\[13\\]"),
    ):
        fields = {"images": pack.images[:], "labels": pack.labels[:], "targets": pack.targets[:]}
        bad = packer.ImagePack(**{**fields, **kw}, batch_size=[n])
        with pytest.raises(UsageError, match=f"float32 \\[N, K\\] or None, not {what}"):
            packer.PackLoader(bad, 4, device="cpu")


def test_dataset_items_and_dataloader_with_workers(tpack: Path) -> None:
    pack = packer.load(tpack)
    ds = packer.PackDataset(tpack)
    x, y, t = ds[6]
    assert torch.equal(x, pack.images[6]) and y == int(pack.labels[6])
    assert t.dtype == torch.float32 and t.shape == (2,) and torch.equal(t, pack.targets[6])
    items = ds.__getitems__([12, 0, 4])
    assert [len(it) for it in items] == [3, 3, 3]
    assert torch.equal(torch.stack([it[2] for it in items]), pack.targets[[12, 0, 4]])
    dl = DataLoader(packer.PackDataset(tpack), batch_size=4, num_workers=2, shuffle=False)
    batches = list(dl)
    assert all(len(b) == 3 for b in batches)
    ts = [b[2] for b in batches]
    assert [tuple(t.shape) for t in ts] == [(4, 2), (4, 2), (4, 2), (1, 2)]
    assert all(t.dtype == torch.float32 for t in ts)
    assert torch.equal(torch.cat(ts), pack.targets[:])
    assert torch.equal(torch.cat([b[1] for b in batches]), pack.labels[:])


def test_dataset_without_targets_gives_pairs(packed: Path) -> None:
    ds = packer.PackDataset(packed)
    assert len(ds[0]) == 2 and all(len(it) == 2 for it in ds.__getitems__([0, 1]))


# ------------------------------------------------- split with integer labels and -1


@pytest.fixture
def intpack(image_tree: Path, tmp_path: Path) -> Path:
    """13 images, no class names: integer labels 7 (x5), 3 (x4), -1 (x4)."""
    labels = ["7", "3", "-1", "7", "3", "-1", "7", "3", "-1", "7", "3", "-1", "7"]
    return build_with_table(image_tree, tmp_path / "intpack", labels, targets=False)


def test_split_stratifies_integer_labels_and_unlabeled(intpack: Path) -> None:
    pack = packer.load(intpack)
    assert pack.classes == [] and sorted(set(pack.labels.tolist())) == [-1, 3, 7]
    parts = packer.split(pack, (0.5, 0.5), seed=1)
    assert sorted(torch.cat(parts).tolist()) == list(range(13))
    assert sorted(len(p) for p in parts) == [6, 7]
    labels = pack.labels[:]
    for value in (-1, 3, 7):
        n = int((labels == value).sum())
        for p in parts:
            assert abs(int((labels[p] == value).sum()) - n / 2) <= 1
    assert packer.class_histogram(pack) == {"3": 4, "7": 5, "(unlabeled)": 4}
    hist = [packer.class_histogram(pack, p) for p in parts]
    assert [sum(h.values()) for h in hist] == [len(p) for p in parts]
    assert {k: hist[0].get(k, 0) + hist[1].get(k, 0) for k in hist[0]} == {
        "3": 4,
        "7": 5,
        "(unlabeled)": 4,
    }


def test_class_histogram_keeps_empty_classes_first_and_unlabeled_last(tpack: Path) -> None:
    pack = packer.load(tpack)
    assert packer.class_histogram(pack, torch.tensor([0])) == {"cat": 1, "dog": 0, "zebra": 0}


# ------------------------------------------------------------ imgpack info --split


def run(*args: object) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, [str(a) for a in args])
    return r.exit_code, r.stdout, r.stderr


def test_info_split_json_and_text(packed: Path) -> None:
    rc, out, err = run("info", packed, "--split", "0.75,0.25", "--seed", "3", "--json")
    assert rc == 0, err
    splits = json.loads(out)["splits"]
    parts = packer.split(packed, (0.75, 0.25), seed=3)
    assert [s["fraction"] for s in splits] == [0.75, 0.25]
    assert [s["count"] for s in splits] == [len(p) for p in parts] == [10, 3]
    for s, p in zip(splits, parts):
        assert s["class_counts"] == packer.class_histogram(packed, p)
    assert "splits" not in json.loads(run("info", packed, "--json")[1])
    rc, text, _ = run("info", packed, "--split", "0.75,0.25", "--seed", "3")
    assert rc == 0
    tail = text[text.index("split     0.75,0.25 (seed 3") :].splitlines()
    assert tail[1] == "  part 1  0.75: 10 images (images, label)"
    want = splits[0]["class_counts"]
    assert tail[2:5] == [f"    {want[n]:>8}  {n}" for n in ("cat", "dog", "zebra")]
    assert "\nsplit " not in run("info", packed)[1]


def test_info_split_on_integer_labels(intpack: Path) -> None:
    rc, out, err = run("info", intpack, "--split", "0.5,0.5", "--json")
    assert rc == 0, err
    splits = json.loads(out)["splits"]
    assert sum(s["class_counts"].get("(unlabeled)", 0) for s in splits) == 4
    assert sum(s["class_counts"].get("7", 0) for s in splits) == 5


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--split", "0.5,0.4"], "Error: --split 0.5,0.4: fractions must be positive and sum to 1"),
        (["--split", "1.2,-0.2"], "Error: --split 1.2,-0.2: fractions must be positive"),
        (["--split", "0.9,x"], "Error: --split '0.9,x': give fractions separated by commas"),
        (["--split", ""], "Error: --split '': give fractions separated by commas"),
        (["--seed", "1"], "Error: --seed is the seed of --split; give --split too"),
    ],
)
def test_info_bad_split_is_one_error_line(packed: Path, args: list[str], line: str) -> None:
    rc, out, err = run("info", packed, *args)
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(line), err


# ------------------------------------------------------------------ verify --trace


def test_verify_trace_on_a_pack_with_targets(tpack: Path, tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    cfg = packer.VerifyConfig(
        device="cpu", sample=0, batch_size=4, batches=2, repeats=1, use_recorded_source=False
    )
    report = packer.verify_pack(tpack, cfg, trace=trace)
    assert report.ok and report.pack_images_per_s
    assert "traceEvents" in json.loads(trace.read_text())


# ------------------------------------------------------------------------- CUDA


@pytest.mark.cuda
@pytest.mark.parametrize("resident", [False, True])
def test_cuda_nonblocking_triples_equal_synchronized(tpack: Path, resident: bool) -> None:
    pack = packer.load(tpack)
    fast = packer.PackLoader(pack, 4, device="cuda", seed=3, prefetch=2, resident=resident)
    slow = packer.PackLoader(pack, 4, device="cpu", seed=3)
    for _epoch in range(3):
        for (xf, yf, tf), (xs, ys, ts) in zip(fast, slow, strict=True):
            assert tf.device.type == "cuda" and tf.dtype == torch.float32
            torch.cuda._sleep(100_000)  # the consumer's stream is busy: copies queue up
            doubled = tf * 2  # consumed on the GPU right away: the copy must be complete
            assert torch.equal(xf.cpu(), xs) and torch.equal(yf.cpu(), ys)
            assert torch.equal(tf.cpu(), ts) and torch.equal(doubled.cpu(), ts * 2)
            check_batch(pack, (xs, ys, ts))


@pytest.mark.cuda
def test_cuda_reused_slots_give_fresh_targets(tmp_path: Path, image_tree: Path) -> None:
    """More batches than pinned slots: each batch's targets are its own rows'."""
    pack = packer.load(build_with_table(image_tree, tmp_path / "p", ["-1"] * 13))
    fast = packer.PackLoader(pack, 2, device="cuda", seed=9, prefetch=2, num_threads=2)
    slow = packer.PackLoader(pack, 2, device="cpu", seed=9)
    for (_, _, tf), (_, _, ts) in zip(fast, slow, strict=True):
        torch.cuda._sleep(200_000)
        assert torch.equal(tf.cpu(), ts)
