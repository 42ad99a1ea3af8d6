"""Object-storage URLs: ``s3://bucket/prefix``, ``gs://bucket/prefix``,
``az://container/prefix``. A local path is not a URL and passes through untouched.
No network, no obstore: parsing only."""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass

from ..errors import UsageError

SCHEMES = ("s3", "gs", "az")
_URL = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<rest>.*)", re.S)
_BUCKET = re.compile(r"[a-z0-9][a-z0-9._-]{0,254}", re.I)


@dataclass(frozen=True)
class StorageURL:
    """A parsed URL: ``scheme`` (s3, gs, az), ``bucket`` (or Azure container) and
    ``prefix`` (no leading or trailing ``/``; "" for the bucket's root)."""

    scheme: str
    bucket: str
    prefix: str

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")

    def key(self, *parts: str) -> str:
        """The object key of ``parts`` (joined with ``/``) under the prefix."""
        return "/".join(p for p in (self.prefix, *parts) if p)

    def child(self, *parts: str) -> str:
        """The URL of an object under the prefix, for messages."""
        return f"{self.scheme}://{self.bucket}/{self.key(*parts)}"

    def cache_key(self, endpoint: str | None) -> str:
        """16 hex digits naming this set in a cache: a hash of the URL and the endpoint
        (the same bucket name on two servers is two sets). Never a credential."""
        text = f"{self}\0{endpoint or ''}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def is_url(path: object) -> bool:
    """Whether ``path`` is an object-storage URL (a ``str`` with a ``scheme://``)."""
    return isinstance(path, str) and _URL.match(path) is not None


def redact(text: str) -> str:
    """``text`` for a message: whatever might be user info (all before the last ``@``,
    after any ``scheme://``) replaced by ``***``, whatever characters it holds."""
    if "@" not in text:
        return text
    head, sep, _ = text.partition("://")
    tail = text.rpartition("@")[2]
    return f"{head}://***@{tail}" if sep and "@" not in head else f"***@{tail}"


def _has_userinfo(rest: str) -> bool:
    """Whether ``rest`` (the URL after ``scheme://``) may carry ``user[:secret]@``: any
    ``@`` (a secret holding ``/`` moves the ``@`` past the first ``/``, and a key id
    alone needs no ``:``), so a prefix holding ``@`` is refused too."""
    return "@" in rest


# the clouds' own rules (a name outside them is refused here, in one line, rather than
# by the server after retries): Azure containers 3-63 lowercase letters, digits and
# single hyphens; GCS buckets lowercase letters, digits, '-', '_', '.' (their length,
# 3 to 63 per dot-separated part, is left to the server)
_AZ_CONTAINER = re.compile(r"(?!.*--)[a-z0-9][a-z0-9-]{1,61}[a-z0-9]")
_GS_BUCKET = re.compile(r"[a-z0-9](?:[a-z0-9._-]{0,220}[a-z0-9])?")


def _check_cloud_name(scheme: str, bucket: str) -> None:
    if scheme == "az" and _AZ_CONTAINER.fullmatch(bucket) is None:
        raise UsageError(
            f"az:// URL: {bucket!r} is not an Azure container name (3 to 63 lowercase "
            "letters, digits and single hyphens, starting and ending with a letter or digit)"
        )
    if scheme == "gs" and _GS_BUCKET.fullmatch(bucket) is None:
        raise UsageError(
            f"gs:// URL: {bucket!r} is not a Google Cloud Storage bucket name (lowercase "
            "letters, digits, '-', '_' and '.', starting and ending with a letter or digit)"
        )


def parse_url(text: str | os.PathLike[str]) -> StorageURL:
    """Parse ``s3://bucket/prefix`` (or gs://, az://). UsageError for an unknown scheme,
    a missing or malformed bucket, user info (``user:secret@``), a query, or a ``..``
    path part. No message echoes user info, whatever characters it holds (``/``, ``@``,
    ``:``, ``%2F``): credentials are refused without quoting the URL, and the other
    messages quote only what was checked or :func:`redact`'s form."""
    text = str(text)
    m = _URL.fullmatch(text)
    if m is None:
        raise UsageError(f"{redact(text)!r} is not an object-storage URL (s3://bucket/prefix)")
    scheme, rest = m.group("scheme").lower(), m.group("rest")  # schemes ignore case
    if scheme not in SCHEMES:
        raise UsageError(
            f"{scheme}:// is not a storage imgpack reads; use {', '.join(s + '://' for s in SCHEMES)}"
        )
    if _has_userinfo(rest):
        # never echo the URL: what came before the @ may be a secret
        from .cloud_env import CREDENTIALS_PLACE

        raise UsageError(
            f"{scheme}:// URL: credentials in the URL are refused (an '@' anywhere in it is "
            f"taken for them); set them in the environment ({CREDENTIALS_PLACE[scheme]}"
        )
    bucket, _, prefix = rest.partition("/")
    if _BUCKET.fullmatch(bucket) is None:
        shown = f" {bucket!r}" if re.fullmatch(r"[A-Za-z0-9._-]{1,255}", bucket) else ""
        raise UsageError(
            f"{scheme}:// URL: the bucket{shown} is not a bucket name (letters, digits, "
            "'.', '-' and '_', up to 255)"
        )
    _check_cloud_name(scheme, bucket)
    if "?" in rest or "#" in rest:
        raise UsageError(f"{scheme}://{bucket}: a URL with a query or fragment is refused")
    parts = [p for p in prefix.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise UsageError(f"{redact(text)!r}: '.' and '..' are not allowed in the prefix")
    return StorageURL(scheme, bucket, "/".join(parts))
