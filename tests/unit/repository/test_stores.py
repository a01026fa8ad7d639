"""Remote repository URLs as Triton parses them (``model_repository.md``; core's S3FileSystem regex)."""

from __future__ import annotations

import pytest

from kserve_v2.repository.stores import StoreError, StoreLocation, is_url, parse_location, redact


@pytest.mark.parametrize(("url", "expected"), [
    ("s3://bucket/path/to/repo", StoreLocation("s3://bucket/path/to/repo", "s3", "bucket/path/to/repo")),
    ("s3://bucket", StoreLocation("s3://bucket", "s3", "bucket")),
    ("s3://127.0.0.1:9000/bucket/repo/", StoreLocation("s3://127.0.0.1:9000/bucket/repo/", "s3", "bucket/repo",
                                                       endpoint="http://127.0.0.1:9000")),
    ("s3://https://minio.local:443/bucket/repo", StoreLocation("s3://https://minio.local:443/bucket/repo", "s3",
                                                               "bucket/repo", endpoint="https://minio.local:443")),
    ("s3://http://minio:9000//bucket//repo", StoreLocation("s3://http://minio:9000//bucket//repo", "s3", "bucket/repo",
                                                           endpoint="http://minio:9000")),
    ("gs://bucket/models", StoreLocation("gs://bucket/models", "gs", "bucket/models")),
    ("as://account/container/models", StoreLocation("as://account/container/models", "as", "container/models",
                                                    account="account")),
])
def test_url_forms(url: str, expected: StoreLocation) -> None:
    assert is_url(url)
    assert parse_location(url) == expected


@pytest.mark.parametrize(("url", "reason"), [("s3://", "names no bucket"), ("gs:///", "names no bucket"),
                                             ("as://account", "as://account/container/path"),
                                             ("ftp://host/x", "only s3://, gs:// and as://")])
def test_refused_urls(url: str, reason: str) -> None:
    with pytest.raises(StoreError, match=reason):
        parse_location(url)


def test_local_paths_are_not_urls() -> None:
    assert not is_url("/models") and not is_url("models/s3://x") and not is_url("s3:/bucket")


def test_redact_hides_secret_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "abcd1234secret")
    monkeypatch.setenv("AZURE_STORAGE_KEY", "azurekey==")
    assert redact("signed with abcd1234secret and azurekey==") == "signed with *** and ***"


def test_redact_hides_the_secret_parts_of_a_connection_string(monkeypatch: pytest.MonkeyPatch) -> None:
    key = "c2VjcmV0LWtleQ=="
    connection = f"DefaultEndpointsProtocol=http;AccountName=acct;AccountKey={key};SharedAccessSignature=sv=1&sig=abcd;"
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", connection)
    assert redact(f"bad string {connection}") == "bad string ***"
    assert redact(f"key {key}, quoted c2VjcmV0LWtleQ%3D%3D, sas sv=1&sig=abcd") == "key ***, quoted ***, sas ***"
    assert redact("AccountName=acct") == "AccountName=acct"  # the rest is not secret
