"""benchmarks/dense.py (issue 46's figures) at toy scale on the CPU: every part runs end
to end on data and packs it makes, the summary has a row per figure, and each ratio is
the one the measured medians give; parts are selectable, a failing part is reported
while the others still run, and a bad --parts is refused."""

from __future__ import annotations

import contextlib
import io
import json
import re
import statistics
from pathlib import Path

import pytest

pytest.importorskip("pycocotools")
pytest.importorskip("torchvision")

from benchmarks import dense

# small models, tiny images, one round of one step: seconds on two cores
TOY = ["--device", "cpu", "--toy", "--images", "12", "--val-images", "4", "--seg-images", "8",
       "--max-side", "64", "--lsj", "64", "--min-size", "48", "--crop", "48", "--batch", "2",
       "--seg-batch", "2", "--loader-batch", "2", "--loader-steps", "2", "--steps", "1",
       "--rounds", "1", "--warm", "0", "--settle", "1", "--resident", "1", "--map-steps", "1",
       "--miou-steps", "1", "--workers", "0", "--threads", "1", "--host-passes", "1",
       "--host-groups", "1,4"]  # fmt: skip
ROWS = {
    "a": "| a. Faster R-CNN fed by a pack (LSJ on the device) / resident |",
    "ap": "| a. the same, the median of each round's pack / resident |",
    "as": "| a. the same, resident's median step / the pack's (host ms of every step) |",
    "b1": "| b. the same model fed by the reference data path (img/s) |",
    "b2": "| b. imgpack / reference data path, same model |",
    "c": "| c. DeepLabV3 fed by a pack, 48² crops / resident |",
    "dj": "| d. loader alone (jpeg pack), LSJ 64, batch 2 / reference on 0 workers |",
    "dr": "| d. loader alone (raw pack), LSJ 64, batch 2 / reference on 0 workers |",
    "e1": "| e. bbox mAP, same weights, the recipe's val path (CPU decode) vs reference |",
    "ec": "| e. bbox mAP, same weights, the pack decoded on the GPU vs reference |",
    "e2": "| e. mean IoU, same weights, pack vs reference data path |",
    "f": "| f. the dense pass's host ms a batch, 4 batches a pass / 1 |",
    "f2": "| f. the same, the producer thread's share with host='process' / all of it |",
}


def _run(work: Path, out: Path, *extra: str) -> tuple[int, str, dict]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = dense.main([*TOY, "--work", str(work), "--out", str(out), *extra])
    return code, buf.getvalue(), json.loads((out / dense.JSON).read_text())


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dense_bench")


def _row(text: str, label: str) -> list[str]:
    """The summary row starting with ``label``: its cells."""
    line = next(ln for ln in text.splitlines() if ln.startswith(label))
    return [c.strip() for c in line.strip("|").split("|")]


@pytest.mark.slow
def test_every_part_runs_and_the_ratios_are_the_measured_ones(work: Path) -> None:
    code, text, r = _run(work, work / "out")
    assert code == 0 and r["errors"] == {}, text
    summary = text[text.index("\nSummary (") :]
    for label in ROWS.values():
        assert label in summary, label
    for part in ("frcnn", "deeplab", "loader"):
        for way, rates in r[part]["rounds"].items():
            assert len(rates) == 1 and all(v > 0 for v in rates)
            assert r[part]["img_s"][way] == statistics.median(rates), (part, way)
    fr, dl, ld = r["frcnn"]["img_s"], r["deeplab"]["img_s"], r["loader"]["img_s"]
    assert _row(summary, ROWS["a"])[2] == f"{fr['pack'] / fr['resident']:.3f}"
    rounds = r["frcnn"]["rounds"]
    assert r["frcnn"]["paired_ratios"] == [rounds["pack"][0] / rounds["resident"][0]]
    assert _row(summary, ROWS["ap"])[1:3] == ["1 rounds", f"{r['frcnn']['paired_ratios'][0]:.3f}"]
    steps = r["frcnn"]["step_ms"]
    assert [len(steps[w]) for w in ("resident", "pack")] == [1, 1]  # a list a timing
    assert all(len(t) == 1 and t[0] > 0 for t in steps["pack"])  # a figure a step (--steps 1)
    sm = r["frcnn"]["step_ms_median"]
    assert sm["pack"] == statistics.median(steps["pack"][0])
    assert _row(summary, ROWS["as"])[2] == f"{sm['resident'] / sm['pack']:.3f}"
    assert _row(summary, ROWS["b2"])[2] == f"{fr['pack'] / fr['reference']:.2f}x"
    assert _row(summary, ROWS["c"])[2] == f"{dl['pack'] / dl['resident']:.3f}"
    ref = ld["reference data path"]
    assert _row(summary, ROWS["dj"])[2] == f"{ld['imgpack, jpeg pack'] / ref:.2f}x"
    assert _row(summary, ROWS["dr"])[2] == f"{ld['imgpack, raw pack'] / ref:.2f}x"
    m, u = r["map"]["map"], r["map"]["miou"]
    assert m["images"] == [4, 4] and u["pixels"][0] == u["pixels"][1] > 0
    assert 0 <= m["pack"] <= 100 and 0 <= u["pack"] <= 100 and m["trained_steps"] > 0
    assert _row(summary, ROWS["e1"])[2] == f"{m['pack_cpu_decode'] - m['reference']:+.3f} points"
    assert _row(summary, ROWS["ec"])[2] == f"{m['pack'] - m['reference']:+.3f} points"
    assert 0 <= m["pack_cpu_decode"] <= 100
    # on the CPU both paths decode with libjpeg-turbo: the data paths' targets, sizes and
    # images agree, so the same weights score the same
    assert m["pack_cpu_decode"] == m["pack"] == m["reference"], m
    assert m["cpu_decode_same_detections"] is True and m["detections"][1] > 0, m
    assert _row(summary, ROWS["e2"])[2] == f"{u['pack'] - u['reference']:+.3f} points"
    host = r["host"]["ms_a_batch"]
    assert sorted(host) == ["1", "4"] and all(len(v) == 2 for v in r["host"]["each"].values())
    assert _row(summary, ROWS["f"])[2] == f"{host['4'] / host['1']:.2f}"
    kept = r["host"]["thread_ms_a_batch_with_a_host_process"]
    assert 0 < kept["4"] < host["4"]  # a part of the pass's host time
    assert _row(summary, ROWS["f2"])[2] == f"{kept['4'] / host['4']:.2f}"
    assert r["summary"] == [_row(summary, label) for label in ROWS.values()]
    assert not list((work / "out").glob(".*tmp*"))  # the JSON written whole, then renamed


