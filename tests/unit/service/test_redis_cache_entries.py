"""The Redis response cache's entry layout and key (kserve_v2.service.redis_cache), without a Redis:
what ``pack`` writes ``unpack`` reads back as the model's outputs (numbers and BYTES, read-only), a
value of another layout is a miss, and the key is the same in every process."""

from __future__ import annotations

import subprocess
import sys

import msgpack
import numpy as np

from kserve_v2.request.decode import DecodedRequest
from kserve_v2.service.redis_cache import KEY_PREFIX, RedisResponseCache, pack, unpack
from kserve_v2.settings.cache_config import RedisSettings


def test_outputs_and_parameters_come_back_as_stored() -> None:
    numbers = np.arange(12, dtype=np.float16).reshape(3, 4)
    texts = np.array([[b"a", b""], [b"\xff\x00", "caf\u00e9"]], dtype=object)
    entry = unpack(pack([numbers, texts, np.zeros((0, 2), dtype=np.int64)], {"k": 1, "b": True, "s": "v"}))
    assert entry is not None
    first, second, empty = entry.outputs
    assert first.dtype == np.float16 and np.array_equal(first, numbers) and not first.flags.writeable
    assert second.dtype == object and second.shape == (2, 2)
    assert second.tolist() == [[b"a", b""], [b"\xff\x00", "caf\u00e9".encode()]]
    assert empty.shape == (0, 2) and empty.dtype == np.int64
    assert entry.parameters == {"k": 1, "b": True, "s": "v"}


def test_a_value_of_another_layout_is_a_miss() -> None:
    assert unpack(b"not msgpack at all \xc1") is None
    assert unpack(msgpack.packb([99, [], None])) is None


def _key() -> bytes:
    cache = RedisResponseCache(RedisSettings("127.0.0.1", 1))  # no connection is made until a call
    decoded = DecodedRequest({"X": np.arange(3, dtype=np.int32)}, (), 1, {}, {}, ("Y",))  # type: ignore[arg-type]
    return cache.key("m", 1, decoded)


def test_the_key_is_the_same_in_every_process() -> None:
    key = _key()
    assert key.startswith(KEY_PREFIX) and len(key) == len(KEY_PREFIX) + 64
    other = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, 'tests/unit/service'); "
                            "from test_redis_cache_entries import _key; print(_key().decode())"],
                           capture_output=True, text=True, check=True)
    assert other.stdout.strip() == key.decode()
