"""One object-storage client for S3, GCS and Azure, on obstore (``imgpack[cloud]``).

S3 settings come from the standard AWS places, the environment first:
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
``AWS_REGION``/``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL``
(an S3-compatible server), ``AWS_PROFILE``; then ``~/.aws/credentials`` and
``~/.aws/config`` (``AWS_SHARED_CREDENTIALS_FILE``, ``AWS_CONFIG_FILE``). Plain http
is allowed only for a loopback endpoint (127.0.0.1, ::1, localhost). GCS and Azure
settings are read by :mod:`.cloud_env` (``GOOGLE_APPLICATION_CREDENTIALS``,
``GOOGLE_BASE_URL``, ``AZURE_STORAGE_ACCOUNT_NAME``, ``AZURE_STORAGE_CONNECTION_STRING``,
...), under the same rules. A malformed endpoint is a one-line UsageError, checked
here before obstore sees it.

Every request is bounded (:class:`Retry`): connect 5 s; the answer's first byte
within ``first_byte_timeout`` (10 s); no ``idle_timeout`` (30 s) without a byte while
a body streams; an upload within 10 s plus its size at 1 MB/s. Each request runs on a
daemon thread that the caller waits for in short slices, so Ctrl-C is honoured at once
(an abandoned request dies with the process). A failed try is retried with
exponential backoff, and no new try starts once ``deadline`` (60 s) has passed since
the first; then :class:`~packer.errors.StorageError` names the object. Every read of a
whole object into memory is capped by its caller (``get(max_bytes=)``): its size is
checked from the answer's headers before the body is read, and the body is streamed
and counted, so at most the cap plus two chunks (1 MiB) are ever held. Refused
credentials are one line, never retried (exit 2), and a missing bucket is one line
naming it (exit 2). No message holds a credential: the known secrets are scrubbed from
every error text.
"""

from __future__ import annotations

import configparser
import errno
import ipaddress
import logging
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..errors import (
    CredentialsError,
    DiskFullError,
    InputError,
    StorageError,
    UsageError,
)
from .cloud_env import CREDENTIALS_HINT, azure_settings, gcs_settings
from .url import StorageURL

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = "5s"
# obstore's own cap on a whole request, body included (a 256 MB shard at ~1 MB/s); the
# tighter bounds (first byte, idle, deadline) are Retry's, enforced here
REQUEST_TIMEOUT = "300s"
_CHUNK = 1 << 20  # streamed bodies arrive in pieces of about this many bytes


@dataclass
class Retry:
    """How requests are bounded and retried: ``attempts`` tries, ``backoff * 2**i``
    seconds apart (at most ``max_backoff``), no new try once ``deadline`` seconds have
    passed since the first. Each try: the answer's first byte within
    ``first_byte_timeout`` seconds, then never ``idle_timeout`` seconds without a byte;
    an upload within ``first_byte_timeout + size / min_rate`` seconds.
    ``on_retry(attempt, url)``: called before each new try (tests restart a server there;
    nothing else uses it)."""

    attempts: int = 4
    backoff: float = 0.5
    max_backoff: float = 8.0
    first_byte_timeout: float = 10.0
    idle_timeout: float = 30.0
    deadline: float = 60.0
    min_rate: float = 1e6
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


class TooLarge(Exception):
    """The object is larger than the caller's cap (``size`` as known when refused, at
    most the cap plus a chunk read); callers name what it should have been."""

    def __init__(self, where: str, size: int, cap: int) -> None:
        super().__init__(f"{where}: {size:,} bytes or more, above the cap of {cap:,}")
        self.where, self.size, self.cap = where, size, cap


class NoRanges(Exception):
    """The server answered a ranged read with the whole-object status (200, not 206):
    some S3-compatible servers (rclone serve s3 1.75) do; obstore refuses the answer."""


class _Cancelled(Exception):
    """The client was cancelled (:meth:`ObjectStore.cancel`) while a request waited."""


