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

from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend.decoupled import Streamed
from kserve_v2.backend.instance_groups import instance_count
from kserve_v2.codec.messages import InferRequest, InferResponse
from kserve_v2.protocol.errors import Cancelled, InvalidInput, Unavailable
from kserve_v2.protocol.statistics import RequestReport

# The models whose executions wait for the request being made in this context, outermost first.
CALLERS: ContextVar[tuple[str, ...]] = ContextVar("kserve_v2_callers", default=())
# The most callers one request may have: deeper nesting is refused (a runaway recursion).
MAX_CALL_DEPTH = 16
CALL_CANCELLED = "the request was cancelled by the model that sent it"
NOT_SERVING = "the server is not serving requests: business logic scripting calls need its event loop"

Infer = Callable[[InferRequest], Awaitable[tuple[InferResponse, RequestReport]]]
Stream = Callable[[InferRequest], AsyncIterator[Streamed]]
Load = Callable[[pb.RepositoryModelLoadRequest], Awaitable[object]]
Unload = Callable[[pb.RepositoryModelUnloadRequest], Awaitable[object]]
Ready = Callable[[pb.ModelReadyRequest], pb.ModelReadyResponse]


async def _awaited(call: Awaitable[object]) -> object:
    return await call


class LocalCalls:
    """The server's inference calls, and its model control calls, as model code makes them from an
    instance thread.

    Args:
        infer: the one inference call (``InferenceService.model_infer_reported``).
        stream: the call that yields every response of a request (``InferenceService.model_stream``).
        load, unload: the model repository extension's load and unload (with ``--workers N``, on every
            replica), which refuse them outside explicit model control mode; None: refused.
        ready: the model readiness call (``InferenceService.model_ready``); None: refused.

    Attributes:
        loop: the event loop the calls run on (set by the service when it serves its first request,
            and by the app when it starts serving).

    The server's own (``InferenceService.calls``) reach model code with each request
    (``RequestContext.calls``) and, outside a request (the model loading API in ``initialize``),
    through the ``BackendHost`` its models are opened with (``kserve_v2.backend.host``).
    """

    def __init__(self, infer: Infer, stream: Stream, load: Load | None = None, unload: Unload | None = None,
                 ready: Ready | None = None) -> None:
        self._infer = infer
        self._stream = stream
        self._load, self._unload, self._ready = load, unload, ready
        self.loop: asyncio.AbstractEventLoop | None = None

    def load(self, request: pb.RepositoryModelLoadRequest) -> concurrent.futures.Future[object]:
        """Load (or reload) a model as the repository extension's load does; its future (any thread
        but the loop's).

        Raises:
            Unavailable: no loop serves requests yet; or the server has no model control here.
        """
        return self._control(None if self._load is None else self._load(request))

    def unload(self, request: pb.RepositoryModelUnloadRequest) -> concurrent.futures.Future[object]:
        """Unload a model as the repository extension's unload does; its future (any thread but the loop's).

        Raises:
            Unavailable: no loop serves requests yet; or the server has no model control here.
        """
        return self._control(None if self._unload is None else self._unload(request))

    def _control(self, call: Awaitable[object] | None) -> concurrent.futures.Future[object]:
        """``call`` (a load or unload) run on the loop; its future.

        Raises:
            Unavailable: ``call`` is None (the server has no model control here), or no loop serves yet.
        """
        if call is None:
            raise Unavailable("this server has no model control for model code")
        return asyncio.run_coroutine_threadsafe(_awaited(call), self._serving())

    def ready(self, request: pb.ModelReadyRequest) -> bool:
        """Whether a model (version) is ready, read on the loop (any thread but the loop's).

        Raises:
            Unavailable: no loop serves requests yet; or the server has no readiness call here.
        """
        ready = self._ready
        if ready is None:
            raise Unavailable("this server has no model readiness call for model code")

        async def call() -> bool:
            return ready(request).ready

        return asyncio.run_coroutine_threadsafe(call(), self._serving()).result()

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
        final error. Any thread but the loop's. Cancelling the returned future cancels the request
        (the callee's ``ResponseStream`` turns cancelled) and delivers a final CANCELLED error.

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
            except asyncio.CancelledError:  # the caller cancelled the call: the callee's request is cancelled
                if not final:
                    deliver(Streamed(None, Cancelled(CALL_CANCELLED), True))
                raise
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
    if held and config.platform != "ensemble" and held >= (instance_count(config.instance_group) or 1):
        raise InvalidInput(f"model '{model}' is called by its own execution ({chain}) while its callers hold all "
                           f"{held} of its instances: the request would wait for itself forever")
