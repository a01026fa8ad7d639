"""Request parsing that never raises: bytes that are not valid protobuf become an ``Unparsable`` marker.

grpc.aio reports a deserializer's exception as UNKNOWN with the Python exception's class in the
message. ``tolerant`` wraps a handler's deserializer (``kserve_v2.grpc.registration`` does it for
every handler, at registration): bytes that do not parse become an ``Unparsable`` marker, which the
wrapped behaviour ends with INVALID_ARGUMENT (gRPC status codes, ``doc/statuscodes.md``: "the
client specified an invalid argument"). Methods registered raw (ModelInfer, ModelStreamInfer) have
no deserializer: their behaviours decode the bytes themselves and refuse them with the same text
(``unparsable``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError


@dataclass(frozen=True, slots=True)
class Unparsable:
    """A request message that did not parse; ``message`` is the client-visible text."""

    message: str


def unparsable(what: str) -> str:
    """The client's text for bytes that are not a valid ``what`` message (``"<service>.<method> request"``)."""
    return f"the request is not a valid protobuf {what} message"


def tolerant(deserialize: Callable[[bytes], Any], what: str) -> Callable[[bytes], Any]:
    """``deserialize`` returning ``Unparsable`` for bytes that are not a valid ``what``."""
    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except DecodeError:
            return Unparsable(unparsable(what))
    return parse
