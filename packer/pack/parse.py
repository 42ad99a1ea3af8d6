"""Checks of an untrusted manifest: :func:`_parse` behind :meth:`Manifest.from_json`
(it returns the manifest's fields, typed, and ``from_json`` makes the
:class:`~packer.pack.schema.Manifest`), and the label and target rules of a manifest's
JSON (int64 labels, float32 targets, never cast). The same rules on arrays are
:mod:`packer.pack.labels`'s, importable here too."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import PackFormatError
from ..imaging.limits import DEFAULT_MAX_PIXELS, RESIZE_MODES
from .kinds import kind_of
from .labels import check_label_arrays, label_fields
from .layout import (
    _BUILD_KEYS,
    CHECKSUM,
    FORMAT_NAME,
    FORMAT_VERSION,
    JPEG_STORAGE_VERSION,
    LABEL_DTYPE,
    MAX_COUNT,
    STORAGE_KINDS,
    TARGET_DTYPE,
    BuildInfo,
    Checksums,
    Skip,
)

# the label rules on arrays live in packer.pack.labels (the kinds check with them)
__all__ = ["check_label_arrays", "check_label_fields", "check_label_fields_json", "label_fields"]


class _Bad(Exception):
    pass


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


def _parse(m: Any) -> dict[str, Any]:
    """The fields of :class:`~packer.pack.schema.Manifest` from an untrusted manifest, checked."""
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
    jpeg_bytes, storage_version, max_side, quality = _storage_fields(m, storage)

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
    build = _build_info(_dict(m, "build"))
    checksums = _checksums(_dict(m, "checksums"), targets, storage)
    dense = None
    if "dense" in m:  # boxes, masks, keypoints (packer.pack.dense)
        from .dense import parse_record

        try:
            dense = parse_record(m["dense"], n)
        except ValueError as e:
            raise _Bad(str(e)) from None
    return dict(
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
        dense=dense,
    )


def check_label_fields(fields: dict[str, Any], count: int, where: str) -> list[str] | None:
    """Validate a manifest's label fields for a pack of ``count`` images.

    Returns the target names (None when the pack has no targets). Raises
    :class:`PackFormatError` for any dtype or shape other than int64 [count] and
    float32 [count, K]: a pack with other label types is refused, never cast.
    """
    names = check_label_fields_json(fields, count, where)
    return list(names) if names else None


def _storage_fields(m: Mapping[str, Any], storage: str) -> tuple[int, int, int | None, int | None]:
    """``(jpeg_bytes, storage_version, max_side, quality)`` of a manifest of ``storage``:
    recorded by the kinds whose images are decoded when read (:mod:`packer.pack.kind`)."""
    if not kind_of(storage).decoded:
        return 0, 0, None, None
    storage_version = _int(m, "storage_version", "", lo=1, hi=1 << 31)
    _want(
        storage_version <= JPEG_STORAGE_VERSION,
        f"jpeg storage version {storage_version} is newer than this imgpack reads "
        f"({JPEG_STORAGE_VERSION}); upgrade imgpack",
    )
    jpeg_bytes = _int(m, "jpeg_bytes", "", hi=1 << 50)
    max_side = _int(m, "max_side", "", lo=1) if m.get("max_side") is not None else None
    quality = _int(m, "quality", "", lo=1, hi=100) if m.get("quality") is not None else None
    return jpeg_bytes, storage_version, max_side, quality


def _build_info(b: dict[str, Any]) -> BuildInfo:
    """The manifest's ``build`` object, typed (keys imgpack does not know kept in ``extra``)."""
    return BuildInfo(
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


def _checksums(ck: dict[str, Any], targets: tuple[str, ...], storage: str) -> Checksums:
    """The manifest's ``checksums`` object, typed and checked against the targets."""
    images = _list(ck, "images", "checksums.")
    checksums = Checksums(
        block_rows=_int(ck, "block_rows", "checksums.", lo=0),
        images=_strs(images, "checksums.images"),
        labels=_str(ck, "labels", "checksums."),
        algorithm=_str(ck, "algorithm", "checksums.") if "algorithm" in ck else CHECKSUM,
        targets=_str(ck, "targets", "checksums.") if targets or "targets" in ck else "",
        index=_str(ck, "index", "checksums.") if kind_of(storage).decoded else "",
    )
    _want(checksums.algorithm == CHECKSUM, f"checksum algorithm {checksums.algorithm!r} unknown")
    _want(
        bool(checksums.targets) == bool(targets),
        "field 'checksums.targets' must be given exactly when the pack has targets; "
        "rebuild the pack",
    )
    return checksums
