"""The response cache's flags, as Triton's ``tritonserver`` spells them: ``--cache-config <cache>,<key>=<value>``
(repeated, one setting each), ``--cache-directory`` and the deprecated ``--response-cache-byte-size``
(Triton's ``docs/user_guide/response_cache.md``; parsing as Triton's ``command_line_parser.cc``
``ParseCacheConfigOption``). The cache itself is ``kserve_v2.service.response_cache``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

LOCAL = "local"  # the one cache implementation this server has (Triton's local_cache)
DEFAULT_DIRECTORY = "/opt/tritonserver/caches"  # Triton's --cache-directory default


@dataclass(frozen=True)
class CacheConfig:
    """The server's response cache: Triton's ``local`` cache of ``size`` bytes.

    Attributes:
        name: the cache implementation (always ``local``).
        size: the bytes its entries may take in all (outputs' bytes plus their names, datatypes and
            shapes, as Triton's local cache counts its buffers).
        settings: every ``<key>=<value>`` given for it, in order (``size`` among them).
    """

    name: str
    size: int
    settings: tuple[tuple[str, str], ...] = ()


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


def parse_cache_config(values: Sequence[str], directory: str = DEFAULT_DIRECTORY,
                       byte_size: int | None = None) -> CacheConfig | None:
    """The response cache the flags ask for, or None when none does (no model is then cached, whatever
    its ``response_cache``, as in Triton).

    Args:
        values: every ``--cache-config`` value.
        directory: ``--cache-directory``, named in the error for a cache other than ``local``.
        byte_size: the deprecated ``--response-cache-byte-size`` (a ``local`` cache of that size).

    Raises:
        ValueError: a malformed value (``parse_cache_setting``); both flags given ("Error: Incompatible
            flags --response-cache-byte-size and --cache-config both provided. Please provide one or
            the other."); settings for several caches ("found multiple cache configurations, but only
            a single cache is currently supported"); a cache other than ``local`` ("unable to find
            'libtritoncache_<name>.so' for cache. Searched: <directory>"); a ``local`` cache without
            ``size`` ("Failed to initialize LocalCache: config didn't contain a valid 'size' field.")
            or whose size does not start with a whole number of bytes > 0 ("Failed to initialize LocalCache:
            stoull", as ``std::stoull`` fails; a negative size, which Triton wraps and fails to allocate): Triton's
            texts.
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
