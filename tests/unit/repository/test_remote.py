"""A remote repository's listing on the event loop: the last listing answers, and ``refresh`` reads the store on a
worker thread, so a slow or unreachable store never stalls the loop."""

from __future__ import annotations

import asyncio
import importlib.util
import threading
from pathlib import Path

import pytest

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
