"""``imgpack build``: which build a job is, decided once, here.

A job makes one of three things and one of two engines builds a set's shards::

    route(src, dst, config) -> Route(target, engine, bucket_src)
        target  "pack"    one pack at DST                        packer.builder.run
                "set"     a pack set of shards at DST            packer.builder.shards
                "bucket"  a pack set at an s3:// gs:// az:// DST  packer.builder.upload
        engine  "local"   this machine's cores, one shard after another (shards.LocalEngine)
                "ray"     one Ray task per shard on a cluster (ray_engine.RayEngine)
        bucket_src        SRC is a bucket prefix (one pack: read here, packer.sources;
                          a set: engine ray)

:func:`build` (``packer.build_pack``, and the CLI's ``imgpack build``) validates the
config, takes the route and hands the job to that module with that engine object. The
modules below never import this one and never ask again which build they are: imports
run one way, ``api -> ray_engine -> upload -> shards -> run``. The set modules are
imported when a set is built, so one pack's build loads none of them (nor Ray).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UsageError
from ..storage.url import is_url, parse_url
from . import run
from .config import BuildConfig, BuildResult, _Labels

if TYPE_CHECKING:
    from .shards import SetEngine

__all__ = ["BuildConfig", "BuildResult", "Route", "build", "route"]

TARGETS = ("pack", "set", "bucket")


@dataclass(frozen=True)
class Route:
    """What a build makes (``target``: one of :data:`TARGETS`), who builds a set's shards
    (``engine``: ``"local"`` or ``"ray"``) and whether SRC is a bucket of images."""

    target: str
    engine: str
    bucket_src: bool

    @property
    def sharded(self) -> bool:
        """Whether the build writes a pack set (shard by shard: the CLI's progress bar)."""
        return self.target != "pack"

    def set_engine(self) -> SetEngine:
        """The object that builds the shards of a set (the bytes are the same for both)."""
        if self.engine == "ray":
            from .ray_engine import RayEngine

            return RayEngine()
        from .shards import LocalEngine

        return LocalEngine()


def route(src: str | os.PathLike[str], dst: str | os.PathLike[str], config: BuildConfig) -> Route:
    """The one decision: pack, set or bucket, local or Ray, folder or bucket SRC. Reads
    nothing; ``config`` is taken as valid (:meth:`BuildConfig.validate`)."""
    sharded = config.shard_size is not None or config.append or config.engine == "ray"
    target = "bucket" if is_url(dst) else "set" if sharded else "pack"
    return Route(target=target, engine=config.engine, bucket_src=is_url(src))


def build(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    config: BuildConfig = BuildConfig(),
    progress: Callable[[int], None] | None = None,
    on_start: Callable[[int, int], None] | None = None,
    plan: _Labels | None = None,
    on_shard: Callable[[int, int], None] | None = None,
) -> BuildResult:
    """Build a pack, a pack set, or a pack set in object storage at ``dst`` from the
    images under ``src`` (a folder, or with ``config.engine="ray"`` a bucket prefix).

    ``progress(n)`` is called in this process as images are done; ``on_start(total,
    already_done)`` once before work; ``on_shard(done, total)`` after each shard of a set.
    ``plan``: the labelled images to pack, already listed (one pack only). Raises
    PackerError subclasses for unusable input; broken images are skipped and listed in
    the result. Interrupted builds resume when rerun. Which build it is: :func:`route`.
    """
    config.validate()
    r = route(src, dst, config)
    # a device this process lacks is refused before any work; ray: each task's node needs
    # the GPU, not this one; auto falls back to the CPU and asks CUDA only where the GPU
    # could pay for the job (build/auto.py)
    if r.engine != "ray" and config.device != "auto":
        run._build_device(config)
    if r.bucket_src:
        parse_url(str(src))  # first: a URL with a credential is refused, unquoted
        if r.engine != "ray" and r.sharded:
            raise UsageError(
                f"SRC {src}: a pack set from a bucket of images is built with "
                "BuildConfig.engine ray (each task downloads its shard's images); here, one "
                "pack is built to a local folder (no BuildConfig.shard_size, append or "
                "bucket DST)",
                field="BuildConfig.engine",
            )
    if r.sharded and not r.bucket_src:  # parquet, tar, zip: one pack, refused here first
        from .formats.base import source_plan

        source_plan(src, dst, config)
    if plan is not None and r.sharded:
        raise UsageError("a listed plan builds one pack: not with a shard size, append or ray")
    if r.target == "pack":  # SRC may be a list of files (parquet, tar shards): one pack
        return run.build(src, dst, config, progress=progress, on_start=on_start, plan=plan)
    where: str | Path = str(src) if r.bucket_src else Path(src)
    if r.target == "bucket":
        from .upload import build_to_bucket

        return build_to_bucket(
            where, str(dst), config, progress=progress, on_start=on_start, engine=r.set_engine()
        )
    if r.target == "set":
        from .shards import build_set

        return build_set(
            where, dst, config, progress=progress, on_start=on_start, on_shard=on_shard,
            engine=r.set_engine(),
        )  # fmt: skip
    raise AssertionError(f"no builder for target {r.target!r}")  # route() names three
