"""The JPEG kind: each image's JPEG file, back to back, with an offset table, and its
pack class :class:`JpegPack`; the reader's bounds on a stored JPEG's size.

No torch at import: :class:`JpegPack` asks for it in its methods.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from .._fs import fsync_dir, write_atomic
from ..errors import DecodeError, PackerError, PackFormatError, UsageError
from ..imaging.limits import DEFAULT_MAX_PIXELS
from .hashing import digest
from .kind import Parts, Progress, StorageKind, pack_dir
from .labels import check_label_arrays
from .layout import (
    DATA_DIR,
    JPEG_FILE,
    JPEG_STORAGE_VERSION,
    LABELS_FILE,
    LENGTHS_FILE,
    OFFSETS_FILE,
    SIZES_FILE,
    FieldSpec,
    Layout,
)

if TYPE_CHECKING:
    import torch

    from .schema import Manifest  # above the kinds: its fields are their answers


class JpegKind(StorageKind):
    """Each image's JPEG file, back to back in ``jpeg.memmap``, with int64 offsets,
    lengths and (h, w) sizes [N, 2] (``--store jpeg``)."""

    name = "jpeg"
    decoded = True
    gpu_build = False  # the files are stored as they are; decoded on the GPU when read
    chunk_files = True
    verify_reads: ClassVar[Mapping[str, str]] = {
        "images": f"{DATA_DIR}/{JPEG_FILE}",
        "decode": f"{DATA_DIR}/{JPEG_FILE}",
        "labels": f"{DATA_DIR}/{LABELS_FILE}",
    }

    def fields(self, m: Manifest) -> tuple[FieldSpec, ...]:
        return (
            FieldSpec("jpeg", JPEG_FILE, "uint8", (), rows=m.jpeg_bytes),
            FieldSpec("offsets", OFFSETS_FILE, "int64", ()),
            FieldSpec("lengths", LENGTHS_FILE, "int64", ()),
            FieldSpec("sizes", SIZES_FILE, "int64", (2,)),
        )

    def manifest_json(self, m: Manifest) -> dict[str, Any]:
        return {
            "storage": m.storage,
            "storage_version": m.storage_version,
            "jpeg_bytes": m.jpeg_bytes,
            "max_side": m.max_side,
            "quality": m.quality,
            "checksums": {"index": m.checksums.index},
        }

    def describe(self, m: Manifest) -> dict[str, Any]:
        return {"storage": m.storage, "jpeg_bytes": m.jpeg_bytes}

    def summary(self, count: int, image_shape: Sequence[int], max_side: int | None) -> str:
        """``36 stored JPEGs (each its own size, up to 512 wide x 384 high, max side
        512), decoded when read``: a JPEG pack has no one shape."""
        _, h, w = image_shape
        bound = f", max side {max_side}" if max_side else ""
        return (
            f"{count} stored {self.name.upper()}s (each its own size, up to {w} wide x {h} "
            f"high{bound}), decoded when read"
        )

    def shape_fits(self, shard: Sequence[int], whole: Sequence[int]) -> bool:
        return all(a <= b for a, b in zip(shard, whole))  # the set's: the largest image

    def check_options(self, config: Any) -> None:
        if config.device not in ("cpu", "auto"):
            raise UsageError(
                f"BuildConfig.device {config.device} decodes and resizes raw packs; "
                "BuildConfig.store jpeg stores the files as they are (they are decoded on "
                "the GPU when read)",
                field="BuildConfig.device",
            )

    def fingerprint(self, config: Any) -> list[Any] | None:
        return [self.name, config.quality, config.max_side]

    def cut(self, sizes: list[int], row_bytes: int, shard_size: int) -> list[tuple[int, int]]:
        """By cumulative source bytes: a shard ends before the input that would take it
        past ``shard_size`` (at least one input a shard)."""
        n = len(sizes)
        out, start, total = [], 0, 0
        for i, s in enumerate(sizes):
            if i > start and total + s > shard_size:
                out.append((start, i))
                start, total = i, 0
            total += s
        if start < n:
            out.append((start, n))
        return out

    semantic_store = "png"  # beside compressed images, compressed masks

    def stored_frames(
        self, data_dir: Path, count: int, image_shape: Sequence[int], resize: str
    ) -> tuple[str, list[tuple[int, int]]]:
        """Each stored file is its whole source, scaled (``max_side``) or as it was: a
        stretch to its recorded (h, w)."""
        hw = np.fromfile(data_dir / SIZES_FILE, dtype="<i8").reshape(-1, 2)
        return "stretch", [(int(h), int(w)) for h, w in hw[:count]]

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
        check_label_arrays(tensors["labels"], tensors.get("targets"), where=str(root))
        check_stored_sizes(tensors["sizes"].numpy(), m, root, max_pixels)
        return JpegPack(tensors, m, root)

    def source_tensor(self, pack: Any) -> torch.Tensor:
        return pack.jpeg

    def stored_images(self, pack: Any, rows: Sequence[int]) -> list[torch.Tensor]:
        return pack.decode(rows, "cpu")

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

    def block_hashes(self, path: Path, m: Manifest, shard: Path) -> list[str]:
        """The blocks' byte ranges from the shard's lengths file (checked when the set
        was opened)."""
        block, n = m.checksums.block_rows, m.count
        lengths = np.fromfile(shard / DATA_DIR / LENGTHS_FILE, dtype="<i8")
        ends = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        got = []
        with open(path, "rb") as f:
            for b in range(len(m.checksums.images)):
                lo, hi = b * block, min(n, (b + 1) * block)
                f.seek(int(ends[lo]))
                got.append(digest(f.read(int(ends[hi] - ends[lo]))))
        return got

    def check_index(self, shard: Path, m: Manifest) -> str | None:
        """The three index files in ``shard`` against the manifest's SHA-256."""
        files = (OFFSETS_FILE, LENGTHS_FILE, SIZES_FILE)
        parts = [(shard / DATA_DIR / f).read_bytes() for f in files]
        if digest(b"".join(parts)) != m.checksums.index:
            return "offsets/lengths/sizes do not match the manifest's SHA-256"
        return None

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


