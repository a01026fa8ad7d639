"""The response cache's flags, as Triton's ``tritonserver`` spells them: ``--cache-config <cache>,<key>=<value>``
(repeated, one setting each), ``--cache-directory`` and the deprecated ``--response-cache-byte-size``
(Triton's ``docs/user_guide/response_cache.md``; parsing as Triton's ``command_line_parser.cc``
``ParseCacheConfigOption``). Two caches: ``local`` (Triton's local_cache: ``size``) and ``redis``
(Triton's redis_cache, github.com/triton-inference-server/redis_cache: its README's settings, and
its ``TRITONCACHE_REDIS_USERNAME`` / ``TRITONCACHE_REDIS_PASSWORD`` environment variables). The caches
themselves are ``kserve_v2.service.response_cache`` and ``kserve_v2.service.redis_cache``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

LOCAL = "local"  # Triton's local_cache
REDIS = "redis"  # Triton's redis_cache
DEFAULT_DIRECTORY = "/opt/tritonserver/caches"  # Triton's --cache-directory default
# the redis cache's settings (its README, "Available Configuration Options" and "TLS"; cacert_dir as its source reads it)
REDIS_SETTINGS = ("host", "port", "user", "password", "db", "connect_timeout", "socket_timeout", "pool_size",
                  "wait_timeout", "tls_enabled", "cert", "key", "cacert", "cacert_dir", "sni")
_REDIS_NUMBERS = ("port", "db", "connect_timeout", "socket_timeout", "pool_size", "wait_timeout")
_NO_ADDRESS = ("Failed to initialize RedisCache, didn't specify address. Must at a minimum specify 'host' and 'port' "
               "in the configuration - e.g. tritonserver --cache-config redis,host=redis --cache-config redis,port=6379 "
               "--model-repository=/models ...")


@dataclass(frozen=True)
class RedisSettings:
    """Triton's redis cache settings (times in ms; 0: wait forever, as its client reads them).

    Attributes:
        host, port: where Redis listens.
        user, password: ACL credentials (``user`` empty: Redis's ``default``), else the environment's
            ``TRITONCACHE_REDIS_USERNAME`` / ``TRITONCACHE_REDIS_PASSWORD`` (the flags win, as in Triton).
        db: the database number.
        connect_timeout_ms, socket_timeout_ms: the longest wait for a connection and for an answer (0: forever).
        pool_size: connections kept to Redis.
        wait_timeout_ms: the longest wait for a free pooled connection.
        tls: connect over TLS (``tls_enabled=true``), with ``cert``/``key`` (client certificate),
            ``cacert`` (a CA file) or ``cacert_dir`` (a CA folder).
    """

    host: str
    port: int
    user: str = ""
    password: str = ""
    db: int = 0
    connect_timeout_ms: int = 0
    socket_timeout_ms: int = 0
    pool_size: int = 1
    wait_timeout_ms: int = 1000
    tls: bool = False
    cert: str = ""
    key: str = ""
    cacert: str = ""
    cacert_dir: str = ""


@dataclass(frozen=True)
class CacheConfig:
    """The server's response cache: Triton's ``local`` cache of ``size`` bytes, or its ``redis`` cache.

    Attributes:
        name: the cache implementation (``local`` or ``redis``).
        size: the bytes a ``local`` cache's entries may take in all (outputs' bytes plus their names,
            datatypes and shapes, as Triton's local cache counts its buffers); 0 for ``redis`` (Redis's
            own ``maxmemory`` bounds it).
        settings: every ``<key>=<value>`` given for it, in order (``size`` among them).
        redis: the ``redis`` cache's settings (None for ``local``).
    """

    name: str
    size: int
    settings: tuple[tuple[str, str], ...] = ()
    redis: RedisSettings | None = None


def parse_cache_setting(text: str) -> tuple[str, str, str]:
    """Split one ``--cache-config`` value into (cache name, setting, value).

    Raises:
        ValueError: no cache name before a ``,`` ("No cache specified. --cache-config option format is
            <cache name>,<setting>=<value>. Got <text>"), no ``=`` after it, or an empty setting or
            value ("--cache-config option format is '<cache name>,<setting>=<value>'. Got <text>"):
            Triton's texts.
    """
    comma = text.find(",")
    if comma <= 0:
        raise ValueError(f"No cache specified. --cache-config option format is <cache name>,<setting>=<value>. "
                         f"Got {text}")
    equals = text.find("=", comma + 1)
    setting, value = text[comma + 1:equals], text[equals + 1:]
    if equals < 0 or not setting or not value:
        raise ValueError(f"--cache-config option format is '<cache name>,<setting>=<value>'. Got {text}")
    return text[:comma], setting, value


def parse_cache_config(values: Sequence[str], directory: str = DEFAULT_DIRECTORY, byte_size: int | None = None,
                       environ: Mapping[str, str] | None = None) -> CacheConfig | None:
    """The response cache the flags ask for, or None when none does (no model is then cached, whatever
    its ``response_cache``, as in Triton).

    Args:
        values: every ``--cache-config`` value.
        directory: ``--cache-directory``, named in the error for a cache other than ``local``.
        byte_size: the deprecated ``--response-cache-byte-size`` (a ``local`` cache of that size).
        environ: the environment the redis cache's credentials are read from (default ``os.environ``).

    Raises:
        ValueError: a malformed value (``parse_cache_setting``); both flags given ("Error: Incompatible
            flags --response-cache-byte-size and --cache-config both provided. Please provide one or
            the other."); settings for several caches ("found multiple cache configurations, but only
            a single cache is currently supported"); a cache other than ``local`` ("unable to find
            'libtritoncache_<name>.so' for cache. Searched: <directory>"); a ``local`` cache without
            ``size`` ("Failed to initialize LocalCache: config didn't contain a valid 'size' field.")
            or whose size does not start with a whole number of bytes > 0 ("Failed to initialize LocalCache:
            stoull", as ``std::stoull`` fails; a negative size, which Triton wraps and fails to allocate); a
            ``redis`` cache without ``host`` and ``port`` ("Failed to initialize RedisCache, didn't specify
            address. ..."): Triton's texts. Ours: a ``redis`` setting not in ``REDIS_SETTINGS``, a number
            that is not a whole number >= 0 (port 1-65535, pool_size >= 1), ``tls_enabled`` other than
            true/false, TLS files without ``tls_enabled=true``, an ``sni`` other than ``host`` (the client
            names the host it connects to).
    """
    if byte_size is not None:
        if values:
            raise ValueError("Error: Incompatible flags --response-cache-byte-size and --cache-config both "
                             "provided. Please provide one or the other.")
        values = [f"{LOCAL},size={byte_size}"]
    if not values:
        return None
    settings: dict[str, list[tuple[str, str]]] = {}
    for value in values:
        name, key, setting = parse_cache_setting(value)
        settings.setdefault(name, []).append((key, setting))
    if len(settings) > 1:
        raise ValueError("found multiple cache configurations, but only a single cache is currently supported")
    (name, pairs), = settings.items()
    if name == REDIS:
        return CacheConfig(name, 0, tuple(pairs), _redis(dict(pairs), os.environ if environ is None else environ))
    if name != LOCAL:
        raise ValueError(f"unable to find 'libtritoncache_{name}.so' for cache. Searched: {directory}")
    sizes = [value for key, value in pairs if key == "size"]
    if not sizes:
        raise ValueError("Failed to initialize LocalCache: config didn't contain a valid 'size' field.")
    # the last value of a key counts, read as C++ std::stoull reads it (Triton's local cache): its leading number
    number = re.match(r"\s*\+?(\d+)", sizes[-1])
    if number is None:
        raise ValueError("Failed to initialize LocalCache: stoull")
    size = int(number.group(1))
    if size <= 0:
        raise ValueError(f"Failed to initialize LocalCache: size must be > 0 bytes, got {sizes[-1]}")
    return CacheConfig(name, size, tuple(pairs))


def _redis(found: dict[str, str], environ: Mapping[str, str]) -> RedisSettings:
    """The redis cache's settings (the last value of each key), checked (see ``parse_cache_config``)."""
    unknown = [key for key in found if key not in REDIS_SETTINGS]
    if unknown:
        raise ValueError(f"--cache-config: redis setting '{unknown[0]}' is not supported (supported: "
                         f"{', '.join(REDIS_SETTINGS)})")
    if "host" not in found or "port" not in found:
        raise ValueError(_NO_ADDRESS)
    numbers: dict[str, int] = {}
    for key in _REDIS_NUMBERS:
        if key in found:
            text = found[key].strip()
            if not text.isdigit():
                raise ValueError(f"--cache-config: redis setting '{key}' must be a whole number >= 0, got '{found[key]}'")
            numbers[key] = int(text)
    if not 1 <= numbers["port"] <= 65535:
        raise ValueError(f"--cache-config: redis setting 'port' must be 1-65535, got '{found['port']}'")
    if numbers.get("pool_size", 1) < 1:
        raise ValueError("--cache-config: redis setting 'pool_size' must be at least 1")
    tls = found.get("tls_enabled", "false")
    if tls not in ("true", "false"):
        raise ValueError(f"--cache-config: redis setting 'tls_enabled' must be true or false, got '{tls}'")
    files = [key for key in ("cert", "key", "cacert", "cacert_dir", "sni") if key in found]
    if files and tls != "true":
        raise ValueError(f"--cache-config: redis setting '{files[0]}' needs tls_enabled=true")
    if found.get("sni", found["host"]) != found["host"]:
        raise ValueError("--cache-config: redis setting 'sni' must name the host: the TLS server name sent is the "
                         "host connected to")
    defaults = RedisSettings("", 0)
    return RedisSettings(
        found["host"], numbers["port"], found.get("user", environ.get("TRITONCACHE_REDIS_USERNAME", "")),
        found.get("password", environ.get("TRITONCACHE_REDIS_PASSWORD", "")), numbers.get("db", defaults.db),
        numbers.get("connect_timeout", defaults.connect_timeout_ms), numbers.get("socket_timeout", defaults.socket_timeout_ms),
        numbers.get("pool_size", defaults.pool_size), numbers.get("wait_timeout", defaults.wait_timeout_ms),
        tls == "true", found.get("cert", ""), found.get("key", ""), found.get("cacert", ""), found.get("cacert_dir", ""))
