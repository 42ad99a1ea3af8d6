"""imgpack's errors: one base class, a few kinds, each with its CLI exit code.

The CLI prints ``Error: <message>`` for any :class:`PackerError` and exits with
its ``exit_code``; anything else is a bug and keeps its traceback. Messages
name the path and say what to do.

Messages name a config's field as Python spells it (``BuildConfig.size 0x0 is out of
range``), never a CLI flag: an error about an option carries that field in ``field``,
and every field its message names in ``fields``, so the CLI shows each as its flag
(``--size 0x0 is out of range``) from one table (:mod:`packer.cli.flags`) without
reading the text.
"""

from __future__ import annotations

import re

# a field as messages spell it: ``BuildConfig.size``, ``VerifyConfig.batch_size``
FIELD_RE = re.compile(r"\b[A-Z][A-Za-z]*(?:Config|Options)\.[a-z_][a-z0-9_]*\b")


class PackerError(Exception):
    """Base class for every error imgpack raises on purpose.

    ``field``: the option the error is about (``"BuildConfig.size"``), or None.
    ``fields``: every field the message names, ``field`` first (the others are found in
    the message as ``XConfig.name``), for the CLI's field -> flag table.
    """

    exit_code = 2

    def __init__(self, *args: object, field: str | None = None) -> None:
        super().__init__(*args)
        self.field = field
        found = FIELD_RE.findall(" ".join(str(a) for a in args))
        self.fields: tuple[str, ...] = tuple(
            dict.fromkeys([field, *found] if field is not None else found)
        )


class UsageError(PackerError):
    """An option is out of range or options contradict each other."""


class InputError(PackerError):
    """The source or destination cannot be used (missing, wrong kind, no images)."""


class PackFormatError(PackerError):
    """A pack is missing, damaged, untrusted or from a newer imgpack."""


class PackBusyError(PackerError):
    """Another imgpack process is writing the same destination."""


class DiskFullError(PackerError):
    """The disk filled up; the work done so far is kept and a rerun resumes."""


class WorkerDiedError(PackerError):
    """A decode worker died (killed, out of memory); the finished work is kept for a rerun."""

    exit_code = 1


class ShardFailedError(PackerError):
    """A shard of a distributed build kept failing; the shards in place are kept for a rerun."""

    exit_code = 1


class NoUsableImagesError(PackerError):
    """Every input was skipped: there is nothing to write."""

    exit_code = 1


class StorageError(PackerError):
    """Object storage could not be reached, or refused a request (credentials, bucket),
    after the retries; the message names the object, never a credential."""

    exit_code = 1


class CredentialsError(StorageError):
    """Object storage refused the credentials (a wrong key or secret, no permission): bad
    input, so exit 2; the message names the object, never the credential."""

    exit_code = 2


class FFmpegError(PackerError):
    """The ffmpeg binary is missing or cannot run."""


class DecodeError(Exception):
    """One image could not be used. Recorded as a skip, never fatal on its own."""
