"""``imgpack verify SET``: the index, then every shard through the pack's own checks.

One check for the index (schema, counts) and one per shard: its manifest against the
index (SHA-256, count, data bytes, class map, storage), then :func:`packer.measure.
verify.verify`'s integrity checks (block hashes, labels, a re-decoded sample of the
sources). A failed shard's check is named after the shard and says which of its checks
failed and on which file. Throughput over a set is measured with the set loader (not
here yet): every shard is verified with ``throughput=False``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import PackerError
from ..pack.index import read_index, read_shard_manifest, shard_root
from ..pack.kinds import kind_of
from ..storage.open import where
from .verify import VerifyConfig, VerifyReport, images_phrase, verify


def verify_set(
    path: str | os.PathLike[str],
    config: VerifyConfig | None = None,
    progress: Callable[[int], None] | None = None,
) -> VerifyReport:
    """Check a pack set's index and every shard; a report with one check named
    ``index`` and one named ``shard <name>`` per shard (``report.ok`` only if all
    pass). ``config``: as :func:`verify`'s (throughput is never timed here).
    ``progress(k)``: k more images of a shard checked. Raises PackFormatError
    only when ``path`` holds no readable index (nothing to verify); a damaged
    shard is a failed check, and the other shards are still checked."""
    config = config or VerifyConfig(throughput=False)
    config.validate()
    remote = None
    if where(path).kind == "url":  # object storage: every shard downloaded
        from ..storage.remote import open_remote

        remote = open_remote(path, prefetch_depth=0)
        root = remote.path
    else:
        root = Path(path)
    index = read_index(root)
    report = VerifyReport(path=Path(root) if remote is None else path)  # type: ignore[arg-type]
    report.add(
        "index",
        True,
        f"set format {index.version}, {len(index.shards)} shards ({index.storage}): "
        + images_phrase(
            index.count, index.image_shape, index.storage, index.options.get("max_side")
        ),
    )
    shard_config = replace(config, throughput=False)
    try:
        for k, entry in enumerate(index.shards):
            _check_shard(report, root, index, k, entry, shard_config, remote, progress)
    finally:
        if remote is not None:
            remote.store.close()
    return report


def _check_shard(
    report: VerifyReport,
    root: Path,
    index: Any,
    k: int,
    entry: Any,
    shard_config: VerifyConfig,
    remote: Any,
    progress: Callable[[int], None] | None,
) -> None:
    name = f"shard {entry.name}"
    try:
        read_shard_manifest(root, entry, index)
        if remote is not None:
            remote.store.fetch(k)  # downloaded (and hashed) into the cache, held
        try:
            r = verify(shard_root(root, entry), shard_config, progress=progress)
        finally:
            if remote is not None:
                remote.store.release(k)
    except PackerError as e:
        report.add(name, False, str(e))
        return
    failed = [c for c in r.checks if not c["ok"]]
    if failed:
        detail = "; ".join(_failure(c, index.storage) for c in failed)
    else:
        detail = f"{entry.count} images: " + ", ".join(c["name"] for c in r.checks) + " ok"
    report.add(name, not failed, detail)


def _failure(check: dict[str, Any], storage: str) -> str:
    # the file of a shard the check reads, named in a failed check's detail
    file = kind_of(storage).verify_reads.get(check["name"])
    where = f" ({file})" if file else ""
    return f"{check['name']}{where}: {check['detail']}"
