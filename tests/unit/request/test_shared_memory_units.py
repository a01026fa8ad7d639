"""System shared memory regions held by requests in flight: what may be unregistered, and when."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from kserve_v2.protocol.errors import Cancelled, InternalError, NotFound
from kserve_v2.request.shared_memory import SHM_ROOT, SharedMemoryRegistry


@pytest.fixture
def registry() -> Iterator[SharedMemoryRegistry]:
    """Regions 'a', 'b' and 'c', 64 bytes each of one object in /dev/shm."""
    key = f"/kv2_unit_{os.getpid()}"
    (SHM_ROOT / key[1:]).write_bytes(bytes(192))
    registry = SharedMemoryRegistry()
    for i, name in enumerate("abc"):
        registry.register(name, key, 64 * i, 64)
    yield registry
    (SHM_ROOT / key[1:]).unlink()


def test_a_held_region_is_not_unregistered_until_released(registry: SharedMemoryRegistry) -> None:
    first, second = registry.request(), registry.request()
    first.slice("a", 0, 8)
    second.slice("a", 8, 8)
    second.slice("b", 0, 64)
    with pytest.raises(InternalError) as err:
        registry.unregister("a")
    assert str(err.value) == "Cannot unregister shared memory region 'a', it is currently in use."
    registry.unregister("c")  # nobody holds it
    first.release()
    with pytest.raises(InternalError):
        registry.unregister("a")  # the second request still holds it
    second.release()
    second.release()  # idempotent: no count goes below zero
    registry.unregister("a")
    registry.unregister("b")
    assert registry.status("") == []


def test_unregister_all_removes_the_free_regions_and_names_the_held_ones(registry: SharedMemoryRegistry) -> None:
    request = registry.request()
    request.slice("c", 0, 4)
    request.slice("a", 0, 4)
    with pytest.raises(InternalError) as err:
        registry.unregister("")
    assert str(err.value) == "Failed to unregister the following system shared memory regions: a ,c ,"
    assert [r.name for r in registry.status("")] == ["a", "c"]
    request.release()
    registry.unregister("")
    assert registry.status("") == []


def test_a_released_request_takes_no_more_regions(registry: SharedMemoryRegistry) -> None:
    """A cancelled request whose decoding goes on in a thread must not hold a region afterwards."""
    request = registry.request()
    request.release()
    with pytest.raises(Cancelled):
        request.slice("a", 0, 4)
    registry.unregister("a")


def test_a_failed_slice_holds_nothing(registry: SharedMemoryRegistry) -> None:
    request = registry.request()
    with pytest.raises(NotFound):
        request.slice("missing", 0, 4)
    registry.unregister("")
    assert registry.status("") == []
