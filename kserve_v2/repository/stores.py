"""Object stores a model repository can live in, as Triton names them (``model_repository.md``, "Model
Repository Locations", and ``src/filesystem/`` of triton-inference-server/core):

- ``s3://bucket/path``, ``s3://host:port/bucket/path`` (an S3-compatible endpoint over HTTP, such as MinIO)
  and ``s3://https://host:port/bucket/path`` (over HTTPS), read with ``s3fs``;
- ``gs://bucket/path``, read with ``gcsfs``;
- ``as://account/container/path`` (Azure Blob Storage), read with ``adlfs``.

Each library is an optional extra of the package (``pip install kserve_v2[s3]``, ``[gcs]``, ``[azure]``).
Credentials come from where Triton takes them: the AWS environment variables and config files (botocore's
chain); ``GOOGLE_APPLICATION_CREDENTIALS``, else the attached service account, else anonymous access;
``AZURE_STORAGE_ACCOUNT`` / ``AZURE_STORAGE_KEY`` / ``AZURE_STORAGE_AUTH_TYPE`` / ``AZURE_STORAGE_CLIENT_ID``. When
``TRITON_CLOUD_CREDENTIAL_PATH`` names a JSON file, the credentials of each store come from that file instead, from the
entry whose name is the longest prefix of the URL (Triton's ``model_repository.md``, "Cloud Storage with Credential
file"). ``AZURE_STORAGE_CONNECTION_STRING`` (the Azure SDK's variable; not Triton's), when set, is used instead for
``as://``: its ``BlobEndpoint=`` points at an emulator such as Azurite or a private endpoint. No secret is ever part of
a text made here (``redact``).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMES = ("s3", "gs", "as")
# scheme -> (the fsspec library that reads it, the package extra that installs it)
EXTRAS = {"s3": ("s3fs", "s3"), "gs": ("gcsfs", "gcs"), "as": ("adlfs", "azure")}
# Triton's S3FileSystem regex: an endpoint needs a port; the scheme is http unless https:// is given
S3_ENDPOINT = re.compile(r"s3://(http://|https://|)([0-9a-zA-Z\-.]+):([0-9]+)/([0-9a-z.\-]+)(((/[0-9a-zA-Z.\-_]+)*)?)")
# get_file's options per store: s3fs reads a large object in parts held whole in memory (50 MiB each, several at
# once) unless it reads one stream, 64 KiB at a time (max_concurrency 1). gcsfs and adlfs stream in small blocks.
DOWNLOAD_OPTIONS: dict[str, dict[str, int]] = {"s3": {"max_concurrency": 1}}
SECRET_VARIABLES = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AZURE_STORAGE_KEY", "AZURE_STORAGE_CONNECTION_STRING",
                    "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_CLIENT_SECRET")
CREDENTIAL_FILE = "TRITON_CLOUD_CREDENTIAL_PATH"
# the members of the credential file's entries that are secret (Triton's S3Credential and ASCredential)
SECRET_MEMBERS = ("secret_key", "session_token", "account_key")
# the secret parts of an Azure connection string (its other parts, such as BlobEndpoint, are not secret)
CONNECTION_STRING_SECRETS = re.compile(r"(?i)(?:AccountKey|SharedAccessSignature)=([^;]+)")


class StoreError(ValueError):
    """A URL that names no store Triton reads, or a store whose library is not installed."""


@dataclass(frozen=True)
class StoreLocation:
    """Where a remote repository is.

    Attributes:
        url: the URL as given (with no credentials in it: Triton's URLs carry none).
        scheme: ``s3``, ``gs`` or ``as``.
        root: the repository's path in the store as fsspec names it (``bucket/path``, ``container/path``).
        endpoint: an S3-compatible endpoint (``http://host:port``), or "" for AWS itself.
        account: the Azure storage account, or "".
    """

    url: str
    scheme: str
    root: str
    endpoint: str = ""
    account: str = ""


def is_url(text: str) -> bool:
    """Whether ``text`` names a repository in an object store (``s3://``, ``gs://``, ``as://``)."""
    return any(text.startswith(f"{scheme}://") for scheme in SCHEMES)


def public_url(url: str) -> str:
    """``url`` as a text may show it: without user information (``user:password@``, after the scheme or an S3
    endpoint's ``http(s)://``) and without a query or fragment (a signature, a SAS token)."""
    return re.sub(r"(://)[^/@]*@", r"\1", re.split(r"[?#]", url, maxsplit=1)[0])


def split_repositories(text: str) -> list[str]:
    """The repositories of a ``:``-separated list (``KSERVE_V2_MODEL_REPOSITORY``), where URLs keep their own colons:
    ``/models:s3://127.0.0.1:9000/bucket/repo:gs://b/m`` is a folder and two URLs. A ``:`` belongs to a URL when
    what follows starts with ``//`` (after a scheme) or is a port (digits, then ``/`` or the end) right after a URL's
    host; every other ``:`` separates."""
    parts: list[str] = []
    for piece in text.split(":"):
        last = parts[-1] if parts else ""
        after_scheme = piece.startswith("//") and last in (*SCHEMES, "s3://http", "s3://https")
        port = re.fullmatch(r"[0-9]+(/.*)?", piece) is not None and re.fullmatch(
            r"s3://(https?://)?[^/]+", last) is not None
        if after_scheme or port:
            parts[-1] = f"{last}:{piece}"
        else:
            parts.append(piece)
    return [part for part in parts if part]


def parse_location(url: str) -> StoreLocation:
    """The location of a repository URL.

    Raises:
        StoreError: not one of Triton's URL forms, or no bucket / container in it.
    """
    scheme, _, rest = url.partition("://")
    if scheme not in SCHEMES:
        raise StoreError(f"model repository '{url}': only s3://, gs:// and as:// URLs are read")
    if scheme == "s3":
        match = S3_ENDPOINT.fullmatch(re.sub(r"(?<!:)/{2,}", "/", url.rstrip("/")))
        if match:
            protocol, host, port, bucket, path = match.group(1, 2, 3, 4, 5)
            return StoreLocation(url, scheme, (bucket + path).rstrip("/"),
                                 endpoint=f"{protocol or 'http://'}{host}:{port}")
    root = "/".join(part for part in rest.split("/") if part)
    if scheme == "as":
        account, _, root = root.partition("/")
        if not root:
            raise StoreError(f"model repository '{url}': Azure URLs are as://account/container/path")
        return StoreLocation(url, scheme, root, account=account)
    if not root:
        raise StoreError(f"model repository '{url}' names no bucket")
    return StoreLocation(url, scheme, root)


def check_installed(scheme: str) -> None:
    """Raise when the library that reads ``scheme`` is missing.

    Raises:
        StoreError: naming the extra to install (``pip install kserve_v2[s3]``).
    """
    library, extra = EXTRAS[scheme]
    if importlib.util.find_spec(library) is None:  # found, not imported (gcsfs reads its settings on import)
        raise StoreError(f"{scheme}:// model repositories need the '{library}' package: "
                         f"pip install kserve_v2[{extra}]")


def file_credentials(location: StoreLocation) -> Any:
    """The entry of ``TRITON_CLOUD_CREDENTIAL_PATH``'s JSON file for ``location``, or None when the variable is unset.

    The file holds an object per scheme (``"s3"``, ``"gs"``, ``"as"``) whose members are URL prefixes; the longest
    prefix of ``location.url`` names the entry, and ``""`` matches every URL (Triton's core,
    ``src/filesystem/api.cc``). S3 entries have ``key_id``, ``secret_key``, ``session_token``, ``region`` and
    ``profile``; GCS entries are the path of a service-account JSON file; Azure entries have ``account_str``,
    ``account_key``, ``auth_type`` and ``client_id``. With the file, the store's environment variables are not read
    (as in Triton).

    Raises:
        StoreError: the file cannot be read or is not a JSON object; no entry matches the URL (Triton's text,
            "Cannot match credential for path <url>"); an entry of the wrong type.
    """
    path = os.environ.get(CREDENTIAL_FILE)
    if not path:
        return None
    creds = _credential_file(path)
    entries = creds.get(location.scheme, {})
    if not isinstance(entries, dict):
        raise StoreError(f"{CREDENTIAL_FILE} '{path}': its '{location.scheme}' member is not a JSON object")
    for prefix in sorted(entries, key=len, reverse=True):
        if location.url.startswith(prefix):
            entry = entries[prefix]
            path_entry = location.scheme == "gs"
            if not (isinstance(entry, str) if path_entry else
                    isinstance(entry, dict) and all(isinstance(value, str) for value in entry.values())):
                kind = "a file path" if path_entry else "an object of strings"
                raise StoreError(f"{CREDENTIAL_FILE} '{path}': the '{location.scheme}' credential '{prefix}' is not {kind}")
            return entry
    raise StoreError(f"Cannot match credential for path {location.url}")


def _credential_file(path: str) -> dict[str, Any]:
    """``TRITON_CLOUD_CREDENTIAL_PATH``'s file as JSON (read at each use: Triton reloads it when a client fails).

    Raises:
        StoreError: it cannot be read, or is not a JSON object (the text names the file, never its content).
    """
    try:
        creds = json.loads(Path(path).read_text())
    except OSError as err:
        raise StoreError(f"{CREDENTIAL_FILE} '{path}' cannot be read: {err.strerror}") from None
    except ValueError as err:
        raise StoreError(f"{CREDENTIAL_FILE} '{path}' is not JSON: line {getattr(err, 'lineno', '?')}") from None
    if not isinstance(creds, dict):
        raise StoreError(f"{CREDENTIAL_FILE} '{path}' is not a JSON object")
    return creds


def open_store(location: StoreLocation) -> Any:
    """An fsspec file system for ``location``, with the credentials Triton would use (no network access yet).
    Listings are never cached: each one reads the store.

    Raises:
        StoreError: the library is missing (``check_installed``), or ``file_credentials`` refuses.
    """
    check_installed(location.scheme)
    entry = file_credentials(location)
    if location.scheme == "s3":
        return _s3(location, entry)
    if location.scheme == "gs":
        if os.environ.get("STORAGE_EMULATOR_HOST"):  # emulators do not serve the storage control API gcsfs asks
            os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")  # (read when gcsfs is imported)
        import gcsfs

        credentials = entry if entry is not None else os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
        token: str | None = credentials or ("anon" if os.environ.get("STORAGE_EMULATOR_HOST") else None)
        # token None: the attached service account (google_default), else anonymous access (gcsfs' order)
        return gcsfs.GCSFileSystem(token=token, use_listings_cache=False, skip_instance_cache=True)
    return _azure(location, entry)


def _s3(location: StoreLocation, entry: dict[str, str] | None) -> Any:
    """An ``s3fs`` file system: keys from the credential file's entry or the AWS variables, else a profile, else
    botocore's chain (files, instance roles), as Triton's S3 client chooses."""
    import s3fs

    config: dict[str, Any] = {"connect_timeout": 5, "read_timeout": 60, "retries": {"max_attempts": 2}}
    client: dict[str, Any] = {}
    if location.endpoint:
        client["endpoint_url"] = location.endpoint
        config["s3"] = {"addressing_style": "path"}  # as Triton's client for custom endpoints
    if entry is None:
        region = os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION")
        return s3fs.S3FileSystem(use_listings_cache=False, skip_instance_cache=True, config_kwargs=config,
                                 client_kwargs={**client, **({"region_name": region} if region else {})})
    if entry.get("region"):
        client["region_name"] = entry["region"]
    keys: dict[str, Any] = {}
    if entry.get("key_id") and entry.get("secret_key"):
        keys = {"key": entry["key_id"], "secret": entry["secret_key"], "token": entry.get("session_token") or None}
    elif entry.get("profile"):
        from aiobotocore.session import AioSession

        keys = {"session": AioSession(profile=entry["profile"])}
    return s3fs.S3FileSystem(use_listings_cache=False, skip_instance_cache=True, config_kwargs=config,
                             client_kwargs=client, **keys)


def _azure(location: StoreLocation, entry: dict[str, str] | None) -> Any:
    """An ``adlfs`` file system. The account is the credential's ``account_str`` (``AZURE_STORAGE_ACCOUNT``), else
    the URL's; ``auth_type`` (``AZURE_STORAGE_AUTH_TYPE``) ``managed_identity`` (with ``client_id`` /
    ``AZURE_STORAGE_CLIENT_ID`` for a user-assigned identity) or ``default`` (Azure's default credential chain) uses
    a token; else an account key (``AZURE_STORAGE_KEY``) signs requests; else access is anonymous (Triton's
    ``as.h``)."""
    import adlfs

    # azure-core logs every request and response at INFO (headers, redacted): Triton's Azure client logs none of them
    logging.getLogger("azure.core.pipeline.policies.http_logging_policy").setLevel(logging.WARNING)
    if entry is None:
        entry = {name: os.environ.get(variable, "") for name, variable in (
            ("account_str", "AZURE_STORAGE_ACCOUNT"), ("account_key", "AZURE_STORAGE_KEY"),
            ("auth_type", "AZURE_STORAGE_AUTH_TYPE"), ("client_id", "AZURE_STORAGE_CLIENT_ID"))}
    account = entry.get("account_str") or location.account
    # a connection string names its endpoint (BlobEndpoint=, e.g. Azurite's http://127.0.0.1:10000/devstoreaccount1)
    # and its credentials; adlfs prefers it to the account and key
    connection = os.environ.get("AZURE_STORAGE_CONNECTION_STRING") or None
    options: dict[str, Any] = {"account_name": account, "connection_string": connection,
                               "use_listings_cache": False, "skip_instance_cache": True}
    auth = entry.get("auth_type", "")
    if auth == "managed_identity":
        from azure.identity.aio import ManagedIdentityCredential

        credential = ManagedIdentityCredential(client_id=entry["client_id"]) if entry.get("client_id") else (
            ManagedIdentityCredential())
        return adlfs.AzureBlobFileSystem(credential=credential, anon=False, **options)
    if auth == "default":
        return adlfs.AzureBlobFileSystem(anon=False, **options)  # adlfs' DefaultAzureCredential
    if auth not in ("", "key"):
        raise StoreError(f"as:// auth_type '{auth}' is not one of key, managed_identity, default")
    key = entry.get("account_key") or None
    return adlfs.AzureBlobFileSystem(account_key=key, anon=key is None and connection is None, **options)


def _file_secrets() -> list[str]:
    """The secret members of every entry of ``TRITON_CLOUD_CREDENTIAL_PATH``'s file (none when it cannot be read)."""
    path = os.environ.get(CREDENTIAL_FILE)
    try:
        creds = _credential_file(path) if path else {}
    except StoreError:
        return []
    return [str(entry.get(member, "")) for entries in creds.values() if isinstance(entries, dict)
            for entry in entries.values() if isinstance(entry, dict) for member in SECRET_MEMBERS]


def redact(text: str) -> str:
    """``text`` with the value of every secret credential variable and credential file member, and the ``AccountKey`` / ``SharedAccessSignature``
    of ``AZURE_STORAGE_CONNECTION_STRING`` (whole or URL-quoted), replaced by ``***``."""
    secrets = [os.environ.get(variable, "") for variable in SECRET_VARIABLES]
    secrets += CONNECTION_STRING_SECRETS.findall(os.environ.get("AZURE_STORAGE_CONNECTION_STRING", ""))
    secrets += _file_secrets()
    for secret in sorted(secrets, key=len, reverse=True):  # a whole connection string before the key inside it
        if len(secret) >= 4:
            text = text.replace(secret, "***").replace(urllib.parse.quote(secret, safe=""), "***")
    return text
