"""``imgpack bench``: the questions behind imgpack, measured on this machine.

Three experiments, each a list of points (one dict per measurement):

transfer    a batch of images from host memory to the device: uint8 vs
            float16 vs float32, pinned vs pageable memory, over batch and image
            sizes; and the order of conversion: ``x.cuda().half()`` (copy
            uint8, convert on the device) vs ``x.half().cuda()`` (convert on
            the host, copy twice the bytes).
loading     images/s delivered to the device, normalized, by: the original
            JPEG folder (ImageFolder + Pillow + DataLoader workers), the same
            folder after ``imgpack compress``, the pack read on the CPU, and
            the pack streamed to the device by PackLoader.
training    ResNet-18 with bf16 autocast fed by each loader, and by batches
            already on the GPU (the ceiling). CUDA only.

Timing: warm-up first, the device synchronized before every clock read, the
median of repeats. Data: synthetic photo-like JPEGs (see :mod:`packer.synth`)
or, with ``source``, an even sample of the user's images, written to a
temporary folder that is removed at the end.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import InputError, PackerError, UsageError
from .timing import check_device_name, resolve_device, time_call, time_loader

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

SECTIONS = ("transfer", "loading", "training")


@dataclass(frozen=True)
class Grid:
    """What one run measures; ``FULL`` and ``QUICK`` are the two sizes."""

    image_sizes: tuple[tuple[int, int], ...]  # (w, h) for the transfer experiment
    transfer_batches: tuple[int, ...]
    load_batches: tuple[int, ...]
    images: int  # images in the loading/training dataset
    photo_size: tuple[int, int]  # (w, h) of the synthetic originals
    pack_side: int  # the pack's images are pack_side² (crop)
    train_batch: int
    train_steps: int  # per repeat (at least one round of folder workers)
    train_repeats: int
    load_repeats: int
    repeats: int
    target_s: float  # length of one timed repeat in the transfer experiment
    load_images: int  # images per timed repeat in the loading experiment


FULL = Grid(
    image_sizes=((384, 384), (640, 480), (1280, 960)),
    transfer_batches=(8, 16, 32, 64, 128, 256),
    load_batches=(32, 64, 128, 256),
    images=2048,
    photo_size=(1280, 960),
    pack_side=224,
    train_batch=256,
    train_steps=10,
    train_repeats=3,
    load_repeats=3,
    repeats=5,
    target_s=0.05,
    load_images=512,
)
QUICK = Grid(
    image_sizes=((384, 384), (640, 480)),
    transfer_batches=(8, 32),
    load_batches=(16, 32),
    images=64,
    photo_size=(320, 240),
    pack_side=64,
    train_batch=32,
    train_steps=4,
    train_repeats=3,
    load_repeats=3,
    repeats=3,
    target_s=0.01,
    load_images=32,
)


@dataclass(frozen=True)
class BenchConfig:
    device: str | torch.device = "auto"  # resolved once: by the caller, or by bench()
    quick: bool = False
    source: Path | None = None  # the user's images instead of synthetic ones
    workers: int | None = None  # DataLoader workers and build/compress processes
    sections: tuple[str, ...] = SECTIONS
    max_batch_bytes: int | None = None  # default: a quarter of free memory, at most 4 GiB

    @property
    def grid(self) -> Grid:
        return QUICK if self.quick else FULL

    def resolved_workers(self, cores: int) -> int:
        return self.workers or (min(2, cores) if self.quick else min(16, cores))

    def validate(self) -> None:
        if isinstance(self.device, str):
            check_device_name(self.device)
        unknown = set(self.sections) - set(SECTIONS)
        if unknown or not self.sections:
            raise UsageError(
                f"sections must be some of {', '.join(SECTIONS)}; "
                f"got {', '.join(sorted(unknown)) or 'none'}"
            )
        if self.workers is not None and self.workers < 1:
            raise UsageError("--workers must be at least 1")
        if self.source is not None and not self.source.is_dir():
            raise UsageError(f"{self.source}: --source must be a folder of images")


@dataclass
class BenchResult:
    device: str
    device_name: str
    quick: bool
    machine: dict[str, Any]
    grid: dict[str, Any]
    transfer: list[dict[str, Any]] = field(default_factory=list)
    conversion: list[dict[str, Any]] = field(default_factory=list)
    loading: list[dict[str, Any]] = field(default_factory=list)
    training: list[dict[str, Any]] = field(default_factory=list)
    dataset: dict[str, Any] = field(default_factory=dict)
    skipped: list[dict[str, str]] = field(default_factory=list)
    seconds: float = 0.0

    def skip(self, section: str, what: str, reason: str) -> None:
        log.debug("bench: skipping %s %s: %s", section, what, reason)
        self.skipped.append({"section": section, "what": what, "reason": reason})

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["seconds"] = round(self.seconds, 2)
        return d


# ---------------------------------------------------------------- the plan


def _free_memory() -> int | None:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _transfer_plan(cuda: bool) -> list[tuple[str, str, bool]]:
    """(dtype, label, pinned) series; pinned memory needs CUDA."""
    series = []
    for dtype in ("uint8", "float16", "float32"):
        series.append((dtype, f"{dtype} pageable", False))
        if cuda:
            series.append((dtype, f"{dtype} pinned", True))
    return series


def estimate_seconds(cfg: BenchConfig, cores: int, cuda: bool) -> float:
    """A rough forecast of the run time, printed before a full run starts."""
    g = cfg.grid
    workers = cfg.resolved_workers(cores)
    s = 0.0
    if "transfer" in cfg.sections:
        points = len(g.image_sizes) * len(g.transfer_batches)
        series = len(_transfer_plan(cuda)) + 4
        s += points * series * (g.repeats + 3) * g.target_s * 1.5 + 10
    if {"loading", "training"} & set(cfg.sections):
        mpx = g.photo_size[0] * g.photo_size[1] / 1e6
        # make (~0.1 s/Mpx), compress (~0.1 s/Mpx + process start), build (~0.02 s/Mpx) per core
        s += g.images * (0.22 * mpx + 0.03) / max(1, cores)
        folder_rate = max(50.0, workers * 50 / max(mpx, 0.05))  # ImageFolder + Pillow, img/s
        folders = 2  # the original and the compressed folder
        for b in g.load_batches if "loading" in cfg.sections else ():
            s += folders * (2 + g.load_repeats) * max(workers * b, g.load_images) / folder_rate + 2
        if cuda and "training" in cfg.sections:
            s += folders * (2 + g.train_repeats) * workers * g.train_batch / folder_rate + 20
    return s


# ---------------------------------------------------------------- transfer


def _batch_bytes(b: int, size: tuple[int, int], dtype: str) -> int:
    return b * 3 * size[0] * size[1] * {"uint8": 1, "float16": 2, "float32": 4}[dtype]


def _rotating(buf: Any, b: int) -> Callable[[], Any]:
    """Alternate between two disjoint slices of ``buf`` when it holds two batches,
    so a small batch is not served from cache on every call."""
    slices = [buf[:b], buf[b : 2 * b]] if len(buf) >= 2 * b else [buf[:b]]
    state = [0]

    def nxt() -> Any:
        state[0] ^= 1
        return slices[state[0] % len(slices)]

    return nxt


def run_transfer(
    cfg: BenchConfig, device: torch.device, result: BenchResult, tick: Callable[[], None]
) -> None:
    import torch

    g = cfg.grid
    cuda = device.type == "cuda"
    free = _free_memory()
    cap = cfg.max_batch_bytes or min(4 << 30, (free // 4) if free else 4 << 30)
    dtypes = {"uint8": torch.uint8, "float16": torch.float16, "float32": torch.float32}
    for size in g.image_sizes:
        w, h = size
        for dtype, label, pinned in _transfer_plan(cuda):
            fits = [b for b in g.transfer_batches if _batch_bytes(b, size, dtype) <= cap]
            for b in g.transfer_batches:
                if b not in fits:
                    result.skip(
                        "transfer",
                        f"{label} {w}x{h} batch {b}",
                        f"{_batch_bytes(b, size, dtype) / 1e9:.1f} GB per batch is over "
                        f"the {cap / 1e9:.1f} GB limit (a quarter of free memory)",
                    )
                    tick()
            if not fits:
                continue
            rows = max(fits) * 2 if _batch_bytes(max(fits), size, dtype) * 2 <= cap else max(fits)
            buf = torch.empty((rows, 3, h, w), dtype=dtypes[dtype], pin_memory=pinned)
            buf.fill_(7)  # fault the pages in before any clock runs
            for b in fits:
                nxt = _rotating(buf, b)
                sec = time_call(
                    lambda nxt=nxt, nb=pinned: nxt().to(device, non_blocking=nb, copy=True),
                    device,
                    repeats=g.repeats,
                    target_s=g.target_s,
                )
                nbytes = _batch_bytes(b, size, dtype)
                result.transfer.append(
                    {
                        "image": f"{w}x{h}",
                        "batch": b,
                        "dtype": dtype,
                        "pinned": pinned,
                        "series": label,
                        "ms": round(sec * 1e3, 4),
                        "images_per_s": round(b / sec, 1),
                        "gb_per_s": round(nbytes / sec / 1e9, 3),
                    }
                )
                tick()
            del buf
        _conversion(cfg, device, size, cap, result, tick)


def _conversion(
    cfg: BenchConfig,
    device: torch.device,
    size: tuple[int, int],
    cap: int,
    result: BenchResult,
    tick: Callable[[], None],
) -> None:
    """uint8 batch in host memory (pinned on CUDA, as a loader holds it) -> float on the device."""
    import torch

    g = cfg.grid
    w, h = size
    cuda = device.type == "cuda"
    dev = "cuda" if cuda else "to('cpu')"
    fits = [b for b in g.transfer_batches if _batch_bytes(b, size, "float32") <= cap]
    buf = torch.empty((max(fits or [1]) * 2, 3, h, w), dtype=torch.uint8, pin_memory=cuda)
    buf.fill_(7)
    for to in ("float16", "float32"):
        short = {"float16": "half", "float32": "float"}[to]
        dt = getattr(torch, to)
        variants = {
            f"x.{dev}().{short}()" if cuda else f"x.{dev}.{short}()": lambda x, dt=dt: x.to(
                device, non_blocking=cuda, copy=True
            ).to(dt),
            f"x.{short}().{dev}()" if cuda else f"x.{short}().{dev}": lambda x, dt=dt: x.to(dt).to(
                device, copy=True
            ),
        }
        for order, (label, fn) in enumerate(variants.items()):
            for b in g.transfer_batches:
                if b not in fits:
                    result.skip("transfer", f"{label} {w}x{h} batch {b}", "over the memory limit")
                    tick()
                    continue
                nxt = _rotating(buf, b)
                sec = time_call(
                    lambda nxt=nxt, fn=fn: fn(nxt()), device, repeats=g.repeats, target_s=g.target_s
                )
                result.conversion.append(
                    {
                        "image": f"{w}x{h}",
                        "batch": b,
                        "to": to,
                        "order": order,
                        "series": label,
                        "convert_on": "device" if order == 0 else "host",
                        "ms": round(sec * 1e3, 4),
                        "images_per_s": round(b / sec, 1),
                    }
                )
                tick()


# ---------------------------------------------------------------- data


def _sample_source(source: Path, n: int, dst: Path) -> None:
    """Link an even sample of ``n`` images of ``source`` into an ImageFolder tree at ``dst``."""
    from .scan import scan_tree

    scan = scan_tree(source)  # raises InputError when there is no image
    step = max(1, len(scan.entries) // n)
    for k, e in enumerate(scan.entries[::step][:n]):
        path = scan.root / e.rel
        d = dst / (scan.classes[e.label] if scan.classes else "all")
        d.mkdir(parents=True, exist_ok=True)
        link = d / f"i{k:06d}{path.suffix.lower()}"
        try:
            os.symlink(path.resolve(), link)
        except OSError:
            shutil.copyfile(path, link)


def _tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def prepare_data(cfg: BenchConfig, work: Path, result: BenchResult) -> dict[str, Path]:
    """Originals, their compressed copy (if ffmpeg works) and a pack; returns their paths."""
    from .build import BuildConfig, build
    from .compress import CompressConfig, compress
    from .synth import make_jpeg_tree

    g = cfg.grid
    t0 = time.perf_counter()
    orig = work / "original"
    if cfg.source is not None:
        _sample_source(cfg.source, g.images, orig)
        kind = f"{cfg.source} (an even sample)"
    else:
        make_jpeg_tree(orig, g.images, g.photo_size, threads=cfg.workers)
        kind = f"synthetic {g.photo_size[0]}x{g.photo_size[1]} JPEG quality 95"
    paths = {"original": orig}
    n = sum(1 for p in orig.rglob("*") if p.is_file() or p.is_symlink())
    result.dataset = {
        "images": n,
        "kind": kind,
        "original_bytes": _tree_bytes(orig),
        "pack_image": [3, g.pack_side, g.pack_side],
    }
    comp = work / "compressed"
    try:
        r = compress(orig, comp, CompressConfig(workers=cfg.workers))
        if r.written:
            paths["compressed"] = comp
            result.dataset["compressed_bytes"] = r.bytes_out
            result.dataset["compress_quality"] = CompressConfig().quality
        else:
            result.skip("loading", "compressed folder", "compress wrote no image")
    except PackerError as e:  # no ffmpeg, typically
        result.skip("loading", "compressed folder", str(e))
    pack = work / "pack"
    r = build(orig, pack, BuildConfig(size=(g.pack_side, g.pack_side), workers=cfg.workers))
    if not r.count:
        raise InputError(f"{cfg.source or orig}: no image could be decoded for the pack")
    paths["pack"] = pack
    from .format import pack_bytes

    result.dataset["pack_bytes"] = pack_bytes(pack)
    result.dataset["prepare_seconds"] = round(time.perf_counter() - t0, 2)
    return paths


# ---------------------------------------------------------------- loaders


@dataclass
class Way:
    """One way of loading: batches from ``loader``, ``ship`` puts one on the device.

    ``warmup`` and ``per_repeat`` are in batches. A folder DataLoader delivers in
    bursts (each worker builds a whole batch, all start together), so it is warmed
    up past its first two bursts (prefetch_factor 2) and timed over whole rounds
    of one batch per worker; it samples with replacement, without end, so no epoch
    boundary lands inside a timed run.
    """

    name: str
    loader: Any
    ship: Callable[[Any], Any]
    warmup: int
    per_repeat: int
    close: Callable[[], None] = lambda: None


def _folder_way(
    name: str, ds: Any, batch: int, device: torch.device, workers: int, images: int
) -> Way:
    from .baseline import burst_batches, folder_loader

    dl = folder_loader(ds, batch, device, workers, endless=True)
    _, per_repeat = burst_batches(workers, batch, images)

    def ship(b: Any) -> Any:
        return b[0].to(device, non_blocking=True), b[1].to(device, non_blocking=True)

    return Way(
        f"{name} folder (ImageFolder + Pillow, {workers} workers)",
        dl,
        ship,
        warmup=2 * max(1, workers),
        per_repeat=per_repeat,
    )


def _ways(
    paths: dict[str, Path],
    side: int,
    batch: int,
    device: torch.device,
    workers: int,
    per_repeat_images: int,
    section: str,
) -> Iterator[Way]:
    """Each way of loading, made when it is its turn (one at a time holds workers or
    pinned memory). Batches end on ``device`` as normalized floats: folder loaders
    normalize in their workers, as people write them; the pack on arrival."""
    from .baseline import image_folder, pack_files
    from .loader import Normalize, PackLoader
    from .pack import open_pack

    pack = open_pack(paths["pack"])
    # the originals as the pack holds them: a file the build skipped is never timed
    original, _ = pack_files(paths["original"], pack.manifest, pack.labels.tolist())
    yield _folder_way("original", original, batch, device, workers, per_repeat_images)
    if "compressed" in paths:  # compress wrote only files ffmpeg could read
        ds = image_folder(paths["compressed"], side, side, "crop")
        yield _folder_way("compressed", ds, batch, device, workers, per_repeat_images)
    n = len(pack)
    pack_batches = max(8, math.ceil(4 * n / batch))  # four epochs: not lost in clock noise
    cuda = device.type == "cuda"
    if section == "loading" or not cuda:
        pl = PackLoader(pack, batch, device="cpu", drop_last=True)
        if cuda:  # the pack read the simple way: host batches, then a plain copy
            norm = Normalize().to(device)
            yield Way(
                f"pack read on the CPU, then .to({device})",
                pl,
                lambda b: (norm(b[0].to(device)), b[1].to(device)),
                6,
                pack_batches,
                pl.close,
            )
        else:
            cpu_norm = Normalize()
            yield Way(
                "pack on CPU (PackLoader)",
                pl,
                lambda b: (cpu_norm(b[0]), b[1]),
                6,
                pack_batches,
                pl.close,
            )
    if cuda:
        norm = Normalize().to(device)
        pl = PackLoader(pack, batch, device=device, drop_last=True)
        yield Way(
            f"pack to {device} (PackLoader)",
            pl,
            lambda b: (norm(b[0]), b[1]),
            6,
            pack_batches,
            pl.close,
        )


def _iterate(way: Way) -> Callable[[], Any]:
    return lambda: iter(way.loader)


def run_loading(
    cfg: BenchConfig,
    paths: dict[str, Path],
    device: torch.device,
    workers: int,
    result: BenchResult,
    tick: Callable[[], None],
) -> None:
    g = cfg.grid
    for batch in g.load_batches:
        if batch > result.dataset["images"]:
            result.skip("loading", f"batch {batch}", "larger than the dataset")
            for _ in range(4 if device.type == "cuda" else 3):
                tick()
            continue
        for way in _ways(paths, g.pack_side, batch, device, workers, g.load_images, "loading"):
            rate = time_loader(
                _iterate(way),
                lambda b, f=way.ship: f(b)[0],
                device,
                way.per_repeat,
                g.load_repeats,
                warmup=way.warmup,
            )
            way.close()
            result.loading.append(
                {"loader": way.name, "batch": batch, "images_per_s": round(rate, 1)}
            )
            tick()


# ---------------------------------------------------------------- training


def run_training(
    cfg: BenchConfig,
    paths: dict[str, Path],
    device: torch.device,
    workers: int,
    result: BenchResult,
    tick: Callable[[], None],
) -> None:
    import torch
    import torchvision

    g = cfg.grid
    classes = max(2, len([p for p in paths["original"].iterdir() if p.is_dir()]))
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=classes)
    model = model.to(device, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(x: Any, y: Any) -> Any:
        x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return x

    b, side = g.train_batch, g.pack_side
    x0 = torch.randn(b, 3, side, side, device=device)
    y0 = torch.randint(0, classes, (b,), device=device)

    def on_gpu() -> Iterator[tuple[Any, Any]]:
        while True:
            yield x0, y0

    ceiling = Way("batches already on the GPU (ceiling)", None, lambda t: t, 3, g.train_steps)
    for way in itertools.chain([ceiling], _ways(paths, side, b, device, workers, 0, "training")):
        if b > result.dataset["images"] and way.loader is not None:
            result.skip("training", way.name, f"batch {b} is larger than the dataset")
            continue
        make = on_gpu if way.loader is None else _iterate(way)
        rate = time_loader(
            make,
            lambda t, f=way.ship: step(*f(t)),
            device,
            max(g.train_steps, way.per_repeat),
            g.train_repeats,
            warmup=way.warmup,
        )
        way.close()
        result.training.append(
            {
                "loader": way.name,
                "batch": b,
                "model": "resnet18",
                "precision": "bf16 autocast",
                "images_per_s": round(rate, 1),
            }
        )
        tick()
    ceiling = result.training[0]["images_per_s"]
    for p in result.training:
        p["of_ceiling"] = round(p["images_per_s"] / ceiling, 4)


# ---------------------------------------------------------------- entry point


def count_points(cfg: BenchConfig, cuda: bool) -> int:
    g = cfg.grid
    n = 0
    if "transfer" in cfg.sections:
        n += len(g.image_sizes) * len(g.transfer_batches) * (len(_transfer_plan(cuda)) + 4)
    loaders = 4 if cuda else 3
    if "loading" in cfg.sections:
        n += len(g.load_batches) * loaders
    if "training" in cfg.sections and cuda:
        n += loaders
    return n


def machine_info(device: torch.device) -> dict[str, Any]:
    import platform

    import torch

    info: dict[str, Any] = {
        "cores": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def bench(
    cfg: BenchConfig = BenchConfig(),
    progress: Callable[[int], None] | None = None,
    on_start: Callable[[int, int], None] | None = None,
) -> BenchResult:
    """Run the experiments of ``cfg``; every measured point is in the result.

    Raises PackerError for unusable options (no CUDA for ``device="cuda"``, a
    source folder without images).
    """
    import torch

    t0 = time.perf_counter()
    cfg.validate()
    device = resolve_device(cfg.device)
    cuda = device.type == "cuda"
    cores = os.cpu_count() or 1
    workers = cfg.resolved_workers(cores)
    result = BenchResult(
        device=str(device),
        device_name=torch.cuda.get_device_name(device) if cuda else "CPU",
        quick=cfg.quick,
        machine=machine_info(device),
        grid=asdict(cfg.grid),
    )
    result.grid["workers"] = workers
    tick = (lambda: progress(1)) if progress else (lambda: None)
    if on_start:
        on_start(count_points(cfg, cuda), 0)
    wants_data = "loading" in cfg.sections or ("training" in cfg.sections and cuda)
    if "training" in cfg.sections and not cuda:
        result.skip("training", "all", "training runs on CUDA only; use a machine with a GPU")
    if wants_data:
        with tempfile.TemporaryDirectory(prefix="imgpack-bench-") as tmp:
            paths = prepare_data(cfg, Path(tmp), result)
            if "loading" in cfg.sections:
                run_loading(cfg, paths, device, workers, result, tick)
            if "training" in cfg.sections and cuda:
                run_training(cfg, paths, device, workers, result, tick)
    # last: its multi-GB buffers stay in torch's caching allocators, and PackLoader measured
    # after them ran 2-3x slower on an H100 (79k vs 219k img/s at batch 256)
    if "transfer" in cfg.sections:
        run_transfer(cfg, device, result, tick)
    result.seconds = time.perf_counter() - t0
    return result


# ---------------------------------------------------------------- report


def write_results(r: dict[str, Any], out: Path) -> list[Path]:
    """Write the plots, ``results.md`` and ``results.json`` of a result (its
    ``to_json()``) into the folder ``out`` (made if needed), each file whole or absent."""
    from .format import write_json_atomic
    from .plots import plot_bench

    out.mkdir(parents=True, exist_ok=True)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        log.warning("no plots: matplotlib is not installed (pip install 'imgpack[plot]')")
        files = []
    else:
        files = plot_bench(r, out)
    md = out / "results.md"
    tmp = out / ".results.md.tmp"
    tmp.write_text(to_markdown(r) + "\n", encoding="utf-8")
    os.replace(tmp, md)
    write_json_atomic(out / "results.json", r, indent=1)
    return [*files, md, out / "results.json"]


def _pivot(
    points: list[dict[str, Any]], row: str, col: str, val: str, fmt: Callable[[Any], str]
) -> list[str]:
    rows = list(dict.fromkeys(p[row] for p in points))
    cols = list(dict.fromkeys(p[col] for p in points))
    cell = {(p[row], p[col]): p[val] for p in points}
    lines = [f"| {row} | " + " | ".join(str(c) for c in cols) + " |", "|---|" + "---:|" * len(cols)]
    for r in rows:
        lines.append(
            f"| {r} | "
            + " | ".join(fmt(cell[r, c]) if (r, c) in cell else "-" for c in cols)
            + " |"
        )
    return lines


def to_markdown(r: dict[str, Any]) -> str:
    """The result (``BenchResult.to_json()``) as Markdown tables."""
    m = r["machine"]
    out = [
        f"# imgpack bench{' --quick' if r['quick'] else ''}",
        "",
        f"{r['device_name']} ({r['device']}), {m['cores']} cores, torch {m['torch']}, "
        f"{m['date']}; {r['seconds']:.0f} s. Medians of repeats after warm-up (transfer "
        f"{r['grid']['repeats']}, loading {r['grid']['load_repeats']}, training "
        f"{r['grid']['train_repeats']}), device synchronized before each clock read.",
        "",
    ]
    for image in dict.fromkeys(p["image"] for p in r["transfer"]):
        pts = [
            dict(p, cell=f"{p['images_per_s']:,.0f} ({p['gb_per_s']:.1f})")
            for p in r["transfer"]
            if p["image"] == image
        ]
        out += [f"## Transfer, {image} images: images/s (GB/s) by batch size", ""]
        out += _pivot(pts, "series", "batch", "cell", str)
        out.append("")
    for image in dict.fromkeys(p["image"] for p in r["conversion"]):
        pts = [p for p in r["conversion"] if p["image"] == image]
        out += [f"## Where to convert, {image} uint8 -> float: ms per batch", ""]
        out += _pivot(pts, "series", "batch", "ms", lambda v: f"{v:.3f}")
        out.append("")
    if r["loading"]:
        d = r["dataset"]
        sizes = [f"original {d['original_bytes'] / d['images'] / 1e3:,.0f} KB/image"]
        if "compressed_bytes" in d:
            sizes.append(
                f"compressed (-q:v {d['compress_quality']}) "
                f"{d['compressed_bytes'] / d['images'] / 1e3:,.0f} KB/image"
            )
        sizes.append(f"pack {d['pack_bytes'] / d['images'] / 1e3:,.0f} KB/image")
        out += [
            "## Loading: images/s on the device, normalized, by batch size",
            "",
            f"{d['images']} images, {d['kind']}; " + ", ".join(sizes) + ".",
            "",
        ]
        out += _pivot(r["loading"], "loader", "batch", "images_per_s", lambda v: f"{v:,.0f}")
        out.append("")
    if r["training"]:
        out += [
            f"## Training: ResNet-18, bf16 autocast, batch {r['training'][0]['batch']}",
            "",
            "| fed by | images/s | of the ceiling |",
            "|---|---:|---:|",
        ]
        out += [
            f"| {p['loader']} | {p['images_per_s']:,.0f} | {p['of_ceiling']:.1%} |"
            for p in r["training"]
        ]
        out.append("")
    if r["skipped"]:
        out += ["## Not measured", ""]
        out += [f"- {s['section']}: {s['what']}: {s['reason']}" for s in r["skipped"]]
        out.append("")
    return "\n".join(out)
