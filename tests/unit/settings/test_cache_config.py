"""``--cache-config`` values split and checked as Triton's ``ParseCacheConfigOption`` and its local cache's
``Create`` do (kserve_v2.settings.cache_config)."""

from __future__ import annotations

import pytest

from kserve_v2.settings.cache_config import CacheConfig, RedisSettings, parse_cache_config, parse_cache_setting


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


def test_the_redis_cache_and_its_settings() -> None:
    config = parse_cache_config(["redis,host=cache.local", "redis,port=6380", "redis,db=2", "redis,pool_size=4",
                                 "redis,socket_timeout=250", "redis,connect_timeout=100", "redis,wait_timeout=50",
                                 "redis,user=u", "redis,password=p"], environ={})
    assert config is not None and config.name == "redis" and config.size == 0
    assert config.redis == RedisSettings("cache.local", 6380, "u", "p", 2, 100, 250, 4, 50)
    tls = parse_cache_config(["redis,host=h", "redis,port=1", "redis,tls_enabled=true", "redis,cacert=/ca.pem",
                              "redis,cert=/c.pem", "redis,key=/k.pem", "redis,sni=h"], environ={})
    assert tls is not None and tls.redis is not None
    assert (tls.redis.tls, tls.redis.cacert, tls.redis.cert, tls.redis.key) == (True, "/ca.pem", "/c.pem", "/k.pem")


def test_redis_credentials_from_the_environment_unless_the_flags_give_them() -> None:
    environ = {"TRITONCACHE_REDIS_USERNAME": "env-user", "TRITONCACHE_REDIS_PASSWORD": "env-secret"}
    config = parse_cache_config(["redis,host=h", "redis,port=1"], environ=environ)
    assert config is not None and config.redis is not None
    assert (config.redis.user, config.redis.password) == ("env-user", "env-secret")
    config = parse_cache_config(["redis,host=h", "redis,port=1", "redis,password=flag"], environ=environ)
    assert config is not None and config.redis is not None and config.redis.password == "flag"


@pytest.mark.parametrize(("values", "text"), [
    (["redis,host=h"], "Failed to initialize RedisCache, didn't specify address. Must at a minimum specify 'host' and "
                       "'port'"),
    (["redis,port=1"], "didn't specify address"),
    (["redis,host=h", "redis,port=1", "redis,ttl=5"], "redis setting 'ttl' is not supported (supported: host, port"),
    (["redis,host=h", "redis,port=x"], "redis setting 'port' must be a whole number >= 0, got 'x'"),
    (["redis,host=h", "redis,port=70000"], "redis setting 'port' must be 1-65535"),
    (["redis,host=h", "redis,port=1", "redis,pool_size=0"], "'pool_size' must be at least 1"),
    (["redis,host=h", "redis,port=1", "redis,tls_enabled=yes"], "'tls_enabled' must be true or false, got 'yes'"),
    (["redis,host=h", "redis,port=1", "redis,cacert=/ca.pem"], "redis setting 'cacert' needs tls_enabled=true"),
    (["redis,host=h", "redis,port=1", "redis,tls_enabled=true", "redis,sni=other"], "'sni' must name the host"),
])
def test_redis_refused(values: list[str], text: str) -> None:
    with pytest.raises(ValueError, match=text.replace("(", r"\(").replace(".", r"\.").replace(")", r"\)")):
        parse_cache_config(values, environ={})
