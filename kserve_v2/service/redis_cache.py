"""Triton's ``redis`` response cache (github.com/triton-inference-server/redis_cache): the response
cache (``kserve_v2.service.response_cache``) kept in a Redis server, so that every replica of
``--workers N`` and every server pointed at the same Redis share one cache.

``--cache-config redis,host=<host> --cache-config redis,port=<port>`` and the other settings of its
README (``kserve_v2.settings.cache_config.RedisSettings``). The server pings Redis at start and does
not start without it ("Failed to initialize RedisCache: <reason>", Triton's text). Afterwards a
lookup or an insertion that fails (Redis down, a timeout) is logged and counted as a miss: the model
answers, as Triton's core goes on when its cache fails.

Entries are Redis strings under ``kserve_v2:response:<SHA-256 of the request, hex>`` (the key covers
what the local cache's covers, with no per-process secret, so every server computes the same key),
written with ``SET NX`` (an existing entry is Triton's ALREADY_EXISTS), never expiring: Redis's own
``maxmemory`` and ``maxmemory-policy`` (``allkeys-lru``, say) bound the cache, as with Triton's.
The value is msgpack (the outputs' datatypes, shapes and bytes, and the response's parameters); it
is not Triton's hash layout, so Triton and this server do not read each other's entries.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Mapping
from typing import Any

import msgpack
import numpy as np
import redis
import redis.asyncio

from kserve_v2.backend import Parameter
from kserve_v2.request.decode import DecodedRequest
from kserve_v2.service.response_cache import CachedResponse, CountedCache, hash_request
from kserve_v2.settings.cache_config import RedisSettings

log = logging.getLogger(__name__)

KEY_PREFIX = b"kserve_v2:response:"
_FORMAT = 1  # the value layout's version: an entry of another layout is a miss
_LOG_EVERY_S = 10.0  # a failing Redis is logged at most this often


def _connection(settings: RedisSettings) -> dict[str, Any]:
    """The Redis client's connection arguments for ``settings`` (times in seconds; None: forever)."""
    arguments: dict[str, Any] = {
        "host": settings.host, "port": settings.port, "db": settings.db,
        "username": settings.user or None, "password": settings.password or None,
        "socket_connect_timeout": settings.connect_timeout_ms / 1000 or None,
        "socket_timeout": settings.socket_timeout_ms / 1000 or None,
    }
    if settings.tls:
        arguments.update(ssl=True, ssl_certfile=settings.cert or None, ssl_keyfile=settings.key or None,
                         ssl_ca_certs=settings.cacert or None, ssl_ca_path=settings.cacert_dir or None)
    return arguments


def ping(settings: RedisSettings) -> None:
    """Connect to Redis and ping it once, as Triton's redis cache does when it is created (blocking:
    at start, before requests are served).

    Raises:
        RuntimeError: "Failed to initialize RedisCache: <reason>" (Triton's text; the server does not start).
    """
    client = redis.Redis(**_connection(settings))
    try:
        client.ping()
    except (redis.RedisError, OSError) as err:
        raise RuntimeError(f"Failed to initialize RedisCache: {err}") from None
    finally:
        client.close()


def pack(outputs: list[np.ndarray], parameters: Mapping[str, Parameter] | None) -> bytes:
    """An entry's value: msgpack of [format, [[datatype, shape, bytes or texts], ...], parameters].

    BYTES outputs (object arrays) keep each element's bytes; other outputs their C-order bytes."""
    packed = []
    for array in outputs:
        if array.dtype.hasobject:
            items = [item if isinstance(item, bytes) else str(item).encode() for item in array.flat]
            packed.append(["|O", list(array.shape), items])
        else:
            packed.append([array.dtype.str, list(array.shape), np.ascontiguousarray(array).tobytes()])
    return bytes(msgpack.packb([_FORMAT, packed, dict(parameters) if parameters else None], use_bin_type=True))


def unpack(value: bytes) -> CachedResponse | None:
    """The entry ``pack`` wrote (read-only arrays), or None for a value of another layout."""
    try:
        layout, packed, parameters = msgpack.unpackb(value, raw=False)
    except (ValueError, TypeError, msgpack.ExtraData):
        return None
    if layout != _FORMAT:
        return None
    outputs = []
    for datatype, shape, data in packed:
        if datatype == "|O":
            array = np.empty(len(data), dtype=object)
            array[:] = data
            array = array.reshape(shape)
        else:
            array = np.frombuffer(data, dtype=np.dtype(datatype)).reshape(shape)
        array.flags.writeable = False
        outputs.append(array)
    return CachedResponse(outputs, parameters, len(value))


class RedisResponseCache(CountedCache):
    """The response cache in Redis (see the module docstring); lookups and insertions are awaited on
    the event loop through a pool of ``pool_size`` connections.

    Args:
        settings: the redis cache's settings (``--cache-config redis,...``).
    """

    def __init__(self, settings: RedisSettings) -> None:
        super().__init__()
        self.settings = settings
        pool = redis.asyncio.BlockingConnectionPool(max_connections=settings.pool_size,
                                                    timeout=settings.wait_timeout_ms / 1000 or None,
                                                    **_redis_pool_arguments(settings))
        self._client = redis.asyncio.Redis(connection_pool=pool)
        self._logged_at = -_LOG_EVERY_S
        log.info("Response Cache is Redis at %s:%d", settings.host, settings.port)

    def key(self, model: str, version: int, decoded: DecodedRequest) -> bytes:
        """See ``CountedCache.key``: the Redis key, the same in every server."""
        digest = hashlib.sha256()
        hash_request(digest, model, version, decoded)
        return KEY_PREFIX + digest.hexdigest().encode()

    async def _find(self, key: bytes) -> CachedResponse | None:
        try:
            value = await self._client.get(key)
        except (redis.RedisError, OSError) as err:
            self._failed("Failed to retrieve key: ", key, err)
            return None
        return unpack(value) if isinstance(value, bytes) else None  # the client answers bytes (no decode_responses)

    async def _store(self, key: bytes, names: tuple[str, ...], outputs: list[np.ndarray],
                     parameters: Mapping[str, Parameter] | None) -> bool:
        try:
            stored = await self._client.set(key, pack(outputs, parameters), nx=True)
        except (redis.RedisError, OSError) as err:
            self._failed("Failed to insert key: ", key, err)
            return True
        return bool(stored)

    def _failed(self, what: str, key: bytes, err: Exception) -> None:
        """Log a failed Redis call in Triton's words, at most every ``_LOG_EVERY_S`` seconds."""
        now = time.monotonic()
        if now - self._logged_at >= _LOG_EVERY_S:
            self._logged_at = now
            log.error("%s%s. %s (answered by the model; logged at most every %d s)", what, key.decode(), err,
                      _LOG_EVERY_S)

    async def close(self) -> None:
        """Close the connections to Redis."""
        await self._client.aclose()


def _redis_pool_arguments(settings: RedisSettings) -> dict[str, Any]:
    """``_connection``'s arguments as a connection pool takes them (TLS: its SSL connection class)."""
    arguments = _connection(settings)
    if arguments.pop("ssl", False):
        arguments["connection_class"] = redis.asyncio.SSLConnection
    return arguments
