"""Request parsing that never raises: bytes that are not valid protobuf become an ``Unparsable`` marker.

grpc.aio reports a deserializer's exception as UNKNOWN with the Python exception's class in the
message. ``tolerant`` wraps a handler's deserializer (``kserve_v2.grpc.registration`` does it for
every handler, at registration): bytes that do not parse become an ``Unparsable`` marker, which the
wrapped behaviour ends with INVALID_ARGUMENT (gRPC status codes, ``doc/statuscodes.md``: "the
client specified an invalid argument"). The parse also records the message's size for the handler
(``RECEIVED_BYTES``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError


# Bytes of the last request message this RPC's task parsed. grpc.aio parses a unary request in the task
# that then runs its handler, so ModelInfer reads its own message's size here: upb's ByteSize would
# serialize the message again to measure it (10-27 ms and a full copy for 16 MiB).
RECEIVED_BYTES: ContextVar[int | None] = ContextVar("received_bytes", default=None)


@dataclass(frozen=True, slots=True)
class Unparsable:
    """A request message that did not parse; ``message`` is the client-visible text."""

    message: str


def tolerant(deserialize: Callable[[bytes], Any], what: str) -> Callable[[bytes], Any]:
    """``deserialize`` returning ``Unparsable`` for bytes that are not a valid ``what``, and
    setting ``RECEIVED_BYTES`` to the bytes' length."""
    def parse(data: bytes) -> Any:
        RECEIVED_BYTES.set(len(data))
        try:
            return deserialize(data)
        except DecodeError:
            return Unparsable(f"the request is not a valid protobuf {what} message")
    return parse
