"""Storage kinds: how a pack's images are stored, each one class.

A kind answers, for the manifests of its ``storage`` name:

* ``fields(m)``: its data files under ``_tensordict/`` (names, dtypes, per-row shapes);
  labels and targets are every kind's and come after (``Manifest.fields``);
* ``assemble(data_dir, parts)``: the build's last write of its data files (finalize
  calls it; the workers' chunk writers stay in :mod:`packer.build.workers`), and
  ``stamp(m, written)``: the manifest fields it owns;
* ``open(root, m, tensors)``: the mapped files (already size-checked against
  ``fields``) checked further and wrapped as a pack object;
* ``verify(root, m, progress, threads)``: its integrity check, ``(ok, detail)``;
  ``same_as_source(pack, m, path, i)``: whether image ``i`` is what its source
  gives again (verify's sample), on the pack or on ``checked_view(root, m)``: what
  the integrity checks read, opened without torch where the kind can (raw rows);
* ``batch(pack, indices, device, crop)``: one batch uint8 [B, 3, h, w] on a device;
  the loader's pipelined passes (:mod:`packer.loading.strategies`) use the same steps,
  overlapped.

``decoded`` tells readers whether the kind's images have one stored size (raw rows)
or are decoded to a size the reader picks (``image_size=``). The registry
:data:`KINDS` maps each ``storage`` name to its kind; :func:`kind_of` gives a
manifest's. A new kind is a subclass registered here, nothing more. Sharded and
remote packs (a pack set) are not kinds: they are lists of shards, each opened by its
kind (see docs/ARCHITECTURE.md, "Storage kinds"). No torch at import.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from .._fs import fsync_dir, write_atomic
from ..errors import DecodeError, PackerError, UsageError
from ..imaging.limits import DEFAULT_MAX_PIXELS
from .schema import (
    IMAGES_FILE,
    JPEG_FILE,
    JPEG_STORAGE_VERSION,
    LENGTHS_FILE,
    OFFSETS_FILE,
    SIZES_FILE,
    FieldSpec,
    Layout,
    Manifest,
)
from .writer import digest, hash_blocks

if TYPE_CHECKING:
    import torch

Progress = Callable[[int], None]


@dataclass
class Parts:
    """What a build hands its kind to assemble, in the work folder.

    ``rows``: the data file the workers wrote (raw: the rows, preallocated; JPEG: only a
    marker that the chunk files are not yet joined). ``chunk_file(k)``: chunk ``k``'s
    file (JPEG). ``done``: the journal's records by chunk. ``keep``: the kept images,
    ``skipped`` whether any was skipped. ``block``: images per checksum block."""

    rows: Path
    chunk_file: Callable[[int], Path]
    chunk_dir: Path
    done: Mapping[int, Mapping[str, Any]]
    keep: list[int]
    skipped: bool
    block: int
    row_bytes: int
    shas: list[str]
    clock: dict[str, float] = field(default_factory=dict)  # seconds per step, by name


class StorageKind:
    """One way of storing images; see the module's docstring for the interface."""

    name: ClassVar[str]
    decoded: ClassVar[bool]  # images decoded to a size the reader picks (no fixed row)

    def fields(self, m: Manifest) -> tuple[FieldSpec, ...]:
        raise NotImplementedError

    def assemble(self, data_dir: Path, parts: Parts) -> dict[str, Any]:
        """Write the data files from the workers' output; returns at least ``shas``."""
        raise NotImplementedError

    def stamp(self, m: Manifest, written: Mapping[str, Any]) -> Manifest:
        """``m`` with the fields this kind owns set from what :meth:`assemble` wrote."""
        return m

    def open(
        self,
        root: Path,
        m: Manifest,
        tensors: dict[str, torch.Tensor],
        max_pixels: int | None = None,
    ) -> Any:
        """The pack object over ``tensors``; ``max_pixels``: the reader's bound on a
        stored image (kinds that decode; see ``reader.check_stored_sizes``)."""
        raise NotImplementedError

    def source_tensor(self, pack: Any) -> torch.Tensor:
        """The mapped tensor a loader reads images from."""
        raise NotImplementedError

    def verify(
        self, root: Path, m: Manifest, progress: Progress | None, threads: int
    ) -> tuple[bool, str]:
        raise NotImplementedError

    def same_as_source(self, pack: Any, m: Manifest, path: str, i: int) -> bool:
        raise NotImplementedError

    def checked_view(self, root: Path, m: Manifest) -> Any:
        """What the integrity checks of ``verify`` read of a pack whose files
        :func:`~packer.pack.files.check_files` passed (``same_as_source``,
        ``check_decodes``): the pack itself, opened with its kind's checks."""
        from .reader import open_pack

        return open_pack(root, m)

    def batch(
        self, pack: Any, indices: Any, device: str | torch.device = "cpu", crop: Any = None
    ) -> torch.Tensor:
        raise NotImplementedError


