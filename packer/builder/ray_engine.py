"""``imgpack build --engine ray``: a pack set whose shards are built by Ray tasks.

Data flow::

    driver: scan + labels, cut into named shards (packer.builder.set_plan.plan_set, as the
    local build) -> one Ray task per shard not yet in place -> each task builds its
    shard with the local build into a work folder inside DST and renames it into place
    (shards.commit_shard) -> driver: the index, written last (shards.finish_set)

So the set is byte-identical to ``imgpack build SRC DST --shard-size ...`` on one
machine. SRC must be a folder every node reads at the same path (shard names hash
SRC's absolute path) or an object-store prefix of images, listed once by the driver
(:func:`packer.builder.upload.plan_bucket`; each task downloads its shard's images into a
node-local folder), DST a folder every node writes (a shared file system), or an
object-store URL: then each task builds its shard in a node-local temporary folder
and uploads it itself, with its node's credentials, and the driver fetches the
manifests for the index (:mod:`packer.builder.upload`).

Retries: a task whose worker or node dies is run again by Ray (``max_retries``), and
so is one that raised OSError (a shared file system's hiccup); the retry resumes the
dead attempt's work folder or finds the shard already in place. A shard that still
fails stops the build: the tasks left are cancelled, nothing of that shard is in
place, the index is not written, and the error names the shard and its first inputs.
Ctrl-C cancels the tasks the same way; the same command resumes.

Ray is imported here only, when a build asks for it: ``import packer`` and a local
build never load it.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import PackerError, ShardFailedError, UsageError, WorkerDiedError
from . import shards, upload
from .config import BuildConfig, _Labels
from .plan import plan_labels
from .set_plan import SetPlan, ShardSink
from .shards import SetEngine, ShardOutcome, commit_shard

log = logging.getLogger(__name__)

MAX_RETRIES = 3  # a task whose worker died (or raised OSError) runs up to 4 times
_SHOWN = 3  # inputs named in the error of a shard that failed
_CANCEL_WAIT_S = 30.0


def import_ray() -> Any:
    """The ``ray`` module, or UsageError naming the extra that installs it."""
    try:
        import ray
    except ImportError:
        raise UsageError(
            "BuildConfig.engine ray needs Ray, which is not installed: pip install 'imgpack[ray]'",
            field="BuildConfig.engine",
        ) from None
    return ray


def cluster_device(config: BuildConfig) -> Any:
    """The device the shards are decoded on, fixed by the driver (it is part of every
    shard's name), whatever GPUs the driver itself has: None for the CPU path."""
    if config.device == "cpu" or not config.kind.gpu_build:
        return None
    if config.device == "auto":
        raise UsageError(
            "BuildConfig.device auto with BuildConfig.engine ray: give BuildConfig.device "
            "cpu or BuildConfig.device cuda (the shards of one set are decoded on one kind "
            "of device, whichever node runs them)",
            field="BuildConfig.device",
        )
    import torch

    return torch.device("cuda")  # each task sees the GPU Ray gave it as cuda:0


def _shard_task(
    src: str, dst: str, name: str, part: Any, config: BuildConfig, url: str | None = None
) -> dict[str, Any]:
    """One Ray task: build shard ``name`` and put it in place (``url``: upload it there
    from a node-local folder instead; ``src`` a bucket URL: download the shard's images
    into a node-local folder first); where and how long."""
    import ray

    from ..storage.url import is_url

    t = time.perf_counter()
    uploaded = False
    bucket_src = is_url(src)  # (an absolute path never is one)
    if url is not None:
        where: Path | str = src if bucket_src else Path(src)
        outcome, uploaded = upload.build_and_upload(where, url, name, part, config)
    elif bucket_src:
        outcome = upload.build_from_bucket(src, Path(dst), name, part, config)
    else:
        outcome = commit_shard(Path(src), Path(dst), name, part, config)
    return {
        "outcome": outcome,
        "uploaded": uploaded,
        "node": ray.get_runtime_context().get_node_id(),
        "pid": os.getpid(),
        "seconds": round(time.perf_counter() - t, 3),
    }


class RayEngine(SetEngine):
    """One Ray task per shard (:func:`run_ray`); SRC a shared folder or a bucket prefix
    of images; into a bucket, each task uploads its own shard."""

    tasks_upload = True

    def prepare(self, config: BuildConfig) -> Any:
        ray = import_ray()  # before the scan: a missing extra is a one-line error at once
        device = cluster_device(config)
        # before DST is made: seconds, not 14 minutes. An address given (or RAY_ADDRESS) is
        # always checked; with none, a library caller's own connection is taken as it is
        named = config.ray_address is not None or bool(os.environ.get("RAY_ADDRESS"))
        if named or not ray.is_initialized():
            check_address(config.ray_address)
        return device

    def plan(self, src: Path | str, config: BuildConfig) -> _Labels:
        if isinstance(src, str):  # a bucket prefix (packer.builder.api routed it here)
            return upload.plan_bucket(src, config)
        return plan_labels(src, config)

    def run(
        self,
        sp: SetPlan,
        progress: Callable[[int], None] | None,
        on_shard: Callable[[int, int], None] | None,
        sink: ShardSink | None,
    ) -> tuple[list[ShardOutcome], dict[str, Any]]:
        return run_ray(sp, progress, on_shard, sink)


_ADDRESS = "BuildConfig.ray_address"  # the field messages name (the CLI: its flag)
PROBE_TIMEOUT_S = 3.0  # the TCP probe of BuildConfig.ray_address before any work


def check_address(address: str | None) -> None:
    """Refuse, before any work, a ``BuildConfig.ray_address`` (or ``RAY_ADDRESS`` when none is
    given) that is malformed or where nothing accepts a connection within
    :data:`PROBE_TIMEOUT_S`: a UsageError naming the address (Ray itself would raise a
    raw ValueError, or retry for about 14 minutes). Takes ``HOST:PORT`` (a bracketed
    IPv6 host too), ``ray://HOST:PORT`` (Ray Client), ``auto`` and ``local``; None with
    no ``RAY_ADDRESS`` starts a one-machine cluster and is not probed."""
    flag: str | None = _ADDRESS
    if address is None:
        address = os.environ.get("RAY_ADDRESS") or None
        flag = None  # the variable's, named as such
    if address is None or address in ("auto", "local"):
        return
    host, port = _host_port(address, flag)
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S):
            pass
    except OSError as e:
        why = "no answer" if isinstance(e, TimeoutError) else e.strerror or type(e).__name__
        raise UsageError(
            f"{flag or 'RAY_ADDRESS'} {address}: cannot reach a Ray cluster there ({why} "
            f"within {PROBE_TIMEOUT_S:g} s); start one with `ray start --head` or check "
            "the address",
            field=flag,
        ) from None


