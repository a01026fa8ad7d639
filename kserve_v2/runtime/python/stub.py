"""The stub process of a python model instance run in a process of its own (``EXECUTION_MODE``
``process``; the server's side is ``kserve_v2.runtime.python.process``), as Triton's
``triton_python_backend_stub`` runs one: it imports ``model.py``, runs ``auto_complete_config``,
``initialize``, each ``execute`` and ``finalize`` as the server asks over its socket, with the
tensors in the instance's shared memory region (``kserve_v2.runtime.python.shm``).

Started as ``python -m kserve_v2.runtime.python.stub <settings JSON>`` (the socket's descriptor,
the region's name and sizes, the log level). It imports numpy, the standard library and
``triton_python_backend_utils`` (protobuf's messages included), never gRPC, ONNX Runtime or the
server. Messages are pickled tuples. The server's calls (``load``, ``auto_complete``, ``initialize``,
``execute``, ``finalize``) run on the main thread, one at a time, each answered ``("ok", result)`` or
``("error", text)``. A response the model sends through a request's sender, from any thread and also
after ``execute`` returned (a decoupled model's threads), travels as ``("send", number, execution,
request, response, final, size)``: its outputs in the region's output area while the server waits for
an ``execute``, else pickled in the message; the server's sender of that request checks it and
answers ``("reply", number, error)``, which that thread's ``send`` raises. ``is_cancelled`` asks the
same way. A request the model sends (business logic scripting: ``exec``, ``async_exec``) travels
as ``("bls", number, execution, fields)``, its tensors pickled; the server runs it as the execution
that sent it and answers with its response (to a decoupled model: ``bls_stream``, then
``bls_next`` per response and ``bls_cancel``). Custom metrics (``MetricFamily``, ``Metric``) and the model loading API (``load_model``, ``unload_model``,
``is_model_ready``) are the server's: each call is answered there (``("metric_family" | "metric_of"
| "metric" | "control", number, execution, ...)``). All of these are ``StubHost``'s: the stub's
``pb_utils.ModelHost``, the module's one seam to the server (the model's code runs as the
execution that runs it, or, in a thread it started, as the latest one).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import itertools
import json
import logging
import queue
import socket
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2.backend.custom_metrics import MetricError, MetricKind
from kserve_v2.runtime.python import pb_utils
from kserve_v2.runtime.python.config import ModelConfig
from kserve_v2.runtime.python.executing import (awaited_as, check_returned, import_model_class, package_of, running_as,
                                                serve_loop, text_of)
from kserve_v2.runtime.python.pb_utils import InferenceRequest, ModelHost, ResponseIterator, received
from kserve_v2.runtime.python.shm import Region, Sizes, Slot
from kserve_v2.runtime.python.tensors import InferenceResponse, Tensor, TritonModelException

log = logging.getLogger("kserve_v2.python_stub")
# a response meta: its outputs (slots in the region, or (name, array) pairs pickled), error (message, code) or None,
# parameters
ResponseMeta = tuple[list[Slot] | list[tuple[str, Any]], tuple[str, int] | None, dict[str, bool | int | str]]
_GONE = object()  # what a waiting thread gets when the server's connection closed
GONE = "the server closed the stub's connection"


def response_meta(region: Region, response: InferenceResponse, offset: int, sizes: Sizes) -> ResponseMeta:
    """A response as it travels: its outputs written into ``region`` from ``offset``, its error and parameters."""
    slots = region.write([(t.name(), t.as_numpy()) for t in response.output_tensors()], offset, sizes)
    error = response.error()
    return slots, (error.message(), error.code()) if error is not None else None, response.parameter_values()


def inline_meta(response: InferenceResponse) -> ResponseMeta:
    """A response as it travels outside an execute: its outputs' arrays pickled in the message."""
    error = response.error()
    return ([(t.name(), t.as_numpy()) for t in response.output_tensors()],
            (error.message(), error.code()) if error is not None else None, response.parameter_values())


