"""``triton_python_backend_utils`` for python models run by this server (Triton's python backend
API, its "Python Backend" documentation): the module a ``model.py`` imports as ``pb_utils``, the same
module in the server's process and in a stub process.

``kserve_v2.runtime.python.backend`` and the stub register it under that name. Requests, responses
and tensors are plain Python objects over numpy arrays. What model code asks of the server that runs
it goes through one seam, ``ModelHost``: business logic scripting (``InferenceRequest.exec`` and
``async_exec``), custom metrics (``MetricFamily``), the model loading API (``load_model``,
``unload_model``, ``is_model_ready``) and the model's folder (``get_model_dir``). The host of the
code running now is ``running()``: the one the backend set around ``initialize``, ``execute`` and
``finalize`` (``RUNNING``), or, in a thread the model started, the latest one of the model whose code
the thread runs (``register``). In the server's process it is ``kserve_v2.runtime.python.in_process.InProcessHost``;
in a stub process, the stub's, which asks the server. A decoupled model answers through
``InferenceRequest.get_response_sender``. Names, signatures, constants and error texts are Triton's.
"""

from __future__ import annotations

import abc
import enum
import json
import logging
import struct
import sys
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from types import FrameType
from typing import Any, Protocol

import numpy as np

from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2.backend import Parameter
from kserve_v2.backend.custom_metrics import MetricError, MetricKind
from kserve_v2.runtime.python.config import ModelConfig, tensor_config
from kserve_v2.runtime.python.tensors import (TRITON_TYPES, InferenceResponse, MemoryType, Tensor, TritonError,
                                              TritonModelException, binding_type_error, is_text, numpy_to_triton_type,
                                              tensor_list, text)

__all__ = ["InferenceResponse", "ModelConfig", "Tensor", "TritonError", "TritonModelException", "numpy_to_triton_type"]

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
TRITONSERVER_MEMORY_GPU = MemoryType.TRITONSERVER_MEMORY_GPU
TRITONSERVER_MEMORY_CPU = MemoryType.TRITONSERVER_MEMORY_CPU
TRITON_STRING_TO_NUMPY = {"TYPE_BOOL": bool, "TYPE_UINT8": np.uint8, "TYPE_UINT16": np.uint16,
                          "TYPE_UINT32": np.uint32, "TYPE_UINT64": np.uint64, "TYPE_INT8": np.int8,
                          "TYPE_INT16": np.int16, "TYPE_INT32": np.int32, "TYPE_INT64": np.int64,
                          "TYPE_FP16": np.float16, "TYPE_FP32": np.float32, "TYPE_FP64": np.float64,
                          "TYPE_STRING": np.object_}
_log = logging.getLogger("kserve_v2.python_models")


@dataclass(frozen=True, slots=True)
class PreferredMemory:
    """Where a model would like a BLS response's tensors: they are always in CPU memory here (a GPU
    preference logs one warning saying so)."""

    preferred_memory_type: MemoryType = MemoryType.TRITONSERVER_MEMORY_CPU
    preferred_device_id: int = 0


class MetricHandle(Protocol):
    """One series of a custom metric family, as the host keeps it: each operation raises
    ``MetricError`` with Triton's text when the family's kind has not that operation."""

    def increment(self, value: float) -> None: ...

    def set(self, value: float) -> None: ...

    def observe(self, value: float) -> None: ...

    def value(self) -> float: ...


class FamilyHandle(Protocol):
    """A custom metric family as the host keeps it."""

    def metric(self, labels: dict[str, str], buckets: Sequence[float] | None) -> MetricHandle:
        """Its series with ``labels`` (``buckets``: a histogram's upper bounds).

        Raises:
            MetricError: missing or unexpected buckets (Triton's texts).
        """
        ...


