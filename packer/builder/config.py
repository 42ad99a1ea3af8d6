"""What a build takes and returns: :class:`BuildConfig`, :class:`BuildResult`, and the
labelled image list (:class:`_Labels`) fixed before any decoding. :func:`parse_size` reads
``imgpack build --size``'s text; :meth:`BuildConfig.validate` checks its range. Imported by
:mod:`packer.builder.run` and :mod:`packer.builder.finalize` (no build work here).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import UsageError
from ..imaging.decode import DEFAULT_MAX_PIXELS, RESIZE_MODES, ResizeSpec
from ..pack.kinds import StorageKind, kind_of
from ..pack.layout import STORAGE_KINDS
from ..sources.scan import Scan
from ..sources.tables import check_target_names
from .formats.options import SourceOptions

if TYPE_CHECKING:
    from .dense import DenseOptions

_F = "BuildConfig."  # how messages name a field (the CLI shows its flag: packer.cli.flags)


@dataclass(frozen=True)
class GpuTuning:
    """The batched GPU build's knobs (:mod:`packer.builder.gpu`), at their measured
    defaults. Private: a build takes them from ``BuildConfig._gpu``, which tests set
    (smaller groups, to cut a few images into many) instead of patching the module."""

    group_images: int = 256  # about this many images (whole chunks) decoded as one GPU batch
    writers: int = 4  # threads writing and hashing groups (pwrite, SHA-256 free the GIL)
    readers: int = 4  # threads reading and classifying the files (read frees the GIL)
    read_ahead: int = 6  # groups read (and their CPU decodes started) ahead of the decoder
    in_flight: int = 8  # groups sent to the decoder and not yet written
    decode_ahead: int = 3  # groups decoded ahead of the crop


@dataclass(frozen=True)
class BuildConfig:
    """Options of a build. ``size`` is (width, height) in pixels.

    ``classes``: a class-map file (one name per line) or a pack whose ``classes`` are
    reused: fixes the class -> index map. ``allow_new_classes``: append classes not in
    the map instead of refusing them. ``labels``: a label table (.csv, .tsv, .parquet)
    with ``path`` and ``label`` columns. ``targets``: numeric columns of the table,
    stored as float32 ``targets [N, K]`` in this order.
    """

    size: tuple[int, int] = (224, 224)
    resize: str = "crop"
    workers: int | None = None  # None: every core
    overwrite: bool = False
    max_pixels: int = DEFAULT_MAX_PIXELS
    classes: Path | str | None = None  # str: an object-storage URL
    allow_new_classes: bool = False
    labels: Path | None = None
    targets: tuple[str, ...] = ()
    store: str = "raw"  # "raw": uint8 rows of ``size``; "jpeg": each image's JPEG file
    quality: int = 3  # store "jpeg": re-encode quality, ffmpeg's -q:v scale (2 best..31)
    max_side: int | None = None  # store "jpeg": longest stored side; larger are re-encoded
    device: str = "cpu"  # "cpu" (worker processes), "cuda" (batched nvjpeg), "auto"
    # a pack set (packer.builder.shards): shards of about this many bytes; None: one pack
    shard_size: int | None = None
    append: bool = False  # add SRC's images the set at DST lacks, as new shards
    # who builds a set's shards: "local" (this machine), "ray" (one Ray task per shard,
    # packer.builder.ray_engine; always a set), on the cluster at ``ray_address``
    engine: str = "local"
    ray_address: str | None = None  # None: the cluster ray.init finds (RAY_ADDRESS), or a new one
    # private: the GPU build's knobs (tests pass small groups); not an option of the pack
    _gpu: GpuTuning = field(default=GpuTuning(), repr=False)
    # parquet/Arrow/tar/zip/bucket sources: columns, label field, per-image byte cap
    sources: SourceOptions = SourceOptions()
    # boxes, masks, keypoints from annotations (packer.builder.dense.DenseOptions); None:
    # none, unless SRC's layout is unmistakably COCO, YOLO or VOC (then the defaults)
    dense: DenseOptions | None = None

    def __post_init__(self) -> None:
        # paths given as str and column names as a list are the same options
        for name in ("classes", "labels"):
            value = getattr(self, name)
            # an object-storage URL stays a str (Path would fold its "//")
            if value is not None and not isinstance(value, Path):
                keep = name == "classes" and isinstance(value, str) and "://" in value
                object.__setattr__(self, name, value if keep else Path(value))
        if not isinstance(self.targets, tuple):
            object.__setattr__(self, "targets", tuple(self.targets))

    def validate(self) -> None:
        w, h = self.size
        if not (1 <= w <= 8192 and 1 <= h <= 8192):
            raise UsageError(
                f"{_F}size {w}x{h} is out of range: each side must be 1 to 8192 pixels",
                field=f"{_F}size",
            )
        if self.resize not in RESIZE_MODES:
            raise UsageError(
                f"{_F}resize must be one of {', '.join(RESIZE_MODES)}, not {self.resize!r}",
                field=f"{_F}resize",
            )
        if self.workers is not None and not 1 <= self.workers <= 1024:
            raise UsageError(
                f"{_F}workers must be 1 to 1024, not {self.workers}", field=f"{_F}workers"
            )
        if self.max_pixels < 1:
            raise UsageError(f"{_F}max_pixels must be positive", field=f"{_F}max_pixels")
        if self.targets and self.labels is None:
            raise UsageError(
                f"{_F}targets names columns of a label table; give the table with {_F}labels",
                field=f"{_F}targets",
            )
        check_target_names(list(self.targets))
        if self.store not in STORES:
            raise UsageError(
                f"{_F}store must be one of {', '.join(STORES)}, not {self.store!r}",
                field=f"{_F}store",
            )
        if not 2 <= self.quality <= 31:
            raise UsageError(
                f"{_F}quality must be 2 (best) to 31 (worst), not {self.quality}",
                field=f"{_F}quality",
            )
        kind = kind_of(self.store)
        if self.max_side is not None:
            kind.check_options(self)  # a raw build refuses max_side here, as before
            if not 1 <= self.max_side <= 65536:
                raise UsageError(
                    f"{_F}max_side must be 1 to 65536 pixels, not {self.max_side}",
                    field=f"{_F}max_side",
                )
        if self.device not in ("cpu", "cuda", "auto") and not (
            self.device.startswith("cuda:") and self.device[5:].isdigit()
        ):
            raise UsageError(
                f"{_F}device must be cpu, cuda, cuda:N or auto, not {self.device!r}",
                field=f"{_F}device",
            )
        kind.check_options(self)  # what the kind cannot honour (a JPEG build on CUDA)
        if self.shard_size is not None and not 1 <= self.shard_size <= 1 << 50:
            raise UsageError(
                f"{_F}shard_size must be 1 byte to 1 PB, not {self.shard_size}",
                field=f"{_F}shard_size",
            )
        if self.engine not in ENGINES:
            raise UsageError(
                f"{_F}engine must be one of {', '.join(ENGINES)}, not {self.engine!r}",
                field=f"{_F}engine",
            )
        if self.ray_address is not None and self.engine != "ray":
            raise UsageError(
                f"{_F}ray_address names the cluster of {_F}engine ray; add {_F}engine ray",
                field=f"{_F}ray_address",
            )
        if self.append and self.overwrite:
            raise UsageError(
                f"{_F}append adds to the set at DST and {_F}overwrite replaces it; give one",
                field=f"{_F}append",
            )
        if self.dense is not None:
            self.dense.validate()
            if self.labels is not None:
                raise UsageError(
                    f"{_F}dense takes its targets from annotations and {_F}labels from a "
                    "table; give one",
                    field=f"{_F}dense",
                )
        if self.allow_new_classes and self.classes is None:
            raise UsageError(
                f"{_F}allow_new_classes extends a fixed class map; give the map with {_F}classes",
                field=f"{_F}allow_new_classes",
            )

    @property
    def spec(self) -> ResizeSpec:
        return ResizeSpec(self.size[0], self.size[1], self.resize, self.max_pixels)

    @property
    def kind(self) -> StorageKind:
        """The storage kind of ``store`` (:mod:`packer.pack.kinds`)."""
        return kind_of(self.store)


def parse_size(text: str) -> tuple[int, int]:
    """``"224"`` -> (224, 224); ``"320x240"`` -> (320, 240) as (width, height).

    Only the syntax is checked here; the range (1 to 8192 a side) is checked once,
    by ``BuildConfig.validate``, for the CLI and library callers alike.
    """
    t = text.strip().lower()
    try:
        if "x" in t:
            w, h = t.split("x", 1)
            size = (int(w), int(h))
        else:
            size = (int(t), int(t))
    except ValueError:
        raise ValueError(
            f"size must be S or WxH in pixels, like 224 or 320x240, not {text!r}"
        ) from None
    return size


STORES = STORAGE_KINDS
ENGINES = ("local", "ray")
# --device cuda vs the CPU path, pixels of the same inputs (tests/test_build_gpu.py, the
# batched code run on the CPU, 500x375 q90 photos-like JPEGs: mean 0.15-1.2, p99 1-12;
# nvjpeg adds its IDCT rounding): the mean absolute difference per pixel value, at most
GPU_TOLERANCE = {"mean_abs": 2.0}


@dataclass
class BuildResult:
    path: Path
    count: int
    skipped: list[dict[str, str]]
    classes: list[str]
    image_shape: list[int]
    seconds: float
    resumed: int = 0  # images taken from an interrupted earlier run
    extra: dict[str, Any] = field(default_factory=dict)
    ignored: int = 0  # images under SRC that the --labels table has no row for
    new_classes: list[str] = field(default_factory=list)  # appended by --allow-new-classes
    targets: list[str] = field(default_factory=list)  # names of the targets columns
    # Where the class -> index map came from: "folders" (inferred from SRC's class
    # folders, sorted), "classes" (the --classes map), "labels" (the --labels table's
    # names), or None (no classes: a flat folder, or integer labels); from a parquet, Arrow
    # or tar source (packer.sources): "dataset" (a ClassLabel's names), "source" (names found).
    classes_from: str | None = None
    storage: str = "raw"  # "jpeg": image_shape is the largest stored image, not every one's
    shards: int = 0  # a pack set: its shards (0: a single pack)
    # a pack set: each shard's name, images, count, skips, status (built, kept, failed),
    # and with --engine ray the node that built it and its seconds
    per_shard: list[dict[str, Any]] = field(default_factory=list)
    # a build with dense targets (packer.builder.dense): format, categories, instances,
    # boxes dropped by the resize, clipped and outside at reading; None without
    dense: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "count": self.count,
            "skipped": self.skipped,
            "classes": self.classes,
            "image_shape": self.image_shape,
            "seconds": round(self.seconds, 3),
            "resumed": self.resumed,
            "ignored": self.ignored,
            "new_classes": self.new_classes,
            # null without targets, as `imgpack info --json` says
            "targets": self.targets or None,
            "classes_from": self.classes_from,
            "storage": self.storage,
            **({"shards": self.shards} if self.shards else {}),
            **({"per_shard": self.per_shard} if self.per_shard else {}),
            **({"dense": self.dense} if self.dense is not None else {}),
        }


@dataclass(frozen=True)
class _Labels:
    """The images to pack and what labels them, fixed before any decoding.

    ``scan.entries``: the images in pack order with their label index into
    ``scan.classes``; ``targets``: float32 [len(entries), K] aligned with them, or None.
    """

    scan: Scan
    targets: np.ndarray | None = None
    target_names: tuple[str, ...] = ()
    new_classes: list[str] = field(default_factory=list)
    ignored: int = 0
    class_map: str | None = None  # absolute path of --classes
    table: str | None = None  # absolute path of --labels
    table_sha256: str | None = None
    missing_rows: int = 0  # table rows naming no image (all, listed or not)
    # a shard of a pack set: no build time in its manifest, so its bytes depend only
    # on its inputs and the options (packer.builder.shards)
    shard: bool = False
    # a dense build's targets by image (packer.builder.dense.DensePlan), or None
    dense: Any = None