class RawKind(StorageKind):
    """uint8 rows [N, 3, H, W] of one size, C-order, in ``images.memmap``."""

    name = "raw"
    decoded = False

    def fields(self, m: Manifest) -> tuple[FieldSpec, ...]:
        return (FieldSpec("images", IMAGES_FILE, "uint8", m.image_shape),)

    def assemble(self, data_dir: Path, parts: Parts) -> dict[str, Any]:
        """The rows file fsynced, then renamed into place, or its kept rows copied
        (:func:`compact_rows`) when images were skipped. Restartable: with the rows file
        gone (an earlier run compacted it), the compacted file is hashed again."""
        images = data_dir / IMAGES_FILE
        shas, row, block = parts.shas, parts.row_bytes, parts.block
        if parts.rows.exists():
            t = time.perf_counter()
            fd = os.open(parts.rows, os.O_RDONLY)
            try:
                os.fsync(fd)  # all rows durable before anything depends on them
            finally:
                os.close(fd)
            parts.clock["fsync_rows"] = time.perf_counter() - t
            if parts.skipped:
                shas = compact_rows(parts.rows, images, parts.keep, row, block)
                os.remove(parts.rows)
            else:
                os.replace(parts.rows, images)
        elif parts.skipped:  # compacted by an earlier run that stopped before the manifest
            size = os.path.getsize(images)
            shas = hash_blocks(images, row * block, -(-size // (row * block)))
        return {"shas": shas}

    def open(
        self,
        root: Path,
        m: Manifest,
        tensors: dict[str, torch.Tensor],
        max_pixels: int | None = None,
    ) -> Any:
        from ..errors import PackFormatError
        from .parse import check_label_arrays
        from .reader import ImagePack

        if not {"images", "labels"} <= set(tensors) <= {"images", "labels", "targets"}:
            raise PackFormatError(
                f"{root}: holds fields {sorted(tensors)} this imgpack cannot open; upgrade imgpack"
            )
        # the manifest was checked; this guards the mapping itself against a future slip
        check_label_arrays(tensors["labels"], tensors.get("targets"), where=str(root))
        pack = ImagePack(
            images=tensors["images"],
            labels=tensors["labels"],
            targets=tensors.get("targets"),
            batch_size=[m.count],
        )
        pack.__dict__["_imgpack_manifest"] = m
        pack.__dict__["_imgpack_path"] = root
        pack.__dict__["_imgpack_classes"] = list(m.classes)
        pack.__dict__["_imgpack_sources"] = list(m.sources)
        return pack

    def source_tensor(self, pack: Any) -> torch.Tensor:
        return pack.images

    def verify(
        self, root: Path, m: Manifest, progress: Progress | None, threads: int
    ) -> tuple[bool, str]:
        """Each block of ``block_rows`` rows hashed (on ``threads`` threads) against the
        manifest's SHA-256; a mismatch names the block, its images and sources."""
        ck = m.checksums
        block, want, n = ck.block_rows, ck.images, m.count
        if block < 1 or len(want) != (n + block - 1) // block:
            if progress:
                progress(n)
            return False, (
                f"manifest lists {len(want)} checksums for {n} images in "
                f"blocks of {block}; the manifest is damaged"
            )

        def done(k: int) -> None:
            if progress:
                progress(min(n, (k + 1) * block) - k * block)

        got = hash_blocks(Layout(root).images, m.image_bytes * block, len(want), done, threads)
        bad: list[str] = []
        for k, (sha, expect) in enumerate(zip(got, want)):
            if sha != expect:
                lo, hi = k * block, min(n, (k + 1) * block)
                names = ", ".join(m.sources[lo : min(hi, lo + 3)])
                more = f" and {hi - lo - 3} more" if hi - lo > 3 else ""
                bad.append(f"block {k} (images {lo}-{hi - 1}: {names}{more})")
        if bad:
            return False, (
                f"checksum mismatch in {len(bad)} of {len(want)} blocks: "
                + "; ".join(bad[:5])
                + ("; ..." if len(bad) > 5 else "")
                + ". The image data changed since the build; rebuild the pack"
            )
        return True, f"{n} images, {len(want)} blocks, SHA-256 match"

    def checked_view(self, root: Path, m: Manifest) -> Any:
        """The rows as a read-only numpy map (``.images`` [N, 3, H, W]): all that
        ``same_as_source`` reads, so ``imgpack verify --no-speed`` needs no torch.
        The files' sizes were checked against the manifest."""
        rows: np.ndarray = np.empty((0, *m.image_shape), np.uint8)
        if m.count:
            shape = (m.count, *m.image_shape)
            rows = np.memmap(Layout(root).images, np.uint8, "r", shape=shape)
        return RawRows(rows)

    def same_as_source(self, pack: Any, m: Manifest, path: str, i: int) -> bool:
        """The source re-decoded exactly as the build did gives row ``i``'s pixels
        (``pack``: an :class:`ImagePack` or a :class:`RawRows`)."""
        from ..imaging.decode import ResizeSpec, decode

        # the reader's bound on a source's pixels (reader.read_max_pixels(None), the
        # default); the pack's own figure only lowers it
        spec = ResizeSpec(m.width, m.height, m.resize, min(m.build.max_pixels, DEFAULT_MAX_PIXELS))
        try:
            return np.array_equal(decode(path, spec), np.asarray(pack.images[i]))
        except DecodeError:
            return False

    def batch(
        self, pack: Any, indices: Any, device: str | torch.device = "cpu", crop: Any = None
    ) -> torch.Tensor:
        """Rows ``indices`` uint8 [B, 3, H, W] on ``device``: gathered (a memcpy per
        row) into pinned memory for CUDA, then copied without blocking the host."""
        import torch

        if crop is not None:
            raise UsageError("a raw pack's rows have the size it was built with; no crop")
        dev = torch.device(device)
        idx = np.asarray(indices, dtype=np.intp).reshape(-1)
        src = pack.images
        out = torch.empty(
            (len(idx), *src.shape[1:]), dtype=torch.uint8, pin_memory=dev.type == "cuda"
        )
        if len(idx):
            np.take(src.numpy(), idx, 0, out.numpy(), "raise")
        return out if dev.type == "cpu" else out.to(dev, non_blocking=True)


@dataclass(frozen=True)
class RawRows:
    """A raw pack's rows mapped with numpy (:meth:`RawKind.checked_view`)."""

    images: np.ndarray


class JpegKind(StorageKind):
    """Each image's JPEG file, back to back in ``jpeg.memmap``, with int64 offsets,
    lengths and (h, w) sizes [N, 2] (``--store jpeg``)."""

    name = "jpeg"
    decoded = True

    def fields(self, m: Manifest) -> tuple[FieldSpec, ...]:
        return (
            FieldSpec("jpeg", JPEG_FILE, "uint8", (), rows=m.jpeg_bytes),
            FieldSpec("offsets", OFFSETS_FILE, "int64", ()),
            FieldSpec("lengths", LENGTHS_FILE, "int64", ()),
            FieldSpec("sizes", SIZES_FILE, "int64", (2,)),
        )

    def assemble(self, data_dir: Path, parts: Parts) -> dict[str, Any]:
        """Join the chunk files, in order, into ``jpeg.memmap`` and write the offsets,
        lengths and sizes of the kept images. Restartable: the chunk files are removed
        only after the byte file is complete and fsynced (``parts.rows``, the marker, is
        removed between); a rerun that finds them gone hashes the byte file instead.

        Returns ``shas`` (SHA-256 per block of kept images' bytes), ``index`` (of the
        three index files), ``bytes``, ``max_hw`` and ``reencoded``."""
        import shutil

        done = parts.done
        lengths: list[int] = []
        stored: list[list[int]] = []
        reencoded = 0
        for k in sorted(done):
            rec = done[k]
            lengths.extend(n for n in rec["lengths"] if n > 0)
            stored.extend(hw for n, hw in zip(rec["lengths"], rec["stored"]) if n > 0)
            reencoded += int(rec.get("reencoded", 0))
        lens = np.array(lengths, dtype="<i8")
        offsets = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype("<i8") if len(lens) else lens
        sizes = np.array(stored, dtype="<i8").reshape(-1, 2)
        out = data_dir / JPEG_FILE
        if parts.rows.exists():  # the marker: chunks not yet joined into ``out``
            tmp = out.with_name(out.name + ".tmp")
            with open(tmp, "wb") as f:
                for k in sorted(done):
                    f.write(parts.chunk_file(k).read_bytes())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, out)
            fsync_dir(out.parent)
            parts.rows.unlink()
            fsync_dir(parts.rows.parent)
        shutil.rmtree(parts.chunk_dir, ignore_errors=True)
        shas: list[str] = []
        with open(out, "rb") as f:
            for b in range(0, len(lens), parts.block):
                shas.append(digest(f.read(int(lens[b : b + parts.block].sum()))))
        index = offsets.tobytes() + lens.tobytes() + sizes.tobytes()
        write_atomic(data_dir / OFFSETS_FILE, offsets.tobytes())
        write_atomic(data_dir / LENGTHS_FILE, lens.tobytes())
        write_atomic(data_dir / SIZES_FILE, sizes.tobytes())
        return {
            "shas": shas,
            "index": digest(index),
            "bytes": int(lens.sum()),
            "max_hw": tuple(int(v) for v in sizes.max(0)) if len(sizes) else (1, 1),
            "reencoded": reencoded,
        }

    def stamp(self, m: Manifest, written: Mapping[str, Any]) -> Manifest:
        extra = {**m.build.extra, "reencoded": written["reencoded"]}
        return replace(
            m,
            image_shape=(3, *written["max_hw"]),  # the largest stored image
            storage=self.name,
            storage_version=JPEG_STORAGE_VERSION,
            jpeg_bytes=written["bytes"],
            checksums=replace(m.checksums, index=written["index"]),
            build=replace(m.build, extra=extra),
        )

    def open(
        self,
        root: Path,
        m: Manifest,
        tensors: dict[str, torch.Tensor],
        max_pixels: int | None = None,
    ) -> Any:
        from .parse import check_label_arrays
        from .reader import JpegPack, check_stored_sizes

        check_label_arrays(tensors["labels"], tensors.get("targets"), where=str(root))
        check_stored_sizes(tensors["sizes"].numpy(), m, root, max_pixels)
        return JpegPack(tensors, m, root)

    def source_tensor(self, pack: Any) -> torch.Tensor:
        return pack.jpeg

    def verify(
        self, root: Path, m: Manifest, progress: Progress | None, threads: int
    ) -> tuple[bool, str]:
        """The index files' checksum, offsets that tile the byte file in order, and the
        SHA-256 of each block of ``block_rows`` images' bytes."""
        lay = Layout(root)
        raw = [lay.data(f).read_bytes() for f in (OFFSETS_FILE, LENGTHS_FILE, SIZES_FILE)]
        off, ln = (np.frombuffer(r, dtype="<i8") for r in raw[:2])
        ck, n = m.checksums, m.count
        problems = []
        if digest(b"".join(raw)) != ck.index:
            problems.append("offsets/lengths/sizes checksum mismatch")
        ends = np.concatenate([[0], np.cumsum(ln)]) if n else np.zeros(1, np.int64)
        if (ln < 1).any() or not np.array_equal(off, ends[:-1]) or int(ends[-1]) != m.jpeg_bytes:
            problems.append("offsets and lengths do not tile the JPEG file in order")
        block, want = ck.block_rows, ck.images
        if block < 1 or len(want) != (n + block - 1) // block:
            problems.append(f"manifest lists {len(want)} checksums for {n} images")
        if problems:
            if progress:
                progress(n)
            return False, "; ".join(problems) + "; the pack is damaged, rebuild it"
        bad = []
        with open(lay.data(JPEG_FILE), "rb") as f:
            for k, expect in enumerate(want):
                lo, hi = k * block, min(n, (k + 1) * block)
                f.seek(int(ends[lo]))
                if digest(f.read(int(ends[hi] - ends[lo]))) != expect:
                    names = ", ".join(m.sources[lo : min(hi, lo + 3)])
                    bad.append(f"block {k} (images {lo}-{hi - 1}: {names})")
                if progress:
                    progress(hi - lo)
        if bad:
            return False, (
                f"checksum mismatch in {len(bad)} of {len(want)} blocks: "
                + "; ".join(bad[:5])
                + ". The JPEG data changed since the build; rebuild the pack"
            )
        return True, f"{n} JPEGs ({m.jpeg_bytes:,} bytes), SHA-256 match"

    def check_decodes(
        self, pack: Any, m: Manifest, progress: Progress | None, threads: int
    ) -> tuple[bool, str]:
        """Every stored JPEG decodes (CPU, ``threads`` threads) to its recorded size."""
        n = m.count
        sizes = pack.sizes.numpy()

        def decodes(i: int) -> str | None:
            try:
                img = pack.decode([i])[0]  # the frame header checked against its size first
            except PackerError as e:
                return str(e)
            if list(img.shape[1:]) != sizes[i].tolist():
                return f"image {i}: decodes to {list(img.shape[1:])}, recorded {sizes[i].tolist()}"
            return None

        broken = []
        with ThreadPoolExecutor(threads) as pool:
            for what in pool.map(decodes, range(n)):
                if what:
                    broken.append(what)
                if progress:
                    progress(1)
        if broken:
            return False, f"{len(broken)} of {n} stored JPEGs fail: {broken[0]}"
        return True, f"all {n} stored JPEGs decode to their recorded sizes"

    def same_as_source(self, pack: Any, m: Manifest, path: str, i: int) -> bool:
        """The source made into a stored JPEG again gives image ``i``'s bytes."""
        from ..imaging.decode import jpeg_for_pack

        try:
            # the reader's default bound (reader.read_max_pixels(None)), lowered by the pack's
            most = min(m.build.max_pixels, DEFAULT_MAX_PIXELS)
            data, *_ = jpeg_for_pack(path, m.max_side, m.quality or 3, most)
        except DecodeError:
            return False
        return data == bytes(pack.read([i])[0].numpy())

    def batch(
        self, pack: Any, indices: Any, device: str | torch.device = "cpu", crop: Any = None
    ) -> torch.Tensor:
        """Images ``indices`` read (offsets and end markers checked), decoded on
        ``device`` and cropped to ``crop.size``: uint8 [B, 3, h, w]. ``crop``: a
        :class:`packer.loading.crop.JpegCrop` (its random draws unseeded here)."""
        import torch

        from ..imaging.jpeg import decode_batch, resize_images, sizes_of

        if crop is None:
            raise UsageError(
                f"{pack.path}: a JPEG pack's images have many sizes; give an output size "
                "(PackLoader(pack, B, image_size=S)) or decode a few with pack.decode(indices)"
            )
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        datas = pack.read(idx, check_ends=True)
        sizes = torch.from_numpy(pack.sizes.numpy()[idx])
        imgs = decode_batch(datas, device, indices=idx.tolist(), ends_checked=True, sizes=sizes)
        boxes, flip = crop.boxes(sizes, None)
        return resize_images(imgs, crop.size, boxes=boxes, flip=flip, sizes=sizes_of(imgs))


KINDS: dict[str, StorageKind] = {k.name: k for k in (RawKind(), JpegKind())}


def kind_of(m: Manifest | str) -> StorageKind:
    """The kind of a manifest (or of a ``storage`` name); KeyError for an unknown one
    (the manifest's parser refuses those first)."""
    return KINDS[m if isinstance(m, str) else m.storage]


def compact_rows(rows: Path, out_path: Path, keep: list[int], row: int, block: int) -> list[str]:
    """Copy the kept rows of ``rows``, in order, into ``out_path``; per-block checksums.

    Restartable: the source file is untouched until the copy is complete."""
    shas: list[str] = []
    tmp = out_path.with_name(out_path.name + ".tmp")
    with open(rows, "rb") as src, open(tmp, "wb") as out:
        for b in range(0, len(keep), block):
            buf = bytearray()
            for i in keep[b : b + block]:
                src.seek(i * row)
                buf += src.read(row)
            out.write(buf)
            shas.append(digest(buf))
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, out_path)
    return shas
