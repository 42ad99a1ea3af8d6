"""The loading and training experiments: the data they read (originals, their compressed
copy, a pack) and each way of loading it, timed alone and feeding ResNet-18."""

from __future__ import annotations

import itertools
import math
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import PackerError
from ..timing import each_pass, time_loader
from .config import BenchConfig, BenchResult

if TYPE_CHECKING:
    import torch


# ---------------------------------------------------------------- data


def _sample_source(source: Path, n: int, dst: Path) -> dict[str, str]:
    """Link an even sample of ``n`` images of ``source`` into an ImageFolder tree at ``dst``.

    Returns each link's path relative to ``dst`` -> the image's path relative to
    ``source``, so what the bench reports names the user's files, not its links.
    """
    from ...sources.scan import scan_tree

    scan = scan_tree(source)  # raises InputError when there is no image
    step = max(1, len(scan.entries) // n)
    names: dict[str, str] = {}
    for k, e in enumerate(scan.entries[::step][:n]):
        path = scan.root / e.rel
        d = dst / (scan.classes[e.label] if scan.classes else "all")
        d.mkdir(parents=True, exist_ok=True)
        link = d / f"i{k:06d}{path.suffix.lower()}"
        try:
            os.symlink(path.resolve(), link)
        except OSError:
            shutil.copyfile(path, link)
        names[link.relative_to(dst).as_posix()] = e.rel
    return names


def _user_names(text: str, work: Path, source: Path, names: dict[str, str]) -> str:
    """``text`` with the bench's temporary names replaced by the user's own."""
    for link, rel in names.items():
        text = text.replace(str(work / link), str(source / rel)).replace(link, rel)
    return text.replace(str(work), str(source))


def prepare_data(cfg: BenchConfig, work: Path, result: BenchResult) -> dict[str, Path]:
    """Originals, their compressed copy (if ffmpeg works) and a pack; returns their paths."""
    from ...builder.api import BuildConfig, build
    from ...compress import CompressConfig, compress
    from ...pack.describe import pack_bytes
    from ...pack.files import read_manifest
    from .synth import make_jpeg_tree

    g = cfg.grid
    t0 = time.perf_counter()
    orig = work / "original"
    names: dict[str, str] = {}
    if cfg.source is not None:
        names = _sample_source(cfg.source, g.images, orig)
        kind = f"{cfg.source} (an even sample)"
    else:
        make_jpeg_tree(orig, g.images, g.photo_size, threads=cfg.workers)
        kind = f"synthetic {g.photo_size[0]}x{g.photo_size[1]} JPEG quality 95"
    paths = {"original": orig}
    source = cfg.source or orig
    # the pack first: it decides which inputs are usable, and every loader is timed
    # on those only (the folder baseline reads the pack's sources)
    pack = work / "pack"
    try:
        r = build(orig, pack, BuildConfig(size=(g.pack_side, g.pack_side), workers=cfg.workers))
    except PackerError as e:  # every sampled image broken: say so in the user's names
        raise type(e)(_user_names(str(e), orig, source, names)) from None
    broken = [
        {
            "path": names.get(k["path"], k["path"]),
            "reason": _user_names(k["reason"], orig, source, names),
        }
        for k in r.skipped
    ]
    for k in broken:
        result.skip("loading", f"input {k['path']}", k["reason"])
    usable = [orig / rel for rel in read_manifest(pack).sources]
    result.dataset = {
        "images": r.count,
        "kind": kind,
        "original_bytes": sum(p.stat().st_size for p in usable),
        "pack_image": [3, g.pack_side, g.pack_side],
        "skipped_inputs": broken,
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
    paths["pack"] = pack
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
    from ..baseline import burst_batches, folder_loader

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
    from ...imaging.normalize import Normalize
    from ...loading.loader import PackLoader
    from ...loading.stats import StatsConfig
    from ...pack.reader import open_pack
    from ..baseline import image_folder, pack_files

    pack = open_pack(paths["pack"])
    # the originals as the pack holds them: a file the build skipped is never timed
    # links_out: with --source, "original" holds the bench's own links to the user's images
    original, _ = pack_files(paths["original"], pack.manifest, pack.labels.tolist(), links_out=True)
    yield _folder_way("original", original, batch, device, workers, per_repeat_images)
    if "compressed" in paths:  # compress wrote only files ffmpeg could read
        ds = image_folder(paths["compressed"], side, side, "crop")
        yield _folder_way("compressed", ds, batch, device, workers, per_repeat_images)
    n = len(pack)
    pack_batches = max(8, math.ceil(4 * n / batch))  # four epochs: not lost in clock noise
    cuda = device.type == "cuda"
    bare = StatsConfig(warn_share=None)  # a timing loop waits for its loader by design
    if section == "loading" or not cuda:
        pl = PackLoader(pack, batch, device="cpu", drop_last=True, stats=bare)
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
        pl = PackLoader(pack, batch, device=device, drop_last=True, stats=bare)
        yield Way(
            f"pack to {device} (PackLoader)",
            pl,
            lambda b: (norm(b[0]), b[1]),
            6,
            pack_batches,
            pl.close,
        )


def _iterate(way: Way) -> Callable[[], Any]:
    return each_pass(way.loader)


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


def train_step(
    arch: str, classes: int, device: torch.device, weight_decay: float = 0.0
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``step(x, y)``: one SGD step (lr 0.01, momentum 0.9) of a fresh torchvision
    ``arch`` (weights seeded 0) in bf16 autocast, channels_last, on float images ``x``;
    returns ``x`` as the model saw it. The step every training figure times."""
    import torch
    import torchvision

    torch.manual_seed(0)
    model = getattr(torchvision.models, arch)(num_classes=classes)
    model = model.to(device, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=weight_decay)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return x

    return step


def resident_batches(
    pack: Any, batch: int, device: torch.device, aug: Callable[..., Any], count: int = 8
) -> Callable[[], Iterator[tuple[Any, Any]]]:
    """The ceiling's batches: the pack's first ``count`` batches of ``batch`` (uint8
    images, labels) already on ``device``; returns a function giving an endless
    iterator over them, each image batch through ``aug`` (its generator seeded 0)."""
    import torch

    resident = [
        (pack.images[i * batch : (i + 1) * batch].to(device),
         pack.labels[i * batch : (i + 1) * batch].to(device))
        for i in range(min(count, len(pack) // batch))
    ]  # fmt: skip
    g = torch.Generator().manual_seed(0)

    def on_gpu() -> Iterator[tuple[Any, Any]]:
        while True:
            for x, y in resident:
                yield aug(x, generator=g), y

    return on_gpu


def run_training(
    cfg: BenchConfig,
    paths: dict[str, Path],
    device: torch.device,
    workers: int,
    result: BenchResult,
    tick: Callable[[], None],
) -> None:
    import torch

    g = cfg.grid
    classes = max(2, len([p for p in paths["original"].iterdir() if p.is_dir()]))
    step = train_step("resnet18", classes, device)

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
