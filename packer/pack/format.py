"""The pack on disk: its layout, manifest schema and format version, in one place.

A pack is a directory::

    PACK/
      meta.json                  tensordict: {"_type": "<class 'packer.pack.ImagePack'>"}
      _tensordict/meta.json      tensordict: shapes and dtypes of the fields
      _tensordict/images.memmap  uint8 [N, 3, H, W], raw C-order bytes
      _tensordict/labels.memmap  int64 [N], raw little-endian bytes
      _tensordict/targets.memmap float32 [N, K], only with ``--targets`` (C-order, little-endian)
      imgpack.json               imgpack's manifest: :class:`Manifest`

A JPEG pack (``storage: "jpeg"``, ``--store jpeg``) holds, instead of ``images.memmap``::

      _tensordict/jpeg.memmap    uint8 [total_bytes]: every image's JPEG file, back to back
      _tensordict/offsets.memmap int64 [N]: where image i's bytes start in jpeg.memmap
      _tensordict/lengths.memmap int64 [N]: how many bytes it has
      _tensordict/sizes.memmap   int64 [N, 2]: its (height, width) in pixels, upright

The two ``meta.json`` files follow tensordict's ``memmap_()`` layout, so
tensordict can read the directory too. imgpack itself never trusts them:
``packer.pack.reader.open_pack`` reads only the manifest (plain JSON, every field
type-checked by :meth:`Manifest.from_json`), and maps the data files at fixed
names with shapes from the manifest. Nothing is unpickled and nothing named in
the pack's files is imported. ``ImagePack.load_memmap``/``load`` are routed to
the same safe path. This module needs no torch, so build workers stay light.

The manifest is read only through :meth:`Manifest.from_json` and written only
through :meth:`Manifest.to_json` (by :func:`write_pack_metadata`); a new field
is added there, with its default, and nowhere else.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import InputError, PackerError, PackFormatError
from ..imaging.decode import DEFAULT_MAX_PIXELS, RESIZE_MODES
from ..sources.scan import NotRegularFile, file_kind, open_fd_if_regular

FORMAT_NAME = "imgpack"
FORMAT_VERSION = 1
MANIFEST = "imgpack.json"
DATA_DIR = "_tensordict"
IMAGES_FILE = "images.memmap"
LABELS_FILE = "labels.memmap"
TARGETS_FILE = "targets.memmap"
TD_TYPE = "<class 'packer.pack.ImagePack'>"
CHECKSUM = "sha256"
# A manifest holds about 100 bytes per image (its source path and size, a share of the
# block checksums) besides what every pack has and what was skipped: the cap is a base
# plus MANIFEST_BYTES_PER_IMAGE for each image the labels file holds (a count read
# before the manifest), never above MAX_MANIFEST_BYTES. Checked on the opened file
# before a byte is read, so a huge (or sparse) file costs nothing.
MAX_MANIFEST_BYTES = 2 << 30
MANIFEST_BASE_BYTES = 64 << 20
MANIFEST_BYTES_PER_IMAGE = 512
MAX_META_BYTES = 64 << 10  # tensordict's meta.json files: tens of bytes in a pack
MAX_COUNT = 1 << 40
STORAGE_KINDS = ("raw", "jpeg")  # jpeg: variable-size JPEG files with an offset table
JPEG_STORAGE_VERSION = 1  # the layout of a "jpeg" pack's four files, recorded in the manifest
JPEG_FILE = "jpeg.memmap"
OFFSETS_FILE = "offsets.memmap"
LENGTHS_FILE = "lengths.memmap"
SIZES_FILE = "sizes.memmap"
DTYPE_BYTES = {"uint8": 1, "int64": 8, "float32": 4}
LABEL_DTYPE = "int64"  # labels: int64 [N]; anything else is refused on load, never cast
TARGET_DTYPE = "float32"  # targets: float32 [N, K]; likewise
_FORBIDDEN_SUFFIXES = (".pickle", ".pkl", ".pt", ".pth", ".npy", ".py", ".so")


@dataclass(frozen=True)
class Layout:
    """File paths of a pack directory."""

    root: Path

    @property
    def manifest(self) -> Path:
        return self.root / MANIFEST

    @property
    def images(self) -> Path:
        return self.root / DATA_DIR / IMAGES_FILE

    @property
    def labels(self) -> Path:
        return self.root / DATA_DIR / LABELS_FILE

    @property
    def targets(self) -> Path:
        return self.root / DATA_DIR / TARGETS_FILE

    def data(self, name: str) -> Path:
        return self.root / DATA_DIR / name


# ---------------------------------------------------------------- the manifest


@dataclass(frozen=True)
class Skip:
    """An input the build could not use: its relative path and why."""

    path: str
    reason: str


@dataclass(frozen=True)
class BuildInfo:
    """How the pack was made. ``extra`` keeps other build keys as written."""

    max_pixels: int = DEFAULT_MAX_PIXELS
    source_root: str | None = None  # absolute path of the source folder at build time
    imgpack_version: str | None = None
    created: str | None = None  # ISO 8601 local time
    labels_table: str | None = None  # absolute path of the ``--labels`` table
    labels_sha256: str | None = None  # SHA-256 of the table's bytes at build time
    unlisted: int | None = None  # images under SRC the table has no row for (ignored)
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Checksums:
    """SHA-256 of the image data per block of ``block_rows`` rows, of the labels, and
    of the targets (``""`` for a pack without them)."""

    block_rows: int
    images: tuple[str, ...] = ()
    labels: str = ""
    algorithm: str = CHECKSUM
    targets: str = ""
    index: str = ""  # jpeg packs: SHA-256 of offsets, lengths and sizes files, concatenated


@dataclass(frozen=True)
class FieldSpec:
    """One memory-mapped field: file under ``_tensordict/``, dtype, and per-row shape."""

    name: str
    file: str
    dtype: str  # a key of DTYPE_BYTES
    row_shape: tuple[int, ...]
    rows: int | None = None  # rows in the file; None: one per image (the pack's count)

    @property
    def row_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype] * math.prod(self.row_shape)


@dataclass(frozen=True)
class Manifest:
    """imgpack's manifest (``imgpack.json``), typed. On disk its JSON keys are those of
    format 1: ``image_shape`` and ``resize`` at the top, repeated as ``build.size``
    ([W, H]) and ``build.resize`` for older readers; this class holds each once.

    Optional fields (defaults = today's packs) are what later formats add: write them
    in :meth:`to_json` only when set, so packs without them stay byte-identical.

    Labels and targets (issue 15) are recorded with their dtype and shape and checked
    on load; a pack whose record says anything but int64 ``[count]`` labels and float32
    ``[count, K]`` targets is refused, never cast. On disk::

        "label_dtype": "int64", "label_shape": [N],
        "targets": {"names": ["col", ...], "dtype": "float32", "shape": [N, K]}   # if any
        "class_map": "/abs/path/of/--classes"                                     # if given

    ``label_dtype``/``label_shape`` are written for every pack (older packs without
    them read as int64 ``[count]``); ``targets`` only for a pack that has them.
    """

    count: int
    image_shape: tuple[int, int, int]  # (3, H, W)
    resize: str  # one of RESIZE_MODES
    classes: tuple[str, ...]
    sources: tuple[str, ...]  # relative POSIX path of each image's source
    source_sizes: tuple[tuple[int, int], ...]  # (W, H) of each source before resizing
    checksums: Checksums
    class_counts: tuple[int, ...] = ()  # images per class; () when not recorded
    skipped: tuple[Skip, ...] = ()
    build: BuildInfo = BuildInfo()
    version: int = FORMAT_VERSION
    storage: str = "raw"  # how images are stored: one uint8 [3, H, W] row each
    label_dtype: str = LABEL_DTYPE
    targets: tuple[str, ...] = ()  # column names of a float32 ``targets`` [N, K] field
    class_map: str | None = None  # where a fixed class list came from (``--classes``)
    # storage "jpeg": bytes of jpeg.memmap, the layout version, and the build options
    # that shaped the stored files (``--max-side``; ``--quality`` of re-encoded inputs)
    jpeg_bytes: int = 0
    storage_version: int = 0
    max_side: int | None = None
    quality: int | None = None

    @property
    def class_to_idx(self) -> dict[str, int]:
        """Class name -> label index (the order of ``classes``)."""
        return {c: i for i, c in enumerate(self.classes)}

    @property
    def height(self) -> int:
        return self.image_shape[1]

    @property
    def width(self) -> int:
        return self.image_shape[2]

    @property
    def image_bytes(self) -> int:
        return math.prod(self.image_shape)

    @property
    def fields(self) -> tuple[FieldSpec, ...]:
        """The memory-mapped fields of the pack, in the order tensordict writes them."""
        if self.storage == "jpeg":
            out = [
                FieldSpec("jpeg", JPEG_FILE, "uint8", (), rows=self.jpeg_bytes),
                FieldSpec("offsets", OFFSETS_FILE, "int64", ()),
                FieldSpec("lengths", LENGTHS_FILE, "int64", ()),
                FieldSpec("sizes", SIZES_FILE, "int64", (2,)),
                FieldSpec("labels", LABELS_FILE, self.label_dtype, ()),
            ]
        else:
            out = [
                FieldSpec("images", IMAGES_FILE, "uint8", self.image_shape),
                FieldSpec("labels", LABELS_FILE, self.label_dtype, ()),
            ]
        if self.targets:
            out.append(FieldSpec("targets", TARGETS_FILE, TARGET_DTYPE, (len(self.targets),)))
        return tuple(out)

    # ---------------------------------------------------------------- JSON

    def to_json(self) -> dict[str, Any]:
        """The manifest as JSON-ready dicts and lists, in the key order of format 1."""
        c, h, w = self.image_shape
        build: dict[str, Any] = {
            "size": [w, h],
            "resize": self.resize,
            "max_pixels": self.build.max_pixels,
        }
        for key in _BUILD_KEYS:
            value = getattr(self.build, key)
            if value is not None:
                build[key] = value
        build.update(self.build.extra)
        out: dict[str, Any] = {
            "format": FORMAT_NAME,
            "version": self.version,
            "count": self.count,
            "image_shape": [c, h, w],
            "dtype": "uint8",
            "resize": self.resize,
            "classes": list(self.classes),
            "class_counts": list(self.class_counts),
            "sources": list(self.sources),
            "source_sizes": [list(s) for s in self.source_sizes],
            "skipped": [{"path": s.path, "reason": s.reason} for s in self.skipped],
            "build": build,
            "checksums": {
                "algorithm": self.checksums.algorithm,
                "block_rows": self.checksums.block_rows,
                "images": list(self.checksums.images),
                "labels": self.checksums.labels,
            },
            **label_fields_json(self.count, self.targets, self.label_dtype),
        }
        if self.checksums.targets:
            out["checksums"]["targets"] = self.checksums.targets
        if self.storage != "raw":
            out["storage"] = self.storage
            out["storage_version"] = self.storage_version
            out["jpeg_bytes"] = self.jpeg_bytes
            out["max_side"] = self.max_side
            out["quality"] = self.quality
            out["checksums"]["index"] = self.checksums.index
        if self.class_map is not None:
            out["class_map"] = self.class_map
        return out

    @classmethod
    def from_json(cls, obj: Any, where: str = MANIFEST) -> Manifest:
        """Validate a parsed manifest and return it typed; the only reader of raw manifests.

        Every field's type and range is checked here once, so no reader meets a
        wrong type later. Raises PackFormatError naming ``where`` and the field.
        """
        try:
            return _parse(obj)
        except _Bad as e:
            raise PackFormatError(f"{where}: {e}") from None


class _Bad(Exception):
    pass


_BUILD_KEYS = (
    "source_root",
    "imgpack_version",
    "created",
    "labels_table",
    "labels_sha256",
    "unlisted",
)


def label_fields_json(
    count: int, target_names: Iterable[str] = (), label_dtype: str = LABEL_DTYPE
) -> dict[str, Any]:
    """The manifest keys recording the labels' and targets' dtype and shape."""
    out: dict[str, Any] = {"label_dtype": label_dtype, "label_shape": [count]}
    names = list(target_names)
    if names:
        out["targets"] = {"names": names, "dtype": TARGET_DTYPE, "shape": [count, len(names)]}
    return out


def _label_fields(m: Mapping[str, Any], n: int) -> tuple[str, tuple[str, ...]]:
    """``(label_dtype, target names)`` of a manifest's label keys, checked against ``n``
    images. Absent keys (packs made before they existed) mean int64 ``[n]``, no targets."""
    label_dtype = m.get("label_dtype", LABEL_DTYPE)
    _want(
        label_dtype == LABEL_DTYPE,
        f"labels recorded as {label_dtype!r}, expected {LABEL_DTYPE!r} (field 'label_dtype'); "
        "imgpack never casts labels, rebuild the pack",
    )
    shape = m.get("label_shape", [n])
    _want(
        isinstance(shape, list) and len(shape) == 1 and _is_int(shape[0]) and shape[0] == n,
        f"label_shape {shape!r} does not match {n} images (field 'label_shape'); rebuild the pack",
    )
    t = m.get("targets")
    if t is None:
        return label_dtype, ()
    names = t.get("names") if isinstance(t, dict) else None
    ok = (
        isinstance(t, dict)
        and set(t) == {"names", "dtype", "shape"}
        and isinstance(names, list)
        and len(names) > 0
        and all(isinstance(c, str) and c for c in names)
        and len(set(names)) == len(names)
        and t.get("dtype") == TARGET_DTYPE
        and isinstance(t.get("shape"), list)
        and len(t["shape"]) == 2
        and all(_is_int(v) for v in t["shape"])
        and t["shape"] == [n, len(names)]
    )
    _want(
        ok,
        f"targets recorded as {_short(t)}; expected {{'names': [K distinct names], "
        f"'dtype': {TARGET_DTYPE!r}, 'shape': [{n}, K]}} (field 'targets'); imgpack never "
        "casts targets, rebuild the pack",
    )
    return label_dtype, tuple(names)


def _short(v: Any, limit: int = 200) -> str:
    text = repr(v)
    return text if len(text) <= limit else text[:limit] + "..."


def check_label_fields_json(obj: Mapping[str, Any], count: int, where: str) -> tuple[str, ...]:
    """Check the label keys of a manifest (dict) for ``count`` images; return the target
    names (``()`` without targets). Raises PackFormatError naming ``where``."""
    try:
        return _label_fields(obj, count)[1]
    except _Bad as e:
        raise PackFormatError(f"{where}: {e}") from None


def _want(ok: bool, what: str) -> None:
    if not ok:
        raise _Bad(what)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int(d: Mapping[str, Any], key: str, where: str, lo: int = 0, hi: int | None = None) -> int:
    v = d.get(key)
    _want(
        _is_int(v) and v >= lo and (hi is None or v <= hi),
        f"field {where + key!r} is missing or not an integer"
        + (f" in [{lo}, {hi}]" if hi is not None else f" >= {lo}")
        + "; rebuild the pack",
    )
    return v


def _list(d: Mapping[str, Any], key: str, where: str = "") -> list[Any]:
    v = d.get(key)
    _want(isinstance(v, list), f"field {where + key!r} is missing or not a list; rebuild the pack")
    return v


def _dict(d: Mapping[str, Any], key: str) -> dict[str, Any]:
    v = d.get(key)
    _want(isinstance(v, dict), f"field {key!r} is missing or not an object; rebuild the pack")
    return v


def _str(d: Mapping[str, Any], key: str, where: str = "", optional: bool = False) -> Any:
    v = d.get(key)
    _want(
        isinstance(v, str) or (optional and v is None),
        f"field {where + key!r} is {'not' if optional else 'missing or not'} a string; "
        "rebuild the pack",
    )
    return v


def _strs(items: list[Any], what: str) -> tuple[str, ...]:
    _want(all(isinstance(s, str) for s in items), f"{what} must be strings; rebuild the pack")
    return tuple(items)


def _source_ok(s: Any) -> bool:
    # A relative POSIX path with no ".." part, so joining it to the source root stays
    # under that root. A backslash is an ordinary character in a POSIX name (scan
    # packs such files), so it is accepted here: refusing it made packs that the
    # build wrote unreadable. Cheap on a million paths: no PurePath objects.
    return (
        isinstance(s, str)
        and bool(s)
        and not s.startswith("/")
        and "\x00" not in s
        and ".." not in s.split("/")
    )


def _parse(m: Any) -> Manifest:
    _want(isinstance(m, dict) and m.get("format") == FORMAT_NAME, "not an imgpack manifest")
    version = _int(m, "version", "", lo=1, hi=1 << 31)
    if version > FORMAT_VERSION:
        raise _Bad(
            f"made by a newer imgpack (format version {version}, this one reads "
            f"up to {FORMAT_VERSION}); upgrade imgpack"
        )
    n = _int(m, "count", "", hi=MAX_COUNT)
    shape = _list(m, "image_shape")
    _want(
        len(shape) == 3 and shape[0] == 3 and all(_is_int(v) and 0 < v <= 65536 for v in shape),
        f"bad count {n} or image_shape {shape}",
    )
    _want(m.get("dtype", "uint8") == "uint8", "field 'dtype' must be 'uint8'; rebuild the pack")
    resize = _str(m, "resize")
    _want(resize in RESIZE_MODES, f"field 'resize' must be one of {', '.join(RESIZE_MODES)}")
    storage = m.get("storage", "raw")
    _want(
        storage in STORAGE_KINDS,
        f"storage {storage!r} is not one this imgpack reads ({', '.join(STORAGE_KINDS)}); "
        "upgrade imgpack",
    )
    label_dtype, targets = _label_fields(m, n)
    class_map = _str(m, "class_map", optional=True)
    jpeg_bytes, storage_version, max_side, quality = 0, 0, None, None
    if storage == "jpeg":
        storage_version = _int(m, "storage_version", "", lo=1, hi=1 << 31)
        _want(
            storage_version <= JPEG_STORAGE_VERSION,
            f"jpeg storage version {storage_version} is newer than this imgpack reads "
            f"({JPEG_STORAGE_VERSION}); upgrade imgpack",
        )
        jpeg_bytes = _int(m, "jpeg_bytes", "", hi=1 << 50)
        max_side = _int(m, "max_side", "", lo=1) if m.get("max_side") is not None else None
        quality = _int(m, "quality", "", lo=1, hi=100) if m.get("quality") is not None else None

    classes = _strs(_list(m, "classes"), "class names")
    _want(len(set(classes)) == len(classes), "class names must be distinct; rebuild the pack")
    counts = m.get("class_counts") or []
    _want(
        isinstance(counts, list)
        and all(_is_int(v) and v >= 0 for v in counts)
        and (not counts or len(counts) == len(classes)),
        f"field 'class_counts' must be a list of {len(classes)} counts; rebuild the pack",
    )
    sources = _list(m, "sources")
    sizes = _list(m, "source_sizes")
    _want(
        len(sources) == n and len(sizes) == n,
        f"{len(sources)} sources and {len(sizes)} source sizes for {n} images",
    )
    bad = next((s for s in sources if not _source_ok(s)), None)
    _want(
        bad is None,
        f"source path {bad!r} leaves the source folder or is not a path; refusing the pack",
    )
    _want(
        all(isinstance(s, list) and len(s) == 2 and _is_int(s[0]) and _is_int(s[1]) for s in sizes),
        "field 'source_sizes' must hold [width, height] pairs of integers; rebuild the pack",
    )
    skipped = _list(m, "skipped")
    _want(
        all(
            isinstance(s, dict)
            and isinstance(s.get("path"), str)
            and isinstance(s.get("reason"), str)
            for s in skipped
        ),
        "field 'skipped' must hold {path, reason} objects of strings; rebuild the pack",
    )
    b = _dict(m, "build")
    build = BuildInfo(
        max_pixels=_int(b, "max_pixels", "build.", lo=1)
        if "max_pixels" in b
        else DEFAULT_MAX_PIXELS,
        source_root=_str(b, "source_root", "build.", optional=True),
        imgpack_version=_str(b, "imgpack_version", "build.", optional=True),
        created=_str(b, "created", "build.", optional=True),
        labels_table=_str(b, "labels_table", "build.", optional=True),
        labels_sha256=_str(b, "labels_sha256", "build.", optional=True),
        unlisted=_int(b, "unlisted", "build.", hi=MAX_COUNT) if "unlisted" in b else None,
        extra={
            k: v for k, v in b.items() if k not in ("size", "resize", "max_pixels", *_BUILD_KEYS)
        },
    )
    ck = _dict(m, "checksums")
    images = _list(ck, "images", "checksums.")
    checksums = Checksums(
        block_rows=_int(ck, "block_rows", "checksums.", lo=0),
        images=_strs(images, "checksums.images"),
        labels=_str(ck, "labels", "checksums."),
        algorithm=_str(ck, "algorithm", "checksums.") if "algorithm" in ck else CHECKSUM,
        targets=_str(ck, "targets", "checksums.") if targets or "targets" in ck else "",
        index=_str(ck, "index", "checksums.") if storage == "jpeg" else "",
    )
    _want(checksums.algorithm == CHECKSUM, f"checksum algorithm {checksums.algorithm!r} unknown")
    _want(
        bool(checksums.targets) == bool(targets),
        "field 'checksums.targets' must be given exactly when the pack has targets; "
        "rebuild the pack",
    )
    return Manifest(
        count=n,
        image_shape=(shape[0], shape[1], shape[2]),
        resize=resize,
        classes=classes,
        sources=tuple(sources),
        source_sizes=tuple((s[0], s[1]) for s in sizes),
        checksums=checksums,
        class_counts=tuple(counts),
        skipped=tuple(Skip(s["path"], s["reason"]) for s in skipped),
        build=build,
        version=version,
        storage=storage,
        label_dtype=label_dtype,
        targets=targets,
        class_map=class_map,
        jpeg_bytes=jpeg_bytes,
        storage_version=storage_version,
        max_side=max_side,
        quality=quality,
    )


# ---------------------------------------------------------------- helpers


def block_rows_for(count: int) -> int:
    """Rows per checksum block (also the build's unit of work): at most 64, about
    256 blocks for small packs, so every worker gets many small tasks."""
    return max(1, min(64, math.ceil(count / 256)))


def digest(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def image_bytes(shape: Iterable[int]) -> int:
    return int(math.prod(shape))


def pack_bytes(root: Path) -> int:
    """Bytes a pack directory's files take on disk (allocated blocks, not their apparent
    sizes: a sparse file is counted for what it holds). Links are not followed."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            try:
                st = os.lstat(os.path.join(dirpath, f))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_blocks * 512
    return total


def is_pack(path: Path) -> bool:
    return (path / MANIFEST).is_file()


def hash_blocks(
    path: Path,
    block_bytes: int,
    blocks: int,
    progress: Callable[[int], None] | None = None,
    workers: int | None = None,
) -> list[str]:
    """SHA-256 of each of ``blocks`` consecutive ``block_bytes`` slices of ``path``
    (the last may be short), on a thread pool: hashlib and pread release the GIL.
    ``progress(k)`` is called with the index of each finished block, in order."""
    if blocks == 0:
        return []
    fd = os.open(path, os.O_RDONLY)
    try:

        def one(k: int) -> str:
            # in pieces: a block of 64 large images can be hundreds of MB
            h, pos, end = hashlib.sha256(), k * block_bytes, (k + 1) * block_bytes
            while pos < end and (piece := os.pread(fd, min(8 << 20, end - pos), pos)):
                h.update(piece)
                pos += len(piece)
            return h.hexdigest()

        with ThreadPoolExecutor(workers or min(32, os.cpu_count() or 1)) as pool:
            out = []
            for k, sha in enumerate(pool.map(one, range(blocks))):
                out.append(sha)
                if progress:
                    progress(k)
            return out
    finally:
        os.close(fd)


# ---------------------------------------------------------------- writing


class JSONNestingError(ValueError):
    """JSON nested deeper than Python's parser can follow (a hostile or garbage file)."""


def loads_json(data: bytes | str) -> Any:
    """``json.loads`` for files imgpack reads back (manifests, plans, journals, records).

    Nesting too deep for the parser's recursion raises :class:`JSONNestingError`, a
    ``ValueError``, like any other invalid JSON, so every caller that already treats
    ``ValueError`` as "not valid" is safe from ``RecursionError`` too.
    """
    try:
        return json.loads(data)
    except RecursionError:
        raise JSONNestingError("JSON nested too deeply") from None


def write_json_atomic(path: Path, obj: Any, indent: int | None = None) -> None:
    """Write JSON to ``path`` via a temporary file, fsync, rename: ``path`` is always whole."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        if indent is None:
            json.dump(obj, f, ensure_ascii=False, separators=(",", ":"))
        else:
            json.dump(obj, f, ensure_ascii=False, indent=indent)
            f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _tensordict_meta(count: int, fields: Iterable[FieldSpec]) -> dict[str, Any]:
    meta: dict[str, Any] = {
        f.name: {
            "device": "cpu",
            "shape": [count, *f.row_shape],
            "dtype": f"torch.{f.dtype}",
            "is_nested": False,
        }
        for f in fields
    }
    meta.update(
        {
            "shape": [count],
            "device": "cpu",
            "_type": "<class 'tensordict._td.TensorDict'>",
            "_format_version": 1,
            "_class": "tensordict:TensorDict",
        }
    )
    return meta


def write_tensordict_meta(root: Path, count: int, image_shape: Iterable[int]) -> None:
    """The two meta.json files that let tensordict's own loader open an images+labels pack."""
    shape = tuple(image_shape)
    fields = (
        FieldSpec("images", IMAGES_FILE, "uint8", shape),
        FieldSpec("labels", LABELS_FILE, "int64", ()),
    )
    write_json_atomic(root / DATA_DIR / "meta.json", _tensordict_meta(count, fields))
    write_json_atomic(root / "meta.json", {"_type": TD_TYPE})


def write_pack_metadata(root: Path, manifest: Manifest) -> None:
    """Write tensordict's two meta.json files and the manifest (last) into ``root``,
    whose data files are complete. Every way of making a pack ends here."""
    root = Path(root)
    write_json_atomic(
        root / DATA_DIR / "meta.json", _tensordict_meta(manifest.count, manifest.fields)
    )
    write_json_atomic(root / "meta.json", {"_type": TD_TYPE})
    write_json_atomic(root / MANIFEST, manifest.to_json())


def checksums_of(root: Path, count: int, image_shape: Iterable[int]) -> Checksums:
    """Hash a pack's data files as a build records them (the targets when present)."""
    lay = Layout(Path(root))
    block = block_rows_for(count)
    row = image_bytes(image_shape)
    shas = hash_blocks(lay.images, row * block, -(-count // block))
    targets = digest(lay.targets.read_bytes()) if lay.targets.is_file() else ""
    return Checksums(
        block_rows=block,
        images=tuple(shas),
        labels=digest(lay.labels.read_bytes()),
        targets=targets,
    )


def write_pack(
    root: Path,
    images: Iterable[bytes | memoryview],
    labels: Iterable[int],
    manifest: Manifest,
    targets: Iterable[Iterable[float]] | None = None,
) -> Path:
    """Write a whole pack at ``root`` from image bytes and labels, for synthetic packs
    and tests; the build writes its data its own way and ends in :func:`write_pack_metadata`.

    ``images``: chunks of raw uint8 rows, C-order [*, 3, H, W], ``manifest.count``
    rows in all. ``labels``: ``manifest.count`` ints. ``targets``: with
    ``manifest.targets`` (K names), ``manifest.count`` rows of K floats, stored as
    float32 [N, K]. The checksums of
    ``manifest`` are replaced by those of the data written. The pack is written
    under a temporary name and renamed into place, so ``root`` is whole or absent.
    """
    import shutil
    import struct

    root = Path(root)
    if root.exists():
        raise PackFormatError(f"{root}: already exists; remove it first")
    work = root.with_name(f".{root.name}.imgpack-writing")
    shutil.rmtree(work, ignore_errors=True)
    (work / DATA_DIR).mkdir(parents=True)
    lay = Layout(work)
    with open(lay.images, "wb") as f:
        for chunk in images:
            f.write(chunk)
        written = f.tell()
        f.flush()
        os.fsync(f.fileno())
    want = manifest.count * manifest.image_bytes
    if written != want:
        shutil.rmtree(work)
        raise ValueError(f"write_pack: {written} image bytes for {manifest.count} images ({want})")
    lab = list(labels)
    if len(lab) != manifest.count:
        shutil.rmtree(work)
        raise ValueError(f"write_pack: {len(lab)} labels for {manifest.count} images")
    with open(lay.labels, "wb") as f:
        f.write(struct.pack(f"<{len(lab)}q", *lab))
        f.flush()
        os.fsync(f.fileno())
    rows = [list(r) for r in targets] if targets is not None else []
    k = len(manifest.targets)
    if (targets is not None) != bool(k) or len(rows) != (manifest.count if k else 0):
        shutil.rmtree(work)
        raise ValueError(f"write_pack: {len(rows)} target rows for {manifest.count} images")
    if k:
        if any(len(r) != k for r in rows):
            shutil.rmtree(work)
            raise ValueError(f"write_pack: target rows must hold {k} values each")
        with open(lay.targets, "wb") as f:
            f.write(struct.pack(f"<{len(rows) * k}f", *(v for r in rows for v in r)))
            f.flush()
            os.fsync(f.fileno())
    manifest = replace(manifest, checksums=checksums_of(work, manifest.count, manifest.image_shape))
    write_pack_metadata(work, manifest)
    os.replace(work, root)
    return root


# ---------------------------------------------------------------- reading


def _fail(root: Path, what: str) -> PackFormatError:
    return PackFormatError(f"{root}: {what}")


def read_bounded(root: Path, path: Path, limit: int) -> bytes:
    """The bytes of ``path`` (a file of the pack at ``root``), if it is a regular file
    (symlinks followed) of at most ``limit`` bytes: checked on the opened descriptor
    before anything is read (opening never blocks, so a FIFO is refused, not waited on).
    Raises FileNotFoundError when there is none, PackFormatError for anything else."""
    name = os.path.relpath(path, root)
    try:
        fd, st = open_fd_if_regular(path)
    except NotRegularFile as e:
        raise _fail(
            root, f"{name} is not a regular file ({file_kind(e.mode)}); refusing the pack"
        ) from None
    except FileNotFoundError:
        raise
    except OSError as e:
        raise _fail(root, f"{name} cannot be read ({e.strerror})") from None
    try:
        if st.st_size > limit:
            raise _fail(
                root,
                f"{name} is {st.st_size:,} bytes, more than this pack's can be "
                f"({limit:,}); the pack is damaged or not from imgpack, refusing it",
            )
        os.set_blocking(fd, True)
        parts, got = [], 0
        while got <= limit:  # a file growing meanwhile is read no further than the cap
            part = os.read(fd, min(8 << 20, limit + 1 - got))
            if not part:
                break
            parts.append(part)
            got += len(part)
        if got > limit:
            raise _fail(root, f"{name} grew past {limit:,} bytes while read; refusing it")
        return b"".join(parts)
    except OSError as e:
        raise _fail(root, f"{name} cannot be read ({e.strerror})") from None
    finally:
        os.close(fd)


def manifest_limit(root: Path) -> int:
    """The most bytes the manifest of the pack at ``root`` may have: a base plus an
    allowance per image of its labels file (int64 [N]), at most MAX_MANIFEST_BYTES."""
    try:
        st = os.stat(Layout(root).labels)
        n = st.st_size // 8 if stat.S_ISREG(st.st_mode) else 0
    except OSError:
        n = 0
    return min(MAX_MANIFEST_BYTES, MANIFEST_BASE_BYTES + MANIFEST_BYTES_PER_IMAGE * n)


def read_manifest(root: Path) -> Manifest:
    """Read and validate a pack's manifest. Raises PackFormatError naming the problem."""
    root = Path(root)
    if not root.exists():
        raise _fail(root, "no such pack; check the path or build one with `imgpack build`")
    if not root.is_dir():
        raise _fail(root, "is a file, not a pack directory")
    lay = Layout(root)
    try:
        data = read_bounded(root, lay.manifest, manifest_limit(root))
    except FileNotFoundError:
        raise _fail(
            root, f"not an imgpack pack ({MANIFEST} is missing); build it with `imgpack build`"
        ) from None
    try:
        raw = loads_json(data)
    except JSONNestingError:
        raise _fail(
            root, f"{MANIFEST} is nested too deeply to be a manifest; refusing the pack"
        ) from None
    except (ValueError, UnicodeDecodeError) as e:
        raise _fail(
            root, f"{MANIFEST} is not valid JSON ({e}); the pack is damaged, rebuild it"
        ) from None
    del data
    return Manifest.from_json(raw, where=f"{root}: {MANIFEST}")


def check_tensordict_meta(root: Path) -> None:
    """Refuse a pack whose ``meta.json`` files are not what imgpack writes: tensordict's
    loaders read them first, and the top-level one picks the class whose loader runs
    (another class's, such as ``NonTensorData``'s, unpickles ``other.pickle``). Each
    must be a small regular file, the top-level one exactly ``{"_type": TD_TYPE}``.
    Read with a size cap and a non-blocking open: a FIFO or a link to ``/dev/zero``
    named ``meta.json`` is refused, never read. None at all is fine (imgpack reads
    neither)."""
    root = Path(root)
    for meta in (root / "meta.json", root / DATA_DIR / "meta.json"):
        try:
            data = read_bounded(root, meta, MAX_META_BYTES)
        except FileNotFoundError:
            if os.path.lexists(meta):  # a link to nothing
                raise _fail(
                    root, f"{os.path.relpath(meta, root)} is a broken link; refusing the pack"
                ) from None
            continue
        if meta.parent != root:
            continue  # imgpack never reads it; tensordict reads it only through the top one
        try:
            obj = loads_json(data)
        except (ValueError, UnicodeDecodeError):
            obj = None
        if obj != {"_type": TD_TYPE}:
            t = obj.get("_class", obj.get("_type")) if isinstance(obj, dict) else None
            what = f"names type {t!r}" if t != TD_TYPE else f"holds keys {sorted(obj)}"
            raise _fail(
                root,
                f"meta.json {what}, where imgpack writes only {{'_type': {TD_TYPE!r}}}; "
                "refusing the pack (nothing was imported)",
            )


_OPTIONAL_META = ("device", "_format_version", "_class")  # older tensordicts wrote none


def check_data_meta(root: Path, m: Manifest) -> None:
    """Refuse ``_tensordict/meta.json`` of a checked pack unless it is as imgpack writes
    it: TensorDict's type (whose loader unpickles nothing that :func:`check_files` lets
    through) and exactly the manifest's fields, shapes and dtypes, so tensordict loading
    the data folder alone maps exactly the files checked against the manifest."""
    meta_path = root / DATA_DIR / "meta.json"
    try:
        data = read_bounded(root, meta_path, MAX_META_BYTES)
    except FileNotFoundError:
        raise _fail(root, f"{DATA_DIR}/meta.json is missing; the pack is incomplete") from None
    try:
        meta = loads_json(data)
    except (ValueError, UnicodeDecodeError):
        meta = None
    want = _tensordict_meta(m.count, m.fields)
    ok = isinstance(meta, dict) and not set(meta) - set(want)
    ok = ok and all(
        meta.get(k) == v if k in meta or k not in _OPTIONAL_META else True for k, v in want.items()
    )
    if not ok:
        raise _fail(
            root,
            f"{DATA_DIR}/meta.json does not describe the manifest's fields as imgpack writes "
            "them; refusing the pack (nothing was imported)",
        )


def check_files(root: Path, m: Manifest) -> None:
    """Refuse code-carrying files and data files whose size disagrees with the manifest."""
    root = Path(root)
    real_root = root.resolve()
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            if f.lower().endswith(_FORBIDDEN_SUFFIXES):
                rel = os.path.relpath(os.path.join(dirpath, f), root)
                raise _fail(
                    root,
                    f"holds {rel}, a file type imgpack never writes (it could carry "
                    "code); refusing the pack. Remove the file if you trust its source",
                )
    data_dir = root / DATA_DIR
    if not data_dir.is_dir():
        raise _fail(root, f"{DATA_DIR}/ is missing; the pack is incomplete, rebuild it")
    allowed = {f.file for f in m.fields} | {"meta.json"}
    for f in os.listdir(data_dir):
        if f not in allowed:
            raise _fail(root, f"unexpected file {DATA_DIR}/{f}; refusing the pack")
    check_tensordict_meta(root)
    n = m.count
    for spec in m.fields:
        path = data_dir / spec.file
        rel = f"{DATA_DIR}/{spec.file}"
        if path.is_symlink() or not path.is_file():
            raise _fail(root, f"{rel} is missing or not a regular file")
        if not path.resolve().is_relative_to(real_root):
            raise _fail(root, f"{rel} points outside the pack; refusing it")
        size = path.stat().st_size
        want = (n if spec.rows is None else spec.rows) * spec.row_bytes
        if size != want:
            shape = list(m.image_shape) if spec.name == "images" else list(spec.row_shape)
            raise _fail(
                root,
                f"{rel} is {size:,} bytes, the manifest says "
                f"{want:,} ({n} {spec.name} of {shape}); the pack is damaged or truncated",
            )


def describe(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What ``imgpack info --json`` prints: count, shape, classes and their counts,
    the class -> index map, the targets (names, dtype, shape; None without), bytes on
    disk, build options, skipped inputs, format version."""
    root = Path(path)
    m = read_manifest(root)
    classes = list(m.classes)
    counts = list(m.class_counts) or [0] * len(classes)
    j = m.to_json()
    return {
        "path": str(path),
        "count": m.count,
        "image_shape": list(m.image_shape),
        "classes": classes,
        "class_counts": dict(zip(classes, counts)),
        "class_to_idx": m.class_to_idx,
        "targets": j.get("targets"),
        "bytes": pack_bytes(root),
        "build": j["build"],
        "skipped": j["skipped"],
        "format_version": m.version,
        # only for other storage than raw, so raw packs' info stays as it was
        **({"storage": m.storage, "jpeg_bytes": m.jpeg_bytes} if m.storage != "raw" else {}),
    }


# ---------------------------------------------------------------- label dtypes (never cast)


def _dtype_name(a: Any) -> str:
    # numpy dtypes print "int64", torch ones "torch.int64"; compare without the prefix
    # so this module never imports torch.
    return str(getattr(a, "dtype", type(a).__name__)).removeprefix("torch.")


def check_label_arrays(
    labels: Any,
    targets: Any | None,
    *,
    error: type[PackerError] = PackFormatError,
    where: str = "labels",
) -> tuple[int, int | None]:
    """Check ``labels`` is int64 ``[N]`` and ``targets`` float32 ``[N, K]`` (or None).

    Works on numpy arrays and torch tensors alike. Returns ``(N, K)`` (K None without
    targets). Raises ``error`` naming what is wrong; never casts.
    """
    if _dtype_name(labels) != LABEL_DTYPE:
        raise error(
            f"{where}: labels are {_dtype_name(labels)}, expected {LABEL_DTYPE}; "
            "imgpack does not cast labels (float labels belong in --targets)"
        )
    shape = tuple(getattr(labels, "shape", ()))
    if len(shape) != 1:
        raise error(f"{where}: labels have shape {list(shape)}, expected [N]")
    n = shape[0]
    if targets is None:
        return n, None
    if _dtype_name(targets) != TARGET_DTYPE:
        raise error(
            f"{where}: targets are {_dtype_name(targets)}, expected {TARGET_DTYPE}; "
            "imgpack does not cast targets"
        )
    tshape = tuple(getattr(targets, "shape", ()))
    if len(tshape) != 2 or tshape[0] != n:
        raise error(f"{where}: targets have shape {list(tshape)}, expected [{n}, K]")
    return n, tshape[1]


def label_fields(labels: Any, targets: Any | None, target_names: Sequence[str]) -> dict[str, Any]:
    """The manifest fields describing ``labels`` (int64 [N]) and ``targets`` (float32
    [N, K] or None), after checking them with :func:`check_label_arrays`; ``targets``
    is None in the result for a pack without targets."""
    n, k = check_label_arrays(labels, targets, error=InputError)
    if targets is not None and len(target_names) != k:
        raise InputError(f"{len(target_names)} target names for {k} target columns")
    fields: dict[str, Any] = {"targets": None}
    fields.update(label_fields_json(n, target_names if targets is not None else ()))
    return fields


def check_label_fields(fields: dict[str, Any], count: int, where: str) -> list[str] | None:
    """Validate a manifest's label fields for a pack of ``count`` images.

    Returns the target names (None when the pack has no targets). Raises
    :class:`PackFormatError` for any dtype or shape other than int64 [count] and
    float32 [count, K]: a pack with other label types is refused, never cast.
    """
    names = check_label_fields_json(fields, count, where)
    return list(names) if names else None
