"""imgpack's errors: one base class, a few kinds, each with its CLI exit code.

The CLI prints ``Error: <message>`` for any :class:`PackerError` and exits with
its ``exit_code``; anything else is a bug and keeps its traceback. Messages
name the path and say what to do.
"""

from __future__ import annotations


class PackerError(Exception):
    """Base class for every error imgpack raises on purpose."""

    exit_code = 2


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
