"""Build speed against the machine's own ceiling, and where the build's time goes.

For each data set (made once under ``--work`` with ``packer.measure.bench.synth``, quality 90):

* ``a``: 640x480 JPEGs -> 224x224 crop; ``b``: 500x375 JPEGs -> 256x256 crop;
* **ceiling**: N independent processes (started and warmed off the clock), each
  decoding its own slice of the whole set with imgpack's decode (open, draft,
  convert, resize), nothing written, no coordination; N = all cores and 1;
* ``imgpack build`` with all cores' workers (library call, ``BuildResult.seconds``: from
  the call to the renamed pack, pool start and final fsync included), and through the
  CLI in a fresh interpreter (wall clock of the whole command, process start to exit),
  each variant in every repeat, interleaved; 1 worker on a subset;
* the CLI's timeline (``IMGPACK_BUILD_TIMELINE``, :mod:`packer.builder.timeline`): each
  phase's end on the machine's one monotonic clock, from the process's launch (interpreter
  and imports, scan, pool, first and last chunk, fsync, manifest, rename) to its exit;
  the packages' bytecode is compiled first (``compileall``, as ``pip install`` does), so no
  run pays for compiling the sources;
* the build's time split (``BuildResult.extra``): the parent's steps and the workers'
  decode / copy / pwrite / sha256 / writeback / idle / tail;
* what the disk does with the same bytes: pwrite in chunk-sized pieces + one fsync,
  with and without per-chunk ``sync_file_range``; SHA-256 speed of one core.

Variants of the build (``--variants``): ``new`` (defaults), ``gpu`` (``--device cuda``;
then also the pixel difference from the CPU build), ``wb-off`` (no per-chunk
writeback: ``IMGPACK_BUILD_WRITEBACK=off``), ``forkserver`` / ``fork`` (how workers
start: ``IMGPACK_BUILD_START``; the default forks when that is safe), ``old`` (the
packer at ``--old-tree``, same run).

    python -m benchmarks.build [--images 16000] [--work /tmp/imgpack-bench]
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from ._common import dump

SETS = {
    "a": {"size": (640, 480), "out": 224},
    "b": {"size": (500, 375), "out": 256},
}
CPU = SimpleNamespace(type="cpu")  # what packer.measure.timing needs of a device: no torch import


def make_set(root: Path, n: int, size: tuple[int, int], procs: int) -> None:
    """``make_jpeg_tree``'s files (same names, seeds, classes) made by processes: the
    synthesis is numpy-heavy and holds the GIL, so threads would take minutes."""
    from packer.measure.bench import synth

    done = root / ".imgpack-bench-done"
    if done.exists():
        return
    tasks = []
    for i in range(n):
        d = root / f"class_{i % 10}"
        d.mkdir(parents=True, exist_ok=True)
        tasks.append((i, d / f"img_{i:06d}.jpg", size[0], size[1], 90))
    with mp.get_context("fork").Pool(procs) as pool:
        pool.map(synth._write, tasks, chunksize=64)
    done.write_text("ok")


def set_b(work: Path, images: int) -> tuple[int, int, Path, list[str]]:
    """Set b under ``work`` (made once), for the GPU build probes: (cores, the output
    side, its folder, its files sorted)."""
    cores = len(os.sched_getaffinity(0))
    src = work / "set_b"
    make_set(src, images, SETS["b"]["size"], cores)
    return cores, SETS["b"]["out"], src, sorted(str(p) for p in src.rglob("*.jpg"))


def _decode_slice(args: tuple[list[str], int]) -> int:
    from packer.imaging.decode import ResizeSpec, decode

    files, side = args
    spec = ResizeSpec(side, side, "crop", 100_000_000)
    for f in files:
        decode(f, spec)
    return len(files)


def _ready(_: int) -> int:
    import packer.imaging.decode  # noqa: F401  (imported before the clock starts)

    time.sleep(0.05)  # every process gets a task
    return os.getpid()


def ceiling(files: list[str], procs: int, side: int, repeats: int = 3) -> float:
    """Median img/s of ``procs`` independent processes decoding disjoint slices of
    ``files`` (nothing written)."""
    from packer.measure.timing import median_rate

    slices = [(files[i::procs], side) for i in range(procs)]
    with mp.get_context("forkserver").Pool(procs) as pool:
        pool.map(_ready, range(procs * 2), chunksize=1)
        return median_rate(lambda: sum(pool.map(_decode_slice, slices, chunksize=1)), CPU, repeats)


def clean(dst: Path) -> None:
    """Remove an earlier pack and flush all dirty pages, off the clock: every build
    starts from the same quiet disk."""
    shutil.rmtree(dst, ignore_errors=True)
    os.sync()


def lib_build(
    src: Path, dst: Path, side: int, workers: int, env: dict[str, str], device: str = "cpu"
) -> dict:
    """One library build in a child interpreter (own forkserver, own env); its result.
    ``device`` "cuda": ``--device cuda`` (CUDA start-up inside the timed call)."""
    code = (
        "import json,sys,packer;from packer.builder.run import BuildConfig;"
        f"r=packer.build_pack({str(src)!r},{str(dst)!r},BuildConfig(size=({side},{side}),"
        f"workers={workers},overwrite=True,device={device!r}));"
        "print('RESULT '+json.dumps({'count':r.count,'seconds':r.seconds,'extra':r.extra}))"
    )
    t = time.perf_counter()
    p = subprocess.run(  # cwd "/": `-c` puts the cwd first on sys.path, hiding --old-tree
        [sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
        cwd="/",
    )  # fmt: skip
    wall = time.perf_counter() - t
    if p.returncode:
        raise RuntimeError(p.stderr[-3000:])
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    res = json.loads(line[7:])
    res["process_wall_s"] = wall
    return res


def pixel_diff(a: Path, b: Path) -> dict:
    """Mean and 99th percentile of |a - b| over two packs of the same sources (0-255)."""
    import numpy as np

    import packer

    x, y = packer.load(a).images.numpy(), packer.load(b).images.numpy()
    d = np.abs(x[:2000].astype(np.int16) - y[:2000].astype(np.int16))
    return {"mean_abs": round(float(d.mean()), 3), "p99_abs": float(np.percentile(d, 99)),
            "max_abs": int(d.max())}  # fmt: skip


def cli_build(
    src: Path, dst: Path, side: int, workers: int, env: dict[str, str] | None = None
) -> dict:
    """``imgpack build`` as a user runs it, in a fresh interpreter: ``wall_s`` from the
    launch to the exit, and (where the packer run has it: :mod:`packer.builder.timeline`)
    ``phases``, each phase's end in seconds since the launch, the exit last."""
    timeline = dst.parent / f".{dst.name}-timeline.json"
    timeline.unlink(missing_ok=True)
    env = {**os.environ, **(env or {}), "IMGPACK_BUILD_TIMELINE": str(timeline)}
    t = time.perf_counter()  # CLOCK_MONOTONIC, as the child's perf_counter
    subprocess.run(  # cwd "/": as lib_build, so that --old-tree is what gets imported
        [sys.executable, "-m", "packer", "build", str(src), str(dst), "--size", str(side),
         "--workers", str(workers), "--overwrite", "--quiet", "--device", "cpu"],
        check=True, capture_output=True, env=env, cwd="/",
    )  # fmt: skip
    wall = time.perf_counter() - t
    res: dict = {"wall_s": wall}
    if timeline.exists():
        got = json.loads(timeline.read_text())
        res["phases"] = {k: round(v - t, 4) for k, v in got["monotonic"].items()}
        res["phases"]["exit"] = round(wall, 4)
        res["extra"] = got["extra"]
        timeline.unlink()
    return res


