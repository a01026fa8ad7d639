"""``--cache-config`` values split and checked as Triton's ``ParseCacheConfigOption`` and its local cache's
``Create`` do (kserve_v2.settings.cache_config)."""

from __future__ import annotations

import pytest

from kserve_v2.settings.cache_config import CacheConfig, parse_cache_config, parse_cache_setting


def test_a_setting_splits_at_the_first_comma_and_the_next_equals() -> None:
    assert parse_cache_setting("local,size=1048576") == ("local", "size", "1048576")
    assert parse_cache_setting("redis,host=a=b") == ("redis", "host", "a=b")


@pytest.mark.parametrize("text", ["size=1", ",size=1"])
def test_no_cache_name(text: str) -> None:
    with pytest.raises(ValueError, match="^No cache specified"):
        parse_cache_setting(text)


@pytest.mark.parametrize("text", ["local,size", "local,=1", "local,size="])
def test_no_setting_or_value(text: str) -> None:
    with pytest.raises(ValueError, match=r"^--cache-config option format is '<cache name>,<setting>=<value>'. Got "):
        parse_cache_setting(text)


def test_the_local_cache_and_its_size() -> None:
    assert parse_cache_config([]) is None
    assert parse_cache_config(["local,size=1024"]) == CacheConfig("local", 1024, (("size", "1024"),))
    assert parse_cache_config(["local,size=10", "local,size=20"]) == CacheConfig(
        "local", 20, (("size", "10"), ("size", "20")))  # the last value of a key
    assert parse_cache_config(["local,size= 64kb"]) == CacheConfig("local", 64, (("size", " 64kb"),))  # std::stoull
    assert parse_cache_config([], byte_size=4096) == CacheConfig("local", 4096, (("size", "4096"),))


@pytest.mark.parametrize(("values", "text"), [
    (["local,other=1"], "config didn't contain a valid 'size' field"),
    (["local,size=abc"], "Failed to initialize LocalCache: stoull"),
    (["local,size=0"], "size must be > 0"),
    (["local,size=-5"], "Failed to initialize LocalCache"),
    (["memcached,size=1"], "unable to find 'libtritoncache_memcached.so' for cache. Searched: /opt/tritonserver/caches"),
    (["local,size=1", "redis,host=h"], "found multiple cache configurations"),
])
def test_refused(values: list[str], text: str) -> None:
    with pytest.raises(ValueError, match=text.replace("(", r"\(").replace(".", r"\.")):
        parse_cache_config(values)