class Stub:
    """The stub's state: its socket, region and model. ``serve`` runs the server's calls on the main
    thread until ``finalize``; a reader thread takes the server's messages, handing the replies to a
    send or cancellation check (any thread's, also after ``execute`` returned) to the thread that waits."""

    def __init__(self, conn: Connection, region: Region, sizes: Sizes) -> None:
        self._conn, self._region, self._sizes = conn, region, sizes
        self._model_class: Any = None
        self._instance: Any = None
        self._folder = ""
        self._decoupled = False
        self._name = ""  # the instance's (Triton's model_instance_name)
        self._write = threading.Lock()  # one message at a time on the socket
        self._area = threading.Lock()  # the region's output area: one response in it until the server read it
        self._executing = False  # the server waits for an execute: the region after its inputs is the stub's
        self._free = 0  # where the output area starts: after the execution's inputs
        self._calls: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._waiting: dict[int, queue.SimpleQueue[Any]] = {}
        self._numbers = itertools.count()
        self._gone = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.latest: int | None = None  # the latest execution (a thread the model started sends BLS requests as it)

    def serve(self) -> None:
        """Run the server's calls until ``finalize`` (or until the server goes away)."""
        threading.Thread(target=self._read, name="python-stub-reader", daemon=True).start()
        while (message := self._calls.get()) is not None:
            kind, body = message[0], message[1:]
            try:
                reply: tuple[Any, ...] = ("ok", getattr(self, f"_on_{kind}")(*body))
            except (Exception, SystemExit) as err:  # noqa: BLE001 - the server reports it
                if kind != "load":
                    log.error("python model code failed in %s", kind, exc_info=err)
                reply = ("error", str(err) if kind == "load" else text_of(err))
            with self._area:
                self._executing = False
            self._post(reply)
            if kind == "finalize":
                return

    def _read(self) -> None:
        """Take the server's messages: calls for the main thread, replies for the threads that wait."""
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                break
            if message[0] == "reply":
                self._waiting.pop(message[1]).put(message[2])
            else:
                self._calls.put(message)
        self._gone = True
        for waiting in list(self._waiting.values()):
            waiting.put(_GONE)
        self._calls.put(None)

    def _post(self, message: tuple[Any, ...]) -> None:
        with self._write:
            self._conn.send(message)

    def ask(self, message: tuple[Any, ...]) -> Any:
        """Send ``message`` (its second field is filled with a number) and wait for the server's reply to it.

        Raises:
            TritonModelException: the server went away.
        """
        number = next(self._numbers)
        waiting: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._waiting[number] = waiting
        if self._gone:
            self._waiting.pop(number, None)
            raise TritonModelException(GONE)
        try:
            self._post((message[0], number, *message[1:]))
        except OSError:
            self._waiting.pop(number, None)
            raise TritonModelException(GONE) from None
        reply = waiting.get()
        if reply is _GONE:
            raise TritonModelException(GONE)
        return reply

    def host(self, execution: int | None) -> StubHost:
        """What model code running as ``execution`` (None: outside ``execute``) asks the server through."""
        return StubHost(self, execution, self._folder)

    def _on_load(self, path: str, name: str) -> bool:
        """Import the model file; whether its class has ``auto_complete_config``."""
        self._model_class = import_model_class(Path(path), name)
        self._folder = str(Path(path).parent)
        pb_utils.register(package_of(self._model_class), lambda: self.host(self.latest))  # threads the model starts
        return hasattr(self._model_class, "auto_complete_config")

    def _on_auto_complete(self, config: str) -> Any:
        """Run ``auto_complete_config``; the configuration it returns (Triton's JSON dict), or None: not a ModelConfig."""
        with running_as(self.host(None)):
            completed = self._model_class.auto_complete_config(ModelConfig(config))
        return completed.as_dict() if isinstance(completed, ModelConfig) else None

    def _on_initialize(self, args: dict[str, str]) -> None:
        self._decoupled = pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"]))
        self._name = args["model_instance_name"]
        self._instance = self._model_class()
        if hasattr(self._instance, "initialize"):
            with running_as(self.host(None)):
                self._instance.initialize(args)

    def _on_finalize(self) -> None:
        if self._instance is not None and hasattr(self._instance, "finalize"):
            with running_as(self.host(None)):
                self._instance.finalize()

    def _on_execute(self, execution: int, size: int, requests: list[tuple[Any, ...]]
                    ) -> tuple[int, list[bool], list[ResponseMeta | None] | None]:
        """Run one ``execute``: the region's size after it, which requests the model gave back to be
        executed again (``set_release_flags``), and the responses it returned (None: it returned
        None; ``[]``: a decoupled model returned something, which the server refuses)."""
        self._region.remap(size)
        received_requests = []
        free = 0
        for index, (request_id, correlation_id, flags, parameters, slots, output_names) in enumerate(requests):
            # views of the region, valid until the next execute writes it; a decoupled model's requests
            # outlive their execute (its threads answer them), so they get copies
            inputs = [Tensor(slot.name, self._region.read(slot, copy=self._decoupled)) for slot in slots]
            free = self._region.end(slots, free)
            cancelled = self._cancelled(execution, index)
            sender = pb_utils.InferenceResponseSender(self._sender(execution, index), cancelled)
            received_requests.append(received(request_id, correlation_id, flags, parameters, inputs, output_names,
                                              sender, cancelled))
        with self._area:
            self._executing, self._free = True, free
        now = self.host(execution)
        self.latest = execution
        with running_as(now):
            returned = self._instance.execute(received_requests)
        if inspect.iscoroutine(returned):
            future = asyncio.run_coroutine_threadsafe(awaited_as(now, returned), self._event_loop())
            if self._decoupled:  # in the background (as in the server's process): its executes overlap
                future.add_done_callback(lambda done: self._failed(done, received_requests))
                returned = None
            else:
                returned = future.result()
        again = [pb_utils.rescheduled(request) for request in received_requests]
        if self._decoupled:
            return self._region.size, again, None if returned is None else []
        if returned is None:
            return self._region.size, again, None
        check_returned(returned, again)
        metas: list[ResponseMeta | None] = []
        with self._area:  # the server reads them before the next execute: the area stays the stub's until then
            offset = self._free
            for response in returned:
                meta = None if response is None else response_meta(self._region, response, offset, self._sizes)
                if meta is not None:
                    offset = self._region.end([slot for slot in meta[0] if isinstance(slot, Slot)], offset)
                metas.append(meta)
        return self._region.size, again, metas

    def _sender(self, execution: int, index: int) -> Any:
        """Deliver a response the model sends for request ``index`` of ``execution``: through the
        region's output area while the server waits for an execute, else pickled in the message (the
        server may be writing the next execution's inputs into the region)."""
        def deliver(response: InferenceResponse | None, final: bool) -> None:
            with self._area:
                if response is None:
                    meta = None
                elif self._executing:
                    meta = response_meta(self._region, response, self._free, self._sizes)
                else:
                    meta = inline_meta(response)
                error = self.ask(("send", execution, index, meta, final, self._region.size))
            if error is not None:
                raise TritonModelException(error)
        return deliver

    def _failed(self, done: concurrent.futures.Future[Any], requests: list[pb_utils.InferenceRequest]) -> None:
        """A decoupled model's ``async def execute`` ended: when it raised, the error is logged and
        the requests still open end with it (the in-process text: the server's ``PythonModel``)."""
        err = None if done.cancelled() else done.exception()
        if err is None:
            return
        log.error("python model '%s' failed to execute", self._name, exc_info=err)
        failure = InferenceResponse(error=pb_utils.TritonError(
            f"Failed to process the request(s) for model '{self._name}', message: {text_of(err)}"))
        for request in requests:
            try:
                request.get_response_sender().send(failure, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            except TritonModelException:
                pass  # answered already

    def _cancelled(self, execution: int, index: int) -> Any:
        def cancelled() -> bool:
            try:
                return bool(self.ask(("cancelled", execution, index)))
            except TritonModelException:
                return True  # the server went away
        return cancelled

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        """The instance's event loop for ``async def execute``, on a daemon thread of its own."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            threading.Thread(target=serve_loop, args=(self._loop,), name="python-stub-loop", daemon=True).start()
        return self._loop


class StubHost(ModelHost):
    """``pb_utils.ModelHost`` in a stub process: each call is the server's, asked over the stub's
    socket as the execution ``execution`` (None: ``initialize``, ``auto_complete_config`` or
    ``finalize``), which the server runs it as (``ProcessInstance``)."""

    def __init__(self, stub: Stub, execution: int | None, model_dir: str) -> None:
        self._stub, self._execution, self.model_dir = stub, execution, model_dir

    def infer(self, request: InferenceRequest) -> InferenceResponse:
        """The request goes to the server (its tensors pickled in the message), which applies its timeout."""
        return _inline_response(self._ask("bls", self._sending(request)))

    def stream(self, request: InferenceRequest) -> ResponseIterator:
        return _Responses(self, self._ask("bls_stream", self._sending(request)))

    def metric_family(self, name: str, description: str, kind: MetricKind) -> _Family:
        try:
            return _Family(self, self._ask("metric_family", name, description, int(kind)))
        except TritonModelException as err:
            raise MetricError(str(err)) from None

    def load_model(self, request: pb.RepositoryModelLoadRequest) -> None:
        self._ask("control", "load_model", request)

    def unload_model(self, request: pb.RepositoryModelUnloadRequest) -> None:
        self._ask("control", "unload_model", request)

    def is_model_ready(self, request: pb.ModelReadyRequest) -> bool:
        return bool(self._ask("control", "is_model_ready", request))

    def _sending(self, request: InferenceRequest) -> dict[str, Any]:
        if self._execution is None:
            raise TritonModelException(pb_utils.BLS_OUTSIDE_EXECUTE)
        return request.as_fields()

    def _ask(self, kind: str, *args: Any) -> Any:
        """The server's answer to a call it runs as this host's execution.

        Raises:
            TritonModelException: the server's text of the call's failure; the server went away.
        """
        status, body = self._stub.ask((kind, self._execution, *args))
        if status == "error":
            raise TritonModelException(body)
        return body


def _inline_response(meta: Any) -> InferenceResponse:
    """A response that travelled pickled (``inline_meta``)."""
    outputs, error, parameters = meta
    return InferenceResponse([Tensor(name, array) for name, array in outputs],
                             pb_utils.TritonError(*error) if error is not None else None, parameters)


class _Responses(ResponseIterator):
    """The responses of a BLS request to a decoupled model, in the stub: the server's iterator (its
    timeout, errors and ``cancel``), one response per call."""

    def __init__(self, host: StubHost, number: int) -> None:
        self._host = host
        self._number = number
        self._done = False

    def __next__(self) -> InferenceResponse:
        meta = None if self._done else self._host._ask("bls_next", self._number)
        if meta is None:
            self._done = True
            raise StopIteration
        return _inline_response(meta)

    def cancel(self) -> None:
        if not self._done:
            self._host._ask("bls_cancel", self._number)


class _Metric:
    """A custom metric's series in the stub (``pb_utils.FamilyHandle``'s metric): each operation runs
    on the server's (its texts, raised as ``MetricError``)."""

    def __init__(self, host: StubHost, number: int) -> None:
        self._host, self._number = host, number

    def increment(self, value: float) -> None:
        self._operate("increment", value)

    def set(self, value: float) -> None:
        self._operate("set", value)

    def observe(self, value: float) -> None:
        self._operate("observe", value)

    def value(self) -> float:
        return float(self._operate("value", None))

    def _operate(self, operation: str, value: float | None) -> Any:
        try:
            return self._host._ask("metric", self._number, operation, value)
        except TritonModelException as err:
            raise MetricError(str(err)) from None