def compile_tree(root: Path) -> None:
    """The ``packer`` package under ``root`` compiled to bytecode, as an installed wheel
    is (``PYTHONDONTWRITEBYTECODE`` would otherwise make every run compile it anew)."""
    import compileall

    compileall.compile_dir(str(root / "packer"), quiet=1)


def phase_steps(phases: dict[str, float]) -> str:
    """``phase +seconds`` for each phase of a CLI run, in order."""
    out, prev = [], 0.0
    for k, v in phases.items():
        out.append(f"{k} +{v - prev:.3f}")
        prev = v
    return ", ".join(out)


def disk_probe(folder: Path, nbytes: int, chunk: int, writeback: bool) -> dict:
    """pwrite ``nbytes`` in ``chunk`` pieces (+ sync_file_range each), then fsync."""
    path = folder / ".imgpack-bench-disk"
    buf = os.urandom(chunk)
    sfr = ctypes.CDLL(None, use_errno=True).sync_file_range if writeback else None
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.posix_fallocate(fd, 0, nbytes)
        t0 = time.perf_counter()
        off = 0
        while off < nbytes:
            n = os.pwrite(fd, buf[: min(chunk, nbytes - off)], off)
            if sfr is not None:
                sfr(fd, ctypes.c_int64(off), ctypes.c_int64(n), 2)
            off += n
        t1 = time.perf_counter()
        os.fsync(fd)
        t2 = time.perf_counter()
    finally:
        os.close(fd)
        os.unlink(path)
        os.sync()
    return {
        "writeback": writeback,
        "write_s": t1 - t0,
        "fsync_s": t2 - t1,
        "GBps": nbytes / (t2 - t0) / 1e9,
    }


