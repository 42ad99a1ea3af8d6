"""``imgpack build SRC s3://bucket/prefix --shard-size SIZE``: a pack set built into
object storage.

The set is built by :func:`packer.builder.shards.build_set` into a staging folder of the
cache (``<cache>/builds/<hash of the URL>/set``); each shard is uploaded as soon as it
is in place (its data files, then tensordict's meta files, then its manifest, last),
and its big data file is dropped from the staging folder, which keeps only manifests and
small files. The index goes up last, after every shard: a reader never sees a set
whose index names a shard that is not whole in the bucket.

A rerun of a killed build resumes: a shard whose manifest is in the bucket byte for
byte (uploaded whole, since the manifest goes last) is neither built nor uploaded again;
shards built but not uploaded are uploaded. ``--append`` reads the bucket's index and
the manifests of its shards, builds SRC's new images as new shards and swaps the index.
Once the new index is up (and read back as this build's), objects of shards it does not
name (an older or a dead build's) are deleted. The staging folder is removed after a
build that completed.

One writer at a time (:class:`~packer.storage.lease.Lease`): the build takes the set's
lease before any work, which also checks the destination (a missing bucket, refused
credentials or a server that does not answer end the build there, in one line), and
holds it until its clean-up is done; a second build of the same set, from any machine,
stops at once with PackBusyError naming the first and changes nothing. The index is put
and shards are deleted only after checking that the lease is still this build's.

``--engine ray``: each task builds its shard in a node-local temporary folder (the same
:func:`~packer.builder.shards.commit_shard`, so the same bytes) and uploads it itself with
the same :class:`BucketSink` (:func:`build_and_upload`), opening the store from the URL
and its node's own AWS environment: no credential travels in a task's arguments. The
driver plans with :class:`ClusterSink`: a shard whose manifest is in the bucket under its
name is done (the name hashes everything its bytes depend on, and the manifest goes up
last); it fetches the manifest of each shard a task sent, writes the index from them
and uploads it last, as above. So the bucket holds the same objects as the local
engine's build, and a rerun builds and uploads only the shards the bucket lacks.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from .._fs import write_atomic
from ..errors import InputError, PackFormatError, UsageError
from ..pack.files import loads_json, read_manifest, write_json_atomic
from ..pack.index import INDEX, MAX_INDEX_BYTES, manifest_digest
from ..pack.schema import DATA_DIR, MANIFEST, MAX_MANIFEST_BYTES, Manifest
from ..sources.bucket import bucket_scan
from ..sources.classes import apply_class_map, resolve_classes
from ..sources.labels import apply_table
from ..sources.scan import Scan
from ..sources.tables import read_table
from ..storage.cache import default_cache_dir
from ..storage.client import NotFound, ObjectStore, TooLarge, open_store
from ..storage.lease import Lease
from ..storage.open import read_class_map
from ..storage.remote import read_remote_index, remote_manifest_cap
from ..storage.url import StorageURL, parse_url
from .config import BuildConfig, BuildResult, _Labels
from .plan import labels_from_table
from .set_plan import ShardSink, _complete
from .shards import SetEngine, ShardOutcome, build_set, commit_shard

log = logging.getLogger(__name__)

_SHARD_DIR = re.compile(r"\d{5,}-[0-9a-f]{16}")


def _reached(step: str) -> None:
    """Called after each step ("lease taken", "uploaded <shard>", "index uploaded");
    crash and concurrency tests stop or wait there."""


class BucketSink(ShardSink):
    """Uploads each shard of a set build to the client's URL (see the module docstring)."""

    def __init__(self, client: ObjectStore) -> None:
        self.client = client
        self.uploaded = 0
        self.skipped = 0

    def _remote_manifest(self, name: str, cap: int = MAX_MANIFEST_BYTES) -> bytes | None:
        """The bucket's manifest of shard ``name``: None if missing or above ``cap``
        bytes (refused by its size, unread)."""
        try:
            return self.client.get(name, MANIFEST, max_bytes=cap)
        except (NotFound, TooLarge):
            return None

    def holds(self, path: Path) -> bool:
        local = path / MANIFEST
        if not local.is_file():
            return False
        data = local.read_bytes()
        return self._remote_manifest(path.name, len(data)) == data

    def put(self, path: Path) -> None:
        name = path.name
        data = (path / MANIFEST).read_bytes()
        m = Manifest.from_json(loads_json(data), where=f"{path}: {MANIFEST}")
        big = path / DATA_DIR / m.fields[0].file
        if self._remote_manifest(name, len(data)) == data:
            self.skipped += 1
        else:
            files = [f"{DATA_DIR}/{f.file}" for f in m.fields]
            files += [f"{DATA_DIR}/{k}" for k in sorted(m.dense.files)] if m.dense else []
            for rel in [*files, "meta.json", f"{DATA_DIR}/meta.json"]:
                self.client.put(path / rel, name, *rel.split("/"))
            self.client.put(data, name, MANIFEST)  # last: the shard is whole in the bucket
            self.uploaded += 1
            _reached(f"uploaded {name}")
        big.unlink(missing_ok=True)  # the staging folder keeps the small files only


