"""Request memory: what one request may cost once decoded, and what all requests in flight may hold.

The cost of a request is an estimate of the memory it holds at its peak, made from its declared
shapes and sizes before anything is decoded (calibrated with ``benchmarks/memory.py``):

- a message received over gRPC ``MESSAGE_COPIES`` times: grpc.aio holds it three times while it
  receives it (its byte buffer, the bytearray it assembles the message in, the bytes it hands
  over); the tensor data then stays in those bytes (the wire codec's views), and the outputs, not
  known before the model runs and taken to be as large as the inputs (as an identity's are), are
  held by ONNX Runtime (whose CPU arena keeps their buffer for later requests), copied once into
  the response and once more by grpc to send it, while the request is still held; the raw entries
  of other requests (REST binary data, views of the body) ``RAW_COPIES`` times (the body, the
  outputs, their send);
- typed contents once more as arrays, and shared memory ranges (copied out);
- for BYTES inputs, ``BYTES_ELEMENT_BYTES`` per element (array slots, ONNX Runtime's 32-byte
  ``std::string`` in the input and output tensors), ``BYTES_OBJECT_BYTES`` per element that can
  hold text (its Python ``bytes``, the ``str`` ONNX Runtime takes, the output's ``str``), and
  ``BYTES_PAYLOAD_COPIES`` per byte of element text (those objects and strings hold it again).

A request over the per-request limit (``--max-request-decoded-bytes``) is refused; a request that
would take the server's in-flight total over ``--request-memory-pool-bytes`` is refused too (not
queued: the bytes it arrived with are freed at once, and the client retries). The first is
RESOURCE_EXHAUSTED / 413 (gRPC status codes: "some resource has been exhausted"): the same request
will never fit; the second is UNAVAILABLE / 503 with ``Retry-After``, as Triton answers a full
queue: the same request fits once others finish.
Requests under 64 KiB on the wire are not counted (see ``request_cost``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from kserve_v2.codec.messages import InferRequest
from kserve_v2.protocol.datatypes import BY_V2, BYTES
from kserve_v2.protocol.errors import Overloaded, TooLarge

# Peak RSS growth of a fresh server over one request to an identity model (benchmarks/memory.py): gRPC
# FP32 4.4-5.1x the message (3.1x with ONNX Runtime's arena off), REST binary FP32 2.0x the body; BYTES:
# 4,000,000 empty elements 89 bytes each, 1,000,000 x 16 bytes 357 bytes each (20 on the wire), 16,000 x
# 1 KiB 8.4x the wire.
MESSAGE_COPIES = 5
RAW_COPIES = 3
BYTES_ELEMENT_BYTES = 120
BYTES_OBJECT_BYTES = 100
BYTES_PAYLOAD_COPIES = 8
SMALL_BYTES = 1 << 16
_SHM_SIZE = "shared_memory_byte_size"


class MemoryBusy(Overloaded):
    """The server's in-flight request memory is in use (UNAVAILABLE / 503 with Retry-After, as a full
    queue; SIE's QUEUE_FULL)."""


def request_cost(request: InferRequest, uses_shared_memory: bool, wire_bytes: int | None = None) -> tuple[int, int]:
    """(estimated peak bytes, BYTES elements) of a request, from its declared shapes and sizes.

    The wire part is the message as the transport received it, ``wire_bytes`` (gRPC: the tensor
    data stays in that buffer), counted ``MESSAGE_COPIES`` times; without it (REST, whose binary
    data are views of the body, or JSON data turned into raw bytes) the raw entries, counted
    ``RAW_COPIES`` times. Counts never exceed what the data can hold (a BYTES element takes 4 bytes
    or more of the wire or of shared memory, a typed value a byte or more), so a shape that
    disagrees with its data fails its decoding with Triton's INVALID_ARGUMENT text instead of being
    refused for the memory it claims. The text of BYTES elements is bounded by the wire and shared
    memory sizes less their 4-byte prefixes. A request under ``SMALL_BYTES`` that reads no shared memory costs
    nothing here (its decoded size is bounded by ~41x its wire size, and walking its tensors would
    cost more than decoding them); ``uses_shared_memory``: client shared memory is on.
    """
    if wire_bytes is None:
        wire = sum(map(len, request.raw_input_contents))
        total = wire * RAW_COPIES
    else:
        wire = wire_bytes
        total = wire * MESSAGE_COPIES
    if wire < SMALL_BYTES and not uses_shared_memory:
        return 0, 0
    elements = shared = 0
    for tensor in request.inputs:
        count = 1
        for dim in tensor.shape:
            count *= max(dim, 0)
        dtype = BY_V2.get(tensor.datatype)
        if dtype is BYTES:
            elements += count
        elif dtype is not None and tensor.contents is not None:
            total += min(count, wire) * dtype.itemsize  # a typed value takes a byte or more of the message
        parameter = tensor.parameters.get(_SHM_SIZE)
        if parameter is not None and parameter.choice in ("int64_param", "uint64_param"):
            shared += max(int(parameter.value), 0)
    total += shared
    if elements:
        # a BYTES element takes 4 bytes or more of data: a shape beyond the data fails its decoding, with
        # Triton's text, instead of being refused for the memory it claims
        elements = min(elements, (wire + shared) // 4)
        text = max(wire + shared - 4 * elements, 0)
        total += elements * BYTES_ELEMENT_BYTES + min(elements, text) * BYTES_OBJECT_BYTES + text * BYTES_PAYLOAD_COPIES
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
            MemoryBusy: the pool cannot hold it now -> UNAVAILABLE / 503 + Retry-After.
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
