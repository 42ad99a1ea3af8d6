"""A real two-node Ray cluster on 127.0.0.1 for the tests (``ray start --head`` plus
``ray start --address``), each node with its own temp folder, free ports and one CPU,
no dashboard, no log monitor. Each node's ``ray start --block`` leads its own process
group, so a node is killed (SIGKILL: its raylet and agents; its workers exit with the
raylet) or stopped by that PID alone."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import processes

# a node found dead in about 2 s, not Ray's default 15 s (killed-node test)
_SYSTEM = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 500,
    "health_check_failure_threshold": 4,
}
_START_S = 90.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ports(gcs: int) -> list[str]:
    """The ports of a node's components; ``gcs``, the head's port, is never in the
    workers' range (Ray refuses to start where it is)."""
    base = gcs
    while base <= gcs <= base + 100:
        base = random.randint(30000, 45000)  # worker ports: a range, not one free port
    out = ["--min-worker-port", str(base), "--max-worker-port", str(base + 100)]
    taken = {gcs, *range(base, base + 101)}  # Ray refuses a component port in that range
    for flag in (
        "--node-manager-port",
        "--object-manager-port",
        "--dashboard-agent-listen-port",
        "--dashboard-agent-grpc-port",
        "--metrics-export-port",
        "--runtime-env-agent-port",
    ):
        port = _free_port()
        while port in taken:
            port = _free_port()
        taken.add(port)
        out += [flag, str(port)]
    return out


