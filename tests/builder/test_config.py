"""packer.builder.config: ``--size``'s syntax (parse_size) and the one range check (BuildConfig)."""

from __future__ import annotations

import pytest

from packer.builder.config import BuildConfig, parse_size
from packer.errors import UsageError


@pytest.mark.parametrize(
    "text, want", [("224", (224, 224)), ("320x240", (320, 240)), (" 64X32 ", (64, 32))]
)
def test_parse_size(text: str, want: tuple[int, int]) -> None:
    assert parse_size(text) == want


@pytest.mark.parametrize("text", ["abc", "10x", "x10", "1.5", ""])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="size must be S or WxH"):
        parse_size(text)


@pytest.mark.parametrize("text", ["0", "9000", "-5", "224x0"])
def test_size_range_checked_once_by_the_build_config(text: str) -> None:
    size = parse_size(text)  # the syntax is fine; the range is the config's to check
    with pytest.raises(UsageError, match="out of range: each side must be 1 to 8192 pixels"):
        BuildConfig(size=size).validate()
