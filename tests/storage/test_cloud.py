"""gs:// and az:// pack sets (issue 47.5) against real servers: Azurite for Azure, a
server of GCS's XML API for Google Cloud (cloud_servers.py). Each of the two: build to
the bucket, load (and stream) the set, info and verify over the URL, the shared cache,
one writer at a time, a missing bucket and refused credentials as one line, exit 2,
before any work. Then the settings (packer/storage/cloud_env.py) without a server."""

from __future__ import annotations

import json
import time
from pathlib import Path

import cloud_servers as fx
import pytest
import torch
from click.testing import CliRunner
from cloud_servers import Cloud
from s3_server import RAW, write_src

import packer
from helpers.emulators import AzuriteServer
from packer.builder.api import BuildConfig, build
from packer.cli import cli
from packer.errors import CredentialsError, InputError, UsageError
from packer.storage import client as storage_client
from packer.storage.client import ObjectStore, open_store
from packer.storage.cloud_env import azure_settings, parse_connection_string
from packer.storage.lease import Lease
from packer.storage.url import parse_url

az, gs, gs_or_az = fx.az, fx.gs, fx.gs_or_az  # the fixtures
azurite_server, gcs_server = fx.azurite_server, fx.gcs_server
JPEG = BuildConfig(size=(8, 6), workers=1, shard_size=2500, store="jpeg")
OPTIONS = ["--size", "8x6", "--shard-size", "300", "--workers", "1"]  # RAW's


def local_tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def bucket_tree(url: str) -> dict[str, bytes]:
    """Every object under ``url``, read back through the client."""
    store = open_store(parse_url(url))
    return {key: store.get(key, max_bytes=1 << 24) for key in sorted(store.list())}


def every_image(s: packer.pack.packset.PackSet) -> torch.Tensor:
    out = []
    for k in range(len(s.index.shards)):
        pack = s.shard(k)
        out.append((pack.images if s.storage == "raw" else pack.jpeg).clone())
        s.release(k)
    return torch.cat(out)


def no_secret_anywhere(gs_or_az: Cloud, texts: list[str], roots: list[Path]) -> None:
    for text in texts:
        assert gs_or_az.secret not in text
    for root in roots:
        for path, data in local_tree(root).items():
            assert gs_or_az.secret.encode() not in data, path


# ---------------------------------------------------------------- with a server


@pytest.mark.parametrize("config", [RAW, JPEG], ids=["raw", "jpeg"])
def test_build_to_the_bucket_then_load_gives_the_local_sets_images(
    gs_or_az: Cloud, tmp_path: Path, config: BuildConfig
) -> None:
    fmt = "JPEG" if config.store == "jpeg" else "PNG"
    src = write_src(tmp_path / "src", {"cat": 3, "dog": 3}, fmt)
    url = gs_or_az.new_url()
    result = build(src, url, config)
    assert result.count == 6 and result.extra["shards_uploaded"] == len(
        packer.load(url).index.shards
    )
    ref = tmp_path / "ref"
    build(src, ref, config)
    assert bucket_tree(url) == local_tree(ref)  # the local set, byte for byte
    s, local = packer.load(url), packer.load(ref)
    assert len(s) == len(local) == 6 and s.storage == config.store
    assert torch.equal(s.labels, local.labels) and s.sources == local.sources
    assert torch.equal(every_image(s), every_image(local))
    s.store.close()


def test_a_set_streams_through_the_loader_and_the_cache_is_shared(
    gs_or_az: Cloud, tmp_path: Path
) -> None:
    src = write_src(tmp_path / "src", {"a": 6, "b": 6})
    url = gs_or_az.new_url()
    build(src, url, RAW)  # 6 shards of 2 rows (304 bytes each in the cache)
    build(src, tmp_path / "ref", RAW)
    kw = {"device": "cpu", "order": "shards", "seed": 3}
    s = packer.load(url, cache_limit=1300)  # the working set (4 shards), not all 6
    remote = packer.PackLoader(s, 2, **kw)
    ref = packer.PackLoader(packer.load(tmp_path / "ref"), 2, **kw)
    n = 0
    for (xa, ya), (xb, yb) in zip(remote, ref, strict=True):
        assert xa.equal(xb) and ya.equal(yb)
        n += len(ya)
    assert n == 12 and s.store.cached_bytes() <= s.store.limit
    assert len(s.store.cached()) < len(s.index.shards)  # some were evicted
    s.store.close()
    # a second reader of the same cache (no limit) downloads only what was evicted
    first = packer.load(url)
    every_image(first)
    first.store.close()
    again = packer.load(url)
    assert torch.equal(every_image(again), every_image(packer.load(tmp_path / "ref")))
    assert again.store.downloads == 0  # every shard from the shared cache
    again.store.close()


