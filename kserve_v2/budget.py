"""Request memory: what one request may cost once decoded, and what all requests in flight may hold.

The cost of a request is estimated from its declared shapes and sizes before anything is decoded:
its size as it arrived, typed contents once more as arrays, shared memory ranges (copied out), plus, for BYTES inputs, ``BYTES_ELEMENT_BYTES`` per element for the Python objects
and the runtime's string copies that each element becomes. A request over the per-request limit
(``--max-request-decoded-bytes``) is refused; a request that would take the server's in-flight
total over ``--request-memory-pool-bytes`` is refused too (not queued: the bytes it arrived with
are freed at once, and the client retries; ``Retry-After`` over HTTP). Both are
RESOURCE_EXHAUSTED / 413 (gRPC status codes: "some resource has been exhausted"). Requests under
64 KiB on the wire are not counted (see ``request_cost``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2.datatypes import BY_V2, BYTES
from kserve_v2.errors import TooLarge

# Peak RSS per element measured with benchmarks/storm.py (2,000,000 zero-length elements through a
# string identity model: ~150 bytes): the object array slots of the decoded input and its text,
# ONNX Runtime's std::string per element in and out, and the output's Python strings.
BYTES_ELEMENT_BYTES = 160
SMALL_BYTES = 1 << 16
_SHM_SIZE = "shared_memory_byte_size"


class MemoryBusy(TooLarge):
    """The server's in-flight request memory is in use (RESOURCE_EXHAUSTED / 413 with Retry-After)."""


def request_cost(request: pb.ModelInferRequest, uses_shared_memory: bool,
                 raw: Sequence[bytes | memoryview] | None = None) -> tuple[int, int]:
    """(estimated decoded bytes, BYTES elements) of a request, from its declared shapes and sizes.

    The wire part is the message's serialized size (``ByteSize``: lengths only; reading a raw
    entry would copy it) plus ``raw``, the raw entries kept beside the message (REST), if any.
    A request under ``SMALL_BYTES`` that reads no shared memory costs
    nothing here (its decoded size is bounded by ~41x its wire size, and walking its tensors
    would cost more than decoding them); ``uses_shared_memory``: client shared memory is on.
    """
    total = request.ByteSize()
    if raw:
        total += sum(map(len, raw))
    if total < SMALL_BYTES and not uses_shared_memory:
        return 0, 0
    elements = 0
    for tensor in request.inputs:
        count = 1
        for dim in tensor.shape:
            count *= max(dim, 0)
        dtype = BY_V2.get(tensor.datatype)
        if dtype is BYTES:
            elements += count
            total += count * BYTES_ELEMENT_BYTES
        elif dtype is not None and tensor.HasField("contents"):
            total += count * dtype.itemsize
        parameter = tensor.parameters.get(_SHM_SIZE)
        if parameter is not None and parameter.WhichOneof("parameter_choice") in ("int64_param", "uint64_param"):
            total += max(getattr(parameter, parameter.WhichOneof("parameter_choice")), 0)
    return total, elements


class MemoryBudget:
    """The per-request limit and the in-flight pool (event loop only).

    Args:
        max_request_bytes: the most one request may cost.
        pool_bytes: the most all requests in flight may cost together.
    """

    def __init__(self, max_request_bytes: int, pool_bytes: int) -> None:
        self.max_request_bytes = max_request_bytes
        self.pool_bytes = pool_bytes
        self.in_use = 0

    @contextmanager
    def reserve(self, cost: int, model: str) -> Iterator[None]:
        """Hold ``cost`` bytes of the pool while the request runs.

        Raises:
            TooLarge: over the per-request limit -> RESOURCE_EXHAUSTED / 413.
            MemoryBusy: the pool cannot hold it now -> RESOURCE_EXHAUSTED / 413 + Retry-After.
        """
        if cost > self.max_request_bytes:
            raise TooLarge(f"the request for model '{model}' would take {cost} bytes once decoded, over the "
                           f"{self.max_request_bytes}-byte limit (--max-request-decoded-bytes)")
        if self.in_use + cost > self.pool_bytes:
            raise MemoryBusy(f"the server's request memory ({self.pool_bytes} bytes, --request-memory-pool-bytes) "
                             "is in use by requests in flight: retry later")
        self.in_use += cost
        try:
            yield
        finally:
            self.in_use -= cost
