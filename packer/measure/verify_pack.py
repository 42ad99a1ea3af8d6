"""``packer.verify_pack`` (``imgpack verify``): the pack, set or URL at a path checked,
where it is decided once (:func:`packer.storage.open.where`): a single pack by
:func:`packer.measure.verify.verify` (integrity, then throughput), a set on this machine
or in object storage by :func:`packer.measure.verify_set.verify_set` (the index, then
every shard; no timing)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from ..storage.open import where
from .verify import Progress, VerifyConfig, VerifyReport, verify
from .verify_set import verify_set


def verify_pack(
    path: str | os.PathLike[str],
    config: VerifyConfig | None = None,
    trace: Path | None = None,
    progress: Progress | None = None,
    on_start: Callable[[int, int], None] | None = None,
) -> VerifyReport:
    """Check the pack, pack set or object-storage URL at ``path``.

    ``config``: default ``VerifyConfig()``. A pack: :func:`~packer.measure.verify.verify`
    (``trace``, ``on_start`` as there).
    A set or URL: one check named ``index`` and one per shard
    (:func:`~packer.measure.verify_set.verify_set`); its throughput is not timed, so
    ``trace`` is not written. ``progress(k)``: k more images checked, either way.

    Raises PackerError only when there is nothing to verify (no such path, no manifest
    or index, bad options); every problem found in a pack or shard is a failed check.
    """
    w = where(path)
    if w.kind == "pack":
        return verify(
            w.path, config or VerifyConfig(), trace=trace, progress=progress, on_start=on_start
        )
    return verify_set(w.path, config, progress=progress)
