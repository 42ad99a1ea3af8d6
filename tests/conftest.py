"""Fixtures: small real images written with Pillow into tmp_path, and a built pack."""

from __future__ import annotations

import atexit
import gc
import hashlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import packer
from packer.builder.api import BuildConfig, build

REPO = Path(__file__).resolve().parent.parent


# ---- the garbage collector in a test process (issue 45, item 12)
#
# A full collection traces every object alive: after collection a worker holds about
# 470,000 (torch, torchvision, packer, the test modules), and its full collections (the
# collector's own, the tests' gc.collect(), pytest's at the end) took 0.1-0.2 CPU-s
# each. Once the tests are collected, what exists then (modules, classes, functions, the
# items) lives until the end: it moves to the collector's permanent generation
# (gc.freeze, as `imgpack` does at its exit), which collections skip. Objects made
# after it (every test's own) are collected as before; gc.get_objects() lists only
# those. The process's exit: after its last atexit function, the interpreter's
# finalization runs full collections again as it clears the modules (1-2 s a worker
# that has imported tensordict, Ray, lightning, which the controller waits for before
# its summary); registered here, before the servers' and zygotes' own (atexit runs in
# reverse order), the last atexit function freezes what is alive then too. Objects
# freed by their reference counts as the modules are cleared are freed as before
# (their __del__ runs); only cyclic garbage left at exit is not collected, which Python
# never promises ("It is not guaranteed that __del__() methods are called for objects
# that still exist when the interpreter exits", its data model).
def pytest_collection_finish(session: pytest.Session) -> None:
    gc.collect()  # the collection's garbage is freed, not frozen
    gc.freeze()


def _exit_without_collecting() -> None:
    gc.freeze()
    gc.disable()


atexit.register(_exit_without_collecting)

# ---- Ctrl-C and the session's servers (issue 43)
#
# A test that runs a command in this process (CliRunner) sees a Ctrl-C as the command's
# exit 130 (packer.cli.output.handle_errors turns KeyboardInterrupt into it), so before
# these hooks an interrupt only failed the test that was running and the suite went on.
# Now the first SIGINT (or SIGTERM) is noted and raised as KeyboardInterrupt; whoever
# catches it, the session stops after that test (exit 130), and its finalizers stop the
# servers and clusters it started. If it has not ended INTERRUPT_GRACE_S later (a
# finalizer stuck), the recorded processes are stopped and the process exits 130.
INTERRUPT_GRACE_S = 20.0
_interrupted = threading.Event()


def _on_interrupt(signum: int, frame: Any) -> None:
    if not _interrupted.is_set():
        _interrupted.set()
        threading.Thread(target=_last_resort, daemon=True, name="interrupt-grace").start()
    raise KeyboardInterrupt


def _last_resort() -> None:
    import processes

    if _ended.wait(INTERRUPT_GRACE_S):
        return
    processes.stop_mine()
    sys.stderr.write("\ninterrupted: the session did not end in time; stopped its servers\n")
    os._exit(130)


_ended = threading.Event()


def pytest_sessionstart(session: pytest.Session) -> None:
    import processes

    processes.reap_leftovers()  # what a killed session left running
    # before any test used object storage: the commands a test process cannot fork
    # itself for are forked from here (tests/helpers/forked.py); not in the controller
    # of pytest-xdist's workers, which runs no test
    if os.environ.get("PYTEST_XDIST_WORKER") or session.config.getoption("dist", "no") == "no":
        from helpers.forked import start_zygote

        start_zygote()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _on_interrupt)
        signal.signal(signal.SIGTERM, _on_interrupt)


def pytest_runtest_logfinish(nodeid: str, location: Any) -> None:
    if _interrupted.is_set():
        pytest.exit("interrupted (Ctrl-C or SIGTERM)", returncode=130)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    import processes

    processes.stop_mine()  # after the fixtures' own finalizers: what they left
    if _interrupted.is_set():
        session.exitstatus = 130


def pytest_unconfigure(config: pytest.Config) -> None:
    _ended.set()
    where = os.environ.get(_GROUPS_ENV)
    if where and not os.environ.get("PYTEST_XDIST_WORKER"):  # the controller made it
        import shutil

        shutil.rmtree(where, ignore_errors=True)