# a missing bucket as the server says it: its error code, or its message after a code
# tag, a ': ' or a quote (obstore's bulk-delete reasons), never a match inside the key
# (obstore's "Object at location KEY not found" quotes the key as it is)
_NO_BUCKET = re.compile(
    r"<Code>(?:NoSuchBucket|ContainerNotFound)</Code>"
    r"|(?:<Message>|: |\")The specified (?:bucket|container) does not exist"
)


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


_ENDPOINT = re.compile(r"(?P<scheme>https?)://(?P<rest>.*)", re.S | re.I)
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\.?")
_PORT = re.compile(r"[0-9]{1,5}")


_AWS_ENDPOINT = "AWS_ENDPOINT_URL (or endpoint_url in the AWS config)"


def parse_endpoint(text: str, what: str = _AWS_ENDPOINT) -> tuple[str, list[str]]:
    """``AWS_ENDPOINT_URL`` (or ``endpoint_url``; ``what`` names another variable)
    checked: ``http(s)://HOST[:PORT][/PATH]`` without its user info, and the user info's
    secrets (to scrub). UsageError for anything else (an unclosed IPv6 bracket, a port
    outside 1-65535, a query, text that is not a URL), never echoing the value (it may
    hold a secret)."""
    usage = "give http(s)://HOST[:PORT], e.g. https://s3.example.com or http://127.0.0.1:9000"
    m = _ENDPOINT.fullmatch(text.strip())
    if m is None:
        raise UsageError(f"{what} is not an http(s) URL; {usage}")
    scheme, rest = m.group("scheme").lower(), m.group("rest")
    secrets: list[str] = []
    if "@" in rest:  # user info, whatever it holds (a '/' or '@' in a password too)
        info, _, rest = rest.rpartition("@")
        secrets = [info, *info.split(":", 1)[1:]]
    if "?" in rest or "#" in rest:
        raise UsageError(f"{what}: a query or fragment is not part of an endpoint; {usage}")
    hostport, slash, path = rest.partition("/")
    if hostport.startswith("["):
        host, closed, port = hostport[1:].partition("]")
        try:
            if not closed:
                raise ValueError
            ipaddress.IPv6Address(host)
        except ValueError:
            raise UsageError(
                f"{what}: the host is not an IPv6 address in brackets; {usage}"
            ) from None
        host = f"[{host}]"
    else:
        host, colon, port = hostport.partition(":")
        port = colon + port
        if _HOST.fullmatch(host) is None:
            raise UsageError(f"{what}: the host is not a host name or address; {usage}")
    if port:
        digits = port[1:]
        if (
            not port.startswith(":")
            or _PORT.fullmatch(digits) is None
            or not 1 <= int(digits) <= 65535
        ):
            raise UsageError(f"{what}: the port must be a number from 1 to 65535; {usage}")
    return f"{scheme}://{host}{port}{slash}{path}", [s for s in secrets if s]


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else type(e).__name__


