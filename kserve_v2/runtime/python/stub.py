"""The stub process of a python model instance run in a process of its own (``EXECUTION_MODE``
``process``; the server's side is ``kserve_v2.runtime.python.process``), as Triton's
``triton_python_backend_stub`` runs one: it imports ``model.py``, runs ``auto_complete_config``,
``initialize``, each ``execute`` and ``finalize`` as the server asks over its socket, with the
tensors in the instance's shared memory region (``kserve_v2.runtime.python.shm``).

Started as ``python -m kserve_v2.runtime.python.stub <settings JSON>`` (the socket's descriptor,
the region's name and sizes, the log level). It imports numpy, the standard library and
``triton_python_backend_utils`` (protobuf's messages included), never gRPC, ONNX Runtime or the
server. Both sides talk through ``protocol.Link``: numbered calls, each answered by a ``Reply``.
The server's calls (``Load``, ``AutoComplete``, ``Initialize``, ``Execute``, ``Finalize``) run on
the main thread, one at a time, which reads the link itself while it waits for the next one (no
hand-off between threads); the server waits ``stub-timeout-seconds`` for each reply, then kills
this process (SIGKILL) as not healthy. A response the model sends through a request's sender, from
any thread and also after ``execute`` returned (a decoupled model's threads), is a ``Send``: its
outputs in the region's output area while the server waits for an ``Execute``, else pickled in the
message; the server's sender of that request takes it, and its error is what the model's ``send``
raises. ``is_cancelled`` asks the same way (``Cancelled``). What else model code asks of the server
goes through ``StubHost``, the stub's ``pb_utils.ModelHost`` (the module's one seam to the server),
as the execution that runs it (or, in a thread the model started, the latest one): business logic
scripting (``Bls``, its tensors pickled; to a decoupled model ``BlsStream``, ``BlsNext``,
``BlsCancel``), custom metrics (``MetricFamily``, ``MetricOf``, ``MetricOp``, ``MetricFamilyGone``)
and the model loading API (``Control``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
import logging
import socket
import sys
import threading
from collections import deque
from pathlib import Path
from typing import Any

from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2.backend.custom_metrics import MetricError, MetricKind
from kserve_v2.runtime.python import pb_utils
from kserve_v2.runtime.python.config import ModelConfig
from kserve_v2.runtime.python.executing import (awaited_as, check_returned, import_model_class, package_of, running_as,
                                                serve_loop, text_of)
from kserve_v2.runtime.python.pb_utils import InferenceRequest, ModelHost, ResponseIterator, received
from kserve_v2.runtime.python.protocol import (AutoComplete, Bls, BlsCancel, BlsNext, BlsStream, Cancelled, Control,
                                               Executed, Execute, Finalize, Initialize, Link, LinkClosed, Load, Message,
                                               MetricFamily, MetricFamilyGone, MetricOf, MetricOp, RemoteError, Reply,
                                               RequestData, ResponseData, Send, StubCall)
from kserve_v2.runtime.python.shm import Region, Sizes, Slot
from kserve_v2.runtime.python.tensors import InferenceResponse, Tensor, TritonModelException

log = logging.getLogger("kserve_v2.python_stub")
GONE = "the server closed the stub's connection"


def response_data(region: Region, response: InferenceResponse, offset: int, sizes: Sizes) -> ResponseData:
    """A response as it travels: its outputs written into ``region`` from ``offset`` (bytes), its error and parameters."""
    slots = region.write([(t.name(), t.as_numpy()) for t in response.output_tensors()], offset, sizes)
    error = response.error()
    return ResponseData(slots, (error.message(), error.code()) if error is not None else None,
                        response.parameter_values())


def inline_data(response: InferenceResponse) -> ResponseData:
    """A response as it travels outside an execute: its outputs' arrays pickled in the message."""
    error = response.error()
    return ResponseData([(t.name(), t.as_numpy()) for t in response.output_tensors()],
                        (error.message(), error.code()) if error is not None else None, response.parameter_values())


