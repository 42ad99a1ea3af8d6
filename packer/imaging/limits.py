"""The decoder's vocabulary that a pack's manifest records, without Pillow or numpy:
the resize modes and the default bound on an image's pixels. :mod:`packer.imaging.decode`
defines what they mean; the manifest's reader (``imgpack info``, ``verify``) needs only
the names, and starts without the decoder."""

from __future__ import annotations

RESIZE_MODES = ("stretch", "crop", "pad")
DEFAULT_MAX_PIXELS = 100_000_000
