"""``imgpack build SRC s3://... --engine ray`` against the real S3 server and the session's
two-node Ray cluster: each task builds its shard in a node-local folder and uploads it
itself; the bucket then holds the local engine's objects byte for byte, and a rerun
builds and uploads only what the bucket lacks."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import s3_server as fx
from s3_server import RAW, bucket_path, new_url, write_src

from conftest import ray_tests_left, write_image
from helpers.local_server import S3Server
from packer.builder import upload
from packer.builder.api import build
from packer.errors import InputError, StorageError, UsageError
from packer.pack.index import INDEX
from packer.pack.schema import MANIFEST
from packer.storage.client import open_store
from packer.storage.url import parse_url

pytestmark = pytest.mark.ray

s3, s3_server = fx.s3, fx.s3_server  # the fixtures


def objects(server: S3Server, url: str) -> dict[str, bytes]:
    root = bucket_path(server, url)
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def shard_mtimes(server: S3Server, url: str) -> dict[str, int]:
    root = bucket_path(server, url)
    return {str(p): p.stat().st_mtime_ns for p in root.glob("*-*/**/*") if p.is_file()}


def join(cluster: Any, env: dict[str, str] | None) -> None:
    """This driver joins ``cluster`` again, its tasks seeing ``env`` (None: nothing more)."""
    import ray

    ray.shutdown()
    kw: dict[str, Any] = {} if env is None else {"runtime_env": {"env_vars": env}}
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False, **kw)


@pytest.fixture(scope="module")
def nodes_env(ray_cluster: Any, s3_server: S3Server) -> Iterator[Any]:
    """The cluster's tasks see the S3 server's AWS environment, as on nodes started with
    it. The session's cluster starts before this server, so the driver joins it again
    with that environment as its job's (Ray's runtime_env: a test's stand-in for the
    nodes' own environment; imgpack passes no credential to a task); then as before."""
    join(ray_cluster, s3_server.env())
    if ray_cluster.worker is not None and ray_cluster.worker.poll() is not None:
        # killed by a test before (tests/builder/test_ray_build.py, last there): until
        # Ray's health check marks it dead it still counts as alive, and a new worker
        # node would seem up at once
        deadline = time.monotonic() + 30
        while len(ray_cluster.alive()) > 1 and time.monotonic() < deadline:
            time.sleep(0.1)
    ray_cluster.ensure_worker()
    try:
        yield ray_cluster
    finally:
        join(ray_cluster, None)
        if ray_tests_left():  # the job's workers are new: warm as the session's were
            ray_cluster.warm()


@pytest.fixture
def src(tmp_path: Path) -> Path:
    return write_src(tmp_path / "src", {"cat": 6, "dog": 6})  # 12 images: 6 shards of 2


def test_ray_build_to_a_bucket_equals_the_local_engines_object_for_object(
    nodes_env: Any, s3: S3Server, src: Path
) -> None:
    local, ray_url = new_url(), new_url()
    build(src, local, RAW)
    r = build(src, ray_url, replace(RAW, engine="ray"))
    assert objects(s3, ray_url) == objects(s3, local)
    assert len(objects(s3, local)) == 6 * 5 + 1  # 5 objects a shard, the index
    assert r.count == 12 and r.shards == 6
    assert r.extra["shards_uploaded"] == 6 and r.extra["shards_already_there"] == 0
    assert [s["status"] for s in r.per_shard] == ["built"] * 6
    assert {s["node"] for s in r.per_shard} <= set(nodes_env.alive())


def test_ray_rerun_uploads_nothing_new_and_a_killed_run_resumes(
    nodes_env: Any, s3: S3Server, src: Path, tmp_path: Path
) -> None:
    ref, url = new_url(), new_url()
    build(src, ref, RAW)
    build(src, url, replace(RAW, engine="ray"))
    before = shard_mtimes(s3, url)
    again = build(src, url, replace(RAW, engine="ray", overwrite=True))
    assert again.extra["shards_uploaded"] == 0 and again.extra["shards_already_there"] == 6
    assert again.extra["shards_built"] == 0 and again.extra["shards_kept"] == 6
    assert shard_mtimes(s3, url) == before  # not one shard object written again
    assert objects(s3, url) == objects(s3, ref)
    # a run killed after 5 shards went up: no index, the last shard's manifest missing
    client = open_store(parse_url(url))
    last = sorted(k.split("/")[0] for k in client.list() if "/" in k)[-1]
    client.delete(INDEX)
    client.delete(last, MANIFEST)
    r = build(src, url, replace(RAW, engine="ray"))
    assert r.extra["shards_built"] == 1 and r.extra["shards_uploaded"] == 1
    assert r.extra["shards_already_there"] == 5
    assert objects(s3, url) == objects(s3, ref)
    assert not list((tmp_path / "cache" / "builds").glob("*"))  # the staging folder went


def upload_tree(root: Path, url: str) -> None:
    client = open_store(parse_url(url))
    for p in sorted(root.rglob("*")):
        if p.is_file():
            client.put(p, *p.relative_to(root).parts)


