"""A remote repository's listing on the event loop: the last listing answers, and ``refresh`` reads the store on a
worker thread, so a slow or unreachable store never stalls the loop. An empty prefix is an empty repository once the
bucket is known to exist; a missing bucket or a failed request is a failure, named with the URL and no secret."""

from __future__ import annotations

import asyncio
import importlib.util
import threading
from pathlib import Path
from typing import Any

import pytest

from kserve_v2.protocol.errors import InternalError
from kserve_v2.repository import remote, stores

pytestmark = pytest.mark.skipif(importlib.util.find_spec("s3fs") is None, reason="s3fs is not installed")


class Counting(remote.RemoteRepository):
    """A repository on a closed port whose listings record the thread that read the store."""

    def __init__(self, mirror: Path) -> None:
        super().__init__(stores.parse_location("s3://127.0.0.1:9/bucket/repo"), mirror)
        self.threads: list[str] = []

    def _list(self, prefix: str) -> dict[str, remote.Files]:
        self.threads.append(threading.current_thread().name)
        return {"model": {"1/model.onnx": (1, 1, "bucket/repo/model/1/model.onnx")}}


def test_the_loop_reads_the_last_listing_and_refresh_lists_off_the_loop(tmp_path: Path) -> None:
    repository = Counting(tmp_path)

    async def on_the_loop() -> None:
        assert set(repository.listing()) == {"model"}  # the first listing is read, even on the loop
        assert repository.threads == ["MainThread"]
        assert set(repository.listing()) == {"model"}  # then the loop reads the last one
        assert repository.threads == ["MainThread"]
        remote._MIRRORS[tmp_path] = repository
        try:
            await remote.refresh([tmp_path, tmp_path.parent])  # the local folder is not listed
        finally:
            del remote._MIRRORS[tmp_path]
        assert len(repository.threads) == 2 and repository.threads[1] != "MainThread"

    asyncio.run(on_the_loop())
    repository.listing()  # off the loop: the store is read
    assert len(repository.threads) == 3


class FakeStore:
    """What ``_list`` asks of an fsspec file system: ``find`` (every file under a path) and ``info`` (the bucket)."""

    def __init__(self, files: dict[str, int], buckets: set[str]) -> None:
        self.files = files
        self.buckets = buckets
        self.down = ""  # when set: the error every request fails with

    def find(self, path: str, detail: bool) -> dict[str, dict[str, Any]]:
        if self.down:
            raise ConnectionError(self.down)
        return {name: {"type": "file", "size": size, "ETag": "x"} for name, size in self.files.items()
                if name.startswith(path + "/") and name.split("/")[0] in self.buckets}  # adlfs: no container, no file

    def info(self, path: str) -> dict[str, Any]:
        if path not in self.buckets:
            raise FileNotFoundError(path)
        return {"name": path, "type": "directory"}


def fake(tmp_path: Path, url: str, store: FakeStore) -> remote.RemoteRepository:
    repository = remote.RemoteRepository(stores.parse_location(url), tmp_path)
    repository._store = store
    return repository


def test_an_empty_prefix_is_an_empty_listing_and_a_missing_bucket_a_failure(tmp_path: Path) -> None:
    store = FakeStore({"models/repo/scale/1/model.onnx": 4}, {"models"})
    repository = fake(tmp_path, "s3://models/repo", store)
    assert repository.check() == "" and set(repository.listing()) == {"scale"}
    store.files.clear()
    repository._failed_at = -remote.RETRY_AFTER_FAILURE_SECS
    assert repository.listing() == {} and repository.failed == ""  # the last model is gone
    store.buckets.clear()
    store.files["models/repo/scale/1/model.onnx"] = 4
    repository._listing = {"scale": {}}
    assert repository.listing() == {"scale": {}}  # no bucket: an outage, the last listing answers
    assert repository.failed == "FileNotFoundError: no such bucket 'models'"
    with pytest.raises(FileNotFoundError, match="no such container 'models'"):
        fake(tmp_path, "as://account/models/repo", store)._list("")


def test_at_start_an_empty_prefix_is_no_repository_and_a_bucket_alone_is_one(tmp_path: Path) -> None:
    store = FakeStore({}, {"models"})
    assert fake(tmp_path, "gs://models/repo", store).check() == (
        "model repository 'gs://models/repo' cannot be read: no object under 'repo/' in 'models': repository path "
        "is not a valid directory")
    assert fake(tmp_path, "gs://models", store).check() == ""
    assert fake(tmp_path, "gs://absent", store).check() == (
        "model repository 'gs://absent' cannot be read: FileNotFoundError: no such bucket 'absent'")


def test_a_failed_listing_names_the_url_in_loads_and_no_secret(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "the-secret-key-0123")
    store = FakeStore({"models/repo/scale/1/model.onnx": 4}, {"models"})
    repository = fake(tmp_path, "s3://models/repo", store)
    monkeypatch.setattr(remote, "_MIRRORS", {tmp_path: repository})
    assert repository.check() == ""
    assert str(remote.unlisted("late")) == "failed to load 'late', failed to poll from model repository"
    store.down = "refused with the-secret-key-0123"
    expected = ("failed to poll from model repository 's3://models/repo': ConnectionError: refused with ***")
    with pytest.raises(InternalError) as failed:
        repository.fetch("scale")
    assert str(failed.value) == f"failed to load 'scale', {expected}"
    repository._failed_at = -remote.RETRY_AFTER_FAILURE_SECS
    assert set(repository.listing()) == {"scale"}  # kept
    assert str(remote.unlisted("late")) == f"failed to load 'late', {expected}"


@pytest.mark.parametrize(("url", "shown"), [
    ("s3://bucket/repo", "s3://bucket/repo"),
    ("s3://key:secret@bucket/repo?sig=1#f", "s3://bucket/repo"),
    ("s3://https://user@minio:443/bucket/repo?X-Amz-Signature=abc", "s3://https://minio:443/bucket/repo"),
    ("as://account/container/repo?sv=2024&sig=xyz", "as://account/container/repo"),
])
def test_public_url(url: str, shown: str) -> None:
    assert stores.public_url(url) == shown