# ---- markers (issue 45): `cuda` is the one spelling of "needs a CUDA device"
# (tests/test_suite_markers.py keeps it so), skipped here where torch sees none, so that
# `pytest -m cuda` selects every CUDA-only test; the `ray` tests share the session's
# two-node cluster, so under pytest-xdist (--dist loadgroup) they run on one worker.
CUDA_SKIP_REASON = "needs a CUDA device (marked cuda)"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    cuda = [item for item in items if item.get_closest_marker("cuda")]
    if cuda:
        import torch

        if not torch.cuda.is_available():
            for item in cuda:
                item.add_marker(pytest.mark.skip(reason=CUDA_SKIP_REASON))
    if config.pluginmanager.hasplugin("xdist"):
        for item in items:
            group = _xdist_group(item)
            if group:
                item.add_marker(pytest.mark.xdist_group(group))
        _write_groups(items)


# pytest 9 derives Item.nodeid from a structured id, so pytest-xdist's way of grouping
# (appending "@group" to item._nodeid on the worker) no longer changes the nodeid the
# scheduler sees: under --dist loadgroup every test was its own unit, and each worker
# started its own Ray cluster, S3/GCS/Azure servers and module fixtures. Each worker now
# writes {nodeid: group} to a file the controller's scheduler reads (same collection).
_GROUPS_ENV = "IMGPACK_TEST_XDIST_GROUPS"


def _write_groups(items: list[pytest.Item]) -> None:
    where = os.environ.get(_GROUPS_ENV)
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not where or not worker:
        return
    groups, weights = {}, {}
    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})  # fmt: skip
        if names:
            groups[item.nodeid] = "_".join(names)
        weight = _weight(item)
        if weight != 1:
            weights[item.nodeid] = weight
    tmp = Path(where) / f"{worker}.json.tmp"
    tmp.write_text(json.dumps({"groups": groups, "weights": weights}))
    os.replace(tmp, Path(where) / f"{worker}.json")


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # pytest -p no:xdist runs too
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getoption("dist", None) != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    where = os.environ[_GROUPS_ENV]  # set in pytest_configure, before the workers start
    found: dict[str, dict[str, Any]] = {}

    unit_weight: dict[str, int] = {}

    def read(key: str) -> dict[str, Any]:
        if not found:
            files = sorted(Path(where).glob("*.json"))
            found.update(json.loads(files[0].read_text()) if files else {"groups": {}})
        return found.get(key, {})

    class _HeaviestFirst(OrderedDict):
        """The work queue: the unit of most weight goes out first (then the one of most
        tests, then the first collected), so that no long unit starts last and keeps one
        worker busy while the others have finished. The units are ranked once (again
        when one is added), not searched at each pop: with about 2,000 units a search a
        pop was 4 million comparisons in the controller."""

        _ranked: list[str] | None = None  # the keys, in the order they go out
        _next = 0  # the rank of the next key to go out

        def __setitem__(self, key: str, value: dict[str, bool]) -> None:
            super().__setitem__(key, value)
            self._ranked = None  # ranked again at the next pop

        def popitem(self, last: bool = True) -> tuple[str, dict[str, bool]]:
            if last:
                return super().popitem(last=True)
            if self._ranked is None:
                weights = read("weights")
                for k, unit in self.items():
                    if k not in unit_weight:
                        unit_weight[k] = sum(weights.get(n, 1) for n in unit)
                # sorted() is stable: of equal units, the first collected first
                self._ranked = sorted(self, key=lambda k: (-unit_weight[k], -len(self[k])))
                self._next = 0
            while True:
                key = self._ranked[self._next]
                self._next += 1
                if key in self:
                    return key, self.pop(key)

    class _Groups(LoadGroupScheduling):
        def __init__(self, config: pytest.Config, log: Any) -> None:
            super().__init__(config, log)
            self.workqueue = _HeaviestFirst()
            # a workload's id -> [the workload, its units seen, those not complete]
            self._open: dict[int, list[Any]] = {}

        def _split_scope(self, nodeid: str) -> str:
            return read("groups").get(nodeid) or nodeid

        def _pending_of(self, workload: dict[str, dict[str, bool]]) -> int:
            """The tests of a node's ``workload`` not complete, as xdist counts them,
            without going through every unit the node was ever given at each test's
            report (quadratic in the suite's size: seconds of the controller's CPU).
            A workload's units are only added (in order) and a test complete stays so:
            only the units not complete when last seen, and the new ones, are counted."""
            seen = self._open.get(id(workload))
            if seen is None or seen[0] is not workload:
                seen = self._open[id(workload)] = [workload, 0, set()]
            if seen[1] < len(workload):
                seen[2].update(itertools.islice(workload, seen[1], None))
                seen[1] = len(workload)
            pending = 0
            for scope in list(seen[2]):
                left = list(workload[scope].values()).count(False)
                if left:
                    pending += left
                else:
                    seen[2].discard(scope)
            return pending

    return _Groups(config, log)


