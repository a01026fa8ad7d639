"""Triton's response cache (``docs/user_guide/response_cache.md``) with its ``local`` implementation
(github.com/triton-inference-server/local_cache): the outputs of earlier requests, found again by a
hash of the request, so that a repeated request is answered without its model.

One cache serves every model whose configuration has ``response_cache { enable: true }`` when the
server runs with ``--cache-config local,size=<bytes>`` (``kserve_v2.settings.cache_config``); with
``--workers N`` each replica has its own. ``CountedCache`` is what every cache shares (the key,
the counts and the metrics); ``kserve_v2.service.redis_cache`` is the other cache, one that replicas
and servers share. ``InferenceService`` looks a request up after decoding it
and before scheduling it: a hit is encoded from the cached outputs for whatever transport asked (the
cache holds arrays, not a transport's bytes), a miss runs the model and stores its outputs.

The key is a SHA-1, under a secret of this process, of the model's name and version, each input
(sorted by name: name, datatype, shape and bytes, as the model receives it), the requested outputs
and the request's own parameters (less those Triton's front ends take for scheduling: ``priority``,
``timeout``, ``sequence_*``, ``binary_data_output``). Triton's hash (``cache_manager.cc`` ``TritonCache::Hash``) covers
the name, version and inputs' names and bytes only; the rest is added here so that two requests that
would get different answers never share an entry. Entries are evicted least recently used first, by
bytes (an output's bytes plus its name, datatype and shape, as Triton serializes a response); an
entry larger than the whole cache is not stored (Triton's "Requested byte_size: <n> is greater than
total cache size: <size>", logged).

Metrics, as Triton reports them (``docs/user_guide/metrics.md``, "Response Cache Metrics", and the
local cache's own): per model and version ``nv_cache_num_hits_per_model``,
``nv_cache_num_misses_per_model``, ``nv_cache_hit_duration_per_model`` and
``nv_cache_miss_duration_per_model`` (microseconds); for the cache ``nv_cache_num_entries``,
``nv_cache_num_lookups``, ``nv_cache_num_hits``, ``nv_cache_num_misses``, ``nv_cache_num_evictions``,
``nv_cache_lookup_duration``, ``nv_cache_insertion_duration`` (microseconds) and ``nv_cache_util``
(0 to 1). Updated on the event loop only: no lock.
"""

from __future__ import annotations

import hashlib
from abc import abstractmethod
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from prometheus_client.core import GaugeMetricFamily, Metric, UnknownMetricFamily
from prometheus_client.registry import Collector

from kserve_v2.backend import Parameter
from kserve_v2.protocol.reserved import BINARY_DATA_OUTPUT, SCHEDULING_PARAMETERS
from kserve_v2.request.decode import DecodedRequest

log = logging.getLogger(__name__)

_LABELS = ["model", "version"]
# Triton's per-model families (counters without a _total suffix: untyped, as kserve_v2.observability.metrics has them)
_PER_MODEL = (
    ("nv_cache_num_hits_per_model", "Number of cache hits per model"),
    ("nv_cache_num_misses_per_model", "Number of cache misses per model"),
    ("nv_cache_hit_duration_per_model", "Total cache hit duration per model, in microseconds"),
    ("nv_cache_miss_duration_per_model", "Total cache miss (insert+lookup) duration per model, in microseconds"),
)
# not in the key: the parameters Triton's front ends turn into the request's scheduling fields (never the model's),
# and binary_data_output (how the outputs are encoded: the cache holds arrays)
_SCHEDULING = SCHEDULING_PARAMETERS | {BINARY_DATA_OUTPUT}
_ENTRY_BYTES = 4  # a serialized response starts with its number of outputs (uint32)
_OUTPUT_BYTES = 8 + 8 + 4 + 4 + 8  # per output: its size, the name's, datatype's and shape's lengths, the bytes'


@dataclass(slots=True)
class CachedResponse:
    """What a hit answers with: the model's outputs, in the requested order, and the response's parameters.

    Attributes:
        outputs: one read-only array per requested output (this cache's own copies).
        parameters: the response's parameters (an ensemble's, a model's), or None.
        nbytes: the bytes the entry counts against the cache's size.
    """

    outputs: list[np.ndarray]
    parameters: dict[str, Parameter] | None
    nbytes: int


