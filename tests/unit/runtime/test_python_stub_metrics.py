"""A custom metric family deleted in a python model's stub process (``kserve_v2.runtime.python.stub``): its
``__del__`` may run in a garbage collection at any allocation, also while the stub's thread holds one of the link's
locks; it must neither wait for that lock (a deadlock) nor lose the deletion, which reaches the server before the
model's next call does."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

from kserve_v2.backend.custom_metrics import MetricKind
from kserve_v2.runtime.python.protocol import Link, Message, MetricFamily, MetricFamilyGone, Reply
from kserve_v2.runtime.python.shm import Region, Sizes
from kserve_v2.runtime.python.stub import Stub, StubHost


def test_a_family_deleted_under_the_links_lock_is_gone_before_the_next_call(tmp_path: Path) -> None:
    server_end, stub_end = socket.socketpair()
    seen: list[Message] = []
    server = Link(server_end, "test-server")

    def take(number: int, message: Message) -> None:
        seen.append(message)
        server.reply(Reply(number, len(seen)))  # a family's number

    server.serve(take)
    region = Region(f"kserve-v2-test-stub-metrics-{os.getpid()}", 4096, create=True)
    stub = Stub(stub_end, region, Sizes())
    try:
        host = StubHost(stub, 7, str(tmp_path))
        families = [host.metric_family("requests", "Requests seen", MetricKind.COUNTER)]

        def delete_holding_the_lock() -> None:
            with stub.link._guard:  # as a garbage collection inside the link's own code would
                families.clear()  # the last reference: __del__ runs here

        deleting = threading.Thread(target=delete_holding_the_lock, daemon=True)
        deleting.start()
        deleting.join(timeout=10)
        assert not deleting.is_alive(), "__del__ waited for the link's lock it was called under"

        host.metric_family("errors", "Errors seen", MetricKind.COUNTER)
        assert seen == [MetricFamily(7, "requests", "Requests seen", MetricKind.COUNTER),
                        MetricFamilyGone(7, 1),
                        MetricFamily(7, "errors", "Errors seen", MetricKind.COUNTER)]
    finally:
        stub.link.close()
        server.close(wait=5)
        region.close(unlink=True)