def test_info_verify_and_classes_over_the_url_never_show_the_secret(
    gs_or_az: Cloud, tmp_path: Path
) -> None:
    src = write_src(tmp_path / "src", {"cat": 3, "dog": 3})
    url = gs_or_az.new_url()
    runner = CliRunner()
    up = runner.invoke(cli, ["build", str(src), url, *OPTIONS, "--json"])
    assert up.exit_code == 0, up.output
    assert json.loads(up.stdout)["path"] == url
    info = runner.invoke(cli, ["info", url, "--json"])
    assert info.exit_code == 0, info.output
    out = json.loads(info.stdout)
    assert out["count"] == 6 and out["path"] == url and out["shards"]["count"] == 3
    verify = runner.invoke(cli, ["verify", url, "--no-source", "--json"])
    assert verify.exit_code == 0, verify.output
    assert json.loads(verify.stdout)["ok"]
    val = write_src(tmp_path / "val", {"dog": 1})
    b = runner.invoke(
        cli, ["build", str(val), str(tmp_path / "val_pack"), "--size", "8x6", "--classes", url]
    )
    assert b.exit_code == 0, b.output
    assert packer.load(tmp_path / "val_pack").labels.tolist() == [1]
    bad = runner.invoke(cli, ["info", url + "-nothing-here"])
    assert bad.exit_code == 2 and "imgpack-set.json is missing" in bad.output
    texts = [up.output, info.output, verify.output, b.output, bad.output]
    no_secret_anywhere(gs_or_az, texts, [tmp_path / "cache", tmp_path / "val_pack"])
    assert not any(gs_or_az.secret.encode() in v for v in bucket_tree(url).values())


def test_a_second_writer_is_turned_away_while_a_lease_is_held(
    gs_or_az: Cloud, tmp_path: Path
) -> None:
    src = write_src(tmp_path / "src", {"cat": 2, "dog": 2})
    url = gs_or_az.new_url()
    holder = Lease(open_store(parse_url(url)))
    holder.acquire()  # another writer, as listed by the server's clock
    try:
        r = CliRunner().invoke(cli, ["build", str(src), url, *OPTIONS])
        assert r.exit_code == 2, r.output
        assert "another imgpack build is writing this set (host " in r.output
        assert not (tmp_path / "cache" / "builds").exists()  # nothing built
        holder.check()  # the holder's lease is still the only live one
    finally:
        holder.release()
    r = CliRunner().invoke(cli, ["build", str(src), url, *OPTIONS])
    assert r.exit_code == 0, r.output
    assert not [k for k in bucket_tree(url) if k.startswith(".imgpack-lease")]


def test_an_object_changed_since_it_was_listed_is_refused_and_caps_hold(
    gs_or_az: Cloud, tmp_path: Path
) -> None:
    """download(etag=): Azurite answers If-Match with 412; the GCS XML API server ignores
    it, and the ETag of the answer is compared instead. Either way, InputError."""
    from packer.storage.client import TooLarge

    store = open_store(parse_url(gs_or_az.new_url()))
    store.put(b"first", "obj")
    [(key, size, etag)] = store.list_meta()
    assert (key, size) == ("obj", 5) and etag
    assert store.download(tmp_path / "a", "obj", etag=etag) == 5
    store.put(b"second!", "obj")
    with pytest.raises(InputError, match="obj: changed since it was listed"):
        store.download(tmp_path / "b", "obj", etag=etag)
    with pytest.raises(TooLarge, match="above the cap of 6"):
        store.get("obj", max_bytes=6)
    with pytest.raises(TooLarge):
        store.download(tmp_path / "c", "obj", max_bytes=6)
    assert store.head("missing") is None
    store.delete("obj")
    store.delete("obj")  # gone already: no error
    assert store.head("obj") is None and store.list() == []


