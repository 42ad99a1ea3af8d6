"""packer.examples.train_imagenet (``python -m``, or examples/train_imagenet.py in a checkout)
runs the standard recipe on the CPU: two tiny epochs, then resumes."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import torch

import packer
from conftest import subprocess_env
from helpers.forked import run_script
from packer.builder.run import BuildConfig, build

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    "transform" not in inspect.signature(packer.PackLoader).parameters,
    reason="PackLoader has no transform= parameter yet (issue 12, loader side)",
)


def run(*args: str) -> str:
    """``python examples/train_imagenet.py ARGS`` in a process of its own: a fork of this
    one (tests/helpers/forked.py), torch already imported."""
    env = subprocess_env(OMP_NUM_THREADS="2")
    r = run_script(ROOT / "examples/train_imagenet.py", args, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


@pytest.mark.slow
def test_train_two_epochs_on_cpu_then_resume(tmp_path: Path) -> None:
    pack = tmp_path / "pack64"
    build(ROOT / "sample_data", pack, BuildConfig(size=(64, 64), workers=1))
    out = tmp_path / "run"
    common = [
        "--train", str(pack), "--val", str(pack), "--arch", "resnet18",
        "--batch-size", "8", "--max-steps", "2", "--crop", "48", "--val-crop", "48",
        "--res-schedule", "40:0,48:1", "--lr-schedule", "cosine", "--label-smoothing", "0.1",
        "--device", "cpu", "--workers", "1", "--out", str(out), "--log-every", "0",
    ]  # fmt: skip
    text = run(*common, "--epochs", "2")
    lines = re.findall(r"^epoch (\d) size (\d+): train loss ([\d.]+) .*top5 ([\d.]+)%", text, re.M)
    assert [(e, s) for e, s, _, _ in lines] == [("0", "40"), ("1", "48")], text
    assert all(0 < float(loss) < 20 for _, _, loss, _ in lines)
    assert all(0 <= float(t5) <= 100 for *_, t5 in lines)
    ck = torch.load(out / "last.pt", weights_only=True)
    assert ck["epoch"] == 1 and ck["arch"] == "resnet18"
    assert not list(out.glob(".*tmp*"))  # written under a temporary name, then renamed

    text = run(*common, "--epochs", "3", "--resume", str(out / "last.pt"))
    assert "resumed from" in text and "epoch 1 done" in text
    assert re.findall(r"^epoch (\d) size (\d+):", text, re.M) == [("2", "48")], text
    assert torch.load(out / "last.pt", weights_only=True)["epoch"] == 2


# ---- bad input stops before any training: one `Error:` line, exit 2


@pytest.fixture(scope="module")
def script():
    import packer.examples.train_imagenet

    return packer.examples.train_imagenet


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from conftest import write_image

    root = tmp_path_factory.mktemp("packs")
    for c in ("cat", "dog"):
        for i in range(2):
            write_image(root / "src" / c / f"{i}.png", (12, 10), seed=i)
            write_image(root / "flat" / f"{c}{i}.png", (12, 10), seed=i)
    (root / "rev.txt").write_text("dog\ncat\n")
    cfg = BuildConfig(size=(8, 8), workers=1)
    build(root / "src", root / "train", cfg)
    build(
        root / "src", root / "valrev", BuildConfig(size=(8, 8), workers=1, classes=root / "rev.txt")
    )
    build(root / "flat", root / "flatp", cfg)
    (root / "text.pt").write_text("not a checkpoint\n")
    torch.save({"weights": torch.zeros(2)}, root / "foreign.pt")
    (root / "afile").write_text("x")
    return {p.name: p for p in root.iterdir()}


def _error(script, capsys, *argv: object) -> tuple[int, str]:
    try:
        code = script.main([str(a) for a in argv])
    except SystemExit as e:  # argparse
        code = e.code
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err, err
    return code, err.splitlines()[-1]


def test_batch_size_zero_is_refused(script, packs, capsys) -> None:
    code, line = _error(script, capsys, "--train", packs["train"], "--batch-size", "0")
    assert code == 2 and re.search(r"--batch-size: .*0 is outside", line), line


def test_val_with_another_class_map_is_refused(script, packs, capsys) -> None:
    code, line = _error(
        script, capsys, "--train", packs["train"], "--val", packs["valrev"], "--device", "cpu"
    )
    assert code == 2
    assert line == (
        f"Error: {packs['valrev']}: its class map differs from {packs['train']}'s; "
        f"rebuild it with --classes {packs['train']}"
    )


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--train", "flatp"], r"^Error: .*flatp: the train pack has no classes"),
        (["--train", "train", "--val", "flatp"], r"^Error: .*flatp: its class map differs"),
        (["--train", "nope"], r"^Error: .*nope: no such pack"),
        (["--train", "train", "--val", "nope"], r"^Error: .*nope: no such pack"),
        (
            ["--train", "train", "--resume", "missing.pt"],
            r"^Error: .*missing.pt: no such checkpoint",
        ),
        (
            ["--train", "train", "--resume", "text.pt"],
            r"^Error: .*text.pt: not a checkpoint this script can read",
        ),
        (
            ["--train", "train", "--resume", "foreign.pt"],
            r"^Error: .*foreign.pt: not a checkpoint of train_imagenet.py",
        ),
        (["--train", "train", "--out", "afile"], r"^Error: --out .*afile is a file"),
        (["--train", "train", "--crop", "0"], r"--crop/--train-crop-size: .*0 is outside"),
        (["--train", "train", "--train-crop-size", "0"], r"--train-crop-size: .*0 is outside"),
        (["--train", "train", "--val-resize-size", "0"], r"--val-resize-size: .*0 is outside"),
        (["--train", "train", "--lr-step", "0"], r"--lr-step: .*outside"),
        (["--train", "train", "--label-smoothing", "5"], r"--label-smoothing: .*outside"),
        (["--train", "train", "--lr", "nan"], r"--lr: .*outside"),
        (["--train", "train", "--res-schedule", "x"], r"^Error: --res-schedule wants"),
        (["--train", "train", "--random-erase", "2"], r"--random-erase: .*outside"),
        (["--train", "train", "--mixup-alpha", "-1"], r"--mixup-alpha: .*outside"),
        (["--train", "train", "--auto-augment", "x"], r"--auto-augment: invalid choice"),
        (["--train", "train", "--ra-reps", "0"], r"--ra-reps: .*outside"),
        (["--train", "train", "--model-ema-decay", "2"], r"--model-ema-decay: .*outside"),
    ],
)
def test_bad_input_exits_2_before_training(script, packs, capsys, argv, match) -> None:
    root = packs["train"].parent
    names = {"flatp", "train", "nope", "missing.pt", "text.pt", "foreign.pt", "afile"}
    argv = [str(root / a) if a in names else a for a in argv]
    if "--out" not in argv:
        argv += ["--out", str(root / "o")]
    code, line = _error(script, capsys, *argv, "--device", "cpu", "--batch-size", "2")
    assert code == 2 and re.search(match, line), line


# ---- the modern recipe (issue 33): the reference's flags, two tiny epochs in this process


def recipe_ops() -> list[str]:
    """``--auto-augment ta_wide`` where packer.transforms has it (the ops land in two
    steps); skips the test while the other ops are missing."""
    import packer.transforms as T

    for name in ("RandomErasing", "MixUp", "CutMix", "RandomChoice"):
        if not hasattr(T, name):
            pytest.skip(f"packer.transforms.{name} has not landed yet (issue 33, the ops)")
    return ["--auto-augment", "ta_wide"] if hasattr(T, "TrivialAugmentWide") else []


@pytest.fixture
def one_thread():
    """torch on one thread in this process: a tiny model gains nothing from more, and on a
    busy machine their spin-waits cost seconds."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def test_modern_recipe_two_epochs_then_resume(script, tmp_path: Path, capsys, one_thread) -> None:
    from packer.measure.bench.synth import make_random_pack

    aa = recipe_ops()

    pack = make_random_pack(tmp_path / "p", 24, 24, classes=3)
    val = make_random_pack(tmp_path / "v", 6, 16, classes=3)
    out = tmp_path / "run"
    common = [
        "--train", pack, "--val", val, "--arch", "resnet18", "--batch-size", "6",
        "--max-steps", "2", "--crop", "16", "--val-crop", "16", "--device", "cpu",
        "--workers", "1", "--out", out, "--log-every", "0", "--lr-schedule", "cosine",
        *aa, "--random-erase", "0.5", "--mixup-alpha", "0.2",
        "--cutmix-alpha", "1.0", "--ra-sampler", "--ra-reps", "2", "--model-ema",
        "--model-ema-steps", "1", "--label-smoothing", "0.1",
    ]  # fmt: skip
    assert script.main([str(a) for a in [*common, "--epochs", "2"]]) == 0, capsys.readouterr().err
    text = capsys.readouterr().out
    lines = re.findall(r"^epoch (\d) size 16: train loss ([\d.]+) .* ema loss ([\d.]+)", text, re.M)
    assert [e for e, *_ in lines] == ["0", "1"], text
    assert all(0 < float(a) < 1e3 and 0 < float(b) < 1e6 for _, a, b in lines)  # finite
    assert "--ra-sampler: one process" in text
    ck = torch.load(out / "last.pt", weights_only=True)
    assert ck["epoch"] == 1 and "model_ema" in ck and int(ck["model_ema"]["n_averaged"]) > 0
    assert (
        script.main([str(a) for a in [*common, "--epochs", "3", "--resume", out / "last.pt"]]) == 0
    )
    assert re.findall(r"^epoch (\d) size", capsys.readouterr().out, re.M) == ["2"]