def _descendants(root: int) -> list[int]:
    """``root`` and every process below it (from /proc), parents first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


class Cluster:
    """``head`` and ``worker``: the two ``ray start --block`` processes."""

    def __init__(self, env: dict[str, str]) -> None:
        # a cluster of one user on 127.0.0.1 for the tests: Ray's token authentication
        # (on by default since 2.5x) would need the token in every process and ~/.ray
        self.env = {**env, "RAY_AUTH_MODE": "disabled"}
        self._auth = os.environ.get("RAY_AUTH_MODE")
        self.ray = str(Path(sys.executable).parent / "ray")
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.dirs: list[str] = []
        self.head: subprocess.Popen[bytes] | None = None
        self.worker: subprocess.Popen[bytes] | None = None
        self.worker_id: str | None = None  # the worker node's id, once started
        self.records: list[Path] = []  # tests/processes.py's records of the nodes

    def _node(self, *args: str) -> subprocess.Popen[bytes]:
        # short: Ray's Unix sockets live under it (a path of at most 107 bytes)
        tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
        self.dirs.append(tmp)
        cmd = [self.ray, "start", "--block", "--node-ip-address", "127.0.0.1", "--num-cpus", "1"]
        # no log monitor: the driver is started with log_to_driver=False, so the one
        # process that tails the workers' logs for it (a Python process a node, polling)
        # had nothing to do
        cmd += ["--temp-dir", tmp, "--disable-usage-stats", "--include-log-monitor", "false"]
        cmd += [*args, *_ports(self.port)]
        log = open(os.path.join(tmp, "start.log"), "wb")  # noqa: SIM115 (the node's lifetime)
        proc = subprocess.Popen(
            cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        # recorded: stopped with its group by the session's finalizer, or by the next
        # session if this one is killed outright (tests/processes.py)
        self.records.append(processes.track(proc.pid, group=True))
        return proc

    def _wait(self, what: str, ready: Any, proc: subprocess.Popen[bytes]) -> None:
        end = time.monotonic() + _START_S
        while not ready():
            if proc.poll() is not None or time.monotonic() > end:
                log = Path(self.dirs[-1], "start.log").read_text(errors="replace")
                raise RuntimeError(f"ray {what} did not start:\n{log[-3000:]}")
            time.sleep(0.05)

    def start(self) -> None:
        import ray

        self.head = self._node(
            "--head", "--port", str(self.port), "--include-dashboard", "false",
            "--system-config", json.dumps(_SYSTEM),
        )  # fmt: skip

        def gcs_up() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", self.port)) == 0

        self._wait("head", gcs_up, self.head)
        os.environ["RAY_AUTH_MODE"] = "disabled"  # this process is the driver
        ray.init(address=self.address, logging_level="ERROR", log_to_driver=False)
        # The driver prints cluster events (the killed node marked dead, a task
        # retried) on sys.stdout from a thread, seconds later: into whatever a later
        # test captures there (a CliRunner's --json). Not needed here: dropped for the
        # session (Ray's private function; a test-only patch, undone by stop()).
        from ray._private import worker

        self._print = worker.print_to_stdstream
        worker.print_to_stdstream = lambda data, **kw: None

    def alive(self) -> list[str]:
        import ray

        return [n["NodeID"] for n in ray.nodes() if n["Alive"]]

    def start_worker(self) -> None:
        # a node killed before may still count as alive until Ray's health check marks
        # it dead (seconds, more on a loaded machine): wait for the new node itself
        before = set(self.alive())
        self.worker = self._node("--address", self.address)
        self._wait("worker node", lambda: bool(set(self.alive()) - before), self.worker)
        self.worker_id = (set(self.alive()) - before).pop()
        self.warm()

    def warm(self) -> None:
        """One task on each node that imports what a shard task imports, so each node
        has a warm worker. Else a build of small shards can drain the queue on the
        head's warm worker while the other node's first worker still imports torch
        (its lease then cancelled): "both nodes ran tasks" would hang on timing."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        def load() -> str:  # nested: pickled by value (tests/ is not on the workers' path)
            import packer.builder.ray_engine
            import packer.builder.run  # noqa: F401

            return ray.get_runtime_context().get_node_id()

        task = ray.remote(load)
        # the head and the worker started last (not a killed one not yet marked dead)
        up = self.worker is not None and self.worker.poll() is None and self.worker_id
        nodes = [self.head_node(), *([self.worker_id] if up else [])]
        refs = [
            task.options(
                num_cpus=1, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
            ).remote()
            for node in nodes
        ]
        assert sorted(ray.get(refs)) == sorted(nodes)

    def head_node(self) -> str:
        """The head node's id (its object store socket lives in the head's temp dir)."""
        import ray

        head_dir = self.dirs[0]
        for n in ray.nodes():
            if n["Alive"] and str(n.get("ObjectStoreSocketName", "")).startswith(head_dir):
                return n["NodeID"]
        raise RuntimeError("the head node is not alive")

    def occupy_head(self, gate: Path) -> Any:
        """Take the head node's one CPU with a task that ends once ``gate`` exists, so
        tasks go to the worker node meanwhile; returns once it runs (its ref)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        started = gate.with_name(gate.name + ".started")

        def hold(gate: str, started: str) -> None:  # nested: pickled by value
            import os
            import time

            open(started, "w").close()
            while not os.path.exists(gate):  # a gate the test opens, not a timing guess
                time.sleep(0.02)

        strategy = NodeAffinitySchedulingStrategy(self.head_node(), soft=False)
        ref = ray.remote(hold).options(num_cpus=1, scheduling_strategy=strategy)
        ref = ref.remote(str(gate), str(started))
        end = time.monotonic() + _START_S
        while not started.exists():
            if time.monotonic() > end:
                raise RuntimeError("the head node's CPU could not be taken")
            time.sleep(0.02)
        return ref

    def ensure_worker(self) -> None:
        """Two nodes alive (a test before may have killed the worker node)."""
        if self.worker is None or self.worker.poll() is not None or len(self.alive()) < 2:
            self.start_worker()

    def worker_files(self) -> list[str]:
        """What the worker node's processes hold open now (paths; pipes and sockets too)."""
        assert self.worker is not None
        out = []
        for pid in _descendants(self.worker.pid):
            with contextlib.suppress(OSError):
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    with contextlib.suppress(OSError):
                        out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        return out

    def kill_worker(self) -> None:
        """SIGKILL every process of the worker node, as if the machine died: its
        ``ray start``, the raylet and agents, and the raylet's workers (each in a
        session of its own, found as the raylet's children)."""
        assert self.worker is not None
        for pid in _descendants(self.worker.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.worker.wait()

    def stop(self) -> None:
        import ray
        from ray._private import worker

        ray.shutdown()
        if hasattr(self, "_print"):
            worker.print_to_stdstream = self._print
        if self._auth is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = self._auth
        for p in (self.worker, self.head):
            if p is not None and p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        for record in self.records:
            processes.stop(record)  # a killed node's raylet or workers left in its group
        self.records.clear()
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)