def _host_port(address: str, flag: str | None) -> tuple[str, int]:
    """(host, port) of ``[ray://]HOST:PORT``; UsageError naming ``flag`` (the field, or
    None: the RAY_ADDRESS variable) otherwise."""
    bad = UsageError(
        f"{flag or 'RAY_ADDRESS'} {address!r}: give the head node as HOST:PORT (e.g. "
        "10.0.0.5:6379, [fe80::1]:6379, ray://head:10001), 'auto' or 'local'",
        field=flag,
    )
    rest = address[len("ray://") :] if address.startswith("ray://") else address
    if not rest or any(c.isspace() or ord(c) < 32 for c in rest) or "/" in rest:
        raise bad
    if rest.startswith("["):
        host, sep, tail = rest[1:].partition("]")
        if not sep or not tail.startswith(":") or ":" not in host:
            raise bad
        port_text = tail[1:]
    else:
        host, sep, port_text = rest.rpartition(":")
        if not sep or not host or ":" in host:
            raise bad
    if not (port_text.isascii() and port_text.isdigit() and 1 <= int(port_text) <= 65535):
        raise bad
    return host, int(port_text)


def _connect(ray: Any, address: str | None) -> bool:
    """Join the cluster at ``address`` (None: RAY_ADDRESS, else a new one-machine
    cluster); reuse the connection a library caller already made. True: we opened it."""
    if ray.is_initialized():
        return False
    try:
        ray.init(
            address=address,
            include_dashboard=False,
            logging_level=logging.WARNING,
            log_to_driver=False,
            configure_logging=False,
        )
    except (ConnectionError, ValueError) as e:
        raise UsageError(
            f"{_ADDRESS} {address}: cannot reach a Ray cluster there ({e}); "
            "start one with `ray start --head` or check the address",
            field=_ADDRESS,
        ) from None
    return True


