"""A build's phases on one clock, for benchmarks: when each step of a build ended.

``time.perf_counter`` is ``CLOCK_MONOTONIC`` on Linux, one clock for every process of
the machine, so a benchmark that starts ``imgpack build`` can set the build's phases
beside its own clock readings (the process's launch and exit) and see where the wall
time between them went: interpreter start and imports, the scan, the pool's start,
the first and last chunk, the final fsync, the manifest, the rename, the exit.

:class:`Timeline` is filled by :func:`packer.builder.run.build` into
``BuildResult.extra["timeline"]`` (seconds since the build was called, in the order
the phases ended) and ``BuildResult.extra["t0_monotonic"]`` (that call's clock
reading). With ``IMGPACK_BUILD_TIMELINE=FILE`` in its environment, ``imgpack build``
also writes :func:`cli_timeline`'s JSON to FILE (:func:`write_cli_timeline`): the
library's phases and the command's own readings (module imported, build called,
build returned, result printed). Unset, nothing is written.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from .._fs import write_atomic

TIMELINE_ENV = "IMGPACK_BUILD_TIMELINE"


class Timeline:
    """The ends of a build's phases, as seconds since ``t0`` (a ``perf_counter`` reading).
    A phase marked twice keeps its first mark (a retried step does not move it)."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self._marks: dict[str, float] = {}

    def mark(self, phase: str, at: float | None = None) -> None:
        """``phase`` ended now (or at the ``perf_counter`` reading ``at``)."""
        if phase not in self._marks:
            self._marks[phase] = time.perf_counter() if at is None else at

    def as_dict(self) -> dict[str, float]:
        """Seconds since ``t0`` per phase, in clock order."""
        ends = sorted(self._marks.items(), key=lambda kv: kv[1])
        return {k: round(v - self.t0, 4) for k, v in ends}


def cli_timeline(marks: dict[str, float], extra: dict[str, Any]) -> dict[str, Any]:
    """The command's own ``perf_counter`` readings (``marks``) with the library's
    timeline (``extra`` of the BuildResult), every phase as an absolute clock reading
    (``monotonic``) so that a caller subtracts its own launch time."""
    t0 = extra.get("t0_monotonic")
    phases = dict(marks)
    if t0 is not None:
        phases.update({k: t0 + v for k, v in extra.get("timeline", {}).items()})
    ordered = dict(sorted(phases.items(), key=lambda kv: kv[1]))
    return {"monotonic": ordered, "extra": extra}


def write_cli_timeline(marks: dict[str, float], extra: dict[str, Any]) -> None:
    """:func:`cli_timeline` to the file ``IMGPACK_BUILD_TIMELINE`` names (written to a
    temporary name and renamed); nothing when it is unset."""
    path = os.environ.get(TIMELINE_ENV)
    if path:
        write_atomic(path, json.dumps(cli_timeline(marks, extra)).encode())
