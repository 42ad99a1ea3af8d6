"""``imgpack compress``: recompress an image tree to JPEG with ffmpeg at ``-q:v Q``.

Each image is read into memory and piped to ffmpeg (``pipe:0`` -> ``pipe:1``),
so no file name ever reaches ffmpeg's command line: names with spaces,
non-ASCII characters, ``%d`` or a leading dash are safe, and ffmpeg writes
nothing itself. imgpack writes the result under DST at the source's relative
path with a ``.jpg`` suffix (:func:`output_names`: distinct sources always get
distinct outputs), via a hidden temporary file that is fsynced and renamed when
complete; a rerun removes the temporary files a dead run left, skips outputs
that exist and redoes the rest. The options are recorded in DST
(``.imgpack-compress.json``); a rerun with other options redoes the outputs
made before them. Only regular files are read, and only as many bytes as the
file holds; anything else (a FIFO, a device) fails with its reason. Images
above ``max_pixels`` are refused from the header, before any decoding.

Pixels come out upright and RGB: the EXIF orientation is applied by explicit
filters (ffmpeg's own autorotation is off, so every ffmpeg version agrees),
alpha is premultiplied (flattened onto black, as ``build`` does), and 16-bit,
grayscale, palette and CMYK inputs are converted by ffmpeg. Formats ffmpeg
cannot read from a pipe (TIFF) go through Pillow as lossless PNG first.

A corrupt or truncated input fails (ffmpeg runs with ``-xerror -err_detect
explode``, and the output must decode as a JPEG of the expected size); the
failure is recorded with the tail of ffmpeg's stderr and the run goes on.

The ffmpeg binary is the one the imageio-ffmpeg wheel ships; set
``IMGPACK_FFMPEG`` (or imageio-ffmpeg's ``IMAGEIO_FFMPEG_EXE``) to use another.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ffmpeg

from ._fs import default_workers, destination_error, write_atomic
from .errors import DecodeError, FFmpegError, InputError, UsageError
from .imaging.decode import DEFAULT_MAX_PIXELS, open_image, open_regular
from .pack.files import loads_json
from .sources.scan import IMAGE_EXTENSIONS, printable, relative, walk_images

log = logging.getLogger(__name__)

_TRANSPOSE = {  # EXIF orientation -> ffmpeg filters that make it upright
    2: [("hflip", {})],
    3: [("hflip", {}), ("vflip", {})],
    4: [("vflip", {})],
    5: [("transpose", {"dir": 0})],
    6: [("transpose", {"dir": 1})],
    7: [("transpose", {"dir": 3})],
    8: [("transpose", {"dir": 2})],
}
_DIRECT = {
    "JPEG": "jpeg_pipe",
    "PNG": "png_pipe",
    "BMP": "bmp_pipe",
    "GIF": "gif",
    "WEBP": "webp_pipe",
}
_ALPHA_MODES = {"RGBA", "LA", "PA", "RGBa", "La"}
_TMP_PREFIX = ".imgpack-tmp-"
OPTIONS_FILE = ".imgpack-compress.json"  # the options DST's outputs were made with


@dataclass(frozen=True)
class CompressConfig:
    quality: int = 3
    max_side: int | None = None
    workers: int | None = None
    overwrite: bool = False
    max_pixels: int = DEFAULT_MAX_PIXELS

    def validate(self) -> None:
        f = "CompressConfig."  # how messages name a field (the CLI: its flag, packer.cli.flags)
        if not 2 <= self.quality <= 31:
            raise UsageError(
                f"{f}quality must be 2 (best) to 31 (worst), not {self.quality}",
                field=f"{f}quality",
            )
        if self.max_side is not None and not 1 <= self.max_side <= 65535:
            raise UsageError(
                f"{f}max_side must be 1 to 65535 pixels, not {self.max_side}", field=f"{f}max_side"
            )
        if self.workers is not None and not 1 <= self.workers <= 1024:
            raise UsageError(
                f"{f}workers must be 1 to 1024, not {self.workers}", field=f"{f}workers"
            )
        if self.max_pixels < 1:
            raise UsageError(f"{f}max_pixels must be positive", field=f"{f}max_pixels")


@dataclass
class CompressResult:
    """What a compress run did, in the words ``build`` uses too.

    ``written``: outputs made by this run. ``already_done``: outputs an earlier
    run made with the same options, left as they are. ``skipped_inputs``: bad
    inputs not used, each ``{"path", "reason"}``.

    Legacy names, kept for compatibility (also in ``to_json``): ``skipped`` is
    the count of already-done outputs (not of bad inputs), ``failed`` the list
    of skipped inputs.
    """

    written: int = 0
    already_done: int = 0
    skipped_inputs: list[dict[str, str]] = field(default_factory=list)
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0

    @property
    def skipped(self) -> int:
        """Legacy name of ``already_done``."""
        return self.already_done

    @property
    def failed(self) -> list[dict[str, str]]:
        """Legacy name of ``skipped_inputs``."""
        return self.skipped_inputs

    def to_json(self) -> dict[str, Any]:
        return {
            "written": self.written,
            "already_done": self.already_done,
            "skipped_inputs": self.skipped_inputs,
            "skipped": self.already_done,  # legacy: the count of already-done outputs
            "failed": self.skipped_inputs,  # legacy: the skipped inputs
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "seconds": round(self.seconds, 3),
        }


def ffmpeg_exe() -> str:
    """Path of the ffmpeg binary: $IMGPACK_FFMPEG, else imageio-ffmpeg's bundled one."""
    exe = os.environ.get("IMGPACK_FFMPEG")
    if exe:
        if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
            raise FFmpegError(f"IMGPACK_FFMPEG={exe} is not an executable file; fix or unset it")
        return exe
    try:
        import imageio_ffmpeg

        return imageio_ffmpeg.get_ffmpeg_exe()
    except Exception as e:  # RuntimeError when the wheel's binary is missing
        raise FFmpegError(
            f"no ffmpeg binary found ({e}); reinstall imgpack "
            "(the imageio-ffmpeg wheel ships one) or set IMGPACK_FFMPEG"
        ) from None