def test_recipe_transform_is_the_references_order(script) -> None:
    aa = recipe_ops()
    args = script.argparse.Namespace(
        auto_augment=aa[1] if aa else None, ra_magnitude=9, augmix_severity=3,
        random_erase=0.1, mixup_alpha=0.2, cutmix_alpha=1.0, interpolation="bilinear",
    )  # fmt: skip
    compose, rrc = script.train_transform(args, 176, 10)
    kinds = [type(t).__name__ for t in compose]
    assert kinds == [
        "RandomResizedCrop", "RandomHorizontalFlip", *(["TrivialAugmentWide"] if aa else []),
        "RandomErasing", "RandomChoice",
    ]  # fmt: skip
    assert compose[0] is rrc and rrc.size == (176, 176) and compose.mixes_labels
    x = torch.randint(0, 256, (4, 3, 200, 200), dtype=torch.uint8)
    images, soft = compose(x, torch.tensor([0, 1, 2, 3]), generator=torch.Generator())
    assert images.shape == (4, 3, 176, 176) and soft.shape == (4, 10)


def test_a_missing_recipe_op_is_named(script, packs, capsys, monkeypatch) -> None:
    import packer.transforms as T

    monkeypatch.delattr(T, "TrivialAugmentWide", raising=False)
    code, line = _error(
        script, capsys, "--train", packs["train"], "--device", "cpu", "--auto-augment", "ta_wide",
        "--out", packs["train"].parent / "o",
    )  # fmt: skip
    assert code == 2
    assert line == (
        "Error: --auto-augment ta_wide needs packer.transforms.TrivialAugmentWide, which this "
        "imgpack does not have"
    )