# a test's weight in the scheduler's order (a unit's is its tests' sum): a test marked
# slow (more than a few seconds) or ray counts as SLOW_WEIGHT quick ones
SLOW_WEIGHT = 20


def _weight(item: pytest.Item) -> int:
    return SLOW_WEIGHT if item.get_closest_marker("slow") or item.get_closest_marker("ray") else 1


def _xdist_group(item: pytest.Item) -> str | None:
    """The tests that must run on one worker under ``--dist loadgroup``: the ``ray`` ones
    (one cluster a session), those of the GCS and Azure servers (``cloud``), and those
    of a module using a module-scoped fixture (a pack built once for the module, not
    once a worker)."""
    if item.get_closest_marker("ray"):
        return "ray"
    if {"azurite_server", "gcs_server", "gs_or_az"} & set(getattr(item, "fixturenames", ())):
        return "cloud"  # tests/storage/cloud_servers.py: one start of each a session
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    if any(d and d[-1].scope in ("module", "class", "package") for d in defs):
        return item.nodeid.split("::")[0]
    return None


def pytest_configure(config: pytest.Config) -> None:
    """A pytest-xdist worker computes with one thread (and so do the interpreters it
    starts, unless a test says otherwise): two workers on two cores each running two
    OpenMP threads spend the machine's time waiting on each other."""
    if not os.environ.get("PYTEST_XDIST_WORKER") and config.getoption("dist", None) == "loadgroup":
        import tempfile

        os.environ[_GROUPS_ENV] = tempfile.mkdtemp(prefix="imgpack-xdist-groups-")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(name, "1")
        import torch

        torch.set_num_threads(1)


def subprocess_env(**extra: str) -> dict[str, str]:
    """This environment for a child Python, with the repository first on PYTHONPATH
    (what was on it stays: a machine may carry packages there)."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def write_image(
    path: Path,
    size: tuple[int, int] = (40, 30),
    mode: str = "RGB",
    seed: int = 0,
    fmt: str | None = None,
    **save: object,
) -> Path:
    """A smooth random image (gradient + noise) of ``size`` (w, h) in ``mode``."""
    rng = np.random.default_rng(seed)
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack(
        [
            (xx * 255 // max(w - 1, 1)),
            (yy * 255 // max(h - 1, 1)),
            np.full((h, w), int(rng.integers(0, 256))),
        ],
        -1,
    )
    arr = np.clip(base + rng.integers(-20, 21, (h, w, 3)), 0, 255).astype(np.uint8)
    im = Image.fromarray(arr, "RGB")
    if mode != "RGB":
        im = im.convert(mode)
    path.parent.mkdir(parents=True, exist_ok=True)
    im.save(path, format=fmt, **save)
    return path


def write_bomb_jpeg(path: Path, width: int = 65000, height: int = 1500) -> Path:
    """A JPEG of 674 bytes whose frame header claims ``width`` x ``height``: a 16x16
    image's header and the start of its image data, then the end marker. libjpeg
    decodes it with only a warning ("premature end of data segment"), filling the rest
    with grey."""
    rng = np.random.default_rng(0)
    im = Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8))
    from io import BytesIO

    buf = BytesIO()
    im.save(buf, "JPEG", quality=50)
    data = bytearray(buf.getvalue())
    sof = data.find(b"\xff\xc0")
    data[sof + 5 : sof + 9] = height.to_bytes(2, "big") + width.to_bytes(2, "big")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(data[:672]) + b"\xff\xd9")
    return path


def write_cut_jpeg(path: Path, keep: float = 0.6, **save: object) -> Path:
    """A photo-like 120x90 JPEG whose image data stop after ``keep`` of the file, the
    end marker appended (a download cut short, then "repaired"): decodable, the rest
    grey, with libjpeg's "premature end of data segment" warning only."""
    write_image(path, (120, 90), fmt="JPEG", quality=90, **save)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)] + b"\xff\xd9")
    return path


# image_tree and packed serve about 500 and 250 tests: each worker writes the tree and
# builds its pack once (the templates below), and a test gets its own copy of them in its
# tmp_path (fresh files, fresh times), as if made there. A tree that another fixture has
# changed before ``packed`` (``photos``) is built, as before.
IMAGE_TREE = {
    "cat": [("a.jpg", (64, 48)), ("b.JPG", (30, 60)), ("c.png", (50, 50)), ("d.jpeg", (80, 20))],
    "dog": [("e.jpg", (64, 64)), ("nested/f.png", (33, 47)), ("g.webp", (40, 40)), ("h.bmp", (20, 30))],
    "zebra": [("i.jpg", (100, 75)), ("j.gif", (25, 25)), ("k.tiff", (36, 24)),
              ("l m.jpg", (41, 31)), ("-dash.jpg", (32, 32))],
}  # fmt: skip
PACKED = BuildConfig(size=(32, 24), workers=1)