def test_a_missing_bucket_is_one_line_exit_2_before_any_work(
    gs_or_az: Cloud, tmp_path: Path
) -> None:
    src = write_src(tmp_path / "src", {"cat": 2, "dog": 2})
    what = "container" if gs_or_az.scheme == "az" else "bucket"
    t0 = time.monotonic()
    url = f"{gs_or_az.scheme}://no-such-{what}/x"
    r = CliRunner().invoke(cli, ["build", str(src), url, *OPTIONS])
    assert r.exit_code == 2, r.output
    endpoint = (
        gs_or_az.server.blob_endpoint if gs_or_az.scheme == "az" else gs_or_az.server.endpoint
    )
    assert r.output == (
        f"Error: {gs_or_az.scheme}://no-such-{what}: the {what} does not exist; create it "
        f"first, or check its name and the endpoint ({endpoint})\n"
    )
    assert not (tmp_path / "cache" / "builds").exists()  # nothing built or staged
    for command in (["info", url], ["verify", url, "--no-source"]):
        r = CliRunner().invoke(cli, command)
        assert r.exit_code == 2 and f"the {what} does not exist" in r.output, r.output
        assert r.output.count("\n") == 1
    with pytest.raises(InputError, match=f"the {what} does not exist"):
        packer.load(url)
    assert time.monotonic() - t0 < 30


