"""Google Cloud Storage and Azure Blob settings from the environment, for
:class:`~packer.storage.client.ObjectStore` (S3's are ``client._aws_settings``).

Read here, checked, then handed to obstore explicitly, so that an endpoint is checked
(plain http only for a server on this machine) and every secret is known, to be
scrubbed from any message. Nothing here is printed or stored.

``gs://``: ``GOOGLE_APPLICATION_CREDENTIALS`` (a service-account or user credentials
file), or ``GOOGLE_SERVICE_ACCOUNT`` (a file), ``GOOGLE_SERVICE_ACCOUNT_KEY`` (its JSON),
``GOOGLE_BEARER_TOKEN`` (a static OAuth token); ``GOOGLE_BASE_URL`` for another server
(an emulator, a proxy). With none of them obstore asks the machine's metadata server
(on a GCP machine).

``az://container/prefix``: ``AZURE_STORAGE_ACCOUNT_NAME`` with ``AZURE_STORAGE_ACCOUNT_KEY``
(or ``AZURE_STORAGE_SAS_TOKEN``, or a service principal: ``AZURE_CLIENT_ID``,
``AZURE_CLIENT_SECRET``, ``AZURE_TENANT_ID``; obstore's other ``AZURE_*`` settings
apply too), or ``AZURE_STORAGE_CONNECTION_STRING`` (``AccountName=...;AccountKey=...;
BlobEndpoint=...``; the variables win over it); ``AZURE_STORAGE_ENDPOINT`` for another
server; ``AZURE_STORAGE_USE_EMULATOR=true`` for Azurite (at ``AZURITE_BLOB_STORAGE_URL``,
default ``http://127.0.0.1:10000``, account ``devstoreaccount1`` unless named).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from .._fs import loads_json
from ..errors import UsageError

GCS_CREDENTIALS_HINT = (
    "check GOOGLE_APPLICATION_CREDENTIALS (or GOOGLE_SERVICE_ACCOUNT, "
    "GOOGLE_SERVICE_ACCOUNT_KEY, GOOGLE_BEARER_TOKEN)"
)
AZURE_CREDENTIALS_HINT = (
    "check AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY (or "
    "AZURE_STORAGE_SAS_TOKEN, AZURE_STORAGE_CONNECTION_STRING)"
)
AWS_CREDENTIALS_HINT = "check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)"
CREDENTIALS_HINT = {
    "s3": AWS_CREDENTIALS_HINT,
    "gs": GCS_CREDENTIALS_HINT,
    "az": AZURE_CREDENTIALS_HINT,
}
# where a credential belongs, for the refusal of one written into a URL
CREDENTIALS_PLACE = {
    "s3": "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) or ~/.aws/credentials",
    "gs": "GOOGLE_APPLICATION_CREDENTIALS)",
    "az": "AZURE_STORAGE_ACCOUNT_NAME, AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_TOKEN)",
}

AZURITE_URL = "http://127.0.0.1:10000"  # Azurite's blob service by default
AZURITE_ACCOUNT = "devstoreaccount1"

_AZURE_KEYS = ("AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_ACCESS_KEY", "AZURE_STORAGE_MASTER_KEY")
_AZURE_SAS = ("AZURE_STORAGE_SAS_KEY", "AZURE_STORAGE_SAS_TOKEN")
_AZURE_SECRETS = (
    *_AZURE_KEYS,
    *_AZURE_SAS,
    "AZURE_STORAGE_TOKEN",
    "AZURE_STORAGE_CLIENT_SECRET",
    "AZURE_CLIENT_SECRET",
    "AZURE_STORAGE_CONNECTION_STRING",
)
_TRUE = ("1", "true", "yes", "on")


@dataclass
class Settings:
    """What the store is made with: ``kwargs`` for obstore's store, the ``endpoint`` in
    use (None: the service's own), the variable it came from (for messages), and the
    ``secrets`` to scrub from every message."""

    kwargs: dict[str, Any] = field(default_factory=dict)
    endpoint: str | None = None
    endpoint_from: str = ""
    secrets: list[str] = field(default_factory=list)


def _first(env: os._Environ[str] | dict[str, str], names: tuple[str, ...]) -> str | None:
    for name in names:
        if env.get(name):
            return env[name]
    return None


def gcs_settings() -> Settings:
    """``gs://``: the endpoint (``GOOGLE_BASE_URL``) and the secrets of the environment;
    obstore reads the credentials' variables itself."""
    env = os.environ
    out = Settings()
    for name in ("GOOGLE_SERVICE_ACCOUNT_KEY", "GOOGLE_BEARER_TOKEN"):
        if env.get(name):
            out.secrets.append(env[name])
    key = env.get("GOOGLE_SERVICE_ACCOUNT_KEY")
    if key:
        try:
            private = loads_json(key).get("private_key")
        except (ValueError, AttributeError):
            private = None
        if isinstance(private, str) and private:
            out.secrets.append(private)
    if env.get("GOOGLE_BASE_URL"):
        out.endpoint = env["GOOGLE_BASE_URL"]
        out.endpoint_from = "GOOGLE_BASE_URL"
    return out


def parse_connection_string(text: str) -> dict[str, str]:
    """``Key=Value;...`` of an Azure connection string (values may hold ``=``). A part
    without ``=`` is refused without quoting it (it may be a secret)."""
    out: dict[str, str] = {}
    for part in text.strip().split(";"):
        if not part.strip():
            continue
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            raise UsageError(
                "AZURE_STORAGE_CONNECTION_STRING is not a connection string "
                "(Key=Value;Key=Value, e.g. AccountName=...;AccountKey=...)"
            )
        out[key.strip()] = value.strip()
    return out


def azure_settings(container: str) -> Settings:
    """``az://``: account, key or SAS, endpoint, emulator, from the variables first, then
    the connection string. UsageError when no account is named."""
    env = os.environ
    out = Settings()
    cs_text = env.get("AZURE_STORAGE_CONNECTION_STRING", "")
    cs = parse_connection_string(cs_text) if cs_text.strip() else {}
    out.secrets += [env[n] for n in _AZURE_SECRETS if env.get(n)]
    out.secrets += [cs[k] for k in ("AccountKey", "SharedAccessSignature") if cs.get(k)]
    emulator = (env.get("AZURE_STORAGE_USE_EMULATOR", "").strip().lower() in _TRUE) or (
        cs.get("UseDevelopmentStorage", "").lower() == "true"
    )
    account = env.get("AZURE_STORAGE_ACCOUNT_NAME") or cs.get("AccountName")
    if emulator and not account:
        account = AZURITE_ACCOUNT
    if not account:
        raise UsageError(
            f"az://{container}: no Azure storage account is set; set "
            "AZURE_STORAGE_ACCOUNT_NAME (with AZURE_STORAGE_ACCOUNT_KEY or "
            "AZURE_STORAGE_SAS_TOKEN) or AZURE_STORAGE_CONNECTION_STRING"
        )
    out.kwargs["account_name"] = account
    key = _first(env, _AZURE_KEYS) or cs.get("AccountKey")
    if key:
        out.kwargs["account_key"] = key
    sas = _first(env, _AZURE_SAS) or cs.get("SharedAccessSignature")
    if sas and not key:
        out.kwargs["sas_key"] = sas.lstrip("?")
    endpoint = _first(env, ("AZURE_STORAGE_ENDPOINT", "AZURE_ENDPOINT"))
    if endpoint or cs.get("BlobEndpoint"):
        if endpoint:
            out.endpoint, out.endpoint_from = endpoint, "AZURE_STORAGE_ENDPOINT"
        else:
            out.endpoint = cs["BlobEndpoint"]
            out.endpoint_from = "BlobEndpoint of AZURE_STORAGE_CONNECTION_STRING"
        out.kwargs["use_emulator"] = False  # the endpoint named wins (obstore: the emulator)
    elif emulator:
        base = env.get("AZURITE_BLOB_STORAGE_URL") or AZURITE_URL
        out.endpoint = f"{base.rstrip('/')}/{account}"
        out.endpoint_from = "AZURITE_BLOB_STORAGE_URL"
        out.kwargs["use_emulator"] = True
    else:
        out.endpoint = f"https://{account}.blob.core.windows.net"
    return out
