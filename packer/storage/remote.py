"""Open a pack set in object storage: ``packer.load("s3://bucket/prefix")``.

The index is downloaded once per open (a warm cache makes no other request until a
shard's big file is wanted); each shard's small files are fetched if the cache lacks
them or they differ (manifest against the index's SHA-256, labels, targets and the JPEG
index files against the manifest), in parallel. The result is a
:class:`~packer.pack.packset.PackSet` whose root is the set's folder in the cache and
whose store is a :class:`~packer.storage.cache.RemoteShards`.
"""

from __future__ import annotations

import errno
import itertools
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..errors import DiskFullError, InputError, PackerError, PackFormatError, UsageError
from ..pack.files import JSONNestingError, loads_json
from ..pack.index import (
    INDEX,
    MAX_INDEX_BYTES,
    SetIndex,
    manifest_digest,
    read_shard_manifest,
)
from ..pack.packset import PackSet, describe_set
from ..pack.schema import DATA_DIR, MANIFEST, MAX_MANIFEST_BYTES, Manifest
from .cache import META_DIR, RemoteShards, default_cache_dir, flocked
from .client import NotFound, ObjectStore, Retry, open_store
from .url import StorageURL, parse_url
from .verify import check_jpeg_index, check_small_file, small_files

OPEN_THREADS = 8  # small files fetched in parallel when a set is opened cold
_counter = itertools.count()


def set_cache_root(url: StorageURL, client: ObjectStore, cache_dir: Any = None) -> Path:
    """The set's folder in the cache (created): ``cache_dir/sets/<hash of URL>``."""
    base = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    root = base / "sets" / url.cache_key(client.endpoint)
    try:
        (root / META_DIR / "tmp").mkdir(parents=True, exist_ok=True)
        note = root / META_DIR / "url"
        if not note.exists():
            _write(note, f"{url}\n".encode(), root, "url")
    except OSError as e:
        raise InputError(f"{base}: cannot use it as the cache folder ({e.strerror})") from None
    return root


def _write(path: Path, data: bytes, root: Path, tag: str) -> None:
    """``data`` to ``path`` through a temporary name of this process (renamed in);
    ``tag``: whose lock the writer holds (a shard's name), for orphans' clean-up."""
    tmp = root / META_DIR / "tmp" / f"s-{tag}.{os.getpid()}.{next(_counter)}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFullError(
                f"{root}: the disk is full; free space or give another cache_dir"
            ) from None
        raise
    finally:
        tmp.unlink(missing_ok=True)


def read_remote_index(client: ObjectStore) -> tuple[SetIndex, bytes]:
    """The set's index at the client's URL, checked. PackFormatError if there is none."""
    url = client.url
    try:
        data = client.get(INDEX)
    except NotFound:
        raise PackFormatError(
            f"{url}: not a pack set ({INDEX} is missing); build one with "
            f"`imgpack build SRC {url} --shard-size SIZE`"
        ) from None
    if len(data) > MAX_INDEX_BYTES:
        raise PackFormatError(f"{url}/{INDEX}: larger than an index can be")
    try:
        raw = loads_json(data)
    except JSONNestingError:
        raise PackFormatError(f"{url}/{INDEX} is nested too deeply to be an index") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise PackFormatError(f"{url}/{INDEX} is not valid JSON ({e})") from None
    return SetIndex.from_json(raw, where=f"{url}/{INDEX}"), data


def _get_checked(client: ObjectStore, name: str, rel: str, check: Any) -> bytes:
    """An object of shard ``name``; fetched a second time if ``check(data)`` names a
    problem, then PackFormatError naming the object."""
    for _ in (1, 2):
        try:
            data = client.get(name, *rel.split("/"))
        except NotFound:
            raise PackFormatError(
                f"{client.url.child(name, rel)} is missing from the bucket; the set is "
                "incomplete, rebuild it"
            ) from None
        problem = check(data)
        if problem is None:
            return data
    raise PackFormatError(
        f"{client.url.child(name, rel)}: {problem}, twice; the object in the bucket is "
        "damaged, rebuild the set"
    )


def _small_ok(root: Path, entry: Any, index: SetIndex) -> Manifest | None:
    """The shard's manifest if the cache holds its small files, whole and matching."""
    shard = root / entry.name
    try:
        m = read_shard_manifest(root, entry, index)
        for rel in small_files(m)[:-1]:
            path = shard / rel
            if not path.is_file():
                return None
            if check_small_file(rel, path.read_bytes(), m, shard) is not None:
                return None
        if m.storage == "jpeg" and check_jpeg_index(shard, m) is not None:
            return None
        return m
    except (PackFormatError, OSError):
        return None