@dataclass(slots=True)
class Lookup:
    """One request's lookup: its key, the response found (None: a miss), and its times (ns).

    Attributes:
        key: the request's hash.
        found: the cached response, or None.
        hash_ns: time spent hashing the request (Triton counts it as queue time).
        lookup_ns: time spent looking the key up.
        names: the requested outputs' names (they count in an entry's bytes).
    """

    key: bytes
    found: CachedResponse | None
    hash_ns: int
    lookup_ns: int
    names: tuple[str, ...] = ()


@dataclass(slots=True)
class _ModelCounts:
    hits: int = 0
    misses: int = 0
    hit_ns: int = 0
    miss_ns: int = 0


class Digest(Protocol):
    """What ``hash_request`` feeds: a ``hashlib`` hash object."""

    def update(self, data: bytes | memoryview, /) -> None:
        """Add ``data`` to the hash."""


def hash_request(digest: Digest, model: str, version: int, decoded: DecodedRequest) -> None:
    """Feed ``digest`` (a ``hashlib`` object) what a cache key covers of a decoded request (see the
    module's docstring)."""
    update = digest.update
    update(f"{len(model)}:{model}:{version}".encode())
    feeds = decoded.feeds
    for name in sorted(feeds):
        array = feeds[name]
        update(f"|{len(name)}:{name}:{array.dtype.str}:{array.shape}".encode())
        if array.dtype.hasobject:  # BYTES: each element's length and bytes
            for item in array.flat:
                data = item if isinstance(item, bytes) else str(item).encode()
                update(len(data).to_bytes(8, "little"))
                update(data)
        else:
            update(np.ascontiguousarray(array).data)
    update(repr(tuple(decoded.output_names)).encode())
    update(repr(sorted(item for item in decoded.parameters.items() if item[0] not in _SCHEDULING)).encode())


