"""Open a pack set in object storage: ``packer.load("s3://bucket/prefix")``.

The index is downloaded once per open (a warm cache makes no other request until a
shard's big file is wanted); each shard's small files are fetched if the cache lacks
them or they differ (manifest against the index's SHA-256, labels, targets and the JPEG
index files against the manifest), in parallel. The result is a
:class:`~packer.storage.packset.PackSet` whose root is the set's folder in the cache and
whose store is a :class:`~packer.storage.cache.RemoteShards`.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import itertools
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..errors import DiskFullError, InputError, PackerError, PackFormatError, UsageError
from ..pack.describe import describe_set
from ..pack.files import JSONNestingError, loads_json
from ..pack.index import (
    INDEX,
    MAX_INDEX_BYTES,
    SetIndex,
    manifest_digest,
    read_shard_manifest,
)
from ..pack.kinds import kind_of
from ..pack.schema import (
    DATA_DIR,
    MANIFEST,
    MANIFEST_BASE_BYTES,
    MANIFEST_BYTES_PER_IMAGE,
    MAX_MANIFEST_BYTES,
    MAX_META_BYTES,
    Manifest,
)
from .cache import META_DIR, RemoteShards, default_cache_dir, flocked
from .client import NotFound, ObjectStore, Retry, TooLarge, open_store
from .packset import PackSet
from .url import StorageURL, parse_url
from .verify import check_small_file, small_files

OPEN_THREADS = 8  # small files fetched in parallel when a set is opened cold
MAX_CLASS_FILE_BYTES = 64 << 20  # --classes s3://.../classes.txt
POINTER = "url"  # in a set's cache folder: its URL, signed (see pointer_key)
_counter = itertools.count()


def pointer_key(create: bool = True) -> bytes | None:
    """This user's secret for signing cache pointers (``<default cache>/pointer.key``,
    32 random bytes, mode 0600, made once). A set's cache folder names its URL in
    ``.imgpack-cache/url`` with an HMAC of the URL and the folder's real path under this
    key: only a pointer this user's imgpack wrote, in the folder it wrote it to, makes a
    local path contact object storage (:func:`reopen_cached`). ``create=False``: None
    if there is none yet (checking a pointer writes nothing)."""
    path = default_cache_dir() / "pointer.key"
    try:
        data = path.read_bytes()
        if len(data) == 32:
            return data
    except FileNotFoundError:
        if not create:
            return None
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".pointer.key.{os.getpid()}.{next(_counter)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, os.urandom(32))
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # never replaces a key another process made first
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    data = path.read_bytes()
    if len(data) != 32:
        raise InputError(f"{path}: not imgpack's pointer key (remove it: a new one is made)")
    return data


def _pointer(url: str, root: Path, key: bytes) -> bytes:
    sign = hmac.new(key, f"{url}\0{root.resolve()}".encode(), hashlib.sha256)
    return f"{url}\n{sign.hexdigest()}\n".encode()


def read_pointer(root: Path) -> str | None:
    """The URL the cache folder ``root`` caches, if its pointer is one this user's
    imgpack signed for this very folder; None otherwise (a planted or copied pointer:
    the folder is then only a local folder)."""
    try:
        from ..pack.files import read_bounded

        data = read_bounded(root, root / META_DIR / POINTER, 4096)
        url = data.decode("utf-8").split("\n")[0]
    except (PackFormatError, OSError, UnicodeDecodeError, ValueError):
        return None
    key = pointer_key(create=False)
    if key is None or not hmac.compare_digest(_pointer(url, root, key), data):
        return None
    return url


def set_cache_root(url: StorageURL, client: ObjectStore, cache_dir: Any = None) -> Path:
    """The set's folder in the cache (created): ``cache_dir/sets/<hash of URL>``, with
    its signed pointer (:func:`pointer_key`)."""
    base = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    root = base / "sets" / url.cache_key(client.endpoint)
    try:
        (root / META_DIR / "tmp").mkdir(parents=True, exist_ok=True)
        note = root / META_DIR / POINTER
        want = _pointer(str(url), root, pointer_key())  # type: ignore[arg-type]
        if not note.is_file() or note.read_bytes() != want:
            _write(note, want, root, "url")
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
        data = client.get(INDEX, max_bytes=MAX_INDEX_BYTES)
    except NotFound:
        raise PackFormatError(
            f"{url}: not a pack set ({INDEX} is missing); build one with "
            f"`imgpack build SRC {url} --shard-size SIZE`"
        ) from None
    except TooLarge as e:
        raise PackFormatError(
            f"{url}/{INDEX}: {e.size:,} bytes, larger than an index can be "
            f"({MAX_INDEX_BYTES:,}); refused before reading it"
        ) from None
    try:
        raw = loads_json(data)
    except JSONNestingError:
        raise PackFormatError(f"{url}/{INDEX} is nested too deeply to be an index") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise PackFormatError(f"{url}/{INDEX} is not valid JSON ({e})") from None
    return SetIndex.from_json(raw, where=f"{url}/{INDEX}"), data


def _get_checked(client: ObjectStore, name: str, rel: str, cap: int, check: Any) -> bytes:
    """An object of shard ``name``, at most ``cap`` bytes (refused by its size before
    it is read); fetched a second time if ``check(data)`` names a problem, then
    PackFormatError naming the object."""
    for _ in (1, 2):
        try:
            data = client.get(name, *rel.split("/"), max_bytes=cap)
        except NotFound:
            raise PackFormatError(
                f"{client.url.child(name, rel)} is missing from the bucket; the set is "
                "incomplete, rebuild it"
            ) from None
        except TooLarge as e:
            raise PackFormatError(
                f"{client.url.child(name, rel)}: {e.size:,} bytes, more than it can be "
                f"({cap:,}); refused before reading it, rebuild the set"
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
        if kind_of(m).check_index(shard, m) is not None:  # its index files, if any
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
            if manifest_digest(data) != entry.sha256:
                return "does not match the SHA-256 the index gives"
            return None

        data = _get_checked(
            client, entry.name, MANIFEST, remote_manifest_cap(entry.count), manifest_ok
        )
        try:
            m = Manifest.from_json(
                loads_json(data), where=f"{client.url.child(entry.name, MANIFEST)}"
            )
        except (ValueError, UnicodeDecodeError) as e:
            raise PackFormatError(
                f"{client.url.child(entry.name, MANIFEST)}: not valid JSON ({e})"
            ) from None
        sizes = {
            f"{DATA_DIR}/{f.file}": (m.count if f.rows is None else f.rows) * f.row_bytes
            for f in m.fields
        }
        if m.dense is not None:  # each dense file's recorded size (the manifest was checked)
            sizes.update({f"{DATA_DIR}/{k}": b for k, (b, _sha) in m.dense.files.items()})
        for rel in small_files(m)[:-1]:
            body = _get_checked(
                client,
                entry.name,
                rel,
                sizes.get(rel, MAX_META_BYTES),
                lambda b, rel=rel: check_small_file(rel, b, m, shard),
            )
            _write(shard / rel, body, root, entry.name)
        problem = kind_of(m).check_index(shard, m)
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
    pool = ThreadPoolExecutor(min(OPEN_THREADS, len(index.shards)))
    try:
        manifests = list(
            pool.map(lambda k: _fetch_small(client, root, index, k), range(len(index.shards)))
        )
    except BaseException:
        client.cancel()  # Ctrl-C or an error: the other fetches end now, not after their tries
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    kw = {} if prefetch_depth is None else {"prefetch_depth": prefetch_depth}
    store = RemoteShards(root, index, manifests, client, limit=cache_limit, **kw)
    return PackSet(root, index, manifests, store)


def remote_manifest_cap(count: int) -> int:
    """The most bytes a shard's manifest in a bucket may have: the reader's allowance
    for ``count`` images (as a local pack's), never above MAX_MANIFEST_BYTES."""
    return min(MAX_MANIFEST_BYTES, MANIFEST_BASE_BYTES + MANIFEST_BYTES_PER_IMAGE * count)


def reopen_cached(root: Path) -> Any:
    """The set whose cache folder is ``root`` (``cache_dir/sets/<key>``), as the process
    that opened it left it (a DataLoader worker reopening a PackDataset's path): the
    cached index and small files, checked, no request; shards not cached are fetched from
    the URL recorded in the folder, with this process's settings, when wanted. No cache
    limit (the opener's is not recorded).

    Only a pointer this user's imgpack signed for this folder (:func:`read_pointer`) is
    followed: any other folder holding ``.imgpack-cache/url`` opens as the local pack or
    set it is, and nothing is contacted or written outside it."""
    from ..pack.index import read_index

    url = read_pointer(root)
    if url is None:
        return _open_local(root)
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
    """``imgpack info URL --json``: :func:`~packer.pack.describe.describe_set` of the
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
        data = client.get(MANIFEST, max_bytes=MANIFEST_BASE_BYTES)
        m = Manifest.from_json(loads_json(data), where=f"{u}/{MANIFEST}")
        return list(m.classes)
    except NotFound:
        pass
    except TooLarge as e:
        raise InputError(f"{e} (given as a class map)") from None
    except (PackerError, ValueError) as e:
        raise InputError(f"{u}/{MANIFEST}: {e} (given as a class map)") from None
    if not u.prefix:
        raise InputError(f"{u}: holds no pack set or pack to take the class map from")
    parent, _, name = u.prefix.rpartition("/")
    holder = open_store(StorageURL(u.scheme, u.bucket, parent))
    try:
        text = holder.get(name, max_bytes=MAX_CLASS_FILE_BYTES)
    except NotFound:
        raise InputError(
            f"{u}: no pack set, pack or class-map file there; give a set, a pack or a text "
            "file with one class per line"
        ) from None
    except TooLarge as e:
        raise InputError(f"{e}: too large for a class map (given as a class map)") from None
    import tempfile

    from ..sources.classes import read_class_file

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / (name or "classes.txt")
        path.write_bytes(text)
        try:
            return read_class_file(path)
        except InputError as e:
            raise InputError(str(e).replace(str(path), str(u))) from None


def _open_local(root: Path) -> Any:
    """``root`` opened as the local pack or set it is (its cache pointer ignored)."""
    from ..pack.files import check_files, read_manifest
    from ..pack.index import is_set
    from ..pack.reader import open_pack
    from .packset import open_set

    if is_set(root) and not (root / MANIFEST).exists():
        try:
            return open_set(root)
        except PackFormatError as e:
            raise PackFormatError(
                f"{e} ({root}/{META_DIR}/{POINTER} names a set in object storage, but not "
                "one this user's imgpack cached here: it is ignored; load the set by its URL)"
            ) from None
    m = read_manifest(root)
    check_files(root, m)
    return open_pack(root, m)