def sha_rate() -> float:
    data = os.urandom(64 << 20)
    t = time.perf_counter()
    for _ in range(4):
        hashlib.sha256(data).digest()
    return 4 * len(data) / (time.perf_counter() - t) / 1e9


def system_facts(folder: Path) -> dict:
    facts: dict = {"cores": os.cpu_count(), "affinity": len(os.sched_getaffinity(0))}
    best = ("", "")
    for line in Path("/proc/mounts").read_text().splitlines():
        dev, mnt, fs, *_ = line.split()
        if str(folder.resolve()).startswith(mnt) and len(mnt) >= len(best[0]):
            best = (mnt, f"{dev} {fs}")
    facts["work_fs"] = f"{best[0]}: {best[1]}"
    cpu = Path("/proc/cpuinfo").read_text()
    flags = next((ln for ln in cpu.splitlines() if ln.startswith("flags")), "")
    facts["sha_ni"] = " sha_ni" in flags
    facts["cpu"] = next((ln.split(":", 1)[1].strip() for ln in cpu.splitlines()
                         if ln.startswith("model name")), "?")  # fmt: skip
    for name in ("dirty_ratio", "dirty_background_ratio", "dirty_expire_centisecs"):
        with open(f"/proc/sys/vm/{name}") as f:
            facts[name] = f.read().strip()
    return facts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=16000)
    ap.add_argument("--work", type=Path, default=Path("/tmp/imgpack-bench"))
    ap.add_argument("--sets", default="a,b")
    ap.add_argument("--variants", default="new,wb-off")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-disk", action="store_true", help="skip the disk probe")
    ap.add_argument("--old-tree", type=Path, default=None, help="a checkout of the old packer")
    ap.add_argument("--keep", default="a", help="keep this set's last pack (for probe_stream)")
    args = ap.parse_args()
    cores = len(os.sched_getaffinity(0))
    compile_tree(Path(__file__).resolve().parent.parent)
    if args.old_tree:
        compile_tree(args.old_tree)
    variants = {
        "new": {},
        "wb-off": {"IMGPACK_BUILD_WRITEBACK": "off"},
        "forkserver": {"IMGPACK_BUILD_START": "forkserver"},
        "fork": {"IMGPACK_BUILD_START": "fork"},
        "gpu": {},  # --device cuda
    }
    if args.old_tree:  # the code before this work, same run: PYTHONPATH's first entry swapped
        rest = os.environ.get("PYTHONPATH", "").split(os.pathsep)[1:]
        variants["old"] = {"PYTHONPATH": os.pathsep.join([str(args.old_tree), *rest])}
    res: dict = {"facts": system_facts(args.work if args.work.exists() else Path("/tmp"))}
    res["sha256_GBps_1core"] = sha_rate()
    print("facts:", res["facts"], f"sha256 {res['sha256_GBps_1core']:.2f} GB/s/core", flush=True)
    table = []
    for key in args.sets.split(","):
        spec = SETS[key]
        side = spec["out"]
        src = args.work / f"set_{key}"
        t = time.perf_counter()
        make_set(src, args.images, spec["size"], cores)
        files = sorted(str(p) for p in src.rglob("*.jpg"))
        mb = sum(os.path.getsize(f) for f in files) / len(files) / 1e3
        print(f"set {key}: {len(files)} files, {mb:.0f} KB avg, made in "
              f"{time.perf_counter() - t:.1f} s", flush=True)  # fmt: skip
        row = {"set": key, "src": spec["size"], "side": side, "files": len(files), "kB": mb}
        row["ceiling_all"] = ceiling(files, cores, side)
        row["ceiling_1"] = ceiling(files[:400], 1, side)
        print(f"  ceiling {cores} procs {row['ceiling_all']:,.0f} img/s; 1 proc "
              f"{row['ceiling_1']:,.0f}", flush=True)  # fmt: skip
        nbytes = len(files) * 3 * side * side
        chunk = 3 * side * side * max(1, min(64, -(-len(files) // 256)))
        row["disk"] = [disk_probe(args.work, nbytes, chunk, wb) for wb in (True, False)][
            : 0 if args.no_disk else 2
        ]
        print("  disk:", [f"{d['GBps']:.2f} GB/s (wb={d['writeback']}, fsync "
                          f"{d['fsync_s']:.2f} s)" for d in row["disk"]], flush=True)  # fmt: skip
        dst = args.work / f"pack_{key}"
        names = args.variants.split(",")
        runs: dict[str, list[dict]] = {name: [] for name in names}
        clis: dict[str, list[dict]] = {name: [] for name in names if name != "gpu"}
        for _ in range(args.repeats):  # variants interleaved: a drift hits each alike
            for name in names:
                clean(dst)
                dev = "cuda" if name == "gpu" else "cpu"
                r = lib_build(src, dst, side, cores, variants[name], dev)
                r["img_per_s"] = r["count"] / r["seconds"]
                runs[name].append(r)
                print(f"  build {name}: {r['img_per_s']:,.0f} img/s, {r['seconds']:.2f} s, "
                      f"extra {json.dumps(r['extra'])}", flush=True)  # fmt: skip
            for name in clis:  # the command, process start to exit
                clean(dst)
                c = cli_build(src, dst, side, cores, variants[name])
                clis[name].append(c)
                print(f"  CLI {name}: {c['wall_s']:.2f} s wall "
                      f"({len(files) / c['wall_s'] / row['ceiling_all']:.2f} of the ceiling)"
                      + (f"; {phase_steps(c['phases'])}" if "phases" in c else ""),
                      flush=True)  # fmt: skip
        for name in names:
            med = sorted(runs[name], key=lambda r: r["img_per_s"])[len(runs[name]) // 2]
            row[f"build_{name}"] = med
            row[f"build_{name}_all"] = [r["img_per_s"] for r in runs[name]]
        for name, got in clis.items():
            med = sorted(got, key=lambda c: c["wall_s"])[len(got) // 2]
            row[f"cli_{name}"] = med
            row[f"cli_{name}_all_s"] = [c["wall_s"] for c in got]
        if "gpu" in names and "new" in names:  # pixels: GPU build vs CPU build, same sources
            clean(dst)
            lib_build(src, dst, side, cores, {}, "cpu")
            gdst = args.work / f"pack_{key}_gpu"
            clean(gdst)
            lib_build(src, gdst, side, cores, {}, "cuda")
            row["gpu_vs_cpu"] = pixel_diff(dst, gdst)
            print(f"  GPU vs CPU pixels: {row['gpu_vs_cpu']}", flush=True)
            clean(gdst)
        if "cli_new" not in row:
            clean(dst)
        cli = row.get("cli_new") or cli_build(src, dst, side, cores)
        row["cli_wall_s"] = cli["wall_s"]
        row["cli_img_per_s"] = len(files) / row["cli_wall_s"]
        print(f"  CLI build {row['cli_img_per_s']:,.0f} img/s wall ({row['cli_wall_s']:.2f} s, "
              f"median of {len(row.get('cli_new_all_s', [0]))})")  # fmt: skip
        sub = args.work / f"sub_{key}"
        if not sub.exists():
            for f in files[:1000]:
                d = sub / Path(f).parent.name
                d.mkdir(parents=True, exist_ok=True)
                os.link(f, d / Path(f).name)
        clean(args.work / f"pack1_{key}")
        one = lib_build(sub, args.work / f"pack1_{key}", side, 1, {})
        row["build_1"] = one["count"] / one["seconds"]
        row["build_1_extra"] = one["extra"]
        clean(args.work / f"pack1_{key}")
        if key != args.keep:
            clean(dst)
        table.append(row)
        dump(res | {"sets": table}, f"bench_build_{args.sets.replace(',', '')}.json")
    print(f"\nbuild vs ceiling, {cores} workers ({res['facts']['cpu']})")
    print("| set | ceiling img/s (1 / all) | build img/s (median of "
          f"{args.repeats}) | of ceiling | CLI wall img/s | 1 worker (of 1 proc) |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for r in table:
        for name in args.variants.split(","):
            b = r[f"build_{name}"]["img_per_s"]
            print(f"| {r['set']} {r['src'][0]}x{r['src'][1]}->{r['side']} {name} | "
                  f"{r['ceiling_1']:,.0f} / {r['ceiling_all']:,.0f} | {b:,.0f} "
                  f"({', '.join(f'{x:,.0f}' for x in r[f'build_{name}_all'])}) | "
                  f"{b / r['ceiling_all']:.0%} | {r['cli_img_per_s']:,.0f} "
                  f"({r['cli_img_per_s'] / r['ceiling_all']:.0%}) | {r['build_1']:,.0f} "
                  f"({r['build_1'] / r['ceiling_1']:.0%}) |")  # fmt: skip
    print(f"\nCLI, process start to exit, vs the {cores}-process ceiling (median wall)")
    for r in table:
        for name in args.variants.split(","):
            c = r.get(f"cli_{name}")
            if c is not None:
                ratio = r["files"] / c["wall_s"] / r["ceiling_all"]
                print(f"| {r['set']} {name} | {c['wall_s']:.2f} s | ceiling "
                      f"{r['files'] / r['ceiling_all']:.2f} s | {ratio:.2f} | "
                      f"{', '.join(f'{x:.2f}' for x in r[f'cli_{name}_all_s'])} |")  # fmt: skip
                if "phases" in c:
                    print(f"  phases (s since launch): {phase_steps(c['phases'])}")
    for r in table:
        e = r["build_new"]["extra"]
        print(f"split {r['set']}: parent {e['parent']}")
        print(f"  workers {e.get('worker')} start {e.get('worker_start_s')} "
              f"last-chunk->decoded {e.get('last_chunk_end_to_decoded_s')} "
              f"window {e.get('decode_window_s')} finalize {e['finalize_total_s']}")  # fmt: skip


if __name__ == "__main__":
    main()