def _list_images(
    src: Path, skipped: list[dict[str, str]], followed: list[str] | None = None
) -> list[str]:
    """Relative POSIX paths of every image under src, sorted; symlinks followed, loop-safe.

    Unreadable folders and names that are not UTF-8 go to ``skipped`` with the reason;
    ``followed`` gets the real path of every folder scanned.
    """
    if not src.exists():
        raise InputError(f"{src}: no such folder; check the path")
    if not src.is_dir():
        raise InputError(f"{src}: is a file, not a folder; give the folder that holds the images")
    skips: list[tuple[str, str]] = []
    out = [relative(p, src) for p in walk_images(src, skips, followed)]
    for path, reason in skips:
        skipped.append({"path": printable(relative(path, src)), "reason": reason})
    if not out:
        raise InputError(
            f"{src}: no images found (looked for {', '.join(IMAGE_EXTENSIONS)} in any case)"
        )
    return out


def output_names(rels: list[str]) -> dict[str, str]:
    """Map each source to its output path: ``a/b.png`` -> ``a/b.jpg``; one to one.

    Sources named ``.jpg`` keep their name. Where another source would meet a
    name already given (``x.png`` beside ``x.jpg``) it keeps its full name
    (``x.png.jpg``), and where that is taken too, a number (``x.png~2.jpg``).
    A name is never one of the source folders either. The result depends only
    on the set of sources, so a rerun maps them the same way.
    """
    taken: set[str] = set()
    for rel in rels:  # folders keep their names in DST: no file may take one
        parts = rel.split("/")[:-1]
        taken.update("/".join(parts[: i + 1]) for i in range(len(parts)))
    names: dict[str, str] = {}
    for rel in sorted(rels):
        if rel.endswith(".jpg") and rel not in taken:
            names[rel] = rel
            taken.add(rel)
    for rel in sorted(rels):
        if rel in names:
            continue
        p = Path(rel)
        cand = p.with_suffix(".jpg").as_posix()
        if cand in taken:
            cand = p.with_name(p.name + ".jpg").as_posix()
        k = 2
        while cand in taken:
            cand = p.with_name(f"{p.name}~{k}.jpg").as_posix()
            k += 1
        names[rel] = cand
        taken.add(cand)
    return names


def _probe(data: bytes) -> tuple[str | None, int, bool, tuple[int, int]]:
    """Format, EXIF orientation, has-alpha, and stored size, from the header (no decode)."""
    with open_image(io.BytesIO(data)) as im:
        orientation = im.getexif().get(0x0112, 1) if hasattr(im, "getexif") else 1
        alpha = im.mode in _ALPHA_MODES or (im.mode == "P" and "transparency" in im.info)
        return im.format, int(orientation or 1), alpha, im.size


def _to_png(data: bytes) -> bytes:
    with open_image(io.BytesIO(data)) as im:
        im.load()
        buf = io.BytesIO()
        if im.mode not in ("RGB", "RGBA", "L", "LA", "I;16", "I"):
            im = im.convert("RGBA" if im.mode in _ALPHA_MODES else "RGB")
        im.save(buf, "PNG", compress_level=1)
        return buf.getvalue()


