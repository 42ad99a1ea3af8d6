"""One object-storage client for S3, GCS and Azure, on obstore (``imgpack[cloud]``).

S3 settings come from the standard AWS places, the environment first:
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
``AWS_REGION``/``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL``
(an S3-compatible server), ``AWS_PROFILE``; then ``~/.aws/credentials`` and
``~/.aws/config`` (``AWS_SHARED_CREDENTIALS_FILE``, ``AWS_CONFIG_FILE``). Plain http
is allowed only for a loopback endpoint (127.0.0.1, ::1, localhost). GCS and Azure
take obstore's own environment (``GOOGLE_APPLICATION_CREDENTIALS``,
``AZURE_STORAGE_ACCOUNT_NAME``, ...).

Every call has a timeout (connect 5 s, request :data:`REQUEST_TIMEOUT`) and is retried
with exponential backoff (:class:`Retry`); then :class:`~packer.errors.StorageError`
names the object. Refused credentials are one line, never retried. No message holds
a credential: the known secrets are scrubbed from every error text.
"""

from __future__ import annotations

import configparser
import errno
import ipaddress
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..errors import DiskFullError, InputError, StorageError, UsageError
from .url import StorageURL

CONNECT_TIMEOUT = "5s"
REQUEST_TIMEOUT = "300s"  # a whole request, body included: a 256 MB shard at ~1 MB/s
_CHUNK = 8 << 20


@dataclass
class Retry:
    """``attempts`` tries of a request, ``backoff * 2**i`` seconds apart (at most
    ``max_backoff``). ``on_retry(attempt, url)``: called before each new try (tests
    restart a server there; nothing else uses it)."""

    attempts: int = 4
    backoff: float = 0.5
    max_backoff: float = 8.0
    on_retry: Callable[[int, str], None] | None = field(default=None, repr=False)


RETRY = Retry()


# the process whose obstore runtime (tokio threads) is live: a process forked from it
# has the runtime but not its threads, and any call there would wait forever
_RUNTIME_PID: int | None = None


def _check_not_forked(where: str) -> None:
    global _RUNTIME_PID
    pid = os.getpid()
    if _RUNTIME_PID is None:
        _RUNTIME_PID = pid
    elif pid != _RUNTIME_PID:
        raise UsageError(
            f"{where}: this process was forked from one that used object storage, whose "
            "client cannot run here; start workers with spawn or forkserver (DataLoader("
            "multiprocessing_context='spawn')), or fetch the shards before forking"
        )


class NotFound(Exception):
    """The object does not exist (callers decide what that means)."""


def _need_obstore() -> Any:
    try:
        import obstore
    except ImportError:
        raise UsageError("object storage needs obstore: pip install 'imgpack[cloud]'") from None
    return obstore


def _aws_settings() -> dict[str, str]:
    """Key id, secret, token, region and endpoint from the environment, then the AWS
    credentials and config files of the profile. Only keys that were found."""
    env = os.environ
    profile = env.get("AWS_PROFILE") or env.get("AWS_DEFAULT_PROFILE") or "default"
    home = Path.home() / ".aws"
    creds = configparser.RawConfigParser()
    config = configparser.RawConfigParser()
    try:
        creds.read(env.get("AWS_SHARED_CREDENTIALS_FILE") or home / "credentials")
        config.read(env.get("AWS_CONFIG_FILE") or home / "config")
    except configparser.Error as e:
        raise UsageError(
            f"the AWS credentials or config file cannot be parsed ({type(e).__name__})"
        ) from None
    section = "default" if profile == "default" else f"profile {profile}"

    def pick(env_names: tuple[str, ...], key: str) -> str | None:
        for name in env_names:
            if env.get(name):
                return env[name]
        for cp, sec in ((creds, profile), (config, section)):
            if cp.has_option(sec, key):
                return cp.get(sec, key).strip()
        return None

    out = {
        "access_key_id": pick(("AWS_ACCESS_KEY_ID",), "aws_access_key_id"),
        "secret_access_key": pick(("AWS_SECRET_ACCESS_KEY",), "aws_secret_access_key"),
        "session_token": pick(("AWS_SESSION_TOKEN",), "aws_session_token"),
        "region": pick(("AWS_REGION", "AWS_DEFAULT_REGION"), "region"),
        "endpoint": pick(("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"), "endpoint_url"),
    }
    return {k: v for k, v in out.items() if v}