class Stub:
    """The stub's state: its link to the server, region and model. ``serve`` runs the server's calls on
    the main thread until ``Finalize`` (or until the server goes away); the link's reader thread hands
    them over and takes the replies to the calls of any thread (also after ``execute`` returned)."""

    def __init__(self, sock: socket.socket, region: Region, sizes: Sizes) -> None:
        self._region, self._sizes = region, sizes
        self._model_class: Any = None
        self._instance: Any = None
        self._folder = ""
        self._decoupled = False
        self._name = ""  # the instance's (Triton's model_instance_name)
        self._area = threading.Lock()  # the region's output area: one response in it until the server read it
        self._executing = False  # the server waits for an execute: the region after its inputs is the stub's
        self._free = 0  # where the output area starts: after the execution's inputs (bytes)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.latest: int | None = None  # the latest execution (a thread the model started sends BLS requests as it)
        self._deleted: deque[tuple[int | None, int]] = deque()  # custom metric families the model deleted
        self.link = Link(sock, "python-stub")

    def serve(self) -> None:
        """Run the server's calls until ``Finalize`` (or until the server goes away). The main thread reads
        the link while it waits for one (and hands the replies it reads to the threads that wait for them)."""
        while (call := self.link.next_call()) is not None:
            number, message = call
            try:
                reply = Reply(number, self._run(message))
            except (Exception, SystemExit) as err:  # noqa: BLE001 - the server reports it
                if not isinstance(message, Load):
                    log.error("python model code failed in %s", type(message).__name__, exc_info=err)
                reply = Reply(number, error=str(err) if isinstance(message, Load) else text_of(err))
            self.forget_families()  # a family deleted in execute is gone before the response arrives
            with self._area:
                self._executing = False
            self.link.reply(reply)
            if isinstance(message, Finalize):
                return

    def _run(self, message: Message) -> Any:
        """Run one of the server's calls: its reply's value.

        Raises:
            TypeError: not a call to the stub.
        """
        match message:
            case Execute(execution, size, requests):
                return self._execute(execution, size, requests)
            case Load(path, name):
                return self._load(path, name)
            case AutoComplete(config):
                return self._auto_complete(config)
            case Initialize(args):
                return self._initialize(args)
            case Finalize():
                return self._finalize()
            case _:
                raise TypeError(f"{type(message).__name__} is not a call to the stub")

    def ask(self, message: StubCall) -> Any:
        """The server's answer to ``message`` (after the families the model deleted are gone there).

        Raises:
            TritonModelException: the server's text of the call's failure; the server went away.
        """
        self.forget_families()
        try:
            return self.link.call(message)
        except RemoteError as err:
            raise TritonModelException(err.text) from None
        except LinkClosed:
            raise TritonModelException(GONE) from None

    def family_deleted(self, execution: int | None, number: int) -> None:
        """The model deleted custom metric family ``number``: the server's goes at the next call to it, or once
        the running call of the server's ends (``forget_families``). Runs from ``__del__``, maybe in a garbage
        collection while this thread holds one of the link's locks: it takes no lock and sends nothing."""
        self._deleted.append((execution, number))

    def forget_families(self) -> None:
        """Tell the server which families the model deleted (``MetricFamilyGone``), oldest first."""
        while self._deleted:
            try:
                execution, number = self._deleted.popleft()
            except IndexError:  # another thread took the last one
                return
            try:
                self.link.call(MetricFamilyGone(execution, number))
            except (RemoteError, LinkClosed):
                pass  # the server went away, or forgot the family with its model version

    def host(self, execution: int | None) -> StubHost:
        """What model code running as ``execution`` (None: outside ``execute``) asks the server through."""
        return StubHost(self, execution, self._folder)

    def _load(self, path: str, name: str) -> bool:
        """Import the model file; whether its class has ``auto_complete_config``."""
        self._model_class = import_model_class(Path(path), name)
        self._folder = str(Path(path).parent)
        pb_utils.register(package_of(self._model_class), lambda: self.host(self.latest))  # threads the model starts
        return hasattr(self._model_class, "auto_complete_config")

    def _auto_complete(self, config: str) -> Any:
        """Run ``auto_complete_config``; the configuration it returns (Triton's JSON dict), or None: not a ModelConfig."""
        with running_as(self.host(None)):
            completed = self._model_class.auto_complete_config(ModelConfig(config))
        return completed.as_dict() if isinstance(completed, ModelConfig) else None

    def _initialize(self, args: dict[str, str]) -> None:
        self._decoupled = pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"]))
        self._name = args["model_instance_name"]
        self._instance = self._model_class()
        if hasattr(self._instance, "initialize"):
            with running_as(self.host(None)):
                self._instance.initialize(args)

    def _finalize(self) -> None:
        if self._instance is not None and hasattr(self._instance, "finalize"):
            with running_as(self.host(None)):
                self._instance.finalize()

    def _execute(self, execution: int, size: int, requests: list[RequestData]) -> Executed:
        """Run one ``execute`` on ``requests`` (``RequestData``; the region holds ``size`` bytes)."""
        self._region.remap(size)
        received_requests = []
        free = 0
        for index, request in enumerate(requests):
            # views of the region, valid until the next execute writes it; a decoupled model's requests
            # outlive their execute (its threads answer them), so they get copies
            inputs = [Tensor(slot.name, self._region.read(slot, copy=self._decoupled)) for slot in request.inputs]
            free = self._region.end(request.inputs, free)
            cancelled = self._cancelled(execution, index)
            sender = pb_utils.InferenceResponseSender(self._sender(execution, index), cancelled)
            received_requests.append(received(request.request_id, request.correlation_id, request.flags,
                                              request.parameters, inputs, request.output_names, sender, cancelled))
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
            return Executed(self._region.size, again, None if returned is None else [])
        if returned is None:
            return Executed(self._region.size, again, None)
        check_returned(returned, again)
        responses: list[ResponseData | None] = []
        with self._area:  # the server reads them before the next execute: the area stays the stub's until then
            offset = self._free
            for response in returned:
                data = None if response is None else response_data(self._region, response, offset, self._sizes)
                if data is not None:
                    offset = self._region.end([slot for slot in data.outputs if isinstance(slot, Slot)], offset)
                responses.append(data)
        return Executed(self._region.size, again, responses)

    def _sender(self, execution: int, index: int) -> Any:
        """Deliver a response the model sends for request ``index`` of ``execution``: through the
        region's output area while the server waits for an execute, else pickled in the message (the
        server may be writing the next execution's inputs into the region)."""
        def deliver(response: InferenceResponse | None, final: bool) -> None:
            with self._area:
                if response is None:
                    data = None
                elif self._executing:
                    data = response_data(self._region, response, self._free, self._sizes)
                else:
                    data = inline_data(response)
                self.ask(Send(execution, index, data, final, self._region.size))
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
                return bool(self.ask(Cancelled(execution, index)))
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
        self._stub, self.execution, self.model_dir = stub, execution, model_dir

    def infer(self, request: InferenceRequest) -> InferenceResponse:
        """The request goes to the server (its tensors pickled in the message), which applies its timeout."""
        return _inline_response(self._stub.ask(Bls(self.execution, self._sending(request))))

    def stream(self, request: InferenceRequest) -> ResponseIterator:
        return _Responses(self, self._stub.ask(BlsStream(self.execution, self._sending(request))))

    def metric_family(self, name: str, description: str, kind: MetricKind) -> _Family:
        try:
            return _Family(self, self._stub.ask(MetricFamily(self.execution, name, description, int(kind))))
        except TritonModelException as err:
            raise MetricError(str(err)) from None

    def load_model(self, request: pb.RepositoryModelLoadRequest) -> None:
        self._stub.ask(Control(self.execution, "load_model", request))

    def unload_model(self, request: pb.RepositoryModelUnloadRequest) -> None:
        self._stub.ask(Control(self.execution, "unload_model", request))

    def is_model_ready(self, request: pb.ModelReadyRequest) -> bool:
        return bool(self._stub.ask(Control(self.execution, "is_model_ready", request)))

    def _sending(self, request: InferenceRequest) -> dict[str, Any]:
        if self.execution is None:
            raise TritonModelException(pb_utils.BLS_OUTSIDE_EXECUTE)
        return request.as_fields()

    def ask(self, message: StubCall) -> Any:
        """The server's answer to a call it runs as this host's execution (``Stub.ask``).

        Raises:
            TritonModelException: the server's text of the call's failure; the server went away.
        """
        return self._stub.ask(message)

    def family_deleted(self, number: int) -> None:
        """Custom metric family ``number`` was deleted (``Stub.family_deleted``)."""
        self._stub.family_deleted(self.execution, number)