class ModelHost(abc.ABC):
    """What model code may ask of the server that runs it: the one seam between ``pb_utils`` and a
    server. ``model_dir``: the folder of the version whose code runs (where its ``model.py`` is).

    Every method raises ``TritonModelException`` (or ``MetricError`` for the metric ones) with the
    text the model sees; ``pb_utils`` adds Triton's prefixes ("Failed to load model: ...")."""

    model_dir: str

    @abc.abstractmethod
    def infer(self, request: InferenceRequest) -> InferenceResponse:
        """Run a request the model built (``InferenceRequest.exec``) and wait: its response, an
        error being the response's (a ``timeout`` that expires first: "Request timeout expired").

        Raises:
            TritonModelException: not during ``execute`` nor in a thread after one (``BLS_OUTSIDE_EXECUTE``).
        """

    async def infer_async(self, request: InferenceRequest) -> InferenceResponse:
        """``infer`` for an ``async def execute``, without blocking its event loop."""
        import asyncio

        return await asyncio.get_running_loop().run_in_executor(None, self.infer, request)

    @abc.abstractmethod
    def stream(self, request: InferenceRequest) -> ResponseIterator:
        """Run a request to a decoupled model (``exec(decoupled=True)``): its responses, once the
        first one came.

        Raises:
            TritonModelException: as ``infer``.
        """

    @abc.abstractmethod
    def metric_family(self, name: str, description: str, kind: MetricKind) -> FamilyHandle:
        """Create (or find) a custom metric family, owned by the running version (it goes when that
        unloads).

        Raises:
            MetricError: a name another kind has; outside ``initialize``, ``execute`` or ``finalize``.
        """

    @abc.abstractmethod
    def load_model(self, request: pb.RepositoryModelLoadRequest) -> None:
        """The repository's load, waited for."""

    @abc.abstractmethod
    def unload_model(self, request: pb.RepositoryModelUnloadRequest) -> None:
        """The repository's unload; waited for unless a request of the model waits in this call."""

    @abc.abstractmethod
    def is_model_ready(self, request: pb.ModelReadyRequest) -> bool:
        """ModelReady."""


# set by the backend around initialize, execute and finalize (``kserve_v2.runtime.python.executing.running_as``)
RUNNING: ContextVar[ModelHost | None] = ContextVar("kserve_v2_python_running", default=None)
# a loaded model's package (``executing.import_model_class``) -> its latest host, for the threads it starts
_models: dict[str, Callable[[], ModelHost]] = {}
# Triton's text for a BLS request outside execute (python_backend src/infer_request.cc)
BLS_OUTSIDE_EXECUTE = "BLS is only supported during the 'execute' function."
NOT_IN_A_MODEL = "no python model is executing: this call is only available inside a model"
# the one overload of Triton's InferenceRequest binding (python_backend src/pb_stub.cc), in pybind11's TypeError
_REQUEST_SIGNATURE = ("c_python_backend_utils.InferenceRequest(request_id: str = '', correlation_id: object = 0, "
                      "inputs: List[c_python_backend_utils.Tensor], requested_output_names: List[str], model_name: str, "
                      "model_version: int = -1, flags: int = 0, timeout: int = 0, preferred_memory: "
                      "c_python_backend_utils.PreferredMemory = ..., trace: c_python_backend_utils.InferenceTrace = ..., "
                      "parameters: object = None)")


_warned: set[str] = set()


def _once(key: str, text: str) -> None:
    """Log ``text`` as a warning the first time ``key`` comes up in this process (a setting a model
    gives that has no effect here: named, never dropped in silence)."""
    if key not in _warned:
        _warned.add(key)
        _log.warning("%s", text)


def register(package: str, latest: Callable[[], ModelHost]) -> None:
    """Threads running code of the model imported as ``package`` run as ``latest()`` (its latest
    execute's host, or its version's before any): threads do not inherit ``RUNNING``."""
    _models[package] = latest


def unregister(package: str) -> None:
    """The model imported as ``package`` has unloaded."""
    _models.pop(package, None)


