"""Byte sizes as people write them (``256MB``, ``1GiB``): :func:`parse_bytes`, for
``BuildConfig.shard_size`` and ``SourceOptions.max_image_bytes``. Its own module so that
the command line parses a size without loading the pack-set builder
(:mod:`packer.builder.shards`, which re-exports it)."""

from __future__ import annotations

import re
from fractions import Fraction

from ..errors import UsageError

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
MAX_BYTES = 1 << 50  # the largest size parse_bytes takes (BuildConfig.shard_size's bound)
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*")


def parse_bytes(text: str, option: str = "BuildConfig.shard_size") -> int:
    """``"256MB"`` -> 256000000. Units (any case): B, KB, MB, GB, TB (powers of 1000),
    KiB, MiB, GiB, TiB (powers of 1024); a bare number is bytes. UsageError naming
    ``option`` (a config field, its ``field``) for anything else or a size below one
    byte."""
    m = _SIZE.fullmatch(str(text).lower())
    if m is None or m.group(2) not in _UNITS:
        raise UsageError(
            f"{option} {text!r}: give a size such as 256MB, 1GB or 512MiB "
            "(units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)",
            field=option,
        )
    if len(m.group(1)) > 64:  # no size needs more digits (and a float of them overflows)
        raise UsageError(f"{option} {text[:40]!r}...: too many digits for a size", field=option)
    value = int(Fraction(m.group(1)) * _UNITS[m.group(2)])  # exact, never a float overflow
    if value < 1:
        raise UsageError(f"{option} {text!r}: must be at least one byte", field=option)
    if value > MAX_BYTES:
        raise UsageError(
            f"{option} {text!r}: must be at most 1 PB ({MAX_BYTES:,} bytes)", field=option
        )
    return value