def same_set(local: dict[str, bytes], remote: dict[str, bytes], source: str) -> None:
    """Two sets of the same images: the same shards in the same order, each with the same
    data files and manifest but the recorded source; only the names differ (they hash
    where the images came from)."""
    index = [json.loads(t[INDEX]) for t in (local, remote)]
    names = [[s["name"] for s in i["shards"]] for i in index]
    assert len(names[0]) == len(names[1]) >= 3 and names[0] != names[1]
    for i in index:
        for s in i["shards"]:
            del s["name"], s["sha256"]
    assert index[0] == index[1]
    for a, b in zip(*names):
        files = {k.split("/", 1)[1] for k in local if k.startswith(a + "/")}
        assert files == {k.split("/", 1)[1] for k in remote if k.startswith(b + "/")}
        for f in files - {MANIFEST}:
            assert local[f"{a}/{f}"] == remote[f"{b}/{f}"], f
        ma, mb = (json.loads(t[f"{n}/{MANIFEST}"]) for t, n in ((local, a), (remote, b)))
        assert mb["build"].pop("source_root") == source
        ma["build"].pop("source_root")
        assert ma == mb


def tree_of(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("how", ["folders-raw", "table-jpeg"])
def test_ray_build_from_a_bucket_src_equals_the_build_from_the_files_on_disk(
    nodes_env: Any, s3: S3Server, src: Path, tmp_path: Path, how: str
) -> None:
    write_image(src / "dog" / "deep" / "er" / "x.png", (24, 18), seed=7)  # any depth
    write_image(src / "loose.png", (24, 18), seed=8)  # in the root: not in ImageFolder
    (src / "cat" / "notes.txt").write_text("not an image")
    images = f"s3://{fx.BUCKET}/images/{uuid.uuid4().hex[:12]}"
    upload_tree(src, images)
    cfg = replace(RAW, classes=None)
    if how == "table-jpeg":
        rows = [f"{c}/{i}.png,{c}" for c in ("cat", "dog") for i in range(6)]
        table = tmp_path / "labels.csv"
        table.write_text("path,label\n" + "\n".join([*rows[1:], "loose.png,bird"]) + "\n")
        cfg = replace(RAW, labels=table, store="jpeg", shard_size=1500)
    disk = build(src, tmp_path / "disk", cfg)
    url = new_url()
    r = build(images + "/", url, replace(cfg, engine="ray"))
    assert r.count == disk.count == (13 if how == "folders-raw" else 12)
    assert r.classes == disk.classes and r.ignored == disk.ignored
    same_set(tree_of(tmp_path / "disk"), objects(s3, url), images)
    # the same into a shared folder; a rerun builds nothing (names from sizes and ETags)
    r = build(images, tmp_path / "ray", replace(cfg, engine="ray"))
    assert r.extra["shards_built"] == r.shards
    same_set(tree_of(tmp_path / "disk"), tree_of(tmp_path / "ray"), images)
    again = build(images, tmp_path / "ray", replace(cfg, engine="ray", overwrite=True))
    assert again.extra["shards_built"] == 0 and again.extra["shards_kept"] == r.shards


def test_a_bucket_src_needs_the_ray_engine(s3: S3Server, tmp_path: Path) -> None:
    with pytest.raises(
        UsageError, match=r"SRC s3://imgpack/images: a pack set from a bucket of images is built"
    ):
        build(f"s3://{fx.BUCKET}/images", tmp_path / "set", RAW)


def test_an_image_changed_after_the_listing_is_refused_and_a_rerun_takes_it(
    nodes_env: Any, s3: S3Server, src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    images = f"s3://{fx.BUCKET}/images/{uuid.uuid4().hex[:12]}"
    upload_tree(src, images)
    changed = write_image(tmp_path / "new.png", (20, 16), seed=99)
    listed = upload.plan_bucket

    def list_then_change(url: str, config: Any) -> Any:  # the driver listed; then a writer
        plan = listed(url, config)
        open_store(parse_url(images)).put(changed, "dog", "3.png")
        return plan

    monkeypatch.setattr(upload, "plan_bucket", list_then_change)
    with pytest.raises(InputError, match=r"shard 00004-.*dog/3\.png: changed since it was listed"):
        build(images, tmp_path / "set", replace(RAW, engine="ray"))
    assert not (tmp_path / "set" / INDEX).exists()
    monkeypatch.setattr(upload, "plan_bucket", listed)
    r = build(images, tmp_path / "set", replace(RAW, engine="ray"))
    (src / "dog" / "3.png").write_bytes(changed.read_bytes())
    disk = build(src, tmp_path / "disk", RAW)
    assert r.count == disk.count == 12 and r.per_shard[4]["status"] == "built"
    assert r.extra["shards_kept"] + r.extra["shards_built"] == 6  # (those in place kept)
    same_set(tree_of(tmp_path / "disk"), tree_of(tmp_path / "set"), images)


def test_a_task_uploads_with_its_nodes_credentials_never_the_drivers(
    nodes_env: Any, s3: S3Server, src: Path
) -> None:
    # the driver holds the right secret, the nodes a wrong one: the tasks are refused
    wrong = "imgpack-wrong-secret-on-the-nodes"
    join(nodes_env, {**s3.env(), "AWS_SECRET_ACCESS_KEY": wrong})
    try:
        url = new_url()
        with pytest.raises(StorageError, match=r"shard 0000\d-.*refused the credentials") as e:
            build(src, url, replace(RAW, engine="ray"))
        assert s3.secret not in str(e.value) and wrong not in str(e.value)
        assert not (bucket_path(s3, url) / INDEX).exists()
    finally:
        join(nodes_env, s3.env())