def running() -> ModelHost:
    """The host of the model code running now: ``RUNNING``, else (a thread the model started) the
    latest host of the model whose code is on the thread's stack, else that of the only model loaded.

    Raises:
        TritonModelException: no python model's code is running here.
    """
    current = RUNNING.get()
    if current is not None:
        return current
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        latest = _models.get(str(frame.f_globals.get("__name__", "")).partition(".")[0])
        if latest is not None:
            return latest()
        frame = frame.f_back
    if len(_models) == 1:
        return next(iter(_models.values()))()
    raise TritonModelException(NOT_IN_A_MODEL)


class InferenceResponseSender:
    """Sends a request's responses (Triton's decoupled API), from execute or any thread or task after
    it. A model answered once may send its one response here instead of returning it (Triton's
    rules: a second response, or the final flag before any response, raises; a response sent wins
    over one execute returns). ``send`` hands them to ``deliver`` of the backend."""

    def __init__(self, deliver: Callable[[InferenceResponse | None, bool], None], cancelled: Callable[[], bool]) -> None:
        self._deliver = deliver
        self._cancelled = cancelled

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        """Send ``response`` (None: only the flags); ``flags`` ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``
        ends the request.

        Raises:
            TritonModelException: after the final flag ("Unable to send response. Response sender
                has been closed."); in a model answered once, a second response ("Unable to send
                response. Non-decoupled model cannot send more than one response.") or the final
                flag before any response ("... cannot send complete final before sending a response.").
        """
        if response is not None and not isinstance(response, InferenceResponse):
            raise TritonModelException(f"Expected an 'InferenceResponse' object, found type '{type(response).__name__}'.")
        self._deliver(response, bool(flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL))

    def is_cancelled(self) -> bool:
        """Whether the request was cancelled (its caller went away, e.g. a gRPC stream cancelled),
        also after execute returned."""
        return self._cancelled()