def test_interpolation_flag_reaches_the_crop(script, tmp_path: Path, capsys, one_thread) -> None:
    # The reference's --interpolation: the crop takes it (bicubic as torchvision's
    # pixels); the policy warps nearest or bilinear (torchvision's tensor policies refuse
    # bicubic), and the run says so instead of training bilinear silently.
    from packer.measure.bench.synth import make_random_pack

    args = script.argparse.Namespace(
        auto_augment="ta_wide", ra_magnitude=9, augmix_severity=3, random_erase=0.0,
        mixup_alpha=0.0, cutmix_alpha=0.0, interpolation="bicubic",
    )  # fmt: skip
    compose, rrc = script.train_transform(args, 32, 10)
    assert rrc.interpolation == "bicubic" and compose[2].interpolation == "bilinear"
    args.interpolation = "nearest"
    compose, rrc = script.train_transform(args, 32, 10)
    assert rrc.interpolation == "nearest" and compose[2].interpolation == "nearest"

    pack = make_random_pack(tmp_path / "p", 12, 24, classes=3)
    argv = [
        "--train", pack, "--arch", "resnet18", "--batch-size", "6", "--max-steps", "1",
        "--crop", "16", "--device", "cpu", "--workers", "1", "--out", tmp_path / "run",
        "--log-every", "0", "--epochs", "1", "--auto-augment", "ta_wide",
        "--interpolation", "bicubic",
    ]  # fmt: skip
    assert script.main([str(a) for a in argv]) == 0, capsys.readouterr().err
    assert (
        "--interpolation bicubic: the crop's; the policy warps bilinear" in capsys.readouterr().out
    )
    code, line = _error(script, capsys, *map(str, argv[:-1]), "box")
    assert code == 2 and "--interpolation: invalid choice: 'box'" in line, line


# ---- the reference's eval and crop flags (issue 43)