JPEG = JpegKind()


JPEG_MAX_SIDE = 65535  # a JPEG frame header's sides are 16-bit


def read_max_pixels(max_pixels: int | None) -> int:
    """The most pixels a reader lets one stored image decode to: the user's
    ``max_pixels=`` (checked here), or :data:`DEFAULT_MAX_PIXELS`. Never the pack's
    own ``build.max_pixels``, which a hostile pack sets as it likes (issue 42.3); that
    figure may only lower the bound."""
    if max_pixels is None:
        return DEFAULT_MAX_PIXELS
    if isinstance(max_pixels, bool) or not isinstance(max_pixels, (int, np.integer)):
        raise UsageError(f"max_pixels must be an int, not {type(max_pixels).__name__}")
    if not 1 <= max_pixels <= JPEG_MAX_SIDE * JPEG_MAX_SIDE:
        raise UsageError(f"max_pixels must be 1 to {JPEG_MAX_SIDE**2:,}, not {max_pixels}")
    return int(max_pixels)


def check_stored_sizes(
    sizes: np.ndarray, m: Manifest, root: Path, max_pixels: int | None = None
) -> None:
    """A JPEG pack's stored (h, w) [N, 2], each inside the reader's bounds: 1 to
    ``max_side`` (or 65535, a JPEG's most) a side, at most ``max_pixels`` pixels (the
    reader's: :func:`read_max_pixels`; the build's own ``max_pixels`` only lowers it). A
    decoder allocates what a JPEG's header says, and readers check each header against
    these before decoding, so this bounds every decode of the pack (a 2 KB file saying
    65000x65000 would ask for 12 GB). PackFormatError naming the first image outside."""
    if not len(sizes):
        return
    side = min(m.max_side or JPEG_MAX_SIDE, JPEG_MAX_SIDE)
    most = min(m.build.max_pixels, read_max_pixels(max_pixels))
    bad = ((sizes < 1) | (sizes > side)).any(1)
    inside = np.where(bad[:, None], 1, sizes)  # sides bounded: the product cannot overflow
    bad |= inside[:, 0] * inside[:, 1] > most
    if bad.any():
        i = int(bad.argmax())
        h, w = (int(v) for v in sizes[i])
        mine = "" if most == m.build.max_pixels else "; pass max_pixels= to packer.load to raise"
        raise PackFormatError(
            f"{root}: image {i}: the pack gives its size as {w}x{h}, outside what this reader "
            f"allows (sides 1 to {side}, at most {most:,} pixels{mine}); the pack is "
            "damaged or not from imgpack, refusing it"
        )