class ObjectStore:
    """A bucket prefix (``url``) on S3, GCS or Azure: capped whole-object get, streamed
    download to a file, put (multipart for files), head, list, delete; every request
    bounded as the module docstring says."""

    def __init__(self, url: StorageURL, retry: Retry | None = None) -> None:
        obs = _need_obstore()
        self.url = url
        self.retry = retry or RETRY
        self.chunk = _CHUNK  # streamed bodies' pieces (tests set a small one on the store)
        self.endpoint: str | None = None
        self._secrets: list[str] = []
        self._cancel = threading.Event()
        # the server answers ranged reads with status 200 (None: not yet known)
        self._range_200: bool | None = None
        self._range_lock = threading.Lock()
        options = {"connect_timeout": CONNECT_TIMEOUT, "timeout": REQUEST_TIMEOUT}
        # obstore's own retries are for one request; ours (Retry) wrap whole transfers
        retry_config = {"max_retries": 2, "retry_timeout": _seconds(30)}
        from obstore import store as stores

        if url.scheme == "s3":
            s = _aws_settings()
            self._secrets = [s[k] for k in ("secret_access_key", "session_token") if k in s]
            if s.get("endpoint"):
                # user:password@ in an endpoint is a credential: never shown, scrubbed too
                self.endpoint, secrets = parse_endpoint(s["endpoint"])
                self._secrets += secrets
                s["endpoint"] = self.endpoint
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
        else:
            c = gcs_settings() if url.scheme == "gs" else azure_settings(url.bucket)
            self._secrets = list(c.secrets)
            gkw = dict(c.kwargs)
            if c.endpoint_from:  # an override, checked as AWS_ENDPOINT_URL is
                self.endpoint, secrets = parse_endpoint(c.endpoint or "", c.endpoint_from)
                self._secrets += secrets
                if self.endpoint.startswith("http://"):
                    if not _loopback(self.endpoint):
                        raise UsageError(
                            f"{c.endpoint_from} {self.endpoint}: plain http is allowed only "
                            "for a server on this machine (127.0.0.1); use https"
                        )
                    options["allow_http"] = True  # type: ignore[assignment]
                if not gkw.get("use_emulator"):
                    gkw["base_url" if url.scheme == "gs" else "endpoint"] = self.endpoint
            else:
                self.endpoint = c.endpoint  # Azure: the account's, naming the set's cache
            cls = stores.GCSStore if url.scheme == "gs" else stores.AzureStore
            make = lambda: cls(  # noqa: E731
                url.bucket, client_options=options, retry_config=retry_config, **gkw
            )
        try:
            self._store = make()
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # a bad setting (or a Rust panic): named, scrubbed
            raise UsageError(
                f"{url}: cannot set up the client ({self._scrub(_first_line(e))})"
            ) from None
        self._obs = obs

    def cancel(self) -> None:
        """Make every request of this client waiting now, or later, end at once (a
        process stopping, as after Ctrl-C, so no thread keeps it waiting)."""
        self._cancel.set()

    # ------------------------------------------------------------ errors

    def _scrub(self, text: str) -> str:
        for secret in sorted(self._secrets, key=len, reverse=True):
            if secret:
                text = text.replace(secret, "***")
        # a signature in a request's query (an Azure SAS, a signed URL), however encoded
        return _SIGNED.sub(r"\1***", text)

    def _where(self, key: str) -> str:
        return f"{self.url.scheme}://{self.url.bucket}/{key}"

    def _call(self, key: str, what: str, fn: Callable[[], Any]) -> Any:
        """``fn()`` with :attr:`retry`; NotFound for a missing object, CredentialsError
        for refused credentials (at once), InputError for a missing bucket, StorageError
        for a server that keeps failing or does not answer."""
        from obstore import exceptions as ox

        where = self._where(key)
        _check_not_forked(where)
        last: BaseException | None = None
        start = time.monotonic()
        tries = 0
        for attempt in range(max(1, self.retry.attempts)):
            if attempt:
                delay = min(self.retry.max_backoff, self.retry.backoff * 2 ** (attempt - 1))
                if time.monotonic() - start + delay > self.retry.deadline:
                    break
                log.warning(
                    "%s: %s; trying again (%d of %d)",
                    where,
                    self._scrub(_first_line(last)) if last else "no answer",
                    attempt + 1,
                    self.retry.attempts,
                )
                self._sleep(delay)
                if self.retry.on_retry is not None:
                    self.retry.on_retry(attempt, where)
            tries += 1
            try:
                return fn()
            except (FileNotFoundError, ox.NotFoundError) as e:
                if _names_no_bucket(e):
                    raise self._no_bucket() from None
                raise NotFound(where) from None
            except (ox.PermissionDeniedError, ox.UnauthenticatedError) as e:
                raise CredentialsError(
                    f"{where}: the server refused the credentials ({self._reason(e)}); "
                    f"{CREDENTIALS_HINT[self.url.scheme]}"
                ) from None
            except _Final as e:
                raise e.error from None
            except (ox.BaseError, OSError, RuntimeError, ConnectionError, TimeoutError) as e:
                if _names_no_bucket(e):
                    raise self._no_bucket() from None
                if self.url.scheme != "s3" and "Error performing token request" in str(e):
                    # GCS and Azure fetch a token first (metadata server, OAuth): its
                    # refusal is a credentials problem, which obstore already retried
                    raise CredentialsError(
                        f"{where}: no token for the credentials ({self._token_reason(e)}); "
                        f"{CREDENTIALS_HINT[self.url.scheme]}"
                    ) from None
                last = e
        seconds = time.monotonic() - start
        raise StorageError(
            f"{where}: could not {what} after {tries} tr{'y' if tries == 1 else 'ies'} in "
            f"{seconds:.0f} s ({self._scrub(_first_line(last)) if last else 'no answer'}); "
            f"check that the server{' at ' + self.endpoint if self.endpoint else ''} is "
            "reachable"
        )

    def _no_bucket(self) -> InputError:
        what = "container" if self.url.scheme == "az" else "bucket"
        return InputError(
            f"{self.url.scheme}://{self.url.bucket}: the {what} does not exist; create it "
            f"first, or check its name"
            + (f" and the endpoint ({self.endpoint})" if self.endpoint else "")
        )

    def _token_reason(self, e: BaseException) -> str:
        """Why a token request failed, in a few words: the HTTP status it names, else
        its first line, scrubbed and cut short (the token server's answer is not quoted)."""
        m = re.search(r"status code: ([0-9]{3}[A-Za-z ]*)", str(e))
        if m:
            return f"the token server answered {m.group(1).strip()}"
        return self._scrub(_first_line(e))[:160]

    def _reason(self, e: BaseException) -> str:
        """The server's error code (``<Code>...</Code>``: S3, GCS's XML API, Azure), else
        the HTTP status obstore names; never a match inside the object's key or URL."""
        text = str(e)
        code = re.search(r"<Code>([A-Za-z]{1,64})</Code>", text)
        if code:
            return code.group(1)
        status = re.search(r"status code: (40[13])\b", text)
        if status:
            return "403 Forbidden" if status.group(1) == "403" else "401 Unauthorized"
        from obstore import exceptions as ox

        return "403 Forbidden" if isinstance(e, ox.PermissionDeniedError) else "401 Unauthorized"

    # ------------------------------------------------------------ bounded waits

    def _sleep(self, seconds: float) -> None:
        if self._cancel.wait(seconds):
            raise _Cancelled()

    def _blocking(self, fn: Callable[[], Any], timeout: float) -> Any:
        """``fn()`` (one request) on a daemon thread, waited for in short slices (Ctrl-C
        and :meth:`cancel` end the wait at once); TimeoutError after ``timeout`` s."""
        box: list[tuple[bool, Any]] = []
        done = threading.Event()

        def run() -> None:
            try:
                box.append((True, fn()))
            except BaseException as e:
                box.append((False, e))
            finally:
                done.set()

        threading.Thread(target=run, daemon=True, name="imgpack-storage").start()
        end = time.monotonic() + timeout
        while not done.wait(min(0.25, max(0.0, end - time.monotonic()))):
            if self._cancel.is_set():
                raise _Cancelled()
            if time.monotonic() >= end:
                raise TimeoutError(f"no answer in {timeout:g} s")
        ok, value = box[0]
        if not ok:
            raise value
        return value

    def _pipe(self, items: Callable[[], Iterator[Any]], first: float, then: float) -> Iterator[Any]:
        """The items of ``items()`` (one request's body, or pages of requests), produced
        on a daemon thread: the first within ``first`` seconds, each next within ``then``
        (TimeoutError), at most one item waiting (the consumer bounds what is held)."""
        q: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=1)
        stop = threading.Event()

        def hand(item: tuple[str, Any]) -> bool:
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.25)
                    return True
                except queue.Full:
                    continue
            return False

        def run() -> None:
            try:
                for item in items():
                    if not hand(("item", item)):
                        return
                hand(("end", None))
            except BaseException as e:
                hand(("error", e))

        threading.Thread(target=run, daemon=True, name="imgpack-storage").start()
        timeout = first
        try:
            while True:
                end = time.monotonic() + timeout
                while True:
                    try:
                        kind, value = q.get(timeout=min(0.25, max(0.0, end - time.monotonic())))
                        break
                    except queue.Empty:
                        if self._cancel.is_set():
                            raise _Cancelled() from None
                        if time.monotonic() >= end:
                            raise TimeoutError(f"no data in {timeout:g} s") from None
                if kind == "error":
                    raise value
                if kind == "end":
                    return
                yield value
                timeout = then
        finally:
            stop.set()

    def _body(self, key: str, options: dict[str, Any] | None = None) -> Iterator[Any]:
        """The object's metadata (a dict, once the answer's headers are in), then its
        body in pieces of about ``self.chunk`` bytes (:data:`_CHUNK`)."""

        def items() -> Iterator[Any]:
            result = self._obs.get(self._store, key, options=options)
            yield dict(result.meta)
            yield from result.stream(min_chunk_size=self.chunk)

        return self._pipe(items, self.retry.first_byte_timeout, self.retry.idle_timeout)

    # ------------------------------------------------------------ operations

    def get(self, *parts: str, max_bytes: int) -> bytes:
        """The whole object (small: index, manifest, labels), at most ``max_bytes``
        (checked from its size before the body is read, then counted): TooLarge above,
        NotFound if missing."""
        key = self.url.key(*parts)
        where = self._where(key)

        def once() -> bytes:
            out = bytearray()
            body = self._body(key)
            try:
                size = int(next(body).get("size") or 0)
                if size > max_bytes:
                    raise _Final(TooLarge(where, size, max_bytes))
                for chunk in body:
                    out += chunk
                    if len(out) > max_bytes:  # a server sending more than it said
                        raise _Final(TooLarge(where, len(out), max_bytes))
                return bytes(out)
            finally:
                body.close()  # the request dropped now, not when a traceback goes

        return self._call(key, "read it", once)

    def get_range(self, *parts: str, start: int, length: int) -> bytes:
        """Bytes ``[start, start + length)`` of the object (``length`` >= 1; the range
        must start inside it), at most ``length`` of them whatever the server sends."""
        key = self.url.key(*parts)
        where = self._where(key)

        def once() -> bytes:
            if self._range_200 is None and length > 1:
                with self._range_lock:  # asked once, by one byte: a server sending 200
                    if self._range_200 is None:  # sends the whole range before a refusal
                        self._range_200 = self._answers_200(key, start)
            if self._range_200:
                return self._signed_range(key, start, length)
            out = bytearray()
            body = self._body(key, {"range": (start, start + length)})
            try:
                try:
                    next(body)
                except Exception as e:
                    if "non-partial" in str(e).lower():
                        # status 200, not 206: the range may still be what was sent
                        # (rclone serve s3 1.75 sends it with a Content-Range)
                        self._range_200 = True
                        return self._signed_range(key, start, length)
                    raise
                for chunk in body:
                    out += chunk
                    if len(out) > length:  # a server ignoring the range
                        raise _Final(TooLarge(where, len(out), length))
                return bytes(out)
            finally:
                body.close()

        return self._call(key, "read it", once)

    def _answers_200(self, key: str, start: int) -> bool:
        """Whether the server answers a ranged read (of one byte of ``key``) with status
        200 rather than 206."""
        probe = self._body(key, {"range": (start, start + 1)})
        try:
            next(probe)
        except Exception as e:
            if "non-partial" in str(e).lower():
                return True
            raise
        finally:
            probe.close()
        return False

    def _signed_range(self, key: str, start: int, length: int) -> bytes:
        """Bytes ``[start, start + length)`` by a ranged GET of a signed URL (made by the
        client, valid a few minutes, never shown), for a server that answers a ranged
        read with status 200: taken when the answer's Content-Range and Content-Length
        are exactly the range asked for and its body that long; else NoRanges (the server
        sent the whole object, another range, or a redirect, never followed). Bounded as
        an upload is, on a thread (:meth:`_blocking`). No part of the URL is logged or put
        in an error (a refusal is named by its HTTP status alone)."""
        import datetime
        import http.client
        import urllib.error
        import urllib.request

        where = self._where(key)
        try:
            url = self._obs.sign(self._store, "GET", key, datetime.timedelta(minutes=10))
        except Exception:  # a client that cannot sign (no key): as without ranges
            raise _Final(NoRanges(where)) from None
        want = f"bytes {start}-{start + length - 1}/"
        req = urllib.request.Request(url, headers={"Range": f"bytes={start}-{start + length - 1}"})
        # no redirect is followed (a signed URL is for this server only; another host may
        # be plain http or not ours): a redirect is a server without ranges
        opener = urllib.request.build_opener(_no_redirect_handler())
        t = self.retry.first_byte_timeout

        bound = t + length / self.retry.min_rate
        end = time.monotonic() + bound

        def fetch() -> bytes:
            try:
                with opener.open(req, timeout=t) as r:
                    got = r.headers.get("Content-Range") or ""
                    size = r.headers.get("Content-Length")
                    if (
                        r.status not in (200, 206)
                        or not got.startswith(want)
                        or (size is not None and size.strip() != str(length))
                    ):
                        raise _Final(NoRanges(where))
                    out = bytearray()
                    while len(out) <= length:  # in pieces: the thread ends by the bound
                        piece = r.read1(min(self.chunk, length + 1 - len(out)))
                        if not piece:
                            break
                        out += piece
                        if time.monotonic() > end or self._cancel.is_set():
                            raise TimeoutError(f"no answer in {bound:g} s")
                    return bytes(out)
            except urllib.error.HTTPError as e:
                e.close()
                if e.code == 404:
                    raise NotFound(where) from None
                if 300 <= e.code < 400:
                    raise _Final(NoRanges(where)) from None
                # the status alone: the server's reason phrase may quote the signed URL
                raise OSError(f"HTTP {e.code}") from None  # retried
            except urllib.error.URLError as e:
                reason = e.reason if isinstance(e.reason, OSError) else type(e).__name__
                raise OSError(f"no answer ({reason})") from None
            except http.client.HTTPException as e:  # an answer cut short: retried
                raise OSError(f"the answer broke off ({type(e).__name__})") from None

        # the whole read bounded as an upload is (a server trickling bytes ends), on a
        # thread waited for in slices (Ctrl-C and cancel() end the wait at once)
        data = self._blocking(fetch, bound)
        if len(data) != length:
            raise OSError(f"{len(data):,} bytes of the {length:,} asked for")
        return data

    def head(self, *parts: str) -> int | None:
        """The object's size, or None if it does not exist."""
        key = self.url.key(*parts)
        t = self.retry.first_byte_timeout
        try:
            meta = self._call(
                key, "stat it", lambda: self._blocking(lambda: self._obs.head(self._store, key), t)
            )
        except NotFound:
            return None
        return int(meta["size"])

    def download(
        self,
        path: Path,
        *parts: str,
        progress: Callable[[int], None] | None = None,
        etag: str | None = None,
        max_bytes: int | None = None,
        sync: bool = True,
    ) -> int:
        """Stream the object into the new file ``path`` (created, truncated on each try,
        fsynced unless ``sync`` is False: a scratch copy); returns its size.
        DiskFullError for a full disk (never retried).
        ``etag``: the object must still have this ETag (as listed), else InputError.
        ``max_bytes``: TooLarge for an object larger (by its size, then as counted)."""
        key = self.url.key(*parts)
        where = self._where(key)

        def once() -> int:
            want = etag.strip('"') if etag else None
            options = {"if_match": f'"{want}"'} if want else None
            body = self._body(key, options)
            try:
                return write(body, want)
            finally:
                body.close()  # the request dropped now, not when a traceback goes

        def write(body: Iterator[Any], want: str | None) -> int:
            from obstore import exceptions as ox

            changed = _Final(  # final, as a local write error is: not retried
                InputError(
                    f"{where}: changed since it was listed; run the same command again "
                    "(it lists the objects anew)"
                )
            )
            try:
                meta = next(body)
            except ox.PreconditionError:
                raise changed from None
            got = str(meta.get("e_tag") or "").strip('"')
            if want and got and got != want:  # a server that ignores If-Match
                raise changed
            size = int(meta.get("size") or 0)
            if max_bytes is not None and size > max_bytes:
                raise _Final(TooLarge(where, size, max_bytes))
            n = 0
            try:
                with open(path, "wb") as f:
                    for chunk in body:
                        n += len(chunk)
                        if max_bytes is not None and n > max_bytes:
                            raise _Final(TooLarge(where, n, max_bytes))
                        f.write(chunk)
                        if progress:
                            progress(len(chunk))
                    f.flush()
                    if sync:
                        os.fsync(f.fileno())
            except OSError as e:
                if e.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise _Final(
                        DiskFullError(
                            f"{path.parent}: the disk is full while fetching "
                            f"{self.url.child(key)}; free space, or give a smaller "
                            "cache_limit or another cache_dir"
                        )
                    ) from None
                if e.filename is not None:  # a local file problem, not the network
                    raise _Final(StorageError(f"{path}: cannot write ({e.strerror})")) from None
                raise
            return n

        return self._call(key, "download it", once)

    def put(self, data: bytes | Path, *parts: str) -> None:
        """Write the object: ``data`` bytes, or a local file streamed (multipart), within
        ``first_byte_timeout + size / min_rate`` seconds a try."""
        key = self.url.key(*parts)
        size = len(data) if isinstance(data, (bytes, bytearray)) else Path(data).stat().st_size
        t = self.retry.first_byte_timeout + size / self.retry.min_rate
        self._call(
            key,
            "upload it",
            lambda: self._blocking(lambda: self._obs.put(self._store, key, data), t),
        )

    def _listing(self, key: str) -> list[dict[str, Any]]:
        def pages() -> Iterator[Any]:
            yield from self._obs.list(self._store, prefix=key + "/" if key else None)

        def once() -> list[dict[str, Any]]:
            out: list[dict[str, Any]] = []
            t = self.retry.first_byte_timeout
            for batch in self._pipe(pages, t, t):
                out.extend(batch)
            return out

        return self._call(key, "list it", once)

    def list(self, *parts: str) -> list[str]:
        """Keys under ``parts`` (relative to the URL's prefix)."""
        cut = len(self.url.key()) + 1 if self.url.key() else 0
        return [o["path"][cut:] for o in self._listing(self.url.key(*parts))]

    def list_meta(self, *parts: str) -> list[tuple[str, int, str]]:
        """``(key, size, ETag)`` of each object under ``parts``, keys relative to the
        URL's prefix (an ETag the server gave none of: "")."""
        cut = len(self.url.key()) + 1 if self.url.key() else 0
        return [
            (o["path"][cut:], int(o["size"]), str(o.get("e_tag") or ""))
            for o in self._listing(self.url.key(*parts))
        ]

    def list_times(self, *parts: str) -> list[tuple[str, float]]:
        """``(key, last modified as a POSIX time, by the server's clock)`` of each object
        under ``parts``, keys relative to the URL's prefix."""
        cut = len(self.url.key()) + 1 if self.url.key() else 0
        return [
            (o["path"][cut:], o["last_modified"].timestamp())
            for o in self._listing(self.url.key(*parts))
        ]

    def delete(self, *parts: str) -> None:
        key = self.url.key(*parts)
        t = self.retry.first_byte_timeout
        try:
            self._call(
                key,
                "delete it",
                lambda: self._blocking(lambda: self._obs.delete(self._store, key), t),
            )
        except NotFound:
            pass


_SIGNED = re.compile(
    r"(?i)([?&](?:sig|signature|x-goog-signature|x-amz-signature|x-amz-security-token"
    r"|x-amz-credential|x-goog-credential)=)[^&\s\"'<>)]*"
)


def _no_redirect_handler() -> Any:
    import urllib.request

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None  # the 3xx is raised as an HTTPError

    return NoRedirect


def _names_no_bucket(e: BaseException) -> bool:
    return _NO_BUCKET.search(str(e)) is not None


class _Final(Exception):
    """An error met during a request that is not the network's (a local write, an
    object changed or too large): raised as ``error``, never retried."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _seconds(s: float) -> Any:
    import datetime

    return datetime.timedelta(seconds=s)


def open_store(url: StorageURL, retry: Retry | None = None) -> ObjectStore:
    """An :class:`ObjectStore` for ``url`` (settings read now, from the environment)."""
    return ObjectStore(url, retry)
