"""The bounded local cache of a remote pack set, shared by every process of a node.

Layout (``cache_dir/sets/<key>/`` is the :class:`~packer.storage.packset.PackSet`'s root,
``<key>`` a hash of the URL and endpoint, never a credential)::

    sets/<key>/imgpack-set.json          the index, downloaded once per load
    sets/<key>/<shard>/...               each shard's small files (always) and its big
                                         data file (images.memmap / jpeg.memmap) when cached
    sets/<key>/.imgpack-cache/
        url                              the URL, for people looking at the cache
        <shard>.fetch                    flock: held (exclusive) while fetching the shard
        <shard>.use                      flock: shared while a reader has it mapped; its
                                         mtime is the shard's last use (LRU)
        <shard>.reserved                 bytes a download in flight will add (see below)
        evict.lock                       flock: one evictor at a time
        tmp/<shard>.<pid>.<n>.part       downloads in progress (never mapped)
        downloads.log                    one line per big file downloaded (pid, shard, bytes)

Rules:

* A big file is downloaded to ``tmp/``, checked against the manifest's SHA-256 of every
  block, and renamed into place: a file at its final name is whole and checked. A
  failed check fetches it once more, then raises PackFormatError naming the object.
* The ``.fetch`` lock makes one process of the node download a shard while the others
  wait for it: each shard is downloaded once. The holder removes ``tmp/`` files of that
  shard left by a killed run (only the holder writes them).
* A reader takes the ``.use`` lock shared before it looks for the file and keeps it
  until :meth:`RemoteShards.release`. The evictor takes it exclusive, non-blocking: a
  shard some process has mapped is never evicted. flock locks die with their process,
  so a killed run leaves no stale lock, only ``.part`` files that the next fetch removes.
* Beyond ``limit`` bytes of big files, the least recently used shards nobody holds lose
  their big file (small files stay). A download first reserves its bytes
  (``<shard>.reserved``, under ``evict.lock``, while it holds the ``.fetch`` lock; a
  reader without a limit too), renames its file into place, then removes the
  reservation; every evictor reads the reservations, then the files (under
  ``evict.lock``), and counts a shard found both ways once: a download in flight or
  just ended is counted once, never missed (it was, when the files came first and it
  ended between the reads), so concurrent downloads stay under the limit together. A
  reservation whose ``.fetch`` lock is free is a killed run's and is removed. A fetch
  on demand that cannot make room (every cached shard is held) goes over the limit and
  logs a warning; a prefetch does not.
* :attr:`RemoteShards.prefetch_depth` (:data:`PREFETCH_DEPTH`) shards are fetched ahead
  on background threads; a prefetch that fails is retried, and raises, on demand.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from .._fs import fsync_dir
from ..errors import DiskFullError, PackBusyError, PackFormatError
from ..pack.index import SetIndex
from ..pack.schema import DATA_DIR, Manifest
from .client import NotFound, ObjectStore, TooLarge
from .packset import ShardStore
from .verify import big_field, check_big_file

log = logging.getLogger(__name__)

PREFETCH_DEPTH = 2  # shards fetched ahead of need, on as many background threads
META_DIR = ".imgpack-cache"
DOWNLOAD_LOG = "downloads.log"
LOCK_TIMEOUT = 600.0  # seconds a reader waits for another process's download of a shard
_counter = itertools.count()


_PREFETCH_AHEAD_S = 3600.0  # a prefetched shard's LRU stamp, this far past its fetch


def _kept_locks() -> int:
    """How many kept shards' ``.use`` locks (one descriptor each) the readers without a
    limit of this process hold at most, all together (two sets, train and val, share
    it): a quarter of this process's descriptors, 64 to 4,096."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return 4096
    return max(64, min(4096, soft // 4))


# kept locks held now by every reader of this process (bounded by _kept_locks())
_kept_held = 0
_kept_mutex = threading.Lock()


def _take_kept_slot() -> bool:
    global _kept_held
    with _kept_mutex:
        if _kept_held >= _kept_locks():
            return False
        _kept_held += 1
        return True


def _give_kept_slots(n: int) -> None:
    global _kept_held
    if n:
        with _kept_mutex:
            _kept_held = max(0, _kept_held - n)


def default_cache_dir() -> Path:
    """``$IMGPACK_CACHE_DIR``, else ``$XDG_CACHE_HOME/imgpack``, else ``~/.cache/imgpack``."""
    if os.environ.get("IMGPACK_CACHE_DIR"):
        return Path(os.environ["IMGPACK_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "imgpack"


@contextlib.contextmanager
def flocked(path: Path, shared: bool = False, timeout: float = LOCK_TIMEOUT) -> Iterator[int]:
    """Hold an flock on ``path`` (created) for the block. Waits at most ``timeout``
    seconds (polling: flock has no timeout), then PackBusyError."""
    fd = _lock(path, shared, timeout)
    try:
        yield fd
    finally:
        os.close(fd)


def _lock(path: Path, shared: bool, timeout: float) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    op = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        try:
            fcntl.flock(fd, op)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                raise PackBusyError(
                    f"{path}: another process has held this cache lock for {timeout:.0f} s; "
                    "if no imgpack process is running, report it (a lock dies with its process)"
                ) from None
            time.sleep(delay)
            delay = min(0.1, delay * 2)


def _try_lock(path: Path) -> int | None:
    """An exclusive flock on ``path`` if nobody holds it now, else None."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except BlockingIOError:
        os.close(fd)
        return None


class RemoteShards(ShardStore):
    """The shards of a remote set, fetched into ``root`` (a set folder of the cache)
    on demand and ahead of need, bounded by ``limit`` bytes of big data files.

    ``client``: an :class:`~packer.storage.client.ObjectStore`, or a function making one
    when a download needs it.
    ``fetch(k)`` -> the shard's folder, its big file whole and checked, held (the
    ``.use`` lock) until as many ``release(k)``; see the module docstring for the rules.
    Counters for measurements: ``downloads`` and ``downloaded_bytes`` (this process)."""

    remote = True
    # called with each piece's size while a big file downloads (a progress bar; the
    # tests kill the server there)
    on_download: Callable[[int], None] | None = None

    def __init__(
        self,
        root: Path,
        index: SetIndex,
        manifests: Sequence[Manifest],
        client: ObjectStore | Callable[[], ObjectStore],
        limit: int | None = None,
        prefetch_depth: int = PREFETCH_DEPTH,
    ) -> None:
        self.root = root
        self.index = index
        self.manifests = list(manifests)
        self._client = client
        self.limit = limit
        self.prefetch_depth = prefetch_depth
        self.meta = root / META_DIR
        (self.meta / "tmp").mkdir(parents=True, exist_ok=True)
        self.downloads = 0
        self.downloaded_bytes = 0
        self._mutex = threading.Lock()
        # one thread of this process fetches a shard; the others wait for it (the flocks
        # order processes, these order threads that share one pin count)
        self._shard_locks: dict[int, threading.Lock] = {}
        self._pins: dict[int, int] = {}
        self._use_fds: dict[int, int] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._queued: dict[int, Future[None]] = {}
        self._closed = False
        # shards fetched whose .use lock this reader keeps while it keeps them mapped
        # (keeps_released): a next fetch is a count
        self._kept: set[int] = set()
        self.kept_locks = _kept_locks()
        self._kept_held: set[int] = set()  # kept shards whose lock is kept (counted)
        self._paths = [root / e.name for e in index.shards]

    @property
    def client(self) -> ObjectStore:
        """The object-storage client, made on first use (a set reopened from its cache
        folder needs none while its shards are cached)."""
        if not isinstance(self._client, ObjectStore):
            self._client = self._client()
        return self._client

    # ------------------------------------------------------------ paths

    def _name(self, k: int) -> str:
        return self.index.shards[k].name

    def _big(self, k: int) -> Path:
        return self.root / self._name(k) / DATA_DIR / big_field(self.manifests[k]).file

    def _size(self, k: int) -> int:
        """Bytes of shard ``k``'s big file, as its manifest gives."""
        spec = big_field(self.manifests[k])
        return (self.manifests[k].count if spec.rows is None else spec.rows) * spec.row_bytes

    def _present(self, k: int) -> bool:
        try:
            return self._big(k).stat().st_size == self._size(k)
        except FileNotFoundError:
            return False

    # ------------------------------------------------------------ the seam

    @property
    def keeps_released(self) -> bool:
        """With no limit this reader never evicts: a shard it let go of stays mapped, so
        the next epoch neither checks, opens nor maps it again (it is the bytes the
        index's hash checked), and a later ``fetch`` of it is a count (no lock, stat
        or request: a warm epoch costs no system call per shard). It keeps the
        shard's ``.use`` lock with the mapping (until :meth:`close`; for at most
        :attr:`kept_locks` shards, one descriptor each): the file is in use, so
        another process with a limit does not delete it (which would free no disk
        while it is mapped)."""
        return self.limit is None

    def kept(self, k: int) -> bool:
        """Whether shard ``k`` is fetched, checked and kept by this reader for good
        (:attr:`keeps_released`): a fetch of it is a count."""
        return k in self._kept

    def fetch(self, k: int) -> Path:
        with self._mutex:
            if self._closed:
                raise RuntimeError("the remote set was closed")
            if k in self._kept:  # fetched and still locked by this reader: a count
                self._pins[k] += 1
                return self._paths[k]
            lock = self._shard_locks.setdefault(k, threading.Lock())
        with lock:
            with self._mutex:
                held = self._pins.get(k, 0)
                self._pins[k] = held + 1
            if not held:
                self._first_fetch(k)
                if self.keeps_released:
                    with self._mutex:
                        self._kept.add(k)
        return self._paths[k]

    def _first_fetch(self, k: int) -> None:
        try:
            # held before looking: from here on no process can evict the shard
            fd = _lock(self.meta / f"{self._name(k)}.use", shared=True, timeout=LOCK_TIMEOUT)
            with self._mutex:
                closed = self._closed  # while this waited: the lock is not the store's
                if not closed:
                    self._use_fds[k] = fd
            if closed:
                os.close(fd)
                raise RuntimeError("the remote set was closed")
            os.utime(fd)  # the LRU stamp
            if not self._present(k):
                self._download(k, demand=True)
        except BaseException:
            self.release(k)
            raise

    def release(self, k: int) -> None:
        with self._mutex:
            left = self._pins.get(k, 0) - 1
            if left < 0:
                return
            self._pins[k] = left
            # a kept shard keeps its lock (keeps_released), up to kept_locks of them;
            # any other lets go at 0 (a kept one past the cap is still read from its
            # mapping: another process deleting the file frees its disk when we close)
            # (the process's count, across readers, too: :func:`_kept_locks`)
            fd = None
            if left == 0 and k not in self._kept_held and k in self._use_fds:
                keep = k in self._kept and len(self._use_fds) <= self.kept_locks
                if keep and _take_kept_slot():
                    self._kept_held.add(k)
                else:
                    fd = self._use_fds.pop(k)
        if fd is not None:
            os.close(fd)  # drops the shared lock: the shard may now be evicted

    def prefetch(self, ks: Sequence[int]) -> None:
        with self._mutex:
            if self._closed or self.prefetch_depth < 1:
                return
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.prefetch_depth, "imgpack-prefetch")
            for k in list(ks)[: self.prefetch_depth]:
                if k in self._use_fds or k in self._kept:
                    continue  # held or kept by this reader (present, or being fetched)
                if k in self._queued and not self._queued[k].done():
                    continue
                if self._present(k):
                    continue
                self._queued[k] = self._pool.submit(self._prefetch_one, k)

    def close(self) -> None:
        with self._mutex:
            self._closed = True
            pool, self._pool = self._pool, None
            fds = list(self._use_fds.values())
            self._use_fds.clear()
            self._pins.clear()
            self._kept.clear()
            held, self._kept_held = len(self._kept_held), set()
        _give_kept_slots(held)
        if pool is not None:
            if isinstance(self._client, ObjectStore):
                self._client.cancel()  # prefetches in flight end now (they were hints)
            pool.shutdown(wait=True, cancel_futures=True)
        for fd in fds:
            os.close(fd)
        self._run_close_hooks()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    # ------------------------------------------------------------ fetching

    def _prefetch_one(self, k: int) -> None:
        try:
            with flocked(
                self.meta / f"{self._name(k)}.use", shared=True, timeout=LOCK_TIMEOUT
            ) as fd:
                if not self._present(k):
                    self._download(k, demand=False)
                # wanted soon: stamped ahead of every shard in use, so a full cache evicts
                # the shards already read before the ones about to be (a reader's first
                # fetch stamps it with the time of that use)
                now = time.time() + _PREFETCH_AHEAD_S
                os.utime(fd, (now, now))
        except Exception as e:  # fetched again, and raised, when the shard is wanted
            log.debug("prefetch of shard %s failed: %s", self._name(k), e)

    def _download(self, k: int, demand: bool) -> None:
        """Fetch shard ``k``'s big file into place (under its ``.fetch`` lock)."""
        name = self._name(k)
        m = self.manifests[k]
        spec = big_field(m)
        with flocked(self.meta / f"{name}.fetch"):
            if self._present(k):
                return  # another process (or thread) fetched it while we waited
            for old in (self.meta / "tmp").glob(f"{name}.*.part"):
                old.unlink(missing_ok=True)  # a killed run's: only the lock holder writes them
            size = (m.count if spec.rows is None else spec.rows) * spec.row_bytes
            reservation = self.meta / f"{name}.reserved"
            if not self._make_room(size, k, demand):
                return  # a prefetch is a hint: it never pushes the cache over its limit
            try:
                n = self._download_checked(k)
            finally:
                reservation.unlink(missing_ok=True)
            self._log(f"{os.getpid()} {name} {n}")

    def _download_checked(self, k: int) -> int:
        """Download, check and rename shard ``k``'s big file (fetched twice at most)."""
        name = self._name(k)
        m = self.manifests[k]
        key = (name, DATA_DIR, big_field(m).file)
        problem = None
        for attempt in (1, 2):
            tmp = self.meta / "tmp" / f"{name}.{os.getpid()}.{next(_counter)}.part"
            try:
                try:
                    n = self.client.download(
                        tmp, *key, progress=self.on_download, max_bytes=self._size(k)
                    )
                except TooLarge as e:
                    raise PackFormatError(
                        f"{e.where}: more bytes than the manifest gives ({self._size(k):,}); "
                        "refused before they fill the disk, rebuild the set"
                    ) from None
                except NotFound:
                    raise PackFormatError(
                        f"{self.client.url.child(*key)} is missing from the bucket; the set "
                        "is incomplete, rebuild it"
                    ) from None
                problem = check_big_file(tmp, m, self.root / name)
                if problem is None:
                    with self._mutex:  # counted before a reader can see the shard
                        self.downloads += 1
                        self.downloaded_bytes += n
                    os.replace(tmp, self._big(k))
                    fsync_dir(self._big(k).parent)
                    return n
            finally:
                tmp.unlink(missing_ok=True)
            log.warning("%s: %s (try %d of 2)", self.client.url.child(*key), problem, attempt)
        raise PackFormatError(
            f"{self.client.url.child(*key)}: {problem}, twice; the object in the bucket is "
            "damaged, rebuild the set"
        )

    def _log(self, line: str) -> None:
        try:
            fd = os.open(self.meta / DOWNLOAD_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, (line + "\n").encode())  # one write: whole lines under O_APPEND
            finally:
                os.close(fd)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFullError(f"{self.meta}: the disk is full") from None
            raise

    # ------------------------------------------------------------ eviction

    def cached(self) -> list[tuple[float, str, Path, int]]:
        """(last use, shard name, big file, bytes) of each big file in this set's cache
        folder, oldest first (shards of an older index too)."""
        out = []
        for d in self.root.iterdir():
            if d.name.startswith(".") or not d.is_dir():
                continue
            for f in ("images.memmap", "jpeg.memmap"):
                p = d / DATA_DIR / f
                try:
                    size = p.stat().st_size
                except FileNotFoundError:
                    continue
                try:
                    used = (self.meta / f"{d.name}.use").stat().st_mtime
                except FileNotFoundError:
                    used = 0.0
                out.append((used, d.name, p, size))
        out.sort()
        return out

    def reservations(self, but: str) -> dict[str, int]:
        """{shard name: bytes} of big files being downloaded now (by any process), except
        shard ``but``'s: each download writes ``<shard>.reserved`` under its ``.fetch``
        lock; one whose lock is free is a killed run's, removed here."""
        out = {}
        for r in self.meta.glob("*.reserved"):
            name = r.name[: -len(".reserved")]
            if name == but:
                continue
            fd = _try_lock(self.meta / f"{name}.fetch")
            if fd is not None:  # nobody downloads it: a killed run's reservation
                try:
                    r.unlink(missing_ok=True)
                finally:
                    os.close(fd)
                continue
            try:
                out[name] = int(r.read_text() or 0)
            except (OSError, ValueError):
                pass
        return out

    def cached_bytes(self) -> int:
        return sum(c[3] for c in self.cached())

    def _make_room(self, need: int, k: int, demand: bool) -> bool:
        """Evict least recently used big files nobody holds until ``need`` more bytes fit
        under :attr:`limit` beside the downloads in flight, and reserve them (the caller
        holds shard ``k``'s ``.fetch`` lock and removes the reservation). Whether to download:
        when they fit, or when ``demand`` (then over the limit, with a warning)."""
        with flocked(self.meta / "evict.lock"):
            if self.limit is None:  # reserved all the same: counted by readers with one
                (self.meta / f"{self._name(k)}.reserved").write_text(str(need))
                return True
            # the reservations first, then the files: a download ends outside this lock
            # (its file in place, then its reservation gone), and a reservation appears
            # and a file goes only under it, so a download not seen reserved has its
            # file in place when the files are read; one seen both ways is its file
            reserved = self.reservations(but=self._name(k))
            entries = self.cached()
            files = {e[1] for e in entries}
            total = sum(e[3] for e in entries)
            total += sum(n for name, n in reserved.items() if name not in files)
            for _used, name, path, size in entries:
                if total + need <= self.limit:
                    break
                if name == self._name(k):
                    continue
                fd = _try_lock(self.meta / f"{name}.use")
                if fd is None:
                    continue  # some process has it mapped
                try:
                    path.unlink(missing_ok=True)
                    total -= size
                    log.debug("evicted shard %s (%d bytes)", name, size)
                finally:
                    os.close(fd)
            fits = total + need <= self.limit
            if not (fits or demand):
                return False
            # counted by the others' make-room until this download ends (or its process)
            (self.meta / f"{self._name(k)}.reserved").write_text(str(need))
            if not fits:
                log.warning(
                    "cache %s: %d bytes held by readers, shard %s needs %d more: over the "
                    "limit of %d bytes until they are released",
                    self.root,
                    total,
                    self._name(k),
                    need,
                    self.limit,
                )
            return True
