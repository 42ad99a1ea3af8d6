"""A source's options (``BuildConfig.sources``): its own module, so the build's config
imports it without the readers (no import circle)."""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import UsageError

# The largest image (encoded bytes) any source reader reads into memory; a larger cell,
# member or object is skipped unread where its size is known first.
DEFAULT_MAX_IMAGE_BYTES = 256 << 20


@dataclass(frozen=True)
class SourceOptions:
    """How a source's columns and fields are found, and the per-image byte cap.

    ``image_column`` / ``label_column``: the table's columns (parquet, Arrow) when they
    cannot be told from the schema. ``label_field``: a WebDataset sample's ``json``
    field holding the label (default: the ``cls`` member). ``max_image_bytes``: an
    image larger than this is skipped, never read whole into memory. ``spool_bytes``:
    the most bytes of a bucket's tar shards a build fetches whole into its spool beside
    DST (:mod:`packer.builder.formats.spool`; None: 64 GiB, 0: none), at most half the
    disk's free space; a shard past it is read in place by ranged reads."""

    image_column: str | None = None
    label_column: str | None = None
    label_field: str | None = None
    max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES
    spool_bytes: int | None = None
    # the read-ahead of a bucket object's listing (tar headers and labels), in bytes;
    # a tuning knob tests pass (a block smaller than their small shards)
    _read_ahead: int = 4 << 20

    def validate(self) -> None:
        if not 1 <= self.max_image_bytes <= 1 << 40:
            raise UsageError(
                f"SourceOptions.max_image_bytes must be 1 byte to 1 TiB, not {self.max_image_bytes}",
                field="SourceOptions.max_image_bytes",
            )
        if self.spool_bytes is not None and not 0 <= self.spool_bytes <= 1 << 50:
            raise UsageError(
                f"SourceOptions.spool_bytes must be 0 to 1 PiB (or None), not {self.spool_bytes}",
                field="SourceOptions.spool_bytes",
            )