# a build that SIGKILLs itself at its Nth progress report: argv SRC DST N WORKERS
KILL_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    from packer.builder.run import BuildConfig, build
    seen = 0
    def progress(n):
        global seen
        seen += 1
        if seen == int(sys.argv[3]):
            os.kill(os.getpid(), signal.SIGKILL)
    if __name__ == "__main__":  # worker processes import this module
        build(sys.argv[1], sys.argv[2], BuildConfig(size=(24, 24), workers=int(sys.argv[4])),
              progress=progress)
""")


def pack_digests(pack: Path, *drop: str) -> dict[str, str]:
    """SHA-256 of each file of ``pack`` by relative path, the manifest's ``build.created``
    (and the ``build`` keys ``drop`` names) left out: two builds of the same images
    compare equal."""
    out = {}
    for f in sorted(p for p in pack.rglob("*") if p.is_file()):
        data = f.read_bytes()
        if f.name == "imgpack.json":
            m = json.loads(data)
            for k in ("created", *drop):
                del m["build"][k]
            data = json.dumps(m, sort_keys=True).encode()
        out[str(f.relative_to(pack))] = hashlib.sha256(data).hexdigest()
    return out


def write_image_tree(root: Path) -> Path:
    """The ImageFolder tree of ``image_tree`` written at ``root``."""
    seed = 0
    for cls, files in IMAGE_TREE.items():
        for name, size in files:
            write_image(root / cls / name, size, seed=seed)
            seed += 1
    (root / "cat" / "notes.txt").write_text("not an image")
    return root


def _copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, copy_function=shutil.copy)  # new times, as if written now
    return dst


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.fixture(scope="session")
def image_tree_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_image_tree(tmp_path_factory.mktemp("image-tree-template") / "imgs")


@pytest.fixture(scope="session")
def packed_template(image_tree_template: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dst = tmp_path_factory.mktemp("packed-template") / "pack"
    build(image_tree_template, dst, PACKED)
    return dst


@pytest.fixture
def image_tree(tmp_path: Path, image_tree_template: Path) -> Path:
    """ImageFolder tree: 3 classes, 13 images of mixed sizes and formats, plus a non-image."""
    return _copy_tree(image_tree_template, tmp_path / "imgs")


@pytest.fixture
def packed(
    image_tree: Path, tmp_path: Path, image_tree_template: Path, packed_template: Path
) -> Path:
    """image_tree built at 32x24, crop, one worker: the template's pack copied, its
    manifest's ``source_root`` this test's tree (what a build here writes)."""
    dst = tmp_path / "pack"
    if _files(image_tree) != _files(image_tree_template):
        build(image_tree, dst, PACKED)
        return dst
    _copy_tree(packed_template, dst)
    manifest = dst / "imgpack.json"
    old = f'"source_root":{json.dumps(str(image_tree_template))}'
    text = manifest.read_text()
    assert text.count(old) == 1, text  # the builder's manifest changed: update this
    manifest.write_text(text.replace(old, f'"source_root":{json.dumps(str(image_tree))}'))
    return dst


def cli_run(*args: object) -> tuple[int, str, str]:
    """``imgpack ARGS`` through click's runner: exit code, stdout, stderr."""
    from click.testing import CliRunner

    from packer.cli import cli

    r = CliRunner().invoke(cli, [str(a) for a in args])
    return r.exit_code, r.stdout, r.stderr


def cli_build(src: Path, dst: Path, *extra: object) -> tuple[int, str, str]:
    """``imgpack build SRC DST`` at 8x6, one worker, quiet, plus ``extra``."""
    return cli_run("build", src, dst, "--size", "8x6", "--workers", "1", "-q", *extra)


def one_error(err: str) -> str:
    """The single ``Error:`` line of a user error (no traceback, nothing else)."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def src(tmp_path: Path) -> Path:
    """A tiny ImageFolder tree: cat/0.png, cat/1.png, dog/0.png (12x10)."""
    for rel in ("cat/0.png", "cat/1.png", "dog/0.png"):
        write_image(tmp_path / "src" / rel, (12, 10), seed=len(rel))
    return tmp_path / "src"


@pytest.fixture
def batched_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU build's path (``--device cuda``) with torch.device("cpu") in place of
    the GPU (tests/builder/test_build_gpu.py, tests/test_build_gpu_procs.py)."""
    import torch

    import packer.builder.run

    monkeypatch.setattr(
        packer.builder.run,
        "_build_device",
        lambda config: None if config.device == "cpu" else torch.device("cpu"),
    )