class ClusterSink(BucketSink):
    """The driver's sink of an ``--engine ray`` build into a bucket: the tasks upload
    (:attr:`url`); this one finds the shards already there and fetches the manifests
    of those the tasks sent, for the index."""

    def __init__(self, client: ObjectStore) -> None:
        super().__init__(client)
        self.url = str(client.url)

    def _keep(self, path: Path) -> bool:
        """The bucket's manifest of shard ``path.name`` into ``path`` if it is there and
        valid; whether it was."""
        body = self._remote_manifest(path.name)
        if body is None:
            return False
        try:
            Manifest.from_json(loads_json(body), where=self.client.url.child(path.name, MANIFEST))
        except PackFormatError as e:
            log.warning("%s; building that shard again", e)
            return False
        path.mkdir(parents=True, exist_ok=True)
        write_atomic(path / MANIFEST, body, tmp=path / (MANIFEST + ".part"))
        return True

    def holds(self, path: Path) -> bool:
        # by name, not by comparing bytes: the driver builds nothing to compare with
        if not self._keep(path):
            return False
        self.skipped += 1
        return True

    def put(self, path: Path) -> None:
        raise AssertionError("the tasks of a cluster build upload their shards themselves")

    def sent(self, path: Path, uploaded: bool) -> None:
        if not self._keep(path):
            raise PackFormatError(
                f"{self.client.url.child(path.name, MANIFEST)}: its task reported the shard "
                "uploaded, but the bucket does not hold its manifest; run the same command again"
            )
        if uploaded:
            self.uploaded += 1
        else:
            self.skipped += 1


def plan_bucket(src: str, config: BuildConfig) -> _Labels:
    """The labelled images of a bucket SRC (``s3://bucket/images/``), listed once (keys,
    sizes, ETags): class folders through the ``--classes`` map, or the rows of a
    ``--labels`` table, as :func:`packer.builder.plan.plan_labels` does for a folder.
    The Ray engine's (:class:`packer.builder.ray_engine.RayEngine`): each task downloads
    its shard's images."""
    u = parse_url(src)
    listing = open_store(u).list_meta()
    fixed = read_class_map(config.classes) if config.classes is not None else None
    class_map = (
        None
        if config.classes is None
        else config.classes
        if isinstance(config.classes, str)
        else str(config.classes.resolve())
    )
    if config.labels is None:
        scan = bucket_scan(str(u), listing)
        classes, new = resolve_classes(
            scan.classes, fixed, config.allow_new_classes, map_source=config.classes
        )
        if new:
            log.warning("classes not in %s, appended at the end: %s", config.classes, new)
        mapped = apply_class_map(scan, classes)
        scan = replace(scan, classes=mapped.classes, entries=mapped.entries)
        return _Labels(scan=scan, new_classes=new, class_map=class_map)
    table = read_table(
        config.labels,
        targets=config.targets,
        classes=fixed,
        allow_new_classes=config.allow_new_classes,
    )
    found = bucket_scan(str(u), listing, tree=False)
    match = apply_table(table, [e.rel for e in found.entries])
    return labels_from_table(found, match, table, config.labels, class_map, str(u))