def test_a_wrong_azure_key_is_one_line_exit_2_before_any_work(
    az: Cloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = write_src(tmp_path / "src", {"cat": 2, "dog": 2})
    url = az.new_url()
    build(src, url, RAW)
    wrong = "d3Jvbmcva2V5K3RoYXQ+aXM/YmFzZTY0" + "A" * 12  # base64, not the key
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", wrong)
    r = CliRunner().invoke(cli, ["build", str(src), az.new_url(), *OPTIONS])
    assert r.exit_code == 2, r.output
    assert "refused the credentials (AuthorizationFailure); check AZURE_STORAGE_ACC" in r.output
    assert r.output.count("\n") == 1 and wrong not in r.output, r.output
    assert not list((tmp_path / "cache" / "builds").glob("*"))  # nothing staged
    r = CliRunner().invoke(cli, ["info", url])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and wrong not in r.output, r.output
    with pytest.raises(CredentialsError, match="refused the credentials"):
        packer.load(url)


class RefusingServer:
    """An HTTP server on 127.0.0.1 that refuses every request as GCS refuses a bad token
    (401, AuthenticationRequired), noting the Authorization headers it was sent. No GCS
    emulator checks credentials (docs/RELIABILITY.md), so this stands in for that answer."""

    def __init__(self) -> None:
        import http.server
        import threading

        seen: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def _refuse(self) -> None:
                seen.append(self.headers.get("Authorization", ""))
                n = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(n)
                body = (
                    b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>"
                    b"AuthenticationRequired</Code><Message>Invalid Credentials</Message></Error>"
                )
                self.send_response(401)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _refuse

            def log_message(self, *args: object) -> None:
                pass

        self.seen = seen
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_refused_google_token_is_one_line_exit_2_before_any_work(
    gs: Cloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = write_src(tmp_path / "src", {"cat": 2, "dog": 2})
    token = "ya29.not-a-valid-token-" + "q" * 16
    refusing = RefusingServer()
    try:
        monkeypatch.setenv("GOOGLE_BASE_URL", refusing.endpoint)
        monkeypatch.setenv("GOOGLE_BEARER_TOKEN", token)
        t0 = time.monotonic()
        r = CliRunner().invoke(cli, ["build", str(src), gs.new_url(), *OPTIONS])
        assert r.exit_code == 2, r.output
        assert "refused the credentials (AuthenticationRequired); check GOOGLE_APPLICATION" in (
            r.output
        )
        assert r.output.count("\n") == 1 and token not in r.output, r.output
        assert not (tmp_path / "cache" / "builds").exists()
        assert refusing.seen == [f"Bearer {token}"]  # sent once, never retried
        assert time.monotonic() - t0 < 10
        # the reason is the server's answer, never a match in the key ("403" in a random
        # lease name made it "403 Forbidden" now and then)
        store = open_store(parse_url("gs://imgpack/AccessDenied-403"))
        with pytest.raises(CredentialsError, match=r"\(AuthenticationRequired\); check GOO"):
            store.get("SignatureDoesNotMatch-403.json", max_bytes=10)
    finally:
        refusing.close()


def test_a_google_credentials_file_that_is_not_one_is_one_line(
    gs: Cloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = tmp_path / "creds.json"
    bad.write_text('{"type": "service_account", "private_key": "-----SECRET-----"')
    monkeypatch.delenv("GOOGLE_BEARER_TOKEN")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(bad))
    r = CliRunner().invoke(cli, ["info", gs.new_url()])
    assert r.exit_code == 2, r.output
    assert r.output.startswith("Error: gs://imgpack/sets/") and r.output.count("\n") == 1
    assert "SECRET" not in r.output


# ---------------------------------------------------------------- settings, no server


def test_azure_settings_from_a_connection_string_and_the_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in (
        "AZURE_STORAGE_ACCOUNT_NAME",
        "AZURE_STORAGE_ACCOUNT_KEY",
        "AZURE_STORAGE_ENDPOINT",
    ):
        monkeypatch.delenv(name, raising=False)
    key = "c2VjcmV0LWtleT09PT0="  # holds '=': values are split at the first '=' only
    monkeypatch.setenv(
        "AZURE_STORAGE_CONNECTION_STRING",
        f"DefaultEndpointsProtocol=http;AccountName=acct;AccountKey={key};"
        "BlobEndpoint=http://127.0.0.1:10000/acct;",
    )
    s = azure_settings("cnt")
    assert s.kwargs == {"account_name": "acct", "account_key": key, "use_emulator": False}
    assert s.endpoint == "http://127.0.0.1:10000/acct" and key in s.secrets
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "other")  # the variable wins
    assert azure_settings("cnt").kwargs["account_name"] == "other"
    assert parse_connection_string("A=b=c;;D=") == {"A": "b=c", "D": ""}
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", f"AccountName=a;{key[:-1]}")
    with pytest.raises(UsageError, match="is not a connection string") as e:
        azure_settings("cnt")
    assert key[:-1] not in str(e.value)


def test_azure_emulator_settings_and_a_missing_account(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_NAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("AZURE_STORAGE_ENDPOINT", raising=False)
    monkeypatch.delenv("AZURE_ENDPOINT", raising=False)
    monkeypatch.delenv("AZURE_STORAGE_USE_EMULATOR", raising=False)
    with pytest.raises(UsageError, match=r"az://cnt: no Azure storage account is set; set AZURE_"):
        open_store(parse_url("az://cnt/p"))
    monkeypatch.setenv("AZURE_STORAGE_USE_EMULATOR", "true")
    monkeypatch.setenv("AZURITE_BLOB_STORAGE_URL", "http://127.0.0.1:10999")
    store = open_store(parse_url("az://cnt/p"))
    assert store.endpoint == "http://127.0.0.1:10999/devstoreaccount1"
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "mine")
    monkeypatch.delenv("AZURE_STORAGE_USE_EMULATOR")
    # the same container of two accounts is two sets in the cache
    a = open_store(parse_url("az://cnt/p"))
    assert a.endpoint == "https://mine.blob.core.windows.net"
    assert parse_url("az://cnt/p").cache_key(a.endpoint) != parse_url("az://cnt/p").cache_key(
        store.endpoint
    )


@pytest.mark.parametrize(
    ("scheme", "name", "value"),
    [
        ("gs", "GOOGLE_BASE_URL", "http://storage.example.com"),
        ("az", "AZURE_STORAGE_ENDPOINT", "http://blob.example.com/acct"),
        ("az", "AZURITE_BLOB_STORAGE_URL", "http://azurite.example.com:10000"),
    ],
)
def test_plain_http_only_to_this_machine(
    monkeypatch: pytest.MonkeyPatch, scheme: str, name: str, value: str
) -> None:
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "acct")
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    monkeypatch.delenv("AZURE_STORAGE_ENDPOINT", raising=False)
    monkeypatch.delenv("AZURE_ENDPOINT", raising=False)
    if name == "AZURITE_BLOB_STORAGE_URL":
        monkeypatch.setenv("AZURE_STORAGE_USE_EMULATOR", "1")
    monkeypatch.setenv(name, value)
    with pytest.raises(UsageError, match="plain http is allowed only for a server on this"):
        open_store(parse_url(f"{scheme}://bkt/p"))


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("GOOGLE_BASE_URL", "http://user:pa/ss@127.0.0.1:99999"),
        ("AZURE_STORAGE_ENDPOINT", "https://user:pa/ss@blob.example.com?sig=x"),
    ],
)
def test_a_malformed_endpoint_is_one_line_and_never_echoed(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "acct")
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    monkeypatch.setenv(name, value)
    scheme = "gs" if name.startswith("GOOGLE") else "az"
    r = CliRunner().invoke(cli, ["info", f"{scheme}://bkt/p"])
    assert r.exit_code == 2 and r.output.startswith(f"Error: {name}"), r.output
    assert "pa/ss" not in r.output and r.output.count("\n") == 1