@pytest.fixture(scope="session")
def photos_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("photos-template")
    for i in range(20):
        write_image(root / f"p{i:02d}.jpg", (40 + 9 * i, 30 + 5 * i), seed=50 + i)
    return root


@pytest.fixture
def photos(tmp_path: Path, image_tree: Path, photos_template: Path) -> Path:
    """image_tree (PNG, WebP, BMP, GIF, TIFF, JPEG, a text file) + 20 JPEGs of assorted
    sizes (the inputs the GPU takes; written once a worker, copied) + a broken one."""
    for i in range(20):
        shutil.copy(photos_template / f"p{i:02d}.jpg", image_tree / "zebra" / f"p{i:02d}.jpg")
    (image_tree / "dog" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 broken")
    return image_tree


@pytest.fixture(scope="module")
def pack6(tmp_path_factory: pytest.TempPathFactory) -> packer.ImagePack:
    """6 images in 2 classes (cat, dog), 8x8."""
    root = tmp_path_factory.mktemp("brk")
    for c in ("cat", "dog"):
        for i in range(3):
            write_image(root / "src" / c / f"{i}.png", (20, 16), seed=i)
    build(root / "src", root / "p", BuildConfig(size=(8, 8), workers=1))
    return packer.load(root / "p")


def cpu_loader(pack: packer.ImagePack, bs: int = 2, **kw: object) -> packer.PackLoader:
    """A PackLoader on the CPU in the pack's order."""
    return packer.PackLoader(pack, bs, device="cpu", shuffle=False, **kw)  # type: ignore[arg-type]


PACK_FILES = (
    "_tensordict/images.memmap",
    "_tensordict/labels.memmap",
    "_tensordict/meta.json",
    "meta.json",
)


def assert_same_pack(a: Path, b: Path) -> None:
    """The packs at ``a`` and ``b`` hold the same bytes and manifest (but its build time)."""
    for f in PACK_FILES:
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    ma, mb = (json.loads((p / "imgpack.json").read_text()) for p in (a, b))
    for m in (ma, mb):
        del m["build"]["created"]
    assert ma == mb


def beside(dst: Path) -> list[str]:
    """The names in ``dst``'s parent folder."""
    return sorted(os.listdir(dst.parent))


def start_cli(args: list[object], **env: str) -> subprocess.Popen[str]:
    """``python -m packer ARGS`` started in a child, its stdout and stderr piped."""
    return subprocess.Popen(
        [sys.executable, "-m", "packer", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(**env),
    )


def stderr_until(proc: subprocess.Popen[str], needle: str) -> str:
    """Read the child's stderr until a line holds ``needle`` (the child is then busy)."""
    seen = ""
    assert proc.stderr is not None
    for line in proc.stderr:
        seen += line
        if needle in line:
            return seen
    raise AssertionError(f"{needle!r} never came; stderr: {seen}")


@pytest.fixture(scope="session")
def ray_cluster() -> Any:
    """A two-node Ray cluster on 127.0.0.1 (tests/ray_cluster.py), started once per
    session (about 10 s) with this process connected as its driver; stopped by PID
    after the session's last ``ray`` test (pytest_runtest_teardown below), else at the
    session's end."""
    from ray_cluster import Cluster

    cluster = Cluster(subprocess_env())
    _RAY_CLUSTERS.append(cluster)
    try:
        cluster.start()
        yield cluster
    finally:
        _stop_ray_clusters()


# The cluster's nodes, their warm workers and the driver's threads take CPU while idle
# (about 2 CPU-seconds a minute): once this process has run every ``ray`` test of the
# session (under --dist loadgroup they all run on one worker), the cluster stops then,
# not at the session's end. A ray test scheduled after that would find it stopped:
# the count makes sure none is.
_RAY_CLUSTERS: list[Any] = []
_ray_items: set[str] = set()
_ray_done: set[str] = set()


def _stop_ray_clusters() -> None:
    while _RAY_CLUSTERS:
        _RAY_CLUSTERS.pop().stop()


def ray_tests_left() -> bool:
    """Whether this process has ``ray`` tests still to run (the one being torn down
    counted as run): a fixture need not warm the cluster for none."""
    return bool(_ray_items - _ray_done)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    if item.get_closest_marker("ray"):
        if not _ray_items:
            _ray_items.update(i.nodeid for i in item.session.items if i.get_closest_marker("ray"))
        _ray_done.add(item.nodeid)
    yield
    if item.get_closest_marker("ray") and not ray_tests_left():
        _stop_ray_clusters()
