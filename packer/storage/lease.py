"""One writer at a time for a pack set in object storage: a lease object.

Servers differ in conditional writes (AWS S3 honours ``If-None-Match`` and ``If-Match`` on
PUT; ``rclone serve s3``, the test server, ignores both, as do older S3-compatible
servers), so writers are serialized without them:

* A writer puts ``<set>/.imgpack-lease/<random name>`` (a JSON note: host, boot id, pid
  and process start time; never a credential), then lists ``.imgpack-lease/``. If any
  other live lease is listed, it deletes its own and raises PackBusyError naming the
  other. Each writer puts before it lists and listings are strongly consistent (S3, GCS,
  Azure, rclone over a folder), so two writers can never both list only their own: at
  most one proceeds (both may back off; the same command run again then goes ahead).
* A held lease is put again every :data:`REFRESH` seconds by a daemon thread. A lease
  whose last write (the server's clock, as listed) is more than :data:`TTL` seconds
  older than the new one's is a dead writer's, and is removed; so is, at once, a lease
  of this machine (same host and boot id) whose process is gone (a killed build's, when
  the same command runs again).
* Before the holder commits (puts the set's index) and again before its clean-up, it
  checks that its lease is still listed, was refreshed, and that no other live lease
  is: otherwise PackBusyError, and nothing is committed or deleted.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import uuid
from typing import Any

from ..errors import PackBusyError, StorageError
from ..pack.files import loads_json
from .client import NotFound, ObjectStore, TooLarge

log = logging.getLogger(__name__)

LEASE_DIR = ".imgpack-lease"
TTL = 120.0  # seconds since its last refresh after which another writer's lease is dead
REFRESH = 30.0  # seconds between two refreshes of a held lease
_NOTE_BYTES = 4096


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot) from /proc, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return None


class Lease:
    """The lease of one writer on the set at ``client.url`` (see the module docstring):
    :meth:`acquire`, :meth:`check` before each commit, :meth:`release` at the end."""

    def __init__(self, client: ObjectStore) -> None:
        self.client = client
        self.name = uuid.uuid4().hex
        self.key = f"{LEASE_DIR}/{self.name}"
        pid = os.getpid()
        self.note = {
            "host": socket.gethostname(),
            "boot": _boot_id(),
            "pid": pid,
            "start": _start_time(pid),
        }
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lost: BaseException | None = None

    # ------------------------------------------------------------ the protocol

    def acquire(self) -> None:
        """Put this lease and proceed only if no other live one is listed; PackBusyError
        (this lease removed) if one is."""
        self.client.put(json.dumps(self.note).encode(), LEASE_DIR, self.name)
        try:
            other = self._other_live()
        except BaseException:
            self._delete()
            raise
        if other is not None:
            self._delete()
            raise self._busy(other)
        self._thread = threading.Thread(target=self._refresh, daemon=True, name="imgpack-lease")
        self._thread.start()

    def check(self) -> None:
        """Before a commit: PackBusyError unless this lease is still the only live one."""
        if self._lost is not None:
            raise PackBusyError(
                f"{self.client.url}: the lease on the set could not be renewed "
                f"({self._lost}); nothing was committed, run the same command again"
            )
        other = self._other_live()
        if other is not None:
            raise self._busy(other, lost=True)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        self._delete()

    def __enter__(self) -> Lease:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    # ------------------------------------------------------------ inside

    def _refresh(self) -> None:
        while not self._stop.wait(REFRESH):
            try:
                self.client.put(json.dumps(self.note).encode(), LEASE_DIR, self.name)
            except Exception as e:  # told at the next check, before a commit
                self._lost = e

    def _delete(self) -> None:
        try:
            self.client.delete(LEASE_DIR, self.name)
        except (StorageError, OSError) as e:  # it expires after TTL
            log.warning("%s: could not remove the lease (%s)", self.client.url.child(self.key), e)

    def _other_live(self) -> dict[str, Any] | None:
        """The note of another live lease, or None. Dead ones are removed."""
        times = dict(self.client.list_times(LEASE_DIR))
        mine = times.pop(self.key, None)
        if mine is None:
            raise PackBusyError(
                f"{self.client.url}: this build's lease on the set was removed (it was not "
                f"renewed for {TTL:.0f} s); nothing was committed, run the same command again"
            )
        for key, when in sorted(times.items()):
            note = self._read(key)
            if note is None:
                continue  # released meanwhile
            if mine - when > TTL or self._dead_here(note):
                log.info("removing the lease of a writer that is gone: %s", note)
                self.client.delete(*key.split("/"))
                continue
            note["age"] = max(0.0, mine - when)
            return note
        return None

    def _read(self, key: str) -> dict[str, Any] | None:
        try:
            data = self.client.get(*key.split("/"), max_bytes=_NOTE_BYTES)
            note = loads_json(data)
            return note if isinstance(note, dict) else {}
        except NotFound:
            return None
        except (TooLarge, ValueError, UnicodeDecodeError):
            return {}  # not imgpack's note: live until it expires

    def _dead_here(self, note: dict[str, Any]) -> bool:
        """A lease of this machine (host and boot) whose process is gone."""
        if note.get("host") != self.note["host"] or not self.note["boot"]:
            return False
        if note.get("boot") != self.note["boot"]:
            return False
        pid = note.get("pid")
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            return False
        return _start_time(pid) != note.get("start")

    def _busy(self, other: dict[str, Any], lost: bool = False) -> PackBusyError:
        who = (
            f"host {other.get('host', '?')!s:.100}, pid {other.get('pid', '?')!s:.20}, "
            f"renewed {other.get('age', 0.0):.0f} s ago"
        )
        what = "nothing was committed" if lost else "nothing was changed"
        return PackBusyError(
            f"{self.client.url}: another imgpack build is writing this set ({who}); "
            f"{what}: run the same command again when it has finished (a lease whose "
            f"writer died expires {TTL:.0f} s after its last renewal)"
        )