def ffmpeg_command(
    exe: str, fmt: str, orientation: int, alpha: bool, size: tuple[int, int], config: CompressConfig
) -> list[str]:
    """The ffmpeg argv for one image: stdin -> upright, scaled, RGB JPEG on stdout."""
    stream = ffmpeg.input("pipe:0", f=fmt, noautorotate=None, threads=1, err_detect="explode")
    for name, kw in _TRANSPOSE.get(orientation, []):
        stream = stream.filter(name, **kw)
    w, h = size
    if orientation in (5, 6, 7, 8):
        w, h = h, w
    if config.max_side and max(w, h) > config.max_side:
        s = config.max_side / max(w, h)
        stream = stream.filter("scale", max(1, round(w * s)), max(1, round(h * s)), flags="lanczos")
    if alpha:
        stream = stream.filter("premultiply", inplace=1)
    stream = stream.filter("format", "yuvj420p")
    out = stream.output("pipe:1", f="mjpeg", **{"frames:v": 1, "q:v": config.quality})
    args = out.compile(cmd=exe)
    # Global options first: ffmpeg may ignore options that trail the output.
    return [args[0], "-hide_banner", "-nostdin", "-v", "error", "-xerror", *args[1:]]


def _stderr_tail(err: bytes, n: int = 300) -> str:
    text = err.decode("utf-8", "replace").strip().replace("\n", " | ")
    return text[-n:] if text else "no message"


class WriteError(Exception):
    """Writing into DST failed: the destination's fault, not this image's; ends the run."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


def _write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to a hidden temporary name (holding our pid), fsync, rename.

    Raises WriteError for any OSError: a full, read-only or forbidden DST.
    """
    try:
        write_atomic(path, data, tmp=path.with_name(f"{_TMP_PREFIX}{os.getpid()}-{path.name}"))
    except OSError as e:
        raise WriteError(e) from e


def _remove_dead_temp_files(dst: Path) -> int:
    """Remove the temporary files of compress runs that died (their pid is gone)."""
    removed = 0
    for dirpath, _dirs, files in os.walk(dst):
        for name in files:
            if not name.startswith(_TMP_PREFIX):
                continue
            pid = name[len(_TMP_PREFIX) :].split("-", 1)[0]
            if pid.isdigit() and _alive(int(pid)):
                continue  # another compress into this DST is writing it now
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(dirpath, name))
                removed += 1
    if removed:
        log.info("removed %d temporary file(s) left in %s by an interrupted run", removed, dst)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # ours are never left over from this run
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_source(path: Path) -> bytes:
    """The bytes of a regular file, at most as many as it held when opened."""
    try:
        with open_regular(path) as f:
            return f.read(os.fstat(f.fileno()).st_size)
    except DecodeError as e:
        raise ValueError(str(e)) from None


def compress_one(exe: str, src_path: Path, dst_path: Path, config: CompressConfig) -> int:
    """Recompress one file; return bytes written. Raises ValueError with the reason on failure."""
    data = _read_source(src_path)
    try:
        fmt, orientation, alpha, size = _probe(data)
    except Exception as e:
        raise ValueError(f"not an image Pillow can identify ({type(e).__name__})") from None
    if size[0] * size[1] > config.max_pixels:
        raise ValueError(
            f"image is {size[0]}x{size[1]} = {size[0] * size[1]:,} pixels, above the limit of "
            f"{config.max_pixels:,} (possible decompression bomb)"
        )
    if fmt in _DIRECT:
        pipe_fmt = _DIRECT[fmt]
    else:
        try:
            data, pipe_fmt = _to_png(data), "png_pipe"
        except Exception as e:
            raise ValueError(f"cannot decode {fmt} image: {e}") from None
    cmd = ffmpeg_command(exe, pipe_fmt, orientation, alpha, size, config)
    proc = subprocess.run(cmd, input=data, capture_output=True, check=False)
    if proc.returncode != 0 or not proc.stdout:
        raise ValueError(f"ffmpeg exit {proc.returncode}: {_stderr_tail(proc.stderr)}")
    if proc.stderr.strip():
        raise ValueError(f"ffmpeg reported: {_stderr_tail(proc.stderr)}")
    try:
        with open_image(io.BytesIO(proc.stdout)) as check:
            check.load()
    except Exception as e:
        raise ValueError(f"ffmpeg's output does not decode: {e}") from None
    _write_atomic(dst_path, proc.stdout)
    return len(proc.stdout)


