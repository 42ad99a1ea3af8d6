"""A ranged read from a server that answers status 200 (``rclone serve s3`` 1.75 does,
with the range's bytes and a Content-Range): taken through a URL the client signs,
only when the answer is exactly the range asked for; the whole object, or another
range, is NoRanges (the caller's whole-object fallback); the signed URL never shows
in an error. A small HTTP server on 127.0.0.1 plays each kind of answer."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from packer.errors import StorageError
from packer.storage import client
from packer.storage.client import NoRanges, open_store
from packer.storage.url import parse_url

BODY = bytes(range(256)) * 40  # 10,240 bytes


class _Handler(http.server.BaseHTTPRequestHandler):
    mode = "200-range"
    seen: ClassVar[list[str]] = []
    stop = threading.Event()

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        _Handler.seen.append(self.path)
        rng = self.headers.get("Range", "")
        a, b = (int(x) for x in rng.split("=")[1].split("-")) if rng else (0, len(BODY) - 1)
        mode = _Handler.mode
        if mode == "403":
            self.send_response(403)
            self.end_headers()
            return
        if mode == "redirect" and "other" not in self.path:
            self.send_response(302)
            self.send_header("Location", "/other" + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if mode == "echo":  # a reason phrase quoting the signed URL
            self.send_response(500, "bad " + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if mode == "whole":
            data, cr = BODY, None
        elif mode == "206-whole":  # status 206, the whole object and its Content-Range
            data, cr = BODY, f"bytes 0-{len(BODY) - 1}/{len(BODY)}"
        elif mode == "shifted":
            data, cr = BODY[a + 1 : b + 2], f"bytes {a + 1}-{b + 1}/{len(BODY)}"
        else:
            data, cr = BODY[a : b + 1], f"bytes {a}-{b}/{len(BODY)}"
        self.send_response(206 if mode.startswith("206") else 200)
        if cr:
            self.send_header("Content-Range", cr)
        extra = 50 if mode == "long-length" else 0  # more than Content-Range says
        self.send_header("Content-Length", str(len(data) + extra))
        self.send_header("ETag", '"e"')
        self.send_header("Last-Modified", "Sun, 29 Nov 2026 05:00:00 GMT")
        self.end_headers()
        if mode == "trickle":  # a byte at a time, slower than any bound allows
            for i in range(len(data)):
                self.wfile.write(data[i : i + 1])
                self.wfile.flush()
                if _Handler.stop.wait(0.05):
                    return
            return
        self.wfile.write(data)


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[client.ObjectStore]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test-key-id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test-secret-never-shown")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setattr(client.RETRY, "attempts", 2)
    monkeypatch.setattr(client.RETRY, "backoff", 0.01)
    _Handler.seen = []
    _Handler.stop = threading.Event()
    s = open_store(parse_url("s3://bkt/p"))
    s._range_200 = True  # as the one-byte probe finds against such a server
    try:
        yield s
    finally:
        _Handler.stop.set()
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("mode", ["200-range", "206"])
def test_the_range_asked_for_is_taken(store: client.ObjectStore, mode: str) -> None:
    _Handler.mode = mode
    assert store.get_range("o.bin", start=100, length=1000) == BODY[100:1100]
    assert "X-Amz-Signature=" in _Handler.seen[-1]  # a URL the client signed


@pytest.mark.parametrize("mode", ["whole", "shifted", "206-whole"])
def test_anything_but_that_range_is_no_ranges(store: client.ObjectStore, mode: str) -> None:
    _Handler.mode = mode
    with pytest.raises(NoRanges, match=r"s3://bkt/p/o\.bin"):
        store.get_range("o.bin", start=100, length=1000)


def test_a_refusal_names_the_status_not_the_signed_url(store: client.ObjectStore) -> None:
    _Handler.mode = "403"
    with pytest.raises(StorageError, match="HTTP 403") as e:
        store.get_range("o.bin", start=100, length=1000)
    assert "Signature" not in str(e.value) and "test-key-id" not in str(e.value)


@pytest.mark.parametrize("mode", ["long-length", "redirect"])
def test_a_wrong_length_or_a_redirect_is_no_ranges(store: client.ObjectStore, mode: str) -> None:
    # a Content-Length other than the range's, or a redirect (never followed: a signed
    # URL is for its server only), is not the range asked for
    _Handler.mode = mode
    with pytest.raises(NoRanges, match=r"s3://bkt/p/o\.bin"):
        store.get_range("o.bin", start=100, length=1000)
    assert not any("other" in p for p in _Handler.seen)


def test_no_part_of_the_signed_url_shows_in_errors_or_logs(
    store: client.ObjectStore, caplog: pytest.LogCaptureFixture
) -> None:
    _Handler.mode = "echo"
    with caplog.at_level("DEBUG"), pytest.raises(StorageError, match="HTTP 500") as e:
        store.get_range("o.bin", start=100, length=1000)
    for text in (str(e.value), repr(e.value), caplog.text, repr(store)):
        assert "X-Amz" not in text and "?" not in text and "test-key-id" not in text, text


def test_a_trickling_server_is_bounded(
    store: client.ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a byte every 50 ms: the read ends by its bound (first byte + size at min_rate),
    # not when the last byte arrives (50 s)
    monkeypatch.setattr(client.RETRY, "first_byte_timeout", 0.3)
    _Handler.mode = "trickle"
    # only this read's threads: an earlier test in this process may have left one of its
    # own waiting on a server that never answers
    before = set(threading.enumerate())
    with pytest.raises(StorageError, match=r"no answer in 0\.3"):
        store.get_range("o.bin", start=100, length=1000)
    # and the requests' threads end too (each stops reading at its bound), not at the
    # trickle's last byte
    started = [t for t in threading.enumerate() if t not in before]
    for thread in started:
        if thread.name == "imgpack-storage":
            thread.join(timeout=5)
            assert not thread.is_alive()