def _inline_response(data: ResponseData) -> InferenceResponse:
    """A response that travelled pickled (``inline_data``)."""
    return InferenceResponse([Tensor(*pair) for pair in data.outputs if isinstance(pair, tuple)],
                             pb_utils.TritonError(*data.error) if data.error is not None else None, data.parameters)


class _Responses(ResponseIterator):
    """The responses of a BLS request to a decoupled model, in the stub: the server's iterator (its
    timeout, errors and ``cancel``), one response per call."""

    def __init__(self, host: StubHost, number: int) -> None:
        self._host = host
        self._number = number
        self._done = False

    def __next__(self) -> InferenceResponse:
        data = None if self._done else self._host.ask(BlsNext(self._host.execution, self._number))
        if data is None:
            self._done = True
            raise StopIteration
        return _inline_response(data)

    def cancel(self) -> None:
        if not self._done:
            self._host.ask(BlsCancel(self._host.execution, self._number))


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
            return self._host.ask(MetricOp(self._host.execution, self._number, operation, value))
        except TritonModelException as err:
            raise MetricError(str(err)) from None


class _Family:
    """A custom metric family in the stub (``pb_utils.FamilyHandle``): the family is the server's, in
    its ``/metrics``, created as the model version that runs (released when it unloads)."""

    def __init__(self, host: StubHost, number: int) -> None:
        self._host, self._number = host, number

    def metric(self, labels: dict[str, str], buckets: Any) -> _Metric:
        try:
            return _Metric(self._host, self._host.ask(MetricOf(self._host.execution, self._number, labels, buckets)))
        except TritonModelException as err:
            raise MetricError(str(err)) from None

    def __del__(self) -> None:
        """The model deleted it: the server's goes too, and its metrics refuse their operations (Triton's
        stub clears them), before the server's next call ends or the model's next call reaches it."""
        self._host.family_deleted(self._number)


def main(argv: list[str]) -> int:
    """Run the stub with the settings JSON in ``argv[1]``; 0 when the server finalized it or went away."""
    settings = json.loads(argv[1])
    logging.basicConfig(level=settings["log_level"], stream=sys.stderr,
                        format="%(asctime)s %(levelname)s [python stub %(process)d] %(name)s: %(message)s")
    sys.modules.setdefault("triton_python_backend_utils", pb_utils)
    sys.argv = [""]  # Triton's stub: an embedded interpreter given no arguments
    sizes = Sizes(settings["default_byte_size"], settings["growth_byte_size"], settings["prefix"])
    region = Region(settings["region"], settings["size"])
    Stub(socket.socket(fileno=settings["fd"]), region, sizes).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