def compress(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    config: CompressConfig = CompressConfig(),
    progress: Callable[[int], None] | None = None,
    on_start: Callable[[int, int], None] | None = None,
) -> CompressResult:
    """Recompress every image under ``src`` into ``dst`` (same folders, ``.jpg``).

    Bad inputs are skipped and listed in the result (``skipped_inputs``), not
    raised; outputs an earlier run made with the same options are already done. Raises PackerError
    subclasses for unusable options, paths or a missing ffmpeg.
    """
    t0 = time.perf_counter()
    config.validate()
    src, dst = Path(src), Path(dst)
    result = CompressResult()
    followed: list[str] = []
    rels = _list_images(src, result.skipped_inputs, followed)
    rs, rd = src.resolve(), dst.resolve()
    if rd == rs or rd.is_relative_to(rs):
        raise InputError(
            f"{dst}: the output would be inside the source {src}; choose a destination outside it"
        )
    # SRC may reach DST's folder through a symbolic link: every rerun would then
    # compress its own outputs again, one level deeper each time
    for real in map(Path, followed):
        if rd == real or rd.is_relative_to(real):
            raise InputError(
                f"{dst}: the output would be inside {real}, which the scan of {src} reaches "
                "through a symbolic link; choose a destination outside it"
            )
    if dst.exists() and not dst.is_dir():
        raise InputError(f"{dst}: exists and is not a folder")
    exe = ffmpeg_exe()
    names = output_names(rels)
    try:
        dst.mkdir(parents=True, exist_ok=True)
        _remove_dead_temp_files(dst)
        made_since = _record_options(dst, config)
    except (OSError, WriteError) as e:
        raise destination_error(getattr(e, "error", e), dst) from None
    todo: list[str] = []
    for rel in rels:
        out = dst / names[rel]
        try:
            st = out.stat()
        except FileNotFoundError:
            st = None
        if st is not None and not config.overwrite and st.st_mtime_ns >= made_since:
            result.already_done += 1
            result.bytes_in += (src / rel).stat().st_size
            result.bytes_out += st.st_size
        else:
            todo.append(rel)
    if on_start:
        on_start(len(rels), result.already_done)

    def one(rel: str) -> tuple[str, int, int, str | None]:
        sp, dp = src / rel, dst / names[rel]
        try:
            if not dp.parent.resolve().is_relative_to(rd):
                raise ValueError(f"output folder {dp.parent} leads outside {dst}; refusing")
            try:
                dp.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise WriteError(e) from e
            size_in = sp.stat().st_size
            return rel, size_in, compress_one(exe, sp, dp, config), None
        except (ValueError, OSError) as e:
            return rel, 0, 0, str(e)

    workers = min(config.workers or default_workers(), max(1, len(todo)))
    pool = ThreadPoolExecutor(workers, thread_name_prefix="imgpack-ffmpeg")
    try:
        for rel, size_in, size_out, err in pool.map(one, todo):
            if err is None:
                result.written += 1
                result.bytes_in += size_in
                result.bytes_out += size_out
            else:
                result.skipped_inputs.append({"path": rel, "reason": err})
            if progress:
                progress(1)
    except WriteError as e:
        pool.shutdown(wait=True, cancel_futures=True)
        raise destination_error(e.error, dst) from None
    except BaseException:
        # Ctrl-C: the images not started yet are dropped, not run to the end
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    result.skipped_inputs.sort(key=lambda f: f["path"])
    result.seconds = time.perf_counter() - t0
    return result


def _record_options(dst: Path, config: CompressConfig) -> int:
    """Record the options in DST; return the time (ns, file clock) from which outputs count.

    Outputs older than that were made with other options and are redone. A DST
    without a record (new, or made by an older imgpack) keeps what it has.
    """
    path = dst / OPTIONS_FILE
    opts = {"quality": config.quality, "max_side": config.max_side}
    try:
        old = loads_json(path.read_bytes())
    except FileNotFoundError:
        old = {"keep_older": True, **opts}
    except (OSError, ValueError):
        old = {"keep_older": False}
    if not isinstance(old, dict):
        old = {"keep_older": False}
    same = all(old.get(k) == v for k, v in opts.items())
    if not same:
        log.info("%s: made with other options (%s); redoing its outputs", dst, old)
    keep_older = bool(old.get("keep_older")) and same
    if not path.exists() or not same:
        _write_atomic(path, json.dumps({**opts, "keep_older": keep_older}).encode())
    return 0 if keep_older else path.stat().st_mtime_ns
