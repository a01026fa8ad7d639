"""The host of python model code that runs in the server's own process (``pb_utils.ModelHost``):
what ``pb_utils`` asks of the server is the server's own calls (``kserve_v2.backend.local_calls``:
inference, streams and the model repository) and its custom metrics (``BackendHost``). A stub
process's host asks the server, which answers with this host of the execution that asked
(``kserve_v2.runtime.python.process``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import time
from collections.abc import Iterator
from dataclasses import dataclass

from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2.backend.custom_metrics import CustomFamily, MetricError, MetricKind
from kserve_v2.backend.decoupled import Streamed
from kserve_v2.backend.host import BackendHost
from kserve_v2.backend.local_calls import LocalCalls
from kserve_v2.codec.messages import InferRequest, RequestedOutput, RequestHeader, parameter
from kserve_v2.protocol.errors import Unavailable
from kserve_v2.protocol.reserved import TIMEOUT_EXPIRED
from kserve_v2.runtime.python import pb_utils
from kserve_v2.runtime.python.pb_utils import BLS_OUTSIDE_EXECUTE, InferenceRequest, ResponseIterator
from kserve_v2.runtime.python.tensors import (InferenceResponse, TritonError, TritonModelException, add_input,
                                              response_of)


@dataclass(frozen=True, slots=True)
class InProcessHost(pb_utils.ModelHost):
    """What model code running now in the server's process may use.

    Attributes:
        model_dir: its model version's folder.
        calls: the server's calls for the request being executed (None outside ``execute``: no BLS).
        callers: the models its request's callers wait in (the BLS depth guard's input,
            ``kserve_v2.backend.local_calls``).
        owner: the loaded version (its custom metric families go when it unloads); None: none.
        host: the server that loaded it (its custom metrics and, outside a request, its calls).
    """

    model_dir: str
    calls: LocalCalls | None
    callers: tuple[str, ...]
    owner: object = None
    host: BackendHost | None = None

    def infer(self, request: InferenceRequest) -> InferenceResponse:
        """``pb_utils.ModelHost.infer``: the request through the server's one inference call."""
        future = self._sending().infer(as_message(request), self.callers)
        timeout = request.timeout()
        try:
            return response_of(future.result(timeout / 1e6 if timeout > 0 else None))
        except concurrent.futures.TimeoutError:
            future.cancel()  # the callee's request is cancelled
            return InferenceResponse(error=TritonError.of(Unavailable(TIMEOUT_EXPIRED)))
        except Exception as err:  # noqa: BLE001 - Triton answers a failed BLS request with an error response
            return InferenceResponse(error=TritonError.of(err))

    async def infer_async(self, request: InferenceRequest) -> InferenceResponse:
        """``infer`` awaited on the model's event loop (no worker thread waits for it)."""
        future = self._sending().infer(as_message(request), self.callers)
        timeout = request.timeout()
        try:
            return response_of(await asyncio.wait_for(asyncio.wrap_future(future),
                                                      timeout / 1e6 if timeout > 0 else None))
        except TimeoutError:
            future.cancel()
            return InferenceResponse(error=TritonError.of(Unavailable(TIMEOUT_EXPIRED)))
        except Exception as err:  # noqa: BLE001 - as infer
            return InferenceResponse(error=TritonError.of(err))

    def stream(self, request: InferenceRequest) -> ResponseIterator:
        """``pb_utils.ModelHost.stream``: the request through the server's stream call."""
        return _Responses(self._sending(), as_message(request), self.callers, request.timeout())

    def metric_family(self, name: str, description: str, kind: MetricKind) -> CustomFamily:
        """The family in the server's custom metrics, owned by the running version."""
        if self.owner is None or self.host is None:
            raise MetricError("Error when creating MetricFamily: a metric family can only be created in initialize, "
                              "execute or finalize")
        return self.host.custom_metrics.family(name, description, kind, self.owner)

    def load_model(self, request: pb.RepositoryModelLoadRequest) -> None:
        self._control().load(request).result()

    def unload_model(self, request: pb.RepositoryModelUnloadRequest) -> None:
        future = self._control().unload(request)
        if request.model_name not in self.callers:  # a model whose request waits here unloads after it
            future.result()

    def is_model_ready(self, request: pb.ModelReadyRequest) -> bool:
        return self._control().ready(request)

    def _sending(self) -> LocalCalls:
        if self.calls is None:
            raise TritonModelException(BLS_OUTSIDE_EXECUTE)
        return self.calls

    def _control(self) -> LocalCalls:
        """The request's calls, else those of the server that loaded the version."""
        calls = self.calls or (self.host.calls if self.host is not None else None)
        if calls is None:
            raise TritonModelException("the model loading API needs a running server")
        return calls


def as_message(request: InferenceRequest) -> InferRequest:
    """A request the model built, as the V2 request it is sent as: its correlation id and flags
    become the ``sequence_*`` parameters, its timeout the ``timeout`` parameter."""
    parameters = {key: parameter(value) for key, value in request.parameter_values().items()}
    if request.correlation_id():
        parameters["sequence_id"] = parameter(request.correlation_id())
    if request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
        parameters["sequence_start"] = parameter(True)
    if request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
        parameters["sequence_end"] = parameter(True)
    if request.timeout() > 0:
        parameters["timeout"] = parameter(request.timeout())
    model_name, model_version = request.model()
    version = str(model_version) if model_version > 0 else ""
    message = InferRequest(RequestHeader(model_name, version, parameters, [],
                                         [RequestedOutput(name) for name in request.requested_output_names()]),
                           request.request_id())
    for tensor in request.inputs():
        add_input(message, tensor)
    return message


class _Responses(ResponseIterator):
    """``pb_utils.ResponseIterator`` over the server's stream call. A ``timeout`` (microseconds)
    counts from the call to the final response: when it expires first, the request is cancelled and
    the iterator ends with "Request timeout expired".

    It is made once the first response came, as Triton's ``exec(decoupled=True)`` returns (the iterator
    starts with it): an ``async def execute`` that iterates the responses of ``async_exec`` at once then
    does not hold its event loop, and the model's other executes, waiting for a response to come."""

    def __init__(self, calls: LocalCalls, message: InferRequest, callers: tuple[str, ...], timeout_us: int = 0) -> None:
        self._items: queue.SimpleQueue[Streamed] = queue.SimpleQueue()
        self._done = False
        self._deadline = time.monotonic() + timeout_us / 1e6 if timeout_us > 0 else None
        self._future = calls.stream(message, callers, self._items.put)
        self._first: InferenceResponse | None = self._take()

    def __iter__(self) -> Iterator[InferenceResponse]:
        return self

    def cancel(self) -> None:
        """Cancel the request (any time; after its final response, nothing happens)."""
        self._future.cancel()

    def __next__(self) -> InferenceResponse:
        first, self._first = self._first, None
        if first is not None:
            return first
        if self._done:
            raise StopIteration
        return self._take()

    def _take(self) -> InferenceResponse:
        """The next response, as it comes (until the deadline)."""
        try:
            wait = None if self._deadline is None else max(self._deadline - time.monotonic(), 0.0)
            item = self._items.get(timeout=wait)
        except queue.Empty:
            self._future.cancel()
            self._done = True
            return InferenceResponse(error=TritonError.of(Unavailable(TIMEOUT_EXPIRED)))
        self._done = item.final
        if item.error is not None:
            return InferenceResponse(error=TritonError.of(item.error))
        return response_of(item.response) if item.response is not None else InferenceResponse()