def _loopback(endpoint: str) -> bool:
    host = urlsplit(endpoint).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _userinfo(endpoint: str) -> list[str]:
    password = urlsplit(endpoint).password
    return [password] if password else []


def _without_userinfo(endpoint: str) -> str:
    parts = urlsplit(endpoint)
    if "@" not in parts.netloc:
        return endpoint
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else type(e).__name__


class ObjectStore:
    """A bucket prefix (``url``) on S3, GCS or Azure: whole-object get, streamed
    download to a file, put (multipart for files), head, list, delete."""

    def __init__(self, url: StorageURL, retry: Retry | None = None) -> None:
        obs = _need_obstore()
        self.url = url
        self.retry = retry or RETRY
        self.endpoint: str | None = None
        self._secrets: list[str] = []
        options = {"connect_timeout": CONNECT_TIMEOUT, "timeout": REQUEST_TIMEOUT}
        # obstore's own retries are for one request; ours (Retry) wrap whole transfers
        retry_config = {"max_retries": 2, "retry_timeout": _seconds(30)}
        from obstore import store as stores

        if url.scheme == "s3":
            s = _aws_settings()
            self._secrets = [s[k] for k in ("secret_access_key", "session_token") if k in s]
            self.endpoint = s.get("endpoint")
            if self.endpoint:
                # user:password@ in an endpoint is a credential: never shown, scrubbed too
                self._secrets += _userinfo(self.endpoint)
                self.endpoint = _without_userinfo(self.endpoint)
            if self.endpoint and self.endpoint.startswith("http://"):
                if not _loopback(self.endpoint):
                    raise UsageError(
                        f"AWS_ENDPOINT_URL {self.endpoint}: plain http is allowed only "
                        "for a server on this machine (127.0.0.1); use https"
                    )
                options["allow_http"] = True  # type: ignore[assignment]
            kw: dict[str, Any] = {"region": s.get("region", "us-east-1")}
            for k in ("access_key_id", "secret_access_key", "session_token", "endpoint"):
                if k in s:
                    kw[k] = s[k]
            make = lambda: stores.S3Store(  # noqa: E731
                url.bucket, client_options=options, retry_config=retry_config, **kw
            )
        elif url.scheme == "gs":
            make = lambda: stores.GCSStore(  # noqa: E731
                url.bucket, client_options=options, retry_config=retry_config
            )
        else:
            make = lambda: stores.AzureStore(  # noqa: E731
                url.bucket, client_options=options, retry_config=retry_config
            )
        try:
            self._store = make()
        except Exception as e:  # a bad setting: obstore names it, we scrub it
            raise UsageError(
                f"{url}: cannot set up the client ({self._scrub(_first_line(e))})"
            ) from None
        self._obs = obs

    # ------------------------------------------------------------ errors

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            if secret:
                text = text.replace(secret, "***")
        return text

    def _call(self, key: str, what: str, fn: Callable[[], Any]) -> Any:
        """``fn()`` with :attr:`retry`; NotFound for a missing object, StorageError for
        refused credentials (at once) or a server that keeps failing."""
        from obstore import exceptions as ox

        where = f"{self.url.scheme}://{self.url.bucket}/{key}"
        _check_not_forked(where)
        last: BaseException | None = None
        for attempt in range(max(1, self.retry.attempts)):
            if attempt:
                delay = min(self.retry.max_backoff, self.retry.backoff * 2 ** (attempt - 1))
                time.sleep(delay)
                if self.retry.on_retry is not None:
                    self.retry.on_retry(attempt, where)
            try:
                return fn()
            except (FileNotFoundError, ox.NotFoundError):
                raise NotFound(where) from None
            except (ox.PermissionDeniedError, ox.UnauthenticatedError) as e:
                raise StorageError(
                    f"{where}: the server refused the credentials ({self._reason(e)}); "
                    "check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)"
                ) from None
            except _LocalWriteError as e:
                raise e.error from None
            except (ox.BaseError, OSError, RuntimeError, ConnectionError, TimeoutError) as e:
                last = e
        raise StorageError(
            f"{where}: could not {what} after {self.retry.attempts} tries "
            f"({self._scrub(_first_line(last)) if last else 'no answer'}); check that "
            f"the server{' at ' + self.endpoint if self.endpoint else ''} is reachable"
        )

    def _reason(self, e: BaseException) -> str:
        text = str(e)
        for code in ("SignatureDoesNotMatch", "InvalidAccessKeyId", "AccessDenied"):
            if code in text:
                return code
        return "403 Forbidden" if "403" in text else "401 Unauthorized"

    # ------------------------------------------------------------ operations

    def get(self, *parts: str) -> bytes:
        """The whole object (small: index, manifest, labels). NotFound if missing."""
        key = self.url.key(*parts)
        return self._call(key, "read it", lambda: bytes(self._obs.get(self._store, key).bytes()))

    def head(self, *parts: str) -> int | None:
        """The object's size, or None if it does not exist."""
        key = self.url.key(*parts)
        try:
            return int(self._call(key, "stat it", lambda: self._obs.head(self._store, key))["size"])
        except NotFound:
            return None

    def download(
        self,
        path: Path,
        *parts: str,
        progress: Callable[[int], None] | None = None,
        etag: str | None = None,
    ) -> int:
        """Stream the object into the new file ``path`` (created, truncated on each try,
        fsynced); returns its size. DiskFullError for a full disk (never retried).
        ``etag``: the object must still have this ETag (as listed), else InputError."""
        key = self.url.key(*parts)

        def once() -> int:
            from obstore import exceptions as ox

            want = etag.strip('"') if etag else None
            changed = _LocalWriteError(  # final, as a local write error is: not retried
                InputError(
                    f"{self.url.scheme}://{self.url.bucket}/{key}: changed since it was "
                    "listed; run the same command again (it lists the objects anew)"
                )
            )
            try:
                options = {"if_match": f'"{want}"'} if want else None
                result = self._obs.get(self._store, key, options=options)
            except ox.PreconditionError:
                raise changed from None
            got = str(result.meta.get("e_tag") or "").strip('"')
            if want and got and got != want:  # a server that ignores If-Match
                raise changed
            n = 0
            try:
                with open(path, "wb") as f:
                    for chunk in result.stream(min_chunk_size=_CHUNK):
                        f.write(chunk)
                        n += len(chunk)
                        if progress:
                            progress(len(chunk))
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as e:
                if e.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise _LocalWriteError(
                        DiskFullError(
                            f"{path.parent}: the disk is full while fetching "
                            f"{self.url.child(key)}; free space, or give a smaller "
                            "cache_limit or another cache_dir"
                        )
                    ) from None
                if e.filename is not None:  # a local file problem, not the network
                    raise _LocalWriteError(
                        StorageError(f"{path}: cannot write ({e.strerror})")
                    ) from None
                raise
            return n

        return self._call(key, "download it", once)

    def put(self, data: bytes | Path, *parts: str) -> None:
        """Write the object: ``data`` bytes, or a local file streamed (multipart)."""
        key = self.url.key(*parts)
        self._call(key, "upload it", lambda: self._obs.put(self._store, key, data))

    def list(self, *parts: str) -> list[str]:
        """Keys under ``parts`` (relative to the URL's prefix)."""
        key = self.url.key(*parts)
        base = self.url.key()

        def once() -> list[str]:
            out = []
            for batch in self._obs.list(self._store, prefix=key + "/" if key else None):
                out.extend(o["path"] for o in batch)
            return out

        keys = self._call(key, "list it", once)
        cut = len(base) + 1 if base else 0
        return [k[cut:] for k in keys]

    def list_meta(self, *parts: str) -> list[tuple[str, int, str]]:
        """``(key, size, ETag)`` of each object under ``parts``, keys relative to the
        URL's prefix (an ETag the server gave none of: "")."""
        key = self.url.key(*parts)
        base = self.url.key()

        def once() -> list[tuple[str, int, str]]:
            out = []
            for batch in self._obs.list(self._store, prefix=key + "/" if key else None):
                out.extend((o["path"], int(o["size"]), str(o.get("e_tag") or "")) for o in batch)
            return out

        found = self._call(key, "list it", once)
        cut = len(base) + 1 if base else 0
        return [(k[cut:], size, etag) for k, size, etag in found]

    def delete(self, *parts: str) -> None:
        key = self.url.key(*parts)
        try:
            self._call(key, "delete it", lambda: self._obs.delete(self._store, key))
        except NotFound:
            pass


class _LocalWriteError(Exception):
    """A local write failed during a download: raised as ``error``, never retried."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _seconds(s: float) -> Any:
    import datetime

    return datetime.timedelta(seconds=s)


def open_store(url: StorageURL, retry: Retry | None = None) -> ObjectStore:
    """An :class:`ObjectStore` for ``url`` (settings read now, from the environment)."""
    return ObjectStore(url, retry)
