"""The servers and clusters a test session starts, recorded so that none outlives the run
however it ends (issue 43): each started process writes a record (its PID, its start time,
whether it leads a process group of its own, and the pytest process that owns it) into
a folder of the user's temporary directory. The session's finalizer stops what is still
running; a session killed outright (SIGKILL: no finalizer runs) leaves its records, and
the next session stops those processes at its start, once their owner is gone.

A PID is only ever signalled when its start time is the recorded one (a reused PID is
someone else's process); a process group, only its members started since its leader.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
import time
from pathlib import Path

RECORDS = Path(tempfile.gettempdir()) / f"imgpack-test-processes-{os.getuid()}"


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state first), or None if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), None if it is gone or a zombie."""
    st = _stat(pid)
    return None if st is None or st[0] == "Z" else int(st[19])


def track(pid: int, group: bool = False) -> Path:
    """Record ``pid`` (``group``: the leader of a process group of its own, stopped with
    its members) as started by this process."""
    RECORDS.mkdir(mode=0o700, exist_ok=True)
    record = {"owner": os.getpid(), "owner_start": start_time(os.getpid()), "pid": pid,
              "start": start_time(pid), "group": group}  # fmt: skip
    path = RECORDS / f"{os.getpid()}-{pid}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)
    return path


def _members(record: dict) -> list[int]:
    """The live processes ``record`` names: its PID if it is still that process, and with
    ``group``, its group's members started since it."""
    pid, start = record["pid"], record["start"]
    out = [pid] if start is not None and start_time(pid) == start else []
    if record["group"] and start is not None:
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != pid:
                st = _stat(int(entry))
                if st and st[0] != "Z" and int(st[2]) == pid and int(st[19]) >= start:
                    out.append(int(entry))
    return out


def stop(path: Path, grace: float = 5.0) -> None:
    """Stop what the record at ``path`` names (SIGTERM, then SIGKILL after ``grace``)
    and remove the record."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        path.unlink(missing_ok=True)
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        members = _members(record)
        for pid in members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        end = time.monotonic() + (grace if sig == signal.SIGTERM else 0)
        while members and time.monotonic() < end:
            time.sleep(0.05)
            members = _members(record)
        if not members:
            break
    path.unlink(missing_ok=True)


def untrack(path: Path) -> None:
    path.unlink(missing_ok=True)


def stop_mine() -> None:
    """The session's finalizer: stop everything this process started and still runs."""
    for path in RECORDS.glob(f"{os.getpid()}-*.json"):
        stop(path)


def reap_leftovers() -> list[int]:
    """At a session's start: stop what sessions that are gone left running. Returns the
    PIDs of the records stopped."""
    out = []
    for path in RECORDS.glob("*.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        owner = record.get("owner")
        if owner == os.getpid() or (
            record.get("owner_start") is not None and start_time(owner) == record["owner_start"]
        ):
            continue  # a session still running (another checkout's, say)
        out.append(record["pid"])
        stop(path)
    return out
