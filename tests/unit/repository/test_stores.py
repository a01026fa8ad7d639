"""Remote repository URLs as Triton parses them (``model_repository.md``; core's S3FileSystem regex)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from kserve_v2.repository.stores import (CREDENTIAL_FILE, StoreError, StoreLocation, file_credentials, is_url,
                                         open_store, parse_location, redact, split_repositories)


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


@pytest.mark.parametrize(("text", "expected"), [
    ("/models", ["/models"]),
    ("/a:/b", ["/a", "/b"]),
    ("/models:s3://127.0.0.1:9000/bucket/repo:gs://b/m", ["/models", "s3://127.0.0.1:9000/bucket/repo", "gs://b/m"]),
    ("s3://https://minio.local:443/bucket/repo:as://acct/c/p", ["s3://https://minio.local:443/bucket/repo",
                                                                "as://acct/c/p"]),
    ("s3://bucket/repo:9000", ["s3://bucket/repo", "9000"]),  # after a path, a number is a folder
    ("s3://host:9000:/local", ["s3://host:9000", "/local"]),
    ("::/a::", ["/a"]),
])
def test_split_repositories_keeps_urls_whole(text: str, expected: list[str]) -> None:
    assert split_repositories(text) == expected


def credential_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: object) -> Path:
    path = tmp_path / "creds.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    monkeypatch.setenv(CREDENTIAL_FILE, str(path))
    return path


CREDS = {
    "s3": {"": {"key_id": "any", "secret_key": "any-secret-1"},
           "s3://bucket-2": {"key_id": "two", "secret_key": "two-secret-2", "region": "eu-west-1"},
           "s3://bucket-2/deep": {"key_id": "deep", "secret_key": "deep-secret-3"}},
    "gs": {"gs://bucket": "/creds/sa.json"},
    "as": {"": {"account_str": "acct", "account_key": "azure-secret-4"}},
}


def test_credential_file_takes_the_longest_matching_prefix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert file_credentials(parse_location("s3://bucket-1/x")) is None  # the variable is unset
    credential_file(tmp_path, monkeypatch, CREDS)
    assert file_credentials(parse_location("s3://bucket-1/x"))["key_id"] == "any"  # "" matches every URL
    assert file_credentials(parse_location("s3://bucket-2/x"))["key_id"] == "two"
    assert file_credentials(parse_location("s3://bucket-2/deep/er"))["key_id"] == "deep"
    assert file_credentials(parse_location("gs://bucket/models")) == "/creds/sa.json"
    assert file_credentials(parse_location("as://other/c/p"))["account_str"] == "acct"
    with pytest.raises(StoreError, match=r"^Cannot match credential for path gs://elsewhere/m$"):
        file_credentials(parse_location("gs://elsewhere/m"))  # no "" entry: the environment is not read instead


@pytest.mark.parametrize(("content", "reason"), [
    ("{not json", "is not JSON"), ("[1]", "is not a JSON object"), ({"s3": []}, "'s3' member is not a JSON object"),
    ({"s3": {"": "path"}}, "is not an object of strings"), ({"gs": {"": {"a": "b"}}}, "is not a file path"),
])
def test_credential_file_errors_name_the_file(content: object, reason: str, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    path = credential_file(tmp_path, monkeypatch, content)
    with pytest.raises(StoreError, match=reason) as failed:
        file_credentials(parse_location("s3://b/r" if "gs" not in str(content) else "gs://b/r"))
    assert str(path) in str(failed.value)


def test_missing_credential_file_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CREDENTIAL_FILE, str(tmp_path / "absent.json"))
    with pytest.raises(StoreError, match="absent.json' cannot be read: No such file"):
        file_credentials(parse_location("s3://b/r"))


def test_redact_hides_the_credential_file_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    credential_file(tmp_path, monkeypatch, CREDS)
    text = redact("any-secret-1 two-secret-2 deep-secret-3 azure-secret-4 two")
    assert text == "*** *** *** *** two"


@pytest.mark.skipif(importlib.util.find_spec("adlfs") is None, reason="adlfs is not installed (kserve_v2[azure])")
def test_azure_credentials_as_triton_chooses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The account of the credential wins over the URL's; a key signs; no key and no auth type is anonymous."""
    for variable in ("AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_KEY", "AZURE_STORAGE_AUTH_TYPE",
                     "AZURE_STORAGE_CONNECTION_STRING"):
        monkeypatch.delenv(variable, raising=False)
    anonymous = open_store(parse_location("as://urlaccount/c/p"))
    assert anonymous.account_name == "urlaccount" and anonymous.anon
    credential_file(tmp_path, monkeypatch, CREDS)
    keyed = open_store(parse_location("as://urlaccount/c/p"))
    assert keyed.account_name == "acct" and keyed.account_key == "azure-secret-4" and not keyed.anon
    credential_file(tmp_path, monkeypatch, {"as": {"": {"auth_type": "certificate"}}})
    with pytest.raises(StoreError, match="auth_type 'certificate' is not one of"):
        open_store(parse_location("as://urlaccount/c/p"))