class InferenceRequest:
    """A request: one the model receives (in ``execute``), or one it sends to another model
    (business logic scripting: ``exec``, ``async_exec``).

    ``request_id`` and ``model_name`` may be ``str`` or UTF-8 ``bytes`` (as Triton's binding takes
    them, e.g. a model name read from a BYTES tensor), and ``requested_output_names`` either too.

    Raises:
        TypeError: an argument of a wrong type (None included: ``inputs``, ``requested_output_names``,
            ``model_name``, ``request_id``, ``correlation_id``, ``model_version``, ``flags``, ``timeout``),
            with pybind11's text, as Triton's binding.
        TritonModelException: an input that is None or an empty requested output name (Triton's texts,
            "Input tensor for request with id '<id>' and model name '<model>' should not be empty."); a
            correlation id that is neither int nor str; parameters whose keys are not str or whose
            values are not bool, int or str.
    """

    def __init__(self, request_id: str | bytes = "", correlation_id: int | str = 0, inputs: Sequence[Tensor] = (),
                 requested_output_names: Sequence[str | bytes] = (), model_name: str | bytes = "",
                 model_version: int = -1, flags: int = 0, timeout: int = 0,
                 preferred_memory: PreferredMemory | None = None, trace: Any = None,
                 parameters: dict[str, Parameter] | str | None = None) -> None:
        given_names = requested_output_names
        if (not is_text(request_id) or correlation_id is None or not tensor_list(inputs) or not is_text(model_name)
                or not isinstance(given_names, Sequence) or is_text(given_names) or not all(map(is_text, given_names))
                or not all(isinstance(number, int) for number in (model_version, flags, timeout))):
            raise binding_type_error("__init__", _REQUEST_SIGNATURE, (request_id, correlation_id, inputs, given_names,
                                                                      model_name, model_version, flags, timeout))
        request_id, model_name = text(request_id), text(model_name)
        if any(tensor is None for tensor in inputs):
            raise TritonModelException(f"Input tensor for request with id '{request_id}' and model name '{model_name}' "
                                       "should not be empty.")
        if not all(given_names):
            raise TritonModelException(f"Requested output name for request with id '{request_id}' and model name "
                                       f"'{model_name}' should not be empty.")
        if not isinstance(correlation_id, int | str):
            raise TritonModelException("Correlation ID must be integer or string")
        given: dict[str, Parameter] = json.loads(parameters) if isinstance(parameters, str) else dict(parameters or {})
        for key, value in given.items():
            if not isinstance(key, str):
                raise TritonModelException(f"Expect parameters keys to have type str, found type {type(key)}")
            if not isinstance(value, bool | int | str):
                raise TritonModelException(f"Expect parameters values to have type bool/int/str, found type {type(value)}")
        if preferred_memory is not None and preferred_memory.preferred_memory_type != MemoryType.TRITONSERVER_MEMORY_CPU:
            _once("preferred_memory", "a BLS request's preferred_memory asks for GPU memory: its response's tensors are "
                  "in CPU memory here (this server's python backend keeps tensors in CPU memory only)")
        if trace is not None:
            _once("trace", "a BLS request's trace= is not followed: requests a python model sends are not traced here")
        self._id, self._correlation_id, self._flags, self._timeout = request_id, correlation_id, flags, timeout
        self._inputs = list(inputs)
        self._outputs = [text(name) for name in given_names]
        self._model_name, self._model_version = model_name, model_version
        self._parameters = given
        self._sender: InferenceResponseSender | None = None
        self._cancelled: Callable[[], bool] = lambda: False
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def set_flags(self, flags: int) -> None:
        self._flags = flags

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        """The request's parameters as JSON text."""
        return json.dumps(self._parameters)

    def trace(self) -> None:
        return None

    def requested_output_names(self) -> list[str]:
        return self._outputs

    def get_response_sender(self) -> InferenceResponseSender:
        """The sender of this request's responses.

        Raises:
            TritonModelException: a request the model built itself has no sender.
        """
        if self._sender is None:
            raise TritonModelException("only a request the model received has a response sender")
        return self._sender

    def is_cancelled(self) -> bool:
        """Whether the request's caller went away."""
        return self._cancelled()

    def set_release_flags(self, flags: int) -> None:
        """How the request is released when execute returns (Triton's python_backend README, "Request
        Rescheduling"): ``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE`` gives it back to be executed again
        (a model answered once returns None for it); only a model with ``sequence_batching {
        iterative_sequence: true }`` may, elsewhere the request fails with Triton's INVALID_ARGUMENT
        "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not
        configured to handle such a flag.". ``TRITONSERVER_REQUEST_RELEASE_ALL`` (the default) ends it."""
        self._release_flags = flags

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on its model and wait: its response (an error is the response's, not
        raised), or with ``decoupled`` an iterator of its responses, the last one final (empty when
        the model sent the final flag alone). A ``timeout`` (microseconds, Triton's python backend
        README) that expires first cancels the request and answers Triton's "Request timeout expired"
        (``TritonError.UNAVAILABLE``); the request also carries it as its ``timeout`` parameter (the
        callee's queue policy reads it).

        Raises:
            TritonModelException: in ``initialize``, ``auto_complete_config`` or ``finalize``, or in a
                thread before the model executed a request (Triton's text: "BLS is only supported
                during the 'execute' function."). Threads the model started may send after execute
                returned, as in Triton.
        """
        host = running()
        return host.stream(self) if decoupled else host.infer(self)

    async def async_exec(self, decoupled: bool = False) -> Any:
        """``exec`` for an ``async def execute``: awaits the response (or, with ``decoupled``, the
        iterator of the responses) without blocking the model's other coroutines."""
        import asyncio

        host = running()
        if decoupled:  # the iterator waits for the first response: on a worker thread, not the model's loop
            return await asyncio.get_running_loop().run_in_executor(None, host.stream, self)
        return await host.infer_async(self)

    def as_fields(self) -> dict[str, Any]:
        """What a request the model built is made of, as ``InferenceRequest(**fields)`` takes it
        (the inputs as ``(name, array)`` pairs): how a stub sends it to the server."""
        return {"request_id": self._id, "correlation_id": self._correlation_id,
                "inputs": [(t.name(), t.as_numpy()) for t in self._inputs], "requested_output_names": self._outputs,
                "model_name": self._model_name, "model_version": self._model_version, "flags": self._flags,
                "timeout": self._timeout, "parameters": self._parameters}

    def model(self) -> tuple[str, int]:
        """The model and version (-1: the server's choice) a request the model built goes to."""
        return self._model_name, self._model_version

    def parameter_values(self) -> dict[str, Parameter]:
        """The request's parameters as values (``parameters()`` is their JSON)."""
        return self._parameters


def received(request_id: str, correlation_id: int | str, flags: int, parameters: dict[str, Parameter],
             inputs: list[Tensor], output_names: Sequence[str], sender: InferenceResponseSender,
             cancelled: Callable[[], bool]) -> InferenceRequest:
    """A request as the model receives it in ``execute`` (the backend builds it): with its response
    sender and a view of whether its caller went away."""
    request = InferenceRequest(request_id, correlation_id, inputs, output_names, flags=flags)
    request._parameters, request._sender, request._cancelled = parameters, sender, cancelled
    return request


def rescheduled(request: InferenceRequest) -> bool:
    """Whether the model gave ``request`` back to be executed again (``set_release_flags`` with
    ``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE``; the backend reads it once execute returned)."""
    return bool(request._release_flags & TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)


class ResponseIterator:
    """The responses of a BLS request to a decoupled model, as they come (Triton's ``ResponseIterator``):
    ``for`` over it, or ``async for`` (each next response waits on a worker thread of the running
    loop). ``cancel`` cancels the request (Triton's python backend README, "Cancelling decoupled BLS
    requests"): the callee's ``is_cancelled()`` turns true and the iterator ends with a CANCELLED
    error response. Each host makes its own."""

    def __iter__(self) -> Iterator[InferenceResponse]:
        return self

    def __next__(self) -> InferenceResponse:
        raise NotImplementedError  # the host's iterator's own

    def cancel(self) -> None:
        """Cancel the request (any time; after its final response, nothing happens)."""
        raise NotImplementedError

    def __aiter__(self) -> ResponseIterator:
        return self

    async def __anext__(self) -> InferenceResponse:
        import asyncio

        response = await asyncio.get_running_loop().run_in_executor(None, self._next_or_end)
        if response is None:
            raise StopAsyncIteration
        return response

    def _next_or_end(self) -> InferenceResponse | None:
        """The next response, or None at the end (a StopIteration cannot cross into an asyncio future)."""
        try:
            return self.__next__()
        except StopIteration:
            return None


class Logger:
    """Log lines from model code, in the server's log (logger ``kserve_v2.python_models``).

    Raises:
        TypeError: a message that is not ``str`` (None included), or a level that is not a
            ``Logger.LogLevel`` (an int included), with pybind11's text, as Triton's binding.
    """

    class LogLevel(enum.IntEnum):
        INFO = 0
        WARNING = 1
        ERROR = 2
        VERBOSE = 3

    INFO, WARNING, ERROR, VERBOSE = LogLevel.INFO, LogLevel.WARNING, LogLevel.ERROR, LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: Logger.LogLevel = LogLevel.INFO) -> None:
        if not is_text(message) or not isinstance(level, Logger.LogLevel):
            raise binding_type_error("log", "(message: str, level: c_python_backend_utils.Logger.LogLevel = "
                                     "<LogLevel.INFO: 0>) -> None", (message, level))
        _log.log((logging.INFO, logging.WARNING, logging.ERROR, logging.DEBUG)[int(level)], "%s", text(message))

    @staticmethod
    def log_info(message: str) -> None:
        _log.info("%s", Logger._message("log_info", message))

    @staticmethod
    def log_warn(message: str) -> None:
        _log.warning("%s", Logger._message("log_warn", message))

    @staticmethod
    def log_error(message: str) -> None:
        _log.error("%s", Logger._message("log_error", message))

    @staticmethod
    def log_verbose(message: str) -> None:
        _log.debug("%s", Logger._message("log_verbose", message))

    @staticmethod
    def _message(function: str, message: object) -> str:
        """``message`` of a ``log_*`` call, as text; pybind11's TypeError when it is not text."""
        if not is_text(message):
            raise binding_type_error(function, "(message: str) -> None", (message,))
        return text(message)


def get_model_dir() -> str:
    """The folder of the version whose code runs (where its ``model.py`` is)."""
    return running().model_dir


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    return next((t for t in inference_request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    return next((t for t in inference_response.output_tensors() if t.name() == name), None)


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return tensor_config(model_config, "input", name)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return tensor_config(model_config, "output", name)


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


def triton_string_to_numpy(triton_type_string: str) -> Any:
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int) -> Any:
    return TRITON_TYPES[data_type] if 0 < data_type < len(TRITON_TYPES) else None


def serialize_byte_tensor(input_tensor: np.ndarray) -> bytes | tuple[()]:
    """BYTES elements framed with their 4-byte little-endian lengths, in row-major order."""
    if input_tensor.size == 0:
        return ()
    parts = []
    for item in input_tensor.reshape(-1).tolist():
        data = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts += [struct.pack("<I", len(data)), data]
    return b"".join(parts)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    """The elements of framed BYTES, as a 1-D object array of ``bytes``."""
    items, offset = [], 0
    while offset < len(encoded_tensor):
        (length,) = struct.unpack_from("<I", encoded_tensor, offset)
        items.append(bytes(encoded_tensor[offset + 4 : offset + 4 + length]))
        offset += 4 + length
    return np.array(items, dtype=np.object_)


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load (or reload) ``model_name`` (Triton's python backend README, "Model Loading API"): with
    ``config``, a model configuration in JSON that replaces the repository's; with ``files``
    (``"file:<path>"`` -> content), the model folder to load it from (``config`` required). Waits
    for the load; only in explicit model control mode. Not in ``auto_complete_config`` or
    ``finalize`` (Triton's rule: it may deadlock there).

    Raises:
        TritonModelException: "Failed to load model: <reason>" with the repository extension's text
            (outside explicit mode: "explicit model load / unload is not allowed if polling is
            enabled"); files that are not a dict of bytes (Triton's text).
    """
    if files is not None and not isinstance(files, dict):
        raise TritonModelException(f"Failed to load model: failed to load model '{model_name}', files should be a "
                                   "dictionary of file paths and file contents")
    request = pb.RepositoryModelLoadRequest(model_name=model_name)
    if config:
        request.parameters["config"].string_param = config
    for path, content in (files or {}).items():
        request.parameters[path].bytes_param = bytes(content)
    try:
        running().load_model(request)
    except Exception as err:  # noqa: BLE001 - the model sees Triton's wrapped text
        raise TritonModelException(f"Failed to load model: {err}") from None


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Unload ``model_name`` (with ``unload_dependents``, an ensemble's composing models no other
    ensemble uses); only in explicit model control mode. Waits until it is unloaded, except for a
    model whose request waits in this call (the model itself, or one calling it): then it returns
    at once, and the model unloads once its requests finish (Triton's unload does not wait).

    Raises:
        TritonModelException: "Failed to unload model: <reason>" (outside explicit mode: "explicit
            model load / unload is not allowed if polling is enabled").
    """
    request = pb.RepositoryModelUnloadRequest(model_name=model_name)
    if unload_dependents:
        request.parameters["unload_dependents"].bool_param = True
    try:
        running().unload_model(request)
    except Exception as err:  # noqa: BLE001 - as load_model
        raise TritonModelException(f"Failed to unload model: {err}") from None


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """Whether ``model_name`` (version ``model_version``; "": the server's choice) is loaded and ready.

    Raises:
        TritonModelException: a version that is not an integer > 0 (Triton's text).
    """
    if model_version:
        try:
            valid = int(model_version) > 0
        except ValueError as err:
            raise TritonModelException(f"Failed to check model readiness: failed to get model version from specified "
                                       f"version string '{model_version}' (details: {err}), version should be an "
                                       "integral value > 0") from None
        if not valid:
            raise TritonModelException("Failed to check model readiness: failed to get model version from specified "
                                       f"version string '{model_version}', version should be an integral value > 0")
    try:
        return running().is_model_ready(pb.ModelReadyRequest(name=model_name, version=model_version))
    except Exception as err:  # noqa: BLE001 - as load_model
        raise TritonModelException(f"Failed to check model readiness: {err}") from None


class Metric:
    """One labelled series of a ``MetricFamily`` (Triton's python backend README, "Custom Metrics"):
    ``increment`` (counter, gauge), ``set`` (gauge), ``observe`` (histogram), ``value`` (counter, gauge).

    Raises:
        TritonModelException: an operation the family's kind has not, or a negative counter increment
            (Triton's texts, e.g. "Failed to set metric value: TRITONSERVER_METRIC_KIND_COUNTER does not
            support Set").
    """

    def __init__(self, metric: MetricHandle) -> None:
        self._metric = metric

    def increment(self, value: float) -> None:
        self._call("Failed to increment metric value: ", self._metric.increment, value)

    def set(self, value: float) -> None:
        self._call("Failed to set metric value: ", self._metric.set, value)

    def observe(self, value: float) -> None:
        self._call("Failed to observe metric value: ", self._metric.observe, value)

    def value(self) -> float:
        try:
            return self._metric.value()
        except MetricError as err:
            raise TritonModelException(f"Failed to get metric value: {err}") from None

    @staticmethod
    def _call(prefix: str, operation: Callable[[float], None], value: float) -> None:
        try:
            operation(float(value))
        except MetricError as err:
            raise TritonModelException(f"{prefix}{err}") from None


class MetricFamily:
    """A custom metric family in the server's ``/metrics`` (Triton's python backend README, "Custom
    Metrics"): ``MetricFamily(name, description, kind)`` with ``kind`` ``MetricFamily.COUNTER``,
    ``GAUGE`` or ``HISTOGRAM``; its series come from ``Metric(labels=, buckets=)`` (buckets: a
    histogram's upper bounds, required for it and refused for the others). Created in
    ``initialize``, ``execute`` or ``finalize`` (or a thread the model started); the family lives until
    the model version unloads. With ``--workers N`` the replicas' series are summed, as the built-in
    families'.

    Raises:
        TritonModelException: an unknown kind; a name another kind has; outside a model (Triton's
            "Error when creating MetricFamily: ..." texts); ``Metric`` with labels that are not a
            dict, buckets that are not a list, missing or unexpected buckets.
    """

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: MetricKind) -> None:
        if not isinstance(kind, MetricKind):
            raise TritonModelException("Error when creating MetricFamily: Unsupported kind passed to MetricFamily "
                                       "constructor.")
        try:
            self._family = running().metric_family(name, description, kind)
        except MetricError as err:
            raise TritonModelException(str(err)) from None

    def Metric(self, labels: dict[str, str] | None = None, buckets: list[float] | None = None) -> Metric:  # noqa: N802
        if labels is not None and not isinstance(labels, dict):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        if buckets is not None and not isinstance(buckets, list):
            raise TritonModelException("Failed to create metric. Buckets must be a list.")
        try:
            return Metric(self._family.metric(labels or {}, buckets))
        except MetricError as err:
            raise TritonModelException(str(err)) from None
