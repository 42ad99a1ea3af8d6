"""The columns of a parquet or Arrow source (:mod:`packer.builder.formats.parquet`,
:mod:`packer.builder.formats.arrow`): :func:`need_pyarrow` (a one-line error naming the
extra), the ``datasets`` features of a schema (:func:`hf_features`), and
:func:`pick_columns`: the image column (an ``Image`` feature or binary), the label column
(a ``ClassLabel``, whose names are the class map, or ints, or strings), or an error that
lists the columns.
"""

from __future__ import annotations

from typing import Any

from ..._fs import loads_json
from ...errors import InputError
from .common import Fetched, capped
from .options import SourceOptions

LABEL_NAMES = ("label", "labels", "cls", "class", "target")


def need_pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        from ...errors import UsageError

        raise UsageError(
            "reading parquet and Arrow sources needs pyarrow: pip install 'imgpack[sources]'"
        ) from None
    return pyarrow


# ---------------------------------------------------------------- columns


def hf_features(schema: Any) -> dict[str, Any]:
    """The ``datasets`` features recorded in an Arrow schema's metadata, or {}."""
    meta = schema.metadata or {}
    raw = meta.get(b"huggingface")
    if not raw or len(raw) > 16 << 20:
        return {}
    try:
        doc = loads_json(raw)
        feats = doc.get("info", {}).get("features", {})
    except (ValueError, AttributeError):
        return {}
    return feats if isinstance(feats, dict) else {}


def _type_name(t: Any) -> str:
    return str(t).replace("\n", " ")[:60]


def _column_list(schema: Any) -> str:
    return ", ".join(f"{f.name} ({_type_name(f.type)})" for f in schema)


def _is_image_type(pa: Any, t: Any) -> bool:
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return True
    if pa.types.is_struct(t):
        idx = t.get_field_index("bytes")
        if idx >= 0:
            b = t.field(idx).type
            return pa.types.is_binary(b) or pa.types.is_large_binary(b)
    return False


def _is_label_type(pa: Any, t: Any) -> bool:
    return pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)


def pick_columns(
    schema: Any, features: dict[str, Any], opts: SourceOptions, where: str
) -> tuple[str, str | None, list[str] | None]:
    """(image column, label column or None, ClassLabel names or None) of ``schema``."""
    pa = need_pyarrow()
    types = {f.name: f.type for f in schema}
    listing = _column_list(schema)
    if opts.image_column is not None:
        if opts.image_column not in types:
            raise InputError(f"{where}: no column {opts.image_column!r}; columns: {listing}")
        if not _is_image_type(pa, types[opts.image_column]):
            raise InputError(
                f"{where}: column {opts.image_column!r} holds {_type_name(types[opts.image_column])}, "
                f"not image bytes (an Image feature or binary); columns: {listing}"
            )
        image = opts.image_column
    else:
        hf = [n for n, f in features.items() if isinstance(f, dict) and f.get("_type") == "Image"]
        cands = [n for n in hf if n in types and _is_image_type(pa, types[n])] or [
            n for n, t in types.items() if _is_image_type(pa, t)
        ]
        if len(cands) != 1:
            why = "no column holds image bytes" if not cands else f"{len(cands)} could: {cands}"
            raise InputError(
                f"{where}: cannot tell which column holds the images ({why}); columns: "
                f"{listing}; name it with SourceOptions.image_column"
            )
        image = cands[0]
    names: list[str] | None = None

    def class_names(col: str) -> list[str] | None:
        f = features.get(col)
        if isinstance(f, dict) and f.get("_type") == "ClassLabel":
            ns = f.get("names")
            if isinstance(ns, list) and all(isinstance(n, str) for n in ns):
                return ns
        return None

    if opts.label_column is not None:
        if opts.label_column not in types:
            raise InputError(f"{where}: no column {opts.label_column!r}; columns: {listing}")
        if not _is_label_type(pa, types[opts.label_column]):
            raise InputError(
                f"{where}: column {opts.label_column!r} holds "
                f"{_type_name(types[opts.label_column])}; a label column holds integers or "
                f"strings; columns: {listing}"
            )
        return image, opts.label_column, class_names(opts.label_column)
    ok = {n for n, t in types.items() if n != image and _is_label_type(pa, t)}
    classlabels = [n for n in ok if class_names(n) is not None]
    cands = sorted(classlabels) or sorted(n for n in ok if n.lower() in LABEL_NAMES)
    if len(cands) > 1:
        raise InputError(
            f"{where}: cannot tell which column holds the labels ({len(cands)} could: "
            f"{cands}); columns: {listing}; name it with SourceOptions.label_column"
        )
    if not cands:
        return image, None, None
    names = class_names(cands[0])
    return image, cands[0], names


def label_values(pa: Any, column: Any) -> list[Any]:
    """A label column chunk as Python values (ints or strings; None for null)."""
    return column.to_pylist()


def image_bytes(arr: Any, i: int, cap: int) -> Fetched:
    pa = need_pyarrow()
    if not arr[i].is_valid:
        return Fetched(None, "no image (the cell is null)")
    if pa.types.is_struct(arr.type):
        if not arr.field("bytes")[i].is_valid:
            path = arr.field("path")[i].as_py() if arr.type.get_field_index("path") >= 0 else None
            named = f" (only a path, {str(path)[:200]!r}; a path is never followed)" if path else ""
            return Fetched(None, f"no image bytes in the cell{named}")
        arr = arr.field("bytes")
    buf = arr[i].as_buffer()
    why = capped(buf.size, cap)
    if why is not None:
        return Fetched(None, why)
    return Fetched(buf.to_pybytes())