def _download(src: str, part: _Labels, folder: Path) -> _Labels:
    """The images of ``part`` from the bucket ``src`` into ``folder`` (at their relative
    paths); ``part`` reading them from there."""
    client = open_store(parse_url(src))
    objects = getattr(part.scan, "objects", {})
    for e in part.scan.entries:
        path = folder / e.rel
        path.parent.mkdir(parents=True, exist_ok=True)
        # the ETag the shard's name was made from: an object changed since is refused
        client.download(path, *e.rel.split("/"), etag=objects.get(e.rel, (0, ""))[1] or None)
    scan = Scan(root=folder, classes=part.scan.classes, entries=part.scan.entries)
    return replace(part, scan=scan)


def build_and_upload(
    src: Path | str, url: str, name: str, part: _Labels, config: BuildConfig
) -> tuple[ShardOutcome, bool]:
    """One Ray task of a build into a bucket: shard ``name`` built from ``part`` in a
    node-local temporary folder and uploaded to ``url`` with this node's credentials.
    ``src`` may be a bucket URL: the shard's images are downloaded first, and the
    manifest names ``src`` as its source (not the temporary folder).
    Returns the outcome and whether it uploaded (False: the bucket held the same
    manifest already, as after a retry of a task whose upload had completed)."""
    sink = BucketSink(open_store(parse_url(url)))
    with tempfile.TemporaryDirectory(prefix="imgpack-shard-") as tmp:
        outcome = _build_here(src, Path(tmp), name, part, config)
        if not outcome.failed:
            sink.put(Path(tmp) / "set" / name)
    return outcome, sink.uploaded > 0


def build_from_bucket(
    src: str, dst: Path, name: str, part: _Labels, config: BuildConfig
) -> ShardOutcome:
    """One Ray task of a build from a bucket into a shared folder: the shard's images
    downloaded into a node-local temporary folder and built there (its manifest naming
    ``src``), then copied beside ``dst/name`` and renamed into place whole."""
    path = dst / name
    if _complete(path):  # a retry of a task that died after the rename
        return ShardOutcome(name, built=True)
    with tempfile.TemporaryDirectory(prefix="imgpack-shard-") as tmp:
        outcome = _build_here(src, Path(tmp), name, part, config)
        if outcome.built:
            partial = dst / f".{name}.imgpack-partial"  # removed by the set's clean-up
            shutil.rmtree(partial, ignore_errors=True)
            shutil.copytree(Path(tmp) / "set" / name, partial)
            if path.is_dir():  # an incomplete one, left by a crash
                shutil.rmtree(path)
            os.replace(partial, path)
    return outcome


def _build_here(
    src: Path | str, tmp: Path, name: str, part: _Labels, config: BuildConfig
) -> ShardOutcome:
    out = tmp / "set"
    out.mkdir()
    if isinstance(src, str):
        local = _download(src, part, tmp / "src")
        outcome = commit_shard(tmp / "src", out, name, local, config)
        if outcome.built:
            _name_source(out / name, src)
        return outcome
    return commit_shard(src, out, name, part, config)


def _name_source(path: Path, src: str) -> None:
    """The manifest of the shard at ``path`` records the bucket ``src`` as where its images
    came from, not the temporary folder they were read from (so its bytes depend on its
    inputs only)."""
    m = read_manifest(path)
    if m.build.source_root != src:
        m = replace(m, build=replace(m.build, source_root=src))
        write_json_atomic(path / MANIFEST, m.to_json())


def _staging(client: ObjectStore) -> Path:
    """The build's staging set folder: ``<cache>/builds/<hash of URL and endpoint>/set``."""
    return default_cache_dir() / "builds" / client.url.cache_key(client.endpoint) / "set"