def test_parts_are_selectable_and_a_failing_part_is_reported(
    work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("a broken part")

    monkeypatch.setattr(dense, "part_deeplab", broken)
    code, text, r = _run(work, work / "sel", "--parts", "deeplab,loader", "--loader-stores", "jpeg")
    assert code == 1
    assert r["errors"] == {"deeplab": "RuntimeError: a broken part"}
    assert "| deeplab: FAILED | RuntimeError: a broken part | - | - |" in text
    assert ROWS["dj"] in text and ROWS["dr"] not in text  # the other part still ran
    assert not {"frcnn", "map"} & set(r) and ROWS["a"] not in text


def test_an_unknown_part_is_refused(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as e:
        dense.parse(["--parts", "frcnn,bogus"])
    assert e.value.code == 2
    assert "--parts: bogus not one of frcnn, ref, deeplab, loader, map" in capsys.readouterr().err


def test_a_failing_way_leaves_the_others_figures(
    work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from packer.examples import train_detection as TD

    def broken(dl: object, device: object):
        raise RuntimeError("out of shared memory")
        yield  # a generator, as reference_batches

    monkeypatch.setattr(TD, "reference_batches", broken)
    code, text, r = _run(work, work / "way", "--parts", "loader", "--loader-stores", "jpeg")
    assert code == 1
    assert r["errors"] == {"loader: reference data path": "RuntimeError: out of shared memory"}
    assert r["loader"]["img_s"]["imgpack, jpeg pack"] > 0  # measured all the same
    assert r["loader"]["rounds"]["reference data path"] == []
    assert _row(text, ROWS["dj"])[2] == "n/a"
    assert "| loader: reference data path FAILED | RuntimeError: out of shared memory |" in text


def test_parts_past_the_time_limit_are_skipped(work: Path) -> None:
    code, text, r = _run(work, work / "late", "--parts", "loader", "--time-limit", "1e-9")
    assert code == 1 and "loader" not in r and "loader" not in r["seconds"]
    assert r["errors"]["loader"].startswith("not run: ")
    assert re.search(
        r"^\| loader: SKIPPED \| not run: \d+ s > --time-limit 0 s \| - \| - \|$", text, re.M
    )


@pytest.mark.slow
def test_every_detection_timing_starts_from_the_same_weights(work: Path) -> None:
    """A detector's step time follows its weights, and a run that trains on between
    timings drifts (or diverges): by default every timing restarts from the weights the
    warm-up left. One resident batch and one timed step a timing: from the
    same weights, each round's last loss is the same; trained on, it is not."""
    two = ["--parts", "frcnn", "--rounds", "2", "--warm", "0", "--settle", "0"]
    code, text, r = _run(work, work / "same", *two)
    assert code == 0 and r["frcnn"]["same_start"] is True, text
    res = r["frcnn"]["losses"]["resident"]
    assert len(res) == 2 and res[0] == res[1], res
    assert r["frcnn"]["non_finite"] == {"resident": [], "pack": []}
    code, text, r = _run(work, work / "drift", *two, "--no-same-start")
    assert code == 0 and r["frcnn"]["same_start"] is False, text
    res = r["frcnn"]["losses"]["resident"]
    assert len(res) == 2 and res[0] != res[1], res
