"""Reading a pack's metadata safely: JSON helpers (:func:`loads_json`,
:func:`write_json_atomic`), size-capped non-blocking reads (:func:`read_bounded`),
:func:`read_manifest`, and the checks of the files themselves (:func:`check_files`,
:func:`check_tensordict_meta`). No torch."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .._fs import (
    JSONNestingError,
    NotRegularFile,
    file_kind,
    loads_json,
    open_fd_if_regular,
    write_atomic,
)
from ..errors import PackFormatError
from .schema import (
    DATA_DIR,
    MANIFEST,
    MAX_MANIFEST_BYTES,
    MAX_META_BYTES,
    SET_INDEX,
    TD_TYPE,
    Layout,
    Manifest,
)

_FORBIDDEN_SUFFIXES = (".pickle", ".pkl", ".pt", ".pth", ".npy", ".py", ".so")


def write_json_atomic(path: Path, obj: Any, indent: int | None = None) -> None:
    """Write JSON to ``path`` whole or not at all (:func:`packer._fs.write_atomic`)."""
    if indent is None:
        text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    else:
        text = json.dumps(obj, ensure_ascii=False, indent=indent) + "\n"
    write_atomic(Path(path), text.encode("utf-8"))


def _fail(root: Path, what: str) -> PackFormatError:
    return PackFormatError(f"{root}: {what}")


def read_bounded(root: Path, path: Path, limit: int, head: bytes | None = None) -> bytearray:
    """The bytes of ``path`` (a file of the pack at ``root``), if it is a regular file
    (symlinks followed) of at most ``limit`` bytes: checked on the opened descriptor
    before anything is read (opening never blocks, so a FIFO is refused, not waited on).
    ``limit`` is the reader's (a constant or the user's option), never read from the pack.
    ``head``: the bytes the file's first non-blank byte may be (b"{[" for JSON: what
    the parser could take as a manifest or report as nested too deeply), checked on
    the first chunk, so a large file of garbage (or a sparse one) is refused
    before the rest is read. Read into one buffer of the file's size (no second copy).
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
        first = os.read(fd, min(8 << 20, st.st_size + 1))
        if head is not None:
            lead = first.lstrip(b" \t\r\n")[:1]
            if lead and lead not in head:
                raise _fail(
                    root,
                    f"{name} does not start as JSON (it starts with {lead!r}); the pack "
                    "is damaged or not from imgpack, refusing it",
                )
        # the rest straight into one buffer of the file's size (one byte more: a file
        # growing meanwhile is seen), allocated only once the head passed
        buf = bytearray(st.st_size + 1)
        buf[: len(first)] = first
        got = len(first)
        del first
        view = memoryview(buf)
        while got < len(buf):
            k = os.readv(fd, [view[got : got + (8 << 20)]])
            if not k:
                break
            got += k
        del view
        if got > st.st_size:
            raise _fail(root, f"{name} grew while read; refusing it")
        del buf[got:]
        return buf
    except OSError as e:
        raise _fail(root, f"{name} cannot be read ({e.strerror})") from None
    finally:
        os.close(fd)


def manifest_limit(root: Path | None = None) -> int:
    """The most bytes a pack's manifest may have: the reader's constant
    MAX_MANIFEST_BYTES, whatever the pack at ``root`` holds (never a figure read from
    the pack being checked)."""
    return MAX_MANIFEST_BYTES


def folder_kind(path: str | os.PathLike[str]) -> str | None:
    """What the folder at ``path`` is: ``"set"`` (it holds a set index), ``"pack"`` (it
    holds a pack's manifest) or None (neither, or not a folder). The one rule that
    ``packer.load``, ``imgpack info``, ``imgpack verify``, ``describe`` and
    ``--classes`` follow: a folder holding both (an index beside a manifest) is neither,
    and PackFormatError refuses it, the same message everywhere (issue 42.17)."""
    has_index = os.path.lexists(os.path.join(path, SET_INDEX))
    has_manifest = os.path.lexists(os.path.join(path, MANIFEST))
    if has_index and has_manifest:
        raise PackFormatError(
            f"{path}: holds both a pack set's index ({SET_INDEX}) and a single pack's manifest "
            f"({MANIFEST}), so it is neither; refusing it (a folder is one or the other: "
            "remove the file that does not belong, or rebuild into an empty folder)"
        )
    if has_index:
        return "set"
    if has_manifest:
        return "pack"
    return None


def read_manifest(root: Path) -> Manifest:
    """Read and validate a pack's manifest. Raises PackFormatError naming the problem."""
    root = Path(root)
    if not root.exists():
        raise _fail(root, "no such pack; check the path or build one with `imgpack build`")
    if not root.is_dir():
        raise _fail(root, "is a file, not a pack directory")
    folder_kind(root)  # a folder that is also a set is refused, as everywhere
    lay = Layout(root)
    try:
        data = read_bounded(root, lay.manifest, MAX_MANIFEST_BYTES, head=b"{[")
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
    from .dense import check_dense_files, record_files

    allowed = {f.file for f in m.fields} | {"meta.json"} | record_files(m)
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
    check_dense_files(root, m)