@pytest.mark.parametrize(
    ("url", "hint"),
    [("gs://tok@b/p", "GOOGLE_APPLICATION_CREDENTIALS"), ("az://k:s@cnt/p", "AZURE_STORAGE")],
)
def test_a_credential_in_a_gs_or_az_url_names_the_right_variables(url: str, hint: str) -> None:
    r = CliRunner().invoke(cli, ["info", url])
    assert r.exit_code == 2 and "credentials in the URL are refused" in r.output, r.output
    assert hint in r.output and "AWS" not in r.output and "tok" not in r.output


def test_dev_py_installs_the_azurite_the_tests_expect() -> None:
    import importlib.util

    from helpers import emulators

    spec = importlib.util.spec_from_file_location("dev", emulators.REPO / "dev.py")
    assert spec is not None and spec.loader is not None
    dev = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dev)
    assert dev.AZURITE_VERSION == emulators.AZURITE_VERSION
    assert dev.AZURITE == emulators.AZURITE_DIR
    assert "/.test-servers/" in (emulators.REPO / ".gitignore").read_text().split()


def test_a_refused_azure_token_request_is_one_line_exit_2(
    az: Cloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A service principal (client id and secret): obstore asks the OAuth authority for a
    token first; here a server on 127.0.0.1 that refuses it (401). One line naming that,
    exit 2, before any work, the secret never shown."""
    secret = "client-secret-" + "s" * 20
    refusing = RefusingServer()
    try:
        monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_KEY")
        monkeypatch.setenv("AZURE_STORAGE_CLIENT_ID", "00000000-0000-0000-0000-000000000001")
        monkeypatch.setenv("AZURE_STORAGE_CLIENT_SECRET", secret)
        monkeypatch.setenv("AZURE_STORAGE_TENANT_ID", "00000000-0000-0000-0000-000000000002")
        monkeypatch.setenv("AZURE_STORAGE_AUTHORITY_HOST", refusing.endpoint)
        src = write_src(tmp_path / "src", {"cat": 2, "dog": 2})
        r = CliRunner().invoke(cli, ["build", str(src), az.new_url(), *OPTIONS])
        assert r.exit_code == 2, r.output
        assert "no token for the credentials (the token server answered 401" in r.output
        assert "check AZURE_STORAGE_ACCOUNT_NAME" in r.output
        assert r.output.count("\n") == 1 and secret not in r.output, r.output
        assert not (tmp_path / "cache" / "builds").exists()
        assert refusing.seen  # the token was asked for, of this server
    finally:
        refusing.close()


@pytest.mark.parametrize(
    ("url", "name", "value", "secret"),
    [
        ("az://cnt/p", "AZURE_STORAGE_ACCOUNT_KEY", "not*base64!SECRETKEY", "SECRETKEY"),
        (
            "gs://b/p",
            "GOOGLE_SERVICE_ACCOUNT_KEY",
            '{"private_key": "SECRETPK", "client_email": 5}',
            "SECRETPK",
        ),
        ("gs://b/p", "GOOGLE_SERVICE_ACCOUNT_KEY", '{"private_key": "SECRETPK", ', "SECRETPK"),
    ],
)
def test_a_malformed_key_is_one_line_exit_2_never_quoted(
    monkeypatch: pytest.MonkeyPatch, url: str, name: str, value: str, secret: str
) -> None:
    for other in fx.CLEARED:
        monkeypatch.delenv(other, raising=False)
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "acct")
    monkeypatch.setenv(name, value)
    r = CliRunner().invoke(cli, ["info", url])
    assert r.exit_code == 2, r.output
    assert r.output.startswith(f"Error: {url}: cannot set up the client (")
    assert r.output.count("\n") == 1 and secret not in r.output, r.output


def test_a_sas_token_never_reaches_a_message(
    az: Cloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A SAS rides in every request's query; a server failing (503) makes obstore's error,
    which names the request, reach the retry warnings and the final message."""
    import http.server
    import threading

    class Failing(http.server.BaseHTTPRequestHandler):
        def _fail(self) -> None:
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_PUT = do_HEAD = _fail

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    sig = "TOPSECRET%2Bab%2Fcd%3D"
    try:
        monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_KEY")
        monkeypatch.setenv("AZURE_STORAGE_SAS_TOKEN", f"?sv=2021-08-06&sp=rl&sig={sig}")
        monkeypatch.setenv(
            "AZURE_STORAGE_ENDPOINT", f"http://127.0.0.1:{httpd.server_address[1]}/acct"
        )
        monkeypatch.setattr(storage_client.RETRY, "backoff", 0.01)
        r = CliRunner().invoke(cli, ["info", az.new_url()])
        assert r.exit_code == 1 and "could not read it after 3 tries" in r.output, r.output
        for text in (r.output, caplog.text):
            assert "TOPSECRET" not in text and "ab/cd" not in text
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_signature_in_any_message_is_scrubbed() -> None:
    store = ObjectStore.__new__(ObjectStore)  # no settings needed: the scrub alone
    store._secrets = []
    text = "GET http://h/c/k?sv=1&sig=abc%2Bdef&sp=r and https://x/o?X-Goog-Signature=f00d"
    out = store._scrub(text)
    assert "abc" not in out and "f00d" not in out and "sv=1" in out and "sp=r" in out


@pytest.mark.parametrize(
    "url",
    ["az://My-Container/p", "az://a--b/p", "az://ab/p", "az://abc-/p", "az://a_b_c/p",
     "az://" + "a" * 64 + "/p", "gs://Bucket/p", "gs://aB/p", "gs://abc-/p", "gs://abc./p"],
)  # fmt: skip
def test_a_name_outside_the_clouds_rules_is_one_line_before_any_request(url: str) -> None:
    r = CliRunner().invoke(cli, ["info", url])
    assert r.exit_code == 2, r.output
    what = "an Azure container name" if url.startswith("az") else "a Google Cloud Storage bucket"
    assert f"is not {what}" in r.output and r.output.count("\n") == 1, r.output
    for good in ("az://imgpack-1/p", "az://abc/p", "gs://my_bucket.example.com/p", "gs://abc/p"):
        assert str(parse_url(good)) == good


@pytest.mark.slow  # a child interpreter building (about 10 s)
def test_a_killed_upload_resumes_and_skips_the_uploaded_shards(
    gs_or_az: Cloud, tmp_path: Path
) -> None:
    import subprocess
    import sys
    import textwrap

    from conftest import subprocess_env

    src = write_src(tmp_path / "src", {"cat": 3, "dog": 3})
    url = gs_or_az.new_url()
    script = tmp_path / "kill.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, signal, sys
            import packer.builder.upload as up
            from packer.builder.api import BuildConfig, build
            seen = []
            def die(step):
                seen.append(step) if step.startswith("uploaded") else None
                if len(seen) == 2:  # two shards uploaded, the third and the index not
                    os.kill(os.getpid(), signal.SIGKILL)
            up._reached = die
            build(sys.argv[1], sys.argv[2], BuildConfig(size=(8, 6), workers=1, shard_size=300))
            """
        )
    )
    r = subprocess.run([sys.executable, str(script), str(src), url], env=subprocess_env())
    assert r.returncode == -9
    assert "imgpack-set.json" not in bucket_tree(url)  # no index: no reader sees the set
    result = build(src, url, RAW)
    assert result.extra["shards_already_there"] == 2 and result.extra["shards_uploaded"] == 1
    build(src, tmp_path / "ref", RAW)
    tree = {k: v for k, v in bucket_tree(url).items() if not k.startswith(".imgpack-lease")}
    assert tree == local_tree(tmp_path / "ref")


@pytest.mark.parametrize("how", ["connection string", "emulator", "endpoint over emulator"])
def test_azurite_through_a_connection_string_or_the_emulator_switch(
    az: Cloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    server = az.server
    assert isinstance(server, AzuriteServer)
    url = az.new_url()
    build(write_src(tmp_path / "src", {"cat": 2, "dog": 2}), url, RAW)
    for name in server.env():
        monkeypatch.delenv(name)
    if how == "connection string":
        monkeypatch.setenv(
            "AZURE_STORAGE_CONNECTION_STRING",
            f"DefaultEndpointsProtocol=http;AccountName={server.account};"
            f"AccountKey={server.key};BlobEndpoint={server.blob_endpoint};",
        )
    elif how == "emulator":  # obstore's emulator mode, the account and key of this server
        monkeypatch.setenv("AZURE_STORAGE_USE_EMULATOR", "true")
        monkeypatch.setenv("AZURITE_BLOB_STORAGE_URL", server.endpoint)
        monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", server.account)
        monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", server.key)
    else:  # the emulator switch on, pointing nowhere: the endpoint named is used
        for k, v in server.env().items():
            monkeypatch.setenv(k, v)
        monkeypatch.setenv("AZURE_STORAGE_USE_EMULATOR", "true")
        monkeypatch.setenv("AZURITE_BLOB_STORAGE_URL", "http://127.0.0.1:9")
    r = CliRunner().invoke(cli, ["info", url, "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["count"] == 4 and server.key not in r.output
    assert open_store(parse_url(url)).endpoint == server.blob_endpoint


def test_a_bucket_of_images_is_listed_as_a_folder_is_scanned(
    gs_or_az: Cloud, tmp_path: Path
) -> None:
    """A gs:// or az:// prefix of images as SRC (issue 47.4's URL part): one listing gives
    the classes and the images in a folder's order, with each object's size and ETag
    (what --engine ray's tasks download against)."""
    from dataclasses import replace

    from packer.builder.upload import plan_bucket

    src = write_src(tmp_path / "src", {"cat": 2, "dog": 3})
    url = gs_or_az.new_url()
    store = open_store(parse_url(url))
    for path in sorted(src.rglob("*.png")):
        store.put(path.read_bytes(), *path.relative_to(src).parts)
    plan = plan_bucket(url, replace(RAW, engine="ray"))
    assert plan.scan.classes == ["cat", "dog"]
    assert [(e.rel, e.label) for e in plan.scan.entries] == [
        ("cat/0.png", 0), ("cat/1.png", 0), ("dog/0.png", 1), ("dog/1.png", 1), ("dog/2.png", 1)
    ]  # fmt: skip
    for rel, (size, etag) in plan.scan.objects.items():
        assert size == (src / rel).stat().st_size and etag


def test_a_missing_object_named_like_a_missing_bucket_is_only_missing(
    gs_or_az: Cloud, tmp_path: Path
) -> None:
    """The bucket is there; only the object is not, whatever its key says."""
    from packer.storage.client import NotFound

    store = open_store(parse_url(gs_or_az.new_url() + "/NoSuchBucket"))
    key = "ContainerNotFound/The specified container does not exist/x.png"
    assert store.head(key) is None
    with pytest.raises(NotFound):
        store.get(key, max_bytes=10)
    store.delete(key)  # missing: quiet
    with pytest.raises(NotFound):
        store.download(tmp_path / "x", key)


def test_the_server_tests_share_one_xdist_worker(request: pytest.FixtureRequest) -> None:
    """Under ``--dist loadgroup`` every test using the GCS or Azure server is in group
    ``cloud`` (one start of each server a session), the settings tests in none."""
    from conftest import _xdist_group

    mine = [i for i in request.session.items if i.fspath == request.node.fspath]
    uses = {"azurite_server", "gcs_server", "gs_or_az"}  # gs_or_az: one of them, by param
    servers = [i for i in mine if uses & set(i.fixturenames)]
    for item in mine:  # the items collected with this one (all of them in a full run)
        assert (_xdist_group(item) == "cloud") == (item in servers), item.nodeid


def test_a_bucket_of_tar_shards_builds_one_pack_here(gs_or_az: Cloud, tmp_path: Path) -> None:
    """Issue 47.4 on GCS and Azure: a prefix of WebDataset shards is read in place by this
    machine's workers (no Ray), through the same client, and gives the pack the same
    shards on disk give."""
    import sys

    pytest.importorskip("webdataset")
    sys.path.insert(0, str(Path(__file__).parents[1] / "sources"))
    from source_data import digests, tree, write_shards

    folder = tree(tmp_path / "src")
    write_shards(folder, tmp_path / "shards", maxcount=5)
    url = gs_or_az.new_url()
    store = open_store(parse_url(url))
    for f in sorted((tmp_path / "shards").glob("*.tar")):
        store.put(f, f.name)
    cfg = BuildConfig(size=(16, 12), workers=2)
    r = build(url + "/train-{000000..000003}.tar", tmp_path / "from_bucket", cfg)
    assert r.count == 16 and not r.skipped
    build(str(tmp_path / "shards" / "train-{000000..000003}.tar"), tmp_path / "from_disk", cfg)
    assert digests(tmp_path / "from_bucket", ()) == digests(tmp_path / "from_disk", ())
