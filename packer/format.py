"""The pack on disk: its layout, manifest schema and format version, in one place.

A pack is a directory::

    PACK/
      meta.json                  tensordict: {"_type": "<class 'packer.pack.ImagePack'>"}
      _tensordict/meta.json      tensordict: shapes and dtypes of the fields
      _tensordict/images.memmap  uint8 [N, 3, H, W], raw C-order bytes
      _tensordict/labels.memmap  int64 [N], raw little-endian bytes
      imgpack.json               imgpack's manifest (schema below)

The two ``meta.json`` files follow tensordict's ``memmap_()`` layout, so
``ImagePack.load_memmap(PACK)`` in tensordict reads the same directory.
imgpack itself never trusts them: ``packer.pack.open_pack`` reads only the manifest
(plain JSON), checks every field, and maps the two data files at fixed names
with shapes from the manifest. Nothing is unpickled and nothing named in the
pack's files is imported. This module needs no torch, so build workers stay light.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from .errors import PackFormatError

FORMAT_NAME = "imgpack"
FORMAT_VERSION = 1
MANIFEST = "imgpack.json"
DATA_DIR = "_tensordict"
IMAGES_FILE = "images.memmap"
LABELS_FILE = "labels.memmap"
TD_TYPE = "<class 'packer.pack.ImagePack'>"
CHECKSUM = "sha256"
MAX_MANIFEST_BYTES = 2 << 30
_ALLOWED_DATA = {IMAGES_FILE, LABELS_FILE, "meta.json"}
_FORBIDDEN_SUFFIXES = (".pickle", ".pkl", ".pt", ".pth", ".npy", ".py", ".so")
_REQUIRED = {
    "format": str,
    "version": int,
    "count": int,
    "image_shape": list,
    "resize": str,
    "classes": list,
    "sources": list,
    "source_sizes": list,
    "skipped": list,
    "build": dict,
    "checksums": dict,
}


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


def block_rows_for(count: int) -> int:
    """Rows per checksum block (also the build's unit of work): at most 64, about
    256 blocks for small packs, so every worker gets many small tasks."""
    return max(1, min(64, math.ceil(count / 256)))


def digest(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def image_bytes(shape: list[int] | tuple[int, ...]) -> int:
    return int(math.prod(shape))


def pack_bytes(root: Path) -> int:
    """Bytes on disk of everything in a pack directory."""
    return sum(p.stat().st_size for p in Path(root).rglob("*") if p.is_file())


def is_pack(path: Path) -> bool:
    return (path / MANIFEST).is_file()


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON to ``path`` via a temporary file, fsync, rename."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, separators=(",", ":"))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_tensordict_meta(root: Path, count: int, image_shape: list[int]) -> None:
    """The two meta.json files that let tensordict's own loader open the pack."""
    td_meta = {
        "images": {
            "device": "cpu",
            "shape": [count, *image_shape],
            "dtype": "torch.uint8",
            "is_nested": False,
        },
        "labels": {"device": "cpu", "shape": [count], "dtype": "torch.int64", "is_nested": False},
        "shape": [count],
        "device": "cpu",
        "_type": "<class 'tensordict._td.TensorDict'>",
        "_format_version": 1,
        "_class": "tensordict:TensorDict",
    }
    write_json_atomic(root / DATA_DIR / "meta.json", td_meta)
    write_json_atomic(root / "meta.json", {"_type": TD_TYPE})


def _fail(root: Path, what: str) -> PackFormatError:
    return PackFormatError(f"{root}: {what}")


def read_manifest(root: Path) -> dict[str, Any]:
    """Read and validate a pack's manifest. Raises PackFormatError naming the problem."""
    root = Path(root)
    if not root.exists():
        raise _fail(root, "no such pack; check the path or build one with `imgpack build`")
    if not root.is_dir():
        raise _fail(root, "is a file, not a pack directory")
    lay = Layout(root)
    if not lay.manifest.is_file():
        raise _fail(
            root, f"not an imgpack pack ({MANIFEST} is missing); build it with `imgpack build`"
        )
    if lay.manifest.stat().st_size > MAX_MANIFEST_BYTES:
        raise _fail(root, f"{MANIFEST} is implausibly large; the pack is damaged")
    try:
        m = json.loads(lay.manifest.read_bytes())
    except (ValueError, UnicodeDecodeError) as e:
        raise _fail(
            root, f"{MANIFEST} is not valid JSON ({e}); the pack is damaged, rebuild it"
        ) from None
    if not isinstance(m, dict) or m.get("format") != FORMAT_NAME:
        raise _fail(root, f"{MANIFEST} is not an imgpack manifest")
    for key, typ in _REQUIRED.items():
        if not isinstance(m.get(key), typ) or isinstance(m.get(key), bool):
            raise _fail(
                root,
                f"{MANIFEST}: field {key!r} is missing or not a {typ.__name__}; rebuild the pack",
            )
    if m["version"] > FORMAT_VERSION:
        raise _fail(
            root,
            f"made by a newer imgpack (format version {m['version']}, this one reads "
            f"up to {FORMAT_VERSION}); upgrade imgpack",
        )
    if m["version"] < 1:
        raise _fail(root, f"unknown format version {m['version']}")
    n, shape = m["count"], m["image_shape"]
    if (
        n < 0
        or len(shape) != 3
        or shape[0] != 3
        or not all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 65536 for v in shape)
    ):
        raise _fail(root, f"{MANIFEST}: bad count {n} or image_shape {shape}")
    if len(m["sources"]) != n or len(m["source_sizes"]) != n:
        raise _fail(root, f"{MANIFEST}: {len(m['sources'])} sources for {n} images")
    for s in m["sources"]:
        p = PurePosixPath(s) if isinstance(s, str) else None
        if p is None or p.is_absolute() or ".." in p.parts or "\\" in s or s.startswith("/"):
            raise _fail(
                root, f"{MANIFEST}: source path {s!r} leaves the source folder; refusing the pack"
            )
    if not all(isinstance(c, str) for c in m["classes"]):
        raise _fail(root, f"{MANIFEST}: class names must be strings")
    return m


def check_files(root: Path, m: dict[str, Any]) -> None:
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
    for f in os.listdir(data_dir):
        if f not in _ALLOWED_DATA:
            raise _fail(root, f"unexpected file {DATA_DIR}/{f}; refusing the pack")
    lay = Layout(root)
    meta = root / "meta.json"
    if meta.is_file():
        try:
            t = json.loads(meta.read_bytes()).get("_type")
        except (ValueError, AttributeError):
            t = None
        if t != TD_TYPE:
            raise _fail(
                root,
                f"meta.json names type {t!r}, not {TD_TYPE!r}; refusing the pack "
                "(nothing was imported)",
            )
    n, shape = m["count"], m["image_shape"]
    for path, want in ((lay.images, n * image_bytes(shape)), (lay.labels, n * 8)):
        if path.is_symlink() or not path.is_file():
            raise _fail(root, f"{path.relative_to(root)} is missing or not a regular file")
        if not path.resolve().is_relative_to(real_root):
            raise _fail(root, f"{path.relative_to(root)} points outside the pack; refusing it")
        size = path.stat().st_size
        if size != want:
            raise _fail(
                root,
                f"{path.relative_to(root)} is {size:,} bytes, the manifest says "
                f"{want:,} ({n} images of {shape}); the pack is damaged or truncated",
            )