def test_the_references_crop_and_resize_flags_train(
    script, tmp_path: Path, capsys, one_thread
) -> None:
    """--train-crop-size, --val-crop-size and --val-resize-size, torchvision's names, are
    taken; a val pack built at the --val-resize-size makes no note."""
    from conftest import write_image

    for i in range(12):
        write_image(tmp_path / "src" / "ab"[i % 2] / f"{i}.png", (30, 24), seed=i)
    pack = tmp_path / "p"
    build(tmp_path / "src", pack, BuildConfig(size=(20, 20), resize="crop", workers=1))
    out = tmp_path / "run"
    argv = [
        "--train", pack, "--val", pack, "--arch", "resnet18", "--batch-size", "6",
        "--max-steps", "1", "--epochs", "1", "--device", "cpu", "--workers", "1",
        "--out", out, "--log-every", "0",
        "--train-crop-size", "14", "--val-crop-size", "16", "--val-resize-size", "20",
    ]  # fmt: skip
    assert script.main([str(a) for a in argv]) == 0
    cap = capsys.readouterr()
    assert re.findall(r"^epoch 0 size 14:", cap.out, re.M), cap.out
    assert "note:" not in cap.err


@pytest.mark.parametrize(
    ("resize", "built", "says"),
    [
        # the case: val built at 256 (as PORTING.md had it), the reference's 232
        ("crop", (256, 256), "was built --size 256 --resize crop"),
        ("pad", (232, 232), "was built --size 232 --resize pad"),
        ("crop", (240, 232), "was built --size 240x232 --resize crop"),
    ],
)
def test_a_val_pack_built_otherwise_says_which_build_is_the_references(
    script, tmp_path: Path, resize: str, built: tuple[int, int], says: str
) -> None:
    """Where a raw val pack's build differs from --val-resize-size, the note names the
    `imgpack build --size` that gives Resize(232) + CenterCrop(224)."""
    from conftest import write_image

    write_image(tmp_path / "src" / "a" / "0.png", (300, 260))
    build(tmp_path / "src", tmp_path / "v", BuildConfig(size=built, resize=resize, workers=1))
    pack = packer.load(tmp_path / "v")
    note = script.val_protocol_note(pack, tmp_path / "v", 232, 224)
    assert note is not None and says in note
    assert f"imgpack build VAL_FOLDER {tmp_path / 'v'} --size 232 --resize crop" in note
    assert "Resize(232) + CenterCrop(224)" in note
    assert script.val_protocol_note(pack, tmp_path / "v", None, 224) is None  # not asked


def test_a_val_pack_built_at_the_resize_size_needs_no_note(script, tmp_path: Path) -> None:
    from conftest import write_image

    write_image(tmp_path / "src" / "a" / "0.png", (300, 260))
    build(tmp_path / "src", tmp_path / "v", BuildConfig(size=(232, 232), workers=1))
    assert script.val_protocol_note(packer.load(tmp_path / "v"), tmp_path / "v", 232, 224) is None


def test_the_note_is_printed_and_training_goes_on(
    script, packs, tmp_path: Path, capsys, one_thread
) -> None:
    argv = [
        "--train", packs["train"], "--val", packs["train"], "--arch", "resnet18",
        "--batch-size", "2", "--max-steps", "1", "--epochs", "1", "--device", "cpu",
        "--workers", "1", "--out", tmp_path / "o", "--log-every", "0",
        "--train-crop-size", "6", "--val-crop-size", "6", "--val-resize-size", "7",
    ]  # fmt: skip
    assert script.main([str(a) for a in argv]) == 0
    err = capsys.readouterr().err
    assert f"note: --val-resize-size 7: {packs['train']} was built --size 8 --resize crop" in err
    assert "--size 7 --resize crop`" in err


def test_a_val_crop_larger_than_the_resize_is_refused(script, packs, capsys) -> None:
    code, line = _error(
        script, capsys, "--train", packs["train"], "--device", "cpu",
        "--val-crop-size", "240", "--val-resize-size", "232",
    )  # fmt: skip
    assert code == 2
    assert (
        line
        == "Error: --val-crop-size 240 is larger than --val-resize-size 232: the centre crop is cut from the resized image"
    )


def test_log_lines_say_how_long_the_step_waited_for_the_loader(tmp_path: Path) -> None:
    """Every --log-every steps: the wait share of PackLoader.stats() since the last line."""
    pack = tmp_path / "pack32"
    build(ROOT / "sample_data", pack, BuildConfig(size=(32, 32), workers=1))
    text = run(
        "--train", str(pack), "--arch", "resnet18", "--batch-size", "4", "--max-steps", "2",
        "--crop", "32", "--epochs", "1", "--device", "cpu", "--workers", "1",
        "--out", str(tmp_path / "run"), "--log-every", "1",
    )  # fmt: skip
    got = re.findall(
        r"step (\d)/2: loss [\d.]+, waited for the loader ([\d.]+)% \(slowest: (\w+)\)", text
    )
    assert [g[0] for g in got] == ["1", "2"], text
    assert all(0 <= float(g[1]) <= 100 for g in got)
    assert all(g[2] in ("read", "decode", "crop", "augment", "copy") for g in got)
