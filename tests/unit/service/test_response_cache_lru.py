"""The local response cache (kserve_v2.service.response_cache): what the key covers, LRU eviction by bytes,
an entry larger than the cache, and Triton's ALREADY_EXISTS rule for a second insertion."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import numpy as np

from kserve_v2.request.decode import DecodedRequest
from kserve_v2.service.response_cache import Lookup, ResponseCache


def _decoded(x: np.ndarray, outputs: tuple[str, ...] = ("Y",), **parameters: object) -> DecodedRequest:
    return DecodedRequest({"X": x}, (), 1, dict(parameters), {}, outputs)  # type: ignore[arg-type]


def _lookup(cache: ResponseCache, x: np.ndarray) -> Lookup:
    return asyncio.run(cache.lookup("m", 1, "1", _decoded(x)))


def _insert(cache: ResponseCache, lookup: Lookup, outputs: list[np.ndarray],
            parameters: Mapping[str, object] | None = None) -> int | None:
    return asyncio.run(cache.insert(lookup, "m", "1", outputs, parameters))  # type: ignore[arg-type]


def test_the_key_covers_bytes_shape_datatype_outputs_and_parameters() -> None:
    cache = ResponseCache(1 << 20)
    x = np.arange(4, dtype=np.float32)
    base = cache.key("m", 1, _decoded(x))
    assert cache.key("m", 1, _decoded(x.copy())) == base
    assert cache.key("m", 1, _decoded(x, priority=3, timeout=10)) == base  # scheduling fields are not the model's
    assert cache.key("m", 2, _decoded(x)) != base
    assert cache.key("n", 1, _decoded(x)) != base
    assert cache.key("m", 1, _decoded(x.reshape(2, 2))) != base
    assert cache.key("m", 1, _decoded(x.view(np.int32))) != base
    assert cache.key("m", 1, _decoded(x, ("Z",))) != base
    assert cache.key("m", 1, _decoded(x, k=1)) != base
    texts = np.array([b"ab", b"c"], dtype=object)
    assert cache.key("m", 1, _decoded(texts)) != cache.key("m", 1, _decoded(np.array([b"a", b"bc"], dtype=object)))


def test_least_recently_used_out_first_by_bytes() -> None:
    y = np.zeros(40, dtype=np.float32)  # 4 + 1 ("Y") + 32 + 7 ("float32") + 8 + 160 = 212 bytes an entry
    cache = ResponseCache(700)
    keys = [np.full(2, i, dtype=np.float32) for i in range(4)]
    for x in keys[:3]:
        lookup = _lookup(cache, x)
        assert lookup.found is None
        assert _insert(cache, lookup, [y]) is not None
    assert len(cache) == 3 and cache.used == 636
    assert _lookup(cache, keys[0]).found is not None  # now the most recently used
    _insert(cache, _lookup(cache, keys[3]), [y])
    assert len(cache) == 3 and cache.evictions == 1
    assert _lookup(cache, keys[1]).found is None  # the least recently used went
    assert _lookup(cache, keys[0]).found is not None
    found = _lookup(cache, keys[3]).found
    assert found is not None and not found.outputs[0].flags.writeable


def test_an_entry_larger_than_the_cache_is_not_stored_but_is_a_miss() -> None:
    cache = ResponseCache(700)
    lookup = _lookup(cache, np.zeros(1, dtype=np.float32))
    assert _insert(cache, lookup, [np.zeros(1000, dtype=np.float32)]) is not None
    assert len(cache) == 0 and cache.used == 0


def test_a_second_insertion_of_a_key_is_not_a_miss() -> None:
    cache = ResponseCache(1 << 20)
    x = np.ones(3, dtype=np.float32)
    first, second = _lookup(cache, x), _lookup(cache, x)  # two requests in flight at once
    assert _insert(cache, first, [x]) is not None
    assert _insert(cache, second, [x]) is None  # Triton's ALREADY_EXISTS
    assert len(cache) == 1