def _check_fits(ray: Any, cpus: int, gpus: int) -> None:
    """UsageError unless some live node can run a task of ``cpus`` CPUs and ``gpus`` GPUs:
    Ray would keep such tasks pending for ever."""
    have = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    if any(r.get("CPU", 0) >= cpus and r.get("GPU", 0) >= gpus for r in have):
        return
    need = f"{cpus} CPU" + (f" and {gpus} GPU" if gpus else "")
    most = max((r.get("CPU", 0) for r in have), default=0)
    field = "BuildConfig.device" if gpus and not any(r.get("GPU", 0) for r in have) else None
    what = f"{field} cuda" if field else "BuildConfig.workers"
    raise UsageError(
        f"{what}: each shard's task needs {need}, and no node of the Ray cluster has that "
        f"(the largest has {most:g} CPU, {max((r.get('GPU', 0) for r in have), default=0):g} "
        "GPU); lower BuildConfig.workers, use BuildConfig.device cpu, or add such a node",
        field=field or "BuildConfig.workers",
    )


def _cancel(ray: Any, refs: list[Any]) -> None:
    """Stop the tasks not finished and wait for them to settle. A running task's worker
    is killed, as a crash would: its shard stays in its work folder and a rerun resumes
    it. (A gentle cancel raises inside the task, where a per-image ``except`` may take
    it for a bad image and commit the shard without that image.)"""
    for ref in refs:
        try:
            ray.cancel(ref, force=True)
        except Exception as e:  # a task that finished meanwhile: nothing to cancel
            log.debug("cancel: %s", e)
    if refs:
        ray.wait(refs, num_returns=len(refs), timeout=_CANCEL_WAIT_S)


def _failure(ray: Any, sp: SetPlan, k: int, e: BaseException) -> PackerError:
    """A shard that failed, as the error that stops the build: its inputs, the cause."""
    name, a, b = sp.shards[k]
    rels = [x.rel for x in sp.plan.scan.entries[a:b]]
    inputs = ", ".join(rels[:_SHOWN])
    if len(rels) > _SHOWN:
        inputs += f", ... ({len(rels)} images)"
    cause: BaseException = e
    if isinstance(e, ray.exceptions.RayTaskError) and e.cause is not None:
        cause = e.cause
    x = ray.exceptions
    died = isinstance(e, (x.WorkerCrashedError, x.NodeDiedError, x.OutOfMemoryError))
    if died:
        what = f"its worker died {MAX_RETRIES + 1} times"
    elif isinstance(cause, OSError):
        what = f"it failed {MAX_RETRIES + 1} times: {type(cause).__name__}: {cause}"
    else:
        what = f"it failed: {cause}"
        if not isinstance(cause, PackerError):
            log.error("shard %s: %s", name, e)  # a bug: the task's traceback
    msg = (
        f"{sp.dst}: shard {name} (SRC {sp.src}: {inputs}) could not be built: {what}; "
        f"no index was written and the shards in place are kept: fix the cause and run "
        f"the same command again"
    )
    if died:
        return WorkerDiedError(msg)
    if isinstance(cause, PackerError):
        return type(cause)(msg)
    return ShardFailedError(msg)


