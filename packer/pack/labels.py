"""The label and target rules on arrays: int64 labels ``[N]``, float32 targets
``[N, K]``, never cast. Numpy arrays and torch tensors alike; imports neither.

Below the storage kinds (each checks the arrays it maps with :func:`check_label_arrays`)
and on nothing of the format but its names (:mod:`packer.pack.layout`); the same rules
on a manifest's JSON are :mod:`packer.pack.parse`'s."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import InputError, PackerError, PackFormatError
from .layout import LABEL_DTYPE, TARGET_DTYPE, label_fields_json


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
            "imgpack does not cast labels (float values belong in targets)"
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
