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
| "metric" | "control", number, execution, ...)``).

``import_model_class`` (importing ``model.py`` as Triton's stub does) serves the in-process mode too.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
import inspect
import itertools
import json
import logging
import queue
import socket
import sys
import threading
import types
from contextvars import ContextVar
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from kserve_v2.runtime.python import pb_utils
from kserve_v2.runtime.python.config import ModelConfig
from kserve_v2.runtime.python.model import _as, _check_returned, _serve, running_as, text_of
from kserve_v2.runtime.python.pb_utils import Running, received
from kserve_v2.runtime.python.shm import Region, Sizes, Slot
from kserve_v2.runtime.python.tensors import InferenceResponse, Tensor, TritonModelException

log = logging.getLogger("kserve_v2.python_stub")
_loaded = itertools.count()
# a response meta: its outputs (slots in the region, or (name, array) pairs pickled), error (message, code) or None,
# parameters
ResponseMeta = tuple[list[Slot] | list[tuple[str, Any]], tuple[str, int] | None, dict[str, bool | int | str]]
_GONE = object()  # what a waiting thread gets when the server's connection closed
_EXECUTION: ContextVar[int | None] = ContextVar("kserve_v2_stub_execution", default=None)  # the execute running
_STUB: Stub | None = None


def import_model_class(path: Path, name: str) -> Any:
    """Import the model file as the module ``model`` of a package that is its version folder (as
    Triton's stub imports ``<version>.model``, so ``from . import helper`` finds the folder's
    ``helper.py``; the folder is on ``sys.path`` too, for ``import helper``) and return its
    ``TritonPythonModel``.

    Raises:
        ValueError: the file fails to import, or defines no class ``TritonPythonModel``.
    """
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.append(folder)  # sibling modules import as in Triton's stub
    package = types.ModuleType(f"_kserve_v2_python_model_{next(_loaded)}")
    package.__path__ = [folder]
    package.__package__ = package.__name__
    sys.modules[package.__name__] = package
    spec = importlib.util.spec_from_file_location(f"{package.__name__}.{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"python model '{name}': its model file cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    setattr(package, path.stem, module)
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as err:  # noqa: BLE001 - the load failure reason
        sys.modules.pop(spec.name, None)
        sys.modules.pop(package.__name__, None)
        raise ValueError(f"python model '{name}': importing its model file failed: {text_of(err)}") from None
    model_class = getattr(module, "TritonPythonModel", None)
    if not isinstance(model_class, type):
        raise ValueError(f"python model '{name}': its model file defines no class TritonPythonModel")
    return model_class


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
            raise TritonModelException("the server closed the stub's connection")
        try:
            self._post((message[0], number, *message[1:]))
        except OSError:
            self._waiting.pop(number, None)
            raise TritonModelException("the server closed the stub's connection") from None
        reply = waiting.get()
        if reply is _GONE:
            raise TritonModelException("the server closed the stub's connection")
        return reply

    def _on_load(self, path: str, name: str) -> bool:
        """Import the model file; whether its class has ``auto_complete_config``."""
        self._model_class = import_model_class(Path(path), name)
        self._folder = str(Path(path).parent)
        pb_utils._last[:] = [Running(self._folder, None, ())]  # what threads the model starts run as
        return hasattr(self._model_class, "auto_complete_config")

    def _on_auto_complete(self, config: str) -> Any:
        """Run ``auto_complete_config``; the configuration it returns (Triton's JSON dict), or None: not a ModelConfig."""
        with running_as(Running(self._folder, None, ())):
            completed = self._model_class.auto_complete_config(ModelConfig(config))
        return completed.as_dict() if isinstance(completed, ModelConfig) else None

    def _on_initialize(self, args: dict[str, str]) -> None:
        self._decoupled = pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"]))
        self._name = args["model_instance_name"]
        self._instance = self._model_class()
        if hasattr(self._instance, "initialize"):
            with running_as(Running(self._folder, None, ())):
                self._instance.initialize(args)

    def _on_finalize(self) -> None:
        if self._instance is not None and hasattr(self._instance, "finalize"):
            with running_as(Running(self._folder, None, ())):
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
        now = Running(self._folder, None, ())
        self.latest = execution
        token = _EXECUTION.set(execution)
        try:
            with running_as(now):
                returned = self._instance.execute(received_requests)
            if inspect.iscoroutine(returned):
                future = asyncio.run_coroutine_threadsafe(_as(now, returned), self._event_loop())
                if self._decoupled:  # in the background (as in the server's process): its executes overlap
                    future.add_done_callback(lambda done: self._failed(done, received_requests))
                    returned = None
                else:
                    returned = future.result()
        finally:
            _EXECUTION.reset(token)
        again = [pb_utils.rescheduled(request) for request in received_requests]
        if self._decoupled:
            return self._region.size, again, None if returned is None else []
        if returned is None:
            return self._region.size, again, None
        _check_returned(returned, again)
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
            threading.Thread(target=_serve, args=(self._loop,), name="python-stub-loop", daemon=True).start()
        return self._loop


def _exec(request: pb_utils.InferenceRequest, decoupled: bool = False) -> Any:
    """``InferenceRequest.exec`` in the stub: the request goes to the server, which runs it as the
    execution that sent it (its tensors pickled in the message): its response, or with ``decoupled``
    an iterator of its responses.

    Raises:
        TritonModelException: outside ``execute`` (Triton's text); the server went away.
    """
    if _STUB is None or _EXECUTION.get(None) is None and _STUB.latest is None:
        raise TritonModelException(pb_utils.BLS_OUTSIDE_EXECUTE)
    fields = {"request_id": request.request_id(), "correlation_id": request.correlation_id(),
              "inputs": [(t.name(), t.as_numpy()) for t in request.inputs()],
              "requested_output_names": request.requested_output_names(), "model_name": request._model_name,
              "model_version": request._model_version, "flags": request.flags(), "timeout": request.timeout(),
              "parameters": request._parameters}
    if decoupled:
        return _ResponseIterator(_forward("bls_stream", fields))
    return _inline_response(_forward("bls", fields))


def _inline_response(meta: Any) -> InferenceResponse:
    """A response that travelled pickled (``inline_meta``)."""
    outputs, error, parameters = meta
    return InferenceResponse([Tensor(name, array) for name, array in outputs],
                             pb_utils.TritonError(*error) if error is not None else None, parameters)


class _ResponseIterator(pb_utils._AsyncResponses):
    """The responses of a BLS request to a decoupled model, in the stub: the server's iterator
    (``pb_utils``' ``_ResponseIterator``: its timeout, errors and ``cancel``), one response per call."""

    def __init__(self, number: int) -> None:
        self._number = number
        self._done = False

    def __iter__(self) -> _ResponseIterator:
        return self

    def __next__(self) -> InferenceResponse:
        meta = None if self._done else _forward("bls_next", self._number)
        if meta is None:
            self._done = True
            raise StopIteration
        return _inline_response(meta)

    def cancel(self) -> None:
        """Cancel the request (the callee's ``is_cancelled()`` turns true)."""
        if not self._done:
            _forward("bls_cancel", self._number)


def _forward(*call: Any) -> Any:
    """A call the server answers for model code (BLS, custom metrics) as the execution running it
    (or the latest one, or ``initialize``): what it returned.

    Raises:
        TritonModelException: the server's text of the call's failure; the server went away.
    """
    if _STUB is None:
        raise TritonModelException("no python model is executing: this call is only available inside a model")
    execution = _EXECUTION.get(None)
    status, body = _STUB.ask((call[0], execution if execution is not None else _STUB.latest, *call[1:]))
    if status == "error":
        raise TritonModelException(body)
    return body


class _Metric:
    """``pb_utils.Metric`` in the stub: each operation runs on the server's metric (its texts)."""

    def __init__(self, number: int) -> None:
        self._number = number

    def increment(self, value: float) -> None:
        _forward("metric", self._number, "increment", value)

    def set(self, value: float) -> None:
        _forward("metric", self._number, "set", value)

    def observe(self, value: float) -> None:
        _forward("metric", self._number, "observe", value)

    def value(self) -> float:
        return float(_forward("metric", self._number, "value", None))


class _MetricFamily:
    """``pb_utils.MetricFamily`` in the stub: the family is the server's, in its ``/metrics``,
    created as the model version that runs (released when it unloads)."""

    COUNTER = pb_utils.MetricFamily.COUNTER
    GAUGE = pb_utils.MetricFamily.GAUGE
    HISTOGRAM = pb_utils.MetricFamily.HISTOGRAM

    def __init__(self, name: str, description: str, kind: Any) -> None:
        self._number = _forward("metric_family", name, description, kind)

    def Metric(self, labels: dict[str, str] | None = None, buckets: list[float] | None = None) -> _Metric:  # noqa: N802
        return _Metric(_forward("metric_of", self._number, labels, buckets))

    def __del__(self) -> None:
        """The model deleted it: the server's goes too, and its metrics refuse their operations (Triton's
        stub clears them). Not on the reader thread, which must be free to take the reply."""
        if "_number" not in vars(self):
            return  # creating it failed
        if threading.current_thread().name == "python-stub-reader":
            threading.Thread(target=self._gone, daemon=True).start()
        else:
            self._gone()

    def _gone(self) -> None:
        try:
            _forward("metric_family_gone", self._number)
        except TritonModelException:
            pass  # the server went away


async def _async_exec(request: pb_utils.InferenceRequest, decoupled: bool = False) -> Any:
    """``InferenceRequest.async_exec`` in the stub: ``_exec`` off the event loop."""
    return await asyncio.get_running_loop().run_in_executor(None, _exec, request, decoupled)


def _control(name: str) -> Any:
    """The model loading API call ``name`` (``pb_utils.load_model``, ...) in the stub: the server's own."""
    def control(*args: Any, **kwargs: Any) -> Any:
        return _forward("control", name, args, kwargs)
    return control


def _forward_server_calls() -> None:
    """What needs the server's own objects is asked of the server (BLS, custom metrics, model control)."""
    pb_utils.InferenceRequest.exec = _exec  # type: ignore[assignment]
    pb_utils.InferenceRequest.async_exec = _async_exec  # type: ignore[assignment]
    pb_utils.MetricFamily = _MetricFamily  # type: ignore[misc, assignment]
    for name in ("load_model", "unload_model", "is_model_ready"):
        setattr(pb_utils, name, _control(name))


def main(argv: list[str]) -> int:
    """Run the stub with the settings JSON in ``argv[1]``; 0 when the server finalized it or went away."""
    settings = json.loads(argv[1])
    logging.basicConfig(level=settings["log_level"], stream=sys.stderr,
                        format="%(asctime)s %(levelname)s [python stub %(process)d] %(name)s: %(message)s")
    sys.modules.setdefault("triton_python_backend_utils", pb_utils)
    sys.argv = [""]  # Triton's stub: an embedded interpreter given no arguments
    _forward_server_calls()
    sock = socket.socket(fileno=settings["fd"])
    conn = Connection(sock.detach())
    sizes = Sizes(settings["default_byte_size"], settings["growth_byte_size"], settings["prefix"])
    region = Region(settings["region"], settings["size"])
    global _STUB
    _STUB = Stub(conn, region, sizes)
    _STUB.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