def run_ray(
    sp: SetPlan,
    progress: Callable[[int], None] | None,
    on_shard: Callable[[int, int], None] | None = None,
    sink: ShardSink | None = None,
) -> tuple[list[ShardOutcome], dict[str, Any]]:
    """Build the shards of ``sp`` not yet in place, one Ray task each, on the cluster at
    ``sp.config.ray_address``. ``progress(n)``: n more images, once a shard is in place;
    ``on_shard(done, total)``: shards in place, after each. ``sink``: where the shards
    go; with a ``sink.url`` each task uploads its own (``sink.sent`` once it has).
    Returns each shard's outcome and, for the result's ``per_shard``, where each ran."""
    # Ray's driver prints cluster events (a node marked dead, a task retried with its
    # traceback) on stdout from a thread of its own: into the log while the build runs
    # (INFO: shown without -q), so `--json` stays one object and a retry is no traceback
    with contextlib.redirect_stdout(_LogLines()):
        outcomes, extra = _run(sp, progress, on_shard, sink)
    if sink is not None and sink.url is None:  # in DST: the driver sends them on
        failed = {o.name for o in outcomes if o.failed}
        for name, _, _ in sp.shards:
            if name not in failed:
                sink.put(sp.dst / name)
    return outcomes, extra


class _LogLines(io.TextIOBase):
    """A text stream whose lines go to this module's log at INFO."""

    def write(self, text: str) -> int:
        for line in text.splitlines():
            if line.strip():
                log.info("ray: %s", line)
        return len(text)


def _run(
    sp: SetPlan,
    progress: Callable[[int], None] | None,
    on_shard: Callable[[int, int], None] | None,
    sink: ShardSink | None,
) -> tuple[list[ShardOutcome], dict[str, Any]]:
    ray = import_ray()
    url = sink.url if sink is not None else None
    opened = _connect(ray, sp.config.ray_address)
    cpus = sp.config.workers or 1
    cfg = replace(sp.shard_config, workers=cpus, engine="local", ray_address=None)
    gpus = 0 if cluster_device(sp.config) is None else 1
    try:
        _check_fits(ray, cpus, gpus)
    except UsageError:
        if opened:
            ray.shutdown()
        raise
    task = ray.remote(_shard_task)
    resources = {
        "num_cpus": cpus,
        "num_gpus": gpus,
        "max_retries": MAX_RETRIES,
        "retry_exceptions": [OSError],
    }
    bucket_src = isinstance(sp.src, str)  # a bucket of images: the tasks download them
    src = str(sp.src) if bucket_src else os.path.abspath(sp.src)  # (not the tasks' folder)
    refs: dict[Any, int] = {}
    for k, (name, _a, _b) in enumerate(sp.shards):
        if name not in sp.done:
            part = sp.part(k)
            if bucket_src:  # the ETags of the shard's images only, not the whole listing's
                objects = part.scan.objects  # type: ignore[attr-defined]
                mine = {e.rel: objects[e.rel] for e in part.scan.entries}
                scan = replace(part.scan, objects=mine)
            else:
                scan = replace(part.scan, root=Path(os.path.abspath(part.scan.root)))
            part = replace(part, scan=scan)
            ref = task.options(name=f"imgpack-shard-{name}", **resources).remote(
                src, str(sp.dst), name, part, cfg, url
            )
            refs[ref] = k
    outcomes: list[ShardOutcome] = []
    where: dict[str, dict[str, Any]] = {}
    pending = list(refs)
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=1.0)
            for ref in ready:
                k = refs[ref]
                try:
                    res = ray.get(ref)
                except ray.exceptions.RayError as e:
                    _cancel(ray, pending)
                    raise _failure(ray, sp, k, e) from e
                outcome = res["outcome"]
                if url is not None and not outcome.failed:
                    try:
                        sink.sent(sp.dst / outcome.name, res["uploaded"])  # type: ignore[union-attr]
                    except PackerError:
                        _cancel(ray, pending)
                        raise
                outcomes.append(outcome)
                where[res["outcome"].name] = {
                    "node": res["node"],
                    "pid": res["pid"],
                    "seconds": res["seconds"],
                }
                _, a, b = sp.shards[k]
                if progress:
                    progress(b - a)
                if on_shard:
                    on_shard(len(sp.done) + len(outcomes), len(sp.shards))
                shards._reached(f"shard {k}")
    except KeyboardInterrupt:
        _cancel(ray, pending)
        raise
    finally:
        if opened:
            ray.shutdown()
    return outcomes, {"engine": "ray", "where": where}