class CountedCache(Collector):
    """What every response cache shares: the lookups, hits, misses and their times, overall and per
    model, and their metric families. A cache implements ``_find`` and ``_store``; ``lookup``, ``insert``
    and ``record_hit`` are what ``InferenceService`` calls, on the event loop."""

    def __init__(self) -> None:
        self._models: dict[tuple[str, str], _ModelCounts] = {}
        self.lookups = self.hits = self.misses = 0
        self.lookup_ns = self.insertion_ns = 0

    def __hash__(self) -> int:  # a registry keeps its collectors in a set
        return id(self)

    @abstractmethod
    def key(self, model: str, version: int, decoded: DecodedRequest) -> bytes:
        """The hash of a decoded request (``hash_request``)."""

    @abstractmethod
    async def _find(self, key: bytes) -> CachedResponse | None:
        """The entry stored under ``key``, or None."""

    @abstractmethod
    async def _store(self, key: bytes, names: tuple[str, ...], outputs: list[np.ndarray],
                     parameters: Mapping[str, Parameter] | None) -> bool:
        """Store an entry under ``key``; False when one is stored there already (Triton's ALREADY_EXISTS)."""

    async def lookup(self, model: str, version: int, label: str, decoded: DecodedRequest) -> Lookup:
        """Hash a request and look it up; a hit is counted here (Triton counts it on lookup), a miss
        when its response is inserted (``insert``)."""
        started = time.perf_counter_ns()
        key = self.key(model, version, decoded)
        hashed = time.perf_counter_ns()
        found = await self._find(key)
        self.lookups += 1
        if found is not None:
            self.hits += 1
        else:
            self.misses += 1
        ended = time.perf_counter_ns()
        self.lookup_ns += ended - hashed
        self._counts(model, label)  # the model's series exist from its first lookup
        return Lookup(key, found, hashed - started, ended - hashed, tuple(decoded.output_names))

    def record_hit(self, model: str, label: str, hit_ns: int) -> None:
        """Count a hit of ``model`` answered in ``hit_ns`` (lookup and the response's building)."""
        counts = self._counts(model, label)
        counts.hits += 1
        counts.hit_ns += hit_ns

    async def insert(self, lookup: Lookup, model: str, label: str, outputs: list[np.ndarray],
                     parameters: Mapping[str, Parameter] | None) -> int | None:
        """Store a missed request's outputs.

        Returns:
            The miss's duration (lookup and insertion, ns) as Triton counts it, or None when another
            request stored the same key meanwhile (Triton's ALREADY_EXISTS: not counted as a miss).
            An entry the cache could not store (too large, the store unreachable) counts as a miss
            (logged, as Triton logs the failed insertion).
        """
        started = time.perf_counter_ns()
        if not await self._store(lookup.key, lookup.names, outputs, parameters):
            return None
        ended = time.perf_counter_ns()
        self.insertion_ns += ended - started
        miss_ns = lookup.lookup_ns + ended - started
        counts = self._counts(model, label)
        counts.misses += 1
        counts.miss_ns += miss_ns
        return miss_ns

    async def close(self) -> None:
        """Release what the cache holds outside this process (nothing, unless it says otherwise)."""

    def _counts(self, model: str, label: str) -> _ModelCounts:
        counts = self._models.get((model, label))
        if counts is None:
            counts = self._models[(model, label)] = _ModelCounts()
        return counts

    def _gauges(self) -> tuple[tuple[str, str, float], ...]:
        """The cache's own gauges besides the counts (name, help, value)."""
        return ()

    def collect(self) -> Iterator[Metric]:
        """The cache's metric families (called by the registry at each scrape)."""
        for index, (name, text) in enumerate(_PER_MODEL):
            family = UnknownMetricFamily(name, text, labels=_LABELS)
            for (model, label), counts in self._models.items():
                value = (counts.hits, counts.misses, counts.hit_ns // 1000, counts.miss_ns // 1000)[index]
                family.add_metric([model, label], value)
            yield family
        gauges: tuple[tuple[str, str, float], ...] = (
            ("nv_cache_num_lookups", "Number of cache lookups in response cache", self.lookups),
            ("nv_cache_num_hits", "Number of cache hits in response cache", self.hits),
            ("nv_cache_num_misses", "Number of cache misses in response cache", self.misses),
            ("nv_cache_lookup_duration", "Total cache lookup duration (hit and miss), in microseconds",
             self.lookup_ns // 1000),
            ("nv_cache_insertion_duration", "Total cache insertion duration, in microseconds", self.insertion_ns // 1000),
            *self._gauges(),
        )
        for name, text, gauge in gauges:
            yield GaugeMetricFamily(name, text, value=gauge)


class ResponseCache(CountedCache):
    """Triton's ``local`` response cache: at most ``size`` bytes of responses, least recently used out first.

    Args:
        size: the cache's size in bytes (``--cache-config local,size=<bytes>``).
    """

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size
        self._entries: OrderedDict[bytes, CachedResponse] = OrderedDict()
        self._used = 0
        self._secret = os.urandom(16)
        self.evictions = 0
        log.info("Response Cache is created with size %d", size)  # Triton's local cache logs its size

    @property
    def used(self) -> int:
        """The bytes the entries take now."""
        return self._used

    def __len__(self) -> int:
        return len(self._entries)

    def key(self, model: str, version: int, decoded: DecodedRequest) -> bytes:
        """See ``CountedCache.key``: a SHA-1 under this process's secret."""
        digest = hashlib.sha1(self._secret, usedforsecurity=False)
        hash_request(digest, model, version, decoded)
        return digest.digest()

    async def _find(self, key: bytes) -> CachedResponse | None:
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
        return found

    async def _store(self, key: bytes, names: tuple[str, ...], outputs: list[np.ndarray],
                     parameters: Mapping[str, Parameter] | None) -> bool:
        """Copies of the outputs, evicting the least recently used entries to make room."""
        if key in self._entries:
            return False
        nbytes = _ENTRY_BYTES + sum(len(name.encode()) for name in names) + sum(
            _OUTPUT_BYTES + len(str(a.dtype)) + 8 * a.ndim + _data_bytes(a) for a in outputs)
        if nbytes > self.size:
            log.error("Failed to insert key [%s] into response cache: Requested byte_size: %d is greater than total "
                      "cache size: %d", key.hex(), nbytes, self.size)
            return True
        while self._used + nbytes > self.size:
            _, evicted = self._entries.popitem(last=False)
            self._used -= evicted.nbytes
            self.evictions += 1
        copies = []
        for array in outputs:
            copy = np.array(array, copy=True)
            copy.flags.writeable = False
            copies.append(copy)
        self._entries[key] = CachedResponse(copies, dict(parameters) if parameters else None, nbytes)
        self._used += nbytes
        return True

    def _gauges(self) -> tuple[tuple[str, str, float], ...]:
        return (("nv_cache_num_entries", "Number of responses stored in response cache", len(self._entries)),
                ("nv_cache_num_evictions", "Number of cache evictions in response cache", self.evictions),
                ("nv_cache_util", "Cache utilization [0.0 - 1.0]", self._used / self.size))


def _data_bytes(array: np.ndarray) -> int:
    """An output's bytes as Triton serializes them (BYTES: a 4-byte length before each element)."""
    if not array.dtype.hasobject:
        return int(array.nbytes)
    return sum(4 + len(item if isinstance(item, bytes) else str(item).encode()) for item in array.flat)