class _Family:
    """A custom metric family in the stub (``pb_utils.FamilyHandle``): the family is the server's, in
    its ``/metrics``, created as the model version that runs (released when it unloads)."""

    def __init__(self, host: StubHost, number: int) -> None:
        self._host, self._number = host, number

    def metric(self, labels: dict[str, str], buckets: Any) -> _Metric:
        try:
            return _Metric(self._host, self._host._ask("metric_of", self._number, labels, buckets))
        except TritonModelException as err:
            raise MetricError(str(err)) from None

    def __del__(self) -> None:
        """The model deleted it: the server's goes too, and its metrics refuse their operations (Triton's
        stub clears them). Not on the reader thread, which must be free to take the reply."""
        if threading.current_thread().name == "python-stub-reader":
            threading.Thread(target=self._gone, daemon=True).start()
        else:
            self._gone()

    def _gone(self) -> None:
        try:
            self._host._ask("metric_family_gone", self._number)
        except TritonModelException:
            pass  # the server went away


def main(argv: list[str]) -> int:
    """Run the stub with the settings JSON in ``argv[1]``; 0 when the server finalized it or went away."""
    settings = json.loads(argv[1])
    logging.basicConfig(level=settings["log_level"], stream=sys.stderr,
                        format="%(asctime)s %(levelname)s [python stub %(process)d] %(name)s: %(message)s")
    sys.modules.setdefault("triton_python_backend_utils", pb_utils)
    sys.argv = [""]  # Triton's stub: an embedded interpreter given no arguments
    sock = socket.socket(fileno=settings["fd"])
    conn = Connection(sock.detach())
    sizes = Sizes(settings["default_byte_size"], settings["growth_byte_size"], settings["prefix"])
    region = Region(settings["region"], settings["size"])
    Stub(conn, region, sizes).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