def _fetch_manifests(client: ObjectStore, staging: Path) -> None:
    """--append: the bucket's index and every shard's manifest into the staging folder
    (what build_set reads of the old set)."""
    index, data = read_remote_index(client)
    staging.mkdir(parents=True, exist_ok=True)
    for entry in index.shards:
        local = staging / entry.name / MANIFEST
        if local.is_file() and manifest_digest(local.read_bytes()) == entry.sha256:
            continue
        try:
            body = client.get(entry.name, MANIFEST, max_bytes=remote_manifest_cap(entry.count))
        except (NotFound, TooLarge):
            body = b""
        if manifest_digest(body) != entry.sha256:
            raise PackFormatError(
                f"{client.url.child(entry.name, MANIFEST)}: does not match the SHA-256 the "
                "index gives; the set in the bucket is damaged"
            )
        local.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(local, body)
    write_atomic(staging / INDEX, data, tmp=staging / (INDEX + ".part"))


def build_to_bucket(
    src: str | os.PathLike[str],
    url: str,
    config: BuildConfig,
    progress: Callable[[int], None] | None = None,
    on_start: Callable[[int, int], None] | None = None,
    *,
    engine: SetEngine,
) -> BuildResult:
    """Build the pack set at ``url`` (s3://, gs://, az://) from ``src`` with ``engine``
    (:mod:`packer.builder.api` chose it): see the module docstring. ``config.shard_size`` is required (a URL holds sets only). Returns the
    result of the whole set; ``extra`` counts ``shards_uploaded`` and
    ``shards_already_there``."""
    u = parse_url(url)
    if config.shard_size is None and not config.append:
        raise UsageError(
            f"{u}: object storage holds pack sets; give BuildConfig.shard_size (e.g. 256MB)",
            field="BuildConfig.shard_size",
        )
    client = open_store(u)
    lease = Lease(client)
    lease.acquire()  # the destination checked before any work, and one writer at a time
    try:
        _reached("lease taken")
        return _build_under_lease(src, u, client, lease, config, progress, on_start, engine)
    finally:
        lease.release()


def _build_under_lease(
    src: str | os.PathLike[str],
    u: StorageURL,
    client: ObjectStore,
    lease: Lease,
    config: BuildConfig,
    progress: Callable[[int], None] | None,
    on_start: Callable[[int, int], None] | None,
    engine: SetEngine,
) -> BuildResult:
    exists = client.head(INDEX) is not None
    if exists and not (config.append or config.overwrite):
        raise InputError(
            f"{u}: a pack set already exists; pass BuildConfig.append to add SRC's new "
            "images or BuildConfig.overwrite to rebuild it",
            field="BuildConfig.append",
        )
    if config.append and not exists:
        raise UsageError(
            f"BuildConfig.append: {u} holds no pack set; build one first (without "
            "BuildConfig.append)",
            field="BuildConfig.append",
        )
    staging = _staging(client)
    staging.parent.mkdir(parents=True, exist_ok=True)
    if config.append:
        _fetch_manifests(client, staging)
        local = config
    else:
        # the staging folder is this build's own: a leftover of a killed run is resumed
        local = replace(config, overwrite=True)
    sink = ClusterSink(client) if engine.tasks_upload else BucketSink(client)
    result = build_set(
        src, staging, local, progress=progress, on_start=on_start, sink=sink, engine=engine
    )
    index = (staging / INDEX).read_bytes()
    lease.check()  # still the only writer: commit
    client.put(index, INDEX)  # the commit point, last
    _reached("index uploaded")
    _clean_up(client, lease, index)
    shutil.rmtree(staging.parent, ignore_errors=True)
    result.path = str(u)  # type: ignore[assignment]
    result.extra = {
        **result.extra,
        "shards_uploaded": sink.uploaded,
        "shards_already_there": sink.skipped,
    }
    return result


def _clean_up(client: ObjectStore, lease: Lease, index: bytes) -> None:
    """Delete the shard objects that ``index`` (this build's, just put) does not name:
    only while the index in the bucket is still this one and the lease still this
    build's, so no other writer's index can name what is deleted."""
    try:
        if client.get(INDEX, max_bytes=MAX_INDEX_BYTES) != index:
            log.warning("%s: the index changed after this build put it; no clean-up", client.url)
            return
    except (NotFound, TooLarge):
        return
    lease.check()
    names = {e["name"] for e in loads_json(index)["shards"]}
    for key in client.list():
        first = key.split("/", 1)[0]
        if _SHARD_DIR.fullmatch(first) and first not in names:
            client.delete(key)
