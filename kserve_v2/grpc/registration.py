"""Handler registration: every RPC's failures become a status in one place, and bytes that are not
valid protobuf are refused, so the servicer's methods are plain delegations to the service.

The generated ``add_*_to_server`` functions register their handlers on a ``CheckedRegistration``
standing in for the server; each handler is wrapped once, at registration (no per-call cost beyond
a ``try``):

- its deserializer never raises (``parsing.tolerant``): bytes that do not parse end the call with
  INVALID_ARGUMENT (gRPC status codes, ``doc/statuscodes.md``: "the client specified an invalid
  argument") instead of grpc.aio's UNKNOWN naming a Python exception;
- a unary behaviour's exception ends the call with the status of the one table
  (``status.abort``: a ``ServerError``'s code and message, anything else INTERNAL, logged).

A stream reports a failed request in-stream (``ModelStreamInfer``), so only a stream's parsing is wrapped.

Methods named raw at registration (``as_raw``: ModelInfer and ModelStreamInfer, which read tensor data
where it arrived through the wire codec) are registered with neither deserializer nor serializer:
their behaviours take and give bytes. A raw unary behaviour's exception becomes the call's status as
above, and so does one that ends a raw stream (bytes in it that are not a valid message).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from typing import TYPE_CHECKING, Any, cast

import grpc

from kserve_v2.grpc.parsing import Unparsable, tolerant
from kserve_v2.grpc.status import abort

if TYPE_CHECKING:  # grpc's classes are generic in their stubs only
    Handler = grpc.RpcMethodHandler[Any, Any]
    Context = grpc.aio.ServicerContext[Any, Any]
    # The behaviours grpc.aio registers are coroutine functions (grpc's stubs type the synchronous API's).
    StreamBehaviour = Callable[[AsyncIterator[Any], Context], AsyncIterator[Any]]
    UnaryBehaviour = Callable[[Any, Context], Awaitable[Any]]


def checked(handler: Handler, method: str) -> Handler:
    """``handler`` with a deserializer that never raises, a behaviour that refuses what did not
    parse and, for unary calls, a behaviour whose exceptions become the call's status."""
    if handler.request_deserializer is None:
        return handler
    deserializer = tolerant(handler.request_deserializer, method)
    if handler.request_streaming and handler.response_streaming:
        stream = cast("StreamBehaviour", handler.stream_stream)

        async def stream_stream(requests: AsyncIterator[Any], context: Context) -> AsyncIterator[Any]:
            async def parsed() -> AsyncIterator[Any]:
                async for request in requests:
                    if isinstance(request, Unparsable):
                        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
                    yield request
            async for response in stream(parsed(), context):
                yield response

        return grpc.stream_stream_rpc_method_handler(stream_stream, deserializer, handler.response_serializer)
    if not handler.request_streaming and not handler.response_streaming:
        unary = _mapped(cast("UnaryBehaviour", handler.unary_unary))

        async def unary_unary(request: Any, context: Context) -> Any:
            if isinstance(request, Unparsable):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
            return await unary(request, context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, deserializer, handler.response_serializer)
    return handler


def as_raw(handler: Handler) -> Handler:
    """``handler``'s behaviour registered to take and give bytes (no deserializer, no serializer),
    with the exception that ends its call, unary or stream, becoming the call's status.

    Raises:
        ValueError: a client- or server-streaming method (only unary and bidirectional ones are raw).
    """
    if handler.request_streaming and handler.response_streaming:
        stream = cast("StreamBehaviour", handler.stream_stream)

        async def stream_stream(requests: AsyncIterator[Any], context: Context) -> AsyncIterator[Any]:
            try:
                async for response in stream(requests, context):
                    yield response
            except Exception as err:  # noqa: BLE001 - what ends the stream becomes its status
                await abort(context, err)

        return grpc.stream_stream_rpc_method_handler(stream_stream)
    if not handler.request_streaming and not handler.response_streaming:
        return grpc.unary_unary_rpc_method_handler(_mapped(cast("UnaryBehaviour", handler.unary_unary)))
    raise ValueError("only unary and bidirectional methods are registered raw")


def _mapped(unary: UnaryBehaviour) -> UnaryBehaviour:
    """``unary`` with its exceptions ending the call with the status of the one table."""
    async def mapped(request: Any, context: Context) -> Any:
        try:
            return await unary(request, context)
        except Exception as err:  # noqa: BLE001 - every failure becomes a status
            await abort(context, err)
    return mapped


class CheckedRegistration:
    """Stands in for the server while generated ``add_*_to_server`` functions register handlers,
    wrapping each with ``checked``; ``raw``: the methods (``/<service>/<method>``) registered to take
    and give bytes instead (``as_raw``)."""

    def __init__(self, server: grpc.aio.Server, raw: Collection[str] = ()) -> None:
        self._server = server
        self._raw = raw

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Handler]) -> None:
        """Register ``service``'s handlers on the server, each wrapped with ``checked`` (or raw)."""
        self._server.add_registered_method_handlers(service, {
            name: as_raw(handler) if f"/{service}/{name}" in self._raw else checked(handler, f"{service}.{name} request")
            for name, handler in handlers.items()})

    def add_generic_rpc_handlers(self, handlers: tuple[grpc.GenericRpcHandler, ...]) -> None:
        """Register generic handlers whose answers are wrapped with ``checked`` (or raw)."""
        self._server.add_generic_rpc_handlers(tuple(_CheckedGeneric(h, self._raw) for h in handlers))


class _CheckedGeneric(grpc.GenericRpcHandler):
    """grpc.aio asks a generic handler for every call (it has no registered methods): the wrapped
    handler is built once per method and handler the inner one gives."""

    def __init__(self, inner: grpc.GenericRpcHandler, raw: Collection[str]) -> None:
        self._inner = inner
        self._raw = raw
        self._wrapped: dict[str, tuple[Handler, Handler]] = {}  # method -> (inner handler, wrapped)

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Handler | None:
        """The inner handler for the call, wrapped with ``checked`` (None when it has none)."""
        handler = self._inner.service(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        known = self._wrapped.get(method)
        if known is not None and known[0] is handler:
            return known[1]
        wrapped = as_raw(handler) if method in self._raw else checked(handler, f"{method.strip('/').replace('/', '.')} request")
        self._wrapped[method] = (handler, wrapped)
        return wrapped