class JpegPack:
    """A pack of JPEG files (``imgpack build --store jpeg``), opened read-only.

    Fields (memory-mapped, read-only):
      jpeg: Tensor[total_bytes], uint8: every image's JPEG file, back to back.
      offsets, lengths: Tensor[N], int64: where image i's bytes are in ``jpeg``.
      sizes: Tensor[N, 2], int64: image i's (height, width), upright.
      labels: Tensor[N], int64; targets: Tensor[N, K] float32 or None.
    Plus ``classes``, ``class_to_idx``, ``target_names``, ``sources``, ``manifest``,
    ``path`` as :class:`ImagePack`. Stream it with
    ``PackLoader(pack, B, image_size=S)``; :meth:`decode` decodes a few images.
    The offsets are never trusted: :meth:`read` checks each one.
    """

    storage = JPEG.name
    kind = JPEG

    def __init__(self, tensors: dict[str, torch.Tensor], manifest: Manifest, root: Path) -> None:
        self.jpeg = tensors["jpeg"]
        self.offsets = tensors["offsets"]
        self.lengths = tensors["lengths"]
        self.sizes = tensors["sizes"]
        self.labels = tensors["labels"]
        self.targets = tensors.get("targets")
        self.manifest = manifest
        self.path = root
        self.classes = list(manifest.classes)
        self.sources = list(manifest.sources)

    def __len__(self) -> int:
        return self.manifest.count

    @property
    def class_to_idx(self) -> dict[str, int]:
        return dict(self.manifest.class_to_idx)

    @property
    def target_names(self) -> list[str]:
        return list(self.manifest.targets)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(3, H, W): the largest stored image's sides (as a JPEG set's)."""
        c, h, w = self.manifest.image_shape
        return (c, h, w)

    def __dir__(self) -> list[str]:
        own = ("jpeg", "offsets", "lengths", "sizes", "manifest", "read", "decode")
        return pack_dir(self, own)

    @property
    def images(self) -> torch.Tensor:
        raise UsageError(
            f"{self.path}: a JPEG pack stores compressed files, not an images tensor; "
            "stream it with PackLoader(pack, batch_size, image_size=S) or decode a few "
            "with pack.decode(indices)"
        )

    def read(self, indices: Any, check_ends: bool = False) -> list[torch.Tensor]:
        """The stored bytes of images ``indices`` (ints into the pack): uint8 [n_i] each,
        views of the mapped file. Raises PackFormatError naming the first image whose
        offset or length leaves the byte file, and with ``check_ends`` the first that
        does not end with a JPEG's end-of-image marker."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(idx) and (idx.min() < 0 or idx.max() >= len(self)):
            bad = int(idx[(idx < 0) | (idx >= len(self))][0])
            raise UsageError(f"image index {bad} is outside the pack of {len(self)} images")
        off = self.offsets.numpy()[idx]
        ln = self.lengths.numpy()[idx]
        total = self.jpeg.shape[0]
        bad = (off < 0) | (ln < 1) | (off > total) | (ln > total - np.clip(off, 0, total))
        if bad.any():
            k = int(bad.argmax())
            raise PackFormatError(
                f"{self.path}: image {int(idx[k])}: offset {int(off[k])} + length {int(ln[k])} "
                f"leaves the {total}-byte JPEG file; the pack is damaged, rebuild it"
            )
        # numpy slices of the mapping, then plain tensors: slicing the MemoryMappedTensor
        # subclass costs tens of microseconds per image, a batch of 256 milliseconds
        data = self._bytes()
        if check_ends and len(idx):
            # every stored JPEG ends with its EOI marker (nvjpeg decodes a truncated one
            # inside a batch without an error): two bytes per image, one gather
            end = off + ln
            bad = (ln < 4) | (data[np.maximum(end - 2, 0)] != 0xFF) | (data[end - 1] != 0xD9)
            if bad.any():
                from ..imaging.jpeg import truncated

                raise truncated(int(idx[int(bad.argmax())]))
        import torch

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # read-only mapping: never written
            return [torch.from_numpy(data[o : o + n]) for o, n in zip(off.tolist(), ln.tolist())]

    def _bytes(self) -> np.ndarray:
        arr = self.__dict__.get("_np")
        if arr is None:
            arr = self.jpeg.numpy() if self.jpeg.numel() else np.empty(0, np.uint8)
            self.__dict__["_np"] = arr
        return arr

    def decode(self, indices: Any, device: str | torch.device = "cpu") -> list[torch.Tensor]:
        """Decode images ``indices``: list of uint8 [3, h_i, w_i] in [0, 255] on ``device``."""
        from ..imaging.jpeg import decode_batch

        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        datas = self.read(idx, check_ends=True)  # checks the indices too
        return decode_batch(
            datas,
            device,
            indices=idx.tolist(),
            ends_checked=True,
            sizes=self.sizes.numpy()[idx],
        )
