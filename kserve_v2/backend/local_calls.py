"""Requests a model sends to other models while it executes (Triton's business logic scripting,
"BLS", in its python backend's documentation), through the server's one inference call.

Model code runs on an instance thread; ``LocalCalls`` runs the call it makes as a coroutine on the
server's event loop (``InferenceService.model_infer_reported``, or ``model_stream`` for a decoupled
model), with the wire codec's request and response objects as every transport's requests, so
statistics, batching, ensembles and cancellation see it as any request. The models waiting for a
call travel with it as its callers (``CALLERS``, read by the service into the request's
``RequestContext.callers``), and ``check_callers`` refuses a call that nests too deep, or that
would wait for an instance its own callers hold (a cycle that can never finish).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend.decoupled import Streamed
from kserve_v2.codec.messages import InferRequest, InferResponse
from kserve_v2.protocol.errors import InvalidInput, Unavailable
from kserve_v2.protocol.statistics import RequestReport

# The models whose executions wait for the request being made in this context, outermost first.
CALLERS: ContextVar[tuple[str, ...]] = ContextVar("kserve_v2_callers", default=())
# The most callers one request may have: deeper nesting is refused (a runaway recursion).
MAX_CALL_DEPTH = 16
NOT_SERVING = "the server is not serving requests: business logic scripting calls need its event loop"

Infer = Callable[[InferRequest], Awaitable[tuple[InferResponse, RequestReport]]]
Stream = Callable[[InferRequest], AsyncIterator[Streamed]]


class LocalCalls:
    """The server's inference calls as model code makes them from an instance thread.

    Args:
        infer: the one inference call (``InferenceService.model_infer_reported``).
        stream: the call that yields every response of a request (``InferenceService.model_stream``).

    Attributes:
        loop: the event loop the calls run on (set by the service when it serves its first request).
    """

    def __init__(self, infer: Infer, stream: Stream) -> None:
        self._infer = infer
        self._stream = stream
        self.loop: asyncio.AbstractEventLoop | None = None

    def infer(self, request: InferRequest, callers: tuple[str, ...]) -> concurrent.futures.Future[InferResponse]:
        """Send ``request`` on behalf of ``callers`` (any thread but the loop's); its future response.

        Raises:
            Unavailable: no loop serves requests yet.
        """
        async def call() -> InferResponse:
            CALLERS.set(callers)
            response, _ = await self._infer(request)
            return response

        return asyncio.run_coroutine_threadsafe(call(), self._serving())

    def stream(self, request: InferRequest, callers: tuple[str, ...],
               deliver: Callable[[Streamed], None]) -> concurrent.futures.Future[None]:
        """Send ``request`` on behalf of ``callers`` and hand each of its responses to ``deliver``
        (called on the loop), the last one final; a failure before any response is delivered as a
        final error. Any thread but the loop's.

        Raises:
            Unavailable: no loop serves requests yet.
        """
        async def call() -> None:
            CALLERS.set(callers)
            final = False
            try:
                async for item in self._stream(request):
                    final = item.final
                    deliver(item)
            except Exception as err:  # noqa: BLE001 - the caller reads it as an error response
                if not final:
                    deliver(Streamed(None, err, True))
                    final = True
            if not final:
                deliver(Streamed(None, None, True))

        return asyncio.run_coroutine_threadsafe(call(), self._serving())

    def _serving(self) -> asyncio.AbstractEventLoop:
        loop = self.loop
        if loop is None or loop.is_closed():
            raise Unavailable(NOT_SERVING)
        return loop


def check_callers(callers: tuple[str, ...], model: str, config: mc.ModelConfig) -> None:
    """Refuse a request of ``callers`` to ``model`` (its configuration ``config``) that nests too deep
    or cannot finish.

    Raises:
        InvalidInput: more than ``MAX_CALL_DEPTH`` callers; or callers that already hold every
            instance of ``model`` (each waiting caller holds the instance it executes on), so the
            request would wait for an instance forever -> INVALID_ARGUMENT.
    """
    chain = " -> ".join((*callers, model))
    if len(callers) >= MAX_CALL_DEPTH:
        raise InvalidInput(f"business logic scripting calls nest deeper than {MAX_CALL_DEPTH} requests ({chain}): "
                           "the model calls itself without end")
    held = callers.count(model)
    if held and config.platform != "ensemble" and held >= (sum(g.count for g in config.instance_group) or 1):
        raise InvalidInput(f"model '{model}' is called by its own execution ({chain}) while its callers hold all "
                           f"{held} of its instances: the request would wait for itself forever")
