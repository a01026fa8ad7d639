"""Object stores a model repository can live in, as Triton names them (``model_repository.md``, "Model
Repository Locations", and ``src/filesystem/`` of triton-inference-server/core):

- ``s3://bucket/path``, ``s3://host:port/bucket/path`` (an S3-compatible endpoint over HTTP, such as MinIO)
  and ``s3://https://host:port/bucket/path`` (over HTTPS), read with ``s3fs``;
- ``gs://bucket/path``, read with ``gcsfs``;
- ``as://account/container/path`` (Azure Blob Storage), read with ``adlfs``.

Each library is an optional extra of the package (``pip install kserve_v2[s3]``, ``[gcs]``, ``[azure]``).
Credentials come from where Triton takes them: the AWS environment variables and config files (botocore's
chain); ``GOOGLE_APPLICATION_CREDENTIALS``, else the attached service account, else anonymous access;
``AZURE_STORAGE_ACCOUNT`` / ``AZURE_STORAGE_KEY``, else Azure's default credentials. ``AZURE_STORAGE_CONNECTION_STRING``
(the Azure SDK's variable; not Triton's), when set, is used instead for ``as://``: its ``BlobEndpoint=`` points at an
emulator such as Azurite or a private endpoint. No secret is ever part of a text made here (``redact``).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import urllib.parse
from dataclasses import dataclass
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


def open_store(location: StoreLocation) -> Any:
    """An fsspec file system for ``location``, with the credentials Triton would use (no network access yet).
    Listings are never cached: each one reads the store.

    Raises:
        StoreError: the library is missing (``check_installed``).
    """
    check_installed(location.scheme)
    if location.scheme == "s3":
        import s3fs

        config: dict[str, Any] = {"connect_timeout": 5, "read_timeout": 60, "retries": {"max_attempts": 2}}
        client: dict[str, Any] = {}
        if location.endpoint:
            client["endpoint_url"] = location.endpoint
            config["s3"] = {"addressing_style": "path"}  # as Triton's client for custom endpoints
        region = os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION")
        if region:
            client["region_name"] = region
        return s3fs.S3FileSystem(use_listings_cache=False, skip_instance_cache=True, config_kwargs=config,
                                 client_kwargs=client)
    if location.scheme == "gs":
        if os.environ.get("STORAGE_EMULATOR_HOST"):  # emulators do not serve the storage control API gcsfs asks
            os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")  # (read when gcsfs is imported)
        import gcsfs

        credentials = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
        token: str | None = credentials or ("anon" if os.environ.get("STORAGE_EMULATOR_HOST") else None)
        # token None: the attached service account (google_default), else anonymous access (gcsfs' order)
        return gcsfs.GCSFileSystem(token=token, use_listings_cache=False, skip_instance_cache=True)
    import adlfs

    # azure-core logs every request and response at INFO (headers, redacted): Triton's Azure client logs none of them
    logging.getLogger("azure.core.pipeline.policies.http_logging_policy").setLevel(logging.WARNING)
    account = location.account or os.environ.get("AZURE_STORAGE_ACCOUNT", "")
    key = os.environ.get("AZURE_STORAGE_KEY") or None
    # a connection string names its endpoint (BlobEndpoint=, e.g. Azurite's http://127.0.0.1:10000/devstoreaccount1)
    # and its credentials; adlfs prefers it to the account and key
    connection = os.environ.get("AZURE_STORAGE_CONNECTION_STRING") or None
    return adlfs.AzureBlobFileSystem(account_name=account, account_key=key, connection_string=connection, anon=False,
                                     use_listings_cache=False, skip_instance_cache=True)


def redact(text: str) -> str:
    """``text`` with the value of every secret credential variable, and the ``AccountKey`` / ``SharedAccessSignature``
    of ``AZURE_STORAGE_CONNECTION_STRING`` (whole or URL-quoted), replaced by ``***``."""
    secrets = [os.environ.get(variable, "") for variable in SECRET_VARIABLES]
    secrets += CONNECTION_STRING_SECRETS.findall(os.environ.get("AZURE_STORAGE_CONNECTION_STRING", ""))
    for secret in sorted(secrets, key=len, reverse=True):  # a whole connection string before the key inside it
        if len(secret) >= 4:
            text = text.replace(secret, "***").replace(urllib.parse.quote(secret, safe=""), "***")
    return text