def _fetch_small(client: ObjectStore, root: Path, index: SetIndex, k: int) -> Manifest:
    entry = index.shards[k]
    shard = root / entry.name
    (shard / DATA_DIR).mkdir(parents=True, exist_ok=True)
    with flocked(root / META_DIR / f"{entry.name}.small"):
        m = _small_ok(root, entry, index)
        if m is not None:
            return m
        for old in (root / META_DIR / "tmp").glob(f"s-{entry.name}.*.tmp"):
            old.unlink(missing_ok=True)

        def manifest_ok(data: bytes) -> str | None:
            if len(data) > MAX_MANIFEST_BYTES:
                return "larger than a manifest can be"
            if manifest_digest(data) != entry.sha256:
                return "does not match the SHA-256 the index gives"
            return None

        data = _get_checked(client, entry.name, MANIFEST, manifest_ok)
        try:
            m = Manifest.from_json(
                loads_json(data), where=f"{client.url.child(entry.name, MANIFEST)}"
            )
        except (ValueError, UnicodeDecodeError) as e:
            raise PackFormatError(
                f"{client.url.child(entry.name, MANIFEST)}: not valid JSON ({e})"
            ) from None
        for rel in small_files(m)[:-1]:
            body = _get_checked(
                client, entry.name, rel, lambda b, rel=rel: check_small_file(rel, b, m, shard)
            )
            _write(shard / rel, body, root, entry.name)
        if m.storage == "jpeg":
            problem = check_jpeg_index(shard, m)
            if problem is not None:
                raise PackFormatError(f"{client.url.child(entry.name)}: {problem}; rebuild the set")
        _write(
            shard / MANIFEST, data, root, entry.name
        )  # last: a shard with its manifest is complete
        return read_shard_manifest(root, entry, index)


def open_remote(
    url: str | os.PathLike[str],
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | None = None,
    *,
    retry: Retry | None = None,
    prefetch_depth: int | None = None,
) -> PackSet:
    """The pack set at ``url`` (s3://, gs://, az://), through a local cache.

    ``cache_dir``: default :func:`~packer.storage.cache.default_cache_dir`.
    ``cache_limit``: bytes of shard data the cache keeps for this set (None: no limit).
    ``prefetch_depth``: shards fetched ahead (default
    :data:`~packer.storage.cache.PREFETCH_DEPTH`). Raises PackFormatError for a missing
    or damaged set, StorageError when the server cannot be reached or refuses the
    credentials, UsageError for a bad URL or limit."""
    if cache_limit is not None and (
        not isinstance(cache_limit, int) or isinstance(cache_limit, bool) or cache_limit < 1
    ):
        raise UsageError(f"cache_limit must be a positive number of bytes, not {cache_limit!r}")
    u = parse_url(url)
    client = open_store(u, retry)
    index, data = read_remote_index(client)
    root = set_cache_root(u, client, cache_dir)
    index_path = root / INDEX
    if not index_path.is_file() or index_path.read_bytes() != data:
        _write(index_path, data, root, "index")
    with ThreadPoolExecutor(min(OPEN_THREADS, len(index.shards))) as pool:
        manifests = list(
            pool.map(lambda k: _fetch_small(client, root, index, k), range(len(index.shards)))
        )
    kw = {} if prefetch_depth is None else {"prefetch_depth": prefetch_depth}
    store = RemoteShards(root, index, manifests, client, limit=cache_limit, **kw)
    return PackSet(root, index, manifests, store)


def reopen_cached(root: Path) -> PackSet:
    """The set whose cache folder is ``root`` (``cache_dir/sets/<key>``), as the process
    that opened it left it (a DataLoader worker reopening a PackDataset's path): the
    cached index and small files, checked, no request; shards not cached are fetched from
    the URL recorded in the folder, with this process's settings, when wanted. No cache
    limit (the opener's is not recorded)."""
    from ..pack.index import read_index

    url = (root / META_DIR / "url").read_text(encoding="utf-8").strip()
    index = read_index(root)
    manifests = []
    for entry in index.shards:
        m = _small_ok(root, entry, index)
        if m is None:
            return open_remote(url, cache_dir=root.parent.parent)  # not all here: fetch
        manifests.append(m)
    store = RemoteShards(root, index, manifests, lambda: open_store(parse_url(url)))
    return PackSet(root, index, manifests, store)


def describe_remote(url: str) -> dict[str, Any]:
    """``imgpack info URL --json``: :func:`~packer.pack.packset.describe_set` of the
    set (its index and small files fetched), with the URL as its path and the bytes the
    set holds in the bucket."""
    ps = open_remote(url)
    try:
        out = describe_set(ps.path)
    finally:
        ps.store.close()
    out["path"] = str(parse_url(url))
    out["bytes"] = ps.index.bytes
    return out


def read_remote_class_map(url: str) -> list[str]:
    """``--classes URL``: the classes of the set or pack at ``url``, or of the text file
    (one class per line) that is the object at ``url``. InputError if none is there."""
    u = parse_url(url)
    client = open_store(u)
    try:
        index, _ = read_remote_index(client)
    except PackFormatError as e:
        if "is missing" not in str(e):
            raise InputError(f"{e} (given as a class map)") from None
    else:
        if not index.classes:
            raise InputError(
                f"{u}: the set has no classes (built from a flat folder or integer labels); "
                "it cannot fix a class map"
            )
        return list(index.classes)
    try:
        data = client.get(MANIFEST)
        m = Manifest.from_json(loads_json(data), where=f"{u}/{MANIFEST}")
        return list(m.classes)
    except NotFound:
        pass
    except (PackerError, ValueError) as e:
        raise InputError(f"{u}/{MANIFEST}: {e} (given as a class map)") from None
    if not u.prefix:
        raise InputError(f"{u}: holds no pack set or pack to take the class map from")
    parent, _, name = u.prefix.rpartition("/")
    holder = open_store(StorageURL(u.scheme, u.bucket, parent))
    try:
        text = holder.get(name)
    except NotFound:
        raise InputError(
            f"{u}: no pack set, pack or class-map file there; give a set, a pack or a text "
            "file with one class per line"
        ) from None
    import tempfile

    from ..sources.classes import read_class_file

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / (name or "classes.txt")
        path.write_bytes(text)
        try:
            return read_class_file(path)
        except InputError as e:
            raise InputError(str(e).replace(str(path), str(u))) from None
